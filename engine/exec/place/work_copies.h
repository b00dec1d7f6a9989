/* Trained weights' bf16 working copies in host memory (eng_param_t.work_bf16),
 * made when the executor places a block whose AdamW runs on the host in a
 * bf16 run: pageable, or pinned for the blocks whose plan says so
 * (sched_block_plan_t.pinned_home).
 *
 * The working copy is what every fetch and refresh of the weight copies to
 * the device.  A pageable copy first goes through the staging pool's pack
 * threads (a memcpy into pinned staging); a pinned one the link reads
 * where it is (MOE_STAGING_PINNED), so a fully trained, streamed model
 * leaves the pack threads to gradient unpacking.  A pinned block's copies
 * share one allocation: pinning is slow per call on a GPU's host, and a
 * block of a MoE model has hundreds of tensors.  A block whose pinned
 * allocation fails keeps pageable copies (a slower step, not a failed run)
 * and is counted.
 *
 * Host AdamW writes the copy in place (its fused bf16 output); either way
 * the values, and so the training, are the same bits.  Releasing drops the
 * pinned copies (work_bf16 NULL) and leaves the pageable ones to the model:
 * a later executor makes them again, and until then a fetch rounds the
 * master, the same rounding. */
#ifndef MT_ENGINE_EXEC_WORK_COPIES_H
#define MT_ENGINE_EXEC_WORK_COPIES_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "engine/model/model.h"
#include "kernels/device.h"

typedef struct {
    kern_device_t *dev;
    void **slab;   /* one pinned allocation per pinned block */
    size_t *bytes; /* ... and its size */
    int n, cap;
    int fallbacks; /* pinned blocks whose allocation failed: their copies are pageable */
} exec_work_copies_t;

/* Working copies for the n parameters idx of one block (each trained, with
 * an fp32 master host_w, in a bf16 run, and no working copy yet), rounded
 * from their masters with `pool`: in one pinned allocation when `pinned`
 * and it can be had, else in pageable memory.  MT_ERR_NOMEM naming the
 * tensor when even that fails. */
mt_status_t exec_make_work_copies(exec_work_copies_t *wc, eng_model_t *m, const int *idx, int n, bool pinned,
                                  kern_threadpool_t *pool, mt_error_t *err);
/* Drops every pinned working copy (see above) and frees the allocations. */
void exec_work_copies_release(exec_work_copies_t *wc, eng_model_t *m);

#endif
