// Strided 4-D copy (kernels/copy4d.h): one thread per element, the flat
// index taken apart innermost first.  Destinations are distinct by the
// contract, so threads never write one element twice.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/copy4d.h"
}

#define COPY4D_THREADS 256

static __global__ void copy4d_kernel(float *dst, const float *src, kern_copy4d_t c, int64_t total, int accumulate) {
    const int64_t t = (int64_t)blockIdx.x * COPY4D_THREADS + threadIdx.x;
    if (t >= total) return;
    int64_t r = t;
    const int64_t l = r % c.d[3];
    r /= c.d[3];
    const int64_t k = r % c.d[2];
    r /= c.d[2];
    const int64_t j = r % c.d[1];
    const int64_t i = r / c.d[1];
    const float v = src[i * c.ss[0] + j * c.ss[1] + k * c.ss[2] + l * c.ss[3]];
    float *d = dst + i * c.ds[0] + j * c.ds[1] + k * c.ds[2] + l * c.ds[3];
    if (accumulate) *d += v;
    else *d = v;
}

extern "C" {

void kern_copy4d_cuda(kern_stream_t *s, float *dst, const float *src, const kern_copy4d_t *c, int accumulate) {
    const int64_t total = c->d[0] * c->d[1] * c->d[2] * c->d[3];
    if (c->d[0] <= 0 || c->d[1] <= 0 || c->d[2] <= 0 || c->d[3] <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    copy4d_kernel<<<kc_div_up((size_t)total, COPY4D_THREADS), COPY4D_THREADS, 0, cs>>>(dst, src, *c, total,
                                                                                      accumulate);
    KC_LAUNCHED(s, "copy4d");
}

} // extern "C"
