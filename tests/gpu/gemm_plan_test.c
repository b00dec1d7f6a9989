/* The row-major -> cuBLASLt column-major mapping of the CUDA GEMMs
 * (kernels/cuda/gemm_plan.h), checked without a GPU: the plan is executed
 * with BLAS's column-major definition of D = alpha op(A) op(B) + beta C
 * (what cuBLASLt computes for those descriptors) and compared with gemm.h's
 * row-major definition.  Both sum over k in the same order, so they must
 * agree bit for bit; a swapped operand, flag or leading dimension changes
 * the result (the shapes below keep M, N, K distinct).  Layout dimensions
 * must also be what cuBLASLt requires of each op. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/gemm_plan.h"

static int failures;

static void expect(int ok, const char *what, int M, int N, int K, int ta, int tb) {
    if (ok) return;
    failures++;
    printf("FAIL %s for M=%d N=%d K=%d trans_a=%d trans_b=%d\n", what, M, N, K, ta, tb);
}

/* cuBLAS's definition, column-major, with LA = our B and LB = our A. */
static void run_plan(const kern_cuda_gemm_plan_t *p, const float *LA, const float *LB, float *D,
                     float alpha, float beta) {
    for (int j = 0; j < p->n; j++)
        for (int i = 0; i < p->m; i++) {
            float acc = 0.0f;
            for (int q = 0; q < p->k; q++) {
                const float a = p->trans_la ? LA[q + (size_t)i * p->lda] : LA[i + (size_t)q * p->lda];
                const float b = p->trans_lb ? LB[j + (size_t)q * p->ldb] : LB[q + (size_t)j * p->ldb];
                acc += a * b;
            }
            float *d = &D[i + (size_t)j * p->ldc];
            *d = alpha * acc + beta * *d;
        }
}

/* gemm.h's definition, row-major. */
static void run_rowmajor(int M, int N, int K, int ta, int tb, const float *A, const float *B, float *C,
                         float alpha, float beta) {
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            float acc = 0.0f;
            for (int q = 0; q < K; q++) {
                const float a = ta ? A[(size_t)q * M + r] : A[(size_t)r * K + q];
                const float b = tb ? B[(size_t)c * K + q] : B[(size_t)q * N + c];
                acc += b * a; /* the plan multiplies LA (ours B) by LB (ours A) */
            }
            float *d = &C[(size_t)r * N + c];
            *d = alpha * acc + beta * *d;
        }
}

static void check(int M, int N, int K, int ta, int tb) {
    const kern_cuda_gemm_plan_t p = kern_cuda_gemm_plan(M, N, K, ta, tb);
    /* cuBLASLt's rules: op(LA) is m x k, op(LB) is k x n, D is m x n, ld >= rows. */
    expect(p.m == N && p.n == M && p.k == K, "problem size", M, N, K, ta, tb);
    expect(p.trans_la ? (p.la_rows == (uint64_t)p.k && p.la_cols == (uint64_t)p.m)
                      : (p.la_rows == (uint64_t)p.m && p.la_cols == (uint64_t)p.k),
           "A layout", M, N, K, ta, tb);
    expect(p.trans_lb ? (p.lb_rows == (uint64_t)p.n && p.lb_cols == (uint64_t)p.k)
                      : (p.lb_rows == (uint64_t)p.k && p.lb_cols == (uint64_t)p.n),
           "B layout", M, N, K, ta, tb);
    expect(p.lc_rows == (uint64_t)p.m && p.lc_cols == (uint64_t)p.n, "C layout", M, N, K, ta, tb);
    expect(p.lda >= (int64_t)p.la_rows && p.ldb >= (int64_t)p.lb_rows && p.ldc >= (int64_t)p.lc_rows,
           "leading dimensions", M, N, K, ta, tb);
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C0 = malloc(nc * 4), *C1 = malloc(nc * 4);
    if (!A || !B || !C0 || !C1) {
        printf("out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < na; i++) A[i] = (float)((i * 7 + 3) % 11) - 5.0f;
    for (size_t i = 0; i < nb; i++) B[i] = (float)((i * 5 + 1) % 13) * 0.25f - 1.5f;
    for (size_t i = 0; i < nc; i++) C0[i] = C1[i] = (float)(i % 7) - 3.0f;
    run_rowmajor(M, N, K, ta, tb, A, B, C0, 0.5f, 2.0f);
    run_plan(&p, B, A, C1, 0.5f, 2.0f);
    expect(memcmp(C0, C1, nc * 4) == 0, "column-major plan differs from the row-major product", M, N,
           K, ta, tb);
    free(A);
    free(B);
    free(C0);
    free(C1);
}

int main(void) {
    static const int sizes[] = {1, 2, 3, 5, 8, 13};
    int cases = 0;
    for (int a = 0; a < 6; a++)
        for (int b = 0; b < 6; b++)
            for (int c = 0; c < 6; c++)
                for (int t = 0; t < 4; t++, cases++) check(sizes[a], sizes[b], sizes[c], t & 1, (t >> 1) & 1);
    printf("gemm_plan_test: %d cases, %d failures\n%s\n", cases, failures, failures ? "FAILED" : "PASSED");
    return failures ? 1 : 0;
}
