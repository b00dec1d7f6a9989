/* Spans: the tensors a block fetches together (its dense weights and the
 * experts the router chose) get one device allocation laid out by
 * moe_staging_layout, so the staging pool moves them in one copy; so do the
 * gradients a block sends to the host.  A span is freed when the last
 * tensor in it is released (tensors can outlive their block: a tied
 * embedding is held by the embedding and the head).  If the arena has no
 * contiguous room, each tensor gets its own allocation (more copies, same
 * results).
 *
 * A table with a free list, below residency and gradients (which fill
 * spans) and above the deferred frees (a span read by a copy in flight is
 * freed once the copy is done). */
#ifndef MT_ENGINE_EXEC_SPANS_H
#define MT_ENGINE_EXEC_SPANS_H

#include <stdbool.h>

#include "base/status.h"
#include "engine/exec/place/pending.h"
#include "engine/layers/env.h"
#include "kernels/device.h"

/* One device allocation holding several tensors fetched or produced
 * together (a block's streamed weights, its host-bound gradients). */
typedef struct {
    void *base;    /* NULL: the slot is free */
    int live;      /* tensors inside still in use; the span is freed at 0 */
    int next_free;
} exec_span_t;

typedef struct {
    const eng_layer_env_t *env; /* not owned: the device, the model's tensors */
    exec_pending_list_t *pend;  /* not owned: where a span still being copied is freed */
    exec_span_t *v;
    int n, cap;
    int free_head; /* first free slot, -1 = none */
} exec_spans_t;

void exec_spans_init(exec_spans_t *s, const eng_layer_env_t *env, exec_pending_list_t *pend);
/* Frees every span still allocated, and the table. */
void exec_spans_free(exec_spans_t *s);

/* Device memory for the tensors ids[0..k) (working copies when weights,
 * else fp32 gradients): one span laid out for one copy, else one
 * allocation each.  spans[j] receives tensor j's span, ptrs[j] its
 * address.  Nothing stays allocated on failure. */
mt_status_t exec_span_alloc(exec_spans_t *s, const int *ids, int k, bool weights, const char *tag, int *spans,
                            void **ptrs, mt_error_t *err);
/* One tensor of span sp is done with; the last one frees the span (after
 * `after` passes this point, or stream-ordered now when NULL). */
void exec_span_put(exec_spans_t *s, int sp, kern_stream_t *after);

#endif
