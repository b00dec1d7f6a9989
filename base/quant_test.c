/* Dequantisation against values computed from the formats' definitions:
 * every FP8 code against an fp32 assembled from its fields (E4M3) or the
 * fp16 it is the top byte of (E5M2), the E2M1 values listed in the OCP MX
 * specification, E8M0 powers of two, DeepSeek-style 128x128 block scales
 * with partial edge blocks, and gpt-oss's packed MXFP4 in both layouts. */
#include "base/quant.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"

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

static bool same(float a, float b) {
    if (isnan(a) || isnan(b)) return isnan(a) && isnan(b);
    return memcmp(&a, &b, sizeof a) == 0; /* bit-exact: keeps -0 apart from +0 */
}

/* E4M3 by assembling the fp32 bit pattern: exponent rebiased 7 -> 127,
 * mantissa's 3 bits on top of fp32's 23; subnormals normalised by hand. */
static float e4m3_by_bits(uint8_t b) {
    const uint32_t s = (uint32_t)(b >> 7) << 31;
    int e = (b >> 3) & 0xF;
    uint32_t m = b & 0x7;
    if (e == 0xF && m == 0x7) return NAN;
    if (e == 0 && m == 0) {
        float f;
        memcpy(&f, &s, sizeof f);
        return f;
    }
    if (e == 0) { /* 0.m * 2^-6: shift the leading 1 into place */
        e = 1;
        while (!(m & 0x8)) {
            m <<= 1;
            e--;
        }
        m &= 0x7;
    }
    const uint32_t u = s | (uint32_t)(e - 7 + 127) << 23 | m << 20;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void test_scalars(void) {
    for (int i = 0; i < 256; i++) {
        EXPECT(same(mt_fp8_e4m3_to_f32((uint8_t)i), e4m3_by_bits((uint8_t)i)), "E4M3 0x%02x: %g vs %g", i,
               (double)mt_fp8_e4m3_to_f32((uint8_t)i), (double)e4m3_by_bits((uint8_t)i));
        EXPECT(same(mt_fp8_e5m2_to_f32((uint8_t)i), mt_f16_to_f32((uint16_t)(i << 8))), "E5M2 0x%02x", i);
    }
    EXPECT(mt_fp8_e4m3_to_f32(0x7E) == 448.0f && mt_fp8_e4m3_to_f32(0x38) == 1.0f &&
               mt_fp8_e4m3_to_f32(0xC0) == -2.0f && mt_fp8_e4m3_to_f32(0x01) == 0x1p-9f &&
               mt_fp8_e4m3_to_f32(0x08) == 0x1p-6f && isnan(mt_fp8_e4m3_to_f32(0xFF)) &&
               same(mt_fp8_e4m3_to_f32(0x80), -0.0f),
           "E4M3 landmarks: max 448, 1, -2, smallest subnormal 2^-9, smallest normal 2^-6, NaN, -0");
    static const float k_e2m1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                     -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    for (int i = 0; i < 16; i++)
        EXPECT(same(mt_fp4_e2m1_to_f32((uint8_t)i), k_e2m1[i]) && same(mt_fp4_e2m1_to_f32((uint8_t)(0xF0 | i)), k_e2m1[i]),
               "E2M1 %d: %g", i, (double)mt_fp4_e2m1_to_f32((uint8_t)i));
    EXPECT(mt_e8m0_to_f32(127) == 1.0f && mt_e8m0_to_f32(128) == 2.0f && mt_e8m0_to_f32(120) == 0x1p-7f &&
               mt_e8m0_to_f32(0) == 0x1p-127f && mt_e8m0_to_f32(254) == 0x1p127f && isnan(mt_e8m0_to_f32(255)),
           "E8M0 2^(s-127), 0xFF NaN");
}

/* A weight of 130 x 257 in 128 x 128 blocks: scales 2 x 3, the last block
 * row 2 rows high and the last block column 1 column wide. */
static void test_fp8_blocks(void) {
    const int64_t R = 130, C = 257, SR = 2, SC = 3;
    uint8_t *w = malloc((size_t)(R * C));
    float *out = malloc((size_t)(R * C) * sizeof *out);
    float scale[6];
    for (int i = 0; i < 6; i++) scale[i] = 0.25f * (float)(i + 1);
    for (int64_t i = 0; i < R * C; i++) w[i] = (uint8_t)((i * 37 + 11) % 256 == 0x7F ? 0 : (i * 37 + 11) % 256);
    w[0] = 0x38;                    /* 1.0 in block (0, 0): 0.25 */
    w[129 * C + 256] = 0xC0;        /* -2.0 in the corner block (1, 2): -2 * 1.5 */
    w[127 * C + 128] = 0x7E;        /* 448 in block (0, 1): 448 * 0.5 */
    w[128 * C + 127] = 0x01;        /* 2^-9 in block (1, 0): 2^-9 * 1.0 */
    mt_error_t err = {0};
    mt_status_t st = mt_dequant_fp8_e4m3_block(w, R, C, scale, SR, SC, 128, 128, out, "layers.0.q_a_proj.weight", &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) {
        EXPECT(out[0] == 0.25f && out[129 * C + 256] == -3.0f && out[127 * C + 128] == 224.0f &&
                   out[128 * C + 127] == 0x1p-9f,
               "landmarks %g %g %g %g", (double)out[0], (double)out[129 * C + 256], (double)out[127 * C + 128],
               (double)out[128 * C + 127]);
        int bad = 0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                bad += !same(out[r * C + c], e4m3_by_bits(w[r * C + c]) * scale[(r / 128) * SC + c / 128]);
        EXPECT(bad == 0, "%d elements differ from fp8 * scale_inv of their block", bad);
    }
    /* a scale grid sized for full blocks only is refused, naming the tensor and the shape needed */
    st = mt_dequant_fp8_e4m3_block(w, R, C, scale, 1, 2, 128, 128, out, "layers.0.q_a_proj.weight", &err);
    EXPECT(st == MT_ERR_FORMAT && strstr(err.msg, "layers.0.q_a_proj.weight") && strstr(err.msg, "[1, 2]") &&
               strstr(err.msg, "needs [2, 3]"),
           "%s", err.msg);
    free(w);
    free(out);
}

/* MXFP4: 2 experts x 3 rows x 2 groups of 32, random bytes and scales. */
static void test_mxfp4(void) {
    const int64_t B = 2, R = 3, G = 2, C = G * 32;
    uint8_t blocks[2 * 3 * 2 * 16], scales[2 * 3 * 2];
    uint32_t x = 12345;
    for (size_t i = 0; i < sizeof blocks; i++) blocks[i] = (uint8_t)((x = x * 1664525u + 1013904223u) >> 24);
    for (size_t i = 0; i < sizeof scales; i++) scales[i] = (uint8_t)(120 + ((x = x * 1664525u + 1013904223u) >> 29));
    blocks[0] = 0x21; /* low nibble 1 (0.5) first, then 2 (1.0) */
    scales[0] = 128;  /* x 2 */
    float packed[2 * 3 * 64], tr[2 * 64 * 3];
    mt_dequant_mxfp4(blocks, scales, B, R, G, false, packed);
    mt_dequant_mxfp4(blocks, scales, B, R, G, true, tr);
    EXPECT(packed[0] == 1.0f && packed[1] == 2.0f, "low nibble first: %g %g", (double)packed[0], (double)packed[1]);
    int bad = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t k = 0; k < C; k++) {
                const int64_t g = k / 32, j = (k % 32) / 2;
                const uint8_t byte = blocks[((b * R + r) * G + g) * 16 + j];
                const uint8_t nib = k % 2 ? byte >> 4 : byte & 0xF;
                const float want = mt_fp4_e2m1_to_f32(nib) * ldexpf(1.0f, scales[(b * R + r) * G + g] - 127);
                bad += !same(packed[(b * R + r) * C + k], want) || !same(tr[(b * C + k) * R + r], want);
            }
    EXPECT(bad == 0, "%d values differ from e2m1 * 2^(s-127)", bad);
    /* the same bytes as a transposed view (a quantised home of gpt-oss's
     * experts): what the dequant kernels make equals transformers' layout */
    const mt_quant_view_t v = {.format = MT_QUANT_MXFP4, .rows = B * C, .cols = R, .block = 32, .tr_rows = C,
                               .codes = blocks, .scales_u8 = scales};
    const mt_quant_sizes_t have = {.codes = (int64_t)sizeof blocks, .scales_u8 = (int64_t)sizeof scales};
    mt_error_t err = {0};
    EXPECT(mt_quant_check(&v, &have, "tr", &err) == MT_OK, "%s", err.msg);
    float viewed[2 * 64 * 3];
    mt_dequant(&v, viewed, MT_F32);
    EXPECT(memcmp(viewed, tr, sizeof tr) == 0, "the transposed view differs from mt_dequant_mxfp4(transpose)");
    mt_quant_view_t w = v;
    w.tr_rows = 48; /* not whole blocks */
    EXPECT(mt_quant_check(&w, &have, "tr", &err) == MT_ERR_FORMAT && strstr(err.msg, "multiple of 32"),
           "tr_rows 48 accepted: %s", err.msg);
    w.tr_rows = 32;
    w.rows = B * C + 32; /* whole matrices of 32 rows, more than the buffers hold */
    EXPECT(mt_quant_check(&w, &have, "tr", &err) == MT_ERR_FORMAT, "a view larger than its buffers accepted");
}

/* Block scales are finite and positive: 0, a negative, NaN and Inf are each found at their index. */
static void test_bad_scales(void) {
    float s[4] = {1.0f, 0x1p-20f, 3.5f, 448.0f};
    EXPECT(mt_first_bad_scale(s, 4) == SIZE_MAX && mt_first_bad_scale(s, 0) == SIZE_MAX, "good scales refused");
    const float bad[] = {0.0f, -0.0f, -1.0f, NAN, INFINITY, -INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        s[2] = bad[i];
        EXPECT(mt_first_bad_scale(s, 4) == 2, "scale %g not found at index 2", (double)bad[i]);
    }
}

int main(void) {
    test_scalars();
    test_bad_scales();
    test_fp8_blocks();
    test_mxfp4();
    if (failures) fprintf(stderr, "quant_test: %d failure(s)\n", failures);
    else printf("quant_test: all passed\n");
    return failures != 0;
}
