/* Copies for undoing a speculative host AdamW update (see speculate.h). */
#include "engine/optim/speculate.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void eng_spec_init(eng_spec_t *s, int num_params) {
    memset(s, 0, sizeof *s);
    s->num_params = num_params;
    s->copy = calloc((size_t)(num_params > 0 ? num_params : 1), sizeof *s->copy);
    MT_CHECK_ALLOC(s->copy, "speculative optimizer copies");
}

void eng_spec_free(eng_spec_t *s) {
    for (int i = 0; s->copy && i < s->num_params; i++) {
        free(s->copy[i].w);
        free(s->copy[i].m);
        free(s->copy[i].v);
    }
    free(s->copy);
    memset(s, 0, sizeof *s);
}

static float *copy_of(float **dst, const float *src, size_t n, const char *what, const char *name,
                      uint64_t *bytes) {
    if (!*dst) {
        *dst = malloc(n * sizeof(float));
        MT_CHECK(*dst, "out of host memory for the speculative optimizer's copy of %s's %s", name, what);
        *bytes += n * sizeof(float);
    }
    memcpy(*dst, src, n * sizeof(float));
    return *dst;
}

void eng_spec_save(eng_spec_t *s, const eng_param_t *p, int i) {
    eng_spec_copy_t *c = &s->copy[i];
    const size_t n = p->spec->numel;
    MT_CHECK(p->host_w, "speculative update of %s without its host master", p->spec->name);
    copy_of(&c->w, p->host_w, n, "master", p->spec->name, &s->bytes);
    c->had_state = p->host_m != NULL;
    if (c->had_state) {
        copy_of(&c->m, p->host_m, n, "exp_avg", p->spec->name, &s->bytes);
        copy_of(&c->v, p->host_v, n, "exp_avg_sq", p->spec->name, &s->bytes);
    }
    c->step = p->step;
    c->saved = true;
}

bool eng_spec_undo(eng_spec_t *s, eng_param_t *p, int i) {
    eng_spec_copy_t *c = &s->copy[i];
    if (!c->saved) return false;
    const size_t n = p->spec->numel;
    memcpy(p->host_w, c->w, n * sizeof(float));
    if (c->had_state) {
        memcpy(p->host_m, c->m, n * sizeof(float));
        memcpy(p->host_v, c->v, n * sizeof(float));
    } else { /* the update created zeroed moments: back to none, as torch's lazy state */
        free(p->host_m);
        free(p->host_v);
        p->host_m = p->host_v = NULL;
    }
    p->step = c->step;
    c->saved = false;
    return true;
}

void eng_spec_keep(eng_spec_t *s, int i) { s->copy[i].saved = false; }
