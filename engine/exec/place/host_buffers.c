/* Host working copies and gradient accumulators, pageable or pinned (see host_buffers.h). */
#include "engine/exec/place/host_buffers.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "kernels/host/threadpool.h"

/* Each buffer starts on a cache line of its own in a block's allocation. */
static size_t line_up(size_t bytes) { return (bytes + 63) / 64 * 64; }

static size_t work_bytes(const eng_param_t *p) { return p->spec->numel * sizeof(uint16_t); }

/* A pinned allocation of `bytes` the release frees; NULL when none can be had. */
static char *pinned_slab(exec_host_buffers_t *hb, size_t bytes) {
    char *slab = kern_pinned_alloc(hb->dev, bytes);
    if (!slab) return NULL;
    MT_GROW(hb->slab, hb->cap, hb->n + 1, "pinned host buffers");
    size_t *sizes = realloc(hb->bytes, (size_t)hb->cap * sizeof *sizes);
    MT_CHECK_ALLOC(sizes, "pinned host buffers");
    hb->bytes = sizes;
    hb->slab[hb->n] = slab;
    hb->bytes[hb->n++] = bytes;
    return slab;
}

mt_status_t exec_make_work_copies(exec_host_buffers_t *hb, eng_model_t *m, const int *idx, int n, bool pinned,
                                  kern_threadpool_t *pool, mt_error_t *err) {
    size_t total = 0;
    for (int k = 0; k < n; k++) total += line_up(work_bytes(&m->params[idx[k]]));
    char *slab = pinned && total > 0 ? pinned_slab(hb, total) : NULL;
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        if (slab) {
            p->work_bf16 = (uint16_t *)(slab + off);
            p->work_pinned = true;
            off += line_up(work_bytes(p));
        } else if (!(p->work_bf16 = malloc(work_bytes(p)))) {
            return mt_error_set(err, MT_ERR_NOMEM, "out of host memory for the bf16 working copy of %s (%zu bytes)",
                                p->spec->name, work_bytes(p));
        }
        kern_threadpool_to_bf16(pool, p->work_bf16, p->host_w, p->spec->numel);
    }
    return MT_OK;
}

void exec_pin_grads(exec_host_buffers_t *hb, const eng_model_t *m, eng_dparam_t *dp, const int *idx, int n) {
    size_t total = 0;
    for (int k = 0; k < n; k++) total += line_up(m->params[idx[k]].spec->numel * sizeof(float));
    char *slab = total > 0 ? pinned_slab(hb, total) : NULL;
    if (!slab) return;
    memset(slab, 0, total);
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        eng_dparam_t *d = &dp[idx[k]];
        free(d->host_g);
        d->host_g = (float *)(slab + off);
        d->host_g_pinned = true;
        off += line_up(m->params[idx[k]].spec->numel * sizeof(float));
    }
}

void exec_host_buffers_release(exec_host_buffers_t *hb, eng_model_t *m, eng_dparam_t *dp) {
    for (int i = 0; m && hb->n > 0 && i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        if (p->work_pinned) p->work_bf16 = NULL, p->work_pinned = false;
        if (dp && dp[i].host_g_pinned) dp[i].host_g = NULL, dp[i].host_g_pinned = false;
    }
    for (int s = 0; s < hb->n; s++) kern_pinned_free(hb->dev, hb->slab[s], hb->bytes[s]);
    free(hb->slab);
    free(hb->bytes);
    kern_device_t *dev = hb->dev;
    *hb = (exec_host_buffers_t){.dev = dev};
}
