// The grouped router (kernels/router_group.h): DeepSeek-V3 and GLM-4.5's
// sigmoid, DeepSeek-V2's softmax.
//
// One thread per token row, running router_group_math.h's row function, the
// CPU twin's: the choice of experts is discrete, and sharing the code makes
// it the same choice on both backends (the only arithmetic that may differ
// is expf inside the sigmoid, by an ulp on a real GPU).  A router row is
// E scores and a few scans of them; next to the experts' products it costs
// nothing, so the per-row parallelism is enough.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/math/router_group_math.h"
}

#define ROUTER_GROUP_THREADS 128

static __global__ void router_group_fwd_kernel(float *weights, int32_t *idx, float *scores, const float *logits,
                                               const float *bias, int n, int E, int k, kern_router_group_t g) {
    const int r = blockIdx.x * ROUTER_GROUP_THREADS + threadIdx.x;
    if (r >= n) return;
    const float *lr = logits + (size_t)r * E;
    float *sr = scores + (size_t)r * E;
    kern_router_group_scores(sr, lr, E, &g);
    kern_router_group_row(weights + (size_t)r * k, idx + (size_t)r * k, sr, bias, E, k, &g);
}

static __global__ void router_group_bwd_kernel(float *dlogits, const float *dweights, const float *scores,
                                               const int32_t *idx, int n, int E, int k, kern_router_group_t g) {
    const int r = blockIdx.x * ROUTER_GROUP_THREADS + threadIdx.x;
    if (r >= n) return;
    kern_router_group_row_bwd(dlogits + (size_t)r * E, dweights + (size_t)r * k, scores + (size_t)r * E,
                              idx + (size_t)r * k, E, k, &g);
}

extern "C" {

void kern_router_group_fwd_cuda(kern_stream_t *s, float *weights, int32_t *idx, float *scores, const float *logits,
                                const float *bias, int n, int E, int k, const kern_router_group_t *g) {
    MT_CHECK(kern_router_group_valid(E, k, g),
             "router_group_fwd: top-%d of %d experts in %d groups (keep %d) is outside the router's limits", k, E,
             g->n_group, g->topk_group);
    if (n <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    router_group_fwd_kernel<<<kc_div_up((size_t)n, ROUTER_GROUP_THREADS), ROUTER_GROUP_THREADS, 0, cs>>>(
        weights, idx, scores, logits, bias, n, E, k, *g);
    KC_LAUNCHED(s, "router_group_fwd");
}

void kern_router_group_bwd_cuda(kern_stream_t *s, float *dlogits, const float *dweights, const float *scores,
                                const int32_t *idx, int n, int E, int k, const kern_router_group_t *g) {
    MT_CHECK(kern_router_group_valid(E, k, g),
             "router_group_bwd: top-%d of %d experts in %d groups (keep %d) is outside the router's limits", k, E,
             g->n_group, g->topk_group);
    if (n <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    router_group_bwd_kernel<<<kc_div_up((size_t)n, ROUTER_GROUP_THREADS), ROUTER_GROUP_THREADS, 0, cs>>>(
        dlogits, dweights, scores, idx, n, E, k, *g);
    KC_LAUNCHED(s, "router_group_bwd");
}

} // extern "C"
