/* DeepSeek-V2 / V3 (see family.h): Multi-head Latent Attention
 * and the decoder's MLP half with DeepSeek's shared experts and, for V3,
 * the router's e_score_correction_bias buffer.
 *
 * MLA, as transformers' DeepseekV3Attention computes it: q goes through a
 * low-rank latent (q_a_proj, an RMSNorm, q_b_proj; V2-Lite has q_proj
 * directly), k and v are decompressed per head from one latent of
 * kv_lora_rank shared by all heads (kv_a_proj_with_mqa also emits the
 * qk_rope_head_dim rotary key part, shared by every head), so each head has
 * a query/key of qk_nope + qk_rope and a value of v_head_dim.
 *
 * The multi-token-prediction layers DeepSeek-V3 ships after the last layer
 * (num_nextn_predict_layers, model.layers.61.* there) are not part of the
 * model transformers builds and are not described: a checkpoint's loader
 * reports them as unused tensors (allow_unused_tensors), and the totals
 * here leave them out, as DeepSeek's 671B does.
 *
 * Saved activations reuse the decoder's ids with MLA's meaning (the ids
 * name slots, the names say what is saved): Q_PRE / Q_RSTD are the q latent
 * before its norm and the norm's rstd, K_PRE / K_RSTD the kv latent
 * (with the rotary key part) and its rstd. */
#include <stdio.h>

#include "engine/model/desc/walk.h"

/* q, k, v and the attention output are saved at the attention kernels'
 * one head width D = max(qk, v_head_dim), the narrower zero-padded
 * (engine/layers/mla.c). */
static void mla_acts(const eng_model_config_t *c, eng_desc_builder_t *b, int l) {
    const int64_t H = c->hidden_size, nh = c->num_attention_heads;
    const int64_t qk0 = c->qk_nope_head_dim + c->qk_rope_head_dim, vd0 = c->v_head_dim;
    const int64_t qk = qk0 > vd0 ? qk0 : vd0, vd = qk;
    eng_desc_act(b, l, ENG_A_X_MID, "mid", ENG_ACT_FP32, H, 0);
    eng_desc_act(b, l, ENG_A_ATTN_XN, "attn.xn", ENG_ACT_COMPUTE, H, 0);
    eng_desc_act(b, l, ENG_A_ATTN_RSTD, "attn.rstd", ENG_ACT_FP32, 1, 0);
    if (c->q_lora_rank > 0) {
        eng_desc_act(b, l, ENG_A_Q_PRE, "attn.q_a", ENG_ACT_FP32, c->q_lora_rank, 0);
        eng_desc_act(b, l, ENG_A_Q_RSTD, "attn.q_a_rstd", ENG_ACT_FP32, 1, 0);
    }
    eng_desc_act(b, l, ENG_A_K_PRE, "attn.kv_a", ENG_ACT_FP32, c->kv_lora_rank + c->qk_rope_head_dim, 0);
    eng_desc_act(b, l, ENG_A_K_RSTD, "attn.kv_a_rstd", ENG_ACT_FP32, 1, 0);
    eng_desc_act(b, l, ENG_A_Q, "attn.q", ENG_ACT_FP32, nh * qk, 0);
    eng_desc_act(b, l, ENG_A_K, "attn.k", ENG_ACT_FP32, nh * qk, 0);
    eng_desc_act(b, l, ENG_A_V, "attn.v", ENG_ACT_FP32, nh * vd, 0);
    eng_desc_act(b, l, ENG_A_ATT, "attn.out", ENG_ACT_FP32, nh * vd, 0);
    eng_desc_act(b, l, ENG_A_LSE, "attn.lse", ENG_ACT_FP32, nh, 0);
}

mt_status_t eng_mla_describe(const eng_family_t *f, const eng_model_config_t *c, eng_desc_builder_t *b,
                             mt_error_t *err) {
    (void)err;
    const int64_t H = c->hidden_size, V = c->vocab_size, nh = c->num_attention_heads;
    const int64_t qk = c->qk_nope_head_dim + c->qk_rope_head_dim, vd = c->v_head_dim;
    const int64_t ql = c->q_lora_rank, kvl = c->kv_lora_rank;
    const char *pre = "model.layers";
    eng_desc_param(b, ENG_P_EMBED, -1, -1, V, H, "model.embed_tokens.weight");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        eng_desc_param(b, ENG_P_ATTN_NORM, l, -1, H, 0, "%s.%d.input_layernorm.weight", pre, l);
        if (ql > 0) {
            eng_desc_param(b, ENG_P_Q_A, l, -1, ql, H, "%s.%d.self_attn.q_a_proj.weight", pre, l);
            eng_desc_param(b, ENG_P_Q_A_NORM, l, -1, ql, 0, "%s.%d.self_attn.q_a_layernorm.weight", pre, l);
            eng_desc_param(b, ENG_P_Q_B, l, -1, nh * qk, ql, "%s.%d.self_attn.q_b_proj.weight", pre, l);
        } else {
            eng_desc_param(b, ENG_P_Q, l, -1, nh * qk, H, "%s.%d.self_attn.q_proj.weight", pre, l);
        }
        eng_desc_param(b, ENG_P_KV_A, l, -1, kvl + c->qk_rope_head_dim, H, "%s.%d.self_attn.kv_a_proj_with_mqa.weight",
                       pre, l);
        eng_desc_param(b, ENG_P_KV_A_NORM, l, -1, kvl, 0, "%s.%d.self_attn.kv_a_layernorm.weight", pre, l);
        eng_desc_param(b, ENG_P_KV_B, l, -1, nh * (c->qk_nope_head_dim + vd), kvl, "%s.%d.self_attn.kv_b_proj.weight",
                       pre, l);
        eng_desc_param(b, ENG_P_O, l, -1, H, nh * vd, "%s.%d.self_attn.o_proj.weight", pre, l);
        eng_desc_param(b, ENG_P_MLP_NORM, l, -1, H, 0, "%s.%d.post_attention_layernorm.weight", pre, l);
        mla_acts(c, b, l);
        eng_decoder_mlp_acts(f, c, b, l);
        eng_decoder_describe_mlp(f, c, b, l);
    }
    eng_decoder_describe_head(c, b);
    return MT_OK;
}

/* An RMSNorm over `width` per token, with its weight of `role`; returns the forward op. */
static int latent_norm(eng_walk_t *w, const char *label, eng_param_role_t role, double width, eng_act_id_t rstd) {
    const double n = w->n;
    int f = eng_walk_elementwise(w, SCHED_PHASE_FWD, label, n * width, 2 * n * width * w->ab);
    int g = eng_walk_elementwise(w, SCHED_PHASE_BWD, label, n * width, 4 * n * width * w->ab);
    eng_walk_add_param(w, role, f, g);
    eng_walk_act(w, rstd, f, g);
    return f;
}

void eng_mla_attention_ops(eng_walk_t *w) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size, nh = c->num_attention_heads;
    const double qk = c->qk_nope_head_dim + c->qk_rope_head_dim, vd = c->v_head_dim, rope = c->qk_rope_head_dim;
    const double kva = c->kv_lora_rank + rope;
    const mt_dtype_t adt = w->adt;
    int g;
    int xn = eng_walk_attn_input(w, &g);
    int bq;
    if (c->q_lora_rank > 0) {
        int bqa;
        int fqa = eng_walk_linear(w, "q_a_proj", n, ENG_P_Q_A, ENG_P_ROLE_COUNT, 0, &bqa);
        sched_program_add_consumer(w->p, xn, bqa);
        int qa = eng_walk_act(w, ENG_A_Q_PRE, fqa, -1);
        int fn = latent_norm(w, "q_a_layernorm", ENG_P_Q_A_NORM, c->q_lora_rank, ENG_A_Q_RSTD);
        (void)fn;
        eng_walk_linear(w, "q_b_proj", n, ENG_P_Q_B, ENG_P_ROLE_COUNT, 0, &bq);
        sched_program_add_consumer(w->p, qa, bq); /* q_b's weight gradient reads the normed latent, recomputed */
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "attn.q_a_normed", adt, n * c->q_lora_rank, fn);
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_q_a", adt, n * c->q_lora_rank, bqa);
    } else {
        eng_walk_linear(w, "q_proj", n, ENG_P_Q, ENG_P_ROLE_COUNT, 0, &bq);
        sched_program_add_consumer(w->p, xn, bq);
    }
    int bkva, bkvb;
    int fkva = eng_walk_linear(w, "kv_a_proj_with_mqa", n, ENG_P_KV_A, ENG_P_ROLE_COUNT, 0, &bkva);
    sched_program_add_consumer(w->p, xn, bkva);
    int kv_a = eng_walk_act(w, ENG_A_K_PRE, fkva, -1);
    int fkn = latent_norm(w, "kv_a_layernorm", ENG_P_KV_A_NORM, c->kv_lora_rank, ENG_A_K_RSTD);
    int fkvb = eng_walk_linear(w, "kv_b_proj", n, ENG_P_KV_B, ENG_P_ROLE_COUNT, 0, &bkvb);
    sched_program_add_consumer(w->p, kv_a, bkvb);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "attn.kv_a_normed", adt, n * c->kv_lora_rank, fkn);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_kv_a", adt, n * kva, bkva);
    /* RoPE on each head's rotary query part and the one shared rotary key */
    const double rot = n * (nh * rope + rope);
    int fr = eng_walk_elementwise(w, SCHED_PHASE_FWD, "rope", rot, 2 * rot * w->ab);
    eng_walk_elementwise(w, SCHED_PHASE_BWD, "rope", rot, 2 * rot * w->ab);
    /* attention core over (query, key) pairs: QK^T on qk_nope + qk_rope,
     * PV on v_head_dim; the backward recomputes the scores (only
     * logsumexp saved), 2.5 times the forward as for the decoder */
    const double pairs = w->B * eng_walk_attn_pairs(w->T, eng_walk_window(w)) * nh;
    const double core_io = n * nh * (2 * qk + 2 * vd) * w->ab;
    const double fl = 2.0 * pairs * (qk + vd);
    int fa = eng_walk_add_op(w, SCHED_PHASE_FWD, true, fl, core_io, "L%d.attention.fwd", w->layer);
    int ga = eng_walk_add_op(w, SCHED_PHASE_BWD, true, 2.5 * fl, 2 * core_io, "L%d.attention.bwd", w->layer);
    /* the kernels see one head width for q, k and v: the wider of qk and vd
     * (engine/layers/mla.c pads the other) */
    eng_walk_attention_core(w, fa, ga, (int)nh, (int)nh, (int)(qk >= vd ? qk : vd));
    eng_walk_act(w, ENG_A_Q, fr, ga);
    eng_walk_act(w, ENG_A_K, fr, ga);
    eng_walk_act(w, ENG_A_V, fkvb, ga);
    eng_walk_act(w, ENG_A_ATT, fa, ga);
    eng_walk_act(w, ENG_A_LSE, fa, ga);
    int bo;
    int fo = eng_walk_linear(w, "o_proj", n, ENG_P_O, ENG_P_ROLE_COUNT, 0, &bo);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_out", adt, n * nh * vd, bo);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dq", adt, n * nh * qk, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dk", adt, n * nh * qk, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dv", adt, n * nh * vd, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_xn", adt, n * H, g);
    w->prev_out_op = fo;
}
