// RMSNorm forward and backward (norm.h), also Qwen3's per-head q/k norm.
//
// One warp per row: rows are tokens (or tokens x heads) and dim is the
// hidden size (or head_dim), so a warp's lanes stride the row and reduce
// with a butterfly; 8 rows per 256-thread block.  Row sums are accumulated
// in double like the CPU twin (products of floats are exact in double, so
// only the summation order differs from it), and the per-element formulas
// are the twin's, in its order.
//
// dw (accumulate) is the deterministic two-pass column sum of
// kern_cuda.cuh over dy * xhat; it runs before the dx kernel so that dx
// may alias dy or x.
#include "kernels/cuda/kern_cuda.cuh"

#define NORM_ROWS_PER_BLOCK 8

static __global__ void rmsnorm_fwd_kernel(float *y, float *rstd, const float *x, const float *w,
                                          int rows, int dim, float eps) {
    const int row = blockIdx.x * NORM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return; // whole warps leave together
    const float *xr = x + (size_t)row * dim;
    double ss = 0.0;
    for (int j = lane; j < dim; j += 32) ss += (double)xr[j] * xr[j];
    ss = kc_warp_sum_d(ss);
    const float r = 1.0f / sqrtf((float)(ss / dim) + eps);
    if (lane == 0) rstd[row] = r;
    float *yr = y + (size_t)row * dim;
    for (int j = lane; j < dim; j += 32) yr[j] = w[j] * (xr[j] * r);
}

static __global__ void rmsnorm_bwd_dx_kernel(float *dx, const float *dy, const float *x,
                                             const float *w, const float *rstd, int rows, int dim) {
    const int row = blockIdx.x * NORM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    const int lane = threadIdx.x & 31;
    if (row >= rows) return;
    const size_t off = (size_t)row * dim;
    const float r = rstd[row];
    double acc = 0.0;
    for (int j = lane; j < dim; j += 32) acc += (double)(dy[off + j] * w[j]) * (x[off + j] * r);
    const float mean = (float)(kc_warp_sum_d(acc) / dim);
    for (int j = lane; j < dim; j += 32)
        dx[off + j] = r * (dy[off + j] * w[j] - x[off + j] * r * mean);
}

struct rmsnorm_dw_term {
    const float *dy, *x, *rstd;
    int dim;
    __device__ float operator()(int r, int c) const {
        const size_t i = (size_t)r * dim + c;
        return dy[i] * (x[i] * rstd[r]);
    }
};

extern "C" {

void kern_rmsnorm_fwd_cuda(kern_stream_t *s, float *y, float *rstd, const float *x, const float *w,
                           int rows, int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    rmsnorm_fwd_kernel<<<kc_div_up((size_t)rows, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK, 0,
                         cs>>>(y, rstd, x, w, rows, dim, eps);
    KC_LAUNCHED(s, "rmsnorm_fwd");
}

void kern_rmsnorm_bwd_cuda(kern_stream_t *s, float *dx, float *dw, const float *dy, const float *x,
                           const float *w, const float *rstd, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    kc_colsum(s, rmsnorm_dw_term{dy, x, rstd, dim}, dw, rows, dim, "rmsnorm_bwd dw");
    cudaStream_t cs = kern_cuda_stream_begin(s);
    rmsnorm_bwd_dx_kernel<<<kc_div_up((size_t)rows, NORM_ROWS_PER_BLOCK),
                            32 * NORM_ROWS_PER_BLOCK, 0, cs>>>(dx, dy, x, w, rstd, rows, dim);
    KC_LAUNCHED(s, "rmsnorm_bwd dx");
}

} // extern "C"
