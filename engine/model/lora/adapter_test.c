/* PEFT adapter files: adapter_config.json written and read back; every
 * refused option with the file and key in its message; rank_pattern and
 * alpha_pattern looked up as PEFT's get_pattern_key does (first key in file
 * order, dot-boundary suffix), with PEFT's gate_up rewrite; the fixtures'
 * adapters (tests/fixtures/lora_*) read with the shapes the description
 * gives; weights written and read back byte-identical, with the keys and
 * bytes of the fixture file; the fused transformers-5 layout read as
 * per-expert pairs whose gate and up share A, on hand-made tensors whose
 * values encode where they must land and against the per-expert fixture,
 * and written back byte for byte; shape, missing-factor and unknown-module
 * errors naming the tensor, the shapes and where the rank came from. */
#include "engine/model/lora/adapter.h"

#include <jansson.h>
#include <math.h>
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

/* An adapter_config of rank r, alpha 8, naming nothing PEFT rewrites. */
static eng_lora_config_t cfg_r(int r) {
    return (eng_lora_config_t){.r = r, .lora_alpha = 8};
}

static mt_status_t read_w(const char *path, const model_t *m, eng_lora_config_t c, eng_lora_weights_t *w,
                          mt_error_t *err) {
    return eng_lora_weights_read(path, &m->d, &c, "adapter_config.json", w, err);
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
    expect_refused("\"rank_pattern\": {\"layers\\\\.\\\\d+\\\\.q_proj\": 8}", "layers\\.\\d+\\.q_proj",
                   MT_ERR_UNSUPPORTED);
    expect_refused("\"rank_pattern\": {\"q_proj\": 2.5}", "q_proj", MT_ERR_FORMAT);
    expect_refused("\"alpha_pattern\": {\"q_proj\": -1}", "q_proj", MT_ERR_FORMAT);
    expect_refused("\"rank_pattern\": [8]", "rank_pattern", MT_ERR_FORMAT);
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
    expect_accepted("\"rank_pattern\": {\"q_proj\": 8}, \"alpha_pattern\": {\".*\\\\.gate_up_proj\": 16}");

    const char *p = tmp_path("ia3.json");
    write_text(p, "{\"peft_type\": \"IA3\", \"target_modules\": [\"q_proj\"]}");
    eng_lora_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_ERR_UNSUPPORTED && strstr(err.msg, "'peft_type'"), "%s", err.msg);
    write_text(p, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8}");
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_ERR_FORMAT && strstr(err.msg, "'target_modules'"), "%s", err.msg);
    EXPECT(eng_lora_config_read(tmp_path("missing.json"), &c, &err) == MT_ERR_IO, "%s", err.msg);
}

/* PEFT's get_pattern_key: the first key, in file order, for which
 * (.*\.)?(KEY)$ matches the name from its start; PEFT's gate_up rewrite
 * appends `.*\.gate_up_proj`: 2r / 2 alpha after the file's keys. */
static void test_patterns(void) {
    const char *p = tmp_path("patterns.json");
    write_text(p, "{\"peft_type\": \"LORA\", \"r\": 4, \"lora_alpha\": 8, \"target_modules\": [\"q_proj\", \"w1\","
                  " \"w3\"], \"rank_pattern\": {\"layers\\\\.1\\\\.self_attn\\\\.q_proj\": 6, \"q_proj\": 2,"
                  " \"experts\\\\.down_proj\": 3}, \"alpha_pattern\": {\"o_proj\": 16}}");
    eng_lora_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_lora_config_read(p, &c, &err) == MT_OK, "%s", err.msg);
    if (err.code) return;
    int r;
    double a;
    const char *key;
    eng_lora_config_lookup(&c, "model.layers.1.self_attn.q_proj", false, &r, &a, &key);
    EXPECT(r == 6 && a == 8 && key && !strcmp(key, "layers\\.1\\.self_attn\\.q_proj"), "layer 1 q_proj: %d", r);
    eng_lora_config_lookup(&c, "model.layers.0.self_attn.q_proj", false, &r, &a, &key);
    EXPECT(r == 2 && key && !strcmp(key, "q_proj"), "layer 0 q_proj: %d (the second key)", r);
    eng_lora_config_lookup(&c, "model.layers.11.self_attn.q_proj", false, &r, &a, &key);
    EXPECT(r == 2, "layer 11 q_proj: %d (a key matches at a dot)", r);
    eng_lora_config_lookup(&c, "model.layers.0.self_attn.xq_proj", false, &r, &a, &key);
    EXPECT(r == 4 && !key, "xq_proj: %d (no match inside a name)", r);
    eng_lora_config_lookup(&c, "model.layers.0.self_attn.o_proj", false, &r, &a, &key);
    EXPECT(r == 4 && a == 16, "o_proj: r %d alpha %g", r, a);
    eng_lora_config_lookup(&c, "model.layers.0.mlp.experts.down_proj", false, &r, &a, &key);
    EXPECT(r == 3, "down_proj: %d", r);
    eng_lora_config_lookup(&c, "model.layers.0.mlp.experts.gate_up_proj", true, &r, &a, &key);
    EXPECT(r == 8 && a == 16 && key && !strcmp(key, ".*\\.gate_up_proj"), "rewritten gate_up: r %d alpha %g", r, a);
    eng_lora_config_lookup(&c, "model.layers.0.mlp.experts.gate_up_proj", false, &r, &a, &key);
    EXPECT(r == 4 && a == 8, "gate_up without the rewrite: r %d alpha %g", r, a);
    EXPECT(eng_lora_config_names(&c, "w1", NULL, 0) && eng_lora_config_names(&c, "w3", NULL, 0) &&
               !eng_lora_config_names(&c, "gate_proj", NULL, 0),
           "names");
    eng_lora_config_free(&c);
    /* a regex names a leaf when it matches a probe, as PEFT probes experts.gate_proj */
    eng_lora_config_t rx = {.r = 2, .lora_alpha = 2, .target_regex = ".*experts\\.(gate|up)_proj"};
    const char *probe[] = {"model.layers.3.mlp.experts.gate_proj"};
    EXPECT(eng_lora_config_names(&rx, "gate_proj", probe, 1), "regex probe");
    probe[0] = "model.layers.3.mlp.experts.down_proj";
    EXPECT(!eng_lora_config_names(&rx, "down_proj", probe, 1), "regex probe, no match");
}

/* ---- weights ------------------------------------------------------------------ */

static bool same_tensor_bytes(const eng_st_file_t *a, const eng_st_file_t *b, const char *name) {
    const eng_st_tensor_t *x = eng_st_find(a, name), *y = eng_st_find(b, name);
    return x && y && x->dtype == y->dtype && x->end - x->begin == y->end - y->begin &&
           memcmp(x->data, y->data, x->end - x->begin) == 0;
}

/* The per-expert pair x and the fused-form pair y adapt the same module:
 * B_y A_y == B_x A_x (a block-diagonal fused B holds x's columns). */
static bool same_product(const eng_lora_pair_t *x, const eng_lora_pair_t *y) {
    for (int64_t o = 0; o < x->out; o++)
        for (int64_t i = 0; i < x->in; i++) {
            double px = 0, py = 0;
            for (int k = 0; k < x->r; k++) px += (double)x->b[o * x->r + k] * x->a[k * x->in + i];
            for (int k = 0; k < y->r; k++) py += (double)y->b[o * y->r + k] * y->a[k * y->in + i];
            if (px != py) return false;
        }
    return true;
}

static void check_fused_fixture(const model_t *m, const eng_lora_config_t *c, const char *cpath,
                                const eng_lora_weights_t *w, const char *path) {
    eng_lora_weights_t wf;
    mt_error_t err = {0};
    EXPECT(eng_lora_weights_read(path, &m->d, c, cpath, &wf, &err) == MT_OK, "%s: %s", path, err.msg);
    EXPECT(wf.count == w->count, "fused: %d pairs, per-expert %d", wf.count, w->count);
    const double s2 = c->use_rslora ? 2 * c->lora_alpha / sqrt(2.0 * c->r) : c->lora_alpha / c->r;
    for (int i = 0; i < w->count && i < wf.count; i++) {
        const eng_lora_pair_t *x = &w->pairs[i], *y = &wf.pairs[i];
        const eng_param_role_t role = m->d.params[x->param].role;
        if (role == ENG_P_EXP_DOWN) {
            EXPECT(x->param == y->param && x->r == y->r && !y->shares_a &&
                       !memcmp(x->a, y->a, (size_t)x->r * x->in * sizeof(float)) &&
                       !memcmp(x->b, y->b, (size_t)x->out * x->r * sizeof(float)),
                   "fused down pair %d (%s) differs from per-expert", i, m->d.params[x->param].name);
            continue;
        }
        EXPECT(x->param == y->param && y->r == 2 * c->r && y->shares_a == (role == ENG_P_EXP_UP) &&
                   fabs(y->scale - s2) < 1e-12 && same_product(x, y),
               "fused %s (%s): rank %d, scale %g (PEFT's %g), shares %d", role == ENG_P_EXP_UP ? "up" : "gate",
               m->d.params[x->param].name, y->r, y->scale, s2, y->shares_a);
        if (role == ENG_P_EXP_UP && i > 0)
            EXPECT(!memcmp(wf.pairs[i - 1].a, y->a, (size_t)y->r * y->in * sizeof(float)), "gate and up A differ");
    }
    /* written back: PEFT's fused layout, the fixture's keys and bytes */
    const char *out = tmp_path("fused_again.safetensors");
    EXPECT(eng_lora_weights_write(out, &m->d, &wf, NULL, 0, &err) == MT_OK, "%s", err.msg);
    eng_st_file_t fa, fb;
    if (eng_st_open(path, &fa, &err) == MT_OK) {
        if (eng_st_open(out, &fb, &err) == MT_OK) {
            EXPECT(fa.count == fb.count, "%d fused tensors written, fixture %d", fb.count, fa.count);
            for (int i = 0; i < fa.count; i++)
                EXPECT(same_tensor_bytes(&fa, &fb, fa.tensors[i].name), "%s differs or is missing",
                       fa.tensors[i].name);
            eng_st_close(&fb);
        }
        eng_st_close(&fa);
    }
    eng_lora_weights_free(&wf);
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
        EXPECT(eng_lora_weights_read(path, &m.d, &c, cpath, &w, &err) == MT_OK, "%s: %s", path, err.msg);
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
        EXPECT(eng_lora_weights_read(out, &m.d, &c, cpath, &w2, &err) == MT_OK, "%s", err.msg);
        EXPECT(w2.count == w.count, "reread count");
        for (int i = 0; i < w.count && i < w2.count; i++)
            EXPECT(w2.pairs[i].param == w.pairs[i].param &&
                       !memcmp(w2.pairs[i].a, w.pairs[i].a, (size_t)w.pairs[i].r * w.pairs[i].in * sizeof(float)) &&
                       !memcmp(w2.pairs[i].b, w.pairs[i].b, (size_t)w.pairs[i].out * w.pairs[i].r * sizeof(float)),
                   "pair %d differs after write/read", i);
        eng_lora_weights_free(&w2);

        /* the fused layout of the same adapter: to PEFT on transformers 5 (target_modules names gate
         * and up) one gate_up adapter of rank 2r, alpha 2a, whose A gate and up share; the same
         * products B A; down_proj's pairs bit for bit; written back as the same file */
        snprintf(path, sizeof path, "tests/fixtures/%s/adapter_init/adapter_model_fused.safetensors", fixture);
        if (which == 0 && access(path, R_OK) == 0) check_fused_fixture(&m, &c, cpath, &w, path);
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
    EXPECT(read_w(p, &m, cfg_r(r), &w, &err) == MT_OK, "%s", err.msg);
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
    for (int i = 0; i < w.count; i++)
        EXPECT(w.pairs[i].shares_a == (m.d.params[w.pairs[i].param].role == ENG_P_EXP_UP), "pair %d sharing", i);
    /* written back in PEFT's fused form: the same four tensors, byte for byte */
    const char *p2 = tmp_path("fused_hand_again.safetensors");
    EXPECT(eng_lora_weights_write(p2, &m.d, &w, NULL, 0, &err) == MT_OK, "%s", err.msg);
    eng_st_file_t fa, fb;
    if (eng_st_open(p, &fa, &err) == MT_OK) {
        if (eng_st_open(p2, &fb, &err) == MT_OK) {
            EXPECT(fb.count == 4, "%d tensors written", fb.count);
            for (int i = 0; i < 4; i++) EXPECT(same_tensor_bytes(&fa, &fb, t[i].name), "%s differs", t[i].name);
            eng_st_close(&fb);
        }
        eng_st_close(&fa);
    }
    eng_lora_weights_free(&w);

    /* gate_up alone at rank 2 where the config says r 1: refused, naming the tensor, both shapes and the rank's
     * source; accepted where a rank_pattern or PEFT's gate/up rewrite gives rank 2 */
    EXPECT(eng_st_write(p, t, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(1), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "base_layer.lora_A.weight") &&
               strstr(err.msg, "[8, 16]; expected [4, 16]") && strstr(err.msg, "rank 1 from r in adapter_config.json"),
           "%s", err.msg);
    char key[] = "gate_up_proj";
    eng_lora_pattern_t pat = {key, 2};
    eng_lora_config_t c = cfg_r(1);
    c.rank_pattern = &pat;
    c.num_rank_pattern = 1;
    EXPECT(read_w(p, &m, c, &w, &err) == MT_OK, "%s", err.msg);
    EXPECT(w.count == 2 * E, "%d pairs", w.count);
    for (int i = 0; i < w.count; i++)
        EXPECT(w.pairs[i].r == 2 && w.pairs[i].scale == 4.0, "pair %d rank %d", i, w.pairs[i].r);
    if (w.count == 2 * E) EXPECT(!memcmp(w.pairs[0].a, w.pairs[1].a, 2 * H * sizeof(float)), "gate/up A differ");
    eng_lora_weights_free(&w);
    char *gu[] = {"w1", "w3"};
    c = cfg_r(1);
    c.target_modules = gu;
    c.num_target_modules = 2;
    const mt_status_t st = read_w(p, &m, c, &w, &err);
    EXPECT(st == MT_OK && w.count == 2 * E && w.pairs[0].r == 2 && w.pairs[0].alpha == 16,
           "PEFT's rewrite of w1 + w3: %s", err.msg);
    if (st == MT_OK) eng_lora_weights_free(&w);
    /* down at twice the config's rank: refused the same way */
    EXPECT(eng_st_write(p, t + 2, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(1), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "expected [4, 8]") &&
               strstr(err.msg, "experts.lora_A.weight"),
           "%s", err.msg);

    /* a fused pair of the wrong shape names both tensors and what fits */
    const int64_t s_bad[2] = {E * r, H + 1};
    static float abad[4 * 2 * 17];
    const eng_st_write_tensor_t tb[2] = {
        {"base_model.model.model.layers.1.mlp.experts.lora_A.weight", ENG_ST_F32, 2, s_bad, NULL, abad},
        {"base_model.model.model.layers.1.mlp.experts.lora_B.weight", ENG_ST_F32, 2, s_bdn, NULL, bdn},
    };
    EXPECT(eng_st_write(p, tb, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(r), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "fit neither gate_up_proj") &&
               strstr(err.msg, "experts.lora_A.weight") && strstr(err.msg, "experts.lora_B.weight"),
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
    EXPECT(read_w(p, &m, cfg_r(4), &w, &err) == MT_ERR_FORMAT &&
               strstr(err.msg, "self_attn.q_proj.lora_A.weight has shape [4, 17]") && strstr(err.msg, "[4, 16]"),
           "%s", err.msg);
    /* only A */
    const int64_t s_a[2] = {4, 16};
    t[0].shape = s_a;
    EXPECT(eng_st_write(p, t, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(4), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "q_proj.weight has lora_A"),
           "%s", err.msg);
    /* rank disagreeing with the config */
    EXPECT(eng_st_write(p, t, 2, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(8), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "expected [8, 16]") &&
               strstr(err.msg, "rank 8 from r"),
           "%s", err.msg);
    /* a module that is not linear, and a name without PEFT's prefix */
    const int64_t s_n[2] = {4, 8};
    eng_st_write_tensor_t tn = {"base_model.model.model.layers.0.input_layernorm.lora_A.weight", ENG_ST_F32, 2, s_n,
                                NULL, buf};
    EXPECT(eng_st_write(p, &tn, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(4), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "not a linear module"),
           "%s", err.msg);
    tn.name = "model.layers.0.self_attn.q_proj.lora_A.weight";
    EXPECT(eng_st_write(p, &tn, 1, NULL, 0, &err) == MT_OK, "%s", err.msg);
    EXPECT(read_w(p, &m, cfg_r(4), &w, &err) == MT_ERR_FORMAT && strstr(err.msg, "base_model.model."), "%s",
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
    EXPECT(read_w(p, &m, cfg_r(4), &w, &err) == MT_OK, "%s", err.msg);
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
    test_patterns();
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
