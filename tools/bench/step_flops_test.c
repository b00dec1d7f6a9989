/* The model FLOPs per token that `moetune bench step` divides by (and the
 * planner may use), sched_registry_model_flops_per_token, against the
 * formula computed here by hand from the config's numbers: per layer and
 * token, forward
 *     2 H (nh hd) + 2 * 2 H (nkv hd) + 2 (nh hd) H      q, k, v, o projections
 *   + 2 * 2 * T_avg * nh * hd, T_avg = (T + 1) / 2       causal scores and values
 *   + 2 H E                                              router
 *   + k * 3 * 2 H I                                      the top-k experts' products
 * plus 2 H V for lm_head; training = 3 x forward.  For a tiny config and
 * the two benchmark presets (Qwen3-30B-A3B's head_dim 128 is not H / nh). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/model/desc/program.h"
#include "engine/model/hf/model_config.h"
#include "scheduler/registry.h"

static int g_failures;

typedef struct {
    const char *type;
    int V, H, L, nh, nkv, hd, E, k, I, T, B;
} geom_t;

static double by_hand(const geom_t *g) {
    const double H = g->H, q = (double)g->nh * g->hd, kv = (double)g->nkv * g->hd, t_avg = (g->T + 1) / 2.0;
    const double layer = 2 * H * q + 2 * 2 * H * kv + 2 * q * H + 2.0 * 2.0 * t_avg * g->nh * g->hd +
                         2 * H * g->E + g->k * 3.0 * 2 * H * g->I;
    return 3.0 * (g->L * layer + 2 * H * g->V);
}

static double counted(const geom_t *g) {
    char json[2048];
    if (strcmp(g->type, "qwen3_moe") == 0)
        snprintf(json, sizeof json,
                 "{\"model_type\": \"qwen3_moe\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
                 " \"moe_intermediate_size\": %d, \"num_hidden_layers\": %d, \"num_attention_heads\": %d,"
                 " \"num_key_value_heads\": %d, \"head_dim\": %d, \"num_experts\": %d, \"num_experts_per_tok\": %d,"
                 " \"norm_topk_prob\": true, \"decoder_sparse_step\": 1, \"mlp_only_layers\": [],"
                 " \"rms_norm_eps\": 1e-6, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false}",
                 g->V, g->H, 4 * g->I, g->I, g->L, g->nh, g->nkv, g->hd, g->E, g->k);
    else
        snprintf(json, sizeof json,
                 "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
                 " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
                 " \"head_dim\": %d, \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"rms_norm_eps\": 1e-5,"
                 " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false}",
                 g->V, g->H, g->I, g->L, g->nh, g->nkv, g->hd, g->E, g->k);
    mt_error_t err = {0};
    eng_model_config_t mc;
    if (eng_model_config_parse(json, "test config.json", NULL, &mc, &err) != MT_OK) {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        g_failures++;
        return -1;
    }
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.sequence_len = g->T;
    rc.micro_batch_size = g->B;
    sched_program_t prog = {0};
    sched_run_shape_t shape;
    sched_registry_t reg;
    double f = -1;
    if (eng_program_describe(&mc, &rc, false, &prog, &shape, &err) == MT_OK &&
        sched_registry_build(&prog, &shape, &reg, &err) == MT_OK) {
        f = sched_registry_model_flops_per_token(&reg);
        sched_registry_free(&reg);
    } else {
        fprintf(stderr, "FAIL: %s\n", err.msg);
        g_failures++;
    }
    sched_program_free(&prog);
    eng_model_config_free(&mc);
    eng_run_config_free(&rc);
    return f;
}

int main(void) {
    const geom_t cases[] = {
        {"mixtral", 96, 32, 2, 4, 2, 8, 4, 2, 48, 16, 2},                  /* tiny */
        {"mixtral", 96, 32, 2, 4, 2, 8, 4, 2, 48, 17, 1},                  /* odd T: T_avg 9 */
        {"qwen3_moe", 32768, 2048, 4, 32, 4, 128, 128, 8, 768, 4096, 1},   /* qwen3-30b-a3b preset */
        {"mixtral", 32768, 4096, 2, 32, 8, 128, 8, 2, 14336, 4096, 1},     /* mixtral-8x7b preset */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const double want = by_hand(&cases[i]), got = counted(&cases[i]);
        const bool ok = fabs(got - want) <= 1e-9 * want;
        printf("%-9s H %5d L %d T %4d: %.6g FLOPs per token counted, %.6g by hand %s\n", cases[i].type, cases[i].H,
               cases[i].L, cases[i].T, got, want, ok ? "ok" : "FAIL");
        if (!ok) g_failures++;
    }
    if (g_failures == 0) printf("step_flops_test: all passed\n");
    return g_failures ? 1 : 0;
}
