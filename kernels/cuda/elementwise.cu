// Element-wise ops, small reductions and dtype conversions (elementwise.h).
//
// Grid-stride loops over size_t indices, 256 threads a block.  This file
// is compiled with --fmad=false: the ops are memory-bound, and without
// contraction y += alpha * x rounds exactly as the CPU twin's C does, so
// add/axpy/scale/bias/conversions match the CPU bit for bit, and so does
// the bf16 SwiGLU (its exp is act_math.h's kern_exp_cw, not the device expf).
//
// sumsq accumulates squares in double (products of floats are exact in
// double): per-block partials in a fixed grid, then one block adds them in
// block order.  sumsq_many does the same for up to SUMSQ_MANY tensors per
// launch pair, their pointers and sizes passed by value in the launch (no
// copy to make): each tensor gets the blocks sumsq would give it, each
// block strides over its tensor as sumsq's grid would, and one block per
// tensor adds its partials, so every result has sumsq's bits.  bias_bwd is the deterministic column sum of kern_cuda.cuh.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/math/act_math.h"
}

#define EW_THREADS 256

#define EW_LOOP(i, n) \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (size_t)gridDim.x * blockDim.x)

static __global__ void ew_add_kernel(float *y, const float *a, const float *b, size_t n) {
    EW_LOOP(i, n) y[i] = a[i] + b[i];
}

static __global__ void ew_axpy_kernel(float *y, float alpha, const float *x, size_t n) {
    EW_LOOP(i, n) y[i] += alpha * x[i];
}

static __global__ void ew_scale_kernel(float *x, float alpha, size_t n) {
    EW_LOOP(i, n) x[i] *= alpha;
}

static __global__ void ew_bias_fwd_kernel(float *y, const float *b, size_t n, int cols) {
    EW_LOOP(i, n) y[i] += b[i % (size_t)cols];
}

static __global__ void ew_clamp_fwd_kernel(float *y, const float *x, float c, size_t n) {
    EW_LOOP(i, n) y[i] = kern_clamp_elem(x[i], c);
}

static __global__ void ew_clamp_bwd_kernel(float *dx, const float *dy, const float *x, float c, size_t n) {
    EW_LOOP(i, n) dx[i] = kern_clamp_grad_elem(dy[i], x[i], c);
}

static __global__ void ew_swiglu_fwd_kernel(float *h, const float *g, const float *u, size_t n) {
    EW_LOOP(i, n) h[i] = kern_silu(g[i]) * u[i];
}

static __global__ void ew_swiglu_bwd_kernel(float *dg, float *du, const float *dh, const float *g,
                                     const float *u, size_t n) {
    EW_LOOP(i, n) {
        float a, b;
        kern_swiglu_bwd_elem(dh[i], g[i], u[i], &a, &b); // reads before the (aliased) writes
        dg[i] = a;
        du[i] = b;
    }
}

static __global__ void ew_swiglu_fwd_bf16_kernel(uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n) {
    EW_LOOP(i, n) h[i] = kern_swiglu_bf16_elem(g[i], u[i]);
}

static __global__ void ew_swiglu_bwd_bf16_kernel(uint16_t *dg, uint16_t *du, const uint16_t *dh, const uint16_t *g,
                                                 const uint16_t *u, size_t n) {
    EW_LOOP(i, n) {
        uint16_t a, b;
        kern_swiglu_bwd_bf16_elem(dh[i], g[i], u[i], &a, &b); // reads before the (aliased) writes
        dg[i] = a;
        du[i] = b;
    }
}

static __global__ void ew_f32_to_bf16_kernel(uint16_t *dst, const float *src, size_t n) {
    EW_LOOP(i, n) dst[i] = mt_f32_to_bf16(src[i]);
}

static __global__ void ew_bf16_to_f32_kernel(float *dst, const uint16_t *src, size_t n) {
    EW_LOOP(i, n) dst[i] = mt_bf16_to_f32(src[i]);
}

static __global__ void ew_dropout_kernel(float *dst, const float *src, size_t n, float p, uint64_t seed) {
    const float scale = 1.0f / (1.0f - p);
    EW_LOOP(i, n) dst[i] = kern_dropout_keep(seed, i, p) ? src[i] * scale : 0.0f;
}

static __global__ void ew_sumsq_partial_kernel(double *part, const float *x, size_t n) {
    __shared__ double sh[32];
    double acc = 0.0;
    EW_LOOP(i, n) {
        const double v = (double)x[i];
        acc += v * v;
    }
    acc = kc_block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

static __global__ void ew_sumsq_final_kernel(float *out, const double *part, int nparts) {
    __shared__ double sh[32];
    double acc = 0.0;
    for (int i = threadIdx.x; i < nparts; i += blockDim.x) acc += part[i];
    acc = kc_block_sum(acc, sh);
    if (threadIdx.x == 0) *out = (float)acc;
}

#define SUMSQ_MANY 64
#define SUMSQ_THREADS EW_THREADS
#define SUMSQ_FINAL_THREADS 1024

// Blocks of one tensor's sum of squares: a function of n only.
static inline unsigned sumsq_blocks(size_t n) { return kc_blocks(n, SUMSQ_THREADS * 4, 1024); }

typedef struct {
    const float *x[SUMSQ_MANY];
    float *out[SUMSQ_MANY];
    size_t n[SUMSQ_MANY];
    unsigned first[SUMSQ_MANY + 1]; // tensor t's blocks are [first[t], first[t + 1])
} sumsq_many_t;

static __global__ void ew_sumsq_many_partial_kernel(double *part, sumsq_many_t d) {
    __shared__ double sh[32];
    unsigned b, nb;
    const int t = kc_many_tensor(d.first, &b, &nb);
    const float *x = d.x[t];
    double acc = 0.0;
    for (size_t i = (size_t)b * blockDim.x + threadIdx.x; i < d.n[t]; i += (size_t)nb * blockDim.x) {
        const double v = (double)x[i];
        acc += v * v;
    }
    acc = kc_block_sum(acc, sh);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

static __global__ void ew_sumsq_many_final_kernel(const double *part, sumsq_many_t d) {
    __shared__ double sh[32];
    const unsigned first = d.first[blockIdx.x], np = d.first[blockIdx.x + 1] - first;
    double acc = 0.0;
    for (unsigned i = threadIdx.x; i < np; i += blockDim.x) acc += part[first + i];
    acc = kc_block_sum(acc, sh);
    if (threadIdx.x == 0) *d.out[blockIdx.x] = (float)acc;
}

// add_bf16_many: up to ADD_MANY tensors per launch, passed by value as
// sumsq_many's are, each over its own blocks.
#define ADD_MANY 64

typedef struct {
    float *dst[ADD_MANY];
    const uint16_t *src[ADD_MANY];
    size_t n[ADD_MANY];
    unsigned first[ADD_MANY + 1];
} add_bf16_many_t;

static __global__ void ew_add_bf16_many_kernel(add_bf16_many_t d) {
    unsigned b, nb;
    const int t = kc_many_tensor(d.first, &b, &nb);
    float *y = d.dst[t];
    const uint16_t *a = d.src[t];
    for (size_t i = (size_t)b * blockDim.x + threadIdx.x; i < d.n[t]; i += (size_t)nb * blockDim.x)
        y[i] += mt_bf16_to_f32(a[i]);
}

// zero_many: as add_bf16_many, writing zeros.
typedef struct {
    float *dst[ADD_MANY];
    size_t n[ADD_MANY];
    unsigned first[ADD_MANY + 1];
} zero_many_t;

static __global__ void ew_zero_many_kernel(zero_many_t d) {
    unsigned b, nb;
    const int t = kc_many_tensor(d.first, &b, &nb);
    float *y = d.dst[t];
    for (size_t i = (size_t)b * blockDim.x + threadIdx.x; i < d.n[t]; i += (size_t)nb * blockDim.x) y[i] = 0.0f;
}

struct ew_colsum_dy {
    const float *dy;
    int cols;
    __device__ float operator()(int r, int c) const { return dy[(size_t)r * cols + c]; }
};

extern "C" {

void kern_add_cuda(kern_stream_t *s, float *y, const float *a, const float *b, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_add_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(y, a, b, n);
    KC_LAUNCHED(s, "add");
}

void kern_axpy_cuda(kern_stream_t *s, float *y, float alpha, const float *x, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_axpy_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(y, alpha, x, n);
    KC_LAUNCHED(s, "axpy");
}

void kern_scale_cuda(kern_stream_t *s, float *x, float alpha, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_scale_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(x, alpha, n);
    KC_LAUNCHED(s, "scale");
}

void kern_clamp_fwd_cuda(kern_stream_t *s, float *y, const float *x, float c, size_t n) {
    if (n == 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_clamp_fwd_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(y, x, c, n);
    KC_LAUNCHED(s, "clamp_fwd");
}

void kern_clamp_bwd_cuda(kern_stream_t *s, float *dx, const float *dy, const float *x, float c, size_t n) {
    if (n == 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_clamp_bwd_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dx, dy, x, c, n);
    KC_LAUNCHED(s, "clamp_bwd");
}

void kern_bias_fwd_cuda(kern_stream_t *s, float *y, const float *b, int rows, int cols) {
    if (rows <= 0 || cols <= 0) return;
    const size_t n = (size_t)rows * cols;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_bias_fwd_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(y, b, n, cols);
    KC_LAUNCHED(s, "bias_fwd");
}

void kern_bias_bwd_cuda(kern_stream_t *s, float *db, const float *dy, int rows, int cols) {
    kc_colsum(s, ew_colsum_dy{dy, cols}, db, rows, cols, "bias_bwd");
}

void kern_swiglu_fwd_cuda(kern_stream_t *s, float *h, const float *g, const float *u, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_swiglu_fwd_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(h, g, u, n);
    KC_LAUNCHED(s, "swiglu_fwd");
}

void kern_swiglu_bwd_cuda(kern_stream_t *s, float *dg, float *du, const float *dh, const float *g,
                          const float *u, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_swiglu_bwd_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dg, du, dh, g, u, n);
    KC_LAUNCHED(s, "swiglu_bwd");
}

void kern_swiglu_fwd_bf16_cuda(kern_stream_t *s, uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_swiglu_fwd_bf16_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(h, g, u, n);
    KC_LAUNCHED(s, "swiglu_fwd_bf16");
}

void kern_swiglu_bwd_bf16_cuda(kern_stream_t *s, uint16_t *dg, uint16_t *du, const uint16_t *dh, const uint16_t *g,
                               const uint16_t *u, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_swiglu_bwd_bf16_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dg, du, dh, g, u, n);
    KC_LAUNCHED(s, "swiglu_bwd_bf16");
}

// 4 elements per thread before the grid caps at 1024 blocks.
void kern_sumsq_cuda(kern_stream_t *s, float *out, const float *x, size_t n) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const unsigned nb = sumsq_blocks(n);
    double *part = (double *)kern_cuda_scratch(s, nb * sizeof(double), "sumsq");
    ew_sumsq_partial_kernel<<<nb, SUMSQ_THREADS, 0, cs>>>(part, x, n);
    KC_LAUNCHED(s, "sumsq");
    ew_sumsq_final_kernel<<<1, SUMSQ_FINAL_THREADS, 0, cs>>>(out, part, (int)nb);
    KC_LAUNCHED(s, "sumsq");
}

void kern_sumsq_many_cuda(kern_stream_t *s, float *const *out, const float *const *x, const size_t *n, int count) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    for (int at = 0; at < count; at += SUMSQ_MANY) {
        const int m = count - at < SUMSQ_MANY ? count - at : SUMSQ_MANY;
        sumsq_many_t d;
        memset(&d, 0, sizeof d);
        d.first[0] = 0;
        for (int t = 0; t < m; t++) {
            d.x[t] = x[at + t], d.out[t] = out[at + t], d.n[t] = n[at + t];
            d.first[t + 1] = d.first[t] + sumsq_blocks(n[at + t]);
        }
        double *part = (double *)kern_cuda_scratch(s, d.first[m] * sizeof(double), "sumsq_many");
        ew_sumsq_many_partial_kernel<<<d.first[m], SUMSQ_THREADS, 0, cs>>>(part, d);
        KC_LAUNCHED(s, "sumsq_many");
        ew_sumsq_many_final_kernel<<<(unsigned)m, SUMSQ_FINAL_THREADS, 0, cs>>>(part, d);
        KC_LAUNCHED(s, "sumsq_many");
    }
}

void kern_add_bf16_many_cuda(kern_stream_t *s, float *const *dst, const uint16_t *const *src, const size_t *n,
                             int count) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    for (int at = 0; at < count; at += ADD_MANY) {
        const int m = count - at < ADD_MANY ? count - at : ADD_MANY;
        add_bf16_many_t d;
        memset(&d, 0, sizeof d);
        for (int t = 0; t < m; t++) {
            d.dst[t] = dst[at + t], d.src[t] = src[at + t], d.n[t] = n[at + t];
            d.first[t + 1] = d.first[t] + kc_blocks(n[at + t], EW_THREADS * 4, 4096);
        }
        ew_add_bf16_many_kernel<<<d.first[m], EW_THREADS, 0, cs>>>(d);
        KC_LAUNCHED(s, "add_bf16_many");
    }
}

void kern_zero_many_cuda(kern_stream_t *s, float *const *dst, const size_t *n, int count) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    for (int at = 0; at < count; at += ADD_MANY) {
        const int m = count - at < ADD_MANY ? count - at : ADD_MANY;
        zero_many_t d;
        memset(&d, 0, sizeof d);
        for (int t = 0; t < m; t++) {
            d.dst[t] = dst[at + t], d.n[t] = n[at + t];
            d.first[t + 1] = d.first[t] + kc_blocks(n[at + t], EW_THREADS * 4, 4096);
        }
        ew_zero_many_kernel<<<d.first[m], EW_THREADS, 0, cs>>>(d);
        KC_LAUNCHED(s, "zero_many");
    }
}

void kern_f32_to_bf16_cuda(kern_stream_t *s, uint16_t *dst, const float *src, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_f32_to_bf16_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dst, src, n);
    KC_LAUNCHED(s, "f32_to_bf16");
}

void kern_bf16_to_f32_cuda(kern_stream_t *s, float *dst, const uint16_t *src, size_t n) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_bf16_to_f32_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dst, src, n);
    KC_LAUNCHED(s, "bf16_to_f32");
}

void kern_dropout_cuda(kern_stream_t *s, float *dst, const float *src, size_t n, float p, uint64_t seed) {
    if (!n) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    ew_dropout_kernel<<<kc_blocks(n, EW_THREADS), EW_THREADS, 0, cs>>>(dst, src, n, p, seed);
    KC_LAUNCHED(s, "dropout");
}

} // extern "C"
