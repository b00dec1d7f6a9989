// kern_dequant (kernels/dequant.h): one thread per element of the working
// copy, grid-stride, one kernel per format (the format chosen at launch,
// not per element); each value from base/quant_elem.h's function for the
// format, the definition the CPU twin and the host dequantiser share, so the
// three agree bit for bit (built with --fmad=false: a double-quantised
// absmax's multiply and add stay two roundings).  The view is passed by value.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/dequant.h"
}

#define DEQUANT_THREADS 256

template <int F> __device__ __forceinline__ float dequant_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    if (F == MT_QUANT_FP8_BLOCK) return mt_quant_fp8_value(q, r, c);
    if (F == MT_QUANT_MXFP4) return mt_quant_mxfp4_value(q, r, c);
    if (F == MT_QUANT_NF4) return mt_quant_bnb4_value(q, r, c);
    return mt_quant_int4_value(q, r, c);
}

template <int F> static __global__ void dequant_kernel(void *dst, int bf16, mt_quant_view_t q, int64_t n) {
    for (int64_t i = (int64_t)blockIdx.x * DEQUANT_THREADS + threadIdx.x; i < n;
         i += (int64_t)gridDim.x * DEQUANT_THREADS) {
        const float v = dequant_value<F>(&q, i / q.cols, i % q.cols);
        if (bf16) ((uint16_t *)dst)[i] = mt_f32_to_bf16(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" {

void kern_dequant_cuda(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q) {
    const int64_t n = q->rows * q->cols;
    if (q->rows <= 0 || q->cols <= 0) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const unsigned blocks = kc_blocks((size_t)n, DEQUANT_THREADS);
    const int bf16 = dt == MT_BF16;
    switch (q->format) {
    case MT_QUANT_FP8_BLOCK:
        dequant_kernel<MT_QUANT_FP8_BLOCK><<<blocks, DEQUANT_THREADS, 0, cs>>>(dst, bf16, *q, n);
        break;
    case MT_QUANT_MXFP4:
        dequant_kernel<MT_QUANT_MXFP4><<<blocks, DEQUANT_THREADS, 0, cs>>>(dst, bf16, *q, n);
        break;
    case MT_QUANT_NF4:
    case MT_QUANT_FP4: /* mt_quant_bnb4_value reads which from the view */
        dequant_kernel<MT_QUANT_NF4><<<blocks, DEQUANT_THREADS, 0, cs>>>(dst, bf16, *q, n);
        break;
    case MT_QUANT_INT4:
        dequant_kernel<MT_QUANT_INT4><<<blocks, DEQUANT_THREADS, 0, cs>>>(dst, bf16, *q, n);
        break;
    default: /* mt_quant_check refuses any other format before a view gets here */
        break;
    }
    KC_LAUNCHED(s, "dequant");
}

} // extern "C"
