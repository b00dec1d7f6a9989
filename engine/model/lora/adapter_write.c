/* PEFT adapter files: writing adapter_model.safetensors (adapter.h has the
 * forms).  A layer whose up adapters share their gate's A is written in
 * PEFT's fused form, every other adapter per module. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/safetensors.h"
#include "engine/model/lora/adapter.h"

#define PEFT_PREFIX "base_model.model."

/* The write list: tensors, their names and shapes, and the fused buffers it owns. */
typedef struct {
    eng_st_write_tensor_t *t;
    char (*names)[300];
    int64_t (*shapes)[2];
    float **owned;
    int n, num_owned;
} out_list_t;

static void add(out_list_t *o, const char *name, int ndim, int64_t d0, int64_t d1, const float *data) {
    snprintf(o->names[o->n], sizeof o->names[o->n], "%s", name);
    o->shapes[o->n][0] = d0;
    o->shapes[o->n][1] = d1;
    o->t[o->n] = (eng_st_write_tensor_t){.name = o->names[o->n], .dtype = ENG_ST_F32, .ndim = ndim,
                                         .shape = o->shapes[o->n], .f32 = data};
    o->n++;
}

static bool routed(eng_param_role_t r) {
    return r == ENG_P_EXP_GATE || r == ENG_P_EXP_UP || r == ENG_P_EXP_DOWN;
}

/* PEFT's layout of E per-expert pairs (rank rf) as one wrapper: A (E*rf, in),
 * B (out, E*rf) with B[o, k*E + e]; gate_up stacks each expert's gate rows
 * over its up rows (lower: the up pair, NULL for down_proj). */
static void fuse(out_list_t *o, const char *prefix, const eng_lora_pair_t *const *upper,
                 const eng_lora_pair_t *const *lower, int E) {
    const int rf = upper[0]->r;
    const int64_t in = upper[0]->in, ou = upper[0]->out, out = ou + (lower ? lower[0]->out : 0);
    float *A = malloc((size_t)E * rf * (size_t)in * sizeof *A), *B = malloc((size_t)out * E * rf * sizeof *B);
    MT_CHECK(A && B, "out of host memory allocating %s", "a fused adapter");
    for (int e = 0; e < E; e++) {
        memcpy(A + (size_t)e * rf * (size_t)in, upper[e]->a, (size_t)rf * (size_t)in * sizeof *A);
        for (int64_t i = 0; i < out; i++)
            for (int k = 0; k < rf; k++)
                B[(size_t)i * E * rf + (size_t)k * E + e] =
                    i < ou ? upper[e]->b[(size_t)i * rf + k] : lower[e]->b[(size_t)(i - ou) * rf + k];
    }
    char name[300];
    snprintf(name, sizeof name, "%s.lora_A.weight", prefix);
    add(o, name, 2, (int64_t)E * rf, in, A);
    snprintf(name, sizeof name, "%s.lora_B.weight", prefix);
    add(o, name, 2, out, (int64_t)E * rf, B);
    o->owned[o->num_owned++] = A;
    o->owned[o->num_owned++] = B;
}

/* Layer l's routed experts in PEFT's fused form: gate_up (the inner
 * wrapper, `experts.base_layer`, when down_proj is adapted too) and
 * down_proj (`experts`). */
static mt_status_t fuse_layer(out_list_t *o, const eng_model_desc_t *d, const eng_lora_weights_t *w, int l,
                              mt_error_t *err) {
    const int E = d->num_experts;
    const eng_lora_pair_t **g = calloc((size_t)3 * E, sizeof *g), **u = g + E, **dn = g + 2 * E;
    MT_CHECK_ALLOC(g, "fused adapter list");
    bool has_down = true;
    for (int e = 0; e < E; e++) {
        g[e] = eng_lora_weights_find(w, eng_model_desc_find_role(d, l, ENG_P_EXP_GATE, e));
        u[e] = eng_lora_weights_find(w, eng_model_desc_find_role(d, l, ENG_P_EXP_UP, e));
        dn[e] = eng_lora_weights_find(w, eng_model_desc_find_role(d, l, ENG_P_EXP_DOWN, e));
        has_down = has_down && dn[e];
        if (!g[e] || !u[e] || g[e]->r != g[0]->r || u[e]->r != g[0]->r || (dn[e] && dn[e]->r != dn[0]->r)) {
            free(g);
            return mt_error_set(err, MT_ERR_INTERNAL, "layer %d: a fused gate_up adapter needs every expert's gate "
                                "and up adapters at one rank", l);
        }
    }
    char prefix[200];
    snprintf(prefix, sizeof prefix, PEFT_PREFIX "model.layers.%d.mlp.experts%s", l, has_down ? ".base_layer" : "");
    fuse(o, prefix, g, u, E);
    snprintf(prefix, sizeof prefix, PEFT_PREFIX "model.layers.%d.mlp.experts", l);
    if (has_down) fuse(o, prefix, dn, NULL, E);
    free(g);
    return MT_OK;
}

/* Per layer: its routed experts are written fused (an up pair shares A). */
static bool *fused_layers(const eng_model_desc_t *d, const eng_lora_weights_t *w) {
    int layers = 0;
    for (int i = 0; i < d->count; i++)
        if (d->params[i].layer + 1 > layers) layers = d->params[i].layer + 1;
    bool *f = calloc((size_t)layers + 1, sizeof *f);
    MT_CHECK_ALLOC(f, "fused layer list");
    for (int i = 0; i < w->count; i++)
        if (w->pairs[i].shares_a) f[d->params[w->pairs[i].param].layer] = true;
    return f;
}

mt_status_t eng_lora_weights_write(const char *path, const eng_model_desc_t *d, const eng_lora_weights_t *w,
                                   const char *const *meta_kv, int meta_count, mt_error_t *err) {
    const int n = 2 * w->count + w->num_saved;
    out_list_t o = {.t = calloc((size_t)n + 1, sizeof *o.t), .names = calloc((size_t)n + 1, sizeof *o.names),
                    .shapes = calloc((size_t)n + 1, sizeof *o.shapes), .owned = calloc((size_t)n + 1, sizeof *o.owned)};
    MT_CHECK(o.t && o.names && o.shapes && o.owned, "out of host memory allocating %s", "adapter write list");
    bool *fused = fused_layers(d, w), *pending = fused_layers(d, w);
    mt_status_t st = MT_OK;
    /* description order, pairs and saved modules interleaved as the model lists them */
    int ip = 0, is = 0;
    while ((ip < w->count || is < w->num_saved) && st == MT_OK) {
        if (is >= w->num_saved || (ip < w->count && w->pairs[ip].param < w->saved[is].param)) {
            const eng_lora_pair_t *pr = &w->pairs[ip++];
            const eng_param_spec_t *ps = &d->params[pr->param];
            if (routed(ps->role) && fused[ps->layer]) {
                if (pending[ps->layer]) st = fuse_layer(&o, d, w, ps->layer, err); /* at its first expert */
                pending[ps->layer] = false;
                continue;
            }
            const size_t ml = strlen(ps->name) - strlen(".weight");
            char name[300];
            snprintf(name, sizeof name, PEFT_PREFIX "%.*s.lora_A.weight", (int)ml, ps->name);
            add(&o, name, 2, pr->r, pr->in, pr->a);
            snprintf(name, sizeof name, PEFT_PREFIX "%.*s.lora_B.weight", (int)ml, ps->name);
            add(&o, name, 2, pr->out, pr->r, pr->b);
        } else {
            const eng_lora_full_t *sv = &w->saved[is++];
            const eng_param_spec_t *ps = &d->params[sv->param];
            char name[300];
            snprintf(name, sizeof name, PEFT_PREFIX "%s", ps->name);
            add(&o, name, ps->ndim, ps->shape[0], ps->ndim == 2 ? ps->shape[1] : 0, sv->data);
        }
    }
    if (st == MT_OK) st = eng_st_write(path, o.t, o.n, meta_kv, meta_count, err);
    for (int i = 0; i < o.num_owned; i++) free(o.owned[i]);
    free(o.owned);
    free(o.t);
    free(o.names);
    free(o.shapes);
    free(fused);
    free(pending);
    return st;
}
