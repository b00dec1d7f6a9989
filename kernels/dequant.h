/* Dequantisation of a frozen base's quantised tensor into a working copy,
 * on the device, just before use (base/quant_elem.h describes the formats:
 * FP8 with 128 x 128 block scales, MXFP4, bitsandbytes NF4 / FP4 with or
 * without double quantisation, GPTQ INT4).
 *
 *   dst (q->rows, q->cols) of dt, MT_F32 or MT_BF16 (rounded to nearest
 *   even from the fp32 value), overwritten;
 *   q: the view, its buffers device pointers (the struct itself is read on
 *   the host when the op is issued, so it may live on the caller's stack).
 *
 * Both twins compute every element with base/quant_elem.h's
 * mt_quant_value, the one definition of each format: CPU, CUDA and the
 * host dequantiser (base/quant.h's mt_dequant) agree bit for bit.  The view
 * must have passed mt_quant_check on the host (shapes, sizes, scales). */
#ifndef MT_KERNELS_DEQUANT_H
#define MT_KERNELS_DEQUANT_H

#include "base/dtype.h"
#include "base/quant_elem.h"

typedef struct kern_stream kern_stream_t;

typedef void (*kern_dequant_fn)(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q);
void kern_dequant_cpu(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q);
void kern_dequant_cuda(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q);

#endif
