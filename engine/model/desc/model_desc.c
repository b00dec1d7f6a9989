/* Lookups on a built model description (see model_desc.h): parameters by
 * name or place, saved activations and their sizes, working dtypes, counts.
 *
 * The bottom of the description: the families (family.c's table, the
 * describe and ops functions) and the builder (builder.c) call these, and
 * nothing here knows a family, so this file includes no family.h.
 *
 * Parameter order is HF's module order (embed, then per layer: input norm,
 * attention, post-attention norm, MLP/MoE; final norm, lm_head), which is
 * also the order checkpoints are saved in.  Activation order is the order
 * the forward allocates them (engine/layers/blocks.c, moe/moe_layer.c). */
#include "engine/model/desc/model_desc.h"

#include <stdlib.h>
#include <string.h>

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
