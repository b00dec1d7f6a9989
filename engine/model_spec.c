/* Parameter list per architecture (see model_spec.h).
 *
 * Order is HF's module order (embed, then per layer: input norm, attention,
 * post-attention norm, MLP/MoE; final norm, lm_head), which is also the
 * order checkpoints are saved in. */
#include "engine/model_spec.h"

#include <stdarg.h>
#include <stdio.h>
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
};

const char *eng_param_role_name(eng_param_role_t role) {
    return role < ENG_P_ROLE_COUNT ? k_role_names[role] : "?";
}

typedef struct {
    eng_model_spec_t *spec;
    int cap;
} builder_t;

static void add(builder_t *b, eng_param_role_t role, int layer, int expert, int64_t d0, int64_t d1,
                const char *fmt, ...) __attribute__((format(printf, 7, 8)));



static void add(builder_t *b, eng_param_role_t role, int layer, int expert, int64_t d0, int64_t d1,
                const char *fmt, ...) {
    eng_model_spec_t *s = b->spec;
    if (s->count == b->cap) {
        b->cap = b->cap ? b->cap * 2 : 256;
        s->params = realloc(s->params, (size_t)b->cap * sizeof *s->params);
        MT_CHECK_ALLOC(s->params, "model spec");
    }
    eng_param_spec_t *p = &s->params[s->count++];
    memset(p, 0, sizeof *p);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->name, sizeof p->name, fmt, ap);
    va_end(ap);
    p->role = role;
    p->layer = layer;
    p->expert = expert;
    p->ndim = d1 > 0 ? 2 : 1;
    p->shape[0] = d0;
    p->shape[1] = d1 > 0 ? d1 : 0;
    p->numel = (size_t)d0 * (size_t)(d1 > 0 ? d1 : 1);
}

mt_status_t eng_model_spec_build(const eng_model_config_t *cfg, eng_model_spec_t *out,
                                 mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (cfg->num_hidden_layers > ENG_MAX_LAYERS)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds moetune's limit %d",
                            cfg->num_hidden_layers, ENG_MAX_LAYERS);
    builder_t b = {.spec = out};
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size, hd = cfg->head_dim;
    const int64_t q_out = (int64_t)cfg->num_attention_heads * hd;
    const int64_t kv_out = (int64_t)cfg->num_key_value_heads * hd;
    const int64_t I = cfg->moe_intermediate_size;
    const bool mixtral = cfg->arch == ENG_ARCH_MIXTRAL;

    add(&b, ENG_P_EMBED, -1, -1, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        const char *pre = "model.layers";
        add(&b, ENG_P_ATTN_NORM, l, -1, H, 0, "%s.%d.input_layernorm.weight", pre, l);
        add(&b, ENG_P_Q, l, -1, q_out, H, "%s.%d.self_attn.q_proj.weight", pre, l);
        if (cfg->qkv_bias) add(&b, ENG_P_Q_BIAS, l, -1, q_out, 0, "%s.%d.self_attn.q_proj.bias", pre, l);
        add(&b, ENG_P_K, l, -1, kv_out, H, "%s.%d.self_attn.k_proj.weight", pre, l);
        if (cfg->qkv_bias) add(&b, ENG_P_K_BIAS, l, -1, kv_out, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        add(&b, ENG_P_V, l, -1, kv_out, H, "%s.%d.self_attn.v_proj.weight", pre, l);
        if (cfg->qkv_bias) add(&b, ENG_P_V_BIAS, l, -1, kv_out, 0, "%s.%d.self_attn.v_proj.bias", pre, l);
        add(&b, ENG_P_O, l, -1, H, q_out, "%s.%d.self_attn.o_proj.weight", pre, l);
        /* Qwen3's o_proj takes its bias from attention_bias too; Qwen2-MoE's never has one */
        if (cfg->qkv_bias && cfg->arch == ENG_ARCH_QWEN3_MOE)
            add(&b, ENG_P_O_BIAS, l, -1, H, 0, "%s.%d.self_attn.o_proj.bias", pre, l);
        if (cfg->qk_norm) {
            add(&b, ENG_P_Q_NORM, l, -1, hd, 0, "%s.%d.self_attn.q_norm.weight", pre, l);
            add(&b, ENG_P_K_NORM, l, -1, hd, 0, "%s.%d.self_attn.k_norm.weight", pre, l);
        }
        add(&b, ENG_P_MLP_NORM, l, -1, H, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
        if (!cfg->layer_is_moe[l]) {
            const int64_t Id = cfg->intermediate_size;
            add(&b, ENG_P_DENSE_GATE, l, -1, Id, H, "%s.%d.mlp.gate_proj.weight", pre, l);
            add(&b, ENG_P_DENSE_UP, l, -1, Id, H, "%s.%d.mlp.up_proj.weight", pre, l);
            add(&b, ENG_P_DENSE_DOWN, l, -1, H, Id, "%s.%d.mlp.down_proj.weight", pre, l);
            continue;
        }
        const char *moe = mixtral ? "block_sparse_moe" : "mlp";
        add(&b, ENG_P_ROUTER, l, -1, cfg->num_experts, H, "%s.%d.%s.gate.weight", pre, l, moe);
        for (int e = 0; e < cfg->num_experts; e++) {
            if (mixtral) {
                add(&b, ENG_P_EXP_GATE, l, e, I, H, "%s.%d.%s.experts.%d.w1.weight", pre, l, moe, e);
                add(&b, ENG_P_EXP_DOWN, l, e, H, I, "%s.%d.%s.experts.%d.w2.weight", pre, l, moe, e);
                add(&b, ENG_P_EXP_UP, l, e, I, H, "%s.%d.%s.experts.%d.w3.weight", pre, l, moe, e);
            } else {
                add(&b, ENG_P_EXP_GATE, l, e, I, H, "%s.%d.%s.experts.%d.gate_proj.weight", pre, l, moe, e);
                add(&b, ENG_P_EXP_UP, l, e, I, H, "%s.%d.%s.experts.%d.up_proj.weight", pre, l, moe, e);
                add(&b, ENG_P_EXP_DOWN, l, e, H, I, "%s.%d.%s.experts.%d.down_proj.weight", pre, l, moe, e);
            }
        }
        if (cfg->shared_expert_intermediate_size > 0) {
            const int64_t Is = cfg->shared_expert_intermediate_size;
            add(&b, ENG_P_SHARED_GATE, l, -1, Is, H, "%s.%d.mlp.shared_expert.gate_proj.weight", pre, l);
            add(&b, ENG_P_SHARED_UP, l, -1, Is, H, "%s.%d.mlp.shared_expert.up_proj.weight", pre, l);
            add(&b, ENG_P_SHARED_DOWN, l, -1, H, Is, "%s.%d.mlp.shared_expert.down_proj.weight", pre, l);
            add(&b, ENG_P_SHARED_EXPERT_GATE, l, -1, 1, H, "%s.%d.mlp.shared_expert_gate.weight", pre, l);
        }
    }
    add(&b, ENG_P_FINAL_NORM, -1, -1, H, 0, "model.norm.weight");
    if (!cfg->tie_word_embeddings) add(&b, ENG_P_LM_HEAD, -1, -1, V, H, "lm_head.weight");
    return MT_OK;
}

void eng_model_spec_free(eng_model_spec_t *spec) {
    free(spec->params);
    memset(spec, 0, sizeof *spec);
}

int eng_model_spec_find(const eng_model_spec_t *spec, const char *name) {
    for (int i = 0; i < spec->count; i++)
        if (strcmp(spec->params[i].name, name) == 0) return i;
    return -1;
}

size_t eng_model_spec_numel(const eng_model_spec_t *spec) {
    size_t n = 0;
    for (int i = 0; i < spec->count; i++) n += spec->params[i].numel;
    return n;
}

size_t eng_model_spec_active_numel(const eng_model_spec_t *spec, const eng_model_config_t *cfg) {
    /* A token passes through k of E routed experts; everything else is used
     * by every token. The embedding counts once (one row is read, but the
     * convention in model cards counts the whole table). */
    size_t shared = 0, routed = 0;
    for (int i = 0; i < spec->count; i++) {
        if (spec->params[i].expert >= 0) routed += spec->params[i].numel;
        else shared += spec->params[i].numel;
    }
    if (cfg->num_experts <= 0) return shared + routed;
    return shared + routed / (size_t)cfg->num_experts * (size_t)cfg->num_experts_per_tok;
}
