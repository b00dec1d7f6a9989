/* The CPU products' shared machinery (private to kernels/cpu): fp32 sgemm
 * calls cut into pieces over the backend's pool (gemm.c), on which the
 * typed products (gemm_typed.c) run every fp32 product and the SGEMM bf16
 * path, and the choice of bf16 path (gemm_bf16_path.c). */
#ifndef MT_KERNELS_CPU_GEMM_INTERNAL_H
#define MT_KERNELS_CPU_GEMM_INTERNAL_H

#include <stdbool.h>

#include "kernels/gemm.h"

/* One fp32 product C (M, N) = alpha op(A) op(B) + beta C, gemm.h's layout. */
typedef struct {
    float *C;
    const float *A, *B;
    int M, N, K;
    bool ta, tb;
    float alpha, beta;
} kern_cpu_sgemm_t;

/* Runs `count` independent products as one task list on s's pool (or one
 * threaded OpenBLAS call each; see gemm.c).  Products with M or N == 0 are
 * skipped, K == 0 gives beta * C.  Deterministic for any pool size. */
void kern_cpu_sgemm_batch(kern_stream_t *s, const kern_cpu_sgemm_t *prods, int count);

/* How kern_mm forms bf16 products on the CPU.  Both round each operand to
 * bf16 the same way (round to nearest even) and accumulate exact products
 * in fp32; they differ only in summation order and in vdpbf16ps flushing
 * denormals (see gemm_dpbf16.c), so they agree to a tolerance, not bitwise.
 *   SGEMM:  operands rounded to bf16 values held in fp32, then sgemm
 *           (every CPU; the reference path);
 *   DPBF16: packed bf16 panels and an AVX512-BF16 vdpbf16ps kernel (CPUs
 *           with avx512_bf16: AMD Zen 4+, Intel Cooper Lake, Sapphire
 *           Rapids+). */
typedef enum {
    KERN_CPU_BF16_SGEMM = 0,
    KERN_CPU_BF16_DPBF16,
    KERN_CPU_BF16_PATHS,
} kern_cpu_bf16_path_t;

/* The paths' names, availability and default (gemm_bf16_path.c). */
const char *kern_cpu_bf16_path_name(kern_cpu_bf16_path_t path);
/* Whether this CPU can run `path` (asked of the CPU at run time). */
bool kern_cpu_bf16_path_available(kern_cpu_bf16_path_t path);
/* The path kern_mm_cpu uses on this CPU (the fastest available one). */
kern_cpu_bf16_path_t kern_cpu_bf16_path_default(void);

/* kern_mm_grouped_cpu with the bf16 path named (tests and the bench force
 * each path; fatal when this CPU cannot run it).  MT_F32-compute products
 * take the sgemm path whatever `path` says. */
void kern_mm_grouped_cpu_path(kern_stream_t *s, const kern_mm_t *p, int count,
                              kern_cpu_bf16_path_t path);

/* The DPBF16 path for products with compute MT_BF16, validated shapes and
 * M, N, K > 0 (gemm_dpbf16.c). */
void kern_cpu_dpbf16_batch(kern_stream_t *s, const kern_mm_t *p, int count);

#endif
