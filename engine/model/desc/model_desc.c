/* Model descriptions (see model_desc.h): the family table, the decoder
 * families' parameters and saved activations, and the lookups derived from
 * them.
 *
 * Parameter order is HF's module order (embed, then per layer: input norm,
 * attention, post-attention norm, MLP/MoE; final norm, lm_head), which is
 * also the order checkpoints are saved in.  Activation order is the order
 * the forward allocates them (engine/layers/blocks.c, moe/moe_layer.c). */
#include "engine/model/desc/model_desc.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/desc/family.h"
#include "base/grow.h"

static const char *const k_role_names[ENG_P_ROLE_COUNT] = {
    [ENG_P_EMBED] = "embed",
    [ENG_P_ATTN_NORM] = "attn_norm",
    [ENG_P_Q] = "q_proj",
    [ENG_P_K] = "k_proj",
    [ENG_P_V] = "v_proj",
    [ENG_P_O] = "o_proj",
    [ENG_P_Q_BIAS] = "q_bias",
    [ENG_P_K_BIAS] = "k_bias",
    [ENG_P_V_BIAS] = "v_bias",
    [ENG_P_O_BIAS] = "o_bias",
    [ENG_P_Q_NORM] = "q_norm",
    [ENG_P_K_NORM] = "k_norm",
    [ENG_P_MLP_NORM] = "mlp_norm",
    [ENG_P_ROUTER] = "router",
    [ENG_P_EXP_GATE] = "expert_gate",
    [ENG_P_EXP_UP] = "expert_up",
    [ENG_P_EXP_DOWN] = "expert_down",
    [ENG_P_SHARED_GATE] = "shared_gate",
    [ENG_P_SHARED_UP] = "shared_up",
    [ENG_P_SHARED_DOWN] = "shared_down",
    [ENG_P_SHARED_EXPERT_GATE] = "shared_expert_gate",
    [ENG_P_DENSE_GATE] = "dense_gate",
    [ENG_P_DENSE_UP] = "dense_up",
    [ENG_P_DENSE_DOWN] = "dense_down",
    [ENG_P_FINAL_NORM] = "final_norm",
    [ENG_P_LM_HEAD] = "lm_head",
    [ENG_P_ROUTER_BIAS] = "router_bias",
    [ENG_P_Q_A] = "q_a_proj",
    [ENG_P_Q_A_NORM] = "q_a_layernorm",
    [ENG_P_Q_B] = "q_b_proj",
    [ENG_P_KV_A] = "kv_a_proj_with_mqa",
    [ENG_P_KV_A_NORM] = "kv_a_layernorm",
    [ENG_P_KV_B] = "kv_b_proj",
    [ENG_P_ATTN_SINKS] = "sinks",
    [ENG_P_ROUTER_B] = "router.bias",
    [ENG_P_EXP_GATE_UP_FUSED] = "experts.gate_up_proj",
    [ENG_P_EXP_GATE_UP_BIAS] = "experts.gate_up_proj_bias",
    [ENG_P_EXP_DOWN_FUSED] = "experts.down_proj",
    [ENG_P_EXP_DOWN_BIAS] = "experts.down_proj_bias",
    [ENG_P_LORA_A] = "lora_A",
    [ENG_P_LORA_B] = "lora_B",
};

const char *eng_param_role_name(eng_param_role_t role) {
    return role < ENG_P_ROLE_COUNT ? k_role_names[role] : "?";
}

/* ---- the families ------------------------------------------------------------
 *
 * The one place a family is described.  A new family is a row here: its
 * HF names and the two functions that list its tensors and its ops (the
 * decoder's when its layers are built like these). */
#define HF_EXPERTS {{ENG_P_EXP_GATE, "gate_proj"}, {ENG_P_EXP_UP, "up_proj"}, {ENG_P_EXP_DOWN, "down_proj"}}
static const eng_family_t k_families[] = {
    {ENG_ARCH_MIXTRAL, "Mixtral", "block_sparse_moe",
     {{ENG_P_EXP_GATE, "w1"}, {ENG_P_EXP_DOWN, "w2"}, {ENG_P_EXP_UP, "w3"}},
     false, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_QWEN2_MOE, "Qwen2-MoE", "mlp", HF_EXPERTS,
     false, "shared_expert", true, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_QWEN3_MOE, "Qwen3-MoE", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_OLMOE, "OLMoE", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    /* MLA (engine/layers/mla.c) and the grouped router (kernels/router_group.h:
     * softmax for V2, sigmoid for V3); what they cannot train yet (FP8
     * configs, ...) is refused by engine/model/trainable.c */
    {ENG_ARCH_DEEPSEEK_V2, "DeepSeek-V2", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_mla_describe, eng_decoder_ops, eng_mla_attention_ops, NULL},
    {ENG_ARCH_DEEPSEEK_V3, "DeepSeek-V3", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_mla_describe, eng_decoder_ops, eng_mla_attention_ops, NULL},
    /* GLM-4.5: the decoder's layers (partial RoPE, engine/layers/rope_partial.c) with DeepSeek-V3's router and
     * shared experts; o_proj never has a bias */
    {ENG_ARCH_GLM4_MOE, "GLM-4.5", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_GPT_OSS, "gpt-oss", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_gpt_oss_describe, eng_decoder_ops, NULL, eng_gpt_oss_moe_ops},
};
#undef HF_EXPERTS

const eng_family_t *eng_family_of(eng_arch_t arch) {
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
        if (k_families[i].arch == arch) return &k_families[i];
    return NULL;
}

const char *eng_model_desc_family_name(const eng_model_desc_t *d) {
    return d->family ? d->family->name : "?";
}

/* ---- building ------------------------------------------------------------------ */

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

mt_status_t eng_model_desc_build(const eng_model_config_t *cfg, eng_model_desc_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (cfg->num_hidden_layers > ENG_MAX_LAYERS)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds moetune's limit %d",
                            cfg->num_hidden_layers, ENG_MAX_LAYERS);
    const eng_family_t *f = eng_family_of(cfg->arch);
    if (!f)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "model_type %s: no model description for this family",
                            cfg->model_type);
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

void eng_model_desc_free(eng_model_desc_t *d) {
    free(d->params);
    free(d->buffers);
    free(d->layer_acts);
    free(d->role_at);
    free(d->expert_at);
    memset(d, 0, sizeof *d);
}

/* ---- lookups ------------------------------------------------------------------- */

int eng_model_desc_find(const eng_model_desc_t *d, const char *name) {
    for (int i = 0; i < d->count; i++)
        if (strcmp(d->params[i].name, name) == 0) return i;
    return -1;
}

int eng_model_desc_find_role(const eng_model_desc_t *d, int layer, eng_param_role_t role, int expert) {
    if (layer < -1 || layer >= d->num_layers || (unsigned)role >= ENG_P_ROLE_COUNT) return -1;
    if (expert >= 0) {
        if (layer < 0 || expert >= d->num_experts || role < ENG_P_EXP_GATE || role > ENG_P_EXP_DOWN) return -1;
        return d->expert_at[((size_t)layer * 3 + (role - ENG_P_EXP_GATE)) * d->num_experts + expert];
    }
    return d->role_at[(size_t)(layer + 1) * ENG_P_ROLE_COUNT + role];
}

void eng_model_desc_note_dtype(eng_model_desc_t *d, const char *name, mt_dtype_t dtype) {
    for (int i = 0; i < d->count; i++)
        if (strcmp(d->params[i].name, name) == 0) {
            d->params[i].dtype = dtype;
            return;
        }
    for (int i = 0; i < d->num_buffers; i++)
        if (strcmp(d->buffers[i].name, name) == 0) {
            d->buffers[i].dtype = dtype;
            return;
        }
}

const eng_act_desc_t *eng_model_desc_act(const eng_model_desc_t *d, int layer, eng_act_id_t id) {
    if (layer < 0 || layer >= d->num_layers || (unsigned)id >= ENG_ACT_COUNT) return NULL;
    const eng_layer_acts_t *la = &d->layer_acts[layer];
    return la->index[id] >= 0 ? &la->act[la->index[id]] : NULL;
}

size_t eng_act_numel(const eng_act_desc_t *a, int64_t n) {
    return (size_t)(a->per_token * n + a->fixed);
}

mt_dtype_t eng_param_working_dtype(const eng_param_spec_t *p, mt_dtype_t compute) {
    if (compute != MT_BF16) return MT_F32;
    /* an adapter factor is an operand of the same products as its module */
    const eng_param_role_t role = p->role == ENG_P_LORA_A || p->role == ENG_P_LORA_B ? p->adapts : p->role;
    /* gpt-oss's expert biases are 2-D (E, .) but read as biases, in fp32 */
    const bool bias = role == ENG_P_EXP_GATE_UP_BIAS || role == ENG_P_EXP_DOWN_BIAS;
    return p->ndim >= 2 && role != ENG_P_EMBED && role != ENG_P_ROUTER && !bias ? MT_BF16 : MT_F32;
}

mt_dtype_t eng_act_dtype(eng_act_class_t cls, mt_dtype_t compute) {
    switch (cls) {
    case ENG_ACT_COMPUTE: return compute;
    case ENG_ACT_FP32: return MT_F32;
    case ENG_ACT_INT32: return MT_I32;
    }
    return compute;
}

size_t eng_model_desc_layer_act_bytes(const eng_model_desc_t *d, int layer, int64_t n, mt_dtype_t compute,
                                      size_t align) {
    if (layer < 0 || layer >= d->num_layers) return 0;
    const eng_layer_acts_t *la = &d->layer_acts[layer];
    const size_t a = align > 0 ? align : 1;
    size_t bytes = 0;
    for (int i = 0; i < la->count; i++) {
        const size_t raw = eng_act_numel(&la->act[i], n) * mt_dtype_size(eng_act_dtype(la->act[i].cls, compute));
        bytes += (raw + a - 1) / a * a;
    }
    return bytes;
}

size_t eng_model_desc_numel(const eng_model_desc_t *d) {
    size_t n = 0;
    for (int i = 0; i < d->count; i++) n += d->params[i].numel;
    return n;
}

bool eng_param_role_fused_experts(eng_param_role_t role) {
    return role == ENG_P_EXP_GATE_UP_FUSED || role == ENG_P_EXP_GATE_UP_BIAS || role == ENG_P_EXP_DOWN_FUSED ||
           role == ENG_P_EXP_DOWN_BIAS;
}

bool eng_model_desc_trains(const eng_model_desc_t *d) {
    return d->family && d->family->trains;
}

size_t eng_model_desc_active_numel(const eng_model_desc_t *d, const eng_model_config_t *cfg) {
    /* A token passes through k of E routed experts; everything else is used
     * by every token. The embedding counts once (one row is read, but the
     * convention in model cards counts the whole table). */
    size_t shared = 0, routed = 0;
    for (int i = 0; i < d->count; i++) {
        if (d->params[i].expert >= 0 || eng_param_role_fused_experts(d->params[i].role)) routed += d->params[i].numel;
        else shared += d->params[i].numel;
    }
    if (cfg->num_experts <= 0) return shared + routed;
    return shared + routed / (size_t)cfg->num_experts * (size_t)cfg->num_experts_per_tok;
}
