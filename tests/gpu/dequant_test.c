/* GPU suite: kern_dequant (kernels/dequant.h) against its CPU twin, every
 * format, fp32 and bf16 working copies.  Both compute each element with
 * base/quant_elem.h's mt_quant_value (one multiply, plus one multiply-add
 * for a double-quantised absmax, built without contraction on both sides):
 * bit-identical, so every check is exact.  Shapes include partial FP8
 * blocks, an odd element count for the flat 4-bit formats (the last byte's
 * low nibble unused) and more than 256 NF4 blocks (two nested blocks). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"
#include "tests/gpu/gpu_test.h"

/* Buffers of one quantised tensor on both devices. */
typedef struct {
    gt_buf_t codes, scales, scales_u8, zeros, absmax2, code2;
    mt_quant_view_t vc, vg; /* views on the CPU and the GPU copies */
} dq_case_t;

static gt_buf_t bytes_rand(gt_ctx_t *t, size_t n, const char *tag) {
    uint8_t *h = gt_host_bytes(n ? n : 1);
    for (size_t i = 0; i < n; i++) h[i] = (uint8_t)gt_u64(t);
    gt_buf_t b = gt_from_host(t, h, n ? n : 1, tag);
    free(h);
    return b;
}

static gt_buf_t floats_pos(gt_ctx_t *t, size_t n, float lo, float hi, const char *tag) {
    float *h = gt_host_alloc(n);
    for (size_t i = 0; i < n; i++) h[i] = gt_uniform(t, lo, hi);
    gt_buf_t b = gt_from_host(t, h, n * 4, tag);
    free(h);
    return b;
}

/* Fills both views' buffers for q's format and shape (q: format, rows,
 * cols, block, block_cols, block2). */
static void make_case(gt_ctx_t *t, dq_case_t *k, const mt_quant_view_t *q) {
    memset(k, 0, sizeof *k);
    mt_quant_sizes_t want;
    mt_error_t err = {0};
    gt_expect(t, mt_quant_expect(q, &want, "case", &err) == MT_OK, "%s", err.msg);
    k->vc = k->vg = *q;
    const size_t code_bytes = q->format == MT_QUANT_INT4 ? (size_t)want.codes * 4 : (size_t)want.codes;
    k->codes = bytes_rand(t, code_bytes, "codes");
    k->vc.codes = k->codes.c;
    k->vg.codes = k->codes.g;
    if (want.scales) {
        k->scales = floats_pos(t, (size_t)want.scales, 1e-3f, 2.0f, "scales");
        k->vc.scales = GT_C(k->scales);
        k->vg.scales = GT_G(k->scales);
    }
    if (want.scales_u8) {
        uint8_t *h = gt_host_bytes((size_t)want.scales_u8);
        for (int64_t i = 0; i < want.scales_u8; i++) h[i] = (uint8_t)(q->format == MT_QUANT_MXFP4 ? 100 + gt_int(t, 50) : gt_int(t, 256));
        k->scales_u8 = gt_from_host(t, h, (size_t)want.scales_u8, "scales_u8");
        free(h);
        k->vc.scales_u8 = k->scales_u8.c;
        k->vg.scales_u8 = k->scales_u8.g;
    }
    if (want.zeros) {
        k->zeros = bytes_rand(t, (size_t)want.zeros * 4, "zeros");
        k->vc.zeros = GT_CI(k->zeros);
        k->vg.zeros = GT_GI(k->zeros);
    }
    if (want.absmax2) {
        float map[256];
        mt_bnb_dynamic_map(map);
        k->code2 = gt_from_host(t, map, sizeof map, "code2");
        k->absmax2 = floats_pos(t, (size_t)want.absmax2, 0.01f, 0.1f, "absmax2");
        k->vc.code2 = GT_C(k->code2);
        k->vg.code2 = GT_G(k->code2);
        k->vc.absmax2 = GT_C(k->absmax2);
        k->vg.absmax2 = GT_G(k->absmax2);
    }
}

static void free_case(gt_ctx_t *t, dq_case_t *k) {
    gt_buf_t *bufs[] = {&k->codes, &k->scales, &k->scales_u8, &k->zeros, &k->absmax2, &k->code2};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
        if (bufs[i]->bytes) gt_free(t, bufs[i]);
}

static void run_case(gt_ctx_t *t, const mt_quant_view_t *q) {
    dq_case_t k;
    make_case(t, &k, q);
    const size_t n = (size_t)(q->rows * q->cols);
    char what[128];
    gt_buf_t F = gt_alloc(t, n * 4, "out_f32"), H = gt_alloc(t, n * 2, "out_bf16");
    t->cpu->ops->dequant(t->sc, F.c, MT_F32, &k.vc);
    t->gpu->ops->dequant(t->sg, F.g, MT_F32, &k.vg);
    snprintf(what, sizeof what, "dequant %s%s [%lld, %lld] -> fp32", mt_quant_format_name(q->format),
             q->block2 ? " (double quant)" : "", (long long)q->rows, (long long)q->cols);
    gt_check_exact(t, what, &F, n * 4);
    t->cpu->ops->dequant(t->sc, H.c, MT_BF16, &k.vc);
    t->gpu->ops->dequant(t->sg, H.g, MT_BF16, &k.vg);
    snprintf(what, sizeof what, "dequant %s%s [%lld, %lld] -> bf16", mt_quant_format_name(q->format),
             q->block2 ? " (double quant)" : "", (long long)q->rows, (long long)q->cols);
    gt_check_exact(t, what, &H, n * 2);
    gt_free(t, &F);
    gt_free(t, &H);
    free_case(t, &k);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "dequant", 20261126);
    const mt_quant_view_t cases[] = {
        {.format = MT_QUANT_FP8_BLOCK, .rows = 130, .cols = 260, .block = 128, .block_cols = 128},
        {.format = MT_QUANT_MXFP4, .rows = 12, .cols = 96, .block = 32},
        /* gpt-oss's experts held transposed: 2 experts of (64, 7), packed (7, 64) */
        {.format = MT_QUANT_MXFP4, .rows = 128, .cols = 7, .block = 32, .tr_rows = 64},
        {.format = MT_QUANT_NF4, .rows = 9, .cols = 77, .block = 64},
        {.format = MT_QUANT_FP4, .rows = 8, .cols = 192, .block = 64},
        {.format = MT_QUANT_NF4, .rows = 150, .cols = 129, .block = 64, .block2 = 256},
        {.format = MT_QUANT_INT4, .rows = 32, .cols = 256, .block = 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        mt_quant_view_t q = cases[i];
        if (q.block2) {
            /* mark the view double-quantised for mt_quant_expect */
            static const float one = 1.0f;
            q.code2 = &one;
            q.offset = 0.01f;
        }
        run_case(&t, &q);
    }
    return gt_close(&t);
}
