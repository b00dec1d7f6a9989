/* GPU suite: element-wise ops, bias, SwiGLU, sumsq and bf16 conversions.
 *
 * Tolerances and why:
 *  - add, axpy, scale, bias_fwd, f32<->bf16: the same single operation per
 *    element on both sides (no fused multiply-add on the GPU): bit-identical;
 *  - bias_bwd: fp32 column sums in a different order: atol 1e-5 * rows^0.5
 *    (inputs in [-1, 1)) + rtol 1e-5;
 *  - swiglu: device expf is within 2 ulp of glibc's, so sigmoid/silu differ
 *    by a few ulp: rtol 4e-6; dg's factor 1 + g (1 - sig) cancels near
 *    g = -1.28, hence an atol of 1e-6 as well;
 *  - swiglu over bf16 storage: one scalar rule per element on both sides,
 *    exp included (act_math.h's kern_exp_cw), rounded once: bit-identical;
 *  - copy4d: copies and one float add per element: bit-identical;
 *  - sumsq: double accumulation on both sides, rounded once to float: rtol
 *    1e-6 (summation order moves the double by ~1e-16 relative);
 *  - sumsq_many: the CPU as sumsq; on the GPU each tensor's sum is the one
 *    sumsq gives it alone: bit-identical to that;
 *  - add_bf16_many: one exact widening and one add per element:
 *    bit-identical;
 *  - zero_many: zeros where asked, nothing else touched: bit-identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/math/act_math.h"
#include "tests/gpu/gpu_test.h"

static void simple_ops(gt_ctx_t *t, size_t n) {
    float *ha = gt_host_rand(t, n, 3.0f), *hb = gt_host_rand(t, n, 3.0f);
    gt_buf_t A = gt_from_host(t, ha, n * 4, "a"), Bv = gt_from_host(t, hb, n * 4, "b");
    gt_buf_t Y = gt_alloc(t, n * 4, "y");
    char what[96];
    t->cpu->ops->add(t->sc, GT_C(Y), GT_C(A), GT_C(Bv), n);
    t->gpu->ops->add(t->sg, GT_G(Y), GT_G(A), GT_G(Bv), n);
    snprintf(what, sizeof what, "add n=%zu", n);
    gt_check_exact(t, what, &Y, Y.bytes);
    t->cpu->ops->add(t->sc, GT_C(A), GT_C(A), GT_C(Bv), n); /* y aliases a */
    t->gpu->ops->add(t->sg, GT_G(A), GT_G(A), GT_G(Bv), n);
    snprintf(what, sizeof what, "add in place n=%zu", n);
    gt_check_exact(t, what, &A, A.bytes);
    t->cpu->ops->axpy(t->sc, GT_C(Y), -0.37f, GT_C(Bv), n);
    t->gpu->ops->axpy(t->sg, GT_G(Y), -0.37f, GT_G(Bv), n);
    snprintf(what, sizeof what, "axpy n=%zu", n);
    gt_check_exact(t, what, &Y, Y.bytes);
    t->cpu->ops->scale(t->sc, GT_C(Y), 1.0f / 3.0f, n);
    t->gpu->ops->scale(t->sg, GT_G(Y), 1.0f / 3.0f, n);
    snprintf(what, sizeof what, "scale n=%zu", n);
    gt_check_exact(t, what, &Y, Y.bytes);

    gt_buf_t S = gt_alloc(t, 4, "sumsq");
    t->cpu->ops->sumsq(t->sc, GT_C(S), GT_C(Y), n);
    t->gpu->ops->sumsq(t->sg, GT_G(S), GT_G(Y), n);
    snprintf(what, sizeof what, "sumsq n=%zu", n);
    gt_check_f32(t, what, &S, 1, 0.0f, 1e-6f);
    float first;
    gt_save_gpu(t, &S, &first);
    t->gpu->ops->sumsq(t->sg, GT_G(S), GT_G(Y), n);
    gt_check_same_gpu(t, what, &S, &first);
    gt_free(t, &A);
    gt_free(t, &Bv);
    gt_free(t, &Y);
    gt_free(t, &S);
    free(ha);
    free(hb);
}

static void bias_case(gt_ctx_t *t, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    float *hy = gt_host_rand(t, n, 1.0f), *hb = gt_host_rand(t, (size_t)cols, 1.0f);
    float *hdb = gt_host_rand(t, (size_t)cols, 1.0f);
    gt_buf_t Y = gt_from_host(t, hy, n * 4, "y"), Bb = gt_from_host(t, hb, (size_t)cols * 4, "b");
    gt_buf_t DB = gt_from_host(t, hdb, (size_t)cols * 4, "db");
    char what[96];
    t->cpu->ops->bias_fwd(t->sc, GT_C(Y), GT_C(Bb), rows, cols);
    t->gpu->ops->bias_fwd(t->sg, GT_G(Y), GT_G(Bb), rows, cols);
    snprintf(what, sizeof what, "bias_fwd rows=%d cols=%d", rows, cols);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_set(t, &Y, hy);
    t->cpu->ops->bias_bwd(t->sc, GT_C(DB), GT_C(Y), rows, cols);
    t->gpu->ops->bias_bwd(t->sg, GT_G(DB), GT_G(Y), rows, cols);
    snprintf(what, sizeof what, "bias_bwd (accumulate) rows=%d cols=%d", rows, cols);
    gt_check_f32(t, what, &DB, (size_t)cols, 1e-5f * sqrtf((float)rows + 1.0f), 1e-5f);
    float *first = gt_host_alloc((size_t)cols);
    gt_save_gpu(t, &DB, first);
    gt_set(t, &DB, hdb);
    t->gpu->ops->bias_bwd(t->sg, GT_G(DB), GT_G(Y), rows, cols);
    gt_check_same_gpu(t, what, &DB, first);
    gt_free(t, &Y);
    gt_free(t, &Bb);
    gt_free(t, &DB);
    free(hy);
    free(hb);
    free(hdb);
    free(first);
}

static void swiglu_case(gt_ctx_t *t, size_t n) {
    float *hg = gt_host_rand(t, n, 6.0f), *hu = gt_host_rand(t, n, 1.0f), *hdh = gt_host_rand(t, n, 1.0f);
    gt_buf_t G = gt_from_host(t, hg, n * 4, "g"), U = gt_from_host(t, hu, n * 4, "u");
    gt_buf_t DH = gt_from_host(t, hdh, n * 4, "dh"), H = gt_alloc(t, n * 4, "h");
    gt_buf_t DG = gt_alloc(t, n * 4, "dg"), DU = gt_alloc(t, n * 4, "du");
    char what[96];
    t->cpu->ops->swiglu_fwd(t->sc, GT_C(H), GT_C(G), GT_C(U), n);
    t->gpu->ops->swiglu_fwd(t->sg, GT_G(H), GT_G(G), GT_G(U), n);
    snprintf(what, sizeof what, "swiglu_fwd n=%zu", n);
    gt_check_f32(t, what, &H, n, 1e-7f, 4e-6f);
    t->cpu->ops->swiglu_bwd(t->sc, GT_C(DG), GT_C(DU), GT_C(DH), GT_C(G), GT_C(U), n);
    t->gpu->ops->swiglu_bwd(t->sg, GT_G(DG), GT_G(DU), GT_G(DH), GT_G(G), GT_G(U), n);
    snprintf(what, sizeof what, "swiglu_bwd dg n=%zu", n);
    gt_check_f32(t, what, &DG, n, 1e-6f, 4e-6f);
    snprintf(what, sizeof what, "swiglu_bwd du n=%zu", n);
    gt_check_f32(t, what, &DU, n, 1e-7f, 4e-6f);
    /* In place: dg over g and du over u (allowed by elementwise.h). */
    t->cpu->ops->swiglu_bwd(t->sc, GT_C(G), GT_C(U), GT_C(DH), GT_C(G), GT_C(U), n);
    t->gpu->ops->swiglu_bwd(t->sg, GT_G(G), GT_G(U), GT_G(DH), GT_G(G), GT_G(U), n);
    snprintf(what, sizeof what, "swiglu_bwd in place dg n=%zu", n);
    gt_check_f32(t, what, &G, n, 1e-6f, 4e-6f);
    snprintf(what, sizeof what, "swiglu_bwd in place du n=%zu", n);
    gt_check_f32(t, what, &U, n, 1e-7f, 4e-6f);
    gt_buf_t *bufs[] = {&G, &U, &DH, &H, &DG, &DU};
    for (size_t i = 0; i < 6; i++) gt_free(t, bufs[i]);
    free(hg);
    free(hu);
    free(hdh);
}

/* SwiGLU over bf16 g, u, h (the routed experts in a bf16 run), from a bf16
 * dh (the down product's input gradient); g drawn wide so that silu's
 * saturation and its dip near -1.28 are both hit. */
static void swiglu_bf16_case(gt_ctx_t *t, size_t n) {
    float *hg = gt_host_rand(t, n, 8.0f), *hu = gt_host_rand(t, n, 2.0f), *hdh = gt_host_rand(t, n, 1.0f);
    uint16_t *bg = gt_host_bytes(n * 2 + 2), *bu = gt_host_bytes(n * 2 + 2), *bdh = gt_host_bytes(n * 2 + 2);
    for (size_t i = 0; i < n; i++)
        bg[i] = mt_f32_to_bf16(hg[i]), bu[i] = mt_f32_to_bf16(hu[i]), bdh[i] = mt_f32_to_bf16(hdh[i]);
    /* exp's clamps and saturation, subnormals and zeros (no NaN: its
     * payload is the hardware's own, not a rounding) */
    static const uint16_t special[] = {0x42c8, 0xc2c8, 0x7149, 0xf149, 0x0001, 0x8001, 0x0000, 0x8000,
                                       0x42b2, 0xc2d0, 0xbfa4, 0x3f80};
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < n; i++) bg[i] = special[i];
    gt_buf_t G = gt_from_host(t, bg, n * 2, "g"), U = gt_from_host(t, bu, n * 2, "u");
    gt_buf_t DH = gt_from_host(t, bdh, n * 2, "dh"), H = gt_alloc(t, n * 2, "h");
    gt_buf_t DG = gt_alloc(t, n * 2, "dg"), DU = gt_alloc(t, n * 2, "du");
    char what[96];
    t->cpu->ops->swiglu_fwd_bf16(t->sc, GT_CU16(H), GT_CU16(G), GT_CU16(U), n);
    t->gpu->ops->swiglu_fwd_bf16(t->sg, GT_GU16(H), GT_GU16(G), GT_GU16(U), n);
    snprintf(what, sizeof what, "swiglu_fwd_bf16 n=%zu", n);
    gt_check_exact(t, what, &H, H.bytes);
    t->cpu->ops->swiglu_bwd_bf16(t->sc, GT_CU16(DG), GT_CU16(DU), GT_CU16(DH), GT_CU16(G), GT_CU16(U), n);
    t->gpu->ops->swiglu_bwd_bf16(t->sg, GT_GU16(DG), GT_GU16(DU), GT_GU16(DH), GT_GU16(G), GT_GU16(U), n);
    snprintf(what, sizeof what, "swiglu_bwd_bf16 dg n=%zu", n);
    gt_check_exact(t, what, &DG, DG.bytes);
    snprintf(what, sizeof what, "swiglu_bwd_bf16 du n=%zu", n);
    gt_check_exact(t, what, &DU, DU.bytes);
    /* the rule itself, on the CPU's result: within bf16's rounding (2^-8
     * relative, and exp's ulp) of the fp32 formula on the same widened
     * inputs, or 2^-126 absolute where the result is subnormal (bf16 keeps
     * fewer bits there) */
    uint16_t *hc = gt_host_bytes(n * 2 + 2), *hgpu = gt_host_bytes(n * 2 + 2);
    gt_download(t, &H, hc, hgpu);
    size_t off = 0;
    for (size_t i = 0; i < n && !off; i++) {
        const float want = kern_silu(mt_bf16_to_f32(bg[i])) * mt_bf16_to_f32(bu[i]);
        if (fabsf(mt_bf16_to_f32(hc[i]) - want) > fabsf(want) * 0x1.1p-8f + 0x1p-126f) off = i + 1;
    }
    gt_expect(t, !off, "swiglu_fwd_bf16 n=%zu: h[%zu] = %g, the fp32 formula gives %g", n, off ? off - 1 : 0,
              off ? (double)mt_bf16_to_f32(hc[off - 1]) : 0.0,
              off ? (double)(kern_silu(mt_bf16_to_f32(bg[off - 1])) * mt_bf16_to_f32(bu[off - 1])) : 0.0);
    uint16_t *dgc = gt_host_bytes(n * 2 + 2), *dgg = gt_host_bytes(n * 2 + 2);
    gt_download(t, &DG, dgc, dgg);
    /* and the backward's rule: dg within bf16's rounding of the fp32
     * formula (kern_swiglu_bwd_elem) on the widened bf16 dh, g, u; its
     * terms reach |dh u| ~ 2 while dg may cancel towards 0, hence the
     * absolute part (a few fp32 ulps of those terms, exp's included) */
    off = 0;
    for (size_t i = 0; i < n && !off; i++) {
        float want, du_want;
        kern_swiglu_bwd_elem(mt_bf16_to_f32(bdh[i]), mt_bf16_to_f32(bg[i]), mt_bf16_to_f32(bu[i]), &want, &du_want);
        if (fabsf(mt_bf16_to_f32(dgc[i]) - want) > fabsf(want) * 0x1.1p-8f + 0x1p-20f) off = i + 1;
    }
    gt_expect(t, !off, "swiglu_bwd_bf16 n=%zu: dg[%zu] = %g off the fp32 formula", n, off ? off - 1 : 0,
              off ? (double)mt_bf16_to_f32(dgc[off - 1]) : 0.0);
    /* In place: dg over g and du over u (allowed by elementwise.h). */
    t->cpu->ops->swiglu_bwd_bf16(t->sc, GT_CU16(G), GT_CU16(U), GT_CU16(DH), GT_CU16(G), GT_CU16(U), n);
    t->gpu->ops->swiglu_bwd_bf16(t->sg, GT_GU16(G), GT_GU16(U), GT_GU16(DH), GT_GU16(G), GT_GU16(U), n);
    snprintf(what, sizeof what, "swiglu_bwd_bf16 in place dg n=%zu", n);
    gt_check_exact(t, what, &G, G.bytes);
    snprintf(what, sizeof what, "swiglu_bwd_bf16 in place du n=%zu", n);
    gt_check_exact(t, what, &U, U.bytes);
    gt_download(t, &G, hc, hgpu);
    gt_expect(t, n == 0 || memcmp(hc, dgc, n * 2) == 0, "swiglu_bwd_bf16 n=%zu: dg in place differs", n);
    free(hc);
    free(hgpu);
    free(dgc);
    free(dgg);
    gt_buf_t *bufs[] = {&G, &U, &DH, &H, &DG, &DU};
    for (size_t i = 0; i < 6; i++) gt_free(t, bufs[i]);
    free(hg);
    free(hu);
    free(hdh);
    free(bg);
    free(bu);
    free(bdh);
}

/* Dropout: the same mask and the same scaled values on both backends. */
static void dropout_case(gt_ctx_t *t, size_t n, float p) {
    float *hx = gt_host_rand(t, n, 3.0f);
    gt_buf_t X = gt_from_host(t, hx, n * 4, "x"), Y = gt_alloc(t, n * 4, "dropout");
    char what[96];
    t->cpu->ops->dropout(t->sc, GT_C(Y), GT_C(X), n, p, 0x1234abcdull + n);
    t->gpu->ops->dropout(t->sg, GT_G(Y), GT_G(X), n, p, 0x1234abcdull + n);
    snprintf(what, sizeof what, "dropout n=%zu p=%g", n, (double)p);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_free(t, &X);
    gt_free(t, &Y);
    free(hx);
}

/* Conversions: random values plus the cases rounding gets wrong. */
static void convert_case(gt_ctx_t *t, size_t n) {
    float *hx = gt_host_rand(t, n, 1e3f);
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, /* zeros, infs, NaNs */
        0x00000001u, 0x807fffffu, 0x00800000u, 0x7f7fffffu, 0xff7fffffu,             /* subnormals, extremes */
        0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x3f807fffu, 0x7f7f8000u,             /* ties and overflow */
    };
    for (size_t i = 0; i < sizeof special / sizeof special[0] && i < n; i++) memcpy(&hx[i], &special[i], 4);
    gt_buf_t X = gt_from_host(t, hx, n * 4, "x"), H = gt_alloc(t, n * 2, "bf16");
    gt_buf_t Y = gt_alloc(t, n * 4, "back");
    char what[96];
    t->cpu->ops->f32_to_bf16(t->sc, GT_CU16(H), GT_C(X), n);
    t->gpu->ops->f32_to_bf16(t->sg, GT_GU16(H), GT_G(X), n);
    snprintf(what, sizeof what, "f32_to_bf16 n=%zu", n);
    gt_check_exact(t, what, &H, H.bytes);
    t->cpu->ops->bf16_to_f32(t->sc, GT_C(Y), GT_CU16(H), n);
    t->gpu->ops->bf16_to_f32(t->sg, GT_G(Y), GT_GU16(H), n);
    snprintf(what, sizeof what, "bf16_to_f32 n=%zu", n);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_free(t, &X);
    gt_free(t, &H);
    gt_free(t, &Y);
    free(hx);
}

/* clamp (clip_qkv): the same comparisons on both backends, so bit-identical;
 * values drawn with scale 2 so that about half fall beyond +-1. */
static void clamp_case(gt_ctx_t *t, size_t n) {
    float *hx = gt_host_rand(t, n, 2.0f), *hd = gt_host_rand(t, n, 1.0f);
    gt_buf_t X = gt_from_host(t, hx, n * 4, "x"), Y = gt_from_host(t, hx, n * 4, "y");
    gt_buf_t D = gt_from_host(t, hd, n * 4, "dy");
    char what[96];
    t->cpu->ops->clamp_fwd(t->sc, GT_C(Y), GT_C(X), 1.0f, n);
    t->gpu->ops->clamp_fwd(t->sg, GT_G(Y), GT_G(X), 1.0f, n);
    snprintf(what, sizeof what, "clamp_fwd n=%zu", n);
    gt_check_exact(t, what, &Y, Y.bytes);
    t->cpu->ops->clamp_bwd(t->sc, GT_C(D), GT_C(D), GT_C(X), 1.0f, n);
    t->gpu->ops->clamp_bwd(t->sg, GT_G(D), GT_G(D), GT_G(X), 1.0f, n);
    snprintf(what, sizeof what, "clamp_bwd in place n=%zu", n);
    gt_check_exact(t, what, &D, D.bytes);
    gt_free(t, &X);
    gt_free(t, &Y);
    gt_free(t, &D);
    free(hx);
    free(hd);
}

/* copy4d as MLA uses it: a head's rotary part de-interleaved out of a
 * projection (n, nh, qk), one row broadcast to every head (source stride
 * 0), and the same with += into a prefilled destination. */
static void copy4d_case(gt_ctx_t *t, int n, int nh, int nope, int rope) {
    const int qk = nope + rope;
    const size_t sn = (size_t)n * nh * qk, dn = (size_t)n * (nh + 1) * rope;
    float *hs = gt_host_rand(t, sn, 1.0f), *hd = gt_host_rand(t, dn, 1.0f);
    gt_buf_t S = gt_from_host(t, hs, sn * 4, "src"), D = gt_from_host(t, hd, dn * 4, "dst");
    const kern_copy4d_t cases[2] = {
        {{n, nh, 2, rope / 2}, {(int64_t)nh * qk, qk, 1, 2}, {(int64_t)(nh + 1) * rope, rope, rope / 2, 1}},
        {{n, nh, 1, rope}, {(int64_t)nh * qk, 0, 0, 1}, {(int64_t)(nh + 1) * rope, rope, 0, 1}},
    };
    char what[96];
    for (int c = 0; c < 2; c++)
        for (int acc = 0; acc < 2; acc++) {
            gt_set(t, &D, hd);
            t->cpu->ops->copy4d(t->sc, GT_C(D), (const float *)S.c + nope, &cases[c], acc);
            t->gpu->ops->copy4d(t->sg, GT_G(D), (const float *)S.g + nope, &cases[c], acc);
            snprintf(what, sizeof what, "copy4d n=%d nh=%d case %d acc %d", n, nh, c, acc);
            gt_check_exact(t, what, &D, dn * 4);
        }
    gt_free(t, &S);
    gt_free(t, &D);
    free(hs);
    free(hd);
}

/* Sums of squares of `count` tensors of assorted sizes (empty ones, and
 * more than one launch's worth of tensors) in one call, into slots that
 * are not in order in one buffer. */
static void sumsq_many_case(gt_ctx_t *t, int count) {
    size_t *n = calloc((size_t)count, sizeof *n), *at = calloc((size_t)count, sizeof *at), total = 0;
    MT_CHECK(n && at, "out of memory");
    for (int i = 0; i < count; i++) {
        static const size_t pick[] = {0, 1, 255, 1024, 1025, 4097, 70001, 300003};
        n[i] = pick[gt_int(t, 8)];
        at[i] = total, total += n[i];
    }
    float *hx = gt_host_rand(t, total ? total : 1, 2.0f);
    gt_buf_t X = gt_from_host(t, hx, (total ? total : 1) * 4, "x");
    gt_buf_t S = gt_alloc(t, (size_t)count * 4, "sums"), one = gt_alloc(t, (size_t)count * 4, "sums one by one");
    float **outc = malloc((size_t)count * sizeof *outc), **outg = malloc((size_t)count * sizeof *outg);
    const float **xc = malloc((size_t)count * sizeof *xc), **xg = malloc((size_t)count * sizeof *xg);
    MT_CHECK(outc && outg && xc && xg, "out of memory");
    for (int i = 0; i < count; i++) {
        const int slot = (int)(((size_t)i * 7 + 3) % (size_t)count); /* 7 is prime to the counts below */
        outc[i] = GT_C(S) + slot, outg[i] = GT_G(S) + slot;
        xc[i] = GT_C(X) + at[i], xg[i] = GT_G(X) + at[i];
        t->gpu->ops->sumsq(t->sg, GT_G(one) + slot, xg[i], n[i]);
        t->cpu->ops->sumsq(t->sc, GT_C(one) + slot, xc[i], n[i]);
    }
    t->cpu->ops->sumsq_many(t->sc, outc, xc, n, count);
    t->gpu->ops->sumsq_many(t->sg, outg, xg, n, count);
    char what[96];
    snprintf(what, sizeof what, "sumsq_many count=%d", count);
    gt_check_f32(t, what, &S, (size_t)count, 0.0f, 1e-6f);
    float *one_gpu = gt_host_alloc((size_t)count);
    gt_save_gpu(t, &one, one_gpu);
    snprintf(what, sizeof what, "sumsq_many count=%d equals sumsq one by one", count);
    gt_check_same_gpu(t, what, &S, one_gpu);
    free(one_gpu);
    free(outc), free(outg), free(xc), free(xg), free(n), free(at), free(hx);
    gt_free(t, &X);
    gt_free(t, &S);
    gt_free(t, &one);
}

/* dst[i] += bf16 src[i] for `count` tensors of assorted sizes in one call,
 * the sources packed one after another as a grouped product writes them. */
static void add_bf16_many_case(gt_ctx_t *t, int count) {
    size_t *n = calloc((size_t)count, sizeof *n), *at = calloc((size_t)count, sizeof *at), total = 0;
    MT_CHECK(n && at, "out of memory");
    for (int i = 0; i < count; i++) {
        static const size_t pick[] = {0, 1, 255, 1024, 4097, 70001};
        n[i] = pick[gt_int(t, 6)];
        at[i] = total, total += n[i];
    }
    const size_t cells = total ? total : 1;
    float *hy = gt_host_rand(t, cells, 3.0f), *hs = gt_host_rand(t, cells, 3.0f);
    uint16_t *h16 = gt_host_bytes(cells * 2);
    mt_convert_from_f32(h16, MT_BF16, hs, cells);
    gt_buf_t Y = gt_from_host(t, hy, cells * 4, "dst"), S16 = gt_from_host(t, h16, cells * 2, "src bf16");
    float **yc = malloc((size_t)count * sizeof *yc), **yg = malloc((size_t)count * sizeof *yg);
    const uint16_t **sc = malloc((size_t)count * sizeof *sc), **sg = malloc((size_t)count * sizeof *sg);
    MT_CHECK(yc && yg && sc && sg, "out of memory");
    for (int i = 0; i < count; i++) {
        yc[i] = GT_C(Y) + at[i], yg[i] = GT_G(Y) + at[i];
        sc[i] = GT_CU16(S16) + at[i], sg[i] = GT_GU16(S16) + at[i];
    }
    t->cpu->ops->add_bf16_many(t->sc, yc, sc, n, count);
    t->gpu->ops->add_bf16_many(t->sg, yg, sg, n, count);
    char what[96];
    snprintf(what, sizeof what, "add_bf16_many count=%d", count);
    gt_check_exact(t, what, &Y, Y.bytes);
    /* the rule itself, on the CPU's result */
    float *back = gt_host_alloc(cells);
    gt_download(t, &Y, back, NULL);
    size_t wrong = 0;
    for (size_t i = 0; i < total; i++) wrong += back[i] != hy[i] + mt_bf16_to_f32(h16[i]);
    gt_expect(t, wrong == 0, "%s: %zu elements are not dst + widened src", what, wrong);
    free(back), free(yc), free(yg), free(sc), free(sg), free(n), free(at), free(hy), free(hs), free(h16);
    gt_free(t, &Y);
    gt_free(t, &S16);
}

/* Every other one of `count` ranges of one buffer zeroed in one call, the
 * ranges between them left as they were. */
static void zero_many_case(gt_ctx_t *t, int count) {
    size_t *n = calloc((size_t)count, sizeof *n), *at = calloc((size_t)count, sizeof *at), total = 0;
    MT_CHECK(n && at, "out of memory");
    for (int i = 0; i < count; i++) {
        static const size_t pick[] = {0, 1, 255, 4097, 70001};
        n[i] = pick[gt_int(t, 5)];
        at[i] = total, total += n[i];
    }
    const size_t cells = total ? total : 1;
    float *hy = gt_host_rand(t, cells, 1.0f);
    gt_buf_t Y = gt_from_host(t, hy, cells * 4, "y");
    float **yc = malloc((size_t)count * sizeof *yc), **yg = malloc((size_t)count * sizeof *yg);
    size_t *nz = malloc((size_t)count * sizeof *nz);
    MT_CHECK(yc && yg && nz, "out of memory");
    int m = 0;
    for (int i = 0; i < count; i += 2, m++) yc[m] = GT_C(Y) + at[i], yg[m] = GT_G(Y) + at[i], nz[m] = n[i];
    t->cpu->ops->zero_many(t->sc, yc, nz, m);
    t->gpu->ops->zero_many(t->sg, yg, nz, m);
    char what[64];
    snprintf(what, sizeof what, "zero_many count=%d", m);
    gt_check_exact(t, what, &Y, Y.bytes);
    float *back = gt_host_alloc(cells);
    gt_download(t, &Y, back, NULL);
    size_t wrong = 0;
    for (int i = 0; i < count; i++)
        for (size_t j = 0; j < n[i]; j++) wrong += back[at[i] + j] != (i % 2 ? hy[at[i] + j] : 0.0f);
    gt_expect(t, wrong == 0, "%s: %zu elements not as asked (zero in listed ranges, unchanged between)", what, wrong);
    free(back), free(yc), free(yg), free(nz), free(n), free(at), free(hy);
    gt_free(t, &Y);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "elementwise_test", 0xe1e);
    static const size_t sizes[] = {0, 1, 1000, 65537, ((size_t)1 << 20) + 3};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        simple_ops(&t, sizes[i]);
        swiglu_case(&t, sizes[i]);
        swiglu_bf16_case(&t, sizes[i]);
        convert_case(&t, sizes[i]);
        dropout_case(&t, sizes[i], 0.1f);
        clamp_case(&t, sizes[i]);
    }
    bias_case(&t, 1, 1);
    bias_case(&t, 3, 1000);
    bias_case(&t, 2048, 96);
    bias_case(&t, 10000, 33);
    copy4d_case(&t, 1, 1, 2, 2);
    copy4d_case(&t, 37, 4, 8, 4);
    copy4d_case(&t, 300, 16, 128, 64);
    sumsq_many_case(&t, 1);
    sumsq_many_case(&t, 64);
    sumsq_many_case(&t, 150);
    add_bf16_many_case(&t, 1);
    add_bf16_many_case(&t, 130);
    zero_many_case(&t, 1);
    zero_many_case(&t, 150);
    return gt_close(&t);
}
