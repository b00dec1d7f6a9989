/* Host working copies, pageable or pinned (see work_copies.h). */
#include "engine/exec/place/work_copies.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/grow.h"
#include "kernels/host/threadpool.h"

/* Each copy starts on a cache line of its own in a block's allocation. */
static size_t copy_bytes(const eng_param_t *p) { return (p->spec->numel * sizeof(uint16_t) + 63) / 64 * 64; }

static mt_status_t pageable_copies(eng_model_t *m, const int *idx, int n, kern_threadpool_t *pool, mt_error_t *err) {
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        p->work_bf16 = malloc(p->spec->numel * sizeof(uint16_t));
        if (!p->work_bf16)
            return mt_error_set(err, MT_ERR_NOMEM, "out of host memory for the bf16 working copy of %s (%zu bytes)",
                                p->spec->name, p->spec->numel * sizeof(uint16_t));
        kern_threadpool_to_bf16(pool, p->work_bf16, p->host_w, p->spec->numel);
    }
    return MT_OK;
}

mt_status_t exec_make_work_copies(exec_work_copies_t *wc, eng_model_t *m, const int *idx, int n, bool pinned,
                                  kern_threadpool_t *pool, mt_error_t *err) {
    size_t total = 0;
    for (int k = 0; k < n; k++) total += copy_bytes(&m->params[idx[k]]);
    if (n == 0 || total == 0) return MT_OK;
    char *slab = pinned ? kern_pinned_alloc(wc->dev, total) : NULL;
    if (!slab) {
        wc->fallbacks += pinned;
        return pageable_copies(m, idx, n, pool, err);
    }
    MT_GROW(wc->slab, wc->cap, wc->n + 1, "pinned working copies");
    size_t *bytes = realloc(wc->bytes, (size_t)wc->cap * sizeof *bytes);
    MT_CHECK_ALLOC(bytes, "pinned working copies");
    wc->bytes = bytes;
    wc->slab[wc->n] = slab;
    wc->bytes[wc->n++] = total;
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        p->work_bf16 = (uint16_t *)(slab + off);
        p->work_pinned = true;
        kern_threadpool_to_bf16(pool, p->work_bf16, p->host_w, p->spec->numel);
        off += copy_bytes(p);
    }
    return MT_OK;
}

void exec_work_copies_release(exec_work_copies_t *wc, eng_model_t *m) {
    for (int i = 0; m && wc->n > 0 && i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        if (!p->work_pinned) continue;
        p->work_bf16 = NULL;
        p->work_pinned = false;
    }
    for (int s = 0; s < wc->n; s++) kern_pinned_free(wc->dev, wc->slab[s], wc->bytes[s]);
    free(wc->slab);
    free(wc->bytes);
    kern_device_t *dev = wc->dev;
    *wc = (exec_work_copies_t){.dev = dev};
}
