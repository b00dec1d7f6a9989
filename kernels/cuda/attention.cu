// Causal GQA attention forward with the key-padding mask (attention.h),
// flash-style: scores are never stored; each query row keeps a running max
// m, a running sum l and an unnormalised output o, rescaled as key tiles
// stream past (online softmax), and the row's logsumexp m + log(l) is saved
// for the backward.
//
// Block: ATTN_ROWS (16) consecutive queries of one (batch, head), two per
// warp; the block streams the keys its rows may see ([first key of the
// sliding window, min(last query, kv_len - 1)]) through shared memory 32 at
// a time.  Per tile a lane scores one key (a dot product over hd in shared
// memory), the warp takes the tile's max and sum with butterflies, and the
// output is accumulated lane-per-dimension.  Everything runs in a fixed order, so
// results are deterministic; fp32 throughout (TF32 is never used).
#include "kernels/cuda/attention.cuh"

template <int NPL>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_fwd_kernel(float *out, float *lse, const float *q, const float *k, const float *v,
                    const int32_t *kv_len, const int32_t *seg_start, attn_shape_t a) {
    extern __shared__ float smem[];
    const int hd = a.hd, hdp = a.hd + 1;
    float *sQ = smem;                       // [ATTN_ROWS][hd]
    float *sK = sQ + ATTN_ROWS * hd;        // [ATTN_TILE][hd + 1]
    float *sV = sK + ATTN_TILE * hdp;       // [ATTN_TILE][hd]
    const int b = blockIdx.z, h = blockIdx.y, g = h / (a.nh / a.nkv);
    const int t0 = blockIdx.x * ATTN_ROWS, kvl = attn_kv_len(kv_len, b, a.T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int x = threadIdx.x; x < ATTN_ROWS * hd; x += ATTN_THREADS) {
        const int r = x / hd, d = x % hd, t = t0 + r;
        sQ[x] = t < a.T ? q[attn_q_off(a, b, t, h) + d] : 0.0f;
    }

    float m[ATTN_ROWS_PER_WARP], l[ATTN_ROWS_PER_WARP], o[ATTN_ROWS_PER_WARP][NPL];
#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
        m[rr] = -INFINITY;
        l[rr] = 0.0f;
#pragma unroll
        for (int c = 0; c < NPL; c++) o[rr][c] = 0.0f;
    }

    const int kbeg = a.window > 0 ? max(0, t0 - a.window + 1) : 0;
    const int kend = min(kvl, t0 + ATTN_ROWS); // exclusive
    for (int j0 = kbeg; j0 < kend; j0 += ATTN_TILE) {
        __syncthreads(); // previous tile fully consumed (and sQ written, first time)
        for (int x = threadIdx.x; x < ATTN_TILE * hd; x += ATTN_THREADS) {
            const int jj = x / hd, d = x % hd, j = j0 + jj;
            const bool in = j < a.T;
            sK[jj * hdp + d] = in ? k[attn_kv_off(a, b, j, g) + d] : 0.0f;
            sV[jj * hd + d] = in ? v[attn_kv_off(a, b, j, g) + d] : 0.0f;
        }
        __syncthreads();
        const int j = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
            const int r = warp * ATTN_ROWS_PER_WARP + rr, i = t0 + r;
            const bool ok = attn_allowed(i, j, a.T, kvl, a.window, attn_seg(seg_start, b, i, a.T));
            const float sc = ok ? attn_dot(sQ + r * hd, sK + lane * hdp, hd) * a.scale : -INFINITY;
            const float mnew = fmaxf(m[rr], kc_warp_max(sc));
            if (mnew == -INFINITY) continue; // nothing visible yet (warp-uniform)
            const float p = ok ? expf(sc - mnew) : 0.0f;
            const float corr = expf(m[rr] - mnew); // 0 when m was -inf
            l[rr] = l[rr] * corr + kc_warp_sum(p);
            m[rr] = mnew;
#pragma unroll
            for (int c = 0; c < NPL; c++) o[rr][c] *= corr;
            for (int jj = 0; jj < ATTN_TILE; jj++) {
                const float pj = __shfl_sync(KC_FULL_MASK, p, jj);
#pragma unroll
                for (int c = 0; c < NPL; c++) {
                    const int d = lane + 32 * c;
                    if (d < hd) o[rr][c] += pj * sV[jj * hd + d];
                }
            }
        }
    }

#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
        const int i = t0 + warp * ATTN_ROWS_PER_WARP + rr;
        if (i >= a.T) continue;
        // l >= 1 once a key was seen (its max gives exp(0)); l == 0: no key, out 0, lse -inf
        const float inv = l[rr] > 0.0f ? 1.0f / l[rr] : 0.0f;
        float *orow = out + attn_q_off(a, b, i, h);
#pragma unroll
        for (int c = 0; c < NPL; c++) {
            const int d = lane + 32 * c;
            if (d < hd) orow[d] = o[rr][c] * inv;
        }
        if (lane == 0)
            lse[attn_row_off(a, b, h, i)] = l[rr] > 0.0f ? m[rr] + logf(l[rr]) : -INFINITY;
    }
}

template <int NPL>
static void attn_fwd_launch(kern_stream_t *s, float *out, float *lse, const float *q, const float *k,
                            const float *v, const int32_t *kv_len, const int32_t *seg_start, const attn_shape_t &a) {
    const size_t smem = (size_t)(ATTN_ROWS * a.hd + ATTN_TILE * (a.hd + 1) + ATTN_TILE * a.hd) *
                        sizeof(float);
    kern_cuda_smem_optin(s, (const void *)attn_fwd_kernel<NPL>, smem, "attention_fwd");
    const dim3 grid(kc_div_up((size_t)a.T, ATTN_ROWS), a.nh, a.B);
    attn_fwd_kernel<NPL><<<grid, ATTN_THREADS, smem, kern_cuda_stream_begin(s)>>>(out, lse, q, k, v,
                                                                                 kv_len, seg_start, a);
    KC_LAUNCHED(s, "attention_fwd");
}

extern "C" void kern_attention_fwd_cuda(kern_stream_t *s, float *out, float *lse, const float *q,
                                        const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start,
                                        int B, int T, int nh, int nkv, int hd, int window) {
    const attn_shape_t a = attn_shape(B, T, nh, nkv, hd, window, "attention_fwd");
    if (B == 0 || T == 0) return;
    kern_cuda_stream_begin(s);
    switch (attn_npl(hd)) {
    case 1: attn_fwd_launch<1>(s, out, lse, q, k, v, kv_len, seg_start, a); break;
    case 2: attn_fwd_launch<2>(s, out, lse, q, k, v, kv_len, seg_start, a); break;
    case 4: attn_fwd_launch<4>(s, out, lse, q, k, v, kv_len, seg_start, a); break;
    default: attn_fwd_launch<8>(s, out, lse, q, k, v, kv_len, seg_start, a); break;
    }
}

// ---- Helpers of the cuDNN tensor-core path (kernels/cudnn/attention_cudnn.c) ----
//
// cuDNN's padding mask takes per-row sequence lengths; a row whose queries
// see no key (kv_len 0, or a sliding window wholly in the padding) is left
// to the library there, so these kernels make such rows follow attention.h:
// out 0 and lse -inf after the forward, and an lse the backward can
// subtract (0: the masked scores are -inf, so P = exp(-inf - 0) = 0).

static __global__ void attn_tc_seqlens_kernel(int32_t *seq_q, int32_t *seq_kv, const int32_t *kv_len, int B,
                                              int T) {
    for (int b = blockIdx.x * blockDim.x + threadIdx.x; b < B; b += gridDim.x * blockDim.x) {
        seq_q[b] = T;
        seq_kv[b] = attn_kv_len(kv_len, b, T);
    }
}

extern "C" void kern_attention_tc_seqlens_cuda(kern_stream_t *s, int32_t *seq_q, int32_t *seq_kv,
                                               const int32_t *kv_len, int B, int T) {
    if (B == 0) return;
    attn_tc_seqlens_kernel<<<kc_blocks((size_t)B, 256), 256, 0, kern_cuda_stream_begin(s)>>>(seq_q, seq_kv, kv_len,
                                                                                             B, T);
    KC_LAUNCHED(s, "attention_tc_seqlens");
}

// True when query t of a row with kvl valid keys sees no key (attention.h).
static __device__ __forceinline__ bool attn_tc_row_empty(int t, int kvl, int window) {
    const int hi = min(t, kvl - 1), lo = window > 0 ? max(t - window + 1, 0) : 0;
    return hi < lo;
}

// One thread per (b, t, h): zero out[b, t, h, :] (hd elements of elem_bytes,
// fp32 or bf16: zero bits are 0.0 in both) and set lse[b, h, t] = -inf for
// empty rows; other rows are left as the library wrote them.
static __global__ void attn_tc_empty_rows_kernel(unsigned char *out, int elem_bytes, float *lse,
                                                 const int32_t *kv_len, int B, int T, int nh, int hd, int window) {
    const size_t n = (size_t)B * T * nh;
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < n; r += (size_t)gridDim.x * blockDim.x) {
        const int h = (int)(r % (size_t)nh);
        const size_t bt = r / (size_t)nh;
        const int t = (int)(bt % (size_t)T), b = (int)(bt / (size_t)T);
        if (!attn_tc_row_empty(t, attn_kv_len(kv_len, b, T), window)) continue;
        const size_t row = (size_t)hd * (size_t)elem_bytes;
        for (size_t i = 0; i < row; i++) out[r * row + i] = 0;
        lse[((size_t)b * nh + h) * T + t] = -INFINITY;
    }
}

extern "C" void kern_attention_tc_empty_rows_cuda(kern_stream_t *s, void *out, bool out_bf16, float *lse,
                                                  const int32_t *kv_len, int B, int T, int nh, int hd, int window) {
    const size_t n = (size_t)B * T * nh;
    if (n == 0) return;
    attn_tc_empty_rows_kernel<<<kc_blocks(n, 256), 256, 0, kern_cuda_stream_begin(s)>>>(
        (unsigned char *)out, out_bf16 ? 2 : 4, lse, kv_len, B, T, nh, hd, window);
    KC_LAUNCHED(s, "attention_tc_empty_rows");
}

static __global__ void attn_tc_bwd_stats_kernel(float *stats, const float *lse, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        const float l = lse[i];
        stats[i] = l == -INFINITY ? 0.0f : l;
    }
}

extern "C" void kern_attention_tc_bwd_stats_cuda(kern_stream_t *s, float *stats, const float *lse, size_t n) {
    if (n == 0) return;
    attn_tc_bwd_stats_kernel<<<kc_blocks(n, 256), 256, 0, kern_cuda_stream_begin(s)>>>(stats, lse, n);
    KC_LAUNCHED(s, "attention_tc_bwd_stats");
}
