// Pieces shared by the attention forward (attention.cu) and backward
// (attention_bwd.cu) kernels: shapes, the causal / sliding-window /
// key-padding mask, tile sizes and the dispatch on the per-lane width of a
// head.
//
// Key padding: kv_len (B) int32 on the device, or NULL; a block reads its
// row's entry once (attn_kv_len, clamped to [0, T]) and passes it to
// attn_allowed as kvl, and the key ranges blocks stream stop at kvl.  A
// query with no allowed key keeps l = 0 in the forward and writes out = 0,
// lse = -inf; the backward never evaluates exp for a pair that is not
// allowed, so that row has P = 0 (attention.h).
//
// Packed examples: seg_start (B, T) or NULL; each query reads its own
// entry (attn_seg) and attn_allowed masks the keys before it, so the key
// ranges streamed stay those of the causal mask (correct, not trimmed).
//
// Layouts (attention.h): q, out, dout (B, T, nh, hd); k, v, dk, dv
// (B, T, nkv, hd); lse and D (B, nh, T).  Query head h reads kv head
// h / (nh / nkv).
//
// Work split, the same in every kernel: a warp owns whole rows (queries,
// or keys in dK/dV) and a lane owns head dimensions d = lane + 32c, c < NPL
// ("numbers per lane", NPL = ceil(hd / 32) rounded up to 1, 2, 4 or 8, so
// hd <= 256).  The other side of each product is streamed through shared
// memory 32 rows at a time, one row per lane, so scores are computed
// lane-per-key without shuffles and the weighted sums broadcast one
// probability per step with __shfl_sync.  Rows of 32 are padded to hd + 1
// floats so lanes reading different rows hit different banks.
#ifndef MT_KERNELS_CUDA_ATTENTION_CUH
#define MT_KERNELS_CUDA_ATTENTION_CUH

#include "kernels/cuda/kern_cuda.cuh"

#define ATTN_WARPS 8
#define ATTN_THREADS (32 * ATTN_WARPS)
#define ATTN_ROWS_PER_WARP 2
#define ATTN_ROWS (ATTN_WARPS * ATTN_ROWS_PER_WARP) // owned rows per block
#define ATTN_TILE 32                                 // streamed rows per step
#define ATTN_MAX_HD 256

typedef struct {
    int B, T, nh, nkv, hd, window;
    float scale; // 1 / sqrt(hd), as the CPU twin computes it
} attn_shape_t;

// kvl <= T, so j < kvl also keeps j inside the sequence; seg is query i's
// first key (attn_seg).
__device__ __forceinline__ bool attn_allowed(int i, int j, int T, int kvl, int window, int seg) {
    return j < kvl && i < T && j <= i && j >= seg && (window <= 0 || i - j < window);
}

// The first key of query (b, i)'s packed example (attention.h): seg_start
// clamped to [0, i]; 0 without segments or past the sequence.
__device__ __forceinline__ int attn_seg(const int32_t *seg_start, int b, int i, int T) {
    return seg_start && i < T ? min(max(seg_start[(size_t)b * T + i], 0), i) : 0;
}

// Row b's valid keys (attention.h): kv_len[b] clamped to [0, T]; T without kv_len.
__device__ __forceinline__ int attn_kv_len(const int32_t *kv_len, int b, int T) {
    return kv_len ? min(max(kv_len[b], 0), T) : T;
}

__device__ __forceinline__ size_t attn_q_off(const attn_shape_t &a, int b, int t, int h) {
    return (((size_t)b * a.T + t) * a.nh + h) * a.hd;
}

__device__ __forceinline__ size_t attn_kv_off(const attn_shape_t &a, int b, int t, int g) {
    return (((size_t)b * a.T + t) * a.nkv + g) * a.hd;
}

__device__ __forceinline__ size_t attn_row_off(const attn_shape_t &a, int b, int h, int t) {
    return ((size_t)b * a.nh + h) * a.T + t;
}

// Dot product of two rows of hd floats in shared memory.
__device__ __forceinline__ float attn_dot(const float *x, const float *y, int hd) {
    float acc = 0.0f;
#pragma unroll 4
    for (int d = 0; d < hd; d++) acc += x[d] * y[d];
    return acc;
}

static inline int attn_npl(int hd) {
    const int need = (hd + 31) / 32;
    return need <= 1 ? 1 : need <= 2 ? 2 : need <= 4 ? 4 : 8;
}

static inline attn_shape_t attn_shape(int B, int T, int nh, int nkv, int hd, int window,
                                      const char *what) {
    MT_CHECK(B >= 0 && T >= 0 && nh >= 1 && nkv >= 1 && nh % nkv == 0,
             "%s: B=%d T=%d nh=%d nkv=%d (nh must be a multiple of nkv)", what, B, T, nh, nkv);
    MT_CHECK(hd >= 1 && hd <= ATTN_MAX_HD, "%s: head_dim %d is not in [1, %d]", what, hd,
             ATTN_MAX_HD);
    attn_shape_t a = {B, T, nh, nkv, hd, window, 1.0f / sqrtf((float)hd)};
    return a;
}

#endif
