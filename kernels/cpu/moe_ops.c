/* Router and token-permutation primitives on the CPU (see moe_ops.h). */
#include "kernels/moe_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/elementwise.h"
#include "kernels/status.h"

void kern_router_fwd_cpu(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                         const float *logits, int n, int E, int k, kern_router_mode_t mode) {
    (void)s;
    for (int r = 0; r < n; r++) {
        const float *lr = logits + (size_t)r * E;
        float *pr = probs + (size_t)r * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = lr[e] > mx ? lr[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) {
            pr[e] = expf(lr[e] - mx);
            sum += pr[e];
        }
        for (int e = 0; e < E; e++) pr[e] /= sum;
        /* top-k by repeated selection: k is small (2..8), E up to a few hundred */
        int32_t *ir = idx + (size_t)r * k;
        float *wr = weights + (size_t)r * k;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= ir[q] == e;
                if (!taken && (best < 0 || pr[e] > pr[best])) best = e;
            }
            ir[j] = best;
            wr[j] = pr[best];
        }
        if (mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM) {
            float tot = 0.0f;
            for (int j = 0; j < k; j++) tot += wr[j];
            for (int j = 0; j < k; j++) wr[j] /= tot;
        }
    }
}

void kern_router_bwd_cpu(kern_stream_t *s, float *dlogits, const float *dweights,
                         const float *probs, const int32_t *idx, const float *aux_dp,
                         const float *tok_w, int n, int E, int k, kern_router_mode_t mode) {
    (void)s;
    float *dp = malloc((size_t)E * sizeof *dp);
    MT_CHECK_ALLOC(dp, "router backward scratch");
    for (int r = 0; r < n; r++) {
        const float *pr = probs + (size_t)r * E;
        const int32_t *ir = idx + (size_t)r * k;
        const float *dwr = dweights + (size_t)r * k;
        float *dl = dlogits + (size_t)r * E;
        memset(dp, 0, (size_t)E * sizeof *dp);
        if (mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM) {
            /* w_j = p_j / S:  dL/dp_j = (dw_j - sum_i dw_i w_i) / S */
            float S = 0.0f;
            for (int j = 0; j < k; j++) S += pr[ir[j]];
            float dot = 0.0f;
            for (int j = 0; j < k; j++) dot += dwr[j] * (pr[ir[j]] / S);
            for (int j = 0; j < k; j++) dp[ir[j]] += (dwr[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++) dp[ir[j]] += dwr[j];
        }
        if (aux_dp) {
            const float tw = tok_w ? tok_w[r] : 1.0f;
            for (int e = 0; e < E; e++) dp[e] += aux_dp[e] * tw;
        }
        double pdp = 0.0;
        for (int e = 0; e < E; e++) pdp += (double)pr[e] * dp[e];
        for (int e = 0; e < E; e++) dl[e] = pr[e] * (dp[e] - (float)pdp);
    }
    free(dp);
}

void kern_moe_plan_cpu(kern_stream_t *s, int32_t *counts, int32_t *offsets, int32_t *perm_tok,
                       int32_t *inv, const int32_t *idx, int n, int k, int E) {
    (void)s;
    memset(counts, 0, (size_t)E * sizeof *counts);
    for (int i = 0; i < n * k; i++) counts[idx[i]]++;
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    int32_t *cursor = malloc((size_t)E * sizeof *cursor);
    MT_CHECK_ALLOC(cursor, "moe plan cursor");
    memcpy(cursor, offsets, (size_t)E * sizeof *cursor);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            const int e = idx[(size_t)r * k + j];
            const int pos = cursor[e]++;
            perm_tok[pos] = r;
            inv[(size_t)r * k + j] = pos;
        }
    free(cursor);
}

void kern_moe_gather_cpu(kern_stream_t *s, float *dst, const float *src, const int32_t *perm_tok,
                         int m, int H) {
    (void)s;
    for (int j = 0; j < m; j++)
        memcpy(dst + (size_t)j * H, src + (size_t)perm_tok[j] * H, (size_t)H * sizeof *dst);
}

void kern_moe_unpermute_sum_cpu(kern_stream_t *s, float *y, const float *src, const float *w,
                                const int32_t *inv, int n, int k, int H, int accumulate) {
    (void)s;
    for (int r = 0; r < n; r++) {
        float *yr = y + (size_t)r * H;
        if (!accumulate) memset(yr, 0, (size_t)H * sizeof *yr);
        for (int j = 0; j < k; j++) {
            const float *sr = src + (size_t)inv[(size_t)r * k + j] * H;
            const float wj = w ? w[(size_t)r * k + j] : 1.0f;
            for (int c = 0; c < H; c++) yr[c] += wj * sr[c];
        }
    }
}

void kern_moe_combine_bwd_cpu(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                              const float *src, const float *w, const int32_t *inv, int n, int k,
                              int H) {
    (void)s;
    for (int r = 0; r < n; r++) {
        const float *dyr = dy + (size_t)r * H;
        for (int j = 0; j < k; j++) {
            const size_t row = (size_t)inv[(size_t)r * k + j];
            const float *sr = src + row * H;
            float *dsr = dsrc + row * H;
            const float wj = w[(size_t)r * k + j];
            double dot = 0.0;
            for (int c = 0; c < H; c++) {
                dot += (double)sr[c] * dyr[c];
                dsr[c] = wj * dyr[c];
            }
            dw[(size_t)r * k + j] = (float)dot;
        }
    }
}

void kern_gate_scale_fwd_cpu(kern_stream_t *s, float *y, const float *x, const float *glogit,
                             int n, int H) {
    (void)s;
    for (int r = 0; r < n; r++) {
        const float g = kern_sigmoid(glogit[r]);
        float *yr = y + (size_t)r * H;
        const float *xr = x + (size_t)r * H;
        for (int c = 0; c < H; c++) yr[c] += g * xr[c];
    }
}

void kern_gate_scale_bwd_cpu(kern_stream_t *s, float *dx, float *dglogit, const float *dy,
                             const float *x, const float *glogit, int n, int H) {
    (void)s;
    for (int r = 0; r < n; r++) {
        const float g = kern_sigmoid(glogit[r]);
        const float *dyr = dy + (size_t)r * H, *xr = x + (size_t)r * H;
        float *dxr = dx + (size_t)r * H;
        double dot = 0.0;
        for (int c = 0; c < H; c++) {
            dot += (double)dyr[c] * xr[c];
            dxr[c] = g * dyr[c];
        }
        dglogit[r] = (float)dot * g * (1.0f - g);
    }
}
