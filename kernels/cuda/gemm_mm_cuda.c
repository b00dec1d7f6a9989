/* Typed matrix products on the GPU (kern_mm, gemm.h's contract), over
 * kern_matmul_ex_cuda's cuBLASLt calls.
 *
 * cuBLASLt with CUBLAS_COMPUTE_32F takes A and B of one type (F32 or BF16)
 * and C in F32, or BF16 when A and B are BF16.  What kern_mm allows beyond
 * that is reached through the stream's scratch (stream-ordered, so products
 * issued one after another on the compute stream may reuse it):
 * - bf16 compute with an operand stored F32: the operand is rounded to bf16
 *   (round to nearest even, the f32_to_bf16 kernel, as the CPU twin rounds
 *   it) into scratch first;
 * - fp32 compute into a BF16 C (and K == 0 scaling a BF16 C): the product
 *   is formed in an fp32 copy of C (widened first when beta != 0) and
 *   rounded once into C.
 * An operand bigger than the scratch is a fatal error naming it: store it
 * BF16 (the engine's weights are) or raise KERN_CUDA_SCRATCH_COMPUTE_BYTES.
 *
 * This file makes no CUDA call of its own: the CPU emulator (tests/gpu/emu)
 * builds it unchanged over its stand-ins for the scratch, the conversion
 * kernels and kern_matmul_ex_cuda, so the routing is tested without a GPU. */
#include <stdint.h>
#include <stdio.h>

#include "base/status.h"
#include "kernels/cuda/backend_cuda.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

/* Scratch is aligned to this for cuBLASLt's fastest kernels. */
#define MM_SCRATCH_ALIGN 256

static size_t round_up(size_t n) { return (n + MM_SCRATCH_ALIGN - 1) / MM_SCRATCH_ALIGN * MM_SCRATCH_ALIGN; }

static size_t mat_elems(const kern_mat_t *m) { return (size_t)m->rows * (size_t)m->cols; }

static void mm_one(kern_stream_t *s, const kern_mm_t *p, int idx) {
    int M, N, K;
    kern_mm_dims(p, idx, &M, &N, &K);
    if (M == 0 || N == 0) return;
    const bool conv_a = p->compute == MT_BF16 && p->A.dtype == MT_F32 && K > 0;
    const bool conv_b = p->compute == MT_BF16 && p->B.dtype == MT_F32 && K > 0;
    /* also an empty sum scaling a BF16 C, which the scale kernel (F32 only)
     * cannot do in place */
    const bool c_f32_copy = p->C.dtype == MT_BF16 &&
                            (p->compute == MT_F32 || (K == 0 && p->beta != 0.0f && p->beta != 1.0f));
    const size_t a_bytes = conv_a ? round_up(mat_elems(&p->A) * 2) : 0;
    const size_t b_bytes = conv_b ? round_up(mat_elems(&p->B) * 2) : 0;
    const size_t c_bytes = c_f32_copy ? round_up((size_t)M * N * 4) : 0;
    const void *A = p->A.data, *B = p->B.data;
    void *C = p->C.data;
    mt_dtype_t c_dt = p->C.dtype;
    if (a_bytes + b_bytes + c_bytes) {
        char what[160];
        snprintf(what, sizeof what,
                 "kern_mm product %d (M=%d N=%d K=%d: A %s%s, B %s%s, C %s%s)", idx, M, N, K,
                 mt_dtype_name(p->A.dtype), conv_a ? " rounded to bf16" : "",
                 mt_dtype_name(p->B.dtype), conv_b ? " rounded to bf16" : "",
                 mt_dtype_name(p->C.dtype), c_f32_copy ? " formed in fp32" : "");
        char *scratch = kern_cuda_scratch(s, a_bytes + b_bytes + c_bytes, what);
        if (conv_a) {
            kern_f32_to_bf16_cuda(s, (uint16_t *)scratch, p->A.data, mat_elems(&p->A));
            A = scratch;
        }
        if (conv_b) {
            kern_f32_to_bf16_cuda(s, (uint16_t *)(scratch + a_bytes), p->B.data, mat_elems(&p->B));
            B = scratch + a_bytes;
        }
        if (c_f32_copy) {
            C = scratch + a_bytes + b_bytes;
            c_dt = MT_F32;
            /* beta == 0 overwrites: C may hold NaN and need not be read */
            if (p->beta != 0.0f) kern_bf16_to_f32_cuda(s, C, p->C.data, (size_t)M * N);
        }
    }
    kern_matmul_ex_cuda(s, C, c_dt, A, B, p->compute == MT_BF16 ? MT_BF16 : MT_F32, M, N, K,
                        p->trans_a, p->trans_b, p->alpha, p->beta);
    if (c_f32_copy) kern_f32_to_bf16_cuda(s, p->C.data, C, (size_t)M * N);
}

void kern_mm_cuda(kern_stream_t *s, const kern_mm_t *p) { mm_one(s, p, 0); }

/* One cuBLASLt call per non-empty product, in order (see
 * kern_matmul_grouped_cuda for why not cuBLAS's grouped GEMM). */
void kern_mm_grouped_cuda(kern_stream_t *s, const kern_mm_t *p, int count) {
    for (int g = 0; g < count; g++) mm_one(s, &p[g], g);
}
