/* GPU suite: typed matrix products (kern_mm, gemm.h) — the CUDA twin
 * against the CPU twin, through both kernel tables.
 *
 * Covers bf16 and fp32 compute; operands stored F32 (rounded to bf16 in
 * scratch under bf16 compute) and BF16; C in F32 and BF16 (fp32 compute
 * into a BF16 C goes through an fp32 copy); every transpose combination;
 * beta 0 over a C full of NaN and beta 1; empty sums (K = 0, also with
 * beta 0.5 on a BF16 C); a grouped call over ragged products with empty
 * ones; determinism of repeated GPU calls.
 *
 * On a GPU this runs cuBLASLt; in the emulator build (mm_test_emu) the
 * routing of kernels/cuda/gemm_mm_cuda.c runs unchanged and cuBLASLt's
 * product is stood in for by the CPU's convert + sgemm path.
 *
 * Tolerances.  Both sides multiply the same bf16 (or fp32) values exactly
 * and sum in fp32, in different orders: an F32 C agrees normwise to 1e-5
 * (as tests/gpu/gemm_test; sums of <= 300 terms in [-1, 1) differ by a few
 * 1e-7).  A BF16 C is that value rounded to bf16 on each side, and two fp32
 * values a few 1e-7 apart can round to neighbouring bf16 values: one bf16
 * ulp, 2^-7 relative, plus the normwise 1e-5 for elements near zero. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "tests/gpu/gpu_test.h"

#define F32_TOL 1e-5f
#define BF16_ULP 0x1p-7f

typedef struct {
    gt_buf_t buf;
    mt_dtype_t dt;
    int rows, cols;
} tmat_t;

static tmat_t tmat(gt_ctx_t *t, int rows, int cols, mt_dtype_t dt, bool nan, const char *tag) {
    /* one element at least: an empty matrix still gets a buffer */
    const size_t n = (size_t)rows * cols > 0 ? (size_t)rows * cols : 1;
    float *h = gt_host_rand(t, n, 1.0f);
    tmat_t m = {.dt = dt, .rows = rows, .cols = cols};
    if (dt == MT_BF16) {
        uint16_t *hb = gt_host_bytes(n * 2);
        for (size_t i = 0; i < n; i++) hb[i] = mt_f32_to_bf16(h[i]);
        m.buf = nan ? gt_alloc(t, n * 2, tag) : gt_from_host(t, hb, n * 2, tag);
        free(hb);
    } else {
        m.buf = nan ? gt_alloc(t, n * 4, tag) : gt_from_host(t, h, n * 4, tag);
    }
    free(h);
    return m;
}

static kern_mat_t view(const tmat_t *m, bool gpu) {
    return (kern_mat_t){gpu ? m->buf.g : m->buf.c, m->dt, m->rows, m->cols};
}

/* C on both devices: F32 normwise, BF16 within one ulp (see the top). */
static void check_c(gt_ctx_t *t, const char *what, const tmat_t *C) {
    const size_t n = (size_t)C->rows * C->cols;
    if (C->dt == MT_F32) {
        gt_check_f32_norm(t, what, &C->buf, n, F32_TOL, 0.0f);
        return;
    }
    uint16_t *hc = gt_host_bytes(C->buf.bytes), *hg = gt_host_bytes(C->buf.bytes);
    gt_download(t, &C->buf, hc, hg);
    double scale = 0;
    for (size_t i = 0; i < n; i++) scale = fmax(scale, fabs(mt_bf16_to_f32(hc[i])));
    size_t bad = 0, worst = 0;
    double worst_d = 0;
    for (size_t i = 0; i < n; i++) {
        const double c = mt_bf16_to_f32(hc[i]), g = mt_bf16_to_f32(hg[i]);
        const double d = fabs(g - c);
        if (!(d <= BF16_ULP * fabs(c) + F32_TOL * scale)) {
            if (!bad || d > worst_d) worst = i, worst_d = d;
            bad++;
        }
    }
    gt_expect(t, bad == 0, "%s: %zu of %zu bf16 elements differ by more than an ulp (worst [%zu]: cpu %g gpu %g)",
              what, bad, n, worst, (double)mt_bf16_to_f32(hc[worst]), (double)mt_bf16_to_f32(hg[worst]));
    free(hc);
    free(hg);
}

static void mm_case(gt_ctx_t *t, int M, int N, int K, bool ta, bool tb, mt_dtype_t a_dt,
                    mt_dtype_t b_dt, mt_dtype_t c_dt, mt_dtype_t compute, float beta) {
    tmat_t A = tmat(t, ta ? K : M, ta ? M : K, a_dt, false, "A");
    tmat_t B = tmat(t, tb ? N : K, tb ? K : N, b_dt, false, "B");
    tmat_t C = tmat(t, M, N, c_dt, beta == 0.0f, "C");
    kern_mm_t p = {.A = view(&A, false), .B = view(&B, false), .C = view(&C, false),
                   .trans_a = ta, .trans_b = tb, .alpha = 0.75f, .beta = beta, .compute = compute};
    t->cpu->ops->mm(t->sc, &p);
    p.A = view(&A, true), p.B = view(&B, true), p.C = view(&C, true);
    t->gpu->ops->mm(t->sg, &p);
    char what[200];
    snprintf(what, sizeof what, "mm M=%d N=%d K=%d ta=%d tb=%d A %s B %s C %s compute %s beta=%g",
             M, N, K, ta, tb, mt_dtype_name(a_dt), mt_dtype_name(b_dt), mt_dtype_name(c_dt),
             mt_dtype_name(compute), (double)beta);
    if (K == 0) gt_check_exact(t, what, &C.buf, C.buf.bytes); /* beta * C, exactly */
    else check_c(t, what, &C);
    if (beta == 0.0f && K > 0) { /* the same call again: the same bits */
        void *first = gt_host_bytes(C.buf.bytes);
        gt_save_gpu(t, &C.buf, first);
        t->gpu->ops->mm(t->sg, &p);
        gt_check_same_gpu(t, what, &C.buf, first);
        free(first);
    }
    gt_free(t, &A.buf);
    gt_free(t, &B.buf);
    gt_free(t, &C.buf);
}

static void test_single(gt_ctx_t *t) {
    static const mt_dtype_t ab[][2] = {{MT_F32, MT_F32}, {MT_BF16, MT_BF16}, {MT_F32, MT_BF16},
                                       {MT_BF16, MT_F32}};
    static const int shapes[][3] = {{5, 7, 3}, {33, 17, 64}, {64, 96, 257}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int tr = 0; tr < 4; tr++)
            for (int ci = 0; ci < 2; ci++)
                for (int bi = 0; bi < 2; bi++) {
                    const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    const mt_dtype_t c_dt = ci ? MT_BF16 : MT_F32;
                    for (size_t d = 0; d < 4; d++)
                        mm_case(t, M, N, K, tr & 1, tr >> 1, ab[d][0], ab[d][1], c_dt, MT_BF16,
                                (float)bi);
                    mm_case(t, M, N, K, tr & 1, tr >> 1, MT_F32, MT_F32, c_dt, MT_F32, (float)bi);
                }
    for (int ci = 0; ci < 2; ci++) { /* empty sums */
        const mt_dtype_t c_dt = ci ? MT_BF16 : MT_F32;
        mm_case(t, 6, 9, 0, false, true, MT_F32, MT_BF16, c_dt, MT_BF16, 0.0f);
        mm_case(t, 6, 9, 0, false, true, MT_F32, MT_BF16, c_dt, MT_BF16, 1.0f);
        mm_case(t, 6, 9, 0, false, false, MT_F32, MT_F32, c_dt, MT_F32, 1.0f);
    }
    /* beta 0.5 on a BF16 C with K = 0: through the fp32 copy on the GPU;
     * 0.5 * a bf16 value is exact, so both sides agree bit for bit */
    mm_case(t, 6, 9, 0, false, false, MT_BF16, MT_BF16, MT_BF16, MT_BF16, 0.5f);
}

/* Experts: y_e = x_e W_e^T over ragged token counts, x F32 activations,
 * W BF16 weights, y BF16; empty experts skipped. */
static void test_grouped(gt_ctx_t *t) {
    enum { E = 5 };
    const int Ms[E] = {12, 0, 70, 1, 33}, N = 48, K = 40;
    tmat_t X[E], W[E], Y[E];
    kern_mm_t pc[E], pg[E];
    for (int e = 0; e < E; e++) {
        X[e] = tmat(t, Ms[e], K, MT_F32, false, "x");
        W[e] = tmat(t, N, K, MT_BF16, false, "W");
        Y[e] = tmat(t, Ms[e], N, e % 2 ? MT_F32 : MT_BF16, true, "y");
        pc[e] = (kern_mm_t){.C = view(&Y[e], false), .A = view(&X[e], false),
                            .B = view(&W[e], false), .trans_b = true, .alpha = 1.0f,
                            .compute = MT_BF16};
        pg[e] = pc[e];
        pg[e].C = view(&Y[e], true), pg[e].A = view(&X[e], true), pg[e].B = view(&W[e], true);
    }
    t->cpu->ops->mm_grouped(t->sc, pc, E);
    t->gpu->ops->mm_grouped(t->sg, pg, E);
    for (int e = 0; e < E; e++) {
        char what[96];
        snprintf(what, sizeof what, "mm_grouped expert %d (M=%d, y %s)", e, Ms[e],
                 mt_dtype_name(Y[e].dt));
        if (Ms[e] == 0) gt_check_exact(t, what, &Y[e].buf, Y[e].buf.bytes); /* untouched NaN */
        else check_c(t, what, &Y[e]);
        gt_free(t, &X[e].buf);
        gt_free(t, &W[e].buf);
        gt_free(t, &Y[e].buf);
    }
}

/* Products whose bf16 roundings or fp32 copy of C need more than the
 * stream's scratch run in pieces (kernels/cuda/gemm_mm_cuda.c): along M
 * (A not transposed: an lm_head's input gradient) and along K (A
 * transposed, B not: a weight gradient over many tokens).  Shapes are
 * sized to need more than the scratch: the GPU's 64 MiB, or the
 * emulator's MOETUNE_EMU_SCRATCH_BYTES (mm_pieces_test_emu runs this
 * alone on 64 KiB).  Pieces along K add into C in another order than one
 * product: the F32 tolerance covers it (sums of up to 12288 terms). */
static void test_pieces(gt_ctx_t *t, size_t scratch) {
    const int K1 = 64, N1 = 48;
    const int M1 = (int)(2.5 * (double)scratch / (2.0 * K1));
    mm_case(t, M1, N1, K1, false, true, MT_F32, MT_BF16, MT_F32, MT_BF16, 0.0f);
    mm_case(t, M1, N1, K1, false, false, MT_F32, MT_F32, MT_BF16, MT_BF16, 1.0f);
    mm_case(t, M1 / 2, N1, K1, false, true, MT_F32, MT_F32, MT_BF16, MT_F32, 1.0f);
    /* K of 12288 on the GPU: longer sums part fp32 accumulation orders by
     * more than the tolerance (seen at 82k terms) */
    const bool gpu = scratch >= (64u << 20);
    const int M2 = gpu ? 2048 : 16, N2 = M2;
    const int K2 = gpu ? 12288 : (int)(2.5 * (double)scratch / (2.0 * (M2 + N2)));
    mm_case(t, M2, N2, K2, true, false, MT_F32, MT_F32, MT_F32, MT_BF16, 1.0f);
    mm_case(t, M2, N2, K2, true, false, MT_F32, MT_BF16, MT_BF16, MT_BF16, 1.0f);
    mm_case(t, M2, N2, K2, true, false, MT_BF16, MT_F32, MT_BF16, MT_BF16, 0.0f);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "mm_test", 81);
#ifdef GT_EMULATE
    const char *env = getenv("MOETUNE_EMU_SCRATCH_BYTES");
    if (env && *env) { /* the pieces alone, on a small scratch */
        test_pieces(&t, (size_t)strtoull(env, NULL, 10));
        return gt_close(&t);
    }
#endif
    test_single(&t);
    test_grouped(&t);
#ifndef GT_EMULATE
    test_pieces(&t, (size_t)64 << 20); /* KERN_CUDA_SCRATCH_COMPUTE_BYTES */
#endif
    return gt_close(&t);
}
