/* Row-major products as cuBLASLt column-major ones (see gemm_plan.h). */
#include "kernels/cuda/gemm_plan.h"

kern_cuda_gemm_plan_t kern_cuda_gemm_plan(int M, int N, int K, bool trans_a, bool trans_b) {
    kern_cuda_gemm_plan_t p;
    p.m = N;
    p.n = M;
    p.k = K;
    p.trans_la = trans_b;
    p.trans_lb = trans_a;
    /* LA = our B: stored (K, N) row-major = (N x K, ld N) column-major, or
     * (N, K) = (K x N, ld K) when trans_b. */
    p.la_rows = (uint64_t)(trans_b ? K : N);
    p.la_cols = (uint64_t)(trans_b ? N : K);
    p.lda = trans_b ? K : N;
    /* LB = our A: stored (M, K) = (K x M, ld K), or (K, M) = (M x K, ld M). */
    p.lb_rows = (uint64_t)(trans_a ? M : K);
    p.lb_cols = (uint64_t)(trans_a ? K : M);
    p.ldb = trans_a ? M : K;
    /* C (M, N) row-major = (N x M, ld N) column-major. */
    p.lc_rows = (uint64_t)N;
    p.lc_cols = (uint64_t)M;
    p.ldc = N;
    return p;
}
