// What every .cu file of the CUDA backend shares: the C headers of the op
// families (included with C linkage so the kern_*_cuda definitions here are
// the symbols the C kernel table refers to), reductions with a fixed order,
// launch sizing and the deterministic column sum.
//
// Determinism: every reduction here has a shape fixed by the problem size
// alone (never by the GPU's SM count or by timing) and combines partial
// results in a fixed order: warp sums are xor-butterflies (every lane ends
// with the same bits), block sums add the warps' results in warp order,
// and multi-block sums write per-block partials that one later kernel adds
// in block order.  No floating-point atomics anywhere in the backend.
#ifndef MT_KERNELS_CUDA_KERN_CUDA_CUH
#define MT_KERNELS_CUDA_KERN_CUDA_CUH

#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cuda_runtime.h>

extern "C" {
#include "base/dtype.h"
#include "kernels/ops.h"
}
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"

// Reports launch errors (and, with MOETUNE_CUDA_SYNC=1, faults) at the launch.
#define KC_LAUNCHED(s, what) kern_cuda_after_launch((s), __FILE__, __LINE__, (what))

#define KC_FULL_MASK 0xffffffffu

__device__ __forceinline__ float kc_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KC_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double kc_warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KC_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float kc_warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(KC_FULL_MASK, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024);
// every thread gets the same value. `sh` holds 32 elements of shared memory.
template <typename T>
__device__ __forceinline__ T kc_block_sum(T v, T *sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(KC_FULL_MASK, v, o);
    __syncthreads(); // sh may still be read by a previous call
    if (lane == 0) sh[warp] = v;
    __syncthreads();
    T r = lane < nw ? sh[lane] : T(0);
    for (int o = 16; o > 0; o >>= 1) r += __shfl_xor_sync(KC_FULL_MASK, r, o);
    return r;
}

// Blocks for a grid-stride loop over n items; the count depends on n only.
static inline unsigned kc_blocks(size_t n, unsigned threads, unsigned cap = 65536u) {
    size_t b = (n + threads - 1) / threads;
    if (b < 1) b = 1;
    return b > cap ? cap : (unsigned)b;
}

static inline unsigned kc_div_up(size_t a, size_t b) { return (unsigned)((a + b - 1) / b); }

// A launch over several tensors (the *_many kernels), tensor t owning
// blocks [first[t], first[t + 1]): which tensor this block works on, its
// block index within it and how many blocks it has.
__device__ __forceinline__ int kc_many_tensor(const unsigned *first, unsigned *b, unsigned *nb) {
    int t = 0;
    while (blockIdx.x >= first[t + 1]) t++;
    *b = blockIdx.x - first[t];
    *nb = first[t + 1] - first[t];
    return t;
}

// ---- deterministic column sum: dst[c] += sum_r f(r, c) ----------------------
//
// Pass 1: block (x: 32 columns, y: 8 row lanes) sums one chunk of rows per
// column, row lanes added in order, into partial[chunk][c].  Pass 2 adds the
// chunks in order and accumulates into dst.  Used by bias_bwd and
// rmsnorm_bwd's dw.

#define KC_COLSUM_MAX_CHUNKS 64
#define KC_COLSUM_ROWS_PER_CHUNK_MIN 64

template <class F>
__global__ void kc_colsum_partial_kernel(F f, float *partial, int rows, int cols, int rows_per_chunk) {
    __shared__ float sh[8][33];
    const int c = blockIdx.x * 32 + threadIdx.x;
    const int r0 = blockIdx.y * rows_per_chunk;
    const int r1 = min(rows, r0 + rows_per_chunk);
    float acc = 0.0f;
    if (c < cols)
        for (int r = r0 + (int)threadIdx.y; r < r1; r += 8) acc += f(r, c);
    sh[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int y = 0; y < 8; y++) t += sh[y][threadIdx.x];
        partial[(size_t)blockIdx.y * cols + c] = t;
    }
}

template <int Unused = 0>
__global__ void kc_colsum_final_kernel(float *dst, const float *partial, int nchunks, int cols) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float t = 0.0f;
    for (int k = 0; k < nchunks; k++) t += partial[(size_t)k * cols + c];
    dst[c] += t;
}

template <class F>
static void kc_colsum(kern_stream_t *s, F f, float *dst, int rows, int cols, const char *what) {
    if (rows <= 0 || cols <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    int nchunks = (int)kc_div_up((size_t)rows, KC_COLSUM_ROWS_PER_CHUNK_MIN);
    if (nchunks > KC_COLSUM_MAX_CHUNKS) nchunks = KC_COLSUM_MAX_CHUNKS;
    const int per = (int)kc_div_up((size_t)rows, (size_t)nchunks);
    nchunks = (int)kc_div_up((size_t)rows, (size_t)per);
    float *partial = (float *)kern_cuda_scratch(s, (size_t)nchunks * cols * sizeof(float), what);
    kc_colsum_partial_kernel<F><<<dim3(kc_div_up((size_t)cols, 32), nchunks), dim3(32, 8), 0, cs>>>(
        f, partial, rows, cols, per);
    KC_LAUNCHED(s, what);
    kc_colsum_final_kernel<0><<<kc_div_up((size_t)cols, 256), 256, 0, cs>>>(dst, partial, nchunks, cols);
    KC_LAUNCHED(s, what);
}

#endif
