/* Router arithmetic shared by the CPU twin and the CUDA kernels (moe_ops.h
 * semantics): the top-k order, the renormalisation of the k weights and
 * its backward. */
#ifndef MT_KERNELS_ROUTER_MATH_H
#define MT_KERNELS_ROUTER_MATH_H

#include "base/hd.h"

/* Top-k order: larger probability first, ties to the lower expert index. */
MT_HD int kern_router_before(float pa, int ia, float pb, int ib) {
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
