// MoE router: softmax over experts, top-k with optional renormalisation,
// and its backward with the load-balancing term (moe_ops.h).
//
// One warp per token row (8 rows a 256-thread block); lanes stride the E
// experts.  The k winners are found by k rounds of a warp arg-max over the
// experts that come after the previous winner in the top-k order
// (kern_router_before: probability descending, ties to the lower index),
// which selects exactly what the CPU twin's repeated scan selects.
// Renormalisation and the top-k backward are router_math.h's, shared with
// the CPU; the softmax sums are fp32 (the twin's), in butterfly order; the
// softmax backward's sum(p * dp) is double, as in the twin.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/math/router_math.h"
}

#define ROUTER_ROWS_PER_BLOCK 8
#define ROUTER_MAX_K 32

static __global__ void router_fwd_kernel(float *weights, int32_t *idx, float *probs,
                                         const float *logits, int n, int E, int k, int renorm) {
    const int r = blockIdx.x * ROUTER_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n) return;
    const float *lr = logits + (size_t)r * E;
    float *pr = probs + (size_t)r * E;
    float mx = -INFINITY;
    for (int e = lane; e < E; e += 32) mx = fmaxf(mx, lr[e]);
    mx = kc_warp_max(mx);
    float sum = 0.0f;
    for (int e = lane; e < E; e += 32) sum += expf(lr[e] - mx);
    sum = kc_warp_sum(sum);
    for (int e = lane; e < E; e += 32) pr[e] = expf(lr[e] - mx) / sum; // reread by this lane only

    float wsel[ROUTER_MAX_K];
    float prev_p = INFINITY;
    int prev_i = -1;
    for (int s = 0; s < k; s++) {
        float bp = -INFINITY;
        int bi = -1;
        for (int e = lane; e < E; e += 32) {
            const float p = pr[e];
            const bool eligible = s == 0 || kern_router_before(prev_p, prev_i, p, e);
            if (eligible && (bi < 0 || kern_router_before(p, e, bp, bi))) {
                bp = p;
                bi = e;
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const float op = __shfl_xor_sync(KC_FULL_MASK, bp, o);
            const int oi = __shfl_xor_sync(KC_FULL_MASK, bi, o);
            if (oi >= 0 && (bi < 0 || kern_router_before(op, oi, bp, bi))) {
                bp = op;
                bi = oi;
            }
        }
        wsel[s] = bp;
        prev_p = bp;
        prev_i = bi;
        if (lane == 0) idx[(size_t)r * k + s] = bi;
    }
    if (lane == 0) {
        if (renorm) kern_router_renorm(wsel, k);
        for (int s = 0; s < k; s++) weights[(size_t)r * k + s] = wsel[s];
    }
}

static __global__ void router_bwd_kernel(float *dlogits, const float *dweights, const float *probs,
                                         const int32_t *idx, const float *aux_dp, const float *tok_w,
                                         int n, int E, int k, int renorm) {
    const int r = blockIdx.x * ROUTER_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n) return;
    const float *pr = probs + (size_t)r * E;
    const int32_t *ir = idx + (size_t)r * k;
    float dps[ROUTER_MAX_K], psel[ROUTER_MAX_K], dw[ROUTER_MAX_K];
    for (int s = 0; s < k; s++) {
        psel[s] = pr[ir[s]];
        dw[s] = dweights[(size_t)r * k + s];
    }
    kern_router_topk_bwd(dps, dw, psel, k, renorm);
    const float tw = tok_w ? tok_w[r] : 1.0f;
    double pdp = 0.0;
    for (int e = lane; e < E; e += 32) {
        float dp = 0.0f;
        for (int s = 0; s < k; s++)
            if (ir[s] == e) dp += dps[s];
        if (aux_dp) dp += aux_dp[e] * tw;
        pdp += (double)pr[e] * dp;
    }
    const float pdp_f = (float)kc_warp_sum_d(pdp);
    float *dl = dlogits + (size_t)r * E;
    for (int e = lane; e < E; e += 32) {
        float dp = 0.0f;
        for (int s = 0; s < k; s++)
            if (ir[s] == e) dp += dps[s];
        if (aux_dp) dp += aux_dp[e] * tw;
        dl[e] = pr[e] * (dp - pdp_f);
    }
}

extern "C" {

void kern_router_fwd_cuda(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                          const float *logits, int n, int E, int k, kern_router_mode_t mode) {
    MT_CHECK(k >= 1 && k <= E && k <= ROUTER_MAX_K, "router_fwd: top-%d of %d experts (k <= %d)", k,
             E, ROUTER_MAX_K);
    if (n <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    router_fwd_kernel<<<kc_div_up((size_t)n, ROUTER_ROWS_PER_BLOCK), 32 * ROUTER_ROWS_PER_BLOCK, 0,
                        cs>>>(weights, idx, probs, logits, n, E, k,
                              mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM);
    KC_LAUNCHED(s, "router_fwd");
}

void kern_router_bwd_cuda(kern_stream_t *s, float *dlogits, const float *dweights,
                          const float *probs, const int32_t *idx, const float *aux_dp,
                          const float *tok_w, int n, int E, int k, kern_router_mode_t mode) {
    MT_CHECK(k >= 1 && k <= E && k <= ROUTER_MAX_K, "router_bwd: top-%d of %d experts (k <= %d)", k,
             E, ROUTER_MAX_K);
    if (n <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    router_bwd_kernel<<<kc_div_up((size_t)n, ROUTER_ROWS_PER_BLOCK), 32 * ROUTER_ROWS_PER_BLOCK, 0,
                        cs>>>(dlogits, dweights, probs, idx, aux_dp, tok_w, n, E, k,
                              mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM);
    KC_LAUNCHED(s, "router_bwd");
}

} // extern "C"
