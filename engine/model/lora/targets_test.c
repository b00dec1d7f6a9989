/* LoRA target matching on the three families' descriptions (the tiny
 * fixture checkpoints under tests/fixtures/lora_*): PEFT's suffix rule
 * (Mixtral's w1 hits routed experts only; Qwen2-MoE's gate_proj hits routed,
 * shared and dense MLPs), the router only when `gate` is named, all-linear,
 * whole-name regexes, the no-match and rank errors with their messages,
 * modules_to_save, and the selection for each fixture equal to the module
 * list the PyTorch reference adapted (expected.json), with the same count
 * of trainable parameters. */
#include "engine/model/lora/targets.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/hf/model_config.h"

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

static mt_status_t sel_list(const model_t *m, const char *const *mods, int n, int r, eng_lora_plan_t *p,
                            mt_error_t *err) {
    eng_lora_select_t s = {.modules = mods, .num_modules = n, .r = r};
    return eng_lora_targets_select(&m->d, &s, p, err);
}

static int count_kind(const eng_lora_plan_t *p, eng_lora_kind_t k) {
    int n = 0;
    for (int i = 0; i < p->count; i++) n += p->targets[i].kind == k;
    return n;
}

static void test_mixtral(void) {
    model_t m;
    if (!load("lora_mixtral_attn", &m)) return;
    eng_lora_plan_t p;
    mt_error_t err = {0};
    const int E = m.d.num_experts, L = m.cfg.num_hidden_layers;

    const char *w1[] = {"w1"};
    EXPECT(sel_list(&m, w1, 1, 4, &p, &err) == MT_OK, "%s", err.msg);
    EXPECT(p.count == L * E && count_kind(&p, ENG_LORA_KIND_EXPERT) == L * E, "w1: %d targets", p.count);
    for (int i = 0; i < p.count; i++)
        EXPECT(strstr(m.d.params[p.targets[i].param].name, ".w1.weight"), "%s", m.d.params[p.targets[i].param].name);
    /* w1 (I, H) = (8, 16): r (in + out) per expert */
    EXPECT(p.total_trainable == (size_t)(L * E * 4 * (8 + 16)), "trainable %zu", p.total_trainable);
    eng_lora_plan_free(&p);

    /* all-linear: attention and experts, never the router */
    eng_lora_select_t all = {.all_linear = true, .r = 2};
    EXPECT(eng_lora_targets_select(&m.d, &all, &p, &err) == MT_OK, "%s", err.msg);
    EXPECT(p.count == L * (4 + 3 * E) && count_kind(&p, ENG_LORA_KIND_ROUTER) == 0, "all-linear: %d", p.count);
    eng_lora_plan_free(&p);
    const char *al[] = {"all-linear"};
    EXPECT(sel_list(&m, al, 1, 2, &p, &err) == MT_OK && p.count == L * (4 + 3 * E), "%s", err.msg);
    eng_lora_plan_free(&p);

    /* the router only when named */
    const char *gate[] = {"gate"};
    EXPECT(sel_list(&m, gate, 1, 4, &p, &err) == MT_OK, "%s", err.msg);
    EXPECT(p.count == L && count_kind(&p, ENG_LORA_KIND_ROUTER) == L, "gate: %d", p.count);
    eng_lora_plan_free(&p);

    /* a Qwen name on Mixtral: the error lists Mixtral's module kinds */
    const char *qn[] = {"q_proj", "gate_proj"};
    EXPECT(sel_list(&m, qn, 2, 4, &p, &err) == MT_ERR_CONFIG, "gate_proj on Mixtral accepted");
    EXPECT(strstr(err.msg, "'gate_proj'") &&
               strstr(err.msg, "q_proj, k_proj, v_proj, o_proj, gate (router), w1, w2, w3, lm_head"),
           "message: %s", err.msg);

    /* rank above a target's smaller dimension: w1 is (8, 16) */
    EXPECT(sel_list(&m, w1, 1, 9, &p, &err) == MT_ERR_CONFIG, "r 9 on (8, 16) accepted");
    EXPECT(strstr(err.msg, "model.layers.0.block_sparse_moe.experts.0.w1") && strstr(err.msg, "[8, 16]"),
           "message: %s", err.msg);

    /* regex: whole-name match as PEFT's re.fullmatch */
    eng_lora_select_t re = {.regex = "model\\.layers\\.0\\.self_attn\\.(q|v)_proj", .r = 4};
    EXPECT(eng_lora_targets_select(&m.d, &re, &p, &err) == MT_OK && p.count == 2, "%s", err.msg);
    eng_lora_plan_free(&p);
    eng_lora_select_t re2 = {.regex = "q_proj", .r = 4};
    EXPECT(eng_lora_targets_select(&m.d, &re2, &p, &err) == MT_ERR_CONFIG && strstr(err.msg, "whole name"),
           "a partial regex matched: %s", err.msg);
    eng_lora_select_t re3 = {.regex = "(", .r = 4};
    EXPECT(eng_lora_targets_select(&m.d, &re3, &p, &err) == MT_ERR_CONFIG && strstr(err.msg, "regular expression"),
           "bad regex: %s", err.msg);

    /* modules_to_save: lm_head trained in full, counted under its own kind */
    const char *save[] = {"lm_head"};
    eng_lora_select_t ms = {.modules = w1, .num_modules = 1, .r = 4, .modules_to_save = save,
                            .num_modules_to_save = 1};
    EXPECT(eng_lora_targets_select(&m.d, &ms, &p, &err) == MT_OK, "%s", err.msg);
    EXPECT(p.num_saved == 1 && p.trainable[ENG_LORA_KIND_SAVED] == (size_t)(m.cfg.vocab_size * m.cfg.hidden_size),
           "saved %d / %zu", p.num_saved, p.trainable[ENG_LORA_KIND_SAVED]);
    char sum[1024];
    eng_lora_plan_summary(&p, sum, sizeof sum);
    EXPECT(strstr(sum, "routed experts") && strstr(sum, "modules_to_save") && !strstr(sum, "attention"), "%s", sum);
    eng_lora_plan_free(&p);
    const char *bad_save[] = {"nonexistent"};
    ms.modules_to_save = bad_save;
    EXPECT(eng_lora_targets_select(&m.d, &ms, &p, &err) == MT_ERR_CONFIG && strstr(err.msg, "'nonexistent'"),
           "%s", err.msg);
    unload(&m);
}

static void test_qwen2(void) {
    model_t m;
    if (!load("lora_qwen2_all", &m)) return;
    eng_lora_plan_t p;
    mt_error_t err = {0};
    const char *gp[] = {"gate_proj"};
    EXPECT(sel_list(&m, gp, 1, 2, &p, &err) == MT_OK, "%s", err.msg);
    /* layer 0 is sparse (4 experts + shared expert), layer 1 dense (mlp_only_layers) */
    EXPECT(count_kind(&p, ENG_LORA_KIND_EXPERT) == 4 && count_kind(&p, ENG_LORA_KIND_SHARED) == 1 &&
               count_kind(&p, ENG_LORA_KIND_DENSE) == 1 && p.count == 6,
           "gate_proj: %d targets", p.count);
    eng_lora_plan_free(&p);

    /* router and shared_expert_gate: only when named; the latter is (1, H) so r must be 1 */
    const char *gates[] = {"gate", "shared_expert_gate"};
    EXPECT(sel_list(&m, gates, 2, 1, &p, &err) == MT_OK, "%s", err.msg);
    EXPECT(p.count == 2 && count_kind(&p, ENG_LORA_KIND_ROUTER) == 1 && count_kind(&p, ENG_LORA_KIND_SHARED) == 1,
           "gates: %d", p.count);
    eng_lora_plan_free(&p);
    EXPECT(sel_list(&m, gates, 2, 2, &p, &err) == MT_ERR_CONFIG, "r 2 on shared_expert_gate accepted");
    EXPECT(strstr(err.msg, "model.layers.0.mlp.shared_expert_gate") && strstr(err.msg, "[1, 16]"), "%s", err.msg);

    const char *w1[] = {"w1"};
    EXPECT(sel_list(&m, w1, 1, 2, &p, &err) == MT_ERR_CONFIG, "w1 on Qwen2 accepted");
    EXPECT(strstr(err.msg, "gate (router), gate_proj, up_proj, down_proj, shared_expert_gate"), "%s", err.msg);
    unload(&m);
}

/* The selection for the fixture's run equals the reference's adapted modules. */
static void test_fixture(const char *fixture, const char *const *mods, int n, bool all_linear) {
    model_t m;
    if (!load(fixture, &m)) return;
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s/expected.json", fixture);
    json_error_t je;
    json_t *exp = json_load_file(path, 0, &je);
    EXPECT(exp, "%s: %s", path, je.text);
    if (!exp) {
        unload(&m);
        return;
    }
    const int r = (int)json_integer_value(json_object_get(exp, "lora_r"));
    eng_lora_select_t s = {.modules = mods, .num_modules = n, .all_linear = all_linear, .r = r};
    eng_lora_plan_t p;
    mt_error_t err = {0};
    EXPECT(eng_lora_targets_select(&m.d, &s, &p, &err) == MT_OK, "%s: %s", fixture, err.msg);
    json_t *want = json_object_get(exp, "adapted_modules");
    EXPECT((size_t)p.count == json_array_size(want), "%s: %d targets, reference %zu", fixture, p.count,
           json_array_size(want));
    for (int i = 0; i < p.count && (size_t)i < json_array_size(want); i++) {
        char mod[160];
        eng_lora_module_of(&m.d.params[p.targets[i].param], mod, sizeof mod);
        EXPECT(strcmp(mod, json_string_value(json_array_get(want, (size_t)i))) == 0, "%s: target %d is %s, ref %s",
               fixture, i, mod, json_string_value(json_array_get(want, (size_t)i)));
    }
    EXPECT(p.total_trainable == (size_t)json_integer_value(json_object_get(exp, "trainable_parameters")),
           "%s: %zu trainable, reference %lld", fixture, p.total_trainable,
           (long long)json_integer_value(json_object_get(exp, "trainable_parameters")));
    eng_lora_plan_free(&p);
    json_decref(exp);
    unload(&m);
}

/* Regular expressions POSIX regcomp would expand into gigabytes are refused
 * before compiling; ordinary PEFT patterns (classes, lazy stars, small
 * counts, brackets holding + and *) pass. */
static void test_regex_bounds(void) {
    const char *ok[] = {".*\\.(q|v)_proj", ".*experts.*?w[13]", "layers\\.[0-9]{1,2}\\.mlp", "a[+*?]b", "x+?",
                        "model\\.layers\\.(0|1)\\..*"};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++)
        EXPECT(!eng_lora_regex_unbounded(ok[i]), "'%s' refused: %s", ok[i], eng_lora_regex_unbounded(ok[i]));
    const char *bad[] = {"d++++++++", "a*{2}", "(a{200})", "(a{50}){50}{2}", "a+??"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        EXPECT(eng_lora_regex_unbounded(bad[i]), "'%s' accepted", bad[i]);
    char many[64] = "";
    for (int i = 0; i < 9; i++) strcat(many, "a{2}b");
    EXPECT(eng_lora_regex_unbounded(many), "nine counts accepted");
}

int main(void) {
    test_regex_bounds();
    test_mixtral();
    test_qwen2();
    const char *attn[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    const char *mlp[] = {"gate_proj", "up_proj", "down_proj"};
    test_fixture("lora_mixtral_attn", attn, 4, false);
    test_fixture("lora_qwen3_experts", mlp, 3, false);
    test_fixture("lora_qwen2_all", NULL, 0, true);
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("lora_targets_test: ok\n");
    return 0;
}
