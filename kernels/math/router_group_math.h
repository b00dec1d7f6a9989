/* One token row of the grouped sigmoid router (router_group.h), shared by
 * the CPU twin and the CUDA kernel so both choose the same experts and
 * round the same way.  The row's scores are written first and re-read as
 * the choice is made (choice = score + bias is recomputed on each read, the
 * same float addition every time), so no E-sized scratch is needed.
 * expf and INFINITY come from the includer (<math.h> in C, the CUDA
 * headers in a .cu): <math.h> cannot sit inside the .cu's extern "C". */
#ifndef MT_KERNELS_MATH_ROUTER_GROUP_MATH_H
#define MT_KERNELS_MATH_ROUTER_GROUP_MATH_H

#include <stdint.h>

#include "base/hd.h"
#include "kernels/router_group.h"
#include "kernels/math/router_math.h"

/* The limits of router_group.h, as a predicate both twins check. */
MT_HD int kern_router_group_valid(int E, int k, const kern_router_group_t *g) {
    return g->n_group >= 1 && g->n_group <= KERN_ROUTER_GROUP_MAX_GROUPS && E % g->n_group == 0 &&
           E / g->n_group >= 2 && g->topk_group >= 1 && g->topk_group <= g->n_group && k >= 1 &&
           k <= KERN_ROUTER_GROUP_MAX_K && k <= g->topk_group * (E / g->n_group);
}

MT_HD float kern_router_group_choice(const float *sr, const float *bias, int e) {
    return bias ? sr[e] + bias[e] : sr[e];
}

/* Forward of row r: sr (E) already holds the sigmoid scores.  wr (k), ir (k). */
MT_HD void kern_router_group_row(float *wr, int32_t *ir, const float *sr, const float *bias, int E, int k,
                                 const kern_router_group_t *g) {
    const int G = g->n_group, per = E / G;
    /* group scores: the two largest choices of each group (torch's
     * topk(2).sum), or the largest (V2's max) */
    float gs[KERN_ROUTER_GROUP_MAX_GROUPS];
    for (int q = 0; q < G; q++) {
        int b1 = -1, b2 = -1;
        for (int e = q * per; e < (q + 1) * per; e++) {
            const float c = kern_router_group_choice(sr, bias, e);
            if (b1 < 0 || kern_router_before(c, e, kern_router_group_choice(sr, bias, b1), b1)) {
                b2 = b1;
                b1 = e;
            } else if (b2 < 0 || kern_router_before(c, e, kern_router_group_choice(sr, bias, b2), b2)) {
                b2 = e;
            }
        }
        gs[q] = g->softmax ? kern_router_group_choice(sr, bias, b1)
                           : kern_router_group_choice(sr, bias, b1) + kern_router_group_choice(sr, bias, b2);
    }
    /* the topk_group best groups, as a bit mask */
    uint64_t keep = 0;
    for (int j = 0; j < g->topk_group; j++) {
        int best = -1;
        for (int q = 0; q < G; q++) {
            if (keep >> q & 1) continue;
            if (best < 0 || kern_router_before(gs[q], q, gs[best], best)) best = q;
        }
        keep |= (uint64_t)1 << best;
    }
    /* top-k by choice among the kept groups' experts: slot j is the best
     * expert ranked after slot j-1's */
    for (int j = 0; j < k; j++) {
        int best = -1;
        float bc = 0.0f;
        const float pc = j > 0 ? kern_router_group_choice(sr, bias, ir[j - 1]) : 0.0f;
        for (int e = 0; e < E; e++) {
            if (!(keep >> (e / per) & 1)) continue;
            const float c = kern_router_group_choice(sr, bias, e);
            if (j > 0 && !kern_router_before(pc, ir[j - 1], c, e)) continue;
            if (best < 0 || kern_router_before(c, e, bc, best)) {
                best = e;
                bc = c;
            }
        }
        ir[j] = best;
        wr[j] = sr[best];
    }
    if (g->renorm) {
        float sum = 0.0f;
        for (int j = 0; j < k; j++) sum += wr[j];
        const float den = sum + 1e-20f;
        for (int j = 0; j < k; j++) wr[j] = wr[j] / den;
    }
    for (int j = 0; j < k; j++) wr[j] = wr[j] * g->scale;
}

/* Gradient of the k chosen scores (dp, k) from the weights' (dw, k):
 *   w_s = c * p_s / D, D = sum p + 1e-20:  dp_s = c * (dw_s - sum_t dw_t p_t / D) / D
 *   without renormalisation w_s = c * p_s:  dp_s = c * dw_s. */
MT_HD void kern_router_group_dscores(float *dp, const float *dw, const float *p, int k,
                                     const kern_router_group_t *g) {
    if (!g->renorm) {
        for (int s = 0; s < k; s++) dp[s] = dw[s] * g->scale;
        return;
    }
    float sum = 0.0f;
    for (int s = 0; s < k; s++) sum += p[s];
    const float den = sum + 1e-20f;
    float dot = 0.0f;
    for (int s = 0; s < k; s++) dot += dw[s] * (p[s] / den);
    for (int s = 0; s < k; s++) dp[s] = g->scale * ((dw[s] - dot) / den);
}

/* torch's sigmoid backward: grad * (1 - y) * y. */
MT_HD float kern_router_group_dlogit(float dscore, float score) { return dscore * (1.0f - score) * score; }

/* Scores of one row from its logits: sigmoid, or softmax (max-subtracted,
 * the sum in expert order in fp32, as the softmax router's twin). */
MT_HD void kern_router_group_scores(float *sr, const float *lr, int E, const kern_router_group_t *g) {
    if (!g->softmax) {
        for (int e = 0; e < E; e++) sr[e] = 1.0f / (1.0f + expf(-lr[e]));
        return;
    }
    float mx = -INFINITY;
    for (int e = 0; e < E; e++) mx = lr[e] > mx ? lr[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) {
        sr[e] = expf(lr[e] - mx);
        sum += sr[e];
    }
    for (int e = 0; e < E; e++) sr[e] = sr[e] / sum;
}

/* Backward of one row (overwrite dl (E)) from the weights' gradient dw (k). */
MT_HD void kern_router_group_row_bwd(float *dl, const float *dw, const float *sr, const int32_t *ir, int E, int k,
                                     const kern_router_group_t *g) {
    float p[KERN_ROUTER_GROUP_MAX_K], dp[KERN_ROUTER_GROUP_MAX_K];
    for (int s = 0; s < k; s++) p[s] = sr[ir[s]];
    kern_router_group_dscores(dp, dw, p, k, g);
    if (!g->softmax) {
        for (int e = 0; e < E; e++) dl[e] = 0.0f;
        for (int s = 0; s < k; s++) dl[ir[s]] = kern_router_group_dlogit(dp[s], p[s]);
        return;
    }
    double pdp = 0.0;
    for (int s = 0; s < k; s++) pdp += (double)p[s] * dp[s];
    const float pdp_f = (float)pdp;
    for (int e = 0; e < E; e++) dl[e] = sr[e] * (0.0f - pdp_f);
    for (int s = 0; s < k; s++) dl[ir[s]] = p[s] * (dp[s] - pdp_f);
}

#endif
