/* GPU suite: matrix products (kern_mm, gemm.h) — cuBLASLt against OpenBLAS.
 *
 * Covers fp32 products (F32 operands, F32 compute) in every transpose combination, alpha/beta (beta = 0 must ignore a C
 * full of NaN), empty sums (K = 0), pointers only 4-byte aligned (expert
 * slices of packed buffers), the grouped product over ragged experts with
 * zero-token experts, the bf16-input path with bf16 and fp32 outputs, the
 * experts of a MoE layer in bf16 one by one and as cuBLAS's grouped GEMM
 * (MOETUNE_GROUPED_GEMM=loop and grouped against each other and the CPU
 * twin), and determinism of repeated calls.
 *
 * Tolerance for fp32 products: normwise 1e-5, i.e. max |gpu - cpu| <= 1e-5 *
 * max |cpu|.  Two fp32 GEMMs that differ only in summation order agree to a
 * few 1e-7 here (K <= 512, inputs in [-1, 1)); a TF32 product would be off
 * by ~1e-4, so this tolerance also proves TF32 is off. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "tests/gpu/gpu_test.h"

#define FP32_GEMM_TOL 1e-5f

/* One fp32 product on both devices.  `misalign` floats are skipped at the
 * start of every buffer, so the pointers are only that aligned. */
static void mm_f32_case(gt_ctx_t *t, int M, int N, int K, bool ta, bool tb, float alpha,
                        float beta, int misalign) {
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N, o = (size_t)misalign;
    float *ha = gt_host_rand(t, na + o, 1.0f), *hb = gt_host_rand(t, nb + o, 1.0f);
    float *hc = gt_host_rand(t, nc + o, 1.0f);
    gt_buf_t A = gt_from_host(t, ha, (na + o) * 4, "A"), B = gt_from_host(t, hb, (nb + o) * 4, "B");
    gt_buf_t C = gt_alloc(t, (nc + o) * 4, "C"); /* NaN: must not leak when beta == 0 */
    if (beta != 0.0f) gt_set(t, &C, hc);
    const kern_mm_t pc = kern_mm_make(GT_C(C) + o, GT_C(A) + o, MT_F32, GT_C(B) + o, MT_F32, M, N, K, ta, tb,
                                      alpha, beta, MT_F32);
    const kern_mm_t pg = kern_mm_make(GT_G(C) + o, GT_G(A) + o, MT_F32, GT_G(B) + o, MT_F32, M, N, K, ta, tb,
                                      alpha, beta, MT_F32);
    t->cpu->ops->mm(t->sc, &pc);
    t->gpu->ops->mm(t->sg, &pg);
    char what[160];
    snprintf(what, sizeof what, "mm f32 M=%d N=%d K=%d ta=%d tb=%d alpha=%g beta=%g misalign=%d", M,
             N, K, ta, tb, (double)alpha, (double)beta, misalign);
    /* The skipped prefix is compared too: it must be untouched (NaN both). */
    if (K == 0) gt_check_exact(t, what, &C, C.bytes); /* empty sum: beta * C exactly */
    else gt_check_f32_norm(t, what, &C, nc + o, FP32_GEMM_TOL, 0.0f);
    if (beta == 0.0f && K > 0) {
        float *first = gt_host_alloc(nc + o);
        gt_save_gpu(t, &C, first);
        t->gpu->ops->mm(t->sg, &pg);
        gt_check_same_gpu(t, what, &C, first);
        free(first);
    }
    gt_free(t, &A);
    gt_free(t, &B);
    gt_free(t, &C);
    free(ha);
    free(hb);
    free(hc);
}

/* Experts as a grouped fp32 product: y_e (M_e, N) = x_e (M_e, K) W_e^T (the up
 * projection, trans_b) and dW_e (N, K) (+)= dy_e^T x_e (the weight gradient,
 * trans_a, K = M_e tokens), over packed buffers with ragged M_e. */
static void grouped_case(gt_ctx_t *t, const int *counts, int E, int N, int K, float beta) {
    int m = 0;
    for (int e = 0; e < E; e++) m += counts[e];
    float *hx = gt_host_rand(t, (size_t)m * K + 1, 1.0f), *hw = gt_host_rand(t, (size_t)E * N * K, 1.0f);
    float *hdy = gt_host_rand(t, (size_t)m * N + 1, 1.0f), *hdw = gt_host_rand(t, (size_t)E * N * K, 1.0f);
    gt_buf_t X = gt_from_host(t, hx, ((size_t)m * K + 1) * 4, "x packed");
    gt_buf_t W = gt_from_host(t, hw, (size_t)E * N * K * 4, "W");
    gt_buf_t Y = gt_alloc(t, ((size_t)m * N + 1) * 4, "y packed");
    gt_buf_t DY = gt_from_host(t, hdy, ((size_t)m * N + 1) * 4, "dy packed");
    gt_buf_t DW = gt_alloc(t, (size_t)E * N * K * 4, "dW");
    if (beta != 0.0f) gt_set(t, &DW, hdw);
    kern_mm_t *dc = calloc((size_t)E, sizeof *dc), *dg = calloc((size_t)E, sizeof *dg);
    kern_mm_t *wc = calloc((size_t)E, sizeof *wc), *wg = calloc((size_t)E, sizeof *wg);
    MT_CHECK(dc && dg && wc && wg, "out of host memory allocating product descriptors");
    /* Packed buffers start one float in, so the slices are only 4-byte
     * aligned, as expert slices of the engine's packed buffers are. */
    size_t row = 0;
    for (int e = 0; e < E; e++) {
        const size_t xo = 1 + row * K, yo = 1 + row * N, wo = (size_t)e * N * K;
        dc[e] = kern_mm_make(GT_C(Y) + yo, GT_C(X) + xo, MT_F32, GT_C(W) + wo, MT_F32, counts[e], N, K, false,
                             true, 1.0f, 0.0f, MT_F32);
        dg[e] = kern_mm_make(GT_G(Y) + yo, GT_G(X) + xo, MT_F32, GT_G(W) + wo, MT_F32, counts[e], N, K, false,
                             true, 1.0f, 0.0f, MT_F32);
        wc[e] = kern_mm_make(GT_C(DW) + wo, GT_C(DY) + yo, MT_F32, GT_C(X) + xo, MT_F32, N, K, counts[e], true,
                             false, 1.0f, beta, MT_F32);
        wg[e] = kern_mm_make(GT_G(DW) + wo, GT_G(DY) + yo, MT_F32, GT_G(X) + xo, MT_F32, N, K, counts[e], true,
                             false, 1.0f, beta, MT_F32);
        row += (size_t)counts[e];
    }
    t->cpu->ops->mm_grouped(t->sc, dc, E);
    t->gpu->ops->mm_grouped(t->sg, dg, E);
    t->cpu->ops->mm_grouped(t->sc, wc, E);
    t->gpu->ops->mm_grouped(t->sg, wg, E);
    char what[160];
    snprintf(what, sizeof what, "mm_grouped f32 up-proj E=%d N=%d K=%d", E, N, K);
    /* Y[0] belongs to no expert: it must stay NaN on both, which the
     * comparison accepts only if both are NaN. */
    gt_check_f32_norm(t, what, &Y, (size_t)m * N + 1, FP32_GEMM_TOL, 0.0f);
    snprintf(what, sizeof what, "mm_grouped f32 weight-grad beta=%g (zero-token experts: %s)",
             (double)beta, beta == 0.0f ? "zeroed" : "unchanged");
    gt_check_f32_norm(t, what, &DW, (size_t)E * N * K, FP32_GEMM_TOL, 0.0f);
    gt_free(t, &X);
    gt_free(t, &W);
    gt_free(t, &Y);
    gt_free(t, &DY);
    gt_free(t, &DW);
    free(dc);
    free(dg);
    free(wc);
    free(wg);
    free(hx);
    free(hw);
    free(hdy);
    free(hdw);
}

/* bf16 inputs, fp32 accumulation: kern_mm with bf16 compute on operands
 * stored BF16 (on the GPU one cuBLASLt call, into a BF16 or F32 C), against
 * the CPU's fp32 product of the same bf16 values widened to fp32. */
static void bf16_case(gt_ctx_t *t, int M, int N, int K, bool ta, bool tb, mt_dtype_t c_dt) {
    const size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N;
    float *ha = gt_host_rand(t, na, 1.0f), *hb = gt_host_rand(t, nb, 1.0f);
    uint16_t *ha16 = gt_host_bytes(na * 2), *hb16 = gt_host_bytes(nb * 2);
    mt_convert_from_f32(ha16, MT_BF16, ha, na);
    mt_convert_from_f32(hb16, MT_BF16, hb, nb);
    mt_convert_to_f32(ha, ha16, MT_BF16, na); /* the exact values the GPU multiplies */
    mt_convert_to_f32(hb, hb16, MT_BF16, nb);
    gt_buf_t A = gt_from_host(t, ha, na * 4, "A"), B = gt_from_host(t, hb, nb * 4, "B");
    gt_buf_t A16 = gt_from_host(t, ha16, na * 2, "A bf16"), B16 = gt_from_host(t, hb16, nb * 2, "B bf16");
    gt_buf_t C = gt_alloc(t, nc * 4, "C"), C16 = gt_alloc(t, nc * mt_dtype_size(c_dt), "C out");
    const kern_mm_t pc = kern_mm_make(GT_C(C), GT_C(A), MT_F32, GT_C(B), MT_F32, M, N, K, ta, tb, 1.0f, 0.0f, MT_F32);
    kern_mm_t pg = kern_mm_make(C16.g, A16.g, MT_BF16, B16.g, MT_BF16, M, N, K, ta, tb, 1.0f, 0.0f, MT_BF16);
    pg.C.dtype = c_dt;
    t->cpu->ops->mm(t->sc, &pc);
    t->gpu->ops->mm(t->sg, &pg);
    float *ref = gt_host_alloc(nc), *got = gt_host_alloc(nc);
    void *raw = gt_host_bytes(C16.bytes);
    gt_download(t, &C, ref, NULL);
    gt_download(t, &C16, NULL, raw);
    mt_convert_to_f32(got, raw, c_dt, nc);
    double refmax = 0.0;
    for (size_t i = 0; i < nc; i++) refmax = fmax(refmax, fabs(ref[i]));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < nc; i++) {
        double lim;
        if (c_dt == MT_BF16) {
            /* The fp32 sums differ only in order (~1e-6 relative), but the
             * final rounding to bf16 can then land one bf16 ulp (2^-8
             * relative) apart: allow 2^-7 of the value, plus a sliver of
             * the output's scale for sums that cancel to near zero. */
            lim = ldexp(fabs(ref[i]), -7) + 1e-5 * refmax;
        } else {
            lim = FP32_GEMM_TOL * refmax; /* products of bf16 values are exact in fp32 */
        }
        if (!isfinite(got[i]) || fabs((double)got[i] - ref[i]) > lim) {
            if (!bad++) first = i;
        }
    }
    gt_expect(t, bad == 0, "mm bf16 M=%d N=%d K=%d ta=%d tb=%d -> %s: %zu bad, first at %zu cpu %.7g gpu %.7g",
              M, N, K, ta, tb, mt_dtype_name(c_dt), bad, first, (double)ref[first], (double)got[first]);
    if (!bad) printf("ok   mm bf16 M=%d N=%d K=%d ta=%d tb=%d -> %s\n", M, N, K, ta, tb, mt_dtype_name(c_dt));
    gt_free(t, &A);
    gt_free(t, &B);
    gt_free(t, &A16);
    gt_free(t, &B16);
    gt_free(t, &C);
    gt_free(t, &C16);
    free(ha);
    free(hb);
    free(ha16);
    free(hb16);
    free(ref);
    free(got);
    free(raw);
}

/* ---- The experts of a MoE layer in bf16: one product at a time against
 * cuBLAS's grouped GEMM (kern_mm_grouped_cuda, MOETUNE_GROUPED_GEMM) against
 * the CPU twin.
 *
 * The three products per expert e the layer issues, with x, W and dy
 * stored BF16 and bf16 compute (fp32 accumulation):
 *   forward  y_e (M_e, N)  = x_e (M_e, K) W_e^T   (trans_b, beta 0, C out_dt)
 *   dX       dx_e (M_e, K) = dy_e (M_e, N) W_e    (no transpose, beta 0, C out_dt)
 *   dW       dW_e (N, K)  += dy_e^T x_e           (trans_a, beta 1, C F32: the
 *                                                   accumulated gradient),
 *            or with out_dt BF16 dW_e = dy_e^T x_e (beta 0, C BF16: a bf16
 *                                                   run writes it so, then
 *                                                   adds it to its fp32
 *                                                   accumulator)
 * over packed buffers with ragged M_e, zero-token experts among them (their
 * forward and dX are skipped, their dW is an empty sum that leaves dW_e as
 * it was).  The reference is the CPU's fp32 product of the same bf16 values
 * widened to fp32 (exact: a product of two bf16 is exact in fp32).
 *
 * Tolerances: F32 outputs normwise 1e-5 (FP32_GEMM_TOL: the three results
 * differ only in the order of fp32 sums, K <= 129 terms in [-1, 1)); BF16
 * outputs 2^-7 of the value plus 1e-5 of the output's largest magnitude (a
 * once-rounded bf16 may land one ulp, 2^-8 relative, apart after sums that
 * differ in order).  Loop and grouped are held to the same bound against
 * each other, and the grouped call repeated must give the same bits.  A NaN in one result must be a NaN in the other: the first
 * element of each packed output belongs to no expert and stays NaN. */

typedef struct {
    const char *name;
    size_t n;          /* elements, the unowned first one included */
    mt_dtype_t dt;     /* of the GPU output */
    float *ref;        /* CPU twin, fp32 */
    float *got[3];     /* GPU: loop, grouped, grouped again (widened to fp32) */
} moe_out_t;

static void moe_compare(gt_ctx_t *t, const char *what, const moe_out_t *o, const float *a, const float *b) {
    double big = 0.0;
    for (size_t i = 0; i < o->n; i++)
        if (isfinite(a[i])) big = fmax(big, fabs(a[i]));
    size_t bad = 0, first = 0;
    for (size_t i = 0; i < o->n; i++) {
        const bool nan_a = isnan(a[i]), nan_b = isnan(b[i]);
        const double lim = o->dt == MT_BF16 ? ldexp(fabs(a[i]), -7) + 1e-5 * big : FP32_GEMM_TOL * big;
        const bool ok = nan_a || nan_b ? nan_a && nan_b : isfinite(b[i]) && fabs((double)a[i] - b[i]) <= lim;
        if (!ok && !bad++) first = i;
    }
    gt_expect(t, bad == 0, "%s %s: %zu of %zu elements off, first at %zu: %.7g vs %.7g", what, o->name, bad, o->n,
              first, (double)a[first], (double)b[first]);
    if (!bad) printf("ok   %s %s\n", what, o->name);
}

/* x, W, dy stored BF16 on the GPU, their fp32 widenings on the CPU. */
typedef struct {
    gt_buf_t f32, b16;
} moe_in_t;

static moe_in_t moe_input(gt_ctx_t *t, size_t n, const char *tag) {
    float *h = gt_host_rand(t, n, 1.0f);
    uint16_t *h16 = gt_host_bytes(n * 2);
    mt_convert_from_f32(h16, MT_BF16, h, n);
    mt_convert_to_f32(h, h16, MT_BF16, n);
    moe_in_t in = {gt_from_host(t, h, n * 4, tag), gt_from_host(t, h16, n * 2, tag)};
    free(h);
    free(h16);
    return in;
}

static void moe_bf16_case(gt_ctx_t *t, const int *counts, int E, int N, int K, mt_dtype_t out_dt) {
    int m = 0;
    for (int e = 0; e < E; e++) m += counts[e];
    moe_in_t X = moe_input(t, (size_t)m * K, "x"), W = moe_input(t, (size_t)E * N * K, "W");
    moe_in_t DY = moe_input(t, (size_t)m * N, "dy");
    const size_t osz = mt_dtype_size(out_dt);
    float *hdw = gt_host_rand(t, (size_t)E * N * K, 1.0f);
    moe_out_t out[3] = {{"forward x W^T", 1 + (size_t)m * N, out_dt, NULL, {NULL, NULL, NULL}},
                        {"dX = dy W", 1 + (size_t)m * K, out_dt, NULL, {NULL, NULL, NULL}},
                        {out_dt == MT_BF16 ? "dW = dy^T x" : "dW += dy^T x", (size_t)E * N * K, out_dt, NULL,
                         {NULL, NULL, NULL}}};
    const float dw_beta = out_dt == MT_BF16 ? 0.0f : 1.0f;
    /* the CPU's outputs are fp32; the GPU writes forward and dX as out_dt */
    gt_buf_t Y = gt_alloc(t, out[0].n * 4, "y"), DX = gt_alloc(t, out[1].n * 4, "dx");
    gt_buf_t DW = gt_alloc(t, out[2].n * 4, "dW");
    kern_mm_t *mm = calloc((size_t)E * 6, sizeof *mm);
    MT_CHECK_ALLOC(mm, "product descriptors");
    kern_mm_t *cpu = mm, *gpu = mm + 3 * E; /* per side: forward, dX, dW, E each */
    size_t row = 0;
    for (int e = 0; e < E; e++) {
        const int me = counts[e];
        const size_t xo = row * K, yo = row * N, wo = (size_t)e * N * K;
        for (int side = 0; side < 2; side++) {
            kern_mm_t *d = side ? gpu : cpu;
            const bool g = side == 1;
            char *x = g ? (char *)X.b16.g + xo * 2 : (char *)X.f32.c + xo * 4;
            char *w = g ? (char *)W.b16.g + wo * 2 : (char *)W.f32.c + wo * 4;
            char *dy = g ? (char *)DY.b16.g + yo * 2 : (char *)DY.f32.c + yo * 4;
            const mt_dtype_t in_dt = g ? MT_BF16 : MT_F32, cmp = g ? MT_BF16 : MT_F32, o_dt = g ? out_dt : MT_F32;
            char *y = (char *)(g ? Y.g : Y.c) + (1 + yo) * (g ? osz : 4);
            char *dx = (char *)(g ? DX.g : DX.c) + (1 + xo) * (g ? osz : 4);
            d[e] = kern_mm_make((float *)y, x, in_dt, w, in_dt, me, N, K, false, true, 1.0f, 0.0f, cmp);
            d[E + e] = kern_mm_make((float *)dx, dy, in_dt, w, in_dt, me, K, N, false, false, 1.0f, 0.0f, cmp);
            char *dw = (char *)(g ? DW.g : DW.c) + wo * (g ? osz : 4);
            d[2 * E + e] = kern_mm_make((float *)dw, dy, in_dt, x, in_dt, N, K, me,
                                        true, false, 1.0f, dw_beta, cmp);
            d[e].C.dtype = d[E + e].C.dtype = d[2 * E + e].C.dtype = o_dt;
        }
        row += (size_t)me;
    }
    gt_buf_t *bufs[3] = {&Y, &DX, &DW};
    static const char *modes[3] = {"loop", "grouped", "grouped"};
    for (int md = 0; md <= 3; md++) { /* loop, grouped twice on the GPU; then the CPU twin */
        gt_poison(t, &Y);
        gt_poison(t, &DX);
        gt_set(t, &DW, hdw);
        if (md < 3) setenv("MOETUNE_GROUPED_GEMM", modes[md], 1);
        for (int k = 0; k < 3; k++) {
            if (md < 3) t->gpu->ops->mm_grouped(t->sg, gpu + k * E, E);
            else t->cpu->ops->mm_grouped(t->sc, cpu + k * E, E);
        }
        for (int k = 0; k < 3; k++) {
            float *dst = gt_host_alloc(out[k].n);
            if (md == 3) {
                gt_download(t, bufs[k], dst, NULL);
                out[k].ref = dst;
                continue;
            }
            void *raw = gt_host_bytes(out[k].n * 4);
            gt_download(t, bufs[k], NULL, raw);
            mt_convert_to_f32(dst, raw, out[k].dt, out[k].n);
            free(raw);
            out[k].got[md] = dst;
        }
    }
    unsetenv("MOETUNE_GROUPED_GEMM");
    char what[160];
    for (int k = 0; k < 3; k++) {
        snprintf(what, sizeof what, "experts bf16 E=%d N=%d K=%d -> %s:", E, N, K, mt_dtype_name(out[k].dt));
        moe_compare(t, what, &out[k], out[k].ref, out[k].got[0]);
        snprintf(what, sizeof what, "experts bf16 E=%d N=%d K=%d -> %s, grouped vs cpu:", E, N, K,
                 mt_dtype_name(out[k].dt));
        moe_compare(t, what, &out[k], out[k].ref, out[k].got[1]);
        snprintf(what, sizeof what, "experts bf16 E=%d N=%d K=%d -> %s, grouped vs loop:", E, N, K,
                 mt_dtype_name(out[k].dt));
        moe_compare(t, what, &out[k], out[k].got[0], out[k].got[1]);
        gt_expect(t, memcmp(out[k].got[1], out[k].got[2], out[k].n * 4) == 0,
                  "experts bf16 E=%d N=%d K=%d -> %s: %s grouped twice differs", E, N, K, mt_dtype_name(out[k].dt),
                  out[k].name);
        free(out[k].got[2]);
        free(out[k].ref);
        free(out[k].got[0]);
        free(out[k].got[1]);
    }
    gt_free(t, &X.f32), gt_free(t, &X.b16), gt_free(t, &W.f32), gt_free(t, &W.b16);
    gt_free(t, &DY.f32), gt_free(t, &DY.b16), gt_free(t, &Y), gt_free(t, &DX), gt_free(t, &DW);
    free(mm);
    free(hdw);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "gemm_test", 0x6e6d);
    static const int shapes[][3] = {{1, 1, 1}, {3, 5, 7}, {37, 53, 19}, {128, 96, 512}, {257, 130, 64}};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int tr = 0; tr < 4; tr++) {
            const int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
            mm_f32_case(&t, M, N, K, tr & 1, tr & 2, 1.0f, 0.0f, 0);
            mm_f32_case(&t, M, N, K, tr & 1, tr & 2, 0.5f, 1.0f, 0);
            mm_f32_case(&t, M, N, K, tr & 1, tr & 2, 1.0f, 0.0f, 1);
        }
    mm_f32_case(&t, 4, 5, 0, false, false, 1.0f, 0.0f, 0);
    mm_f32_case(&t, 4, 5, 0, false, true, 1.0f, 1.0f, 0);
    mm_f32_case(&t, 4, 5, 0, true, false, 1.0f, 0.5f, 0);
    mm_f32_case(&t, 0, 5, 3, false, false, 1.0f, 0.0f, 0);

    static const int ragged[] = {5, 0, 17, 1, 0, 33, 2, 0};
    grouped_case(&t, ragged, 8, 24, 40, 0.0f);
    grouped_case(&t, ragged, 8, 24, 40, 1.0f);
    static const int big[] = {64, 0, 129, 7};
    grouped_case(&t, big, 4, 96, 128, 0.0f);

    /* the fp32 experts above ran as MOETUNE_GROUPED_GEMM left them (auto: grouped) */
    for (int dt = 0; dt < 2; dt++) {
        const mt_dtype_t out_dt = dt ? MT_BF16 : MT_F32;
        moe_bf16_case(&t, ragged, 8, 24, 40, out_dt);
        moe_bf16_case(&t, big, 4, 96, 128, out_dt);
        static const int odd[] = {3, 0, 9, 1}; /* odd K and N: slices only 2-byte aligned */
        moe_bf16_case(&t, odd, 4, 21, 37, out_dt);
    }

    for (int tr = 0; tr < 4; tr++) {
        bf16_case(&t, 64, 48, 256, tr & 1, tr & 2, MT_BF16);
        bf16_case(&t, 33, 17, 100, tr & 1, tr & 2, MT_F32);
    }
    return gt_close(&t);
}
