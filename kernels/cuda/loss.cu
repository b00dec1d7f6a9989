// Cross-entropy over the vocabulary with ignored targets (loss.h).
//
// One 512-thread block per row; a row is read twice:
//   pass 1: each thread keeps an online (max, sum of exp) over its strided
//           logits, sums in double (the CPU twin sums exp in double); the
//           block combines them into the row's max and sum in thread order;
//   pass 2: dlogits = grad_scale * exp(logit - lse), minus grad_scale at the
//           target.  Every element is read and written by the same thread,
//           and the target logit is saved before pass 2, so dlogits may
//           alias logits.
// Per-element exponentials are fp32 expf (the twin uses double exp); the
// difference is within 2 ulp of each probability.
//
// A target outside [0, V) other than -100 (the data loader rejects those)
// gives a NaN loss row and a zero gradient row instead of reading out of
// bounds, so the step's loss shows it.
#include "kernels/cuda/kern_cuda.cuh"

#define XENT_THREADS 512

static __global__ void xent_kernel(float *loss_rows, float *dlogits, const float *logits,
                                   const int32_t *targets, int V, float grad_scale) {
    __shared__ float shf[32];
    __shared__ double shd[32];
    __shared__ float target_logit;
    const int r = blockIdx.x;
    const int32_t t = targets[r];
    const float *lr = logits + (size_t)r * V;
    float *dr = dlogits ? dlogits + (size_t)r * V : nullptr;
    if (t == KERN_IGNORE_INDEX || t < 0 || t >= V) {
        if (threadIdx.x == 0) loss_rows[r] = t == KERN_IGNORE_INDEX ? 0.0f : NAN;
        if (dr)
            for (int j = threadIdx.x; j < V; j += blockDim.x) dr[j] = 0.0f;
        return; // the whole block takes this branch
    }
    if (threadIdx.x == 0) target_logit = lr[t];

    float m = -INFINITY;
    double sum = 0.0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        const float x = lr[j];
        if (x > m) {
            sum = sum * exp((double)m - (double)x) + 1.0;
            m = x;
        } else {
            sum += (double)expf(x - m);
        }
    }
    // Block max, then every thread rescales its sum to it.
    float bm = kc_warp_max(m);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shf[warp] = bm;
    __syncthreads();
    bm = lane < (int)(blockDim.x >> 5) ? shf[lane] : -INFINITY;
    bm = kc_warp_max(bm);
    const double mine = m == -INFINITY ? 0.0 : sum * exp((double)m - (double)bm);
    const double total = kc_block_sum(mine, shd);
    const double lse = (double)bm + log(total);
    if (threadIdx.x == 0) loss_rows[r] = (float)(lse - (double)target_logit);
    if (!dr) return;
    const float lse_f = (float)lse;
    for (int j = threadIdx.x; j < V; j += blockDim.x) dr[j] = grad_scale * expf(lr[j] - lse_f);
    __syncthreads(); // the target's probability is written before it is corrected
    if (threadIdx.x == 0) dr[t] -= grad_scale;
}

extern "C" void kern_xent_cuda(kern_stream_t *s, float *loss_rows, float *dlogits,
                               const float *logits, const int32_t *targets, int n, int V,
                               float grad_scale) {
    if (n <= 0) return;
    MT_CHECK(V > 0, "xent: vocabulary size %d", V);
    cudaStream_t cs = kern_cuda_stream_begin(s);
    xent_kernel<<<n, XENT_THREADS, 0, cs>>>(loss_rows, dlogits, logits, targets, V, grad_scale);
    KC_LAUNCHED(s, "xent");
}
