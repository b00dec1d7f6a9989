/* Quantised formats -> fp32 / bf16 (see quant.h, quant_elem.h).  Every
 * value goes through mt_quant_value, the one definition the device kernels
 * share; this file adds the shape and value checks a checkpoint's buffers
 * must pass first. */
#include "base/quant.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

float mt_fp8_e4m3_to_f32(uint8_t b) { return mt_q_e4m3(b); }

float mt_fp8_e5m2_to_f32(uint8_t b) {
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    const int e = (b >> 2) & 0x1F, m = b & 0x3;
    if (e == 0x1F) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexpf((float)m, -16); /* m/4 * 2^(1-15) */
    return sign * ldexpf((float)(4 + m), e - 15 - 2);
}

float mt_fp4_e2m1_to_f32(uint8_t nibble) { return mt_q_e2m1(nibble); }

float mt_e8m0_to_f32(uint8_t s) { return mt_q_e8m0(s); }

size_t mt_first_bad_scale(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(x[i] > 0 && x[i] <= FLT_MAX)) return i; /* NaN fails both */
    return SIZE_MAX;
}

mt_status_t mt_dequant_fp8_e4m3_block(const uint8_t *w, int64_t rows, int64_t cols, const float *scale_inv,
                                      int64_t srows, int64_t scols, int64_t br, int64_t bc, float *out,
                                      const char *what, mt_error_t *err) {
    const mt_quant_view_t q = {.format = MT_QUANT_FP8_BLOCK, .rows = rows, .cols = cols, .block = br,
                               .block_cols = bc, .codes = w, .scales = scale_inv};
    mt_quant_sizes_t want;
    mt_status_t st = mt_quant_expect(&q, &want, what, err);
    if (st != MT_OK) return st;
    if (srows * scols != want.scales || srows != (rows + br - 1) / br)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: weight_scale_inv has shape [%lld, %lld]; an FP8 weight [%lld, %lld] in blocks of "
                            "%lld x %lld needs [%lld, %lld]",
                            what, (long long)srows, (long long)scols, (long long)rows, (long long)cols, (long long)br,
                            (long long)bc, (long long)((rows + br - 1) / br), (long long)((cols + bc - 1) / bc));
    mt_dequant(&q, out, MT_F32);
    return MT_OK;
}

void mt_dequant_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t batch, int64_t rows, int64_t groups,
                      bool transpose, float *out) {
    const int64_t cols = groups * 32;
    const mt_quant_view_t q = {.format = MT_QUANT_MXFP4, .rows = batch * rows, .cols = cols, .block = 32,
                               .codes = blocks, .scales_u8 = scales};
    if (!transpose) {
        mt_dequant(&q, out, MT_F32);
        return;
    }
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t c = 0; c < cols; c++) out[(b * cols + c) * rows + r] = mt_quant_mxfp4_value(&q, b * rows + r, c);
}

const char *mt_quant_format_name(mt_quant_format_t f) {
    switch (f) {
    case MT_QUANT_FP8_BLOCK: return "fp8";
    case MT_QUANT_MXFP4: return "mxfp4";
    case MT_QUANT_NF4: return "nf4";
    case MT_QUANT_FP4: return "fp4";
    case MT_QUANT_INT4: return "gptq";
    default: return "unknown";
    }
}

static int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

static bool is_bnb(mt_quant_format_t f) { return f == MT_QUANT_NF4 || f == MT_QUANT_FP4; }

mt_status_t mt_quant_expect(const mt_quant_view_t *q, mt_quant_sizes_t *want, const char *what, mt_error_t *err) {
    *want = (mt_quant_sizes_t){0};
    const long long R = (long long)q->rows, C = (long long)q->cols, blk = (long long)q->block;
    const char *fmt = mt_quant_format_name(q->format);
    if ((unsigned)q->format >= MT_QUANT_FORMAT_COUNT)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: unknown quantised format %d", what, (int)q->format);
    if (q->rows < 1 || q->cols < 1 || q->block < 1 || (q->format == MT_QUANT_FP8_BLOCK && q->block_cols < 1))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: %s tensor [%lld, %lld] with block %lld: expected positive sizes",
                            what, fmt, R, C, blk);
    const int64_t n = q->rows * q->cols;
    switch (q->format) {
    case MT_QUANT_FP8_BLOCK:
        want->codes = n;
        want->scales = div_up(q->rows, q->block) * div_up(q->cols, q->block_cols);
        break;
    case MT_QUANT_MXFP4:
        if (q->tr_rows < 0 || (q->tr_rows > 0 && (q->tr_rows % 32 || q->rows % q->tr_rows)))
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: MXFP4 tensor [%lld, %lld] held transposed in matrices of %lld rows: expected a "
                                "positive multiple of 32 (one packed row of whole blocks) dividing %lld",
                                what, R, C, (long long)q->tr_rows, R);
        if (q->block != 32 || (q->tr_rows == 0 && q->cols % 32))
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: MXFP4 tensor [%lld, %lld] with blocks of %lld: MXFP4 shares one scale per 32 "
                                "values, so a row must be a multiple of 32",
                                what, R, C, blk);
        want->codes = n / 2;
        want->scales_u8 = n / 32;
        break;
    case MT_QUANT_NF4:
    case MT_QUANT_FP4: {
        const int64_t nb = div_up(n, q->block);
        want->codes = div_up(n, 2);
        if (q->scales_u8 || q->absmax2 || q->code2) {
            if (q->block2 < 1)
                return mt_error_set(err, MT_ERR_FORMAT, "%s: double-quantised absmax with nested block %lld", what,
                                    (long long)q->block2);
            want->scales_u8 = nb;
            want->absmax2 = div_up(nb, q->block2);
            want->code2 = 256;
        } else {
            want->scales = nb;
        }
        break;
    }
    case MT_QUANT_INT4:
        if (q->cols % q->block || q->cols % 8 || q->rows % 8)
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: GPTQ tensor [%lld, %lld] with group size %lld: the group must divide "
                                "in_features (%lld) and in/out_features must be multiples of 8",
                                what, R, C, blk, C);
        want->codes = n / 8;
        want->scales = (q->cols / q->block) * q->rows;
        want->zeros = (q->cols / q->block) * (q->rows / 8);
        break;
    default:
        break;
    }
    return MT_OK;
}

/* One buffer: present when needed, of the required size. */
static mt_status_t check_size(const void *p, int64_t have, int64_t want, const char *buf, const mt_quant_view_t *q,
                              const char *what, mt_error_t *err) {
    if (want == 0) return MT_OK;
    if (!p)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: %s tensor [%lld, %lld] has no %s; expected %lld values", what,
                            mt_quant_format_name(q->format), (long long)q->rows, (long long)q->cols, buf,
                            (long long)want);
    if (have != want)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: %s holds %lld values; a %s tensor [%lld, %lld] in blocks of %lld needs %lld", what,
                            buf, (long long)have, mt_quant_format_name(q->format), (long long)q->rows,
                            (long long)q->cols, (long long)q->block, (long long)want);
    return MT_OK;
}

/* Scales: finite, and > 0 (or >= 0 where an all-zero block is legitimate). */
static mt_status_t check_values(const float *x, int64_t n, bool zero_ok, const char *buf, const char *what,
                                mt_error_t *err) {
    for (int64_t i = 0; i < n; i++)
        if (!(isfinite(x[i]) && (x[i] > 0 || (zero_ok && x[i] == 0))))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s holds %g at [%lld]; expected finite, %s values (the "
                                "checkpoint is damaged)",
                                what, buf, (double)x[i], (long long)i, zero_ok ? "non-negative" : "positive");
    return MT_OK;
}

mt_status_t mt_quant_check(const mt_quant_view_t *q, const mt_quant_sizes_t *have, const char *what,
                           mt_error_t *err) {
    mt_quant_sizes_t want;
    mt_status_t st = mt_quant_expect(q, &want, what, err);
    if (st != MT_OK) return st;
    const bool dq = is_bnb(q->format) && want.scales_u8;
    const char *sname = q->format == MT_QUANT_FP8_BLOCK ? "weight_scale_inv"
                        : is_bnb(q->format)           ? "absmax"
                                                      : "scales";
    if ((st = check_size(q->codes, have->codes, want.codes, "codes", q, what, err)) != MT_OK ||
        (st = check_size(q->scales, have->scales, want.scales, sname, q, what, err)) != MT_OK ||
        (st = check_size(q->scales_u8, have->scales_u8, want.scales_u8, dq ? "absmax codes" : "scales", q, what,
                         err)) != MT_OK ||
        (st = check_size(q->zeros, have->zeros, want.zeros, "qzeros", q, what, err)) != MT_OK ||
        (st = check_size(q->absmax2, have->absmax2, want.absmax2, "nested absmax", q, what, err)) != MT_OK ||
        (st = check_size(q->code2, have->code2, want.code2, "nested quant map", q, what, err)) != MT_OK)
        return st;
    if (want.scales && (st = check_values(q->scales, want.scales, is_bnb(q->format), sname, what, err)) != MT_OK)
        return st;
    if (dq) {
        if ((st = check_values(q->absmax2, want.absmax2, true, "nested absmax", what, err)) != MT_OK) return st;
        for (int i = 0; i < 256; i++)
            if (!isfinite(q->code2[i]) || fabsf(q->code2[i]) > 1.0f)
                return mt_error_set(err, MT_ERR_FORMAT, "%s: nested quant map holds %g at [%d]; expected values in "
                                    "[-1, 1]", what, (double)q->code2[i], i);
        if (!isfinite(q->offset))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: nested offset is %g; expected a finite value", what,
                                (double)q->offset);
    }
    if (q->format == MT_QUANT_MXFP4)
        for (int64_t i = 0; i < want.scales_u8; i++)
            if (q->scales_u8[i] == 0xFF)
                return mt_error_set(err, MT_ERR_FORMAT, "%s: E8M0 scale [%lld] is 0xFF (NaN); expected an exponent "
                                    "byte below 255", what, (long long)i);
    return MT_OK;
}

/* One row loop per format and output type, the format chosen once. */
#define MT_DEQUANT_LOOP(value_fn)                                                              \
    do {                                                                                       \
        for (int64_t r = r0; r < r1; r++) {                                                    \
            if (dt == MT_BF16)                                                                 \
                for (int64_t c = 0; c < v.cols; c++) h[r * v.cols + c] = mt_f32_to_bf16(value_fn(&v, r, c)); \
            else                                                                               \
                for (int64_t c = 0; c < v.cols; c++) f[r * v.cols + c] = value_fn(&v, r, c);   \
        }                                                                                      \
    } while (0)

void mt_dequant_rows(const mt_quant_view_t *q, int64_t r0, int64_t r1, void *out, mt_dtype_t dt) {
    const mt_quant_view_t v = *q; /* a local copy: the compiler sees its fields do not change */
    float *f = out;
    uint16_t *h = out;
    /* the published block sizes get loops of their own, where the compiler
     * knows the divisor (a shift instead of a division per element) */
    switch (v.format) {
    case MT_QUANT_FP8_BLOCK:
        if (v.block == 128 && v.block_cols == 128) MT_DEQUANT_LOOP(mt_quant_fp8_value);
        else MT_DEQUANT_LOOP(mt_quant_fp8_value);
        break;
    case MT_QUANT_MXFP4: MT_DEQUANT_LOOP(mt_quant_mxfp4_value); break;
    case MT_QUANT_NF4:
    case MT_QUANT_FP4:
        if (v.block == 64 && (v.scales || v.block2 == 256)) MT_DEQUANT_LOOP(mt_quant_bnb4_value);
        else MT_DEQUANT_LOOP(mt_quant_bnb4_value);
        break;
    case MT_QUANT_INT4:
        if (v.block == 128) MT_DEQUANT_LOOP(mt_quant_int4_value);
        else MT_DEQUANT_LOOP(mt_quant_int4_value);
        break;
    default: MT_DEQUANT_LOOP(mt_quant_value); break;
    }
}

void mt_dequant(const mt_quant_view_t *q, void *out, mt_dtype_t dt) { mt_dequant_rows(q, 0, q->rows, out, dt); }

double mt_quant_bytes_per_param(mt_quant_format_t f, int64_t block, bool double_quant) {
    switch (f) {
    case MT_QUANT_FP8_BLOCK: return 1.0 + 4.0 / ((double)block * (double)block);
    case MT_QUANT_MXFP4: return 0.5 + 1.0 / (double)block;
    case MT_QUANT_NF4:
    case MT_QUANT_FP4:
        /* double quantisation: one byte per block plus one fp32 per 256 blocks */
        return 0.5 + (double_quant ? (1.0 + 4.0 / 256.0) : 4.0) / (double)block;
    case MT_QUANT_INT4: return 0.5 + (4.0 + 0.5) / (double)block; /* fp32 scale (fp16 on disk: 2) + a 4-bit zero */
    default: return 0.0;
    }
}
