/* eng_checkpoint_check on tiny Qwen3-MoE and Mixtral checkpoints written to
 * $TEST_TMPDIR: a matching config passes; each size key changed in
 * config.json is reported naming that key, the tensor and both shapes;
 * tensors the config does not explain (an expert or a layer too many) are
 * an error naming the first and why, a note-free pass with allow_unused;
 * RoPE's inv_freq buffer, which transformers drops, passes. */
#include "engine/model/io/checkpoint.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/init_random.h"

static int failures;
#define EXPECT(c, ...)                                                                   \
    do {                                                                                 \
        if (!(c)) {                                                                      \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                                \
            fprintf(stderr, "\n");                                                       \
            failures++;                                                                  \
        }                                                                                \
    } while (0)

#define QWEN3 "{\"model_type\": \"qwen3_moe\", \"vocab_size\": 40, \"hidden_size\": 16, " \
              "\"moe_intermediate_size\": 8, \"intermediate_size\": 24, \"num_hidden_layers\": 2, " \
              "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, "        \
              "\"num_experts\": 4, \"num_experts_per_tok\": 2%s}"
#define MIXTRAL "{\"model_type\": \"mixtral\", \"vocab_size\": 40, \"hidden_size\": 16, "  \
                "\"intermediate_size\": 8, \"num_hidden_layers\": %d, "                    \
                "\"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"num_local_experts\": %d}"

/* Checks dir's weights against config text; returns the status, err filled. */
static mt_status_t check(const char *dir, const char *config, bool allow, mt_error_t *err) {
    eng_model_config_t cfg;
    eng_model_desc_t spec;
    eng_checkpoint_t ck;
    mt_status_t st = eng_model_config_parse(config, "dir/config.json", NULL, &cfg, err);
    if (st != MT_OK) return st;
    st = eng_model_desc_build(&cfg, &spec, err);
    if (st == MT_OK) {
        st = eng_checkpoint_open(dir, &ck, err);
        if (st == MT_OK) {
            st = eng_checkpoint_check(&ck, &cfg, &spec, "dir/config.json", allow, err);
            eng_checkpoint_close(&ck);
        }
        eng_model_desc_free(&spec);
    }
    eng_model_config_free(&cfg);
    return st;
}

static void expect_mismatch(const char *dir, const char *config, const char *key, const char *tensor) {
    mt_error_t err = {0};
    mt_status_t st = check(dir, config, false, &err);
    EXPECT(st == MT_ERR_FORMAT && strstr(err.msg, "dir/config.json disagrees") && strstr(err.msg, key) &&
               strstr(err.msg, tensor),
           "want a mismatch naming %s and %s, got %d: %s", key, tensor, (int)st, err.msg);
}

int main(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    char q[1024], m[1024], m3[1024], text[2048], t2[2048];
    snprintf(q, sizeof q, "%s/qwen3", tmp ? tmp : "/tmp");
    snprintf(m, sizeof m, "%s/mixtral", tmp ? tmp : "/tmp");
    snprintf(m3, sizeof m3, "%s/mixtral3", tmp ? tmp : "/tmp");
    mt_error_t err = {0};
    snprintf(text, sizeof text, QWEN3, "");
    EXPECT(eng_checkpoint_init_random(q, text, 1, &err) == MT_OK, "%s", err.msg);
    EXPECT(check(q, text, false, &err) == MT_OK, "matching config refused: %s", err.msg);

    snprintf(t2, sizeof t2, QWEN3, "");
    char *p = strstr(t2, "\"moe_intermediate_size\": 8");
    p[25] = '6';
    expect_mismatch(q, t2, "set by moe_intermediate_size", "mlp.experts.0.gate_proj.weight");
    snprintf(t2, sizeof t2, QWEN3, "");
    p = strstr(t2, "\"head_dim\": 8");
    p[12] = '4';
    expect_mismatch(q, t2, "num_attention_heads x head_dim", "self_attn.q_proj.weight");
    snprintf(t2, sizeof t2, QWEN3, "");
    p = strstr(t2, "\"num_experts\": 4");
    p[15] = '6';
    expect_mismatch(q, t2, "set by num_experts", "mlp.gate.weight");
    snprintf(t2, sizeof t2, QWEN3, "");
    p = strstr(t2, "\"vocab_size\": 40");
    p[14] = '5';
    expect_mismatch(q, t2, "set by vocab_size", "model.embed_tokens.weight");

    /* weights with 5 experts and 3 layers, configs saying 4 experts or 2 layers */
    snprintf(text, sizeof text, MIXTRAL, 2, 5);
    EXPECT(eng_checkpoint_init_random(m, text, 2, &err) == MT_OK, "%s", err.msg);
    snprintf(t2, sizeof t2, MIXTRAL, 2, 4);
    mt_status_t st = check(m, t2, false, &err);
    EXPECT(st == MT_ERR_FORMAT && strstr(err.msg, "set by num_local_experts"), "router first: %s", err.msg);
    snprintf(text, sizeof text, MIXTRAL, 3, 4);
    EXPECT(eng_checkpoint_init_random(m3, text, 3, &err) == MT_OK, "%s", err.msg);
    snprintf(t2, sizeof t2, MIXTRAL, 2, 4);
    st = check(m3, t2, false, &err);
    EXPECT(st == MT_ERR_FORMAT && strstr(err.msg, "does not explain") && strstr(err.msg, "'model.layers.2.") &&
               strstr(err.msg, "layer 2, while num_hidden_layers is 2") && strstr(err.msg, "allow_unused_tensors"),
           "extra layer: %s", err.msg);
    EXPECT(check(m3, t2, true, &err) == MT_OK, "allow_unused: %s", err.msg);
    if (failures) {
        fprintf(stderr, "ckpt_check_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("ckpt_check_test: all passed\n");
    return 0;
}
