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
 * Saved (model_desc_mla.c): the input norm, the q latent and the kv latent
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
    ops->rope_fwd(s, R, env->rope_cos, env->rope_sin, sh->B, sh->T, nh + 1, d.rope);

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
    ops->attention_fwd(s, a->att, a->lse, a->q, a->k, a->v, sh->kv_len, sh->B, sh->T, nh, nh, d.D, c->sliding_window);
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

mt_status_t eng_mla_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *dx,
                                  eng_attn_acts_t *a, mt_error_t *err) {
    eng_model_t *m = env->model;
    kern_device_t *const dev = env->dev;
    const eng_model_config_t *c = &m->cfg;
    const eng_layer_index_t *L = &m->layers[layer];
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const mla_dims_t d = dims_of(env, sh->n);
    const int n = d.n, H = d.H, nh = d.nh, kva = d.kvl + d.rope, kvw = d.nope + d.vd;
    const size_t hdD = (size_t)n * nh * d.D;
    float *ao = NULL, *datt = NULL, *dq = NULL, *dk = NULL, *dv = NULL, *dR = NULL, *dqf = NULL, *dkva = NULL;
    float *dkvb = NULL, *ckv = NULL, *ckvn = NULL, *rstd = NULL, *dlat = NULL, *dlatn = NULL, *dxn = NULL;
    float *scratch = NULL;

    /* o_proj */
    ALLOC(datt, hdD, float, "mla d(attention output)");
    const float *o_in = a->att;
    if (d.D != d.vd) {
        ALLOC(ao, (size_t)n * nh * d.vd, float, "mla attention output (v_head_dim, recomputed)");
        head_cols(env, &d, ao, d.vd, a->att, d.D, d.vd, 0);
        o_in = ao;
        float *dao = NULL;
        ALLOC(dao, (size_t)n * nh * d.vd, float, "mla d(attention output, v_head_dim)");
        eng_mm(env, dao, eng_f32(dx), eng_weight(env, L->o), n, nh * d.vd, H, false, false, 1.0f, 0.0f);
        if (eng_lora_bwd(env, L->o, dx, eng_f32(o_in), dao, n, nh * d.vd, H, err) != MT_OK) {
            eng_dfree(dev, &dao);
            goto fail;
        }
        kern_memset(dev, s, datt, 0, hdD * sizeof(float));
        head_cols(env, &d, datt, d.D, dao, d.vd, d.vd, 0);
        eng_dfree(dev, &dao);
    } else {
        eng_mm(env, datt, eng_f32(dx), eng_weight(env, L->o), n, nh * d.vd, H, false, false, 1.0f, 0.0f);
        TRY(eng_lora_bwd(env, L->o, dx, eng_f32(o_in), datt, n, nh * d.vd, H, err));
    }
    eng_mm_grad(env, L->o, eng_f32(dx), eng_f32(o_in), H, nh * d.vd, n);
    eng_dfree(dev, &ao);

    /* attention core */
    ALLOC(dq, hdD, float, "mla d(q)");
    ALLOC(dk, hdD, float, "mla d(k)");
    ALLOC(dv, hdD, float, "mla d(v)");
    ops->attention_bwd(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, sh->kv_len, sh->B, sh->T, nh, nh, d.D,
                       c->sliding_window);
    eng_dfree(dev, &datt);
    const float qs = q_factor(env, &d);
    if (qs != 1.0f) ops->scale(s, dq, qs, hdD);

    /* back through RoPE: every head's rotary query part, and the shared key's summed over heads */
    ALLOC(dR, (size_t)n * (nh + 1) * d.rope, float, "mla d(rotary parts)");
    const int64_t rs = (int64_t)(nh + 1) * d.rope;
    copy4d(env, dR, dq + d.nope,
           (kern_copy4d_t){{n, nh, 1, d.rope}, {(int64_t)nh * d.D, d.D, 0, 1}, {rs, d.rope, 0, 1}}, 0);
    for (int h = 0; h < nh; h++)
        copy4d(env, dR + (size_t)nh * d.rope, dk + (size_t)h * d.D + d.nope,
               (kern_copy4d_t){{n, 1, 1, d.rope}, {(int64_t)nh * d.D, 0, 0, 1}, {rs, 0, 0, 1}}, h > 0);
    ops->rope_bwd(s, dR, env->rope_cos, env->rope_sin, sh->B, sh->T, nh + 1, d.rope);
    ALLOC(dqf, (size_t)n * nh * d.qk, float, "mla d(q projection)");
    head_cols(env, &d, dqf, d.qk, dq, d.D, d.nope, 0);
    rope_scatter(env, &d, dqf + d.nope, (int64_t)nh * d.qk, d.qk, dR, 0, nh);
    ALLOC(dkva, (size_t)n * kva, float, "mla d(kv latent)");
    rope_scatter(env, &d, dkva + d.kvl, kva, 0, dR, nh, 1);
    eng_dfree(dev, &dR);
    eng_dfree(dev, &dq);

    /* kv_b: d(kv_b output) = [dk_nope, dv] per head */
    ALLOC(dkvb, (size_t)n * nh * kvw, float, "mla d(kv_b output)");
    head_cols(env, &d, dkvb, kvw, dk, d.D, d.nope, 0);
    head_cols(env, &d, dkvb + d.nope, kvw, dv, d.D, d.vd, 0);
    eng_dfree(dev, &dk);
    eng_dfree(dev, &dv);
    ALLOC(ckv, (size_t)n * d.kvl, float, "mla kv latent (compressed part, recomputed)");
    ALLOC(ckvn, (size_t)n * d.kvl, float, "mla kv latent normed (recomputed)");
    ALLOC(rstd, n, float, "mla latent rstd (recomputed)");
    copy4d(env, ckv, a->k_pre, (kern_copy4d_t){{n, 1, 1, d.kvl}, {kva, 0, 0, 1}, {d.kvl, 0, 0, 1}}, 0);
    ops->rmsnorm_fwd(s, ckvn, rstd, ckv, eng_weight_f32(env, L->kv_a_norm), n, d.kvl, c->rms_norm_eps);
    eng_mm_grad(env, L->kv_b, eng_f32(dkvb), eng_f32(ckvn), nh * kvw, d.kvl, n);
    ALLOC(dlatn, (size_t)n * d.kvl, float, "mla d(kv latent normed)");
    eng_mm(env, dlatn, eng_f32(dkvb), eng_weight(env, L->kv_b), n, d.kvl, nh * kvw, false, false, 1.0f, 0.0f);
    TRY(eng_lora_bwd(env, L->kv_b, dkvb, eng_f32(ckvn), dlatn, n, d.kvl, nh * kvw, err));
    eng_dfree(dev, &dkvb);
    eng_dfree(dev, &ckvn);
    ALLOC(dlat, (size_t)n * d.kvl, float, "mla d(kv latent, compressed part)");
    float *gw = eng_grad_or_scratch(env, L->kv_a_norm, &scratch, err);
    if (!gw) goto fail;
    ops->rmsnorm_bwd(s, dlat, gw, dlatn, ckv, eng_weight_f32(env, L->kv_a_norm), a->k_rstd, n, d.kvl);
    eng_dfree(dev, &scratch);
    copy4d(env, dkva, dlat, (kern_copy4d_t){{n, 1, 1, d.kvl}, {d.kvl, 0, 0, 1}, {kva, 0, 0, 1}}, 0);
    eng_dfree(dev, &dlat);
    eng_dfree(dev, &dlatn);
    eng_dfree(dev, &ckv);

    /* kv_a and the q path into d(xn) */
    const eng_operand_t xn = {a->xn, eng_layer_act_dtype(m, layer, ENG_A_ATTN_XN)};
    ALLOC(dxn, (size_t)n * H, float, "mla d(attention input norm)");
    eng_mm_grad(env, L->kv_a, eng_f32(dkva), xn, kva, H, n);
    eng_mm(env, dxn, eng_f32(dkva), eng_weight(env, L->kv_a), n, H, kva, false, false, 1.0f, 0.0f);
    TRY(eng_lora_bwd(env, L->kv_a, dkva, xn, dxn, n, H, kva, err));
    eng_dfree(dev, &dkva);
    if (d.ql > 0) {
        ALLOC(ckvn, (size_t)n * d.ql, float, "mla q latent normed (recomputed)");
        eng_dfree(dev, &rstd);
        ALLOC(rstd, n, float, "mla latent rstd (recomputed)");
        ops->rmsnorm_fwd(s, ckvn, rstd, a->q_pre, eng_weight_f32(env, L->q_a_norm), n, d.ql, c->rms_norm_eps);
        eng_mm_grad(env, L->q_b, eng_f32(dqf), eng_f32(ckvn), nh * d.qk, d.ql, n);
        ALLOC(dlatn, (size_t)n * d.ql, float, "mla d(q latent normed)");
        eng_mm(env, dlatn, eng_f32(dqf), eng_weight(env, L->q_b), n, d.ql, nh * d.qk, false, false, 1.0f, 0.0f);
        TRY(eng_lora_bwd(env, L->q_b, dqf, eng_f32(ckvn), dlatn, n, d.ql, nh * d.qk, err));
        eng_dfree(dev, &ckvn);
        ALLOC(dlat, (size_t)n * d.ql, float, "mla d(q latent)");
        gw = eng_grad_or_scratch(env, L->q_a_norm, &scratch, err);
        if (!gw) goto fail;
        ops->rmsnorm_bwd(s, dlat, gw, dlatn, a->q_pre, eng_weight_f32(env, L->q_a_norm), a->q_rstd, n, d.ql);
        eng_dfree(dev, &scratch);
        eng_mm_grad(env, L->q_a, eng_f32(dlat), xn, d.ql, H, n);
        eng_mm(env, dxn, eng_f32(dlat), eng_weight(env, L->q_a), n, H, d.ql, false, false, 1.0f, 1.0f);
        TRY(eng_lora_bwd(env, L->q_a, dlat, xn, dxn, n, H, d.ql, err));
        eng_dfree(dev, &dlat);
        eng_dfree(dev, &dlatn);
    } else {
        eng_mm_grad(env, L->q, eng_f32(dqf), xn, nh * d.qk, H, n);
        eng_mm(env, dxn, eng_f32(dqf), eng_weight(env, L->q), n, H, nh * d.qk, false, false, 1.0f, 1.0f);
        TRY(eng_lora_bwd(env, L->q, dqf, xn, dxn, n, H, nh * d.qk, err));
    }
    eng_dfree(dev, &dqf);
    eng_dfree(dev, &rstd);
    if (eng_norm_bwd_into_residual(env, L->attn_norm, dx, dxn, x_in, a->rstd, n, "d(attention input)", err) !=
        MT_OK)
        goto fail;
    eng_dfree(dev, &dxn);
    eng_attn_acts_release(dev, a);
    return MT_OK;
fail: {
    float **all[] = {&ao, &datt, &dq, &dk, &dv, &dR, &dqf, &dkva, &dkvb, &ckv, &ckvn, &rstd, &dlat, &dlatn, &dxn,
                     &scratch};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) eng_dfree(dev, all[i]);
    eng_attn_acts_release(dev, a);
    return err->code;
}
}
