// gpt-oss's ops (kernels/gpt_oss.h): attention sinks and the clamped SwiGLU.
//
// Element-wise and memory-bound, built with --fmad=false like
// elementwise.cu, on gpt_oss_math.h's per-element functions (so only the
// device's expf / log1pf, within 2 ulp of glibc's, separate them from the
// CPU twin).  The sink gradient is one block per head: each thread sums its
// rows (strided by the block size) in double, then a fixed tree adds the
// threads' sums, so the result is the same bits every run.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/gpt_oss.h"
#include "kernels/math/gpt_oss_math.h"
}

#define GO_THREADS 256

static __global__ void go_sink_fwd_kernel(float *out, float *lse, const float *sinks, int B, int T, int nh, int hd) {
    const size_t rows = (size_t)B * nh * T;
    for (size_t r = (size_t)blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += (size_t)gridDim.x * blockDim.x) {
        // r indexes lse (B, nh, T)
        const int t = (int)(r % T), h = (int)((r / T) % nh), b = (int)(r / ((size_t)T * nh));
        const float l = lse[r];
        const float l2 = kern_sink_lse(l, sinks[h]);
        const float scale = l == -INFINITY ? 0.0f : expf(l - l2);
        float *o = out + (((size_t)b * T + t) * nh + h) * hd;
        for (int d = 0; d < hd; d++) o[d] *= scale;
        lse[r] = l2;
    }
}

static __global__ void go_sink_bwd_kernel(float *dsinks, const float *dout, const float *out, const float *lse,
                                          const float *sinks, int B, int T, int nh, int hd) {
    __shared__ double part[GO_THREADS];
    const int h = blockIdx.x;
    double acc = 0.0;
    for (int r = threadIdx.x; r < B * T; r += GO_THREADS) {
        const int b = r / T, t = r % T;
        const size_t row = (((size_t)b * T + t) * nh + h) * hd;
        double dot = 0.0;
        for (int d = 0; d < hd; d++) dot += (double)dout[row + d] * out[row + d];
        const float p_sink = expf(sinks[h] - lse[((size_t)b * nh + h) * T + t]);
        acc -= (double)p_sink * dot;
    }
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int w = GO_THREADS / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0) dsinks[h] += (float)part[0];
}

static __global__ void go_swiglu_fwd_kernel(float *h, const float *gu, float alpha, float limit, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        h[i] = kern_swiglu_clamped_elem(gu[2 * i], gu[2 * i + 1], alpha, limit);
}

static __global__ void go_swiglu_bwd_kernel(float *dgu, const float *dh, const float *gu, float alpha, float limit,
                                            size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float dg, du;
        kern_swiglu_clamped_bwd_elem(dh[i], gu[2 * i], gu[2 * i + 1], alpha, limit, &dg, &du);
        dgu[2 * i] = dg; // after both reads: dgu may alias gu
        dgu[2 * i + 1] = du;
    }
}

// Expert biases: blockIdx.y is the expert, x tiles its columns; forward
// strides its rows over blockIdx.z, backward gives each thread one column
// and adds the expert's rows in order (the CPU twin's order).
#define GO_BIAS_ROW_CHUNKS 8

static __global__ void go_expert_bias_fwd_kernel(float *y, const float *b, const int32_t *offsets, int C) {
    const int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float be = b[(size_t)e * C + c];
    for (int32_t r = offsets[e] + (int32_t)blockIdx.z; r < offsets[e + 1]; r += GO_BIAS_ROW_CHUNKS)
        y[(size_t)r * C + c] += be;
}

static __global__ void go_expert_bias_bwd_kernel(float *db, const float *dy, const int32_t *offsets, int C) {
    const int e = blockIdx.y, c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float acc = 0.0f;
    for (int32_t r = offsets[e]; r < offsets[e + 1]; r++) acc += dy[(size_t)r * C + c];
    db[(size_t)e * C + c] += acc;
}

extern "C" {

void kern_expert_bias_fwd_cuda(kern_stream_t *s, float *y, const float *b, const int32_t *offsets, int E, int C) {
    if (E <= 0 || C <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const dim3 grid((unsigned)kc_div_up((size_t)C, GO_THREADS), (unsigned)E, GO_BIAS_ROW_CHUNKS);
    go_expert_bias_fwd_kernel<<<grid, GO_THREADS, 0, cs>>>(y, b, offsets, C);
    KC_LAUNCHED(s, "expert_bias_fwd");
}

void kern_expert_bias_bwd_cuda(kern_stream_t *s, float *db, const float *dy, const int32_t *offsets, int E, int C) {
    if (E <= 0 || C <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const dim3 grid((unsigned)kc_div_up((size_t)C, GO_THREADS), (unsigned)E);
    go_expert_bias_bwd_kernel<<<grid, GO_THREADS, 0, cs>>>(db, dy, offsets, C);
    KC_LAUNCHED(s, "expert_bias_bwd");
}

void kern_attn_sink_fwd_cuda(kern_stream_t *s, float *out, float *lse, const float *sinks, int B, int T,
                                        int nh, int hd) {
    const size_t rows = (size_t)B * nh * T;
    if (!rows) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    go_sink_fwd_kernel<<<kc_blocks(rows, GO_THREADS), GO_THREADS, 0, cs>>>(out, lse, sinks, B, T, nh, hd);
    KC_LAUNCHED(s, "attn_sink_fwd");
}

void kern_attn_sink_bwd_cuda(kern_stream_t *s, float *dsinks, const float *dout, const float *out,
                                        const float *lse, const float *sinks, int B, int T, int nh, int hd) {
    if (nh <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    go_sink_bwd_kernel<<<nh, GO_THREADS, 0, cs>>>(dsinks, dout, out, lse, sinks, B, T, nh, hd);
    KC_LAUNCHED(s, "attn_sink_bwd");
}

void kern_swiglu_clamped_fwd_cuda(kern_stream_t *s, float *h, const float *gu, float alpha, float limit,
                                             size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    go_swiglu_fwd_kernel<<<kc_blocks(n, GO_THREADS), GO_THREADS, 0, cs>>>(h, gu, alpha, limit, n);
    KC_LAUNCHED(s, "swiglu_clamped_fwd");
}

void kern_swiglu_clamped_bwd_cuda(kern_stream_t *s, float *dgu, const float *dh, const float *gu,
                                             float alpha, float limit, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    go_swiglu_bwd_kernel<<<kc_blocks(n, GO_THREADS), GO_THREADS, 0, cs>>>(dgu, dh, gu, alpha, limit, n);
    KC_LAUNCHED(s, "swiglu_clamped_bwd");
}

} // extern "C"
