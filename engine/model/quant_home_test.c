/* Quantised homes (quant_home.h): which modules llm_int8_skip_modules
 * names, which roles are quantised, and that a packed home read through a
 * view over a copy of its bytes (as the device reads it) dequantises to
 * what the quantiser's own view gives, with double quantisation and
 * without; a pending home (left over its sources) fills and packs to the
 * same bytes as one packed at once, and frees the source it owns. */
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

/* An FP8 weight's home left pending over its sources (codes and scales
 * apart, as in a checkpoint's mapping): its view dequantises as the
 * sources do, fill writes exactly a packed home's bytes (twice the same:
 * padding zeroed), materialising makes that packed home, and a home let go
 * while pending frees what it owns (ASan's leak check). */
static void test_pending(void) {
    enum { ROWS = 200, COLS = 301 }; /* 2 x 3 blocks of 128, the last ones partial; 8 bytes of padding */
    uint8_t *codes = malloc(ROWS * COLS);
    for (int i = 0; i < ROWS * COLS; i++) codes[i] = (uint8_t)((i * 37 + 11) % 0x7E); /* finite e4m3 codes */
    float scales[6] = {0.5f, 1.0f, 2.0f, 0.25f, 4.0f, 1.5f};
    const mt_quant_view_t v = {.format = MT_QUANT_FP8_BLOCK, .rows = ROWS, .cols = COLS, .block = 128,
                               .block_cols = 128, .codes = codes, .scales = scales};
    const mt_quant_sizes_t have = {.codes = ROWS * COLS, .scales = 6};
    float *want = malloc(ROWS * COLS * sizeof *want), *got = malloc(ROWS * COLS * sizeof *got);
    mt_dequant(&v, want, MT_F32);
    eng_quant_home_t packed, pend;
    eng_quant_home_pack(&packed, &v, &have);
    float *owned = malloc(sizeof scales);
    memcpy(owned, scales, sizeof scales);
    mt_quant_view_t src = v;
    src.scales = owned;
    eng_quant_home_defer(&pend, &src, &have, owned);
    EXPECT(pend.pending && !pend.bytes && pend.nbytes == packed.nbytes && pend.off_scales == packed.off_scales);
    mt_dequant(&pend.view, got, MT_F32);
    EXPECT(memcmp(got, want, ROWS * COLS * sizeof *got) == 0);
    uint8_t *a = malloc(pend.nbytes), *b = malloc(pend.nbytes);
    memset(a, 0xAA, pend.nbytes);
    memset(b, 0x55, pend.nbytes);
    eng_quant_home_fill(&pend, a);
    eng_quant_home_fill(&pend, b);
    EXPECT(memcmp(a, b, pend.nbytes) == 0 && memcmp(a, packed.bytes, packed.nbytes) == 0);
    const mt_quant_view_t dv = eng_quant_home_view_at(&pend, a);
    mt_dequant(&dv, got, MT_F32);
    EXPECT(memcmp(got, want, ROWS * COLS * sizeof *got) == 0);
    eng_quant_home_materialize(&pend);
    EXPECT(!pend.pending && pend.bytes && !pend.owned && memcmp(pend.bytes, packed.bytes, packed.nbytes) == 0);
    EXPECT(pend.view.codes == pend.bytes + pend.off_codes);
    eng_quant_home_free(&pend);
    /* let go while pending: the owned source goes with it */
    float *owned2 = malloc(sizeof scales);
    memcpy(owned2, scales, sizeof scales);
    src.scales = owned2;
    eng_quant_home_defer(&pend, &src, &have, owned2);
    eng_quant_home_drop_bytes(&pend);
    EXPECT(!pend.pending && !pend.owned && !pend.view.codes && pend.nbytes == packed.nbytes);
    eng_quant_home_free(&pend);
    eng_quant_home_free(&packed);
    free(a);
    free(b);
    free(codes);
    free(want);
    free(got);
}

int main(void) {
    test_skip();
    test_pack(false);
    test_pack(true);
    test_pending();
    if (g_fail) fprintf(stderr, "quant_home_test: %d failure(s)\n", g_fail);
    else printf("quant_home_test: ok\n");
    return g_fail ? 1 : 0;
}
