/* The adapter_config.json moetune writes for PEFT on transformers 5
 * (peft5.h): on a Qwen3-MoE with a dense first layer, the dense MLP goes to
 * target_parameters as its weights (PEFT would rewrite a gate_proj entry
 * into the experts' gate_up_proj), per-expert gate and up adapters become
 * one gate_up_proj of rank 2r with the alpha that keeps their scale (also
 * under rsLoRA); a selection of one layer is written as suffixes that reach
 * no other layer; Mixtral's router as `gate.weight`; PEFT's own fused
 * adapter keeps its rank; and the warnings name what PEFT there cannot
 * load (dropout, a subset of experts, gate without up). */
#include "engine/model/lora/peft5.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
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
    eng_lora_plan_t plan;
    eng_lora_config_t c;
} setup_t;

/* The plan of `targets` (a list, or a regex when regex is set) on a fixture's
 * base at rank r, alpha, and the config moetune would write for it. */
static bool setup(setup_t *s, const char *fixture, const char *const *targets, int n, const char *regex, int r,
                  double alpha, bool rslora) {
    memset(s, 0, sizeof *s);
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s/ckpt", fixture);
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_load(dir, NULL, &s->cfg, &err);
    if (st == MT_OK) st = eng_model_desc_build(&s->cfg, &s->d, &err);
    const eng_lora_select_t sel = {.modules = targets, .num_modules = n, .regex = regex, .r = r};
    if (st == MT_OK) st = eng_lora_targets_select(&s->d, &sel, &s->plan, &err);
    EXPECT(st == MT_OK, "%s: %s", fixture, err.msg);
    if (st != MT_OK) return false;
    const float scale = (float)(rslora ? alpha / sqrt((double)r) : alpha / r);
    for (int t = 0; t < s->plan.count; t++) {
        s->plan.targets[t].alpha = alpha;
        s->plan.targets[t].scale = scale;
    }
    s->c.r = r;
    s->c.lora_alpha = alpha;
    s->c.use_rslora = rslora;
    eng_lora_peft_config(&s->d, &s->plan, &s->c);
    return true;
}

static void teardown(setup_t *s) {
    eng_lora_config_free(&s->c);
    eng_lora_plan_free(&s->plan);
    eng_model_desc_free(&s->d);
    eng_model_config_free(&s->cfg);
}

/* `list` holds exactly the n names given, in any order. */
static bool holds(char **list, int count, const char *const *want, int n) {
    if (count != n) return false;
    for (int i = 0; i < n; i++) {
        bool found = false;
        for (int j = 0; j < count && !found; j++) found = strcmp(list[j], want[i]) == 0;
        if (!found) return false;
    }
    return true;
}

static void show(const char *what, char **list, int n) {
    fprintf(stderr, "  %s:", what);
    for (int i = 0; i < n; i++) fprintf(stderr, " %s", list[i]);
    fprintf(stderr, "\n");
}

static void test_dense_first(void) {
    setup_t s;
    const char *const t[] = {"q_proj", "gate_proj", "up_proj", "down_proj"};
    if (!setup(&s, "lora_qwen3_dense_first", t, 4, NULL, 2, 4.0, false)) return;
    const char *const mods[] = {"q_proj"};
    const char *const params[] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight", "gate_up_proj",
                                  "down_proj"};
    const bool ok = holds(s.c.target_modules, s.c.num_target_modules, mods, 1) &&
                    holds(s.c.target_parameters, s.c.num_target_parameters, params, 5);
    EXPECT(ok, "dense first layer: targets");
    if (!ok) {
        show("target_modules", s.c.target_modules, s.c.num_target_modules);
        show("target_parameters", s.c.target_parameters, s.c.num_target_parameters);
    }
    /* per-expert gate and up: one gate_up_proj of rank 4 whose s is alpha / r = 2 */
    EXPECT(s.c.num_rank_pattern == 1 && !strcmp(s.c.rank_pattern[0].key, "gate_up_proj") &&
               s.c.rank_pattern[0].value == 4,
           "rank_pattern: %d entries", s.c.num_rank_pattern);
    EXPECT(s.c.num_alpha_pattern == 1 && s.c.alpha_pattern[0].value == 8, "alpha_pattern: %d entries",
           s.c.num_alpha_pattern);
    char notes[2048];
    EXPECT(eng_lora_peft_warnings(&s.d, &s.plan, 0.0, notes, sizeof notes) == 0, "warnings: %s", notes);
    EXPECT(eng_lora_peft_warnings(&s.d, &s.plan, 0.1, notes, sizeof notes) == 1 && strstr(notes, "ParamWrapper") &&
               strstr(notes, "lora_dropout 0.1"),
           "dropout: %s", notes);
    teardown(&s);

    /* rsLoRA: alpha' = sqrt(2) alpha keeps alpha / sqrt(r) at rank 2r (PEFT's own 2 alpha would not) */
    if (!setup(&s, "lora_qwen3_dense_first", t + 1, 3, NULL, 2, 4.0, true)) return;
    EXPECT(s.c.num_alpha_pattern == 1 && fabs(s.c.alpha_pattern[0].value - 4.0 * sqrt(2.0)) < 1e-12,
           "rsLoRA alpha_pattern %g", s.c.num_alpha_pattern ? s.c.alpha_pattern[0].value : 0.0);
    EXPECT(s.c.num_target_modules == 0, "MLPs only: no target_modules (%d)", s.c.num_target_modules);
    teardown(&s);
}

static void test_one_layer_and_subset(void) {
    setup_t s;
    if (!setup(&s, "lora_qwen3_dense_first", NULL, 0, "model\\.layers\\.1\\..*_proj", 2, 4.0, false)) return;
    const char *const mods[] = {"1.self_attn.q_proj", "1.self_attn.k_proj", "1.self_attn.v_proj",
                                "1.self_attn.o_proj"};
    const char *const params[] = {"gate_up_proj", "down_proj"};
    const bool ok = holds(s.c.target_modules, s.c.num_target_modules, mods, 4) &&
                    holds(s.c.target_parameters, s.c.num_target_parameters, params, 2);
    EXPECT(ok, "layer 1 only");
    if (!ok) {
        show("target_modules", s.c.target_modules, s.c.num_target_modules);
        show("target_parameters", s.c.target_parameters, s.c.num_target_parameters);
    }
    EXPECT(!s.c.target_regex, "the run's regex is not written");
    teardown(&s);
    if (!setup(&s, "lora_qwen3_dense_first", NULL, 0, ".*\\.experts\\.[01]\\.(gate|up|down)_proj", 2, 4.0, false))
        return;
    char notes[2048];
    EXPECT(eng_lora_peft_warnings(&s.d, &s.plan, 0.0, notes, sizeof notes) == 3 && strstr(notes, "2 of its 4"),
           "two experts: %s", notes);
    teardown(&s);
    const char *const gate_only[] = {"gate_proj"};
    if (!setup(&s, "lora_qwen3_experts", gate_only, 1, NULL, 2, 4.0, false)) return;
    EXPECT(eng_lora_peft_warnings(&s.d, &s.plan, 0.0, notes, sizeof notes) == 2 && strstr(notes, "gate adapters"),
           "gate without up: %s", notes);
    teardown(&s);
}

static void test_mixtral_router_and_fused(void) {
    setup_t s;
    const char *const t[] = {"gate", "w1", "w2", "w3"};
    if (!setup(&s, "lora_mixtral_attn", t, 4, NULL, 2, 4.0, false)) return;
    const char *const params[] = {"gate.weight", "gate_up_proj", "down_proj"};
    EXPECT(s.c.num_target_modules == 0 && holds(s.c.target_parameters, s.c.num_target_parameters, params, 3),
           "Mixtral router and experts");
    if (s.c.num_target_modules || s.c.num_target_parameters != 3)
        show("target_parameters", s.c.target_parameters, s.c.num_target_parameters);
    eng_lora_config_free(&s.c);
    /* PEFT's fused form (an up adapter sharing its gate's A): gate_up keeps its own rank and alpha */
    for (int k = 0; k < s.plan.count; k++) {
        eng_lora_target_t *tg = &s.plan.targets[k];
        const eng_param_spec_t *ps = &s.d.params[tg->param];
        if (ps->role == ENG_P_EXP_GATE || ps->role == ENG_P_EXP_UP) tg->r = 4;
        if (ps->role == ENG_P_EXP_UP)
            tg->share_a = eng_lora_plan_find(&s.plan, eng_model_desc_find_role(&s.d, ps->layer, ENG_P_EXP_GATE,
                                                                               ps->expert));
        if (ps->role == ENG_P_EXP_GATE || ps->role == ENG_P_EXP_UP) tg->alpha = 8.0;
    }
    memset(&s.c, 0, sizeof s.c);
    s.c.r = 2;
    s.c.lora_alpha = 4.0;
    eng_lora_peft_config(&s.d, &s.plan, &s.c);
    EXPECT(s.c.num_rank_pattern == 1 && s.c.rank_pattern[0].value == 4 && s.c.num_alpha_pattern == 1 &&
               s.c.alpha_pattern[0].value == 8.0,
           "fused gate_up: rank %g alpha %g", s.c.num_rank_pattern ? s.c.rank_pattern[0].value : 0.0,
           s.c.num_alpha_pattern ? s.c.alpha_pattern[0].value : 0.0);
    teardown(&s);
}

int main(void) {
    test_dense_first();
    test_one_layer_and_subset();
    test_mixtral_router_and_fused();
    if (failures) {
        fprintf(stderr, "%d failures\n", failures);
        return 1;
    }
    printf("peft5_test: ok\n");
    return 0;
}
