/* Attention and MLP halves of a decoder layer (see blocks.h). */
#include "engine/layers/blocks.h"

#include <stdlib.h>
#include <string.h>

#define ALLOC(ptr, count, tag)                                                         \
    do {                                                                               \
        (ptr) = (float *)kern_alloc(env->dev, (size_t)(count) * sizeof(float), (tag), err); \
        if (!(ptr)) goto fail;                                                         \
    } while (0)

mt_dtype_t eng_act_storage_dtype(const eng_model_t *m) { return m->compute; }

/* A saved activation: its size (and element type) from the model
 * description (engine/model/desc/model_desc.h), which the executor and the scheduler
 * read too.  The block code allocating one its family's description does
 * not list is a bug, caught here. */
static size_t act_bytes(const eng_model_t *m, int layer, eng_act_id_t id, int n) {
    const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, id);
    MT_CHECK(a, "layer %d allocates activation id %d, which its model description does not list", layer, (int)id);
    return eng_act_numel(a, n) * mt_dtype_size(eng_act_dtype(a->cls, eng_act_storage_dtype(m)));
}

/* The dtype an activation is saved in (from its class in the description). */
static mt_dtype_t act_dtype(const eng_model_t *m, int layer, eng_act_id_t id) {
    const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, id);
    MT_CHECK(a, "layer %d uses activation id %d, which its model description does not list", layer, (int)id);
    return eng_act_dtype(a->cls, eng_act_storage_dtype(m));
}

#define ALLOC_ACT(ptr, id, tag)                                                            \
    do {                                                                                   \
        (ptr) = (float *)kern_alloc(env->dev, act_bytes(env->model, layer, (id), n), (tag), err);  \
        if (!(ptr)) goto fail;                                                             \
    } while (0)


/* A weight's device working copy (fp32, or bf16 in a bf16 run): only
 * products read the bf16 ones, so norms and biases get plain floats. */
static eng_operand_t W(eng_layer_env_t *env, int i) {
    eng_model_t *m = env->model;
    return i >= 0 ? (eng_operand_t){env->dp[i].w, m->params[i].w_dtype} : (eng_operand_t){NULL, MT_F32};
}
static float *WF(eng_layer_env_t *env, int i) {
    eng_model_t *m = env->model;
    if (i < 0) return NULL;
    MT_CHECK(m->params[i].w_dtype == MT_F32, "%s: an fp32 kernel was given its bf16 working copy", m->params[i].spec->name);
    return env->dp[i].w;
}
/* The gradient target the executor prepared for this backward; NULL for
 * a frozen parameter (a LoRA run's base), whose weight gradient is not
 * formed at all. */
static float *G(eng_layer_env_t *env, int i) { return i >= 0 ? env->dp[i].g : NULL; }

/* Weight gradient products, skipped for a frozen weight. */
static void mm_grad(eng_layer_env_t *env, int i, eng_operand_t A, eng_operand_t B, int M, int N, int K) {
    float *g = G(env, i);
    if (g) eng_mm(env, g, A, B, M, N, K, true, false, 1.0f, 1.0f);
}

/* The LoRA factors of module i (kernels/lora.h): a == NULL when it has none.
 * The gradient targets are set in backward, when the executor prepared them. */
static kern_lora_t lora_of(const eng_layer_env_t *env, int i) {
    const eng_model_t *m = env->model;
    kern_lora_t l = {0};
    if (i < 0 || m->params[i].lora_a < 0) return l;
    const int ia = m->params[i].lora_a, ib = m->params[i].lora_b;
    l.a = env->dp[ia].w;
    l.b = env->dp[ib].w;
    l.dtype = m->params[ia].w_dtype;
    l.ga = env->dp[ia].g;
    l.gb = env->dp[ib].g;
    l.r = m->lora.r;
    l.scale = m->lora.scale;
    l.dropout = m->lora.dropout;
    /* a mask per run seed, micro-batch and module (PEFT draws one per
     * module call); the forward, its recomputation and the backward agree */
    uint64_t h = m->lora.seed ^ 0x6c6f7261ull;
    const uint64_t parts[2] = {m->lora.batch_serial, (uint64_t)m->params[i].lora_a};
    for (int k = 0; k < 2; k++) h = (h ^ parts[k]) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    l.dropout_seed = h;
    return l;
}

/* y (n, out) += the LoRA term of module i on x (n, in); none: nothing. */
static mt_status_t lora_fwd(eng_layer_env_t *env, int i, float *y, eng_operand_t x, int n, int in, int out,
                            mt_error_t *err) {
    eng_model_t *m = env->model;
    const kern_lora_t l = lora_of(env, i);
    return kern_lora_fwd(env->dev, m->compute, &l, y, x.data, x.dtype, n, in, out, err);
}

/* Its backward: the factors' gradients, and dx (n, in) += its input gradient. */
static mt_status_t lora_bwd(eng_layer_env_t *env, int i, const float *dy, eng_operand_t x, float *dx, int n, int in,
                            int out, mt_error_t *err) {
    eng_model_t *m = env->model;
    const kern_lora_t l = lora_of(env, i);
    return kern_lora_bwd(env->dev, m->compute, &l, dy, x.data, x.dtype, dx, n, in, out, err);
}

/* A small frozen parameter's kernels (norm and bias backward) still write
 * a weight gradient: they get a scratch target, dropped afterwards. */
static float *G_or_scratch(eng_layer_env_t *env, int i, float **scratch, mt_error_t *err) {
    eng_model_t *m = env->model;
    float *g = G(env, i);
    if (g || i < 0) return g;
    const size_t bytes = m->params[i].spec->numel * sizeof(float);
    *scratch = kern_alloc(env->dev, bytes, "gradient of a frozen parameter (discarded)", err);
    if (*scratch) kern_memset(env->dev, kern_stream(env->dev, KERN_STREAM_COMPUTE), *scratch, 0, bytes);
    return *scratch;
}

#define TRY(call)                       \
    do {                                \
        if ((call) != MT_OK) goto fail; \
    } while (0)

eng_operand_t eng_f32(const float *p) { return (eng_operand_t){p, MT_F32}; }

void eng_mm(eng_layer_env_t *env, float *C, eng_operand_t A, eng_operand_t B, int M, int N, int K, bool trans_a,
            bool trans_b, float alpha, float beta) {
    eng_model_t *m = env->model;
    const kern_mm_t p = kern_mm_make(C, A.data, A.dtype, B.data, B.dtype, M, N, K, trans_a, trans_b, alpha, beta,
                                     m->compute);
    env->dev->ops->mm(kern_stream(env->dev, KERN_STREAM_COMPUTE), &p);
}

static void dfree(kern_device_t *dev, float **p) {
    if (*p) kern_free(dev, *p);
    *p = NULL;
}

/* Both halves end the same way: the residual's gradient dx (n, H) gains
 * the pre-norm branch's, rmsnorm_bwd(dxn) through norm weight `norm`. */
static mt_status_t norm_bwd_into_residual(eng_layer_env_t *env, int norm, float *dx, const float *dxn,
                                          const float *x, const float *rstd, int n, const char *tag,
                                          mt_error_t *err) {
    eng_model_t *m = env->model;
    const int H = m->cfg.hidden_size;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    float *tmp = kern_alloc(env->dev, (size_t)n * H * sizeof(float), tag, err);
    if (!tmp) return err->code;
    float *scratch = NULL, *gw = G_or_scratch(env, norm, &scratch, err);
    if (!gw) {
        kern_free(env->dev, tmp);
        return err->code;
    }
    env->dev->ops->rmsnorm_bwd(s, tmp, gw, dxn, x, WF(env, norm), rstd, n, H);
    env->dev->ops->add(s, dx, dx, tmp, (size_t)n * H);
    kern_free(env->dev, tmp);
    if (scratch) kern_free(env->dev, scratch);
    return MT_OK;
}

/* ---- attention half -------------------------------------------------- */

mt_status_t eng_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                             float *x_mid, eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    if (c->mla) return eng_mla_attn_forward(env, layer, sh, x_in, x_mid, a, err);
    memset(a, 0, sizeof *a);

    ALLOC_ACT(a->xn, ENG_A_ATTN_XN, "attention input norm");
    ALLOC_ACT(a->rstd, ENG_A_ATTN_RSTD, "attention input norm rstd");
    const mt_dtype_t xn_dt = act_dtype(env->model, layer, ENG_A_ATTN_XN);
    if (xn_dt == MT_F32) {
        ops->rmsnorm_fwd(s, a->xn, a->rstd, x_in, WF(env, L->attn_norm), n, H, c->rms_norm_eps);
    } else { /* normed in fp32, saved rounded: only q/k/v's products read it */
        float *xn32 = NULL;
        ALLOC(xn32, (size_t)n * H, "attention input norm (fp32)");
        ops->rmsnorm_fwd(s, xn32, a->rstd, x_in, WF(env, L->attn_norm), n, H, c->rms_norm_eps);
        ops->f32_to_bf16(s, (uint16_t *)a->xn, xn32, (size_t)n * H);
        kern_free(env->dev, xn32);
    }
    const eng_operand_t xn = {a->xn, xn_dt};
    ALLOC_ACT(a->q, ENG_A_Q, "attention q");
    ALLOC_ACT(a->k, ENG_A_K, "attention k");
    ALLOC_ACT(a->v, ENG_A_V, "attention v");
    float *qp = a->q, *kp = a->k;
    if (c->qk_norm) {
        ALLOC_ACT(a->q_pre, ENG_A_Q_PRE, "attention q before q_norm");
        ALLOC_ACT(a->k_pre, ENG_A_K_PRE, "attention k before k_norm");
        ALLOC_ACT(a->q_rstd, ENG_A_Q_RSTD, "q_norm rstd");
        ALLOC_ACT(a->k_rstd, ENG_A_K_RSTD, "k_norm rstd");
        qp = a->q_pre;
        kp = a->k_pre;
    }
    eng_mm(env, qp, xn, W(env, L->q), n, qd, H, false, true, 1.0f, 0.0f);
    eng_mm(env, kp, xn, W(env, L->k), n, kd, H, false, true, 1.0f, 0.0f);
    eng_mm(env, a->v, xn, W(env, L->v), n, kd, H, false, true, 1.0f, 0.0f);
    TRY(lora_fwd(env, L->q, qp, xn, n, H, qd, err));
    TRY(lora_fwd(env, L->k, kp, xn, n, H, kd, err));
    TRY(lora_fwd(env, L->v, a->v, xn, n, H, kd, err));
    if (L->q_bias >= 0) {
        ops->bias_fwd(s, qp, WF(env, L->q_bias), n, qd);
        ops->bias_fwd(s, kp, WF(env, L->k_bias), n, kd);
        ops->bias_fwd(s, a->v, WF(env, L->v_bias), n, kd);
    }
    /* q/k RMSNorm per head (Qwen3: rows of hd), or over each token's whole
     * projection (OLMoE: one row of nh*hd, one of nkv*hd). */
    const int qn_rows = c->qk_norm_whole ? n : n * nh, qn_cols = c->qk_norm_whole ? qd : hd;
    const int kn_rows = c->qk_norm_whole ? n : n * nkv, kn_cols = c->qk_norm_whole ? kd : hd;
    if (c->qk_norm) {
        ops->rmsnorm_fwd(s, a->q, a->q_rstd, a->q_pre, WF(env, L->q_norm), qn_rows, qn_cols, c->rms_norm_eps);
        ops->rmsnorm_fwd(s, a->k, a->k_rstd, a->k_pre, WF(env, L->k_norm), kn_rows, kn_cols, c->rms_norm_eps);
    }
    if (c->clip_qkv > 0) { /* OLMoE's clip_qkv: after the q/k norm, before RoPE (modeling_olmoe.py) */
        ops->clamp_fwd(s, a->q, a->q, c->clip_qkv, (size_t)n * qd);
        ops->clamp_fwd(s, a->k, a->k, c->clip_qkv, (size_t)n * kd);
        ops->clamp_fwd(s, a->v, a->v, c->clip_qkv, (size_t)n * kd);
    }
    TRY(eng_rope_qk(env, sh, a->q, a->k, false, err));
    ALLOC_ACT(a->att, ENG_A_ATT, "attention output");
    ALLOC_ACT(a->lse, ENG_A_LSE, "attention logsumexp");
    ops->attention_fwd(s, a->att, a->lse, a->q, a->k, a->v, sh->kv_len, sh->B, sh->T, nh, nkv,
                       hd, eng_layer_window(c, layer));
    /* gpt-oss's sinks rescale the output and join the saved logsumexp (kernels/gpt_oss.h) */
    if (L->sinks >= 0) ops->attn_sink_fwd(s, a->att, a->lse, WF(env, L->sinks), sh->B, sh->T, nh, hd);
    /* x_mid = x_in + att o^T */
    kern_memcpy_d2d(env->dev, s, x_mid, x_in, (size_t)n * H * sizeof(float));
    eng_mm(env, x_mid, eng_f32(a->att), W(env, L->o), n, H, qd, false, true, 1.0f, 1.0f);
    TRY(lora_fwd(env, L->o, x_mid, eng_f32(a->att), n, qd, H, err));
    if (L->o_bias >= 0) ops->bias_fwd(s, x_mid, WF(env, L->o_bias), n, H);
    return MT_OK;
fail:
    eng_attn_acts_release(env->dev, a);
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
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    const eng_operand_t xn = {a->xn, act_dtype(env->model, layer, ENG_A_ATTN_XN)};
    float *x = NULL, *rstd = NULL;
    ALLOC(x, (size_t)n * qd, "clip_qkv input (recomputed)");
    ALLOC(rstd, (size_t)n * (nh > nkv ? nh : nkv), "clip_qkv q/k norm rstd (recomputed)");
    for (int which = 0; which < 3; which++) { /* q, k, v */
        const int d = which == 0 ? qd : kd, proj = which == 0 ? L->q : which == 1 ? L->k : L->v;
        const int norm = which == 0 ? L->q_norm : L->k_norm, bias = which == 0 ? L->q_bias : which == 1 ? L->k_bias : L->v_bias;
        float *grad = which == 0 ? dq : which == 1 ? dk : dv;
        if (which < 2 && c->qk_norm) {
            const float *pre = which == 0 ? a->q_pre : a->k_pre;
            const int rows = c->qk_norm_whole ? n : n * (which == 0 ? nh : nkv), cols = c->qk_norm_whole ? d : hd;
            ops->rmsnorm_fwd(s, x, rstd, pre, WF(env, norm), rows, cols, c->rms_norm_eps);
        } else {
            eng_mm(env, x, xn, W(env, proj), n, d, H, false, true, 1.0f, 0.0f);
            if (bias >= 0) ops->bias_fwd(s, x, WF(env, bias), n, d);
        }
        ops->clamp_bwd(s, grad, grad, x, c->clip_qkv, (size_t)n * d);
    }
    dfree(env->dev, &x);
    dfree(env->dev, &rstd);
    return MT_OK;
fail:
    dfree(env->dev, &x);
    dfree(env->dev, &rstd);
    return err->code;
}

mt_status_t eng_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                              float *dx, eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size, hd = c->head_dim;
    const int nh = c->num_attention_heads, nkv = c->num_key_value_heads;
    const int qd = nh * hd, kd = nkv * hd;
    float *datt = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *dxn = NULL, *tmp = NULL;
    float *scratch[5] = {0}; /* discarded gradients of frozen biases and norms */
    if (c->mla) return eng_mla_attn_backward(env, layer, sh, x_in, dx, a, err);

    ALLOC(datt, (size_t)n * qd, "d(attention output)");
    eng_mm(env, datt, eng_f32(dx), W(env, L->o), n, qd, H, false, false, 1.0f, 0.0f);
    mm_grad(env, L->o, eng_f32(dx), eng_f32(a->att), H, qd, n);
    TRY(lora_bwd(env, L->o, dx, eng_f32(a->att), datt, n, qd, H, err));
    if (L->o_bias >= 0 && G(env, L->o_bias)) ops->bias_bwd(s, G(env, L->o_bias), dx, n, H);
    /* the sinks' own gradient; dq, dk, dv need nothing more (kernels/gpt_oss.h) */
    if (L->sinks >= 0 && G(env, L->sinks))
        ops->attn_sink_bwd(s, G(env, L->sinks), datt, a->att, a->lse, WF(env, L->sinks), sh->B, sh->T, nh, hd);
    ALLOC(dq, (size_t)n * qd, "d(q)");
    ALLOC(dk, (size_t)n * kd, "d(k)");
    ALLOC(dv, (size_t)n * kd, "d(v)");
    ops->attention_bwd(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, sh->kv_len, sh->B,
                       sh->T, nh, nkv, hd, eng_layer_window(c, layer));
    dfree(env->dev, &datt);
    TRY(eng_rope_qk(env, sh, dq, dk, true, err));
    if (c->clip_qkv > 0 && clip_qkv_bwd(env, layer, sh, a, dq, dk, dv, err) != MT_OK) goto fail;
    if (c->qk_norm) { /* through the q/k norm (per head or whole), into the pre-norm projections */
        const int qn_rows = c->qk_norm_whole ? n : n * nh, qn_cols = c->qk_norm_whole ? qd : hd;
        const int kn_rows = c->qk_norm_whole ? n : n * nkv, kn_cols = c->qk_norm_whole ? kd : hd;
        ALLOC(tmp, (size_t)n * qd, "d(q before q_norm)");
        float *gq = G_or_scratch(env, L->q_norm, &scratch[0], err), *gk = G_or_scratch(env, L->k_norm, &scratch[1], err);
        if (!gq || !gk) goto fail;
        ops->rmsnorm_bwd(s, tmp, gq, dq, a->q_pre, WF(env, L->q_norm), a->q_rstd, qn_rows, qn_cols);
        kern_memcpy_d2d(env->dev, s, dq, tmp, (size_t)n * qd * sizeof(float));
        ops->rmsnorm_bwd(s, tmp, gk, dk, a->k_pre, WF(env, L->k_norm), a->k_rstd, kn_rows, kn_cols);
        kern_memcpy_d2d(env->dev, s, dk, tmp, (size_t)n * kd * sizeof(float));
        dfree(env->dev, &tmp);
    }
    if (L->q_bias >= 0) { /* a frozen bias has no gradient to form */
        if (G(env, L->q_bias)) ops->bias_bwd(s, G(env, L->q_bias), dq, n, qd);
        if (G(env, L->k_bias)) ops->bias_bwd(s, G(env, L->k_bias), dk, n, kd);
        if (G(env, L->v_bias)) ops->bias_bwd(s, G(env, L->v_bias), dv, n, kd);
    }
    const eng_operand_t xn = {a->xn, act_dtype(env->model, layer, ENG_A_ATTN_XN)};
    mm_grad(env, L->q, eng_f32(dq), xn, qd, H, n);
    mm_grad(env, L->k, eng_f32(dk), xn, kd, H, n);
    mm_grad(env, L->v, eng_f32(dv), xn, kd, H, n);
    ALLOC(dxn, (size_t)n * H, "d(attention input norm)");
    eng_mm(env, dxn, eng_f32(dq), W(env, L->q), n, H, qd, false, false, 1.0f, 0.0f);
    eng_mm(env, dxn, eng_f32(dk), W(env, L->k), n, H, kd, false, false, 1.0f, 1.0f);
    eng_mm(env, dxn, eng_f32(dv), W(env, L->v), n, H, kd, false, false, 1.0f, 1.0f);
    TRY(lora_bwd(env, L->q, dq, xn, dxn, n, H, qd, err));
    TRY(lora_bwd(env, L->k, dk, xn, dxn, n, H, kd, err));
    TRY(lora_bwd(env, L->v, dv, xn, dxn, n, H, kd, err));
    dfree(env->dev, &dq);
    dfree(env->dev, &dk);
    dfree(env->dev, &dv);
    if (norm_bwd_into_residual(env, L->attn_norm, dx, dxn, x_in, a->rstd, n, "d(attention input)", err) != MT_OK)
        goto fail;
    dfree(env->dev, &dxn);
    for (int i = 0; i < 5; i++) dfree(env->dev, &scratch[i]);
    eng_attn_acts_release(env->dev, a);
    return MT_OK;
fail:
    for (int i = 0; i < 5; i++) dfree(env->dev, &scratch[i]);
    dfree(env->dev, &datt);
    dfree(env->dev, &dq);
    dfree(env->dev, &dk);
    dfree(env->dev, &dv);
    dfree(env->dev, &dxn);
    dfree(env->dev, &tmp);
    eng_attn_acts_release(env->dev, a);
    return err->code;
}

void eng_attn_acts_release(kern_device_t *dev, eng_attn_acts_t *a) {
    float **ptrs[] = {&a->xn, &a->rstd, &a->q, &a->k, &a->v, &a->q_pre, &a->k_pre,
                      &a->q_rstd, &a->k_rstd, &a->att, &a->lse};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) dfree(dev, ptrs[i]);
}

/* ---- MLP half --------------------------------------------------------- */

/* moe/'s saved activations as the description names them */
static const eng_act_id_t k_moe_acts[MOE_ACT_COUNT] = {
    [MOE_ACT_LOGITS] = ENG_A_ROUTER_LOGITS, [MOE_ACT_PROBS] = ENG_A_ROUTER_PROBS,
    [MOE_ACT_TOPW] = ENG_A_TOPW,            [MOE_ACT_IDX] = ENG_A_TOPK_IDX,
    [MOE_ACT_COUNTS] = ENG_A_EXPERT_COUNTS, [MOE_ACT_OFFSETS] = ENG_A_EXPERT_OFFSETS,
    [MOE_ACT_PERM] = ENG_A_PERM,            [MOE_ACT_INV] = ENG_A_INV_PERM,
    [MOE_ACT_XP] = ENG_A_EXPERT_X,          [MOE_ACT_G] = ENG_A_EXPERT_G,
    [MOE_ACT_U] = ENG_A_EXPERT_U,           [MOE_ACT_EP] = ENG_A_EXPERT_OUT,
    [MOE_ACT_SG] = ENG_A_SHARED_G,          [MOE_ACT_SU] = ENG_A_SHARED_U,
    [MOE_ACT_SO] = ENG_A_SHARED_OUT,        [MOE_ACT_SGL] = ENG_A_SHARED_GATE_LOGIT,
};

moe_layer_dims_t eng_moe_dims(const eng_model_t *m, int layer) {
    const eng_model_config_t *c = &m->cfg;
    kern_router_group_t d_group;
    moe_layer_dims_t d = {
        .H = c->hidden_size,
        .E = c->num_experts,
        .k = c->num_experts_per_tok,
        .I = c->moe_intermediate_size,
        .Is = c->shared_expert_intermediate_size,
        .router_mode = c->norm_topk_prob ? KERN_ROUTER_SOFTMAX_TOPK_RENORM : KERN_ROUTER_SOFTMAX_TOPK,
        .router_grouped = eng_router_group_of(c, &d_group),
        .compute = m->compute,
    };
    d.router_group = d_group;
    /* sizes of the saved activations from the description (moe/ cannot read it) */
    for (int i = 0; i < MOE_ACT_COUNT; i++) {
        const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, k_moe_acts[i]);
        if (a)
            d.acts[i] = (moe_act_size_t){a->per_token, a->fixed,
                                          eng_act_dtype(a->cls, eng_act_storage_dtype(m))};
    }
    return d;
}

/* Parameter i's working copy (or its gradient target); -1 gives NULL. */
static void *param_ptr(eng_layer_env_t *env, int i, bool gradient) {
    if (i < 0) return NULL;
    return gradient ? (void *)env->dp[i].g : env->dp[i].w;
}

void eng_moe_params(eng_layer_env_t *env, int layer, bool gradients, moe_layer_params_t *out,
                    void **scratch) {
    eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int E = m->cfg.num_experts;
    memset(out, 0, sizeof *out); /* no LoRA factors unless moe_lora adds them */
    /* every expert matrix of a MoE layer has the same working dtype (see
     * eng_param_t); the router's is always fp32 (moe/moe_layer.c) */
    out->dtype = gradients ? MT_F32 : m->params[L->exp_gate[0]].w_dtype;
    out->router = param_ptr(env, L->router, gradients);
    out->gate = scratch;
    out->up = scratch + E;
    out->down = scratch + 2 * E;
    for (int e = 0; e < E; e++) {
        const int ig = L->exp_gate[e], iu = L->exp_up[e], id = L->exp_down[e];
        out->gate[e] = gradients ? env->dp[ig].g : env->dp[ig].w;
        out->up[e] = gradients ? env->dp[iu].g : env->dp[iu].w;
        out->down[e] = gradients ? env->dp[id].g : env->dp[id].w;
    }
    out->sh_gate = param_ptr(env, L->sh_gate, gradients);
    out->sh_up = param_ptr(env, L->sh_up, gradients);
    out->sh_down = param_ptr(env, L->sh_down, gradients);
    out->sh_expert_gate = param_ptr(env, L->sh_expert_gate, gradients);
    out->fetch_experts = NULL;
    out->fetch_ctx = NULL;
    out->ep = eng_layer_ep(env, layer); /* NULL unless the layer's experts are split between devices */
}

/* The layer's LoRA factors into p (router, shared expert, and per expert
 * when any expert module is adapted: a table of 3E entries, returned for
 * the caller to free; NULL without one). */
static kern_lora_t *moe_lora(eng_layer_env_t *env, int layer, moe_layer_params_t *p) {
    eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int E = m->cfg.num_experts;
    p->lora_router = lora_of(env, L->router);
    p->lora_sh_gate = lora_of(env, L->sh_gate);
    p->lora_sh_up = lora_of(env, L->sh_up);
    p->lora_sh_down = lora_of(env, L->sh_down);
    p->lora_sh_expert_gate = lora_of(env, L->sh_expert_gate);
    bool any = false;
    for (int e = 0; e < E && !any; e++)
        any = m->params[L->exp_gate[e]].lora_a >= 0 || m->params[L->exp_up[e]].lora_a >= 0 ||
              m->params[L->exp_down[e]].lora_a >= 0;
    if (!any) return NULL;
    kern_lora_t *t = calloc((size_t)3 * E, sizeof *t);
    MT_CHECK_ALLOC(t, "expert LoRA table");
    for (int e = 0; e < E; e++) {
        t[e] = lora_of(env, L->exp_gate[e]);
        t[E + e] = lora_of(env, L->exp_up[e]);
        t[2 * E + e] = lora_of(env, L->exp_down[e]);
    }
    p->lora_gate = t;
    p->lora_up = t + E;
    p->lora_down = t + 2 * E;
    return t;
}

typedef struct {
    eng_layer_env_t *env;
    int layer;
    eng_fetch_experts_fn fetch;
    void *fetch_ctx;
    moe_layer_params_t *p; /* its LoRA table follows the fetched experts too */
} fetch_ctx_t;

/* Adapts the engine's fetch to moe/'s hook and refreshes the pointers. */
static mt_status_t fetch_trampoline(void *ctx, const int32_t *counts, void **gate, void **up,
                                    void **down, mt_error_t *err) {
    fetch_ctx_t *c = ctx;
    mt_status_t st = c->fetch(c->fetch_ctx, c->layer, counts, err);
    if (st != MT_OK) return st;
    const eng_model_t *m = c->env->model;
    const eng_layer_index_t *L = &m->layers[c->layer];
    for (int e = 0; e < m->cfg.num_experts; e++) {
        gate[e] = c->env->dp[L->exp_gate[e]].w;
        up[e] = c->env->dp[L->exp_up[e]].w;
        down[e] = c->env->dp[L->exp_down[e]].w;
        if (c->p->lora_gate) {
            c->p->lora_gate[e] = lora_of(c->env, L->exp_gate[e]);
            c->p->lora_up[e] = lora_of(c->env, L->exp_up[e]);
            c->p->lora_down[e] = lora_of(c->env, L->exp_down[e]);
        }
    }
    return MT_OK;
}

mt_status_t eng_mlp_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                            float *x_out, eng_fetch_experts_fn fetch, void *fetch_ctx, eng_mlp_acts_t *a,
                            mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size;
    float *y = NULL, *h = NULL;
    memset(a, 0, sizeof *a);
    a->is_moe = c->layer_is_moe[layer];

    ALLOC_ACT(a->xn, ENG_A_MLP_XN, "mlp input norm");
    ALLOC_ACT(a->rstd, ENG_A_MLP_RSTD, "mlp input norm rstd");
    ops->rmsnorm_fwd(s, a->xn, a->rstd, x_mid, WF(env, L->mlp_norm), n, H, c->rms_norm_eps);
    ALLOC(y, (size_t)n * H, "mlp output");
    if (a->is_moe && c->experts_fused) {
        if (eng_gpt_oss_moe_forward(env, layer, n, a, y, err) != MT_OK) goto fail;
    } else if (a->is_moe) {
        const int E = c->num_experts;
        void **scratch = malloc((size_t)3 * E * sizeof *scratch);
        MT_CHECK_ALLOC(scratch, "expert pointer table");
        moe_layer_params_t p;
        eng_moe_params(env, layer, false, &p, scratch);
        kern_lora_t *lora = moe_lora(env, layer, &p);
        fetch_ctx_t fc = {env, layer, fetch, fetch_ctx, &p};
        if (fetch) {
            p.fetch_experts = fetch_trampoline;
            p.fetch_ctx = &fc;
        }
        moe_layer_dims_t d = eng_moe_dims(m, layer);
        float *rbias = NULL;
        mt_status_t st = eng_router_bias_upload(env, layer, &rbias, err);
        p.router_bias = rbias;
        if (st == MT_OK) st = moe_layer_forward(env->dev, &d, &p, a->xn, n, y, &a->moe, err);
        if (rbias) kern_free(env->dev, rbias);
        free(scratch);
        free(lora);
        if (st != MT_OK) goto fail;
    } else {
        const int Id = c->intermediate_size;
        ALLOC_ACT(a->g, ENG_A_DENSE_G, "dense mlp gate activations");
        ALLOC_ACT(a->u, ENG_A_DENSE_U, "dense mlp up activations");
        ALLOC(h, (size_t)n * Id, "dense mlp hidden");
        eng_mm(env, a->g, eng_f32(a->xn), W(env, L->dense_gate), n, Id, H, false, true, 1.0f, 0.0f);
        TRY(lora_fwd(env, L->dense_gate, a->g, eng_f32(a->xn), n, H, Id, err));
        eng_mm(env, a->u, eng_f32(a->xn), W(env, L->dense_up), n, Id, H, false, true, 1.0f, 0.0f);
        TRY(lora_fwd(env, L->dense_up, a->u, eng_f32(a->xn), n, H, Id, err));
        ops->swiglu_fwd(s, h, a->g, a->u, (size_t)n * Id);
        eng_mm(env, y, eng_f32(h), W(env, L->dense_down), n, H, Id, false, true, 1.0f, 0.0f);
        TRY(lora_fwd(env, L->dense_down, y, eng_f32(h), n, Id, H, err));
        dfree(env->dev, &h);
    }
    ops->add(s, x_out, x_mid, y, (size_t)n * H);
    dfree(env->dev, &y);
    return MT_OK;
fail:
    dfree(env->dev, &y);
    dfree(env->dev, &h);
    eng_mlp_acts_release(env->dev, a);
    return err->code;
}

mt_status_t eng_mlp_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                             float *dx, const float *aux_dp, const float *tok_w,
                             eng_mlp_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    const int n = sh->n, H = c->hidden_size;
    float *dxn = NULL, *h = NULL, *dh = NULL;

    ALLOC(dxn, (size_t)n * H, "d(mlp input norm)");
    if (a->is_moe && c->experts_fused) {
        if (eng_gpt_oss_moe_backward(env, layer, dx, aux_dp, tok_w, a, dxn, err) != MT_OK) goto fail;
    } else if (a->is_moe) {
        const int E = c->num_experts;
        void **scratch = malloc((size_t)6 * E * sizeof *scratch);
        MT_CHECK_ALLOC(scratch, "expert pointer table");
        moe_layer_params_t p, gp;
        eng_moe_params(env, layer, false, &p, scratch);
        eng_moe_params(env, layer, true, &gp, scratch + 3 * E);
        kern_lora_t *lora = moe_lora(env, layer, &p);
        moe_layer_dims_t d = eng_moe_dims(m, layer);
        mt_status_t st = moe_layer_backward(env->dev, &d, &p, &gp, a->xn, dx, aux_dp, tok_w, &a->moe,
                                            dxn, err);
        free(scratch);
        free(lora);
        if (st != MT_OK) goto fail;
    } else {
        const int Id = c->intermediate_size;
        ALLOC(h, (size_t)n * Id, "dense mlp hidden (recomputed)");
        ALLOC(dh, (size_t)n * Id, "d(dense mlp hidden)");
        ops->swiglu_fwd(s, h, a->g, a->u, (size_t)n * Id);
        eng_mm(env, dh, eng_f32(dx), W(env, L->dense_down), n, Id, H, false, false, 1.0f, 0.0f);
        mm_grad(env, L->dense_down, eng_f32(dx), eng_f32(h), H, Id, n);
        TRY(lora_bwd(env, L->dense_down, dx, eng_f32(h), dh, n, Id, H, err));
        ops->swiglu_bwd(s, a->g, a->u, dh, a->g, a->u, (size_t)n * Id);
        mm_grad(env, L->dense_gate, eng_f32(a->g), eng_f32(a->xn), Id, H, n);
        mm_grad(env, L->dense_up, eng_f32(a->u), eng_f32(a->xn), Id, H, n);
        eng_mm(env, dxn, eng_f32(a->g), W(env, L->dense_gate), n, H, Id, false, false, 1.0f, 0.0f);
        eng_mm(env, dxn, eng_f32(a->u), W(env, L->dense_up), n, H, Id, false, false, 1.0f, 1.0f);
        TRY(lora_bwd(env, L->dense_gate, a->g, eng_f32(a->xn), dxn, n, H, Id, err));
        TRY(lora_bwd(env, L->dense_up, a->u, eng_f32(a->xn), dxn, n, H, Id, err));
        dfree(env->dev, &h);
        dfree(env->dev, &dh);
    }
    if (norm_bwd_into_residual(env, L->mlp_norm, dx, dxn, x_mid, a->rstd, n, "d(mlp input)", err) != MT_OK)
        goto fail;
    dfree(env->dev, &dxn);
    eng_mlp_acts_release(env->dev, a);
    return MT_OK;
fail:
    dfree(env->dev, &dxn);
    dfree(env->dev, &h);
    dfree(env->dev, &dh);
    eng_mlp_acts_release(env->dev, a);
    return err->code;
}

void eng_mlp_acts_release(kern_device_t *dev, eng_mlp_acts_t *a) {
    dfree(dev, &a->xn);
    dfree(dev, &a->rstd);
    dfree(dev, &a->g);
    dfree(dev, &a->u);
    if (a->is_moe) moe_layer_acts_release(dev, &a->moe);
}

/* ---- shared with the family-specific halves (blocks.h) -------- */

size_t eng_blocks_act_bytes(const eng_model_t *m, int layer, eng_act_id_t id, int n) {
    return act_bytes(m, layer, id, n);
}
mt_dtype_t eng_blocks_act_dtype(const eng_model_t *m, int layer, eng_act_id_t id) { return act_dtype(m, layer, id); }
kern_lora_t eng_blocks_lora_of(const eng_layer_env_t *env, int i) { return lora_of(env, i); }
float *eng_blocks_grad_or_scratch(eng_layer_env_t *env, int i, float **scratch, mt_error_t *err) {
    return G_or_scratch(env, i, scratch, err);
}
mt_status_t eng_blocks_norm_bwd_into_residual(eng_layer_env_t *env, int norm, float *dx, const float *dxn, const float *x,
                                              const float *rstd, int n, const char *tag, mt_error_t *err) {
    return norm_bwd_into_residual(env, norm, dx, dxn, x, rstd, n, tag, err);
}

const moe_ep_t *eng_layer_ep(const eng_layer_env_t *env, int layer) {
    if (!env->ep || !env->model->cfg.layer_is_moe[layer] || !env->plan->blocks[layer + 1].expert_parallel) return NULL;
    return env->ep;
}
