// Causal GQA attention backward with the key-padding mask (attention.h),
// flash-style and without atomics: probabilities are recomputed from the
// saved logsumexp,
//   P = exp(S - lse), D_i = dout_i . out_i, dS = P * (dout V^T - D),
// and each gradient is written by the one block that owns it:
//   1. attn_bwd_D:    D (B, nh, T) into stream scratch, one warp per row,
//                     summed in double as the CPU twin does;
//   2. attn_bwd_dq:   a block owns 16 queries of one head and streams the
//                     keys they see (as the forward does): dq = scale dS K;
//   3. attn_bwd_dkdv: a block owns 16 keys of one kv head and streams, for
//                     each query head of its group in turn, the queries
//                     that see them: dv = P^T dout, dk = scale dS^T Q.
// Keys at or past kv_len[b] are never streamed in step 2, and a step-3
// block whose keys all lie there writes zeros without streaming queries.
// The score of a (query, key) pair is computed twice (steps 2 and 3), the
// price of owning each output; in exchange every sum runs in a fixed order
// (deterministic) and dk/dv need no zeroing or atomics.
#include "kernels/cuda/attention.cuh"

// D_i = sum_d dout[i, d] * out[i, d]: one warp per (b, t, h) row.
static __global__ void attn_bwd_D_kernel(float *D, const float *dout, const float *out, attn_shape_t a) {
    const size_t rows = (size_t)a.B * a.T * a.nh;
    const size_t w = (size_t)blockIdx.x * ATTN_WARPS + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (w >= rows) return;
    const int h = (int)(w % a.nh), t = (int)((w / a.nh) % a.T), b = (int)(w / ((size_t)a.nh * a.T));
    const float *o = out + w * a.hd, *d = dout + w * a.hd; // (b, t, h) rows are contiguous
    double acc = 0.0;
    for (int c = lane; c < a.hd; c += 32) acc += (double)o[c] * d[c];
    acc = kc_warp_sum_d(acc);
    if (lane == 0) D[attn_row_off(a, b, h, t)] = (float)acc;
}

template <int NPL>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_bwd_dq_kernel(float *dq, const float *dout, const float *q, const float *k, const float *v,
                       const float *lse, const float *D, const int32_t *kv_len, const int32_t *seg_start, attn_shape_t a) {
    extern __shared__ float smem[];
    const int hd = a.hd, hdp = a.hd + 1;
    float *sQ = smem;                    // [ATTN_ROWS][hd]
    float *sO = sQ + ATTN_ROWS * hd;     // [ATTN_ROWS][hd]  dout rows
    float *sK = sO + ATTN_ROWS * hd;     // [ATTN_TILE][hd + 1]
    float *sV = sK + ATTN_TILE * hdp;    // [ATTN_TILE][hd + 1]
    const int b = blockIdx.z, h = blockIdx.y, g = h / (a.nh / a.nkv);
    const int t0 = blockIdx.x * ATTN_ROWS, kvl = attn_kv_len(kv_len, b, a.T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int x = threadIdx.x; x < ATTN_ROWS * hd; x += ATTN_THREADS) {
        const int r = x / hd, d = x % hd, t = t0 + r;
        const bool in = t < a.T;
        sQ[x] = in ? q[attn_q_off(a, b, t, h) + d] : 0.0f;
        sO[x] = in ? dout[attn_q_off(a, b, t, h) + d] : 0.0f;
    }
    float row_lse[ATTN_ROWS_PER_WARP], row_D[ATTN_ROWS_PER_WARP], acc[ATTN_ROWS_PER_WARP][NPL];
#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
        const int i = t0 + warp * ATTN_ROWS_PER_WARP + rr;
        row_lse[rr] = i < a.T ? lse[attn_row_off(a, b, h, i)] : 0.0f;
        row_D[rr] = i < a.T ? D[attn_row_off(a, b, h, i)] : 0.0f;
#pragma unroll
        for (int c = 0; c < NPL; c++) acc[rr][c] = 0.0f;
    }

    const int kbeg = a.window > 0 ? max(0, t0 - a.window + 1) : 0;
    const int kend = min(kvl, t0 + ATTN_ROWS);
    for (int j0 = kbeg; j0 < kend; j0 += ATTN_TILE) {
        __syncthreads();
        for (int x = threadIdx.x; x < ATTN_TILE * hd; x += ATTN_THREADS) {
            const int jj = x / hd, d = x % hd, j = j0 + jj;
            const bool in = j < a.T;
            sK[jj * hdp + d] = in ? k[attn_kv_off(a, b, j, g) + d] : 0.0f;
            sV[jj * hdp + d] = in ? v[attn_kv_off(a, b, j, g) + d] : 0.0f;
        }
        __syncthreads();
        const int j = j0 + lane;
#pragma unroll
        for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
            const int r = warp * ATTN_ROWS_PER_WARP + rr, i = t0 + r;
            float ds = 0.0f;
            if (attn_allowed(i, j, a.T, kvl, a.window, attn_seg(seg_start, b, i, a.T))) {
                const float sc = attn_dot(sQ + r * hd, sK + lane * hdp, hd) * a.scale;
                const float p = expf(sc - row_lse[rr]);
                const float dp = attn_dot(sO + r * hd, sV + lane * hdp, hd);
                ds = p * (dp - row_D[rr]);
            }
            for (int jj = 0; jj < ATTN_TILE; jj++) {
                const float dsj = __shfl_sync(KC_FULL_MASK, ds, jj);
#pragma unroll
                for (int c = 0; c < NPL; c++) {
                    const int d = lane + 32 * c;
                    if (d < hd) acc[rr][c] += dsj * sK[jj * hdp + d];
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
        const int i = t0 + warp * ATTN_ROWS_PER_WARP + rr;
        if (i >= a.T) continue;
        float *row = dq + attn_q_off(a, b, i, h);
#pragma unroll
        for (int c = 0; c < NPL; c++) {
            const int d = lane + 32 * c;
            if (d < hd) row[d] = a.scale * acc[rr][c];
        }
    }
}

template <int NPL>
static __global__ void __launch_bounds__(ATTN_THREADS)
    attn_bwd_dkdv_kernel(float *dk, float *dv, const float *dout, const float *q, const float *k,
                         const float *v, const float *lse, const float *D, const int32_t *kv_len, const int32_t *seg_start,
                         attn_shape_t a) {
    extern __shared__ float smem[];
    const int hd = a.hd, hdp = a.hd + 1;
    float *sK = smem;                    // [ATTN_ROWS][hd]   this block's keys
    float *sV = sK + ATTN_ROWS * hd;     // [ATTN_ROWS][hd]
    float *sQ = sV + ATTN_ROWS * hd;     // [ATTN_TILE][hd + 1]  streamed queries
    float *sO = sQ + ATTN_TILE * hdp;    // [ATTN_TILE][hd + 1]  their dout rows
    float *sL = sO + ATTN_TILE * hdp;    // [ATTN_TILE] lse
    float *sD = sL + ATTN_TILE;          // [ATTN_TILE] D
    const int b = blockIdx.z, g = blockIdx.y, group = a.nh / a.nkv;
    const int j0 = blockIdx.x * ATTN_ROWS, kvl = attn_kv_len(kv_len, b, a.T);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;

    for (int x = threadIdx.x; x < ATTN_ROWS * hd; x += ATTN_THREADS) {
        const int r = x / hd, d = x % hd, j = j0 + r;
        const bool in = j < a.T;
        sK[x] = in ? k[attn_kv_off(a, b, j, g) + d] : 0.0f;
        sV[x] = in ? v[attn_kv_off(a, b, j, g) + d] : 0.0f;
    }
    float gk[ATTN_ROWS_PER_WARP][NPL], gv[ATTN_ROWS_PER_WARP][NPL];
#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++)
#pragma unroll
        for (int c = 0; c < NPL; c++) gk[rr][c] = gv[rr][c] = 0.0f;

    // Queries that see any of keys [j0, j0 + ATTN_ROWS): i >= j0 and, with a
    // window, i < last key + window; none when every key is padding (j0 >=
    // kvl; kvl is the block's own, so the loop bounds stay block-uniform).
    const int qbeg = j0;
    const int qend = j0 >= kvl         ? j0
                     : a.window > 0 ? min(a.T, j0 + ATTN_ROWS - 1 + a.window)
                                    : a.T;
    for (int h = g * group; h < (g + 1) * group; h++) {
        for (int i0 = qbeg; i0 < qend; i0 += ATTN_TILE) {
            __syncthreads();
            for (int x = threadIdx.x; x < ATTN_TILE * hd; x += ATTN_THREADS) {
                const int ii = x / hd, d = x % hd, i = i0 + ii;
                const bool in = i < a.T;
                sQ[ii * hdp + d] = in ? q[attn_q_off(a, b, i, h) + d] : 0.0f;
                sO[ii * hdp + d] = in ? dout[attn_q_off(a, b, i, h) + d] : 0.0f;
            }
            if (threadIdx.x < ATTN_TILE) {
                const int i = i0 + threadIdx.x;
                sL[threadIdx.x] = i < a.T ? lse[attn_row_off(a, b, h, i)] : 0.0f;
                sD[threadIdx.x] = i < a.T ? D[attn_row_off(a, b, h, i)] : 0.0f;
            }
            __syncthreads();
            const int i = i0 + lane; // lane-per-query
            const int seg_i = attn_seg(seg_start, b, i, a.T);
#pragma unroll
            for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
                const int r = warp * ATTN_ROWS_PER_WARP + rr, j = j0 + r;
                float p = 0.0f, ds = 0.0f;
                if (attn_allowed(i, j, a.T, kvl, a.window, seg_i)) {
                    const float sc = attn_dot(sQ + lane * hdp, sK + r * hd, hd) * a.scale;
                    p = expf(sc - sL[lane]);
                    const float dp = attn_dot(sO + lane * hdp, sV + r * hd, hd);
                    ds = p * (dp - sD[lane]);
                }
                for (int ii = 0; ii < ATTN_TILE; ii++) {
                    const float pi = __shfl_sync(KC_FULL_MASK, p, ii);
                    const float dsi = __shfl_sync(KC_FULL_MASK, ds, ii);
#pragma unroll
                    for (int c = 0; c < NPL; c++) {
                        const int d = lane + 32 * c;
                        if (d < hd) {
                            gv[rr][c] += pi * sO[ii * hdp + d];
                            gk[rr][c] += dsi * sQ[ii * hdp + d];
                        }
                    }
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < ATTN_ROWS_PER_WARP; rr++) {
        const int j = j0 + warp * ATTN_ROWS_PER_WARP + rr;
        if (j >= a.T) continue;
        float *krow = dk + attn_kv_off(a, b, j, g), *vrow = dv + attn_kv_off(a, b, j, g);
#pragma unroll
        for (int c = 0; c < NPL; c++) {
            const int d = lane + 32 * c;
            if (d < hd) {
                krow[d] = a.scale * gk[rr][c];
                vrow[d] = gv[rr][c];
            }
        }
    }
}

template <int NPL>
static void attn_bwd_launch(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *lse,
                            const float *D, const int32_t *kv_len, const int32_t *seg_start, const attn_shape_t &a) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const size_t hd = (size_t)a.hd;
    const size_t smem_dq = (2 * ATTN_ROWS * hd + 2 * ATTN_TILE * (hd + 1)) * sizeof(float);
    kern_cuda_smem_optin(s, (const void *)attn_bwd_dq_kernel<NPL>, smem_dq, "attention_bwd dq");
    const dim3 grid_q(kc_div_up((size_t)a.T, ATTN_ROWS), a.nh, a.B);
    attn_bwd_dq_kernel<NPL><<<grid_q, ATTN_THREADS, smem_dq, cs>>>(dq, dout, q, k, v, lse, D, kv_len,
                                                                   seg_start, a);
    KC_LAUNCHED(s, "attention_bwd dq");

    const size_t smem_kv =
        (2 * ATTN_ROWS * hd + 2 * ATTN_TILE * (hd + 1) + 2 * ATTN_TILE) * sizeof(float);
    kern_cuda_smem_optin(s, (const void *)attn_bwd_dkdv_kernel<NPL>, smem_kv, "attention_bwd dk/dv");
    const dim3 grid_k(kc_div_up((size_t)a.T, ATTN_ROWS), a.nkv, a.B);
    attn_bwd_dkdv_kernel<NPL><<<grid_k, ATTN_THREADS, smem_kv, cs>>>(dk, dv, dout, q, k, v, lse, D,
                                                                     kv_len, seg_start, a);
    KC_LAUNCHED(s, "attention_bwd dk/dv");
}

extern "C" void kern_attention_bwd_cuda(kern_stream_t *s, float *dq, float *dk, float *dv,
                                        const float *dout, const float *q, const float *k,
                                        const float *v, const float *out, const float *lse,
                                        const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                        int hd, int window) {
    const attn_shape_t a = attn_shape(B, T, nh, nkv, hd, window, "attention_bwd");
    if (B == 0 || T == 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const size_t rows = (size_t)B * T * nh;
    float *D = (float *)kern_cuda_scratch(s, rows * sizeof(float), "attention_bwd D");
    attn_bwd_D_kernel<<<kc_div_up(rows, ATTN_WARPS), ATTN_THREADS, 0, cs>>>(D, dout, out, a);
    KC_LAUNCHED(s, "attention_bwd D");
    switch (attn_npl(hd)) {
    case 1: attn_bwd_launch<1>(s, dq, dk, dv, dout, q, k, v, lse, D, kv_len, seg_start, a); break;
    case 2: attn_bwd_launch<2>(s, dq, dk, dv, dout, q, k, v, lse, D, kv_len, seg_start, a); break;
    case 4: attn_bwd_launch<4>(s, dq, dk, dv, dout, q, k, v, lse, D, kv_len, seg_start, a); break;
    default: attn_bwd_launch<8>(s, dq, dk, dv, dout, q, k, v, lse, D, kv_len, seg_start, a); break;
    }
}
