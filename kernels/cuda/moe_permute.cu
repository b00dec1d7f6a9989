// Token permutation for the experts (moe_ops.h): the plan, gather,
// weighted un-permute, the combine's backward and Qwen2-MoE's shared-expert
// gate.
//
// moe_plan is a stable sort of the n*k routing slots by expert (sort.cu):
// slots of one expert keep their flat order r*k+s, i.e. ascending token,
// which is the CPU twin's counting sort exactly; offsets are binary
// searches in the sorted experts, so counts are exact and zero-token
// experts get empty ranges.  No atomics.
//
// The other ops are one thread per output element or one warp per row;
// sums over the k slots run in slot order starting from y (the twin's
// loop), and this file is built with --fmad=false, so unpermute_sum and
// gate_scale_fwd's products round as on the CPU; dot products are double.
#include "kernels/cuda/sort.cuh"

extern "C" {
#include "kernels/math/act_math.h"
}

#define PERM_THREADS 256
#define PERM_ROWS_PER_BLOCK 8

static __global__ void plan_scatter_kernel(int32_t *perm_tok, int32_t *inv, const int32_t *spos,
                                           int m, int k) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < m; j += gridDim.x * blockDim.x) {
        const int src = spos[j]; // flat slot r*k + s
        perm_tok[j] = src / k;
        inv[src] = j;
    }
}

// First index of skeys[0..m) that is >= e.
__device__ __forceinline__ int plan_lower_bound(const int32_t *skeys, int m, int e) {
    int lo = 0, hi = m;
    while (lo < hi) {
        const int mid = lo + (hi - lo) / 2;
        if (skeys[mid] < e) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static __global__ void plan_offsets_kernel(int32_t *counts, int32_t *offsets, const int32_t *skeys,
                                           int m, int E) {
    for (int e = blockIdx.x * blockDim.x + threadIdx.x; e <= E; e += gridDim.x * blockDim.x) {
        const int lo = m ? plan_lower_bound(skeys, m, e) : 0;
        offsets[e] = lo;
        if (e < E) counts[e] = (m ? plan_lower_bound(skeys, m, e + 1) : 0) - lo;
    }
}

static __global__ void gather_kernel(float *dst, const float *src, const int32_t *perm_tok,
                                     size_t total, int H) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t j = i / (size_t)H, c = i % (size_t)H;
        dst[i] = src[(size_t)perm_tok[j] * H + c];
    }
}

// A source element as fp32: itself, or a bf16 one widened exactly.
__device__ __forceinline__ float perm_ld(const float *p, size_t i) { return p[i]; }
__device__ __forceinline__ float perm_ld(const uint16_t *p, size_t i) { return mt_bf16_to_f32(p[i]); }

template <typename T>
static __global__ void unpermute_sum_kernel(float *y, const T *src, const float *w,
                                            const int32_t *inv, size_t total, int k, int H,
                                            int accumulate) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / (size_t)H, c = i % (size_t)H;
        float acc = accumulate ? y[i] : 0.0f;
        for (int s = 0; s < k; s++) {
            const size_t slot = r * (size_t)k + s;
            const float ws = w ? w[slot] : 1.0f;
            acc += ws * perm_ld(src, (size_t)inv[slot] * H + c);
        }
        y[i] = acc;
    }
}

// Store a gradient element: itself, or rounded once to bf16 (dtype.h's rule).
__device__ __forceinline__ void perm_st(float *p, size_t i, float v) { p[i] = v; }
__device__ __forceinline__ void perm_st(uint16_t *p, size_t i, float v) { p[i] = mt_f32_to_bf16(v); }

// One warp per (token, slot).
template <typename T, typename D>
static __global__ void combine_bwd_kernel(D *dsrc, float *dw, const float *dy, const T *src,
                                          const float *w, const int32_t *inv, int slots, int k,
                                          int H) {
    const int slot = blockIdx.x * PERM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (slot >= slots) return;
    const size_t r = (size_t)(slot / k);
    const size_t row = (size_t)inv[slot];
    const float ws = w[slot];
    const float *dyr = dy + r * H;
    const T *sr = src + row * H;
    D *dsr = dsrc + row * H;
    double dot = 0.0;
    for (int c = lane; c < H; c += 32) {
        dot += (double)perm_ld(sr, (size_t)c) * dyr[c];
        perm_st(dsr, (size_t)c, ws * dyr[c]);
    }
    dot = kc_warp_sum_d(dot);
    if (lane == 0) dw[slot] = (float)dot;
}

static __global__ void gate_scale_fwd_kernel(float *y, const float *x, const float *glogit,
                                             size_t total, int H) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        const float g = kern_sigmoid(glogit[i / (size_t)H]);
        y[i] += g * x[i];
    }
}

// One warp per token row.
static __global__ void gate_scale_bwd_kernel(float *dx, float *dglogit, const float *dy,
                                             const float *x, const float *glogit, int n, int H) {
    const int r = blockIdx.x * PERM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (r >= n) return;
    const float g = kern_sigmoid(glogit[r]);
    const size_t off = (size_t)r * H;
    double dot = 0.0;
    for (int c = lane; c < H; c += 32) {
        const float d = dy[off + c];
        dot += (double)d * x[off + c];
        dx[off + c] = g * d;
    }
    dot = kc_warp_sum_d(dot);
    if (lane == 0) dglogit[r] = (float)dot * g * (1.0f - g);
}

static int plan_key_bits(int E) {
    int b = 1;
    while (b < 31 && (1 << b) < E) b++;
    return b;
}

template <typename T>
static void unpermute_sum_launch(kern_stream_t *s, float *y, const T *src, const float *w, const int32_t *inv,
                                 int n, int k, int H, int accumulate) {
    if (n <= 0 || H <= 0) return;
    const size_t total = (size_t)n * H;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    unpermute_sum_kernel<T><<<kc_blocks(total, PERM_THREADS), PERM_THREADS, 0, cs>>>(
        y, src, w, inv, total, k, H, accumulate);
    KC_LAUNCHED(s, "moe_unpermute_sum");
}

template <typename T, typename D>
static void combine_bwd_launch(kern_stream_t *s, D *dsrc, float *dw, const float *dy, const T *src,
                               const float *w, const int32_t *inv, int n, int k, int H) {
    const int slots = n * k;
    if (slots <= 0) return;
    MT_CHECK(H > 0, "moe_combine_bwd: H=%d", H);
    cudaStream_t cs = kern_cuda_stream_begin(s);
    combine_bwd_kernel<T, D><<<kc_div_up((size_t)slots, PERM_ROWS_PER_BLOCK), 32 * PERM_ROWS_PER_BLOCK, 0,
                            cs>>>(dsrc, dw, dy, src, w, inv, slots, k, H);
    KC_LAUNCHED(s, "moe_combine_bwd");
}

extern "C" {

void kern_moe_plan_cuda(kern_stream_t *s, int32_t *counts, int32_t *offsets, int32_t *perm_tok,
                        int32_t *inv, const int32_t *idx, int n, int k, int E) {
    MT_CHECK(n >= 0 && k >= 1 && E >= 1, "moe_plan: n=%d k=%d E=%d", n, k, E);
    const int m = n * k;
    int32_t *skeys = nullptr, *spos = nullptr;
    if (m > 0) kc_sort_positions(s, idx, m, plan_key_bits(E), &skeys, &spos, "moe_plan");
    cudaStream_t cs = kern_cuda_stream_begin(s);
    if (m > 0) {
        plan_scatter_kernel<<<kc_blocks((size_t)m, PERM_THREADS), PERM_THREADS, 0, cs>>>(
            perm_tok, inv, spos, m, k);
        KC_LAUNCHED(s, "moe_plan");
    }
    plan_offsets_kernel<<<kc_blocks((size_t)E + 1, PERM_THREADS), PERM_THREADS, 0, cs>>>(
        counts, offsets, skeys, m, E);
    KC_LAUNCHED(s, "moe_plan");
}

void kern_moe_gather_cuda(kern_stream_t *s, float *dst, const float *src, const int32_t *perm_tok,
                          int m, int H) {
    if (m <= 0 || H <= 0) return;
    const size_t total = (size_t)m * H;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    gather_kernel<<<kc_blocks(total, PERM_THREADS), PERM_THREADS, 0, cs>>>(dst, src, perm_tok, total, H);
    KC_LAUNCHED(s, "moe_gather");
}

void kern_moe_unpermute_sum_cuda(kern_stream_t *s, float *y, const float *src, const float *w,
                                 const int32_t *inv, int n, int k, int H, int accumulate) {
    unpermute_sum_launch(s, y, src, w, inv, n, k, H, accumulate);
}

void kern_moe_unpermute_sum_bf16_cuda(kern_stream_t *s, float *y, const uint16_t *src, const float *w,
                                      const int32_t *inv, int n, int k, int H, int accumulate) {
    unpermute_sum_launch(s, y, src, w, inv, n, k, H, accumulate);
}

void kern_moe_combine_bwd_cuda(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                               const float *src, const float *w, const int32_t *inv, int n, int k,
                               int H) {
    combine_bwd_launch(s, dsrc, dw, dy, src, w, inv, n, k, H);
}

void kern_moe_combine_bwd_bf16_cuda(kern_stream_t *s, uint16_t *dsrc, float *dw, const float *dy, const uint16_t *src,
                                    const float *w, const int32_t *inv, int n, int k, int H) {
    combine_bwd_launch(s, dsrc, dw, dy, src, w, inv, n, k, H);
}

void kern_gate_scale_fwd_cuda(kern_stream_t *s, float *y, const float *x, const float *glogit, int n,
                              int H) {
    if (n <= 0 || H <= 0) return;
    const size_t total = (size_t)n * H;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    gate_scale_fwd_kernel<<<kc_blocks(total, PERM_THREADS), PERM_THREADS, 0, cs>>>(y, x, glogit,
                                                                                  total, H);
    KC_LAUNCHED(s, "gate_scale_fwd");
}

void kern_gate_scale_bwd_cuda(kern_stream_t *s, float *dx, float *dglogit, const float *dy,
                              const float *x, const float *glogit, int n, int H) {
    if (n <= 0 || H <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    gate_scale_bwd_kernel<<<kc_div_up((size_t)n, PERM_ROWS_PER_BLOCK), 32 * PERM_ROWS_PER_BLOCK, 0,
                            cs>>>(dx, dglogit, dy, x, glogit, n, H);
    KC_LAUNCHED(s, "gate_scale_bwd");
}

} // extern "C"
