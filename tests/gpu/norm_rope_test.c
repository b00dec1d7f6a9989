/* GPU suite: RMSNorm forward/backward and RoPE forward/backward.
 *
 * Tolerances and why:
 *  - rmsnorm y, rstd, dx: both sides sum the row in double and apply the
 *    same fp32 formula; only the double summation order differs, which can
 *    move the rounded float by 1 ulp: rtol 2e-6 (~16 ulp) with a small atol
 *    for dx elements that cancel to near zero;
 *  - rmsnorm dw accumulates over rows in fp32 in a different order (chunked
 *    on the GPU, sequential on the CPU): rtol 1e-5, atol 1e-5 * rows^0.5;
 *  - rope: the same four products and two sums per pair in the same order,
 *    no fused multiply-add on the GPU (--fmad=false): bit-identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/rope.h"
#include "tests/gpu/gpu_test.h"

static void rmsnorm_case(gt_ctx_t *t, int rows, int dim, float scale) {
    const size_t n = (size_t)rows * dim;
    float *hx = gt_host_rand(t, n, scale), *hw = gt_host_rand(t, (size_t)dim, 1.5f);
    float *hdy = gt_host_rand(t, n, 1.0f), *hdw = gt_host_rand(t, (size_t)dim, 1.0f);
    gt_buf_t X = gt_from_host(t, hx, n * 4, "x"), W = gt_from_host(t, hw, (size_t)dim * 4, "w");
    gt_buf_t Y = gt_alloc(t, n * 4, "y"), R = gt_alloc(t, (size_t)rows * 4, "rstd");
    gt_buf_t DY = gt_from_host(t, hdy, n * 4, "dy"), DX = gt_alloc(t, n * 4, "dx");
    gt_buf_t DW = gt_from_host(t, hdw, (size_t)dim * 4, "dw"); /* accumulated into */
    const float eps = 1e-6f;
    t->cpu->ops->rmsnorm_fwd(t->sc, GT_C(Y), GT_C(R), GT_C(X), GT_C(W), rows, dim, eps);
    t->gpu->ops->rmsnorm_fwd(t->sg, GT_G(Y), GT_G(R), GT_G(X), GT_G(W), rows, dim, eps);
    char what[128];
    snprintf(what, sizeof what, "rmsnorm_fwd y rows=%d dim=%d", rows, dim);
    gt_check_f32(t, what, &Y, n, 1e-7f, 2e-6f);
    snprintf(what, sizeof what, "rmsnorm_fwd rstd rows=%d dim=%d", rows, dim);
    gt_check_f32(t, what, &R, (size_t)rows, 0.0f, 2e-6f);
    /* Backward from the CPU's rstd on both sides, so dx/dw test backward only. */
    float *hr = gt_host_alloc((size_t)rows);
    gt_download(t, &R, hr, NULL);
    gt_set(t, &R, hr);
    t->cpu->ops->rmsnorm_bwd(t->sc, GT_C(DX), GT_C(DW), GT_C(DY), GT_C(X), GT_C(W), GT_C(R), rows, dim);
    t->gpu->ops->rmsnorm_bwd(t->sg, GT_G(DX), GT_G(DW), GT_G(DY), GT_G(X), GT_G(W), GT_G(R), rows, dim);
    snprintf(what, sizeof what, "rmsnorm_bwd dx rows=%d dim=%d", rows, dim);
    gt_check_f32(t, what, &DX, n, 1e-6f, 2e-6f);
    snprintf(what, sizeof what, "rmsnorm_bwd dw (accumulate) rows=%d dim=%d", rows, dim);
    gt_check_f32(t, what, &DW, (size_t)dim, 1e-5f * sqrtf((float)rows), 1e-5f);
    /* Determinism of the chunked dw reduction: same start, same bits. */
    float *first = gt_host_alloc((size_t)dim);
    gt_save_gpu(t, &DW, first);
    gt_set(t, &DW, hdw);
    t->gpu->ops->rmsnorm_bwd(t->sg, GT_G(DX), GT_G(DW), GT_G(DY), GT_G(X), GT_G(W), GT_G(R), rows, dim);
    gt_check_same_gpu(t, what, &DW, first);
    gt_free(t, &X);
    gt_free(t, &W);
    gt_free(t, &Y);
    gt_free(t, &R);
    gt_free(t, &DY);
    gt_free(t, &DX);
    gt_free(t, &DW);
    free(hx);
    free(hw);
    free(hdy);
    free(hdw);
    free(hr);
    free(first);
}

/* packed: per-token positions restarting at 0 every 7 tokens (a packed
 * row's examples), else NULL (the index in the row). */
static void rope_case_pos(gt_ctx_t *t, int B, int T, int heads, int hd, bool packed) {
    const size_t n = (size_t)B * T * heads * hd, nt = (size_t)T * (hd / 2);
    float *hx = gt_host_rand(t, n, 2.0f);
    float *hcos = gt_host_alloc(nt), *hsin = gt_host_alloc(nt);
    kern_rope_table(hcos, hsin, T, hd, 1e6f);
    gt_buf_t X = gt_from_host(t, hx, n * 4, "x");
    gt_buf_t CS = gt_from_host(t, hcos, nt * 4, "cos"), SN = gt_from_host(t, hsin, nt * 4, "sin");
    int32_t *hpos = malloc((size_t)B * T * sizeof *hpos);
    for (int i = 0; i < B * T; i++) hpos[i] = (i % T) % 7;
    gt_buf_t P = gt_from_host(t, hpos, (size_t)B * T * 4, "pos");
    const int32_t *pc = packed ? GT_CI(P) : NULL, *pg = packed ? GT_GI(P) : NULL;
    char what[128];
    t->cpu->ops->rope_fwd(t->sc, GT_C(X), GT_C(CS), GT_C(SN), pc, B, T, heads, hd);
    t->gpu->ops->rope_fwd(t->sg, GT_G(X), GT_G(CS), GT_G(SN), pg, B, T, heads, hd);
    snprintf(what, sizeof what, "rope_fwd B=%d T=%d heads=%d hd=%d%s", B, T, heads, hd, packed ? " packed" : "");
    gt_check_exact(t, what, &X, X.bytes);
    t->cpu->ops->rope_bwd(t->sc, GT_C(X), GT_C(CS), GT_C(SN), pc, B, T, heads, hd);
    t->gpu->ops->rope_bwd(t->sg, GT_G(X), GT_G(CS), GT_G(SN), pg, B, T, heads, hd);
    snprintf(what, sizeof what, "rope_bwd B=%d T=%d heads=%d hd=%d%s", B, T, heads, hd, packed ? " packed" : "");
    gt_check_exact(t, what, &X, X.bytes);
    /* The backward is the inverse rotation: bwd(fwd(x)) = x up to rounding. */
    float *back = gt_host_alloc(n);
    gt_download(t, &X, NULL, back);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)back[i] - hx[i]));
    gt_expect(t, worst <= 4e-6, "rope bwd(fwd(x)) != x: max |diff| %g (|x| < 2)", worst);
    gt_free(t, &X);
    gt_free(t, &CS);
    gt_free(t, &SN);
    gt_free(t, &P);
    free(hpos);
    free(hx);
    free(hcos);
    free(hsin);
    free(back);
}

static void rope_case(gt_ctx_t *t, int B, int T, int heads, int hd) {
    rope_case_pos(t, B, T, heads, hd, false);
    rope_case_pos(t, B, T, heads, hd, true);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "norm_rope_test", 0x4e52);
    rmsnorm_case(&t, 1, 1, 1.0f);
    rmsnorm_case(&t, 7, 33, 3.0f);
    rmsnorm_case(&t, 300, 128, 1.0f);   /* q/k norm shape: tokens x heads, head_dim */
    rmsnorm_case(&t, 130, 4096, 0.05f); /* hidden size; more rows than one dw chunk */
    rmsnorm_case(&t, 5000, 64, 1.0f);   /* many chunks in the dw column sum */
    rope_case(&t, 1, 1, 1, 2);
    rope_case(&t, 2, 17, 3, 64);
    rope_case(&t, 2, 129, 8, 128);
    return gt_close(&t);
}
