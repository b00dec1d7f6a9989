// kern_dequant (kernels/dequant.h): one thread per element of the working
// copy, grid-stride; each value from base/quant_elem.h's mt_quant_value,
// the definition the CPU twin and the host dequantiser share, so the three
// agree bit for bit (built with --fmad=false: the double-quantised absmax's
// multiply and add stay two roundings).  The view is passed by value.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/dequant.h"
}

#define DEQUANT_THREADS 256

static __global__ void dequant_kernel(void *dst, int bf16, mt_quant_view_t q, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * DEQUANT_THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * DEQUANT_THREADS) {
        const float v = mt_quant_value(&q, i / q.cols, i % q.cols);
        if (bf16) ((uint16_t *)dst)[i] = mt_f32_to_bf16(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" {

void kern_dequant_cuda(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q) {
    const int64_t n = q->rows * q->cols;
    if (q->rows <= 0 || q->cols <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    dequant_kernel<<<kc_blocks((size_t)n, DEQUANT_THREADS), DEQUANT_THREADS, 0, cs>>>(dst, dt == MT_BF16, *q, n);
    KC_LAUNCHED(s, "dequant");
}

} // extern "C"
