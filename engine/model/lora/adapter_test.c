/* PEFT adapter files: adapter_config.json written and read back; every
 * refused option with the file and key in its message; the fixtures'
 * adapters (tests/fixtures/lora_*) read with the shapes the description
 * gives; weights written and read back byte-identical, with the keys and
 * bytes of the fixture file; the fused transformers-5 layout converted to
 * per-expert pairs, both on hand-made tensors whose values encode where
 * they must land and against the per-expert fixture; shape, missing-factor
 * and unknown-module errors naming the tensor. */
#include "engine/model/lora/adapter.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/model/hf/model_config.h"
#include "engine/model/io/safetensors.h"

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

static char g_tmp[256];

static const char *tmp_path(const char *name) {
    static char buf[4][512];
    static int k;
    k = (k + 1) % 4;
    snprintf(buf[k], sizeof buf[k], "%s/%s", g_tmp, name);
    return buf[k];
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

typedef struct {
    eng_model_config_t cfg;
    eng_model_desc_t d;
} model_t;

static bool load(const char *fixture, model_t *m) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s/ckpt", fixture);
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_load(dir, NULL, &m->cfg, &err);
    if (st == MT_OK) st = eng_model_desc_build(&m->cfg, &m->d, &err);
    EXPECT(st == MT_OK, "%s: %s", dir, err.msg);
    return st == MT_OK;
}

static void unload(model_t *m) {
    eng_model_desc_free(&m->d);
    eng_model_config_free(&m->cfg);
}

/* ---- adapter_config.json ---------------------------------------------------- */

static void test_config_roundtrip(void) {
    char *mods[] = {"q_proj", "w1"};
    char *save[] = {"lm_head"};
    eng_lora_config_t c = {.base_model_name_or_path = "ckpt", .r = 8, .lora_alpha = 16, .lora_dropout = 0.05,
                           .use_rslora = true, .target_modules = mods, .num_target_modules = 2,
                           .modules_to_save = save, .num_modules_to_save = 1};
    mt_error_t err = {0};
    const char *p = tmp_path("adapter_config.json");
    EXPECT(eng_lora_config_write(p, &c, &err) == MT_OK, "%s", err.msg);
    eng_lora_config_t r;
    EXPECT(eng_lora_config_read(p, &r, &err) == MT_OK, "%s", err.msg);
    EXPECT(r.r == 8 && r.lora_alpha == 16 && r.lora_dropout == 0.05 && r.use_rslora, "scalars");
    EXPECT(r.num_target_modules == 2 && !strcmp(r.target_modules[1], "w1") && !r.target_regex, "targets");
    EXPECT(r.num_modules_to_save == 1 && !strcmp(r.modules_to_save[0], "lm_head"), "modules_to_save");
    EXPECT(r.base_model_name_or_path && !strcmp(r.base_model_name_or_path, "ckpt"), "base model");
    EXPECT(eng_lora_scale(&r) > 5.656 && eng_lora_scale(&r) < 5.657, "rsLoRA scale 16/sqrt(8): %g", eng_lora_scale(&r));
    eng_lora_config_free(&r);

    /* PEFT's own fields the writer must produce */
    json_error_t je;
    json_t *o = json_load_file(p, 0, &je);
    EXPECT(o && !strcmp(json_string_value(json_object_get(o, "peft_type")), "LORA") &&
               !strcmp(json_string_value(json_object_get(o, "task_type")), "CAUSAL_LM") &&
               !strcmp(json_string_value(json_object_get(o, "bias")), "none") &&
               json_is_false(json_object_get(o, "fan_in_fan_out")),
           "written config lacks PEFT fields");
    json_decref(o);

    /* a regex target_modules stays a string */
    eng_lora_config_t c2 = {.r = 4, .lora_alpha = 4, .target_regex = ".*\\.q_proj"};
    EXPECT(eng_lora_config_write(p, &c2, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_config_read(p, &r, &err) == MT_OK && r.target_regex && !strcmp(r.target_regex, ".*\\.q_proj") &&
               r.num_target_modules == 0 && eng_lora_scale(&r) == 1.0,
           "regex round trip: %s", err.msg);
    eng_lora_config_free(&r);
}

static void expect_refused(const char *extra, const char *key, mt_status_t code) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8,"
             " \"target_modules\": [\"q_proj\"], %s}",
             extra);
    const char *p = tmp_path("refused.json");
    write_text(p, text);
    eng_lora_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_lora_config_read(p, &c, &err);
    EXPECT(st == code, "%s: status %d, want %d (%s)", extra, st, code, err.msg);
    char quoted[96];
    snprintf(quoted, sizeof quoted, "'%s'", key);
    EXPECT(strstr(err.msg, p) && strstr(err.msg, quoted), "%s: message does not name file and %s: %s", extra, key,
           err.msg);
    if (st == MT_OK) eng_lora_config_free(&c);
}

static void expect_accepted(const char *extra) {
    char text[1024];
    snprintf(text, sizeof text,
             "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\"], %s}", extra);
    const char *p = tmp_path("accepted.json");
    write_text(p, text);
    eng_lora_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_OK, "%s refused: %s", extra, err.msg);
    eng_lora_config_free(&c);
}

static void test_config_refusals(void) {
    expect_refused("\"use_dora\": true", "use_dora", MT_ERR_UNSUPPORTED);
    expect_refused("\"bias\": \"all\"", "bias", MT_ERR_UNSUPPORTED);
    expect_refused("\"bias\": \"lora_only\"", "bias", MT_ERR_UNSUPPORTED);
    expect_refused("\"fan_in_fan_out\": true", "fan_in_fan_out", MT_ERR_UNSUPPORTED);
    expect_refused("\"rank_pattern\": {\"q_proj\": 8}", "rank_pattern", MT_ERR_UNSUPPORTED);
    expect_refused("\"alpha_pattern\": {\"q_proj\": 8}", "alpha_pattern", MT_ERR_UNSUPPORTED);
    expect_refused("\"init_lora_weights\": \"pissa\"", "init_lora_weights", MT_ERR_UNSUPPORTED);
    expect_refused("\"init_lora_weights\": \"olora\"", "init_lora_weights", MT_ERR_UNSUPPORTED);
    expect_refused("\"layers_to_transform\": [0]", "layers_to_transform", MT_ERR_UNSUPPORTED);
    expect_refused("\"lora_bias\": true", "lora_bias", MT_ERR_UNSUPPORTED);
    expect_refused("\"task_type\": \"SEQ_CLS\"", "task_type", MT_ERR_UNSUPPORTED);
    expect_refused("\"lora_dropout\": 1.5", "lora_dropout", MT_ERR_FORMAT);
    /* what PEFT writes by default is accepted */
    expect_accepted("\"use_dora\": false, \"bias\": \"none\", \"fan_in_fan_out\": false, \"rank_pattern\": {},"
                    " \"alpha_pattern\": {}, \"init_lora_weights\": true, \"layers_to_transform\": null");
    expect_accepted("\"init_lora_weights\": \"gaussian\"");

    const char *p = tmp_path("ia3.json");
    write_text(p, "{\"peft_type\": \"IA3\", \"target_modules\": [\"q_proj\"]}");
    eng_lora_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_ERR_UNSUPPORTED && strstr(err.msg, "'peft_type'"), "%s", err.msg);
    write_text(p, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8}");
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_ERR_FORMAT && strstr(err.msg, "'target_modules'"), "%s", err.msg);
    EXPECT(eng_lora_config_read(tmp_path("missing.json"), &c, &err) == MT_ERR_IO, "%s", err.msg);
}

/* ---- weights ------------------------------------------------------------------ */

static bool same_tensor_bytes(const eng_st_file_t *a, const eng_st_file_t *b, const char *name) {
    const eng_st_tensor_t *x = eng_st_find(a, name), *y = eng_st_find(b, name);
    return x && y && x->dtype == y->dtype && x->end - x->begin == y->end - y->begin &&
           memcmp(x->data, y->data, x->end - x->begin) == 0;
}

static void test_fixture(const char *fixture) {
    model_t m;
    if (!load(fixture, &m)) return;
    char path[256], cpath[256];
    snprintf(cpath, sizeof cpath, "tests/fixtures/%s/adapter_init/adapter_config.json", fixture);
    eng_lora_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_lora_config_read(cpath, &c, &err) == MT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "tests/fixtures/%s/expected.json", fixture);
    json_error_t je;
    json_t *exp = json_load_file(path, 0, &je);
    EXPECT(exp, "%s", je.text);
    const double want_scale = exp ? json_number_value(json_object_get(exp, "scaling")) : 0;
    EXPECT(eng_lora_scale(&c) == want_scale, "%s: scale %g, reference %g", fixture, eng_lora_scale(&c), want_scale);

    for (int which = 0; which < 2; which++) {
        snprintf(path, sizeof path, "tests/fixtures/%s/%s/adapter_model.safetensors", fixture,
                 which ? "adapter_final" : "adapter_init");
        eng_lora_weights_t w;
        EXPECT(eng_lora_weights_read(path, &m.d, c.r, &w, &err) == MT_OK, "%s: %s", path, err.msg);
        json_t *mods = exp ? json_object_get(exp, "adapted_modules") : NULL;
        EXPECT((size_t)w.count == json_array_size(mods), "%s: %d pairs, reference %zu", path, w.count,
               json_array_size(mods));
        for (int i = 0; i < w.count; i++) {
            const eng_lora_pair_t *pr = &w.pairs[i];
            const eng_param_spec_t *ps = &m.d.params[pr->param];
            EXPECT(pr->out == ps->shape[0] && pr->in == ps->shape[1] && pr->r == c.r, "%s: %s", path, ps->name);
            char mod[160];
            snprintf(mod, sizeof mod, "%.*s", (int)(strlen(ps->name) - 7), ps->name);
            EXPECT(i >= (int)json_array_size(mods) || !strcmp(mod, json_string_value(json_array_get(mods, (size_t)i))),
                   "%s: pair %d is %s", path, i, mod);
        }
        /* the file adapts exactly what its config selects */
        eng_lora_select_t sel;
        eng_lora_config_select(&c, &sel);
        eng_lora_plan_t plan;
        EXPECT(eng_lora_targets_select(&m.d, &sel, &plan, &err) == MT_OK, "%s", err.msg);
        EXPECT(eng_lora_weights_match(&w, &plan, &m.d, path, &err) == MT_OK, "%s", err.msg);
        if (plan.count > 1) { /* one module fewer selected: named */
            plan.count--;
            EXPECT(eng_lora_weights_match(&w, &plan, &m.d, path, &err) == MT_ERR_CONFIG &&
                       strstr(err.msg, m.d.params[w.pairs[w.count - 1].param].name),
                   "%s", err.msg);
        }
        eng_lora_plan_free(&plan);

        /* write and read back: same keys, byte-identical data, as the fixture */
        const char *out = tmp_path("adapter_model.safetensors");
        EXPECT(eng_lora_weights_write(out, &m.d, &w, NULL, 0, &err) == MT_OK, "%s", err.msg);
        eng_st_file_t fa, fb;
        if (eng_st_open(path, &fa, &err) == MT_OK) {
            if (eng_st_open(out, &fb, &err) == MT_OK) {
                EXPECT(fa.count == fb.count, "%s: %d tensors written, fixture %d", path, fb.count, fa.count);
                for (int i = 0; i < fa.count; i++) {
                    EXPECT(!strcmp(fa.tensors[i].name, fb.tensors[i].name), "order: %s vs %s", fa.tensors[i].name,
                           fb.tensors[i].name);
                    EXPECT(same_tensor_bytes(&fa, &fb, fa.tensors[i].name), "%s differs", fa.tensors[i].name);
                }
                eng_st_close(&fb);
            }
            eng_st_close(&fa);
        }
        eng_lora_weights_t w2;
        EXPECT(eng_lora_weights_read(out, &m.d, c.r, &w2, &err) == MT_OK, "%s", err.msg);
        EXPECT(w2.count == w.count, "reread count");
        for (int i = 0; i < w.count && i < w2.count; i++)
            EXPECT(w2.pairs[i].param == w.pairs[i].param &&
                       !memcmp(w2.pairs[i].a, w.pairs[i].a, (size_t)w.pairs[i].r * w.pairs[i].in * sizeof(float)) &&
                       !memcmp(w2.pairs[i].b, w.pairs[i].b, (size_t)w.pairs[i].out * w.pairs[i].r * sizeof(float)),
                   "pair %d differs after write/read", i);
        eng_lora_weights_free(&w2);

        /* the fused layout of the same adapter gives the same pairs, bit for bit */
        snprintf(path, sizeof path, "tests/fixtures/%s/adapter_init/adapter_model_fused.safetensors", fixture);
        if (which == 0 && access(path, R_OK) == 0) {
            eng_lora_weights_t wf;
            EXPECT(eng_lora_weights_read(path, &m.d, c.r, &wf, &err) == MT_OK, "%s: %s", path, err.msg);
            EXPECT(wf.count == w.count, "fused: %d pairs, per-expert %d", wf.count, w.count);
            for (int i = 0; i < w.count && i < wf.count; i++) {
                const eng_lora_pair_t *x = &w.pairs[i], *y = &wf.pairs[i];
                EXPECT(x->param == y->param && x->r == y->r &&
                           !memcmp(x->a, y->a, (size_t)x->r * x->in * sizeof(float)) &&
                           !memcmp(x->b, y->b, (size_t)x->out * x->r * sizeof(float)),
                       "fused pair %d (%s) differs from per-expert", i, m.d.params[x->param].name);
            }
            eng_lora_weights_free(&wf);
        }
        eng_lora_weights_free(&w);
    }
    json_decref(exp);
    eng_lora_config_free(&c);
    unload(&m);
}

/* Hand-made fused tensors on Mixtral (E 4, H 16, I 8), block `mlp` as
 * transformers 5 names it.  Values encode their destination:
 * A[(e*r + k), j] = 100e + 10k + j/100, B[o, k*E + e] = 1000 + 100o + 10k + e. */
static void test_fused_hand(void) {
    model_t m;
    if (!load("lora_mixtral_attn", &m)) return;
    const int E = 4, r = 2, H = 16, I = 8;
    static float agu[4 * 2 * 16], bgu[16 * 4 * 2], adn[4 * 2 * 8], bdn[16 * 4 * 2];
    for (int e = 0; e < E; e++)
        for (int k = 0; k < r; k++) {
            for (int j = 0; j < H; j++) agu[(e * r + k) * H + j] = 100.f * e + 10.f * k + j / 100.f;
            for (int j = 0; j < I; j++) adn[(e * r + k) * I + j] = -(100.f * e + 10.f * k + j / 100.f);
        }
    for (int o = 0; o < 2 * I; o++)
        for (int k = 0; k < r; k++)
            for (int e = 0; e < E; e++) bgu[o * E * r + k * E + e] = 1000.f + 100.f * o + 10.f * k + e;
    for (int o = 0; o < H; o++)
        for (int k = 0; k < r; k++)
            for (int e = 0; e < E; e++) bdn[o * E * r + k * E + e] = -(1000.f + 100.f * o + 10.f * k + e);
    const int64_t s_agu[2] = {E * r, H}, s_bgu[2] = {2 * I, E * r}, s_adn[2] = {E * r, I}, s_bdn[2] = {H, E * r};
    const eng_st_write_tensor_t t[4] = {
        {"base_model.model.model.layers.1.mlp.experts.base_layer.lora_A.weight", ENG_ST_F32, 2, s_agu, NULL, agu},
        {"base_model.model.model.layers.1.mlp.experts.base_layer.lora_B.weight", ENG_ST_F32, 2, s_bgu, NULL, bgu},
        {"base_model.model.model.layers.1.mlp.experts.lora_A.weight", ENG_ST_F32, 2, s_adn, NULL, adn},
        {"base_model.model.model.layers.1.mlp.experts.lora_B.weight", ENG_ST_F32, 2, s_bdn, NULL, bdn},
    };
    mt_error_t err = {0};
    const char *p = tmp_path("fused_hand.safetensors");
    EXPECT(eng_st_write(p, t, 4, NULL, 0, &err) == MT_OK, "%s", err.msg);
    eng_lora_weights_t w;
    EXPECT(eng_lora_weights_read(p, &m.d, r, &w, &err) == MT_OK, "%s", err.msg);
    EXPECT(w.count == 3 * E, "%d pairs", w.count);
    int bad = 0;
    for (int e = 0; e < E; e++) {
        const eng_lora_pair_t *g = eng_lora_weights_find(&w, eng_model_desc_find_role(&m.d, 1, ENG_P_EXP_GATE, e));
        const eng_lora_pair_t *u = eng_lora_weights_find(&w, eng_model_desc_find_role(&m.d, 1, ENG_P_EXP_UP, e));
        const eng_lora_pair_t *dn = eng_lora_weights_find(&w, eng_model_desc_find_role(&m.d, 1, ENG_P_EXP_DOWN, e));
        EXPECT(g && u && dn, "expert %d missing", e);
        if (!g || !u || !dn) continue;
        EXPECT(g->r == r && u->r == r && dn->r == r && g->out == I && g->in == H && dn->out == H && dn->in == I,
               "expert %d shapes", e);
        for (int k = 0; k < r; k++) {
            for (int j = 0; j < H; j++) {
                const float want = 100.f * e + 10.f * k + j / 100.f;
                bad += g->a[k * H + j] != want || u->a[k * H + j] != want; /* gate and up share A */
            }
            for (int j = 0; j < I; j++) bad += dn->a[k * I + j] != -(100.f * e + 10.f * k + j / 100.f);
            for (int o = 0; o < I; o++) {
                bad += g->b[o * r + k] != 1000.f + 100.f * o + 10.f * k + e;       /* gate rows 0..I-1 */
                bad += u->b[o * r + k] != 1000.f + 100.f * (o + I) + 10.f * k + e; /* up rows I..2I-1 */
            }
            for (int o = 0; o < H; o++) bad += dn->b[o * r + k] != -(1000.f + 100.f * o + 10.f * k + e);
        }
    }
    EXPECT(bad == 0, "%d elements landed in the wrong place", bad);
    eng_lora_weights_free(&w);

    /* gate_up alone at twice the config's rank with a full (not block-diagonal)
     * B, as PEFT trains it on transformers 5: gate and up keep rank 2 and share A */
    EXPECT(eng_st_write(p, t, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 1, &w, &err) == MT_OK, "%s", err.msg);
    EXPECT(w.count == 2 * E, "%d pairs", w.count);
    for (int i = 0; i < w.count; i++) EXPECT(w.pairs[i].r == 2, "pair %d rank %d", i, w.pairs[i].r);
    if (w.count == 2 * E) EXPECT(!memcmp(w.pairs[0].a, w.pairs[1].a, 2 * H * sizeof(float)), "gate/up A differ");
    eng_lora_weights_free(&w);
    /* down at twice the rank is not PEFT's: refused, naming the rank */
    EXPECT(eng_st_write(p, t + 2, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 1, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "rank 2 per expert"),
           "%s", err.msg);

    /* a fused pair of the wrong shape names both tensors and what fits */
    const int64_t s_bad[2] = {E * r, H + 1};
    static float abad[4 * 2 * 17];
    const eng_st_write_tensor_t tb[2] = {
        {"base_model.model.model.layers.1.mlp.experts.lora_A.weight", ENG_ST_F32, 2, s_bad, NULL, abad},
        {"base_model.model.model.layers.1.mlp.experts.lora_B.weight", ENG_ST_F32, 2, s_bdn, NULL, bdn},
    };
    EXPECT(eng_st_write(p, tb, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, r, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "gate_up_proj") &&
               strstr(err.msg, "experts.lora_A.weight [8, 17]"),
           "%s", err.msg);
    unload(&m);
}

static void test_weight_errors(void) {
    model_t m;
    if (!load("lora_mixtral_attn", &m)) return;
    static float buf[64 * 64];
    mt_error_t err = {0};
    eng_lora_weights_t w;
    const char *p = tmp_path("bad.safetensors");
    const int64_t s_bad[2] = {4, 17}, s_b[2] = {16, 4};
    eng_st_write_tensor_t t[2] = {
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight", ENG_ST_F32, 2, s_bad, NULL, buf},
        {"base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight", ENG_ST_F32, 2, s_b, NULL, buf},
    };
    EXPECT(eng_st_write(p, t, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 4, &w, &err) == MT_ERR_FORMAT &&
               strstr(err.msg, "self_attn.q_proj.lora_A.weight has shape [4, 17]") && strstr(err.msg, "[4, 16]"),
           "%s", err.msg);
    /* only A */
    const int64_t s_a[2] = {4, 16};
    t[0].shape = s_a;
    EXPECT(eng_st_write(p, t, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 4, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "q_proj.weight has lora_A"),
           "%s", err.msg);
    /* rank disagreeing with the config */
    EXPECT(eng_st_write(p, t, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 8, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "[8, 16]"), "%s", err.msg);
    /* a module that is not linear, and a name without PEFT's prefix */
    const int64_t s_n[2] = {4, 8};
    eng_st_write_tensor_t tn = {"base_model.model.model.layers.0.input_layernorm.lora_A.weight", ENG_ST_F32, 2, s_n,
                                NULL, buf};
    EXPECT(eng_st_write(p, &tn, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 4, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "not a linear module"),
           "%s", err.msg);
    tn.name = "model.layers.0.self_attn.q_proj.lora_A.weight";
    EXPECT(eng_st_write(p, &tn, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 4, &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "base_model.model."), "%s",
           err.msg);

    /* modules_to_save: lm_head under its own name, written and read back */
    const int pl = eng_model_desc_find(&m.d, "lm_head.weight");
    const int pq = eng_model_desc_find(&m.d, "model.layers.0.self_attn.q_proj.weight");
    EXPECT(pl >= 0 && pq >= 0, "params");
    static float head[48 * 16], qa[4 * 16], qb[16 * 4];
    for (int i = 0; i < 48 * 16; i++) head[i] = (float)i * 0.25f;
    for (int i = 0; i < 64; i++) qa[i] = qb[i] = (float)i - 7.5f;
    eng_lora_pair_t pair = {.param = pq, .out = 16, .in = 16, .r = 4, .a = qa, .b = qb};
    eng_lora_full_t full = {.param = pl, .data = head};
    eng_lora_weights_t ws = {.pairs = &pair, .count = 1, .saved = &full, .num_saved = 1};
    EXPECT(eng_lora_weights_write(p, &m.d, &ws, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(eng_lora_weights_read(p, &m.d, 4, &w, &err) == MT_OK, "%s", err.msg);
    EXPECT(w.count == 1 && w.num_saved == 1 && w.saved[0].param == pl &&
               !memcmp(w.saved[0].data, head, sizeof head) && !memcmp(w.pairs[0].a, qa, sizeof qa),
           "modules_to_save round trip");
    eng_lora_weights_free(&w);
    eng_st_file_t f;
    if (eng_st_open(p, &f, &err) == MT_OK) {
        EXPECT(eng_st_find(&f, "base_model.model.lm_head.weight") != NULL, "lm_head key");
        eng_st_close(&f);
    }
    unload(&m);
}

int main(void) {
    const char *t = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s", t ? t : "/tmp");
    test_config_roundtrip();
    test_config_refusals();
    test_fixture("lora_mixtral_attn");
    test_fixture("lora_qwen3_experts");
    test_fixture("lora_qwen2_all");
    test_fused_hand();
    test_weight_errors();
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("lora_adapter_test: ok\n");
    return 0;
}
