/* Host buffers of trained weights that the link reads or writes every
 * step, pageable or pinned: the bf16 working copies kept beside fp32
 * masters (eng_param_t.work_bf16), made when the executor places a block
 * whose AdamW runs on the host in a bf16 run, pinned where the plan says
 * so (sched_block_plan_t.pinned_home); and the host gradient accumulators
 * (eng_dparam_t.host_g), pinned where the plan says so (pinned_grads).
 *
 * A working copy is what every fetch and refresh of the weight copies to
 * the device, and an accumulator is where every gradient D2H lands.
 * Pageable, each copy goes through the staging pool's pack threads (a
 * memcpy into pinned staging before an H2D, out of it after a D2H);
 * pinned, the link reads or writes it where it is (MOE_STAGING_PINNED), so
 * a fully trained, streamed model leaves the pack threads nearly idle (a
 * later micro-batch's gradient add is still unpacked).  A block's buffers
 * of one kind share one pinned allocation: pinning is slow per call on a
 * GPU's host, and a block of a MoE model has hundreds of tensors.  A block
 * whose pinned allocation fails keeps pageable buffers (a slower step, not
 * a failed run).
 *
 * The values are the same bits either way: host AdamW writes the working
 * copy in place (its fused bf16 output), a gradient copy moves the same
 * bytes.  Releasing drops the pinned working copies (work_bf16 NULL) and
 * leaves the pageable ones to the model: a later executor makes them
 * again, and until then a fetch rounds the master, the same rounding. */
#ifndef MT_ENGINE_EXEC_HOST_BUFFERS_H
#define MT_ENGINE_EXEC_HOST_BUFFERS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "engine/layers/dparam.h"
#include "engine/model/model.h"
#include "kernels/device.h"

typedef struct {
    kern_device_t *dev;
    void **slab;   /* the pinned allocations */
    size_t *bytes; /* ... and their sizes */
    int n, cap;
} exec_host_buffers_t;

/* Working copies for the n parameters idx of one block (each trained, with
 * an fp32 master host_w, in a bf16 run, and no working copy yet), rounded
 * from their masters with `pool`: in one pinned allocation when `pinned`
 * and it can be had, else in pageable memory.  MT_ERR_NOMEM naming the
 * tensor when even that fails. */
mt_status_t exec_make_work_copies(exec_host_buffers_t *hb, eng_model_t *m, const int *idx, int n, bool pinned,
                                  kern_threadpool_t *pool, mt_error_t *err);
/* Moves the zeroed pageable gradient accumulators (dp[i].host_g) of the n
 * parameters idx of one block into one pinned allocation, zeroed; leaves
 * them where they are when it cannot be had. */
void exec_pin_grads(exec_host_buffers_t *hb, const eng_model_t *m, eng_dparam_t *dp, const int *idx, int n);
/* Drops every pinned working copy (see above), marks every pinned
 * accumulator of dp gone (NULL), and frees the allocations. */
void exec_host_buffers_release(exec_host_buffers_t *hb, eng_model_t *m, eng_dparam_t *dp);

#endif
