/* Copies for undoing a speculative host AdamW update (see speculate.h). */
#include "engine/optim/speculate.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/host/adamw_host.h"

void eng_spec_init(eng_spec_t *s, int num_params) {
    memset(s, 0, sizeof *s);
    s->num_params = num_params;
    s->copy = calloc((size_t)(num_params > 0 ? num_params : 1), sizeof *s->copy);
    MT_CHECK_ALLOC(s->copy, "speculative optimizer copies");
}

void eng_spec_free(eng_spec_t *s) {
    for (int i = 0; s->copy && i < s->num_params; i++) {
        free(s->copy[i].w);
        free(s->copy[i].mom);
    }
    free(s->copy);
    memset(s, 0, sizeof *s);
}

static void *copy_of(kern_threadpool_t *pool, void **dst, const void *src, size_t bytes, const char *what,
                     const char *name, uint64_t *held) {
    if (!*dst) {
        *dst = malloc(bytes);
        MT_CHECK(*dst, "out of host memory for the speculative optimizer's copy of %s's %s", name, what);
        *held += bytes;
    }
    kern_threadpool_memcpy(pool, *dst, src, bytes);
    return *dst;
}

void eng_spec_save(eng_spec_t *s, const eng_param_t *p, int i, kern_threadpool_t *pool) {
    eng_spec_copy_t *c = &s->copy[i];
    const size_t n = p->spec->numel;
    MT_CHECK(p->host_w, "speculative update of %s without its host master", p->spec->name);
    copy_of(pool, (void **)&c->w, p->host_w, n * sizeof(float), "master", p->spec->name, &s->bytes);
    c->had_state = p->host_mom != NULL;
    if (c->had_state)
        copy_of(pool, &c->mom, p->host_mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n), "moments",
                p->spec->name, &s->bytes);
    c->step = p->step;
    c->saved = true;
}

bool eng_spec_undo(eng_spec_t *s, eng_param_t *p, int i, kern_threadpool_t *pool) {
    eng_spec_copy_t *c = &s->copy[i];
    if (!c->saved) return false;
    const size_t n = p->spec->numel;
    kern_threadpool_memcpy(pool, p->host_w, c->w, n * sizeof(float));
    /* the working copy as the restored master rounds (what the update overwrote) */
    if (p->work_bf16) kern_threadpool_to_bf16(pool, p->work_bf16, p->host_w, n);
    if (c->had_state) {
        kern_threadpool_memcpy(pool, p->host_mom, c->mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n));
    } else { /* the update created zeroed moments: back to none, as torch's lazy state */
        free(p->host_mom);
        p->host_mom = NULL;
    }
    p->step = c->step;
    c->saved = false;
    return true;
}

void eng_spec_keep(eng_spec_t *s, int i) { s->copy[i].saved = false; }
