/* Forward and backward of one micro-batch over the whole model (see
 * model.h).  Layer halves live in blocks.c, the MoE block in moe/.
 *
 * Residual stream: hs[0] = embeddings, hs[2l+1] = layer l after attention,
 * hs[2l+2] = layer l's output.  All are kept until backward passes them
 * (the keep-everything plan); backward frees each as soon as it is used.
 *
 * Loss: CE over the shifted targets, mean over counted tokens, plus
 * router_aux_loss_coef * aux when output_router_logits (HF's
 * load_balancing_loss_func over all MoE layers' router outputs, with the
 * attention mask).  The aux statistics need every layer's routing, so they
 * are gathered after the forward pass, before any backward. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/blocks.h"
#include "kernels/rope.h"

#define DALLOC(ptr, bytes, tag)                                 \
    do {                                                        \
        (ptr) = kern_alloc(m->dev, (bytes), (tag), err);        \
        if (!(ptr)) { st = err->code; goto done; }              \
    } while (0)

static void dfree(kern_device_t *dev, void *p) {
    if (p) kern_free(dev, p);
}

static mt_status_t ensure_rope(eng_model_t *m, int T, mt_error_t *err) {
    if (m->rope_T == T) return MT_OK;
    const int half = m->cfg.head_dim / 2;
    dfree(m->dev, m->rope_cos);
    dfree(m->dev, m->rope_sin);
    m->rope_cos = kern_alloc(m->dev, (size_t)T * half * sizeof(float), "rope cos table", err);
    m->rope_sin = kern_alloc(m->dev, (size_t)T * half * sizeof(float), "rope sin table", err);
    if (!m->rope_cos || !m->rope_sin) return err->code;
    float *c = malloc((size_t)T * half * sizeof *c), *s = malloc((size_t)T * half * sizeof *s);
    MT_CHECK(c && s, "out of host memory for rope tables");
    kern_rope_table(c, s, T, m->cfg.head_dim, m->cfg.rope_theta);
    kern_stream_t *st = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    kern_memcpy_h2d(m->dev, st, m->rope_cos, c, (size_t)T * half * sizeof(float));
    kern_memcpy_h2d(m->dev, st, m->rope_sin, s, (size_t)T * half * sizeof(float));
    kern_stream_sync(m->dev, st);
    free(c);
    free(s);
    m->rope_T = T;
    return MT_OK;
}

/* Load-balancing loss over all MoE layers (HF load_balancing_loss_func with
 * the attention mask).  Returns aux and fills dp_coef[e] = E * F[e] / N,
 * so that d(aux)/d(probs_l[t, e]) = dp_coef[e] * mask[t]. */
static double aux_loss_stats(eng_model_t *m, eng_mlp_acts_t *ma, const uint8_t *mask, int n,
                             double *dp_coef) {
    const int E = m->cfg.num_experts, k = m->cfg.num_experts_per_tok;
    double *F = calloc((size_t)E, sizeof *F), *P = calloc((size_t)E, sizeof *P);
    int32_t *idx = malloc((size_t)n * k * sizeof *idx);
    float *probs = malloc((size_t)n * E * sizeof *probs);
    MT_CHECK(F && P && idx && probs, "out of host memory for aux loss");
    kern_stream_t *s = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    double masked = 0;
    for (int t = 0; t < n; t++) masked += mask[t];
    double N = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (!ma[l].is_moe) continue;
        kern_memcpy_d2h(m->dev, s, idx, ma[l].moe.idx, (size_t)n * k * sizeof *idx);
        kern_memcpy_d2h(m->dev, s, probs, ma[l].moe.probs, (size_t)n * E * sizeof *probs);
        kern_stream_sync(m->dev, s);
        for (int t = 0; t < n; t++) {
            if (!mask[t]) continue;
            for (int j = 0; j < k; j++) F[idx[(size_t)t * k + j]] += 1.0;
            for (int e = 0; e < E; e++) P[e] += probs[(size_t)t * E + e];
        }
        N += masked;
    }
    double aux = 0;
    for (int e = 0; e < E; e++) {
        const double f = N > 0 ? F[e] / N : 0, p = N > 0 ? P[e] / N : 0;
        aux += f * p;
        dp_coef[e] = N > 0 ? (double)E * f / N : 0;
    }
    free(F);
    free(P);
    free(idx);
    free(probs);
    return aux * E;
}

static mt_status_t run(eng_model_t *m, const eng_batch_t *batch, float loss_scale,
                       float *logits_out, eng_micro_stats_t *stats, bool backward,
                       mt_error_t *err) {
    const eng_model_config_t *c = &m->cfg;
    const kern_ops_t *ops = m->dev->ops;
    kern_stream_t *s = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    const int L = c->num_hidden_layers, H = c->hidden_size, V = c->vocab_size;
    const eng_shape_t sh = {.B = batch->B, .T = batch->T, .n = batch->B * batch->T};
    const int n = sh.n;
    const size_t act = (size_t)n * H * sizeof(float);
    mt_status_t st = MT_OK;

    int32_t *ids = NULL, *targets = NULL;
    float *tok_w = NULL, *aux_dp = NULL, *xf = NULL, *rstdf = NULL, *logits = NULL;
    float *loss_rows = NULL, *dxf = NULL, *dx = NULL;
    float **hs = calloc((size_t)2 * L + 1, sizeof *hs);
    eng_attn_acts_t *aa = calloc((size_t)L, sizeof *aa);
    eng_mlp_acts_t *ma = calloc((size_t)L, sizeof *ma);
    float *host_tw = malloc((size_t)n * sizeof *host_tw);
    float *host_loss = malloc((size_t)n * sizeof *host_loss);
    MT_CHECK(hs && aa && ma && host_tw && host_loss, "out of host memory for the step");
    memset(stats, 0, sizeof *stats);

    st = ensure_rope(m, sh.T, err);
    if (st != MT_OK) goto done;
    DALLOC(ids, (size_t)n * sizeof *ids, "input ids");
    DALLOC(targets, (size_t)n * sizeof *targets, "targets");
    DALLOC(tok_w, (size_t)n * sizeof *tok_w, "attention mask weights");
    for (int t = 0; t < n; t++) host_tw[t] = batch->mask[t] ? 1.0f : 0.0f;
    kern_memcpy_h2d(m->dev, s, ids, batch->inputs, (size_t)n * sizeof *ids);
    kern_memcpy_h2d(m->dev, s, targets, batch->targets, (size_t)n * sizeof *targets);
    kern_memcpy_h2d(m->dev, s, tok_w, host_tw, (size_t)n * sizeof *tok_w);

    /* ---- forward ---- */
    DALLOC(hs[0], act, "embeddings");
    ops->embedding_fwd(s, hs[0], m->params[m->embed].w, ids, n, H);
    for (int l = 0; l < L; l++) {
        DALLOC(hs[2 * l + 1], act, "residual after attention");
        st = eng_attn_forward(m, l, &sh, hs[2 * l], hs[2 * l + 1], &aa[l], err);
        if (st != MT_OK) goto done;
        DALLOC(hs[2 * l + 2], act, "residual after mlp");
        st = eng_mlp_forward(m, l, &sh, hs[2 * l + 1], hs[2 * l + 2], &ma[l], err);
        if (st != MT_OK) goto done;
    }
    DALLOC(xf, act, "final norm output");
    DALLOC(rstdf, (size_t)n * sizeof(float), "final norm rstd");
    ops->rmsnorm_fwd(s, xf, rstdf, hs[2 * L], m->params[m->final_norm].w, n, H, c->rms_norm_eps);
    DALLOC(logits, (size_t)n * V * sizeof(float), "logits");
    ops->matmul(s, logits, xf, m->params[m->lm_head].w, n, V, H, false, true, 1.0f, 0.0f);
    if (logits_out) {
        kern_memcpy_d2h(m->dev, s, logits_out, logits, (size_t)n * V * sizeof(float));
        kern_stream_sync(m->dev, s);
    }

    const bool use_aux = c->output_router_logits && m->num_moe_layers > 0;
    if (use_aux) {
        const int E = c->num_experts;
        double *coef = malloc((size_t)E * sizeof *coef);
        float *coef_f = malloc((size_t)E * sizeof *coef_f);
        MT_CHECK(coef && coef_f, "out of host memory for aux loss");
        stats->aux_loss = aux_loss_stats(m, ma, batch->mask, n, coef);
        for (int e = 0; e < E; e++)
            coef_f[e] = (float)(coef[e] * c->router_aux_loss_coef * loss_scale);
        aux_dp = kern_alloc(m->dev, (size_t)E * sizeof(float), "aux loss gradient", err);
        if (aux_dp) {
            kern_memcpy_h2d(m->dev, s, aux_dp, coef_f, (size_t)E * sizeof(float));
            kern_stream_sync(m->dev, s);
        }
        free(coef);
        free(coef_f);
        if (!aux_dp) { st = err->code; goto done; }
    }

    stats->tokens = n;
    stats->counted = batch->counted;
    const float grad_scale = batch->counted > 0 ? loss_scale / (float)batch->counted : 0.0f;
    DALLOC(loss_rows, (size_t)n * sizeof(float), "per-token loss");
    ops->xent(s, loss_rows, backward ? logits : NULL, logits, targets, n, V, grad_scale);
    kern_memcpy_d2h(m->dev, s, host_loss, loss_rows, (size_t)n * sizeof(float));
    kern_stream_sync(m->dev, s);
    double sum = 0;
    for (int t = 0; t < n; t++) sum += host_loss[t];
    stats->ce_loss = batch->counted > 0 ? sum / (double)batch->counted : 0.0;
    stats->loss = stats->ce_loss + (use_aux ? c->router_aux_loss_coef * stats->aux_loss : 0.0);
    if (!backward) goto done;

    /* ---- backward ---- */
    DALLOC(dxf, act, "d(final norm output)");
    ops->matmul(s, dxf, logits, m->params[m->lm_head].w, n, H, V, false, false, 1.0f, 0.0f);
    m->params[m->lm_head].has_grad = true;
    ops->matmul(s, m->params[m->lm_head].g, logits, xf, V, H, n, true, false, 1.0f, 1.0f);
    dfree(m->dev, logits);
    logits = NULL;
    DALLOC(dx, act, "d(residual)");
    m->params[m->final_norm].has_grad = true;
    ops->rmsnorm_bwd(s, dx, m->params[m->final_norm].g, dxf, hs[2 * L], m->params[m->final_norm].w,
                     rstdf, n, H);
    for (int l = L - 1; l >= 0; l--) {
        st = eng_mlp_backward(m, l, &sh, hs[2 * l + 1], dx, ma[l].is_moe ? aux_dp : NULL, tok_w,
                              &ma[l], err);
        if (st != MT_OK) goto done;
        dfree(m->dev, hs[2 * l + 2]);
        hs[2 * l + 2] = NULL;
        st = eng_attn_backward(m, l, &sh, hs[2 * l], dx, &aa[l], err);
        if (st != MT_OK) goto done;
        dfree(m->dev, hs[2 * l + 1]);
        hs[2 * l + 1] = NULL;
    }
    m->params[m->embed].has_grad = true;
    ops->embedding_bwd(s, m->params[m->embed].g, dx, ids, n, H);

done:
    kern_stream_sync(m->dev, s);
    for (int l = 0; l < L; l++) {
        eng_attn_acts_release(m->dev, &aa[l]);
        eng_mlp_acts_release(m->dev, &ma[l]);
    }
    for (int i = 0; i <= 2 * L; i++) dfree(m->dev, hs[i]);
    void *bufs[] = {ids, targets, tok_w, aux_dp, xf, rstdf, logits, loss_rows, dxf, dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(m->dev, bufs[i]);
    free(hs);
    free(aa);
    free(ma);
    free(host_tw);
    free(host_loss);
    return st;
}

mt_status_t eng_model_forward_backward(eng_model_t *m, const eng_batch_t *batch,
                                       float loss_scale, float *logits_out,
                                       eng_micro_stats_t *stats, mt_error_t *err) {
    return run(m, batch, loss_scale, logits_out, stats, true, err);
}

mt_status_t eng_model_forward(eng_model_t *m, const eng_batch_t *batch, float *logits_out,
                              eng_micro_stats_t *stats, mt_error_t *err) {
    return run(m, batch, 1.0f, logits_out, stats, false, err);
}
