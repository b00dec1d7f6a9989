/* Router arithmetic shared by the CPU twin and the CUDA kernels (moe_ops.h
 * semantics): the top-k order, the renormalisation of the k weights and
 * its backward. */
#ifndef MT_KERNELS_MATH_ROUTER_MATH_H
#define MT_KERNELS_MATH_ROUTER_MATH_H

#include "base/hd.h"

/* Top-k order: larger probability first, ties to the lower expert index.
 * NaN ranks below every number (two NaNs: lower index first), so this is a
 * strict total order on (p, e) pairs whatever the values: a row of NaN or
 * Inf probabilities (a NaN weight, a huge learning rate) still yields k
 * distinct experts in [0, E), never the "none found" index -1 that a
 * comparison false for NaN would leave and that the plan would then write
 * through. */
MT_HD int kern_router_before(float pa, int ia, float pb, int ib) {
    const int na = pa != pa, nb = pb != pb;
    if (na | nb) return na == nb ? ia < ib : nb;
    return pa > pb || (pa == pb && ia < ib);
}

/* w[s] /= sum_{s'} w[s'], the sum taken in slot order. */
MT_HD void kern_router_renorm(float *w, int k) {
    float sum = 0.0f;
    for (int s = 0; s < k; s++) sum += w[s];
    for (int s = 0; s < k; s++) w[s] = w[s] / sum;
}

/* Gradient w.r.t. the selected probabilities p[s] = probs[idx[s]] given the
 * gradient dw of the router weights.  Without renormalisation w = p, so
 * dp = dw; with it w[s] = p[s] / S, S = sum p, so
 *   dp[s] = (dw[s] - sum_t dw[t] * w[t]) / S. */
MT_HD void kern_router_topk_bwd(float *dp, const float *dw, const float *p, int k, int renorm) {
    if (!renorm) {
        for (int s = 0; s < k; s++) dp[s] = dw[s];
        return;
    }
    float S = 0.0f;
    for (int s = 0; s < k; s++) S += p[s];
    float dot = 0.0f;
    for (int s = 0; s < k; s++) dot += dw[s] * (p[s] / S);
    for (int s = 0; s < k; s++) dp[s] = (dw[s] - dot) / S;
}

#endif
