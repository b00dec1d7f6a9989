/* The decoder families' tensors (see family.h): parameters in
 * HF module order and each layer's saved activations in the order the
 * forward allocates them (engine/exec/step.c allocates x_mid, then
 * engine/layers/blocks.c the attention half's, then the MLP half's, with
 * moe/moe_layer.c's for a sparse layer). */
#include <stdio.h>

#include "engine/model/desc/family.h"
#include "kernels/attention.h"

/* Storage classes: see eng_act_class_t.  The attention input norm (read
 * by q/k/v's products) and the experts' gathered inputs (read by their
 * gate/up products) are the products-only ones, and q, k, v and the
 * attention output where the tensor-core attention reads them; the MLP
 * input norm also feeds the router, whose products are fp32
 * (moe/moe_layer.c). */
void eng_decoder_attn_acts(const eng_model_config_t *cfg, eng_desc_builder_t *b, int l) {
    const int64_t H = cfg->hidden_size, hd = cfg->head_dim;
    const int64_t nh = cfg->num_attention_heads, nkv = cfg->num_key_value_heads;
    const int64_t qd = nh * hd, kd = nkv * hd;
    eng_desc_act(b, l, ENG_A_X_MID, "mid", ENG_ACT_FP32, H, 0);
    eng_desc_act(b, l, ENG_A_ATTN_XN, "attn.xn", ENG_ACT_COMPUTE, H, 0);
    eng_desc_act(b, l, ENG_A_ATTN_RSTD, "attn.rstd", ENG_ACT_FP32, 1, 0);
    /* q, k, v and the attention output: in a bf16 run only the tensor-core
     * attention (kernels/attention.h, which reads and writes them in bf16)
     * and o_proj's products read them, where that path takes the shape;
     * fp32 where the fp32 kernel is the one that runs, and under gpt-oss's
     * sinks, whose fp32 kernel rescales the output in place. */
    const eng_act_class_t qkvo =
        kern_attention_tc_takes((int)nh, (int)nkv, (int)hd) && !cfg->attn_sinks ? ENG_ACT_COMPUTE : ENG_ACT_FP32;
    eng_desc_act(b, l, ENG_A_Q, "attn.q", qkvo, qd, 0);
    eng_desc_act(b, l, ENG_A_K, "attn.k", qkvo, kd, 0);
    eng_desc_act(b, l, ENG_A_V, "attn.v", qkvo, kd, 0);
    if (cfg->qk_norm) {
        /* per head (Qwen3) one rstd per head and token; over the whole
         * projection (OLMoE) one per token */
        eng_desc_act(b, l, ENG_A_Q_PRE, "attn.q_pre", ENG_ACT_FP32, qd, 0);
        eng_desc_act(b, l, ENG_A_K_PRE, "attn.k_pre", ENG_ACT_FP32, kd, 0);
        eng_desc_act(b, l, ENG_A_Q_RSTD, "attn.q_rstd", ENG_ACT_FP32, cfg->qk_norm_whole ? 1 : nh, 0);
        eng_desc_act(b, l, ENG_A_K_RSTD, "attn.k_rstd", ENG_ACT_FP32, cfg->qk_norm_whole ? 1 : nkv, 0);
    }
    eng_desc_act(b, l, ENG_A_ATT, "attn.out", qkvo, qd, 0);
    eng_desc_act(b, l, ENG_A_LSE, "attn.lse", ENG_ACT_FP32, nh, 0);
}

void eng_decoder_mlp_acts(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b, int l) {
    const int64_t H = cfg->hidden_size;
    eng_desc_act(b, l, ENG_A_MLP_XN, "mlp.xn", ENG_ACT_FP32, H, 0);
    eng_desc_act(b, l, ENG_A_MLP_RSTD, "mlp.rstd", ENG_ACT_FP32, 1, 0);
    if (!cfg->layer_is_moe[l]) {
        eng_desc_act(b, l, ENG_A_DENSE_G, "mlp.g", ENG_ACT_FP32, cfg->intermediate_size, 0);
        eng_desc_act(b, l, ENG_A_DENSE_U, "mlp.u", ENG_ACT_FP32, cfg->intermediate_size, 0);
        return;
    }
    const int64_t E = cfg->num_experts, k = cfg->num_experts_per_tok, I = cfg->moe_intermediate_size;
    eng_desc_act(b, l, ENG_A_ROUTER_LOGITS, "moe.logits", ENG_ACT_FP32, E, 0);
    eng_desc_act(b, l, ENG_A_ROUTER_PROBS, "moe.probs", ENG_ACT_FP32, E, 0);
    eng_desc_act(b, l, ENG_A_TOPW, "moe.topw", ENG_ACT_FP32, k, 0);
    eng_desc_act(b, l, ENG_A_TOPK_IDX, "moe.idx", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_COUNTS, "moe.counts", ENG_ACT_INT32, 0, E);
    eng_desc_act(b, l, ENG_A_EXPERT_OFFSETS, "moe.offsets", ENG_ACT_INT32, 0, E + 1);
    eng_desc_act(b, l, ENG_A_PERM, "moe.perm", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_INV_PERM, "moe.inv", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_X, "moe.xp", ENG_ACT_COMPUTE, k * H, 0);
    /* the routed experts' gate, up and down outputs: written by their
     * products in the compute dtype, as autocast's linear layers do
     * (moe/moe_experts.c) */
    eng_desc_act(b, l, ENG_A_EXPERT_G, "moe.g", ENG_ACT_COMPUTE, k * I, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_U, "moe.u", ENG_ACT_COMPUTE, k * I, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_OUT, "moe.ep", ENG_ACT_COMPUTE, k * H, 0);
    if (cfg->shared_expert_intermediate_size > 0) {
        const int64_t Is = cfg->shared_expert_intermediate_size;
        eng_desc_act(b, l, ENG_A_SHARED_G, "shared.g", ENG_ACT_FP32, Is, 0);
        eng_desc_act(b, l, ENG_A_SHARED_U, "shared.u", ENG_ACT_FP32, Is, 0);
        eng_desc_act(b, l, ENG_A_SHARED_OUT, "shared.out", ENG_ACT_FP32, H, 0);
        /* the shared expert's sigmoid gate: fp32, as the router's logits */
        if (f->shared_gate) eng_desc_act(b, l, ENG_A_SHARED_GATE_LOGIT, "shared.gate_logit", ENG_ACT_FP32, 1, 0);
    }
}

mt_status_t eng_decoder_describe(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b,
                                 mt_error_t *err) {
    (void)err;
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size, hd = cfg->head_dim;
    const int64_t q_out = (int64_t)cfg->num_attention_heads * hd;
    const int64_t kv_out = (int64_t)cfg->num_key_value_heads * hd;
    const char *pre = "model.layers";

    eng_desc_param(b, ENG_P_EMBED, -1, -1, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < cfg->num_hidden_layers; l++) {
        eng_desc_param(b, ENG_P_ATTN_NORM, l, -1, H, 0, "%s.%d.input_layernorm.weight", pre, l);
        eng_desc_param(b, ENG_P_Q, l, -1, q_out, H, "%s.%d.self_attn.q_proj.weight", pre, l);
        if (cfg->qkv_bias) eng_desc_param(b, ENG_P_Q_BIAS, l, -1, q_out, 0, "%s.%d.self_attn.q_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_K, l, -1, kv_out, H, "%s.%d.self_attn.k_proj.weight", pre, l);
        if (cfg->qkv_bias) eng_desc_param(b, ENG_P_K_BIAS, l, -1, kv_out, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_V, l, -1, kv_out, H, "%s.%d.self_attn.v_proj.weight", pre, l);
        if (cfg->qkv_bias) eng_desc_param(b, ENG_P_V_BIAS, l, -1, kv_out, 0, "%s.%d.self_attn.v_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_O, l, -1, H, q_out, "%s.%d.self_attn.o_proj.weight", pre, l);
        /* Qwen3's (and OLMoE's) o_proj takes its bias from attention_bias too; Qwen2-MoE's never has one */
        if (cfg->qkv_bias && f->o_bias)
            eng_desc_param(b, ENG_P_O_BIAS, l, -1, H, 0, "%s.%d.self_attn.o_proj.bias", pre, l);
        if (cfg->qk_norm) {
            /* per head: (hd); over the whole projection (OLMoE): (nh*hd), (nkv*hd) */
            eng_desc_param(b, ENG_P_Q_NORM, l, -1, cfg->qk_norm_whole ? q_out : hd, 0,
                           "%s.%d.self_attn.q_norm.weight", pre, l);
            eng_desc_param(b, ENG_P_K_NORM, l, -1, cfg->qk_norm_whole ? kv_out : hd, 0,
                           "%s.%d.self_attn.k_norm.weight", pre, l);
        }
        eng_desc_param(b, ENG_P_MLP_NORM, l, -1, H, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
        eng_decoder_attn_acts(cfg, b, l);
        eng_decoder_mlp_acts(f, cfg, b, l);
        eng_decoder_describe_mlp(f, cfg, b, l);
    }
    eng_decoder_describe_head(cfg, b);
    return MT_OK;
}

void eng_decoder_describe_mlp(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b, int l) {
    const int64_t H = cfg->hidden_size, I = cfg->moe_intermediate_size;
    const char *pre = "model.layers";
    if (!cfg->layer_is_moe[l]) {
        const int64_t Id = cfg->intermediate_size;
        eng_desc_param(b, ENG_P_DENSE_GATE, l, -1, Id, H, "%s.%d.mlp.gate_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_DENSE_UP, l, -1, Id, H, "%s.%d.mlp.up_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_DENSE_DOWN, l, -1, H, Id, "%s.%d.mlp.down_proj.weight", pre, l);
        return;
    }
    const char *moe = f->moe_block;
    eng_desc_param(b, ENG_P_ROUTER, l, -1, cfg->num_experts, H, "%s.%d.%s.gate.weight", pre, l, moe);
    /* DeepSeek-V3 / GLM-4.5: the bias added to the scores only to choose
     * experts, updated outside the gradient (a registered buffer) */
    if (cfg->router_score_bias)
        eng_desc_buffer(b, ENG_P_ROUTER_BIAS, l, cfg->num_experts, 0, "%s.%d.%s.gate.e_score_correction_bias", pre, l,
                        moe);
    for (int e = 0; e < cfg->num_experts; e++)
        for (int j = 0; j < 3; j++) {
            const bool down = f->experts[j].role == ENG_P_EXP_DOWN;
            eng_desc_param(b, f->experts[j].role, l, e, down ? H : I, down ? I : H, "%s.%d.%s.experts.%d.%s.weight",
                           pre, l, moe, e, f->experts[j].leaf);
        }
    if (cfg->shared_expert_intermediate_size > 0) {
        const int64_t Is = cfg->shared_expert_intermediate_size;
        const char *sb = f->shared_block;
        eng_desc_param(b, ENG_P_SHARED_GATE, l, -1, Is, H, "%s.%d.mlp.%s.gate_proj.weight", pre, l, sb);
        eng_desc_param(b, ENG_P_SHARED_UP, l, -1, Is, H, "%s.%d.mlp.%s.up_proj.weight", pre, l, sb);
        eng_desc_param(b, ENG_P_SHARED_DOWN, l, -1, H, Is, "%s.%d.mlp.%s.down_proj.weight", pre, l, sb);
        if (f->shared_gate)
            eng_desc_param(b, ENG_P_SHARED_EXPERT_GATE, l, -1, 1, H, "%s.%d.mlp.shared_expert_gate.weight", pre, l);
    }
}

void eng_decoder_describe_head(const eng_model_config_t *cfg, eng_desc_builder_t *b) {
    const int64_t H = cfg->hidden_size, V = cfg->vocab_size;
    eng_desc_param(b, ENG_P_FINAL_NORM, -1, -1, H, 0, "model.norm.weight");
    if (!cfg->tie_word_embeddings) eng_desc_param(b, ENG_P_LM_HEAD, -1, -1, V, H, "lm_head.weight");
}
