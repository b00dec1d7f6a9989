/* GPU suite: device AdamW against the host kernel.
 *
 * Tolerance: none.  The device kernel evaluates adamw_math.h, the host
 * kernel's exact op order (one explicit fmaf, IEEE sqrt and division, no
 * other fusion on either side), with coefficients computed on the host the
 * same way, so p, m, v and the bf16 copy must be bit-identical: the
 * optimizer's placement may change where it runs, never what it computes.
 * Covered: fp32 and bf16 gradients, with and without the bf16 working copy,
 * several steps (bias corrections change), beta1 >= 0.5 (torch's lerp takes
 * its other branch), sizes that do and do not fill a block; moments in
 * fp32, bf16 (stochastic rounding from a counter-based hash: the same bits
 * on both sides) and 8-bit block-wise (codes and absmax per 256 elements;
 * the device's absmax is a max reduction, exact in any order), the whole
 * moments allocation compared, padding included.  The fused check of the
 * written masters (kern_adamw_params_t.nonfinite) must leave its flag alone
 * after a finite update and set it after one that writes a NaN, on both.
 * adamw_many over tensors of every kind above (more fp32 ones than one
 * launch takes, empty ones, its own step count each) must give what adamw
 * gives each one alone: the CPU runs them one by one, the GPU as a batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "kernels/host/adamw_host.h"
#include "tests/gpu/gpu_test.h"

static void adamw_case(gt_ctx_t *t, size_t n, float beta1, int bf16_grad, int bf16_copy, kern_moments_fmt_t fmt) {
    float *hp = gt_host_rand(t, n, 1.0f), *hm = gt_host_rand(t, n, 0.01f), *hv = gt_host_alloc(n);
    for (size_t i = 0; i < n; i++) hv[i] = gt_uniform(t, 0.0f, 1e-4f);
    const size_t mbytes = kern_moments_bytes(fmt, n);
    void *hmom = gt_host_bytes(mbytes);
    const kern_moments_t hview = kern_moments_view(fmt, hmom, n, 0x5eed + n);
    kern_moments_from_f32(&hview, n, hm, hv);
    gt_buf_t P = gt_from_host(t, hp, n * 4, "p"), MOM = gt_from_host(t, hmom, mbytes, "moments");
    gt_buf_t G = gt_alloc(t, n * 4, "g");
    const kern_moments_t cm = kern_moments_view(fmt, MOM.c, n, hview.seed);
    const kern_moments_t gm = kern_moments_view(fmt, MOM.g, n, hview.seed);
    gt_buf_t G16 = gt_alloc(t, n * 2, "g bf16"), P16 = gt_alloc(t, n * 2, "p bf16");
    char what[128];
    for (int step = 1; step <= 3; step++) {
        float *hg = gt_host_rand(t, n, 2.0f);
        uint16_t *hg16 = gt_host_bytes(n * 2);
        mt_convert_from_f32(hg16, MT_BF16, hg, n);
        gt_set(t, &G, hg);
        gt_set(t, &G16, hg16);
        const kern_adamw_params_t hp_ = {.lr = 3e-4f, .beta1 = beta1, .beta2 = 0.999f, .eps = 1e-8f,
                                         .weight_decay = 0.1f, .grad_scale = 0.25f, .step = step};
        t->cpu->ops->adamw(t->sc, GT_C(P), &cm, bf16_grad ? NULL : GT_C(G),
                           bf16_grad ? GT_CU16(G16) : NULL, bf16_copy ? GT_CU16(P16) : NULL, n, &hp_);
        t->gpu->ops->adamw(t->sg, GT_G(P), &gm, bf16_grad ? NULL : GT_G(G),
                           bf16_grad ? GT_GU16(G16) : NULL, bf16_copy ? GT_GU16(P16) : NULL, n, &hp_);
        free(hg);
        free(hg16);
    }
    const char *fname = kern_moments_fmt_name(fmt);
    snprintf(what, sizeof what, "adamw p n=%zu beta1=%g grad=%s moments=%s", n, (double)beta1,
             bf16_grad ? "bf16" : "f32", fname);
    gt_check_exact(t, what, &P, P.bytes);
    snprintf(what, sizeof what, "adamw moments n=%zu beta1=%g moments=%s", n, (double)beta1, fname);
    gt_check_exact(t, what, &MOM, MOM.bytes);
    if (bf16_copy) {
        snprintf(what, sizeof what, "adamw p bf16 copy n=%zu", n);
        gt_check_exact(t, what, &P16, P16.bytes);
    }
    gt_buf_t *bufs[] = {&P, &MOM, &G, &G16, &P16};
    for (size_t i = 0; i < 5; i++) gt_free(t, bufs[i]);
    free(hmom);
    free(hp);
    free(hm);
    free(hv);
}

/* One update from finite gradients, then one with an Inf gradient element
 * (its master becomes NaN), each with a zeroed flag on both devices. */
static void nonfinite_case(gt_ctx_t *t, size_t n, kern_moments_fmt_t fmt) {
    float *hp = gt_host_rand(t, n, 1.0f), *hg = gt_host_rand(t, n, 1.0f);
    const size_t mbytes = kern_moments_bytes(fmt, n);
    void *hmom = gt_host_bytes(mbytes);
    gt_buf_t P = gt_from_host(t, hp, n * 4, "p"), MOM = gt_from_host(t, hmom, mbytes, "moments");
    gt_buf_t G = gt_from_host(t, hg, n * 4, "g"), F = gt_alloc(t, sizeof(int), "nonfinite flag");
    const kern_moments_t cm = kern_moments_view(fmt, MOM.c, n, 7), gm = kern_moments_view(fmt, MOM.g, n, 7);
    const int zero = 0;
    char what[128];
    for (int step = 1; step <= 2; step++) {
        if (step == 2) {
            hg[n / 2] = INFINITY;
            gt_set(t, &G, hg);
        }
        gt_set(t, &F, &zero);
        kern_adamw_params_t hp_ = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                   .weight_decay = 0.0f, .grad_scale = 1.0f, .step = step};
        hp_.nonfinite = (int *)F.c;
        t->cpu->ops->adamw(t->sc, GT_C(P), &cm, GT_C(G), NULL, NULL, n, &hp_);
        hp_.nonfinite = (int *)F.g;
        t->gpu->ops->adamw(t->sg, GT_G(P), &gm, GT_G(G), NULL, NULL, n, &hp_);
        int fc = -1, fg = -1;
        gt_download(t, &F, &fc, &fg);
        snprintf(what, sizeof what, "adamw nonfinite flag n=%zu moments=%s step %d", n, kern_moments_fmt_name(fmt),
                 step);
        const int want = step == 2;
        gt_expect(t, fc == want && fg == want, "%s: cpu %d gpu %d, expected %d", what, fc, fg, want);
    }
    gt_buf_t *bufs[] = {&P, &MOM, &G, &F};
    for (size_t i = 0; i < 4; i++) gt_free(t, bufs[i]);
    free(hmom);
    free(hp);
    free(hg);
}

/* `count` tensors, their kinds and sizes drawn, updated twice: on the CPU
 * one kern_adamw each, on the GPU one kern_adamw_many per step. */
static void adamw_many_case(gt_ctx_t *t, int count) {
    enum { PARTS = 6 }; /* p, moments, g, g bf16, p bf16, flag */
    gt_buf_t *b = calloc((size_t)count * PARTS, sizeof *b);
    kern_adamw_item_t *ci = calloc((size_t)count, sizeof *ci), *gi = calloc((size_t)count, sizeof *gi);
    MT_CHECK(b && ci && gi, "out of memory");
    static const size_t sizes[] = {0, 1, 300, 1000, 70001};
    const int zero = 0;
    for (int k = 0; k < count; k++) {
        const size_t n = sizes[gt_int(t, 5)];
        const kern_moments_fmt_t fmt = gt_int(t, 4) ? KERN_MOMENTS_F32 : (kern_moments_fmt_t)(1 + gt_int(t, 2));
        const bool bf16_grad = gt_int(t, 2), copy = gt_int(t, 2);
        float *hp = gt_host_rand(t, n ? n : 1, 1.0f), *hg = gt_host_rand(t, n ? n : 1, 2.0f);
        if (n && k % 7 == 3) hg[n / 2] = NAN; /* its flag must be set on both */
        uint16_t *hg16 = gt_host_bytes((n ? n : 1) * 2);
        mt_convert_from_f32(hg16, MT_BF16, hg, n ? n : 1);
        void *hmom = gt_host_bytes(kern_moments_bytes(fmt, n ? n : 1));
        gt_buf_t *q = b + (size_t)k * PARTS;
        q[0] = gt_from_host(t, hp, (n ? n : 1) * 4, "p");
        q[1] = gt_from_host(t, hmom, kern_moments_bytes(fmt, n ? n : 1), "moments");
        q[2] = gt_from_host(t, hg, (n ? n : 1) * 4, "g");
        q[3] = gt_from_host(t, hg16, (n ? n : 1) * 2, "g bf16");
        q[4] = gt_alloc(t, (n ? n : 1) * 2, "p bf16");
        q[5] = gt_from_host(t, &zero, sizeof zero, "flag");
        const kern_adamw_params_t hp_ = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                         .weight_decay = 0.05f, .grad_scale = 0.5f, .step = 1 + gt_int(t, 5)};
        for (int side = 0; side < 2; side++) {
            kern_adamw_item_t *it = side ? &gi[k] : &ci[k];
#define SIDE(buf) (side ? (buf).g : (buf).c)
            *it = (kern_adamw_item_t){.p = SIDE(q[0]), .mom = kern_moments_view(fmt, SIDE(q[1]), n, 11 + k),
                                      .g = bf16_grad ? NULL : SIDE(q[2]), .g_bf16 = bf16_grad ? SIDE(q[3]) : NULL,
                                      .p_bf16 = copy ? SIDE(q[4]) : NULL, .n = n, .hp = hp_};
            it->hp.nonfinite = SIDE(q[5]);
#undef SIDE
        }
        free(hp), free(hg), free(hg16), free(hmom);
    }
    for (int step = 0; step < 2; step++) {
        for (int k = 0; k < count; k++) {
            const kern_adamw_item_t *it = &ci[k];
            if (it->n) t->cpu->ops->adamw(t->sc, it->p, &it->mom, it->g, it->g_bf16, it->p_bf16, it->n, &it->hp);
        }
        t->gpu->ops->adamw_many(t->sg, gi, count);
        for (int k = 0; k < count; k++) ci[k].hp.step++, gi[k].hp.step++;
    }
    char what[96];
    for (int k = 0; k < count; k++) {
        gt_buf_t *q = b + (size_t)k * PARTS;
        snprintf(what, sizeof what, "adamw_many %d/%d n=%zu moments=%s: p", k, count, ci[k].n,
                 kern_moments_fmt_name(ci[k].mom.fmt));
        gt_check_exact(t, what, &q[0], q[0].bytes);
        snprintf(what, sizeof what, "adamw_many %d/%d: moments", k, count);
        gt_check_exact(t, what, &q[1], q[1].bytes);
        if (ci[k].p_bf16) {
            snprintf(what, sizeof what, "adamw_many %d/%d: p bf16", k, count);
            gt_check_exact(t, what, &q[4], q[4].bytes);
        }
        snprintf(what, sizeof what, "adamw_many %d/%d: non-finite flag", k, count);
        gt_check_exact(t, what, &q[5], q[5].bytes);
        for (int j = 0; j < PARTS; j++) gt_free(t, &q[j]);
    }
    free(b), free(ci), free(gi);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "adamw_test", 0xada);
    static const size_t sizes[] = {0, 1, 1000, ((size_t)1 << 20) + 5};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        for (int f = KERN_MOMENTS_F32; f <= KERN_MOMENTS_8BIT; f++) {
            adamw_case(&t, sizes[i], 0.9f, 0, 0, (kern_moments_fmt_t)f);
            adamw_case(&t, sizes[i], 0.9f, 1, 1, (kern_moments_fmt_t)f);
            adamw_case(&t, sizes[i], 0.4f, 0, 1, (kern_moments_fmt_t)f);
        }
    }
    adamw_many_case(&t, 1);
    adamw_many_case(&t, 60);
    for (int f = KERN_MOMENTS_F32; f <= KERN_MOMENTS_8BIT; f++) {
        nonfinite_case(&t, 1000, (kern_moments_fmt_t)f);
        nonfinite_case(&t, ((size_t)1 << 20) + 5, (kern_moments_fmt_t)f);
    }
    return gt_close(&t);
}
