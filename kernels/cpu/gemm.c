/* The fp32 sgemm calls under the CPU's matrix products (gemm_internal.h's
 * kern_cpu_sgemm_batch): every fp32 product and the SGEMM bf16 path run
 * here; kern_mm's contract is gemm.h's.
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

#include "kernels/cpu/gemm_internal.h"
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

/* One sgemm call: a product, or a piece of one (a block of C's rows or
 * columns, with the operands' leading dimensions of the whole product). */
typedef struct {
    float *C;
    const float *A, *B;
    int M, N, K, lda, ldb, ldc;
    bool ta, tb;
    float alpha, beta;
} piece_t;

static void sgemm_piece(const piece_t *p) {
    if (p->M == 0 || p->N == 0) return;
    if (p->K == 0) { /* an empty sum: beta * C */
        for (int r = 0; r < p->M; r++) {
            float *c = p->C + (size_t)r * p->ldc;
            if (p->beta == 0.0f) memset(c, 0, (size_t)p->N * sizeof *c);
            else if (p->beta != 1.0f)
                for (int j = 0; j < p->N; j++) c[j] *= p->beta;
        }
        return;
    }
    cblas_sgemm(CblasRowMajor, p->ta ? CblasTrans : CblasNoTrans,
                p->tb ? CblasTrans : CblasNoTrans, p->M, p->N, p->K, p->alpha, p->A, p->lda, p->B,
                p->ldb, p->beta, p->C, p->ldc);
}

static void piece_task(void *ctx, size_t t) { sgemm_piece(&((const piece_t *)ctx)[t]); }

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

/* Appends the pieces of one product to p; returns how many. */
static int cut(piece_t *p, const kern_cpu_sgemm_t *g, int pieces, bool by_cols) {
    const int M = g->M, N = g->N, K = g->K;
    const int a_ld = g->ta ? M : K, b_ld = g->tb ? K : N;
    const piece_t whole = {.C = g->C, .A = g->A, .B = g->B, .M = M, .N = N, .K = K, .lda = a_ld,
                           .ldb = b_ld, .ldc = N, .ta = g->ta, .tb = g->tb, .alpha = g->alpha,
                           .beta = g->beta};
    const int side = by_cols ? N : M;
    int step = (side + pieces - 1) / pieces;
    step = (step + GEMM_ROW_ALIGN - 1) / GEMM_ROW_ALIGN * GEMM_ROW_ALIGN;
    int n = 0;
    for (int x0 = 0; x0 < side; x0 += step, n++) {
        const int w = side - x0 < step ? side - x0 : step;
        p[n] = whole;
        if (by_cols) { /* C[:, x0:x0+w] = op(A) op(B)[:, x0:x0+w] */
            p[n].C = g->C + x0;
            p[n].B = g->tb ? g->B + (size_t)x0 * b_ld : g->B + x0;
            p[n].N = w;
        } else { /* C[x0:x0+w, :] = op(A)[x0:x0+w, :] op(B) */
            p[n].C = g->C + (size_t)x0 * N;
            p[n].A = g->ta ? g->A + x0 : g->A + (size_t)x0 * a_ld;
            p[n].M = w;
        }
    }
    return n;
}

void kern_cpu_sgemm_batch(kern_stream_t *s, const kern_cpu_sgemm_t *prods, int count) {
    if (count <= 0) return;
    for (int g = 0; g < count; g++)
        MT_CHECK(prods[g].M >= 0 && prods[g].N >= 0 && prods[g].K >= 0,
                 "matmul: product %d has a negative size M=%d N=%d K=%d", g, prods[g].M,
                 prods[g].N, prods[g].K);
    if (!blas_single_threaded()) { /* OpenBLAS splits each call itself */
        for (int g = 0; g < count; g++) {
            piece_t p;
            cut(&p, &prods[g], 1, false);
            sgemm_piece(&p);
        }
        return;
    }
    piece_t one[GEMM_MAX_PIECES];
    piece_t *p = count == 1 ? one : malloc((size_t)count * GEMM_MAX_PIECES * sizeof *p);
    MT_CHECK(p, "out of host memory for %d grouped-matmul descriptors", count);
    int n = 0;
    for (int g = 0; g < count; g++) {
        const kern_cpu_sgemm_t *d = &prods[g];
        if (d->M == 0 || d->N == 0) continue;
        bool by_cols = false;
        n += cut(p + n, d, piece_count(d->M, d->N, d->K, &by_cols), by_cols);
    }
    kern_cpu_parallel_for(s, (size_t)n, piece_task, p);
    if (p != one) free(p);
}
