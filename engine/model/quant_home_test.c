/* Quantised homes (quant_home.h): which modules llm_int8_skip_modules
 * names, which roles are quantised, and that a packed home read through a
 * view over a copy of its bytes (as the device reads it) dequantises to
 * what the quantiser's own view gives, with double quantisation and without. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/quant_home.h"

static int g_fail;
#define EXPECT(c)                                                       \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #c); \
            g_fail++;                                                   \
        }                                                               \
    } while (0)

static void test_skip(void) {
    static const char skip[3][128] = {"o_proj", "mlp.experts", "self_attn.q"};
    EXPECT(eng_quant_home_skipped("model.layers.0.self_attn.o_proj.weight", skip, 3));
    EXPECT(eng_quant_home_skipped("model.layers.1.mlp.experts.3.down_proj.weight", skip, 3));
    EXPECT(!eng_quant_home_skipped("model.layers.0.self_attn.q_proj.weight", skip, 3)); /* "self_attn.q" is no part */
    EXPECT(!eng_quant_home_skipped("model.layers.0.self_attn.oo_proj.weight", skip, 3));
    EXPECT(!eng_quant_home_skipped("model.layers.0.mlp.shared_expert.up_proj.weight", skip, 3));
    EXPECT(!eng_quant_home_skipped("model.layers.0.self_attn.o_proj.weight", skip, 0));
    EXPECT(eng_quant_home_role_ok(ENG_P_Q) && eng_quant_home_role_ok(ENG_P_EXP_DOWN));
    EXPECT(!eng_quant_home_role_ok(ENG_P_ROUTER) && !eng_quant_home_role_ok(ENG_P_EMBED) &&
           !eng_quant_home_role_ok(ENG_P_LM_HEAD) && !eng_quant_home_role_ok(ENG_P_SHARED_EXPERT_GATE) &&
           !eng_quant_home_role_ok(ENG_P_ATTN_NORM));
}

static void test_pack(bool dq) {
    const int64_t rows = 24, cols = 80, n = rows * cols; /* 30 blocks of 64 */
    float *x = malloc((size_t)n * sizeof *x), *want = malloc((size_t)n * sizeof *want),
          *got = malloc((size_t)n * sizeof *got);
    for (int64_t i = 0; i < n; i++) x[i] = (float)sin((double)i * 0.37) * (float)(1 + i % 7);
    for (int64_t i = 128; i < 192; i++) x[i] = 0; /* an all-zero block: absmax 0 */
    mt_bnb4_t q;
    mt_error_t err = {0};
    EXPECT(mt_bnb4_quantize(x, n, MT_QUANT_NF4, 64, dq, &q, "t", &err) == MT_OK);
    const mt_quant_view_t v = mt_bnb4_view(&q, rows, cols);
    mt_dequant(&v, want, MT_F32);
    eng_quant_home_t h;
    EXPECT(eng_quant_home_bnb4(&h, x, rows, cols, MT_QUANT_NF4, dq, "t", &err) == MT_OK);
    EXPECT(h.nbytes >= (size_t)(n / 2) && h.nbytes < (size_t)(n / 2) + (size_t)(n / 64) * 4 + 2048);
    EXPECT((h.off_scales == SIZE_MAX) == dq && (h.off_code2 == SIZE_MAX) == !dq);
    uint8_t *copy = malloc(h.nbytes); /* the bytes where a device would hold them */
    memcpy(copy, h.bytes, h.nbytes);
    const mt_quant_view_t dv = eng_quant_home_view_at(&h, copy);
    mt_dequant(&dv, got, MT_F32);
    EXPECT(memcmp(got, want, (size_t)n * sizeof *got) == 0);
    memset(got, 0, (size_t)n * sizeof *got);
    mt_dequant(&h.view, got, MT_F32);
    EXPECT(memcmp(got, want, (size_t)n * sizeof *got) == 0);
    /* a non-finite value is refused naming the tensor */
    x[5] = NAN;
    eng_quant_home_t bad;
    EXPECT(eng_quant_home_bnb4(&bad, x, rows, cols, MT_QUANT_NF4, dq, "layer.q_proj.weight", &err) != MT_OK &&
           strstr(err.msg, "layer.q_proj.weight"));
    eng_quant_home_free(&h);
    mt_bnb4_free(&q);
    free(copy);
    free(x);
    free(want);
    free(got);
}

int main(void) {
    test_skip();
    test_pack(false);
    test_pack(true);
    if (g_fail) fprintf(stderr, "quant_home_test: %d failure(s)\n", g_fail);
    else printf("quant_home_test: ok\n");
    return g_fail ? 1 : 0;
}
