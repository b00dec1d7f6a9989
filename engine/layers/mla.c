/* Multi-head Latent Attention, forward and backward (DeepSeek-V2/V3), as
 * transformers' DeepseekV3Attention computes it:
 *
 *   q    = q_b(rmsnorm_qa(q_a(xn)))      or q_proj(xn)      (n, nh, qk)
 *   kv_a = kv_a_proj_with_mqa(xn)                           (n, kvl + rope)
 *   c    = rmsnorm_kva(kv_a[:, :kvl]);  k_pe = kv_a[:, kvl:] (one rotary key for all heads)
 *   kv_b(c) = (n, nh, nope + vd) -> k_nope, v
 *   q = [q_nope, rope(q_pe)],  k = [k_nope, rope(k_pe) for every head]
 *   out = o_proj(softmax(q k^T / sqrt(qk)) v)
 * with qk = qk_nope_head_dim + qk_rope_head_dim, nope = qk_nope_head_dim,
 * rope = qk_rope_head_dim, vd = v_head_dim.
 *
 * Composition from the kernel table: products, RMSNorm, the decoder's RoPE
 * (rotate_half over `rope` dims) and attention kernels, plus copy4d for the
 * layout work:
 *  - the rotary parts of every head's query and the shared key are gathered
 *    into one (n, nh + 1, rope) tensor and rotated in one call (the RoPE
 *    table is built for head_dim = qk_rope_head_dim, model_config.h);
 *  - rope_interleave (DeepSeek's default): transformers rotates pairs
 *    (x[2i], x[2i+1]) and writes the results de-interleaved (evens' results
 *    first); that is rotate_half applied to the de-interleaved input, so the
 *    gather de-interleaves and the result is exactly transformers' q/k rope
 *    part in its layout;
 *  - the attention kernels take one head width D for q, k and v: D = qk when
 *    vd <= qk (v zero-padded to D; the padded output columns are 0 and are
 *    dropped before o_proj), D = vd otherwise (q and k zero-padded, which
 *    adds nothing to q.k), and q is then scaled by sqrt(D) / sqrt(qk) so the
 *    kernel's 1/sqrt(D) gives transformers' 1/sqrt(qk), times YaRN's
 *    mscale_all_dim factor squared when rope_scaling is YaRN (a factor of
 *    exactly 1 when D = qk without YaRN, and then skipped).
 * Saved (engine/model/desc/mla.c): the input norm, the q latent and the kv latent
 * before their norms with the norms' rstd, q, k, v (n, nh, D) after RoPE,
 * the attention output and its logsumexp.  The normed latents and kv_b's
 * output are recomputed in backward (one norm each), as the description
 * says. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/layers/blocks.h"
#include "engine/model/desc/rope_tables.h"

typedef struct {
    int n, H, nh, nope, rope, vd, qk, D, ql, kvl;
} mla_dims_t;

static mla_dims_t dims_of(const eng_layer_env_t *env, int n) {
    const eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    mla_dims_t d = {.n = n, .H = c->hidden_size, .nh = c->num_attention_heads, .nope = c->qk_nope_head_dim,
                    .rope = c->qk_rope_head_dim, .vd = c->v_head_dim, .ql = c->q_lora_rank,
                    .kvl = c->kv_lora_rank};
    d.qk = d.nope + d.rope;
    d.D = d.qk >= d.vd ? d.qk : d.vd;
    return d;
}

static void copy4d(eng_layer_env_t *env, float *dst, const float *src, kern_copy4d_t c, int accumulate) {
    env->dev->ops->copy4d(kern_stream(env->dev, KERN_STREAM_COMPUTE), dst, src, &c, accumulate);
}

/* The rotary parts of `heads` heads (token stride ts, head stride hs, the
 * part starting at src) to or from R (n, nh + 1, rope) from head slot
 * `slot` on; de-interleaved on the way in when the model interleaves, and
 * re-interleaved on the way out. */
static void rope_gather(eng_layer_env_t *env, const mla_dims_t *d, float *R, int slot, const float *src, int heads,
                        int64_t ts, int64_t hs) {
    eng_model_t *m = env->model;
    const int64_t rs = (int64_t)(d->nh + 1) * d->rope;
    kern_copy4d_t c;
    if (m->cfg.rope_interleave)
        c = (kern_copy4d_t){{d->n, heads, 2, d->rope / 2}, {ts, hs, 1, 2}, {rs, d->rope, d->rope / 2, 1}};
    else
        c = (kern_copy4d_t){{d->n, heads, 1, d->rope}, {ts, hs, 0, 1}, {rs, d->rope, 0, 1}};
    copy4d(env, R + (size_t)slot * d->rope, src, c, 0);
}

static void rope_scatter(eng_layer_env_t *env, const mla_dims_t *d, float *dst, int64_t ts, int64_t hs, const float *R,
                         int slot, int heads) {
    eng_model_t *m = env->model;
    const int64_t rs = (int64_t)(d->nh + 1) * d->rope;
    kern_copy4d_t c;
    if (m->cfg.rope_interleave)
        c = (kern_copy4d_t){{d->n, heads, 2, d->rope / 2}, {rs, d->rope, d->rope / 2, 1}, {ts, hs, 1, 2}};
    else
        c = (kern_copy4d_t){{d->n, heads, 1, d->rope}, {rs, d->rope, 0, 1}, {ts, hs, 0, 1}};
    copy4d(env, dst, R + (size_t)slot * d->rope, c, 0);
}

/* cols columns of each head: dst (n, heads, dst head width) at dst, src likewise. */
static void head_cols(eng_layer_env_t *env, const mla_dims_t *d, float *dst, int dw, const float *src, int sw, int cols,
                      int accumulate) {
    copy4d(env, dst, src,
           (kern_copy4d_t){{d->n, d->nh, 1, cols}, {(int64_t)d->nh * sw, sw, 0, 1}, {(int64_t)d->nh * dw, dw, 0, 1}},
           accumulate);
}

/* The factor q is scaled by so that the kernel's 1/sqrt(D) is transformers'
 * softmax scale 1/sqrt(qk), times YaRN's mscale_all_dim factor squared. */
static float q_factor(const eng_layer_env_t *env, const mla_dims_t *d) {
    const eng_model_t *m = env->model;
    const double f = eng_rope_yarn_softmax_factor(&m->cfg);
    if (d->D == d->qk && f == 1.0) return 1.0f;
    return (float)(sqrt((double)d->D) / sqrt((double)d->qk) * f);
}

mt_status_t eng_mla_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *x_mid,
                                 eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const mla_dims_t d = dims_of(env, sh->n);
    const int n = d.n, H = d.H, nh = d.nh;
    float *qan = NULL, *qf = NULL, *ckv = NULL, *ckvn = NULL, *kvb = NULL, *R = NULL, *ao = NULL;
    memset(a, 0, sizeof *a);

    ALLOC_SAVED(a->xn, ENG_A_ATTN_XN, "attention input norm");
    ALLOC_SAVED(a->rstd, ENG_A_ATTN_RSTD, "attention input norm rstd");
    const mt_dtype_t xn_dt = eng_layer_act_dtype(m, layer, ENG_A_ATTN_XN);
    if (xn_dt == MT_F32) {
        ops->rmsnorm_fwd(s, a->xn, a->rstd, x_in, eng_weight_f32(env, L->attn_norm), n, H, c->rms_norm_eps);
    } else { /* normed in fp32, saved rounded: only q_a/q and kv_a's products read it */
        float *xn32 = NULL;
        ALLOC(xn32, (size_t)n * H, float, "attention input norm (fp32)");
        ops->rmsnorm_fwd(s, xn32, a->rstd, x_in, eng_weight_f32(env, L->attn_norm), n, H, c->rms_norm_eps);
        ops->f32_to_bf16(s, (uint16_t *)a->xn, xn32, (size_t)n * H);
        kern_free(dev, xn32);
    }
    const eng_operand_t xn = {a->xn, xn_dt};

    /* q (n, nh, qk) */
    ALLOC(qf, (size_t)n * nh * d.qk, float, "mla q projection");
    if (d.ql > 0) {
        ALLOC_SAVED(a->q_pre, ENG_A_Q_PRE, "mla q latent");
        ALLOC_SAVED(a->q_rstd, ENG_A_Q_RSTD, "mla q latent rstd");
        ALLOC(qan, (size_t)n * d.ql, float, "mla q latent normed");
        eng_mm(env, a->q_pre, xn, eng_weight(env, L->q_a), n, d.ql, H, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->q_a, a->q_pre, xn, n, H, d.ql, err));
        ops->rmsnorm_fwd(s, qan, a->q_rstd, a->q_pre, eng_weight_f32(env, L->q_a_norm), n, d.ql, c->rms_norm_eps);
        eng_mm(env, qf, eng_f32(qan), eng_weight(env, L->q_b), n, nh * d.qk, d.ql, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->q_b, qf, eng_f32(qan), n, d.ql, nh * d.qk, err));
        eng_dfree(dev, &qan);
    } else {
        eng_mm(env, qf, xn, eng_weight(env, L->q), n, nh * d.qk, H, false, true, 1.0f, 0.0f);
        TRY(eng_lora_fwd(env, L->q, qf, xn, n, H, nh * d.qk, err));
    }
    /* kv latent and the rotary key */
    const int kva = d.kvl + d.rope;
    ALLOC_SAVED(a->k_pre, ENG_A_K_PRE, "mla kv latent");
    ALLOC_SAVED(a->k_rstd, ENG_A_K_RSTD, "mla kv latent rstd");
    eng_mm(env, a->k_pre, xn, eng_weight(env, L->kv_a), n, kva, H, false, true, 1.0f, 0.0f);
    TRY(eng_lora_fwd(env, L->kv_a, a->k_pre, xn, n, H, kva, err));
    ALLOC(ckv, (size_t)n * d.kvl, float, "mla kv latent (compressed part)");
    ALLOC(ckvn, (size_t)n * d.kvl, float, "mla kv latent normed");
    copy4d(env, ckv, a->k_pre, (kern_copy4d_t){{n, 1, 1, d.kvl}, {kva, 0, 0, 1}, {d.kvl, 0, 0, 1}}, 0);
    ops->rmsnorm_fwd(s, ckvn, a->k_rstd, ckv, eng_weight_f32(env, L->kv_a_norm), n, d.kvl, c->rms_norm_eps);
    eng_dfree(dev, &ckv);
    const int kvw = d.nope + d.vd;
    ALLOC(kvb, (size_t)n * nh * kvw, float, "mla kv_b output");
    eng_mm(env, kvb, eng_f32(ckvn), eng_weight(env, L->kv_b), n, nh * kvw, d.kvl, false, true, 1.0f, 0.0f);
    TRY(eng_lora_fwd(env, L->kv_b, kvb, eng_f32(ckvn), n, d.kvl, nh * kvw, err));
    eng_dfree(dev, &ckvn);

    /* RoPE on every head's rotary query part and the shared rotary key */
    ALLOC(R, (size_t)n * (nh + 1) * d.rope, float, "mla rotary parts");
    rope_gather(env, &d, R, 0, qf + d.nope, nh, (int64_t)nh * d.qk, d.qk);
    rope_gather(env, &d, R, nh, a->k_pre + d.kvl, 1, kva, 0);
    ops->rope_fwd(s, R, env->rope_cos, env->rope_sin, sh->pos, sh->B, sh->T, nh + 1, d.rope);

    /* q, k, v (n, nh, D) */
    ALLOC_SAVED(a->q, ENG_A_Q, "mla q");
    ALLOC_SAVED(a->k, ENG_A_K, "mla k");
    ALLOC_SAVED(a->v, ENG_A_V, "mla v");
    const size_t hdD = (size_t)n * nh * d.D;
    if (d.D > d.qk) {
        kern_memset(dev, s, a->q, 0, hdD * sizeof(float));
        kern_memset(dev, s, a->k, 0, hdD * sizeof(float));
    }
    if (d.D > d.vd) kern_memset(dev, s, a->v, 0, hdD * sizeof(float));
    head_cols(env, &d, a->q, d.D, qf, d.qk, d.nope, 0);
    copy4d(env, a->q + d.nope, R,
           (kern_copy4d_t){{n, nh, 1, d.rope}, {(int64_t)(nh + 1) * d.rope, d.rope, 0, 1},
                           {(int64_t)nh * d.D, d.D, 0, 1}},
           0);
    head_cols(env, &d, a->k, d.D, kvb, kvw, d.nope, 0);
    copy4d(env, a->k + d.nope, R + (size_t)nh * d.rope,
           (kern_copy4d_t){{n, nh, 1, d.rope}, {(int64_t)(nh + 1) * d.rope, 0, 0, 1}, {(int64_t)nh * d.D, d.D, 0, 1}},
           0);
    head_cols(env, &d, a->v, d.D, kvb + d.nope, kvw, d.vd, 0);
    eng_dfree(dev, &qf);
    eng_dfree(dev, &kvb);
    eng_dfree(dev, &R);
    const float qs = q_factor(env, &d);
    if (qs != 1.0f) ops->scale(s, a->q, qs, hdD);

    ALLOC_SAVED(a->att, ENG_A_ATT, "mla attention output");
    ALLOC_SAVED(a->lse, ENG_A_LSE, "mla attention logsumexp");
    /* MLA saves q, k, v and the output in fp32 (engine/model/desc/mla.c) */
    TRY(eng_attn_core_fwd(env, sh, a, MT_F32, nh, nh, d.D, c->sliding_window, err));
    /* x_mid = x_in + att[:, :, :vd] o^T */
    const float *o_in = a->att;
    if (d.D != d.vd) {
        ALLOC(ao, (size_t)n * nh * d.vd, float, "mla attention output (v_head_dim)");
        head_cols(env, &d, ao, d.vd, a->att, d.D, d.vd, 0);
        o_in = ao;
    }
    kern_memcpy_d2d(dev, s, x_mid, x_in, (size_t)n * H * sizeof(float));
    eng_mm(env, x_mid, eng_f32(o_in), eng_weight(env, L->o), n, H, nh * d.vd, false, true, 1.0f, 1.0f);
    TRY(eng_lora_fwd(env, L->o, x_mid, eng_f32(o_in), n, nh * d.vd, H, err));
    eng_dfree(dev, &ao);
    return MT_OK;
fail:
    eng_dfree(dev, &qan);
    eng_dfree(dev, &qf);
    eng_dfree(dev, &ckv);
    eng_dfree(dev, &ckvn);
    eng_dfree(dev, &kvb);
    eng_dfree(dev, &R);
    eng_dfree(dev, &ao);
    eng_attn_acts_release(dev, a);
    return err->code;
}

/* ---- backward ------------------------------------------------------------
 *
 * In five steps, each a function below, that hand each other the gradient
 * buffers in `mla_bwd_t`: o_proj, the attention core, back through RoPE,
 * kv_b and the kv latent's norm, then kv_a and the q path into d(xn).  A
 * buffer is allocated and freed where the math needs it, in the order of
 * one straight-line backward; whatever a failure leaves is freed by
 * mla_bwd_free. */

typedef struct {
    float *ao, *dao, *datt;   /* o_proj: attention output at v_head_dim (recomputed), its and the output's gradient */
    float *dq, *dk, *dv;      /* (n, nh, D) */
    float *dR;                /* (n, nh + 1, rope): the rotary parts' gradient */
    float *dqf, *dkva;        /* d(q projection) (n, nh*qk), d(kv latent) (n, kvl + rope) */
    float *dkvb;              /* d(kv_b output) (n, nh*(nope + vd)) */
    float *ckv, *ckvn, *rstd; /* a latent, its norm and rstd (recomputed) */
    float *dlat, *dlatn;      /* a latent's gradient, and its normed one's */
    float *dxn;               /* d(attention input norm) (n, H) */
    float *scratch;           /* a frozen norm's discarded gradient */
} mla_bwd_t;

static void mla_bwd_free(kern_device_t *dev, mla_bwd_t *b) {
    float **all[] = {&b->ao,   &b->dao,  &b->datt, &b->dq,   &b->dk,   &b->dv,    &b->dR,    &b->dqf,  &b->dkva,
                     &b->dkvb, &b->ckv,  &b->ckvn, &b->rstd, &b->dlat, &b->dlatn, &b->dxn,   &b->scratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) eng_dfree(dev, all[i]);
}

/* o_proj: b->datt (n, nh, D) from dx, zero past v_head_dim; o_proj's gradient. */
static mt_status_t o_proj_bwd(eng_layer_env_t *env, int layer, const mla_dims_t *d, const eng_attn_acts_t *a,
                              const float *dx, mla_bwd_t *b, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const eng_layer_index_t *L = &env->model->layers[layer];
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = d->n, H = d->H, nh = d->nh;
    const size_t hdD = (size_t)n * nh * d->D;
    ALLOC(b->datt, hdD, float, "mla d(attention output)");
    const float *o_in = a->att;
    if (d->D != d->vd) {
        ALLOC(b->ao, (size_t)n * nh * d->vd, float, "mla attention output (v_head_dim, recomputed)");
        head_cols(env, d, b->ao, d->vd, a->att, d->D, d->vd, 0);
        o_in = b->ao;
        ALLOC(b->dao, (size_t)n * nh * d->vd, float, "mla d(attention output, v_head_dim)");
        eng_mm(env, b->dao, eng_f32(dx), eng_weight(env, L->o), n, nh * d->vd, H, false, false, 1.0f, 0.0f);
        TRY(eng_lora_bwd(env, L->o, dx, eng_f32(o_in), b->dao, n, nh * d->vd, H, err));
        kern_memset(dev, s, b->datt, 0, hdD * sizeof(float));
        head_cols(env, d, b->datt, d->D, b->dao, d->vd, d->vd, 0);
        eng_dfree(dev, &b->dao);
    } else {
        eng_mm(env, b->datt, eng_f32(dx), eng_weight(env, L->o), n, nh * d->vd, H, false, false, 1.0f, 0.0f);
        TRY(eng_lora_bwd(env, L->o, dx, eng_f32(o_in), b->datt, n, nh * d->vd, H, err));
    }
    eng_mm_grad(env, L->o, eng_f32(dx), eng_f32(o_in), H, nh * d->vd, n);
    eng_dfree(dev, &b->ao);
    return MT_OK;
fail:
    return err->code;
}

/* The attention core: b->dq, dk, dv from b->datt (freed), dq scaled as q was. */
static mt_status_t core_bwd(eng_layer_env_t *env, const eng_shape_t *sh, const mla_dims_t *d, const eng_attn_acts_t *a,
                            mla_bwd_t *b, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const size_t hdD = (size_t)d->n * d->nh * d->D;
    ALLOC(b->dq, hdD, float, "mla d(q)");
    ALLOC(b->dk, hdD, float, "mla d(k)");
    ALLOC(b->dv, hdD, float, "mla d(v)");
    TRY(eng_attn_core_bwd(env, sh, a, MT_F32, b->dq, b->dk, b->dv, b->datt, d->nh, d->nh, d->D, env->model->cfg.sliding_window,
                          err));
    eng_dfree(dev, &b->datt);
    const float qs = q_factor(env, d);
    if (qs != 1.0f) ops->scale(s, b->dq, qs, hdD);
    return MT_OK;
fail:
    return err->code;
}

/* Back through RoPE: every head's rotary query part, and the shared key's
 * summed over heads, into b->dqf (with q's other part) and the rotary part
 * of b->dkva; b->dq is freed. */
static mt_status_t rope_bwd(eng_layer_env_t *env, const eng_shape_t *sh, const mla_dims_t *d, mla_bwd_t *b,
                            mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const int n = d->n, nh = d->nh, kva = d->kvl + d->rope;
    ALLOC(b->dR, (size_t)n * (nh + 1) * d->rope, float, "mla d(rotary parts)");
    const int64_t rs = (int64_t)(nh + 1) * d->rope;
    copy4d(env, b->dR, b->dq + d->nope,
           (kern_copy4d_t){{n, nh, 1, d->rope}, {(int64_t)nh * d->D, d->D, 0, 1}, {rs, d->rope, 0, 1}}, 0);
    for (int h = 0; h < nh; h++)
        copy4d(env, b->dR + (size_t)nh * d->rope, b->dk + (size_t)h * d->D + d->nope,
               (kern_copy4d_t){{n, 1, 1, d->rope}, {(int64_t)nh * d->D, 0, 0, 1}, {rs, 0, 0, 1}}, h > 0);
    dev->ops->rope_bwd(kern_stream(dev, KERN_STREAM_COMPUTE), b->dR, env->rope_cos, env->rope_sin, sh->pos, sh->B, sh->T,
                       nh + 1, d->rope);
    ALLOC(b->dqf, (size_t)n * nh * d->qk, float, "mla d(q projection)");
    head_cols(env, d, b->dqf, d->qk, b->dq, d->D, d->nope, 0);
    rope_scatter(env, d, b->dqf + d->nope, (int64_t)nh * d->qk, d->qk, b->dR, 0, nh);
    ALLOC(b->dkva, (size_t)n * kva, float, "mla d(kv latent)");
    rope_scatter(env, d, b->dkva + d->kvl, kva, 0, b->dR, nh, 1);
    eng_dfree(dev, &b->dR);
    eng_dfree(dev, &b->dq);
    return MT_OK;
fail:
    return err->code;
}

/* kv_b, d(kv_b output) = [dk_nope, dv] per head (b->dk, dv freed), and the
 * kv latent's norm into the compressed part of b->dkva.  The latent's
 * rstd, recomputed, stays in b->rstd for the q path. */
static mt_status_t kv_latent_bwd(eng_layer_env_t *env, int layer, const mla_dims_t *d, const eng_attn_acts_t *a,
                                 mla_bwd_t *b, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = d->n, nh = d->nh, kva = d->kvl + d->rope, kvw = d->nope + d->vd;
    ALLOC(b->dkvb, (size_t)n * nh * kvw, float, "mla d(kv_b output)");
    head_cols(env, d, b->dkvb, kvw, b->dk, d->D, d->nope, 0);
    head_cols(env, d, b->dkvb + d->nope, kvw, b->dv, d->D, d->vd, 0);
    eng_dfree(dev, &b->dk);
    eng_dfree(dev, &b->dv);
    ALLOC(b->ckv, (size_t)n * d->kvl, float, "mla kv latent (compressed part, recomputed)");
    ALLOC(b->ckvn, (size_t)n * d->kvl, float, "mla kv latent normed (recomputed)");
    ALLOC(b->rstd, n, float, "mla latent rstd (recomputed)");
    copy4d(env, b->ckv, a->k_pre, (kern_copy4d_t){{n, 1, 1, d->kvl}, {kva, 0, 0, 1}, {d->kvl, 0, 0, 1}}, 0);
    ops->rmsnorm_fwd(s, b->ckvn, b->rstd, b->ckv, eng_weight_f32(env, L->kv_a_norm), n, d->kvl, m->cfg.rms_norm_eps);
    eng_mm_grad(env, L->kv_b, eng_f32(b->dkvb), eng_f32(b->ckvn), nh * kvw, d->kvl, n);
    ALLOC(b->dlatn, (size_t)n * d->kvl, float, "mla d(kv latent normed)");
    eng_mm(env, b->dlatn, eng_f32(b->dkvb), eng_weight(env, L->kv_b), n, d->kvl, nh * kvw, false, false, 1.0f, 0.0f);
    TRY(eng_lora_bwd(env, L->kv_b, b->dkvb, eng_f32(b->ckvn), b->dlatn, n, d->kvl, nh * kvw, err));
    eng_dfree(dev, &b->dkvb);
    eng_dfree(dev, &b->ckvn);
    ALLOC(b->dlat, (size_t)n * d->kvl, float, "mla d(kv latent, compressed part)");
    float *gw = eng_grad_or_scratch(env, L->kv_a_norm, &b->scratch, err);
    if (!gw) goto fail;
    ops->rmsnorm_bwd(s, b->dlat, gw, b->dlatn, b->ckv, eng_weight_f32(env, L->kv_a_norm), a->k_rstd, n, d->kvl);
    eng_dfree(dev, &b->scratch);
    copy4d(env, b->dkva, b->dlat, (kern_copy4d_t){{n, 1, 1, d->kvl}, {d->kvl, 0, 0, 1}, {kva, 0, 0, 1}}, 0);
    eng_dfree(dev, &b->dlat);
    eng_dfree(dev, &b->dlatn);
    eng_dfree(dev, &b->ckv);
    return MT_OK;
fail:
    return err->code;
}

/* The q latent's path (q_a, its norm, q_b) from b->dqf into b->dxn. */
static mt_status_t q_latent_bwd(eng_layer_env_t *env, int layer, const mla_dims_t *d, const eng_attn_acts_t *a,
                                eng_operand_t xn, mla_bwd_t *b, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = d->n, H = d->H, nh = d->nh;
    ALLOC(b->ckvn, (size_t)n * d->ql, float, "mla q latent normed (recomputed)");
    eng_dfree(dev, &b->rstd);
    ALLOC(b->rstd, n, float, "mla latent rstd (recomputed)");
    ops->rmsnorm_fwd(s, b->ckvn, b->rstd, a->q_pre, eng_weight_f32(env, L->q_a_norm), n, d->ql, m->cfg.rms_norm_eps);
    eng_mm_grad(env, L->q_b, eng_f32(b->dqf), eng_f32(b->ckvn), nh * d->qk, d->ql, n);
    ALLOC(b->dlatn, (size_t)n * d->ql, float, "mla d(q latent normed)");
    eng_mm(env, b->dlatn, eng_f32(b->dqf), eng_weight(env, L->q_b), n, d->ql, nh * d->qk, false, false, 1.0f, 0.0f);
    TRY(eng_lora_bwd(env, L->q_b, b->dqf, eng_f32(b->ckvn), b->dlatn, n, d->ql, nh * d->qk, err));
    eng_dfree(dev, &b->ckvn);
    ALLOC(b->dlat, (size_t)n * d->ql, float, "mla d(q latent)");
    float *gw = eng_grad_or_scratch(env, L->q_a_norm, &b->scratch, err);
    if (!gw) goto fail;
    ops->rmsnorm_bwd(s, b->dlat, gw, b->dlatn, a->q_pre, eng_weight_f32(env, L->q_a_norm), a->q_rstd, n, d->ql);
    eng_dfree(dev, &b->scratch);
    eng_mm_grad(env, L->q_a, eng_f32(b->dlat), xn, d->ql, H, n);
    eng_mm(env, b->dxn, eng_f32(b->dlat), eng_weight(env, L->q_a), n, H, d->ql, false, false, 1.0f, 1.0f);
    TRY(eng_lora_bwd(env, L->q_a, b->dlat, xn, b->dxn, n, H, d->ql, err));
    eng_dfree(dev, &b->dlat);
    eng_dfree(dev, &b->dlatn);
    return MT_OK;
fail:
    return err->code;
}

/* kv_a (from b->dkva, freed) and the q path (from b->dqf, freed: through
 * the q latent, or q_proj) into b->dxn, d(attention input norm). */
static mt_status_t input_norm_bwd(eng_layer_env_t *env, int layer, const mla_dims_t *d, const eng_attn_acts_t *a,
                                  mla_bwd_t *b, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int n = d->n, H = d->H, nh = d->nh, kva = d->kvl + d->rope;
    const eng_operand_t xn = {a->xn, eng_layer_act_dtype(m, layer, ENG_A_ATTN_XN)};
    ALLOC(b->dxn, (size_t)n * H, float, "mla d(attention input norm)");
    eng_mm_grad(env, L->kv_a, eng_f32(b->dkva), xn, kva, H, n);
    eng_mm(env, b->dxn, eng_f32(b->dkva), eng_weight(env, L->kv_a), n, H, kva, false, false, 1.0f, 0.0f);
    TRY(eng_lora_bwd(env, L->kv_a, b->dkva, xn, b->dxn, n, H, kva, err));
    eng_dfree(dev, &b->dkva);
    if (d->ql > 0) {
        TRY(q_latent_bwd(env, layer, d, a, xn, b, err));
    } else {
        eng_mm_grad(env, L->q, eng_f32(b->dqf), xn, nh * d->qk, H, n);
        eng_mm(env, b->dxn, eng_f32(b->dqf), eng_weight(env, L->q), n, H, nh * d->qk, false, false, 1.0f, 1.0f);
        TRY(eng_lora_bwd(env, L->q, b->dqf, xn, b->dxn, n, H, nh * d->qk, err));
    }
    eng_dfree(dev, &b->dqf);
    eng_dfree(dev, &b->rstd);
    return MT_OK;
fail:
    return err->code;
}

mt_status_t eng_mla_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *dx,
                                  eng_attn_acts_t *a, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const eng_layer_index_t *L = &env->model->layers[layer];
    const mla_dims_t d = dims_of(env, sh->n);
    mla_bwd_t b = {0};
    mt_status_t st = o_proj_bwd(env, layer, &d, a, dx, &b, err);
    if (st == MT_OK) st = core_bwd(env, sh, &d, a, &b, err);
    if (st == MT_OK) st = rope_bwd(env, sh, &d, &b, err);
    if (st == MT_OK) st = kv_latent_bwd(env, layer, &d, a, &b, err);
    if (st == MT_OK) st = input_norm_bwd(env, layer, &d, a, &b, err);
    if (st == MT_OK)
        st = eng_norm_bwd_into_residual(env, L->attn_norm, dx, b.dxn, x_in, a->rstd, d.n, "d(attention input)", err);
    mla_bwd_free(dev, &b);
    eng_attn_acts_release(dev, a);
    return st;
}
