/* Building a model description (see family.h): the calls through which a
 * family's `describe` lists its parameters, buffers and saved activations,
 * and the index the lookups (model_desc.c) read.
 *
 * Its own file, below the families that call it and above model_desc.c's
 * lookups: the family table (family.c) runs a family's `describe` through
 * eng_desc_build, the family calls the builder, and nothing here calls a
 * family by name, so no two files call each other. */
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "engine/model/desc/family.h"

struct eng_desc_builder {
    eng_model_desc_t *d;
    int cap, cap_buf;
    mt_dtype_t dtype; /* config.json's dtype */
};

static eng_param_spec_t *push(eng_param_spec_t **list, int *count, int *cap) {
    MT_GROW(*list, *cap, *count + 1, "model description");
    eng_param_spec_t *p = &(*list)[(*count)++];
    memset(p, 0, sizeof *p);
    return p;
}

static void fill(eng_desc_builder_t *b, eng_param_spec_t *p, eng_param_role_t role, int layer, int expert,
                 int64_t d0, int64_t d1, int64_t d2, const char *fmt, va_list ap) {
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    p->role = role;
    p->layer = layer;
    p->expert = expert;
    p->ndim = d2 > 0 ? 3 : d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->shape[2] = d2 > 0 ? d2 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1) * (size_t)(d2 > 0 ? d2 : 1);
    p->dtype = b->dtype;
}

void eng_desc_param(eng_desc_builder_t *b, eng_param_role_t role, int layer, int expert, int64_t d0, int64_t d1,
                    const char *fmt, ...) {
    eng_param_spec_t *p = push(&b->d->params, &b->d->count, &b->cap);
    va_list ap;
    va_start(ap, fmt);
    fill(b, p, role, layer, expert, d0, d1, 0, fmt, ap);
    va_end(ap);
    p->kind = ENG_TENSOR_PARAM;
    p->trainable = true;
}

void eng_desc_param3(eng_desc_builder_t *b, eng_param_role_t role, int layer, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) {
    eng_param_spec_t *p = push(&b->d->params, &b->d->count, &b->cap);
    va_list ap;
    va_start(ap, fmt);
    fill(b, p, role, layer, -1, d0, d1, d2, fmt, ap);
    va_end(ap);
    p->kind = ENG_TENSOR_PARAM;
    p->trainable = true;
}

void eng_desc_buffer(eng_desc_builder_t *b, eng_param_role_t role, int layer, int64_t d0, int64_t d1,
                     const char *fmt, ...) {
    eng_param_spec_t *p = push(&b->d->buffers, &b->d->num_buffers, &b->cap_buf);
    va_list ap;
    va_start(ap, fmt);
    fill(b, p, role, layer, -1, d0, d1, 0, fmt, ap);
    va_end(ap);
    p->kind = ENG_TENSOR_BUFFER;
    p->trainable = false;
}

void eng_desc_act(eng_desc_builder_t *b, int layer, eng_act_id_t id, const char *name, eng_act_class_t cls,
                  int64_t per_token, int64_t fixed) {
    eng_layer_acts_t *la = &b->d->layer_acts[layer];
    MT_CHECK(la->index[id] < 0, "activation %s listed twice in layer %d", name, layer);
    la->index[id] = (int8_t)la->count;
    la->act[la->count++] = (eng_act_desc_t){id, name, cls, per_token, fixed};
}

/* config.json's dtype (transformers 5) or torch_dtype; fp32 when it names none. */
static mt_dtype_t config_dtype(const eng_model_config_t *cfg) {
    if (!cfg->config_json) return MT_F32;
    json_t *root = json_loads(cfg->config_json, 0, NULL);
    if (!root) return MT_F32;
    const json_t *v = json_object_get(root, "dtype");
    if (!json_is_string(v)) v = json_object_get(root, "torch_dtype");
    mt_dtype_t dt = MT_F32;
    if (json_is_string(v)) {
        const char *s = json_string_value(v);
        if (strcmp(s, "bfloat16") == 0) dt = MT_BF16;
        else if (strcmp(s, "float16") == 0) dt = MT_F16;
    }
    json_decref(root);
    return dt;
}

/* The lookups' index: each (layer, role) and each routed expert's
 * tensor to its position in params (model_desc.h's role_at, expert_at). */
static void build_index(eng_model_desc_t *d) {
    const int L = d->num_layers, E = d->num_experts > 0 ? d->num_experts : 1;
    d->role_at = malloc((size_t)(L + 1) * ENG_P_ROLE_COUNT * sizeof *d->role_at);
    d->expert_at = malloc((size_t)(L > 0 ? L : 1) * 3 * E * sizeof *d->expert_at);
    MT_CHECK(d->role_at && d->expert_at, "out of host memory for the model description index");
    for (int i = 0; i < (L + 1) * ENG_P_ROLE_COUNT; i++) d->role_at[i] = -1;
    for (int i = 0; i < L * 3 * E; i++) d->expert_at[i] = -1;
    for (int i = 0; i < d->count; i++) {
        const eng_param_spec_t *p = &d->params[i];
        if (p->expert >= 0 && p->layer >= 0 && p->expert < E &&
            (p->role == ENG_P_EXP_GATE || p->role == ENG_P_EXP_UP || p->role == ENG_P_EXP_DOWN)) {
            const int r = p->role - ENG_P_EXP_GATE;
            d->expert_at[((size_t)p->layer * 3 + r) * E + p->expert] = i;
        } else if (p->layer < L) {
            int *slot = &d->role_at[(size_t)(p->layer + 1) * ENG_P_ROLE_COUNT + p->role];
            if (*slot < 0) *slot = i;
        }
    }
}

mt_status_t eng_desc_build(const eng_family_t *f, const eng_model_config_t *cfg, eng_model_desc_t *out,
                           mt_error_t *err) {
    out->family = f;
    out->num_layers = cfg->num_hidden_layers;
    out->num_experts = cfg->num_experts;
    out->layer_acts = calloc((size_t)(out->num_layers > 0 ? out->num_layers : 1), sizeof *out->layer_acts);
    MT_CHECK_ALLOC(out->layer_acts, "model description activations");
    for (int l = 0; l < out->num_layers; l++) memset(out->layer_acts[l].index, -1, sizeof out->layer_acts[l].index);
    eng_desc_builder_t b = {.d = out, .dtype = config_dtype(cfg)};
    mt_status_t st = f->describe(f, cfg, &b, err);
    if (st != MT_OK) {
        eng_model_desc_free(out);
        return st;
    }
    build_index(out);
    return MT_OK;
}
