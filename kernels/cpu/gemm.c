/* CPU matrix products on OpenBLAS sgemm (see gemm.h for the contract).
 *
 * Two ways to use the machine's cores, chosen by how OpenBLAS is set up:
 * - OpenBLAS threaded (its default: one thread per core): one sgemm call
 *   per product and OpenBLAS splits it. Its idle threads spin (sched_yield)
 *   for a while after each call, so they also hold the other core while the
 *   non-BLAS kernels run; see the report in tools/bench/train_bench.sh.
 * - OpenBLAS single-threaded (openblas_set_num_threads(1) or
 *   OPENBLAS_NUM_THREADS=1): products big enough to pay for waking the pool
 *   are cut into pieces of C (row blocks, or column blocks when C is wide
 *   and short), each one sgemm call, run as tasks on the backend's pool;
 *   a grouped product (the experts of a layer) makes one task list of all
 *   its groups' pieces. Pieces depend only on the shapes, never on the
 *   number of threads, and each writes its own part of C, so the results
 *   are the same for any pool size (and every element of C is summed over K
 *   by one single-threaded sgemm, as a whole product would be). */
#include "kernels/gemm.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/par.h"
#include "base/status.h"

/* OpenBLAS's own query; weak so that another CBLAS still links (then the
 * products are never split: we cannot know whether that BLAS threads). */
int openblas_get_num_threads(void);
#pragma weak openblas_get_num_threads

/* A piece costs one sgemm call (packing its operands); below ~2 MFLOP the
 * call overheads and the pool's wake-up (~10-30 us) eat the gain. At most
 * GEMM_MAX_PIECES pieces per product: enough to balance 2-8 threads. */
#define GEMM_PIECE_FLOPS 2.0e6
#define GEMM_MAX_PIECES 8
#define GEMM_ROW_ALIGN 16

typedef struct {
    float *C;
    const float *A, *B;
    int M, N, K, ldc;
} piece_t;

typedef struct {
    const piece_t *pieces;
    bool ta, tb;
    float alpha, beta;
    const int *lda, *ldb; /* per piece */
} gemm_job_t;

static void sgemm_piece(const piece_t *p, bool ta, bool tb, int lda, int ldb, float alpha,
                        float beta) {
    if (p->M == 0 || p->N == 0) return;
    if (p->K == 0) { /* an empty sum: beta * C */
        for (int r = 0; r < p->M; r++) {
            float *c = p->C + (size_t)r * p->ldc;
            if (beta == 0.0f) memset(c, 0, (size_t)p->N * sizeof *c);
            else if (beta != 1.0f)
                for (int j = 0; j < p->N; j++) c[j] *= beta;
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, p->M,
                p->N, p->K, alpha, p->A, lda, p->B, ldb, beta, p->C, p->ldc);
}

static void piece_task(void *ctx, size_t t) {
    const gemm_job_t *j = ctx;
    sgemm_piece(&j->pieces[t], j->ta, j->tb, j->lda[t], j->ldb[t], j->alpha, j->beta);
}

static bool blas_single_threaded(void) {
    return openblas_get_num_threads && openblas_get_num_threads() == 1;
}

/* How many pieces one product (M, N, K) is cut into, and along which side. */
static int piece_count(int M, int N, int K, bool *by_cols) {
    const double flops = 2.0 * M * (double)N * K;
    int n = (int)(flops / GEMM_PIECE_FLOPS);
    if (n > GEMM_MAX_PIECES) n = GEMM_MAX_PIECES;
    *by_cols = N > M;
    const int side = *by_cols ? N : M;
    const int max_by_side = (side + GEMM_ROW_ALIGN - 1) / GEMM_ROW_ALIGN;
    if (n > max_by_side) n = max_by_side;
    return n < 1 ? 1 : n;
}

/* Appends the pieces of one product to p/lda/ldb; returns how many. */
static int cut(piece_t *p, int *lda, int *ldb, float *C, const float *A, const float *B, int M,
               int N, int K, bool ta, bool tb, int pieces, bool by_cols) {
    const int a_ld = ta ? M : K, b_ld = tb ? K : N;
    const int side = by_cols ? N : M;
    int step = (side + pieces - 1) / pieces;
    step = (step + GEMM_ROW_ALIGN - 1) / GEMM_ROW_ALIGN * GEMM_ROW_ALIGN;
    int n = 0;
    for (int x0 = 0; x0 < side; x0 += step, n++) {
        const int w = side - x0 < step ? side - x0 : step;
        if (by_cols) { /* C[:, x0:x0+w] = op(A) op(B)[:, x0:x0+w] */
            p[n] = (piece_t){.C = C + x0, .A = A, .B = tb ? B + (size_t)x0 * b_ld : B + x0,
                             .M = M, .N = w, .K = K, .ldc = N};
        } else { /* C[x0:x0+w, :] = op(A)[x0:x0+w, :] op(B) */
            p[n] = (piece_t){.C = C + (size_t)x0 * N, .A = ta ? A + x0 : A + (size_t)x0 * a_ld,
                             .B = B, .M = w, .N = N, .K = K, .ldc = N};
        }
        lda[n] = a_ld;
        ldb[n] = b_ld;
    }
    return n;
}

static void run_pieces(kern_stream_t *s, const piece_t *p, const int *lda, const int *ldb, int n,
                       bool ta, bool tb, float alpha, float beta) {
    gemm_job_t j = {.pieces = p, .ta = ta, .tb = tb, .alpha = alpha, .beta = beta, .lda = lda, .ldb = ldb};
    kern_cpu_parallel_for(s, (size_t)n, piece_task, &j);
}

void kern_matmul_cpu(kern_stream_t *s, float *C, const float *A, const float *B, int M, int N,
                     int K, bool trans_a, bool trans_b, float alpha, float beta) {
    bool by_cols = false;
    const int pieces = blas_single_threaded() ? piece_count(M, N, K, &by_cols) : 1;
    if (pieces == 1) {
        const piece_t p = {.C = C, .A = A, .B = B, .M = M, .N = N, .K = K, .ldc = N};
        sgemm_piece(&p, trans_a, trans_b, trans_a ? M : K, trans_b ? K : N, alpha, beta);
        return;
    }
    piece_t p[GEMM_MAX_PIECES];
    int lda[GEMM_MAX_PIECES], ldb[GEMM_MAX_PIECES];
    const int n = cut(p, lda, ldb, C, A, B, M, N, K, trans_a, trans_b, pieces, by_cols);
    run_pieces(s, p, lda, ldb, n, trans_a, trans_b, alpha, beta);
}

void kern_matmul_grouped_cpu(kern_stream_t *s, const kern_gemm_desc_t *descs, int count,
                             bool trans_a, bool trans_b, float alpha, float beta) {
    if (count <= 0) return;
    if (!blas_single_threaded()) {
        for (int g = 0; g < count; g++) {
            const kern_gemm_desc_t *d = &descs[g];
            const piece_t p = {.C = d->C, .A = d->A, .B = d->B, .M = d->M, .N = d->N, .K = d->K, .ldc = d->N};
            sgemm_piece(&p, trans_a, trans_b, trans_a ? d->M : d->K, trans_b ? d->K : d->N, alpha, beta);
        }
        return;
    }
    piece_t *p = malloc((size_t)count * GEMM_MAX_PIECES * sizeof *p);
    int *lda = malloc((size_t)count * GEMM_MAX_PIECES * sizeof *lda);
    int *ldb = malloc((size_t)count * GEMM_MAX_PIECES * sizeof *ldb);
    MT_CHECK(p && lda && ldb, "out of host memory for %d grouped-matmul descriptors", count);
    int n = 0;
    for (int g = 0; g < count; g++) {
        const kern_gemm_desc_t *d = &descs[g];
        if (d->M == 0 || d->N == 0) continue;
        bool by_cols = false;
        const int pieces = piece_count(d->M, d->N, d->K, &by_cols);
        n += cut(p + n, lda + n, ldb + n, d->C, d->A, d->B, d->M, d->N, d->K, trans_a, trans_b,
                 pieces, by_cols);
    }
    run_pieces(s, p, lda, ldb, n, trans_a, trans_b, alpha, beta);
    free(p);
    free(lda);
    free(ldb);
}
