/* Spare state for undoing a speculative host AdamW update by swapping
 * pointers (see speculate.h). */
#include "engine/optim/speculate.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/host/adamw_host.h"

void eng_spec_init(eng_spec_t *s, int num_params) {
    memset(s, 0, sizeof *s);
    s->num_params = num_params;
    s->copy = calloc((size_t)(num_params > 0 ? num_params : 1), sizeof *s->copy);
    MT_CHECK_ALLOC(s->copy, "speculative optimizer spares");
}

void eng_spec_free(eng_spec_t *s) {
    for (int i = 0; s->copy && i < s->num_params; i++) {
        free(s->copy[i].w);
        free(s->copy[i].mom);
    }
    free(s->copy);
    memset(s, 0, sizeof *s);
}

static void *spare(void **buf, size_t bytes, const char *what, const char *name, uint64_t *held) {
    if (!*buf) {
        /* 64-byte aligned: the out-of-place AdamW streams its stores past
         * the cache where the destinations share a line phase (kernels/host/
         * adamw.c) */
        *buf = aligned_alloc(64, (bytes + 63) / 64 * 64);
        MT_CHECK(*buf, "out of host memory for the speculative optimizer's spare %s of %s", what, name);
        __atomic_fetch_add(held, bytes, __ATOMIC_RELAXED); /* the nodes' runners take spares at once (host_optim.h) */
    }
    return *buf;
}

eng_spec_copy_t *eng_spec_begin(eng_spec_t *s, const eng_param_t *p, int i) {
    eng_spec_copy_t *c = &s->copy[i];
    const size_t n = p->spec->numel;
    MT_CHECK(p->host_w, "speculative update of %s without its host master", p->spec->name);
    /* saved still set: an earlier step's speculation was never settled (its
     * step failed before the norm); the state it left is the current one */
    spare((void **)&c->w, n * sizeof(float), "master", p->spec->name, &s->bytes);
    spare(&c->mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n), "moments", p->spec->name, &s->bytes);
    c->had_state = p->host_mom != NULL;
    c->step = p->step;
    c->saved = true;
    return c;
}

static void swap_state(eng_spec_copy_t *c, eng_param_t *p) {
    float *w = p->host_w;
    void *mom = p->host_mom;
    p->host_w = c->w;
    p->host_mom = c->mom;
    c->w = w;
    c->mom = mom;
}

void eng_spec_swap_in(eng_spec_t *s, eng_param_t *p, int i) {
    eng_spec_copy_t *c = &s->copy[i];
    MT_CHECK(c->saved && c->w && c->mom && p->host_mom, "speculative update of %s swapped in without its spare",
             p->spec->name);
    swap_state(c, p);
}

bool eng_spec_undo(eng_spec_t *s, eng_param_t *p, int i, kern_threadpool_t *pool) {
    eng_spec_copy_t *c = &s->copy[i];
    if (!c->saved) return false;
    swap_state(c, p);
    /* the working copy as the restored master rounds (the update overwrote it in place) */
    if (p->work_bf16) kern_threadpool_to_bf16(pool, p->work_bf16, p->host_w, p->spec->numel);
    if (!c->had_state) {
        /* the update read zeroed moments made for it: back to none, as
         * torch's lazy state; the spare (the discarded update) stays */
        free(p->host_mom);
        p->host_mom = NULL;
    }
    p->step = c->step;
    c->saved = false;
    return true;
}

void eng_spec_keep(eng_spec_t *s, int i) { s->copy[i].saved = false; }
