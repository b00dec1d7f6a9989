/* Spans (see exec_internal.h): the tensors a block fetches together (its
 * dense weights and the experts the router chose) get one device
 * allocation laid out by moe_staging_layout, so the staging pool moves them
 * in one copy; so do the gradients a block sends to the host.  A span is
 * freed when the last tensor in it is released (tensors can outlive their
 * block: a tied embedding is held by the embedding and the head).  If the
 * arena has no contiguous room, each tensor gets its own allocation (more
 * copies, same results). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/internal.h"
#include "base/grow.h"

static int span_new(eng_exec_t *x, void *base, int live) {
    int s = x->spans.free_head;
    if (s >= 0) {
        x->spans.free_head = x->spans.v[s].next_free;
    } else {
        MT_GROW(x->spans.v, x->spans.cap, x->spans.n + 1, "device spans");
        s = x->spans.n++;
    }
    x->spans.v[s] = (exec_span_t){base, live, -1};
    return s;
}

/* One tensor of span s is done; the last frees it (after `after` passes the
 * current point, or now when after is NULL). */
void exec_span_put(eng_exec_t *x, int s, kern_stream_t *after) {
    exec_span_t *sp = &x->spans.v[s];
    MT_CHECK(sp->base && sp->live > 0, "executor: span %d released twice", s);
    if (--sp->live > 0) return;
    if (after) exec_defer_free(x, sp->base, NULL, 0, after);
    else kern_free(x->dev, sp->base);
    sp->base = NULL;
    sp->next_free = x->spans.free_head;
    x->spans.free_head = s;
}

/* Device memory for the tensors ids[0..k): one span laid out for one copy,
 * else one allocation each.  spans[j] receives tensor j's span, ptrs[j] its
 * address.  Nothing stays allocated on failure. */
mt_status_t exec_span_alloc(eng_exec_t *x, const int *ids, int k, bool weights, const char *tag, int *spans,
                               void **ptrs, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (k <= 0) return MT_OK;
    size_t *sz = calloc((size_t)k * 2, sizeof *sz);
    MT_CHECK_ALLOC(sz, "span layout");
    size_t *off = sz + k;
    for (int j = 0; j < k; j++) {
        const eng_param_t *p = &m->params[ids[j]];
        sz[j] = weights ? exec_w_bytes(p) : exec_f32_bytes(p);
    }
    const size_t total = moe_staging_layout(sz, k, MT_ARENA_ALIGN, off);
    mt_error_t quiet = {0};
    char *base = k > 1 ? kern_alloc(x->dev, total, tag, &quiet) : NULL;
    if (base) {
        const int s = span_new(x, base, k);
        for (int j = 0; j < k; j++) {
            spans[j] = s;
            ptrs[j] = base + off[j];
        }
        free(sz);
        return MT_OK;
    }
    for (int j = 0; j < k; j++) { /* no contiguous room: one allocation per tensor */
        char t[240];
        snprintf(t, sizeof t, "%s: %s", tag, m->params[ids[j]].spec->name);
        ptrs[j] = kern_alloc(x->dev, sz[j], t, err);
        if (!ptrs[j]) {
            for (int q = 0; q < j; q++) exec_span_put(x, spans[q], NULL);
            free(sz);
            return err->code;
        }
        spans[j] = span_new(x, ptrs[j], 1);
    }
    free(sz);
    return MT_OK;
}
