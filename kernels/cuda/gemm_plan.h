/* How a row-major product of gemm.h maps onto cuBLASLt's column-major one.
 *
 * A row-major (r, c) matrix is a column-major (c, r) one with the same
 * memory, so C (M, N) = op(A) op(B) is computed as C^T = op(B)^T op(A)^T:
 * cuBLASLt's "A" is our B and its "B" is our A, each keeping the transpose
 * flag the caller gave.  Pure arithmetic, no CUDA: tests/gpu/gemm_plan_test
 * executes the plan with BLAS's column-major definition on the CPU and
 * checks it against the row-major definition, on every machine. */
#ifndef MT_KERNELS_CUDA_GEMM_PLAN_H
#define MT_KERNELS_CUDA_GEMM_PLAN_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    /* column-major D (m, n) = op(LA) (m, k) @ op(LB) (k, n), D = C in place */
    int m, n, k;
    bool trans_la, trans_lb;    /* op of LA (= our B) and of LB (= our A) */
    uint64_t la_rows, la_cols;  /* LA's stored layout, leading dimension lda */
    int64_t lda;
    uint64_t lb_rows, lb_cols;
    int64_t ldb;
    uint64_t lc_rows, lc_cols;
    int64_t ldc;
} kern_cuda_gemm_plan_t;

/* M, N, K > 0; trans_a / trans_b as in gemm.h. */
kern_cuda_gemm_plan_t kern_cuda_gemm_plan(int M, int N, int K, bool trans_a, bool trans_b);

#endif
