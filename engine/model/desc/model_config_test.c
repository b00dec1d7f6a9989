/* config.json parsing: the published configs of Mixtral-8x7B,
 * Qwen1.5-MoE-A2.7B and Qwen3-30B-A3B (parameter counts cross-checked
 * against the model cards through the model description), transformers' defaults for
 * absent keys, sparse-layer patterns, overrides, and every refusal naming
 * its key and file. */
#include "engine/model/hf/model_config.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine/model/desc/model_desc.h"

typedef struct {
    int failures;
} tctx_t;

#define EXPECT(t, cond, ...)                                                \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fprintf(stderr, "\n");                                          \
            (t)->failures++;                                                \
        }                                                                   \
    } while (0)

static const char *k_mixtral_8x7b =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 14336, \"max_position_embeddings\": 32768,"
    " \"model_type\": \"mixtral\", \"num_attention_heads\": 32, \"num_experts_per_tok\": 2,"
    " \"num_hidden_layers\": 32, \"num_key_value_heads\": 8, \"num_local_experts\": 8,"
    " \"output_router_logits\": false, \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0,"
    " \"router_aux_loss_coef\": 0.02, \"sliding_window\": null, \"tie_word_embeddings\": false,"
    " \"torch_dtype\": \"bfloat16\", \"transformers_version\": \"4.36.0.dev0\", \"use_cache\": true,"
    " \"vocab_size\": 32000}";

static const char *k_qwen15_moe =
    "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 151643, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"initializer_range\": 0.02, \"intermediate_size\": 5632,"
    " \"max_position_embeddings\": 8192, \"max_window_layers\": 21, \"model_type\": \"qwen2_moe\","
    " \"num_attention_heads\": 16, \"num_hidden_layers\": 24, \"num_key_value_heads\": 16,"
    " \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"sliding_window\": 32768,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936, \"decoder_sparse_step\": 1,"
    " \"moe_intermediate_size\": 1408, \"shared_expert_intermediate_size\": 5632,"
    " \"num_experts_per_tok\": 4, \"num_experts\": 60, \"norm_topk_prob\": false,"
    " \"output_router_logits\": false, \"router_aux_loss_coef\": 0.001}";

static const char *k_qwen3_30b =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"decoder_sparse_step\": 1,"
    " \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
    " \"max_window_layers\": 48, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\","
    " \"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"num_attention_heads\": 32,"
    " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
    " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

static void test_real_configs(tctx_t *t) {
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_parse(k_mixtral_8x7b, "mixtral/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.arch == ENG_ARCH_MIXTRAL && strcmp(c.model_type, "mixtral") == 0, "arch");
    EXPECT(t, c.hidden_size == 4096 && c.num_hidden_layers == 32 && c.vocab_size == 32000, "sizes");
    EXPECT(t, c.num_attention_heads == 32 && c.num_key_value_heads == 8 && c.head_dim == 128, "heads");
    EXPECT(t, c.num_experts == 8 && c.num_experts_per_tok == 2, "experts");
    EXPECT(t, c.intermediate_size == 14336 && c.moe_intermediate_size == 14336, "widths");
    EXPECT(t, c.shared_expert_intermediate_size == 0 && c.norm_topk_prob && !c.qkv_bias && !c.qk_norm,
           "flags");
    EXPECT(t, c.sliding_window == 0 && c.rope_theta == 1e6f && c.rms_norm_eps == 1e-5f, "rope/eps");
    EXPECT(t, fabsf(c.router_aux_loss_coef - 0.02f) < 1e-9f && !c.output_router_logits, "aux");
    for (int l = 0; l < 32; l++) EXPECT(t, c.layer_is_moe[l], "layer %d", l);
    EXPECT(t, c.config_json && strcmp(c.config_json, k_mixtral_8x7b) == 0, "text kept");
    eng_model_desc_t s;
    if (eng_model_desc_build(&c, &s, &err) == MT_OK) {
        /* Mixtral-8x7B: 46,702,792,704 parameters (model card: 46.7B) */
        EXPECT(t, eng_model_desc_numel(&s) == 46702792704ull, "mixtral numel %zu",
               eng_model_desc_numel(&s));
        size_t act = eng_model_desc_active_numel(&s, &c);
        EXPECT(t, act > 12.8e9 && act < 13.0e9, "mixtral active %zu (card: 12.9B)", act);
        eng_model_desc_free(&s);
    }
    eng_model_config_free(&c);

    st = eng_model_config_parse(k_qwen15_moe, "qwen15/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.arch == ENG_ARCH_QWEN2_MOE && c.num_experts == 60 && c.num_experts_per_tok == 4, "qwen2");
    EXPECT(t, c.moe_intermediate_size == 1408 && c.shared_expert_intermediate_size == 5632 &&
                  c.intermediate_size == 5632,
           "qwen2 widths");
    EXPECT(t, c.qkv_bias && !c.qk_norm && !c.norm_topk_prob && c.head_dim == 128, "qwen2 flags");
    EXPECT(t, c.sliding_window == 0, "use_sliding_window false -> full attention (%d)", c.sliding_window);
    if (eng_model_desc_build(&c, &s, &err) == MT_OK) {
        size_t n = eng_model_desc_numel(&s), act = eng_model_desc_active_numel(&s, &c);
        EXPECT(t, n > 14.2e9 && n < 14.4e9, "qwen1.5-moe numel %zu (card: 14.3B)", n);
        EXPECT(t, act > 2.6e9 && act < 2.8e9, "qwen1.5-moe active %zu (card: 2.7B)", act);
        eng_model_desc_free(&s);
    }
    eng_model_config_free(&c);

    st = eng_model_config_parse(k_qwen3_30b, "qwen3/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.arch == ENG_ARCH_QWEN3_MOE && c.num_experts == 128 && c.num_experts_per_tok == 8, "q3");
    EXPECT(t, c.head_dim == 128 && c.num_key_value_heads == 4 && c.qk_norm && !c.qkv_bias &&
                  c.norm_topk_prob && c.shared_expert_intermediate_size == 0,
           "q3 flags");
    for (int l = 0; l < 48; l++) EXPECT(t, c.layer_is_moe[l], "layer %d", l);
    if (eng_model_desc_build(&c, &s, &err) == MT_OK) {
        /* Qwen3-30B-A3B: 30,532,122,624 parameters (card: 30.5B, 3.3B active) */
        EXPECT(t, eng_model_desc_numel(&s) == 30532122624ull, "q3 numel %zu", eng_model_desc_numel(&s));
        size_t act = eng_model_desc_active_numel(&s, &c);
        EXPECT(t, act > 3.2e9 && act < 3.4e9, "q3 active %zu", act);
        eng_model_desc_free(&s);
    }
    eng_model_config_free(&c);
}

/* Only the required keys: everything else takes transformers' default. */
static void test_defaults(tctx_t *t) {
    eng_model_config_t c;
    mt_error_t err = {0};
    const char *mx = "{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"intermediate_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":16}";
    mt_status_t st = eng_model_config_parse(mx, "m.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.num_key_value_heads == 8 && c.num_experts == 8 && c.num_experts_per_tok == 2, "mx");
    EXPECT(t, c.head_dim == 4 && c.rope_theta == 1e6f && c.rms_norm_eps == 1e-5f, "mx rope/eps");
    EXPECT(t, c.max_position_embeddings == 131072 && !c.tie_word_embeddings && !c.output_router_logits,
           "mx misc");
    EXPECT(t, fabsf(c.router_aux_loss_coef - 0.001f) < 1e-9f && c.sliding_window == 0, "mx aux");
    eng_model_config_free(&c);

    const char *q2 = "{\"model_type\":\"qwen2_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"moe_intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":16}";
    st = eng_model_config_parse(q2, "q2.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.num_key_value_heads == 16 && c.num_experts == 60 && c.num_experts_per_tok == 4 &&
                  c.intermediate_size == 5632 && c.shared_expert_intermediate_size == 5632,
           "q2 defaults");
    EXPECT(t, c.qkv_bias && !c.norm_topk_prob && c.rope_theta == 10000.0f && c.rms_norm_eps == 1e-6f &&
                  c.max_position_embeddings == 32768,
           "q2 flags");
    eng_model_config_free(&c);

    const char *q3 = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"moe_intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
                     "\"num_key_value_heads\":null}";
    st = eng_model_config_parse(q3, "q3.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.num_key_value_heads == 8, "null kv heads -> num_attention_heads (%d)", c.num_key_value_heads);
    EXPECT(t, c.num_experts == 128 && c.num_experts_per_tok == 8 && c.intermediate_size == 6144 &&
                  !c.qkv_bias && c.qk_norm && !c.norm_topk_prob && c.head_dim == 8,
           "q3 defaults");
    eng_model_config_free(&c);

    /* transformers v5 spelling of the RoPE base */
    const char *v5 = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"moe_intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
                     "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":5000.0}}";
    st = eng_model_config_parse(v5, "v5.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.rope_theta == 5000.0f, "rope_parameters: %s", err.msg);
    eng_model_config_free(&c);
}

static void test_layers_and_overrides(tctx_t *t) {
    eng_model_config_t c;
    mt_error_t err = {0};
    const char *q = "{\"model_type\":\"qwen2_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                    "\"moe_intermediate_size\":16,\"num_hidden_layers\":6,\"num_attention_heads\":4,"
                    "\"num_key_value_heads\":2,"
                    "\"decoder_sparse_step\":2,\"mlp_only_layers\":[3, 17],\"num_experts\":4,"
                    "\"num_experts_per_tok\":2}";
    mt_status_t st = eng_model_config_parse(q, "q.json", "{\"output_router_logits\": true, "
                                                        "\"router_aux_loss_coef\": 0.5}",
                                            &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    /* (i+1) % 2 == 0 -> 1, 3, 5; minus mlp_only 3 -> 1, 5 */
    const bool want[6] = {false, true, false, false, false, true};
    for (int l = 0; l < 6; l++) EXPECT(t, c.layer_is_moe[l] == want[l], "layer %d", l);
    EXPECT(t, c.output_router_logits && c.router_aux_loss_coef == 0.5f, "overrides applied");
    EXPECT(t, strcmp(c.config_json, q) == 0, "config_json keeps the file text, not the overrides");
    eng_model_config_free(&c);

    const char *q0 = "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,\"hidden_size\":64,"
                     "\"moe_intermediate_size\":16,\"num_hidden_layers\":2,\"num_attention_heads\":4,"
                     "\"num_experts\":0,\"use_sliding_window\":true,\"sliding_window\":128}";
    st = eng_model_config_parse(q0, "q0.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && !c.layer_is_moe[0] && !c.layer_is_moe[1], "num_experts 0: all dense");
    EXPECT(t, c.sliding_window == 128, "qwen3 sliding window %d", c.sliding_window);
    eng_model_config_free(&c);
}

static void expect_refused(tctx_t *t, int line, const char *text, const char *overrides,
                           mt_status_t code, const char *needle) {
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_parse(text, "dir/config.json", overrides, &c, &err);
    if (st == MT_OK) {
        fprintf(stderr, "FAIL line %d: accepted, want %s\n", line, mt_status_name(code));
        t->failures++;
        eng_model_config_free(&c);
        return;
    }
    if (st != code || !strstr(err.msg, needle) || !strstr(err.msg, "dir/config.json")) {
        fprintf(stderr, "FAIL line %d: got %s '%s', want %s naming '%s' and the file\n", line,
                mt_status_name(st), err.msg, mt_status_name(code), needle);
        t->failures++;
    }
    EXPECT(t, c.config_json == NULL, "no text kept on failure");
}

#define BASE_Q3 "\"vocab_size\":100,\"hidden_size\":64,\"moe_intermediate_size\":16," \
                "\"num_hidden_layers\":2,\"num_attention_heads\":4"

static void test_refusals(tctx_t *t) {
    expect_refused(t, __LINE__, "{\"model_type\":\"llama\"," BASE_Q3 "}", NULL, MT_ERR_UNSUPPORTED,
                   "'llama'");
    expect_refused(t, __LINE__, "{\"model_type\":\"llama\"}", NULL, MT_ERR_UNSUPPORTED, "qwen3_moe");
    expect_refused(t, __LINE__, "{" BASE_Q3 "}", NULL, MT_ERR_CONFIG, "'model_type'");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\",\"vocab_size\":100,"
                                "\"moe_intermediate_size\":16,\"num_hidden_layers\":2,"
                                "\"num_attention_heads\":4}",
                   NULL, MT_ERR_CONFIG, "'hidden_size'");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"num_experts\":\"8\"}",
                   NULL, MT_ERR_CONFIG, "'num_experts'");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"norm_topk_prob\":1}",
                   NULL, MT_ERR_CONFIG, "'norm_topk_prob'");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen3_moe\"," BASE_Q3
                   ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4.0}}",
                   NULL, MT_ERR_UNSUPPORTED, "rope_scaling");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
                   "\"intermediate_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
                   "\"router_jitter_noise\":0.1}",
                   NULL, MT_ERR_UNSUPPORTED, "router_jitter_noise");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"hidden_act\":\"gelu\"}",
                   NULL, MT_ERR_UNSUPPORTED, "hidden_act");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen2_moe\"," BASE_Q3
                   ",\"num_key_value_heads\":4,\"use_sliding_window\":true,\"sliding_window\":64}",
                   NULL, MT_ERR_UNSUPPORTED, "use_sliding_window");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"num_key_value_heads\":3}",
                   NULL, MT_ERR_CONFIG, "num_key_value_heads");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"num_experts\":4,\"num_experts_per_tok\":5}",
                   NULL, MT_ERR_CONFIG, "num_experts_per_tok");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"decoder_sparse_step\":0}",
                   NULL, MT_ERR_CONFIG, "decoder_sparse_step");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"rms_norm_eps\":-1}",
                   NULL, MT_ERR_CONFIG, "'rms_norm_eps' = -1");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"rms_norm_eps\":0}",
                   NULL, MT_ERR_CONFIG, "'rms_norm_eps' = 0");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ", ", NULL, MT_ERR_CONFIG,
                   "not valid JSON");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 "}", "[1]", MT_ERR_CONFIG,
                   "overrides");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 "}",
                   "{\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}}", MT_ERR_UNSUPPORTED,
                   "rope_scaling");
}

static void test_load(tctx_t *t) {
    const char *base = getenv("TEST_TMPDIR");
    char dir[512], path[600];
    snprintf(dir, sizeof dir, "%s/mc_test_%d", base ? base : "/tmp", (int)getpid());
    mkdir(dir, 0755);
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_load(dir, NULL, &c, &err);
    snprintf(path, sizeof path, "%s/config.json", dir);
    EXPECT(t, st == MT_ERR_IO && strstr(err.msg, path), "missing config.json: %s", err.msg);
    FILE *fp = fopen(path, "w");
    fputs(k_qwen3_30b, fp);
    fclose(fp);
    st = eng_model_config_load(dir, NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.num_experts == 128 && strcmp(c.config_json, k_qwen3_30b) == 0,
           "load: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    unlink(path);
    rmdir(dir);
}

/* OLMoE-1B-7B (allenai/OLMoE-1B-7B-0924): every layer sparse, expert width
 * from intermediate_size, whole-projection q/k norm, OlmoeConfig defaults. */
static void test_olmoe(tctx_t *t) {
    static const char *k_olmoe =
        "{\"architectures\": [\"OlmoeForCausalLM\"], \"attention_bias\": false, \"clip_qkv\": null,"
        " \"hidden_act\": \"silu\", \"hidden_size\": 2048, \"intermediate_size\": 1024,"
        " \"max_position_embeddings\": 4096, \"model_type\": \"olmoe\", \"norm_topk_prob\": false,"
        " \"num_attention_heads\": 16, \"num_experts\": 64, \"num_experts_per_tok\": 8,"
        " \"num_hidden_layers\": 16, \"num_key_value_heads\": 16, \"rms_norm_eps\": 1e-05,"
        " \"rope_scaling\": null, \"rope_theta\": 10000.0, \"router_aux_loss_coef\": 0.01,"
        " \"tie_word_embeddings\": false, \"vocab_size\": 50304}";
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_parse(k_olmoe, "olmoe/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.arch == ENG_ARCH_OLMOE && strcmp(c.model_type, "olmoe") == 0, "olmoe arch");
    EXPECT(t, c.num_experts == 64 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 1024, "olmoe experts");
    EXPECT(t, c.qk_norm && c.qk_norm_whole && !c.qkv_bias && !c.norm_topk_prob && c.head_dim == 128, "olmoe flags");
    EXPECT(t, fabsf(c.router_aux_loss_coef - 0.01f) < 1e-9f && c.rope_theta == 10000.0f, "olmoe aux/rope");
    for (int l = 0; l < 16; l++) EXPECT(t, c.layer_is_moe[l], "olmoe layer %d", l);
    eng_model_config_free(&c);
    /* defaults: no kv heads (= heads), no router_aux_loss_coef (0.01), experts 64 top-8 */
    st = eng_model_config_parse("{\"model_type\": \"olmoe\", \"vocab_size\": 64, \"hidden_size\": 32,"
                                " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 16}",
                                "olmoe-min/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK, "%s", err.msg);
    EXPECT(t, c.num_key_value_heads == 4 && c.num_experts == 64 && c.num_experts_per_tok == 8, "olmoe defaults");
    EXPECT(t, fabsf(c.router_aux_loss_coef - 0.01f) < 1e-9f && c.rms_norm_eps == 1e-5f, "olmoe default coef/eps");
    eng_model_config_free(&c);
    st = eng_model_config_parse("{\"model_type\": \"olmoe\", \"vocab_size\": 64, \"hidden_size\": 32,"
                                " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 16,"
                                " \"clip_qkv\": 8.0}",
                                "olmoe-clip/config.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.clip_qkv == 8.0f, "clip_qkv: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    expect_refused(t, __LINE__,
                   "{\"model_type\": \"olmoe\", \"vocab_size\": 64, \"hidden_size\": 32, \"num_hidden_layers\": 2,"
                   " \"num_attention_heads\": 4, \"intermediate_size\": 16, \"clip_qkv\": -1}",
                   NULL, MT_ERR_CONFIG, "'clip_qkv'");
}

/* Both spellings of the routed-expert count, as transformers accepts them:
 * transformers 5 writes Qwen3-MoE's as num_local_experts. */
static void test_expert_count_aliases(tctx_t *t) {
    static const char *q3 = "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 64, \"hidden_size\": 32,"
                            " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
                            " \"moe_intermediate_size\": 16, \"num_experts_per_tok\": 2, %s}";
    char text[1024];
    eng_model_config_t c;
    mt_error_t err = {0};
    snprintf(text, sizeof text, q3, "\"num_local_experts\": 6");
    mt_status_t st = eng_model_config_parse(text, "q3-t5.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.num_experts == 6, "num_local_experts read for qwen3_moe: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    snprintf(text, sizeof text, q3, "\"num_local_experts\": 6, \"num_experts\": 8");
    st = eng_model_config_parse(text, "q3-both.json", NULL, &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "disagree") && strstr(err.msg, "num_local_experts"),
           "disagreeing spellings refused: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
}

/* The spellings transformers 5 reads for the keys moetune reads
 * (configuration_utils.py's torch_dtype, convert_rope_params_to_dict,
 * remap_legacy_layer_types; each family's attribute_map): the same model
 * whichever is used. */
static float theta_of(tctx_t *t, int line, const char *text) {
    eng_model_config_t c;
    mt_error_t err = {0};
    if (eng_model_config_parse(text, "a.json", NULL, &c, &err) != MT_OK) {
        fprintf(stderr, "FAIL line %d: %s\n", line, err.msg);
        t->failures++;
        return -1;
    }
    const float th = c.rope_theta;
    eng_model_config_free(&c);
    return th;
}

static void test_transformers5_aliases(tctx_t *t) {
    /* rope_theta: in rope_parameters, top level, or in a transformers 4
     * rope_scaling, which replaces rope_parameters when set */
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"rope_theta\":7000.0}") == 7000.0f,
           "top-level rope_theta");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3
                                    ",\"rope_theta\":7000.0,\"rope_parameters\":{\"rope_type\":\"default\"}}") == 7000.0f,
           "rope_parameters without rope_theta keeps the top-level one");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3
                                    ",\"rope_theta\":7000.0,\"rope_parameters\":{\"rope_theta\":3000.0}}") == 3000.0f,
           "rope_parameters.rope_theta wins");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3
                                    ",\"rope_scaling\":{\"type\":\"default\",\"rope_theta\":2000.0},"
                                    "\"rope_parameters\":{\"rope_theta\":3000.0}}") == 2000.0f,
           "a set rope_scaling takes rope_parameters' place");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3
                                    ",\"rope_scaling\":{},\"rope_parameters\":{\"rope_theta\":3000.0}}") == 3000.0f,
           "an empty rope_scaling is not set");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
                                    "\"intermediate_size\":32,\"num_hidden_layers\":2,\"num_attention_heads\":8,"
                                    "\"rope_parameters\":{\"rope_type\":\"default\"}}") == 1e6f,
           "Mixtral's default_theta is 1e6");
    /* nested by layer type (Qwen2-MoE declares layer_types) */
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":4," BASE_Q3
                                    ",\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\","
                                    "\"rope_theta\":4000.0},\"sliding_attention\":{\"rope_theta\":4000.0}}}") == 4000.0f,
           "nested rope_parameters");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":4," BASE_Q3
                   ",\"rope_parameters\":{\"full_attention\":{\"rope_theta\":4000.0},"
                   "\"sliding_attention\":{\"rope_theta\":10000.0}}}",
                   NULL, MT_ERR_UNSUPPORTED, "rope_parameters");
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"rope_parameters\":{\"rope_type\":\"default\","
                   "\"partial_rotary_factor\":0.5}}",
                   NULL, MT_ERR_UNSUPPORTED, "rope_parameters.partial_rotary_factor");
    expect_refused(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"partial_rotary_factor\":0.25}", NULL,
                   MT_ERR_UNSUPPORTED, "partial_rotary_factor");
    EXPECT(t, theta_of(t, __LINE__, "{\"model_type\":\"qwen3_moe\"," BASE_Q3 ",\"partial_rotary_factor\":1.0}") > 0,
           "partial_rotary_factor 1.0 is the whole head");

    /* head_dim: absent or null (transformers 5 writes "head_dim": null for
     * Mixtral) means hidden_size / num_attention_heads */
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_model_config_parse("{\"model_type\":\"mixtral\",\"vocab_size\":100,\"hidden_size\":64,"
                                            "\"intermediate_size\":32,\"num_hidden_layers\":2,"
                                            "\"num_attention_heads\":8,\"head_dim\":null,\"num_key_value_heads\":null}",
                                            "a.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.head_dim == 8 && c.num_key_value_heads == 8, "null head_dim / kv heads: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);

    /* layer_types: the older name "attention" is full attention */
    st = eng_model_config_parse("{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":4," BASE_Q3
                                ",\"layer_types\":[\"attention\",\"full_attention\"]}",
                                "a.json", NULL, &c, &err);
    EXPECT(t, st == MT_OK && c.sliding_window == 0, "legacy layer type: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    expect_refused(t, __LINE__,
                   "{\"model_type\":\"qwen2_moe\",\"num_key_value_heads\":4," BASE_Q3 ",\"layer_types\":[\"linear_attention\",\"full_attention\"]}",
                   NULL, MT_ERR_UNSUPPORTED, "layer_types");

    /* dtype (transformers 5) wins over torch_dtype */
    st = eng_model_config_parse("{\"model_type\":\"qwen3_moe\"," BASE_Q3
                                ",\"dtype\":\"bfloat16\",\"torch_dtype\":\"float32\"}",
                                "a.json", NULL, &c, &err);
    eng_model_desc_t d;
    if (st == MT_OK && eng_model_desc_build(&c, &d, &err) == MT_OK) {
        EXPECT(t, d.params[0].dtype == MT_BF16, "dtype over torch_dtype: %s", mt_dtype_name(d.params[0].dtype));
        eng_model_desc_free(&d);
    } else {
        EXPECT(t, 0, "dtype: %s", err.msg);
    }
    if (st == MT_OK) eng_model_config_free(&c);
}

/* A config with only the size keys: everything else is the config class's default. */
static mt_status_t parse_min(const char *type, const char *extra, eng_model_config_t *c, mt_error_t *err) {
    char json[2048];
    /* 16 heads: GLM's default of 8 KV heads must divide them */
    snprintf(json, sizeof json,
             "{\"model_type\": \"%s\", \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 6,"
             " \"num_attention_heads\": 16, \"moe_intermediate_size\": 32%s%s}",
             type, extra[0] ? ", " : "", extra);
    return eng_model_config_parse(json, "min.json", NULL, c, err);
}

/* DeepSeek-V2/V3, GLM-4.5 and gpt-oss: transformers' defaults, the
 * variants each accepts and what it refuses, naming the key. */
static void test_described_families(tctx_t *t) {
    eng_model_config_t c;
    mt_error_t err = {0};
    mt_status_t st = parse_min("deepseek_v3", "", &c, &err);
    EXPECT(t, st == MT_OK, "v3 defaults: %s", err.msg);
    if (st == MT_OK) {
        EXPECT(t, c.arch == ENG_ARCH_DEEPSEEK_V3 && c.mla && c.q_lora_rank == 1536 && c.kv_lora_rank == 512 &&
                      c.qk_nope_head_dim == 128 && c.qk_rope_head_dim == 64 && c.v_head_dim == 128 &&
                      c.head_dim == 64 && c.num_key_value_heads == 16,
               "v3 MLA defaults");
        EXPECT(t, c.num_experts == 256 && c.num_experts_per_tok == 8 && c.n_shared_experts == 1 &&
                      c.shared_expert_intermediate_size == 32 && c.n_group == 8 && c.topk_group == 4 &&
                      c.first_k_dense_replace == 3 && c.norm_topk_prob && c.routed_scaling_factor == 2.5f &&
                      c.routing == ENG_ROUTE_SIGMOID_GROUP_BIAS && c.router_score_bias && c.rope_interleave &&
                      c.intermediate_size == 18432 && c.rms_norm_eps == 1e-6f && c.rope_theta == 10000.0f,
               "v3 MoE defaults");
        EXPECT(t, !c.layer_is_moe[2] && c.layer_is_moe[3] && c.layer_is_moe[5], "v3 first 3 layers dense");
        eng_model_config_free(&c);
    }
    st = parse_min("deepseek_v3",
                   "\"q_lora_rank\": null, \"moe_layer_freq\": 2, \"first_k_dense_replace\": 1, \"num_nextn_predict_layers\": 1,"
                   " \"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"beta_fast\": 32, \"beta_slow\": 1,"
                   " \"mscale\": 1.0, \"mscale_all_dim\": 1.0, \"original_max_position_embeddings\": 4096}",
                   &c, &err);
    EXPECT(t, st == MT_OK, "v3 yarn: %s", err.msg);
    if (st == MT_OK) {
        EXPECT(t, c.q_lora_rank == 0 && strcmp(c.rope_type, "yarn") == 0 && c.rope_factor == 40.0f &&
                      c.rope_original_max_position_embeddings == 4096 && c.rope_mscale_all_dim == 1.0f &&
                      c.num_nextn_predict_layers == 1,
               "v3 yarn recorded, q_lora_rank null");
        EXPECT(t, !c.layer_is_moe[0] && !c.layer_is_moe[1] && c.layer_is_moe[2] && !c.layer_is_moe[3] && c.layer_is_moe[4],
               "moe_layer_freq 2 after first_k_dense_replace 1");
        eng_model_config_free(&c);
    }
    st = parse_min("deepseek_v3", "\"scoring_func\": \"softmax\"", &c, &err);
    EXPECT(t, st == MT_ERR_UNSUPPORTED && strstr(err.msg, "min.json") && strstr(err.msg, "'scoring_func'"),
           "v3 softmax refused: %s", err.msg);
    st = parse_min("deepseek_v3", "\"n_routed_experts\": 250", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'n_group'"), "experts not a multiple of groups: %s", err.msg);
    st = parse_min("deepseek_v3", "\"attention_bias\": true", &c, &err);
    EXPECT(t, st == MT_ERR_UNSUPPORTED && strstr(err.msg, "'attention_bias'"), "MLA bias: %s", err.msg);

    /* DeepSeek-V2: num_experts_per_tok has no default; greedy or group-limited softmax */
    st = parse_min("deepseek_v2", "", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'num_experts_per_tok'"), "v2 needs top-k: %s", err.msg);
    st = parse_min("deepseek_v2", "\"num_experts_per_tok\": 6", &c, &err);
    EXPECT(t, st == MT_OK, "v2: %s", err.msg);
    if (st == MT_OK) {
        EXPECT(t, c.arch == ENG_ARCH_DEEPSEEK_V2 && c.num_experts == 64 && c.n_shared_experts == 2 &&
                      c.routing == ENG_ROUTE_SOFTMAX && !c.norm_topk_prob && !c.router_score_bias &&
                      c.first_k_dense_replace == 0 && c.layer_is_moe[0] && c.routed_scaling_factor == 1.0f,
               "v2 defaults");
        eng_model_config_free(&c);
    }
    st = parse_min("deepseek_v2",
                   "\"num_experts_per_tok\": 6, \"topk_method\": \"group_limited_greedy\", \"n_group\": 8, \"topk_group\": 3",
                   &c, &err);
    EXPECT(t, st == MT_OK && c.routing == ENG_ROUTE_SOFTMAX_GROUP, "v2 group-limited: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    st = parse_min("deepseek_v2", "\"num_experts_per_tok\": 6, \"topk_method\": \"group_limited_greedy\"", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'n_group'"), "v2 groups needed: %s", err.msg);

    /* GLM-4.5 */
    st = parse_min("glm4_moe", "", &c, &err);
    EXPECT(t, st == MT_OK, "glm: %s", err.msg);
    if (st == MT_OK) {
        EXPECT(t, c.arch == ENG_ARCH_GLM4_MOE && c.partial_rotary_factor == 0.5f && c.num_key_value_heads == 8 &&
                      c.num_experts == 128 && c.first_k_dense_replace == 1 && !c.layer_is_moe[0] && c.layer_is_moe[1] &&
                      c.router_score_bias && !c.qkv_bias && !c.qk_norm && !c.mla && c.intermediate_size == 10944,
               "glm defaults");
        eng_model_config_free(&c);
    }
    st = parse_min("glm4_moe", "\"num_key_value_heads\": 2, \"attention_bias\": true, \"use_qk_norm\": true,"
                               " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1000000,"
                               " \"partial_rotary_factor\": 0.25}",
                   &c, &err);
    EXPECT(t, st == MT_OK && c.qkv_bias && c.qk_norm && c.partial_rotary_factor == 0.25f && c.rope_theta == 1e6f,
           "glm transformers 5 rope_parameters: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);

    /* gpt-oss: no rope_scaling key means GptOssConfig's YaRN; head_dim 64 */
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2", &c, &err);
    EXPECT(t, st == MT_OK, "gpt-oss: %s", err.msg);
    if (st == MT_OK) {
        EXPECT(t, c.arch == ENG_ARCH_GPT_OSS && c.head_dim == 64 && c.num_experts == 128 && c.num_experts_per_tok == 4 &&
                      c.intermediate_size == 2880 && c.moe_intermediate_size == 2880 && c.sliding_window == 128 &&
                      strcmp(c.rope_type, "yarn") == 0 && c.rope_factor == 32.0f && c.rope_theta == 150000.0f &&
                      c.router_aux_loss_coef == 0.001f && c.swiglu_limit == 7.0f && c.swiglu_alpha == 1.702f &&
                      !c.rope_truncate && c.attn_sinks && c.router_bias &&
                      c.experts_fused && c.qkv_bias && c.routing == ENG_ROUTE_TOPK_SOFTMAX,
               "gpt-oss defaults");
        EXPECT(t, !c.layer_full_attention[0] && c.layer_full_attention[1] && !c.layer_full_attention[4] &&
                      c.layer_full_attention[5],
               "gpt-oss default layer_types alternate");
        eng_model_config_free(&c);
    }
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2, \"rope_scaling\": null", &c, &err);
    EXPECT(t, st == MT_OK && strcmp(c.rope_type, "default") == 0, "gpt-oss rope_scaling null: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    /* YaRN's optional keys, as transformers reads them (truncate defaults to true in a given dict) */
    st = parse_min("gpt_oss",
                   "\"num_key_value_heads\": 2, \"rope_scaling\": {\"rope_type\": \"yarn\", \"factor\": 8.0, "
                   "\"original_max_position_embeddings\": 512, \"attention_factor\": 1.5}",
                   &c, &err);
    EXPECT(t, st == MT_OK && c.rope_truncate && c.rope_attention_factor == 1.5f && c.rope_factor == 8.0f,
           "gpt-oss YaRN keys: %s", err.msg);
    if (st == MT_OK) eng_model_config_free(&c);
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2, \"rope_scaling\": {\"rope_type\": \"yarn\", \"truncate\": 1}",
                   &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "rope_scaling.truncate"), "truncate not a bool: %s", err.msg);
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2, \"swiglu_limit\": 0", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'swiglu_limit'"), "swiglu_limit 0: %s", err.msg);
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2, \"layer_types\": [\"full_attention\"]", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'layer_types'") && strstr(err.msg, "6 layers"),
           "layer_types too short: %s", err.msg);
    st = parse_min("gpt_oss", "\"num_key_value_heads\": 2, \"experts_per_token\": 3", &c, &err);
    EXPECT(t, st == MT_ERR_CONFIG && strstr(err.msg, "'experts_per_token'"), "top-k disagree: %s", err.msg);
}

int main(void) {
    tctx_t t = {0};
    test_expert_count_aliases(&t);
    test_real_configs(&t);
    test_olmoe(&t);
    test_defaults(&t);
    test_layers_and_overrides(&t);
    test_refusals(&t);
    test_transformers5_aliases(&t);
    test_load(&t);
    test_described_families(&t);
    if (t.failures) {
        fprintf(stderr, "model_config_test: %d failure(s)\n", t.failures);
        return 1;
    }
    printf("model_config_test: all passed\n");
    return 0;
}
