/* CPU matrix products on OpenBLAS sgemm (see gemm.h for the contract).
 * OpenBLAS runs its own threads; these wrappers only translate layouts. */
#include "kernels/gemm.h"

#include <cblas.h>
#include <string.h>

static void matmul_one(float *C, const float *A, const float *B, int M, int N, int K, bool ta,
                       bool tb, float alpha, float beta) {
    if (M == 0 || N == 0) return;
    if (K == 0) { /* an empty sum: beta * C */
        if (beta == 0.0f) memset(C, 0, (size_t)M * (size_t)N * sizeof *C);
        else if (beta != 1.0f)
            for (size_t i = 0; i < (size_t)M * (size_t)N; i++) C[i] *= beta;
        return;
    }
    const int lda = ta ? M : K;
    const int ldb = tb ? K : N;
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, M, N,
                K, alpha, A, lda, B, ldb, beta, C, N);
}

void kern_matmul_cpu(kern_stream_t *s, float *C, const float *A, const float *B, int M, int N,
                     int K, bool trans_a, bool trans_b, float alpha, float beta) {
    (void)s;
    matmul_one(C, A, B, M, N, K, trans_a, trans_b, alpha, beta);
}

void kern_matmul_grouped_cpu(kern_stream_t *s, const kern_gemm_desc_t *descs, int count,
                             bool trans_a, bool trans_b, float alpha, float beta) {
    (void)s;
    for (int g = 0; g < count; g++) {
        const kern_gemm_desc_t *d = &descs[g];
        matmul_one(d->C, d->A, d->B, d->M, d->N, d->K, trans_a, trans_b, alpha, beta);
    }
}
