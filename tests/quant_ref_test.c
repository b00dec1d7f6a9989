/* The quantised formats against tests/reference/make_quant_fixtures.py,
 * which computes each from its definition with torch / numpy (whole-array
 * code, torch's own float8 type, bucket searches for bnb's trees):
 *  - dequantisation (host mt_dequant and the CPU kernel kern_dequant, fp32
 *    and bf16) bit-identical to the reference for FP8 block, MXFP4, NF4,
 *    FP4, NF4 double-quantised and GPTQ INT4;
 *  - bitsandbytes' 4-bit quantiser: codes, absmax (or the nested codes,
 *    absmax2 and offset) identical, the dynamic map identical, values on
 *    and one ulp either side of every tree pivot coded as bnb codes them;
 *  - bad buffers refused, each message naming the tensor and what was
 *    expected. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"
#include "kernels/device.h"
#include "kernels/ops.h"

static int failures;
#define EXPECT(c, ...)                                                                  \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* ---- fixture records (see the script's docstring) ---- */
typedef struct {
    char name[33];
    char kind;
    uint64_t count;
    void *data;
} rec_t;

typedef struct {
    rec_t recs[16];
    int n;
} fix_t;

static size_t kind_size(char k) { return k == 'f' || k == 'i' ? 4 : k == 'h' ? 2 : k == 'q' ? 8 : 1; }

static void fix_load(fix_t *f, const char *cs) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/quant/%s.bin", cs);
    FILE *fp = fopen(path, "rb");
    MT_CHECK(fp, "cannot open %s", path);
    memset(f, 0, sizeof *f);
    unsigned char hdr[48];
    while (f->n < 16 && fread(hdr, 1, sizeof hdr, fp) == sizeof hdr) {
        rec_t *r = &f->recs[f->n++];
        memcpy(r->name, hdr, 32);
        r->kind = (char)hdr[32];
        memcpy(&r->count, hdr + 40, 8);
        const size_t bytes = (size_t)r->count * kind_size(r->kind);
        r->data = malloc(bytes ? bytes : 1);
        MT_CHECK(r->data && fread(r->data, 1, bytes, fp) == bytes, "%s: record %s truncated", path, r->name);
    }
    fclose(fp);
}

static const rec_t *fix_get(const fix_t *f, const char *name) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->recs[i].name, name)) return &f->recs[i];
    return NULL;
}

static void *fix_data(const fix_t *f, const char *name) {
    const rec_t *r = fix_get(f, name);
    return r ? r->data : NULL;
}

static int64_t fix_count(const fix_t *f, const char *name) {
    const rec_t *r = fix_get(f, name);
    return r ? (int64_t)r->count : 0;
}

static void fix_free(fix_t *f) {
    for (int i = 0; i < f->n; i++) free(f->recs[i].data);
}

/* ---- dequantisation ---- */

/* The view and buffer sizes of a fixture case. */
static mt_quant_view_t fix_view(const fix_t *f, mt_quant_format_t fmt, mt_quant_sizes_t *have) {
    const int64_t *shape = fix_data(f, "shape");
    mt_quant_view_t q = {.format = fmt, .rows = shape[0], .cols = shape[1], .block = shape[2]};
    *have = (mt_quant_sizes_t){0};
    if (fmt == MT_QUANT_FP8_BLOCK) q.block_cols = shape[3];
    const char *codes = fmt == MT_QUANT_INT4 ? "qweight" : "codes";
    q.codes = fix_data(f, codes);
    have->codes = fix_count(f, codes);
    q.scales = fix_data(f, fmt == MT_QUANT_NF4 || fmt == MT_QUANT_FP4 ? "absmax" : "scales");
    have->scales = fix_count(f, fmt == MT_QUANT_NF4 || fmt == MT_QUANT_FP4 ? "absmax" : "scales");
    q.scales_u8 = fix_data(f, fmt == MT_QUANT_MXFP4 ? "scales_u8" : "qabsmax");
    have->scales_u8 = fix_count(f, fmt == MT_QUANT_MXFP4 ? "scales_u8" : "qabsmax");
    q.zeros = fix_data(f, "qzeros");
    have->zeros = fix_count(f, "qzeros");
    if (fix_get(f, "absmax2")) {
        q.absmax2 = fix_data(f, "absmax2");
        have->absmax2 = fix_count(f, "absmax2");
        q.code2 = fix_data(f, "code2");
        have->code2 = fix_count(f, "code2");
        q.block2 = shape[3];
        q.offset = *(const float *)fix_data(f, "offset");
    }
    return q;
}

static int count_diff(const void *a, const void *b, size_t n, size_t elem) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += memcmp((const char *)a + i * elem, (const char *)b + i * elem, elem) != 0;
    return bad;
}

/* The CPU kernel on a device copy of q's buffers. */
static void kernel_dequant(kern_device_t *dev, const fix_t *f, const mt_quant_view_t *q, const mt_quant_sizes_t *have,
                           void *out, mt_dtype_t dt) {
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    mt_quant_view_t v = *q;
    void *bufs[6] = {0};
    const void *src[6] = {q->codes, q->scales, q->scales_u8, q->zeros, q->absmax2, q->code2};
    const size_t bytes[6] = {(size_t)have->codes * (q->format == MT_QUANT_INT4 ? 4 : 1), (size_t)have->scales * 4,
                             (size_t)have->scales_u8, (size_t)have->zeros * 4, (size_t)have->absmax2 * 4,
                             (size_t)have->code2 * 4};
    for (int i = 0; i < 6; i++)
        if (src[i]) {
            bufs[i] = kern_alloc(dev, bytes[i], "q", NULL);
            kern_memcpy_h2d(dev, s, bufs[i], src[i], bytes[i]);
        }
    v.codes = bufs[0];
    v.scales = bufs[1];
    v.scales_u8 = bufs[2];
    v.zeros = bufs[3];
    v.absmax2 = bufs[4];
    v.code2 = bufs[5];
    const size_t n = (size_t)(q->rows * q->cols), ob = n * (dt == MT_BF16 ? 2 : 4);
    void *d = kern_alloc(dev, ob, "out", NULL);
    dev->ops->dequant(s, d, dt, &v);
    kern_memcpy_d2h(dev, s, out, d, ob);
    kern_stream_sync(dev, s);
    kern_free(dev, d);
    for (int i = 0; i < 6; i++)
        if (bufs[i]) kern_free(dev, bufs[i]);
    (void)f;
}

static void test_dequant(kern_device_t *dev, const char *cs, mt_quant_format_t fmt) {
    fix_t f;
    fix_load(&f, cs);
    mt_quant_sizes_t have;
    const mt_quant_view_t q = fix_view(&f, fmt, &have);
    mt_error_t err = {0};
    EXPECT(mt_quant_check(&q, &have, cs, &err) == MT_OK, "%s: %s", cs, err.msg);
    const size_t n = (size_t)(q.rows * q.cols);
    EXPECT(fix_count(&f, "out_f32") == (int64_t)n, "%s: fixture size", cs);
    float *o32 = malloc(n * 4);
    uint16_t *o16 = malloc(n * 2);
    mt_dequant(&q, o32, MT_F32);
    int bad = count_diff(o32, fix_data(&f, "out_f32"), n, 4);
    EXPECT(bad == 0, "%s: host fp32: %d of %zu values differ from the reference", cs, bad, n);
    mt_dequant(&q, o16, MT_BF16);
    bad = count_diff(o16, fix_data(&f, "out_bf16"), n, 2);
    EXPECT(bad == 0, "%s: host bf16: %d of %zu values differ from the reference", cs, bad, n);
    memset(o32, 0xFF, n * 4);
    kernel_dequant(dev, &f, &q, &have, o32, MT_F32);
    bad = count_diff(o32, fix_data(&f, "out_f32"), n, 4);
    EXPECT(bad == 0, "%s: kern_dequant_cpu fp32: %d of %zu values differ from the reference", cs, bad, n);
    memset(o16, 0xFF, n * 2);
    kernel_dequant(dev, &f, &q, &have, o16, MT_BF16);
    bad = count_diff(o16, fix_data(&f, "out_bf16"), n, 2);
    EXPECT(bad == 0, "%s: kern_dequant_cpu bf16: %d of %zu values differ from the reference", cs, bad, n);
    printf("ok   %-7s [%lld, %lld]: host and CPU kernel, fp32 and bf16, bit-identical to the reference\n", cs,
           (long long)q.rows, (long long)q.cols);
    free(o32);
    free(o16);
    fix_free(&f);
}

/* ---- bitsandbytes' quantiser ---- */

static void test_quantize(const char *cs, mt_quant_format_t fmt, bool dq) {
    fix_t f;
    fix_load(&f, cs);
    const int64_t n = fix_count(&f, "x");
    mt_bnb4_t q;
    mt_error_t err = {0};
    EXPECT(mt_bnb4_quantize(fix_data(&f, "x"), n, fmt, 64, dq, &q, cs, &err) == MT_OK, "%s", err.msg);
    int bad = count_diff(q.codes, fix_data(&f, "codes"), (size_t)fix_count(&f, "codes"), 1);
    EXPECT(fix_count(&f, "codes") == (n + 1) / 2 && bad == 0, "%s: %d of %lld code bytes differ", cs, bad,
           (long long)fix_count(&f, "codes"));
    if (!dq) {
        bad = count_diff(q.absmax, fix_data(&f, "absmax"), (size_t)q.nblocks, 4);
        EXPECT(fix_count(&f, "absmax") == q.nblocks && bad == 0, "%s: %d absmax differ", cs, bad);
    } else {
        const float *off = fix_data(&f, "offset");
        EXPECT(q.offset == *off, "%s: offset %.9g vs %.9g", cs, (double)q.offset, (double)*off);
        bad = count_diff(q.qabsmax, fix_data(&f, "qabsmax"), (size_t)q.nblocks, 1);
        EXPECT(fix_count(&f, "qabsmax") == q.nblocks && bad == 0, "%s: %d of %lld nested codes differ", cs, bad,
               (long long)q.nblocks);
        bad = count_diff(q.absmax2, fix_data(&f, "absmax2"), (size_t)q.nblocks2, 4);
        EXPECT(fix_count(&f, "absmax2") == q.nblocks2 && q.nblocks2 == 2 && bad == 0, "%s: %d absmax2 differ", cs,
               bad);
    }
    /* and back: the quantised tensor dequantises to the reference's values */
    const int64_t *shape = fix_data(&f, "shape");
    const mt_quant_view_t v = mt_bnb4_view(&q, shape[0], shape[1]);
    float *o = malloc((size_t)n * 4);
    mt_dequant(&v, o, MT_F32);
    bad = count_diff(o, fix_data(&f, "out_f32"), (size_t)n, 4);
    EXPECT(bad == 0, "%s: quantise then dequantise: %d values differ", cs, bad);
    printf("ok   quantize_4bit %-6s: codes, absmax%s identical to the reference\n", cs,
           dq ? " (nested codes, absmax2, offset)" : "");
    free(o);
    mt_bnb4_free(&q);
    fix_free(&f);
}

static void test_ties(void) {
    fix_t f;
    fix_load(&f, "ties");
    const float *x = fix_data(&f, "x");
    const uint8_t *nf4 = fix_data(&f, "nf4"), *fp4 = fix_data(&f, "fp4");
    for (int64_t i = 0; i < fix_count(&f, "x"); i++) {
        EXPECT(mt_bnb_quantize_nf4(x[i]) == nf4[i], "NF4 of %.9g: %d, reference %d", (double)x[i],
               mt_bnb_quantize_nf4(x[i]), nf4[i]);
        EXPECT(mt_bnb_quantize_fp4(x[i]) == fp4[i], "FP4 of %.9g: %d, reference %d", (double)x[i],
               mt_bnb_quantize_fp4(x[i]), fp4[i]);
    }
    float map[256];
    mt_bnb_dynamic_map(map);
    const int bad = count_diff(map, fix_data(&f, "code2"), 256, 4);
    EXPECT(fix_count(&f, "code2") == 256 && bad == 0, "dynamic map: %d of 256 entries differ from torch's", bad);
    printf("ok   %lld values on and beside the NF4/FP4 pivots; the dynamic map\n", (long long)fix_count(&f, "x"));
    fix_free(&f);
}

/* ---- bad buffers ---- */

static void expect_refused(const mt_quant_view_t *q, const mt_quant_sizes_t *have, const char *want1,
                           const char *want2, const char *label) {
    mt_error_t err = {0};
    const mt_status_t st = mt_quant_check(q, have, "model.layers.3.mlp.down_proj.weight", &err);
    EXPECT(st != MT_OK && strstr(err.msg, "model.layers.3.mlp.down_proj.weight") && strstr(err.msg, want1) &&
               strstr(err.msg, want2),
           "%s: status %d, message '%s' (wanted '%s' and '%s')", label, (int)st, err.msg, want1, want2);
}

static void test_bad_inputs(void) {
    uint8_t codes[4096] = {0};
    float scales[64];
    for (int i = 0; i < 64; i++) scales[i] = 0.5f;
    /* FP8 [130, 260] needs a 2 x 3 scale grid */
    mt_quant_view_t q = {.format = MT_QUANT_FP8_BLOCK, .rows = 130, .cols = 260, .block = 128, .block_cols = 128,
                         .codes = codes};
    mt_quant_sizes_t have = {.codes = 130 * 260, .scales = 6};
    expect_refused(&q, &have, "no weight_scale_inv", "expected 6 values", "FP8 without scales");
    q.scales = scales;
    have.scales = 4;
    expect_refused(&q, &have, "weight_scale_inv holds 4 values", "needs 6", "FP8 scales of the wrong shape");
    have.scales = 6;
    const float bad_vals[] = {NAN, 0.0f, -1.0f, INFINITY};
    for (int i = 0; i < 4; i++) {
        scales[4] = bad_vals[i];
        expect_refused(&q, &have, "weight_scale_inv holds", "expected finite, positive", "FP8 bad scale");
    }
    scales[4] = 0.5f;
    /* NF4: absmax missing / NaN / negative (0 is an all-zero block: accepted) */
    mt_quant_view_t n4 = {.format = MT_QUANT_NF4, .rows = 8, .cols = 64, .block = 64, .codes = codes};
    mt_quant_sizes_t hn = {.codes = 256, .scales = 8};
    expect_refused(&n4, &hn, "no absmax", "expected 8 values", "NF4 without absmax");
    n4.scales = scales;
    scales[2] = 0.0f;
    mt_error_t err = {0};
    EXPECT(mt_quant_check(&n4, &hn, "w", &err) == MT_OK, "absmax 0 refused: %s", err.msg);
    scales[2] = -0.25f;
    expect_refused(&n4, &hn, "absmax holds -0.25", "non-negative", "NF4 negative absmax");
    scales[2] = NAN;
    expect_refused(&n4, &hn, "absmax holds nan", "non-negative", "NF4 NaN absmax");
    scales[2] = 0.5f;
    /* block sizes that do not divide the dimension */
    mt_quant_view_t g = {.format = MT_QUANT_INT4, .rows = 16, .cols = 256, .block = 100, .codes = codes,
                         .scales = scales, .zeros = (const int32_t *)(const void *)codes};
    mt_quant_sizes_t hg = {.codes = 512, .scales = 48, .zeros = 6};
    expect_refused(&g, &hg, "group size 100", "must divide in_features (256)", "INT4 group not dividing");
    mt_quant_view_t mx = {.format = MT_QUANT_MXFP4, .rows = 2, .cols = 48, .block = 32, .codes = codes,
                          .scales_u8 = codes};
    mt_quant_sizes_t hm = {.codes = 48, .scales_u8 = 3};
    expect_refused(&mx, &hm, "MXFP4 tensor [2, 48]", "multiple of 32", "MXFP4 row not whole blocks");
    mx.cols = 64;
    hm = (mt_quant_sizes_t){.codes = 64, .scales_u8 = 4};
    codes[1] = 0xFF;
    expect_refused(&mx, &hm, "E8M0 scale [1] is 0xFF", "below 255", "MXFP4 NaN scale");
    codes[1] = 0;
    /* an unknown format */
    mt_quant_view_t u = {.format = MT_QUANT_FORMAT_COUNT, .rows = 1, .cols = 1, .block = 1, .codes = codes};
    expect_refused(&u, &have, "unknown quantised format", "", "unknown format");
    /* the quantiser refuses what bnb cannot code */
    float x[3] = {1.0f, NAN, 2.0f};
    mt_bnb4_t qq;
    EXPECT(mt_bnb4_quantize(x, 3, MT_QUANT_NF4, 64, false, &qq, "lm_head.weight", &err) == MT_ERR_FORMAT &&
               strstr(err.msg, "lm_head.weight") && strstr(err.msg, "[1]"),
           "NaN weight: %s", err.msg);
    EXPECT(mt_bnb4_quantize(scales, 64, MT_QUANT_NF4, 48, false, &qq, "w", &err) == MT_ERR_CONFIG &&
               strstr(err.msg, "power of two"),
           "block 48: %s", err.msg);
    printf("ok   bad buffers refused with the tensor's name and what was expected\n");
}

/* The byte costs docs/quantization.md lists. */
static void test_bytes_per_param(void) {
    const struct {
        mt_quant_format_t f;
        int64_t block;
        bool dq;
        double want;
    } rows[] = {
        {MT_QUANT_FP8_BLOCK, 128, false, 1.000244140625}, {MT_QUANT_MXFP4, 32, false, 0.53125},
        {MT_QUANT_NF4, 64, false, 0.5625},                {MT_QUANT_NF4, 64, true, 0.515869140625},
        {MT_QUANT_INT4, 128, false, 0.53515625},
    };
    for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
        const double got = mt_quant_bytes_per_param(rows[i].f, rows[i].block, rows[i].dq);
        EXPECT(fabs(got - rows[i].want) < 1e-12, "%s%s: %.9g bytes/param, want %.9g",
               mt_quant_format_name(rows[i].f), rows[i].dq ? " dq" : "", got, rows[i].want);
        printf("ok   %-5s%-3s block %4lld: %.5f bytes/param (bf16: 2)\n", mt_quant_format_name(rows[i].f),
               rows[i].dq ? " dq" : "", (long long)rows[i].block, got);
    }
}

int main(void) {
    test_bytes_per_param();
    kern_device_opts_t o = {0};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "CPU device: %s\n", err.msg);
        return 1;
    }
    test_dequant(dev, "fp8", MT_QUANT_FP8_BLOCK);
    test_dequant(dev, "mxfp4", MT_QUANT_MXFP4);
    test_dequant(dev, "nf4", MT_QUANT_NF4);
    test_dequant(dev, "fp4", MT_QUANT_FP4);
    test_dequant(dev, "nf4_dq", MT_QUANT_NF4);
    test_dequant(dev, "gptq", MT_QUANT_INT4);
    test_quantize("nf4", MT_QUANT_NF4, false);
    test_quantize("fp4", MT_QUANT_FP4, false);
    test_quantize("nf4_dq", MT_QUANT_NF4, true);
    test_ties();
    test_bad_inputs();
    kern_device_destroy(dev);
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
