/* Attention and MLP halves of a decoder layer (see blocks.h): the
 * decoder's own math, and the one place that picks a family's piece where
 * its layer differs (mla.c, moe.c, gpt_oss.c).  Those pieces and this file
 * compute with ops_common.h's helpers, below all of them, so calls only go
 * down from here. */
#include "engine/layers/blocks.h"

#include <string.h>

/* ---- attention half -------------------------------------------------- */

mt_status_t eng_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                             float *x_mid, eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    if (c->mla) return eng_mla_attn_forward(env, layer, sh, x_in, x_mid, a, err);
    memset(a, 0, sizeof *a);
    float *q32 = NULL, *k32 = NULL, *v32 = NULL; /* q, k, v in fp32 while they are made */

    ALLOC_SAVED(a->xn, ENG_A_ATTN_XN, "attention input norm");
    ALLOC_SAVED(a->rstd, ENG_A_ATTN_RSTD, "attention input norm rstd");
    const mt_dtype_t xn_dt = eng_layer_act_dtype(env->model, layer, ENG_A_ATTN_XN);
    if (xn_dt == MT_F32) {
        ops->rmsnorm_fwd(s, a->xn, a->rstd, x_in, eng_weight_f32(env, L->attn_norm), n, H, c->rms_norm_eps);
    } else { /* normed in fp32, saved rounded: only q/k/v's products read it */
        float *xn32 = NULL;
        ALLOC(xn32, (size_t)n * H, float, "attention input norm (fp32)");
        ops->rmsnorm_fwd(s, xn32, a->rstd, x_in, eng_weight_f32(env, L->attn_norm), n, H, c->rms_norm_eps);
        ops->f32_to_bf16(s, (uint16_t *)a->xn, xn32, (size_t)n * H);
        kern_free(dev, xn32);
    }
    const eng_operand_t xn = {a->xn, xn_dt};
    ALLOC_SAVED(a->q, ENG_A_Q, "attention q");
    ALLOC_SAVED(a->k, ENG_A_K, "attention k");
    ALLOC_SAVED(a->v, ENG_A_V, "attention v");
    /* q, k, v saved in bf16 (a bf16 run, a shape the tensor-core attention
     * takes) are made in fp32 by the kernels below and rounded once */
    const mt_dtype_t qkv_dt = eng_layer_act_dtype(m, layer, ENG_A_Q);
    if (qkv_dt == MT_F32) {
        q32 = a->q, k32 = a->k, v32 = a->v;
    } else {
        ALLOC(q32, (size_t)n * qd, float, "attention q (fp32)");
        ALLOC(k32, (size_t)n * kd, float, "attention k (fp32)");
        ALLOC(v32, (size_t)n * kd, float, "attention v (fp32)");
    }
    float *qp = q32, *kp = k32;
    if (c->qk_norm) {
        ALLOC_SAVED(a->q_pre, ENG_A_Q_PRE, "attention q before q_norm");
        ALLOC_SAVED(a->k_pre, ENG_A_K_PRE, "attention k before k_norm");
        ALLOC_SAVED(a->q_rstd, ENG_A_Q_RSTD, "q_norm rstd");
        ALLOC_SAVED(a->k_rstd, ENG_A_K_RSTD, "k_norm rstd");
        qp = a->q_pre;
        kp = a->k_pre;
    }
    eng_mm(env, qp, xn, eng_weight(env, L->q), n, qd, H, false, true, 1.0f, 0.0f);
    eng_mm(env, kp, xn, eng_weight(env, L->k), n, kd, H, false, true, 1.0f, 0.0f);
    eng_mm(env, v32, xn, eng_weight(env, L->v), n, kd, H, false, true, 1.0f, 0.0f);
    TRY(eng_lora_fwd(env, L->q, qp, xn, n, H, qd, err));
    TRY(eng_lora_fwd(env, L->k, kp, xn, n, H, kd, err));
    TRY(eng_lora_fwd(env, L->v, v32, xn, n, H, kd, err));
    if (L->q_bias >= 0) {
        ops->bias_fwd(s, qp, eng_weight_f32(env, L->q_bias), n, qd);
        ops->bias_fwd(s, kp, eng_weight_f32(env, L->k_bias), n, kd);
        ops->bias_fwd(s, v32, eng_weight_f32(env, L->v_bias), n, kd);
    }
    /* q/k RMSNorm per head (Qwen3: rows of hd), or over each token's whole
     * projection (OLMoE: one row of nh*hd, one of nkv*hd). */
    const int qn_rows = c->qk_norm_whole ? n : n * nh, qn_cols = c->qk_norm_whole ? qd : hd;
    const int kn_rows = c->qk_norm_whole ? n : n * nkv, kn_cols = c->qk_norm_whole ? kd : hd;
    if (c->qk_norm) {
        ops->rmsnorm_fwd(s, q32, a->q_rstd, a->q_pre, eng_weight_f32(env, L->q_norm), qn_rows, qn_cols,
                         c->rms_norm_eps);
        ops->rmsnorm_fwd(s, k32, a->k_rstd, a->k_pre, eng_weight_f32(env, L->k_norm), kn_rows, kn_cols,
                         c->rms_norm_eps);
    }
    if (c->clip_qkv > 0) { /* OLMoE's clip_qkv: after the q/k norm, before RoPE (modeling_olmoe.py) */
        ops->clamp_fwd(s, q32, q32, c->clip_qkv, (size_t)n * qd);
        ops->clamp_fwd(s, k32, k32, c->clip_qkv, (size_t)n * kd);
        ops->clamp_fwd(s, v32, v32, c->clip_qkv, (size_t)n * kd);
    }
    TRY(eng_rope_qk(env, sh, q32, k32, false, err));
    if (qkv_dt != MT_F32) {
        ops->f32_to_bf16(s, (uint16_t *)a->q, q32, (size_t)n * qd);
        ops->f32_to_bf16(s, (uint16_t *)a->k, k32, (size_t)n * kd);
        ops->f32_to_bf16(s, (uint16_t *)a->v, v32, (size_t)n * kd);
        eng_dfree(dev, &q32), eng_dfree(dev, &k32), eng_dfree(dev, &v32);
    }
    ALLOC_SAVED(a->att, ENG_A_ATT, "attention output");
    ALLOC_SAVED(a->lse, ENG_A_LSE, "attention logsumexp");
    TRY(eng_attn_core_fwd(env, sh, a, qkv_dt, nh, nkv, hd, eng_layer_window(c, layer), err));
    /* gpt-oss's sinks rescale the output and join the saved logsumexp (kernels/gpt_oss.h) */
    if (L->sinks >= 0) ops->attn_sink_fwd(s, a->att, a->lse, eng_weight_f32(env, L->sinks), sh->B, sh->T, nh, hd);
    /* x_mid = x_in + att o^T */
    kern_memcpy_d2d(dev, s, x_mid, x_in, (size_t)n * H * sizeof(float));
    const eng_operand_t att = {a->att, qkv_dt};
    eng_mm(env, x_mid, att, eng_weight(env, L->o), n, H, qd, false, true, 1.0f, 1.0f);
    TRY(eng_lora_fwd(env, L->o, x_mid, att, n, qd, H, err));
    if (L->o_bias >= 0) ops->bias_fwd(s, x_mid, eng_weight_f32(env, L->o_bias), n, H);
    return MT_OK;
fail:
    if (q32 != a->q) eng_dfree(dev, &q32), eng_dfree(dev, &k32), eng_dfree(dev, &v32);
    eng_attn_acts_release(dev, a);
    return err->code;
}

/* Through clip_qkv's clamp: the gradient passes where the clamp's input lay
 * within [-c, c], as torch's clamp_ backward does.  The input is not saved
 * (q and k are saved after RoPE, v after the clamp); it is recomputed
 * exactly as the forward made it, the q/k norm from the saved projections
 * and v's projection from the saved input norm, so the mask is bit for bit
 * the forward's. */
static mt_status_t clip_qkv_bwd(eng_layer_env_t *env, int layer, const eng_shape_t *sh, eng_attn_acts_t *a, float *dq,
                                float *dk, float *dv, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    const eng_operand_t xn = {a->xn, eng_layer_act_dtype(env->model, layer, ENG_A_ATTN_XN)};
    float *x = NULL, *rstd = NULL;
    ALLOC(x, (size_t)n * qd, float, "clip_qkv input (recomputed)");
    ALLOC(rstd, (size_t)n * (nh > nkv ? nh : nkv), float, "clip_qkv q/k norm rstd (recomputed)");
    for (int which = 0; which < 3; which++) { /* q, k, v */
        const int d = which == 0 ? qd : kd, proj = which == 0 ? L->q : which == 1 ? L->k : L->v;
        const int norm = which == 0 ? L->q_norm : L->k_norm;
        const int bias = which == 0 ? L->q_bias : which == 1 ? L->k_bias : L->v_bias;
        float *grad = which == 0 ? dq : which == 1 ? dk : dv;
        if (which < 2 && c->qk_norm) {
            const float *pre = which == 0 ? a->q_pre : a->k_pre;
            const int rows = c->qk_norm_whole ? n : n * (which == 0 ? nh : nkv), cols = c->qk_norm_whole ? d : hd;
            ops->rmsnorm_fwd(s, x, rstd, pre, eng_weight_f32(env, norm), rows, cols, c->rms_norm_eps);
        } else {
            eng_mm(env, x, xn, eng_weight(env, proj), n, d, H, false, true, 1.0f, 0.0f);
            if (bias >= 0) ops->bias_fwd(s, x, eng_weight_f32(env, bias), n, d);
        }
        ops->clamp_bwd(s, grad, grad, x, c->clip_qkv, (size_t)n * d);
    }
    eng_dfree(dev, &x);
    eng_dfree(dev, &rstd);
    return MT_OK;
fail:
    eng_dfree(dev, &x);
    eng_dfree(dev, &rstd);
    return err->code;
}

mt_status_t eng_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                              float *dx, eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    float *datt = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *dxn = NULL, *tmp = NULL;
    float *scratch[5] = {0}; /* discarded gradients of frozen biases and norms */
    if (c->mla) return eng_mla_attn_backward(env, layer, sh, x_in, dx, a, err);

    const mt_dtype_t qkv_dt = eng_layer_act_dtype(m, layer, ENG_A_Q);
    const eng_operand_t att = {a->att, qkv_dt};
    ALLOC(datt, (size_t)n * qd, float, "d(attention output)");
    eng_mm(env, datt, eng_f32(dx), eng_weight(env, L->o), n, qd, H, false, false, 1.0f, 0.0f);
    eng_mm_grad(env, L->o, eng_f32(dx), att, H, qd, n);
    TRY(eng_lora_bwd(env, L->o, dx, att, datt, n, qd, H, err));
    if (L->o_bias >= 0 && eng_grad(env, L->o_bias)) ops->bias_bwd(s, eng_grad(env, L->o_bias), dx, n, H);
    /* the sinks' own gradient; dq, dk, dv need nothing more (kernels/gpt_oss.h) */
    if (L->sinks >= 0 && eng_grad(env, L->sinks))
        ops->attn_sink_bwd(s, eng_grad(env, L->sinks), datt, a->att, a->lse, eng_weight_f32(env, L->sinks), sh->B,
                           sh->T, nh, hd);
    ALLOC(dq, (size_t)n * qd, float, "d(q)");
    ALLOC(dk, (size_t)n * kd, float, "d(k)");
    ALLOC(dv, (size_t)n * kd, float, "d(v)");
    TRY(eng_attn_core_bwd(env, sh, a, qkv_dt, dq, dk, dv, datt, nh, nkv, hd, eng_layer_window(c, layer), err));
    eng_dfree(dev, &datt);
    TRY(eng_rope_qk(env, sh, dq, dk, true, err));
    if (c->clip_qkv > 0) TRY(clip_qkv_bwd(env, layer, sh, a, dq, dk, dv, err));
    if (c->qk_norm) { /* through the q/k norm (per head or whole), into the pre-norm projections */
        const int qn_rows = c->qk_norm_whole ? n : n * nh, qn_cols = c->qk_norm_whole ? qd : hd;
        const int kn_rows = c->qk_norm_whole ? n : n * nkv, kn_cols = c->qk_norm_whole ? kd : hd;
        ALLOC(tmp, (size_t)n * qd, float, "d(q before q_norm)");
        float *gq = eng_grad_or_scratch(env, L->q_norm, &scratch[0], err);
        float *gk = eng_grad_or_scratch(env, L->k_norm, &scratch[1], err);
        if (!gq || !gk) goto fail;
        ops->rmsnorm_bwd(s, tmp, gq, dq, a->q_pre, eng_weight_f32(env, L->q_norm), a->q_rstd, qn_rows, qn_cols);
        kern_memcpy_d2d(dev, s, dq, tmp, (size_t)n * qd * sizeof(float));
        ops->rmsnorm_bwd(s, tmp, gk, dk, a->k_pre, eng_weight_f32(env, L->k_norm), a->k_rstd, kn_rows, kn_cols);
        kern_memcpy_d2d(dev, s, dk, tmp, (size_t)n * kd * sizeof(float));
        eng_dfree(dev, &tmp);
    }
    if (L->q_bias >= 0) { /* a frozen bias has no gradient to form */
        if (eng_grad(env, L->q_bias)) ops->bias_bwd(s, eng_grad(env, L->q_bias), dq, n, qd);
        if (eng_grad(env, L->k_bias)) ops->bias_bwd(s, eng_grad(env, L->k_bias), dk, n, kd);
        if (eng_grad(env, L->v_bias)) ops->bias_bwd(s, eng_grad(env, L->v_bias), dv, n, kd);
    }
    const eng_operand_t xn = {a->xn, eng_layer_act_dtype(env->model, layer, ENG_A_ATTN_XN)};
    eng_mm_grad(env, L->q, eng_f32(dq), xn, qd, H, n);
    eng_mm_grad(env, L->k, eng_f32(dk), xn, kd, H, n);
    eng_mm_grad(env, L->v, eng_f32(dv), xn, kd, H, n);
    ALLOC(dxn, (size_t)n * H, float, "d(attention input norm)");
    eng_mm(env, dxn, eng_f32(dq), eng_weight(env, L->q), n, H, qd, false, false, 1.0f, 0.0f);
    eng_mm(env, dxn, eng_f32(dk), eng_weight(env, L->k), n, H, kd, false, false, 1.0f, 1.0f);
    eng_mm(env, dxn, eng_f32(dv), eng_weight(env, L->v), n, H, kd, false, false, 1.0f, 1.0f);
    TRY(eng_lora_bwd(env, L->q, dq, xn, dxn, n, H, qd, err));
    TRY(eng_lora_bwd(env, L->k, dk, xn, dxn, n, H, kd, err));
    TRY(eng_lora_bwd(env, L->v, dv, xn, dxn, n, H, kd, err));
    eng_dfree(dev, &dq);
    eng_dfree(dev, &dk);
    eng_dfree(dev, &dv);
    TRY(eng_norm_bwd_into_residual(env, L->attn_norm, dx, dxn, x_in, a->rstd, n, "d(attention input)", err));
    eng_dfree(dev, &dxn);
    for (int i = 0; i < 5; i++) eng_dfree(dev, &scratch[i]);
    eng_attn_acts_release(dev, a);
    return MT_OK;
fail:
    for (int i = 0; i < 5; i++) eng_dfree(dev, &scratch[i]);
    eng_dfree(dev, &datt);
    eng_dfree(dev, &dq);
    eng_dfree(dev, &dk);
    eng_dfree(dev, &dv);
    eng_dfree(dev, &dxn);
    eng_dfree(dev, &tmp);
    eng_attn_acts_release(dev, a);
    return err->code;
}

/* ---- MLP half --------------------------------------------------------- */

mt_status_t eng_mlp_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                            float *x_out, eng_fetch_experts_fn fetch, void *fetch_ctx, eng_mlp_acts_t *a,
                            mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size;
    float *y = NULL, *h = NULL;
    memset(a, 0, sizeof *a);
    a->is_moe = c->layer_is_moe[layer];

    ALLOC_SAVED(a->xn, ENG_A_MLP_XN, "mlp input norm");
    ALLOC_SAVED(a->rstd, ENG_A_MLP_RSTD, "mlp input norm rstd");
    ops->rmsnorm_fwd(s, a->xn, a->rstd, x_mid, eng_weight_f32(env, L->mlp_norm), n, H, c->rms_norm_eps);
    ALLOC(y, (size_t)n * H, float, "mlp output");
    if (a->is_moe && c->experts_fused) {
        TRY(eng_gpt_oss_moe_forward(env, layer, n, a, y, err));
    } else if (a->is_moe) {
        TRY(eng_moe_forward(env, layer, n, fetch, fetch_ctx, a, y, err));
    } else {
        const int Id = c->intermediate_size;
        ALLOC_SAVED(a->g, ENG_A_DENSE_G, "dense mlp gate activations");
        ALLOC_SAVED(a->u, ENG_A_DENSE_U, "dense mlp up activations");
        ALLOC(h, (size_t)n * Id, float, "dense mlp hidden");
        eng_mm(env, a->g, eng_f32(a->xn), eng_weight(env, L->dense_gate), n, Id, H, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->dense_gate, a->g, eng_f32(a->xn), n, H, Id, err));
        eng_mm(env, a->u, eng_f32(a->xn), eng_weight(env, L->dense_up), n, Id, H, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->dense_up, a->u, eng_f32(a->xn), n, H, Id, err));
        ops->swiglu_fwd(s, h, a->g, a->u, (size_t)n * Id);
        eng_mm(env, y, eng_f32(h), eng_weight(env, L->dense_down), n, H, Id, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->dense_down, y, eng_f32(h), n, Id, H, err));
        eng_dfree(dev, &h);
    }
    ops->add(s, x_out, x_mid, y, (size_t)n * H);
    eng_dfree(dev, &y);
    return MT_OK;
fail:
    eng_dfree(dev, &y);
    eng_dfree(dev, &h);
    eng_mlp_acts_release(dev, a);
    return err->code;
}

mt_status_t eng_mlp_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                             float *dx, const float *aux_dp, const float *tok_w,
                             eng_mlp_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size;
    float *dxn = NULL, *h = NULL, *dh = NULL;

    ALLOC(dxn, (size_t)n * H, float, "d(mlp input norm)");
    if (a->is_moe && c->experts_fused) {
        TRY(eng_gpt_oss_moe_backward(env, layer, dx, aux_dp, tok_w, a, dxn, err));
    } else if (a->is_moe) {
        TRY(eng_moe_backward(env, layer, dx, aux_dp, tok_w, a, dxn, err));
    } else {
        const int Id = c->intermediate_size;
        ALLOC(h, (size_t)n * Id, float, "dense mlp hidden (recomputed)");
        ALLOC(dh, (size_t)n * Id, float, "d(dense mlp hidden)");
        ops->swiglu_fwd(s, h, a->g, a->u, (size_t)n * Id);
        eng_mm(env, dh, eng_f32(dx), eng_weight(env, L->dense_down), n, Id, H, false, false, 1.0f, 0.0f);
        eng_mm_grad(env, L->dense_down, eng_f32(dx), eng_f32(h), H, Id, n);
        TRY(eng_lora_bwd(env, L->dense_down, dx, eng_f32(h), dh, n, Id, H, err));
        ops->swiglu_bwd(s, a->g, a->u, dh, a->g, a->u, (size_t)n * Id);
        eng_mm_grad(env, L->dense_gate, eng_f32(a->g), eng_f32(a->xn), Id, H, n);
        eng_mm_grad(env, L->dense_up, eng_f32(a->u), eng_f32(a->xn), Id, H, n);
        eng_mm(env, dxn, eng_f32(a->g), eng_weight(env, L->dense_gate), n, H, Id, false, false, 1.0f, 0.0f);
        eng_mm(env, dxn, eng_f32(a->u), eng_weight(env, L->dense_up), n, H, Id, false, false, 1.0f, 1.0f);
        TRY(eng_lora_bwd(env, L->dense_gate, a->g, eng_f32(a->xn), dxn, n, H, Id, err));
        TRY(eng_lora_bwd(env, L->dense_up, a->u, eng_f32(a->xn), dxn, n, H, Id, err));
        eng_dfree(dev, &h);
        eng_dfree(dev, &dh);
    }
    TRY(eng_norm_bwd_into_residual(env, L->mlp_norm, dx, dxn, x_mid, a->rstd, n, "d(mlp input)", err));
    eng_dfree(dev, &dxn);
    eng_mlp_acts_release(dev, a);
    return MT_OK;
fail:
    eng_dfree(dev, &dxn);
    eng_dfree(dev, &h);
    eng_dfree(dev, &dh);
    eng_mlp_acts_release(dev, a);
    return err->code;
}
