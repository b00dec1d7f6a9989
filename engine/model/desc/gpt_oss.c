/* gpt-oss (see family.h): the decoder's attention with biases
 * on q/k/v/o and a learned sink logit per head (self_attn.sinks), layers
 * alternating between a sliding window and full attention (layer_types),
 * and a MoE block of its own: mlp.router with a bias (top-k of the logits,
 * softmax over those k), and experts fused over E as transformers'
 * GptOssExperts holds them:
 *
 *   mlp.experts.gate_up_proj       (E, H, 2I)  x @ W: gate and up interleaved
 *                                              in the last dim (gate = [..., ::2],
 *                                              up = [..., 1::2])
 *   mlp.experts.gate_up_proj_bias  (E, 2I)
 *   mlp.experts.down_proj          (E, I, H)
 *   mlp.experts.down_proj_bias     (E, H)
 *
 * then out = (clamp(up, ±limit) + 1) * g * sigmoid(1.702 g), g = min(gate, limit).
 * These are the names and shapes of a bf16 checkpoint (transformers'
 * save_pretrained of the dequantised model).  The Hub's openai/gpt-oss-*
 * store the two expert matrices in MXFP4 as `<name>_blocks` (E, rows, cols/32,
 * 16) uint8 and `<name>_scales` (E, rows, cols/32) uint8, rows x cols being
 * the transpose of the shapes above: the checkpoint reader dequantises
 * them into these tensors (eng_checkpoint_find_mxfp4, base/quant.h).
 *
 * For the scheduler each fused tensor is listed per expert (name[e], 1/E of
 * it, contiguous in the file), but as a dense weight of its block: the
 * executor moves a fused tensor whole with its block, and every expert's
 * slice gets a gradient each step as transformers' fused parameters do
 * (moe/moe_fused.h), so the plan must not count on leaving idle experts
 * behind. */
#include <stdio.h>

#include "engine/model/desc/walk.h"

/* What the MoE half saves (moe/moe_fused.h): the decoder's routing
 * activations, and per routed row the gathered input, the interleaved
 * gate_up (2I, as EXPERT_G; no separate up) and the expert's output. */
static void mlp_acts(const eng_model_config_t *c, eng_desc_builder_t *b, int l) {
    const int64_t H = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok, I = c->moe_intermediate_size;
    eng_desc_act(b, l, ENG_A_MLP_XN, "mlp.xn", ENG_ACT_FP32, H, 0);
    eng_desc_act(b, l, ENG_A_MLP_RSTD, "mlp.rstd", ENG_ACT_FP32, 1, 0);
    eng_desc_act(b, l, ENG_A_ROUTER_LOGITS, "moe.logits", ENG_ACT_FP32, E, 0);
    eng_desc_act(b, l, ENG_A_ROUTER_PROBS, "moe.probs", ENG_ACT_FP32, E, 0);
    eng_desc_act(b, l, ENG_A_TOPW, "moe.topw", ENG_ACT_FP32, k, 0);
    eng_desc_act(b, l, ENG_A_TOPK_IDX, "moe.idx", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_COUNTS, "moe.counts", ENG_ACT_INT32, 0, E);
    eng_desc_act(b, l, ENG_A_EXPERT_OFFSETS, "moe.offsets", ENG_ACT_INT32, 0, E + 1);
    eng_desc_act(b, l, ENG_A_PERM, "moe.perm", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_INV_PERM, "moe.inv", ENG_ACT_INT32, k, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_X, "moe.xp", ENG_ACT_COMPUTE, k * H, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_G, "moe.gate_up", ENG_ACT_FP32, k * 2 * I, 0);
    eng_desc_act(b, l, ENG_A_EXPERT_OUT, "moe.ep", ENG_ACT_FP32, k * H, 0);
}

mt_status_t eng_gpt_oss_describe(const eng_family_t *f, const eng_model_config_t *c, eng_desc_builder_t *b,
                                 mt_error_t *err) {
    (void)err;
    (void)f;
    const int64_t H = c->hidden_size, V = c->vocab_size, hd = c->head_dim, E = c->num_experts;
    const int64_t I = c->moe_intermediate_size;
    const int64_t qd = (int64_t)c->num_attention_heads * hd, kd = (int64_t)c->num_key_value_heads * hd;
    const char *pre = "model.layers";
    eng_desc_param(b, ENG_P_EMBED, -1, -1, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        eng_desc_param(b, ENG_P_ATTN_NORM, l, -1, H, 0, "%s.%d.input_layernorm.weight", pre, l);
        eng_desc_param(b, ENG_P_Q, l, -1, qd, H, "%s.%d.self_attn.q_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_Q_BIAS, l, -1, qd, 0, "%s.%d.self_attn.q_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_K, l, -1, kd, H, "%s.%d.self_attn.k_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_K_BIAS, l, -1, kd, 0, "%s.%d.self_attn.k_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_V, l, -1, kd, H, "%s.%d.self_attn.v_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_V_BIAS, l, -1, kd, 0, "%s.%d.self_attn.v_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_O, l, -1, H, qd, "%s.%d.self_attn.o_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_O_BIAS, l, -1, H, 0, "%s.%d.self_attn.o_proj.bias", pre, l);
        eng_desc_param(b, ENG_P_ATTN_SINKS, l, -1, c->num_attention_heads, 0, "%s.%d.self_attn.sinks", pre, l);
        eng_desc_param(b, ENG_P_MLP_NORM, l, -1, H, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
        eng_decoder_attn_acts(c, b, l);
        mlp_acts(c, b, l);
        eng_desc_param(b, ENG_P_ROUTER, l, -1, E, H, "%s.%d.mlp.router.weight", pre, l);
        eng_desc_param(b, ENG_P_ROUTER_B, l, -1, E, 0, "%s.%d.mlp.router.bias", pre, l);
        eng_desc_param3(b, ENG_P_EXP_GATE_UP_FUSED, l, E, H, 2 * I, "%s.%d.mlp.experts.gate_up_proj", pre, l);
        eng_desc_param(b, ENG_P_EXP_GATE_UP_BIAS, l, -1, E, 2 * I, "%s.%d.mlp.experts.gate_up_proj_bias", pre, l);
        eng_desc_param3(b, ENG_P_EXP_DOWN_FUSED, l, E, I, H, "%s.%d.mlp.experts.down_proj", pre, l);
        eng_desc_param(b, ENG_P_EXP_DOWN_BIAS, l, -1, E, H, "%s.%d.mlp.experts.down_proj_bias", pre, l);
    }
    eng_decoder_describe_head(c, b);
    return MT_OK;
}

/* A fused expert tensor as E parts of fwd / bwd, dense weights of the block
 * (expert -1: moved and updated whole, see the file's note). */
static void fused_weights(eng_walk_t *w, eng_param_role_t role, int fwd, int bwd) {
    const eng_param_spec_t *p = eng_walk_param(w, role, -1);
    const int E = w->cfg->num_experts;
    const mt_dtype_t dt = eng_param_working_dtype(p, w->wdt);
    for (int e = 0; e < E; e++) {
        char name[160];
        snprintf(name, sizeof name, "%s[%d]", p->name, e);
        eng_walk_add_weight_as(w, name, dt, (double)p->numel / E, -1, !w->s->lora, false, fwd, bwd);
    }
}

/* A grouped product over the routed rows through fused experts: m rows of
 * `in` to `out`, weights read for the experts hit. */
static int fused_linear(eng_walk_t *w, const char *label, double m, double in, double out, eng_param_role_t wrole,
                        eng_param_role_t brole, int *bwd_out) {
    const bool train_w = !w->s->lora;
    const double mm = 2.0 * m * out * in;
    const double wread = w->experts_hit * (out * in + out) * w->wb;
    const double io = m * (in + out) * w->ab;
    int fwd = eng_walk_add_op(w, SCHED_PHASE_FWD, true, mm, wread + io, "L%d.%s.fwd", w->layer, label);
    int bwd = eng_walk_add_op(w, SCHED_PHASE_BWD, true, train_w ? 2 * mm : mm,
                              wread + io + (train_w ? io + w->experts_hit * out * in * 8.0 : 0), "L%d.%s.bwd", w->layer,
                              label);
    fused_weights(w, wrole, fwd, bwd);
    fused_weights(w, brole, fwd, bwd);
    *bwd_out = bwd;
    return fwd;
}

void eng_gpt_oss_moe_ops(eng_walk_t *w, int xn) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size, E = c->num_experts, k = c->num_experts_per_tok;
    const double I = c->moe_intermediate_size, m = n * k;
    const mt_dtype_t adt = w->adt;
    int br;
    int fr = eng_walk_linear(w, "router", n, ENG_P_ROUTER, ENG_P_ROUTER_B, 0, &br);
    sched_program_add_consumer(w->p, xn, br);
    int fs = eng_walk_elementwise(w, SCHED_PHASE_FWD, "route", n * E, 3 * n * E * 4.0);
    eng_walk_act(w, ENG_A_ROUTER_LOGITS, fr, br);
    const eng_act_id_t routing[] = {ENG_A_ROUTER_PROBS, ENG_A_TOPW,  ENG_A_TOPK_IDX, ENG_A_EXPERT_COUNTS,
                                    ENG_A_EXPERT_OFFSETS, ENG_A_PERM, ENG_A_INV_PERM};
    for (size_t i = 0; i < sizeof routing / sizeof routing[0]; i++) eng_walk_act(w, routing[i], fs, br);
    int fp = eng_walk_elementwise(w, SCHED_PHASE_FWD, "permute", m * H, 2 * m * H * w->ab);
    int gp = eng_walk_elementwise(w, SCHED_PHASE_BWD, "permute", m * H, 2 * m * H * w->ab);
    sched_program_add_consumer(w->p, xn, gp);
    eng_walk_act(w, ENG_A_EXPERT_X, fp, gp);
    int bgu, bd;
    int fgu = fused_linear(w, "experts.gate_up", m, H, 2 * I, ENG_P_EXP_GATE_UP_FUSED, ENG_P_EXP_GATE_UP_BIAS, &bgu);
    int fw = eng_walk_elementwise(w, SCHED_PHASE_FWD, "experts.clamped_swiglu", m * I, 3 * m * I * w->ab);
    int fd = fused_linear(w, "experts.down", m, I, H, ENG_P_EXP_DOWN_FUSED, ENG_P_EXP_DOWN_BIAS, &bd);
    eng_walk_act(w, ENG_A_EXPERT_G, fgu, bgu);
    eng_walk_act(w, ENG_A_EXPERT_U, fgu, bgu);
    eng_walk_act(w, ENG_A_EXPERT_OUT, fd, bd);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "moe.h", adt, m * I, fw);
    int last = eng_walk_elementwise(w, SCHED_PHASE_FWD, "combine", m * H, (m + n) * H * w->ab);
    int gc = eng_walk_elementwise(w, SCHED_PHASE_BWD, "combine", m * H, 2 * (m + n) * H * w->ab);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "mlp.y", adt, n * H, last);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_topw", MT_F32, n * k, gc);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_ep", adt, m * H, gc);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.h_recomputed", adt, m * I, bd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.dh", adt, m * I, bd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_logits", MT_F32, n * E, br);
}
