/* Block-scaled formats -> fp32 (see quant.h).  Values are built with
 * ldexpf from the fields each format defines, so the code reads as the
 * definition does. */
#include "base/quant.h"

#include <float.h>
#include <math.h>
#include <stdint.h>

float mt_fp8_e4m3_to_f32(uint8_t b) {
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    const int e = (b >> 3) & 0xF, m = b & 0x7;
    if (e == 0xF && m == 0x7) return NAN; /* the only NaN encodings; E4M3FN has no infinities */
    if (e == 0) return sign * ldexpf((float)m, -9); /* subnormal: m/8 * 2^(1-7) */
    return sign * ldexpf((float)(8 + m), e - 7 - 3); /* (1 + m/8) * 2^(e-7) */
}

float mt_fp8_e5m2_to_f32(uint8_t b) {
    const float sign = (b & 0x80) ? -1.0f : 1.0f;
    const int e = (b >> 2) & 0x1F, m = b & 0x3;
    if (e == 0x1F) return m ? NAN : sign * INFINITY;
    if (e == 0) return sign * ldexpf((float)m, -16); /* m/4 * 2^(1-15) */
    return sign * ldexpf((float)(4 + m), e - 15 - 2);
}

float mt_fp4_e2m1_to_f32(uint8_t nibble) {
    const float sign = (nibble & 0x8) ? -1.0f : 1.0f;
    const int e = (nibble >> 1) & 0x3, m = nibble & 0x1;
    if (e == 0) return sign * 0.5f * (float)m; /* subnormal: m/2 * 2^(1-1) */
    return sign * ldexpf((float)(2 + m), e - 1 - 1); /* (1 + m/2) * 2^(e-1) */
}

float mt_e8m0_to_f32(uint8_t s) {
    return s == 0xFF ? NAN : ldexpf(1.0f, (int)s - 127);
}

size_t mt_first_bad_scale(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(x[i] > 0 && x[i] <= FLT_MAX)) return i; /* NaN fails both */
    return SIZE_MAX;
}

mt_status_t mt_dequant_fp8_e4m3_block(const uint8_t *w, int64_t rows, int64_t cols, const float *scale_inv,
                                      int64_t srows, int64_t scols, int64_t br, int64_t bc, float *out,
                                      const char *what, mt_error_t *err) {
    if (rows < 0 || cols < 0 || br < 1 || bc < 1)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: FP8 weight [%lld, %lld] with blocks of %lld x %lld", what,
                            (long long)rows, (long long)cols, (long long)br, (long long)bc);
    const int64_t want_r = (rows + br - 1) / br, want_c = (cols + bc - 1) / bc;
    if (srows != want_r || scols != want_c)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: weight_scale_inv has shape [%lld, %lld]; an FP8 weight [%lld, %lld] in blocks of "
                            "%lld x %lld needs [%lld, %lld]",
                            what, (long long)srows, (long long)scols, (long long)rows, (long long)cols, (long long)br,
                            (long long)bc, (long long)want_r, (long long)want_c);
    float lut[256];
    for (int i = 0; i < 256; i++) lut[i] = mt_fp8_e4m3_to_f32((uint8_t)i);
    for (int64_t r = 0; r < rows; r++) {
        const float *srow = scale_inv + (r / br) * scols;
        const uint8_t *wr = w + r * cols;
        float *o = out + r * cols;
        for (int64_t c = 0; c < cols; c++) o[c] = lut[wr[c]] * srow[c / bc];
    }
    return MT_OK;
}

void mt_dequant_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t batch, int64_t rows, int64_t groups,
                      bool transpose, float *out) {
    float lut[16];
    for (int i = 0; i < 16; i++) lut[i] = mt_fp4_e2m1_to_f32((uint8_t)i);
    const int64_t cols = groups * 32;
    for (int64_t b = 0; b < batch; b++)
        for (int64_t r = 0; r < rows; r++)
            for (int64_t g = 0; g < groups; g++) {
                const float s = mt_e8m0_to_f32(scales[(b * rows + r) * groups + g]);
                const uint8_t *blk = blocks + ((b * rows + r) * groups + g) * 16;
                for (int j = 0; j < 16; j++) {
                    /* the low nibble is the even element, the high nibble the odd one */
                    const int64_t c = g * 32 + 2 * j;
                    const float lo = lut[blk[j] & 0xF] * s, hi = lut[blk[j] >> 4] * s;
                    if (transpose) {
                        out[(b * cols + c) * rows + r] = lo;
                        out[(b * cols + c + 1) * rows + r] = hi;
                    } else {
                        out[(b * rows + r) * cols + c] = lo;
                        out[(b * rows + r) * cols + c + 1] = hi;
                    }
                }
            }
}
