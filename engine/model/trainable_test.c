/* What engine/model/trainable.c lets train: the published configs of
 * DeepSeek-V3 (YaRN, FP8 quantization_config, 256 experts in 8 groups) and
 * GLM-4.5-Air pass; each refusal names its key. */
#include <stdio.h>
#include <string.h>

#include "engine/model/model.h"

static int failures;

#define EXPECT(cond, ...)                                                   \
    do {                                                                    \
        if (!(cond)) {                                                      \
            fprintf(stderr, "%s:%d: expectation failed: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                   \
            fputc('\n', stderr);                                            \
            failures++;                                                     \
        }                                                                   \
    } while (0)

/* Checks the config in configs/models/<name> with `overrides` merged; want
 * NULL: accepted, else a refusal whose message contains `want`. */
static void check(const char *name, const char *overrides, const char *want) {
    char dir[256];
    snprintf(dir, sizeof dir, "configs/models/%s", name);
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_load(dir, overrides, &cfg, &err) != MT_OK) {
        EXPECT(0, "%s: %s", dir, err.msg);
        return;
    }
    mt_error_t e2 = {0};
    const mt_status_t st = eng_model_check_trainable(&cfg, overrides, dir, &e2);
    if (!want)
        EXPECT(st == MT_OK, "%s %s: refused: %s", name, overrides ? overrides : "", e2.msg);
    else
        EXPECT(st != MT_OK && strstr(e2.msg, want), "%s %s: want a refusal naming '%s', got: %s", name, overrides,
               want, st == MT_OK ? "accepted" : e2.msg);
    if (st != MT_OK) printf("%s %s: %s\n", name, overrides ? overrides : "", e2.msg);
    eng_model_config_free(&cfg);
}

int main(void) {
    check("deepseek-v3", NULL, NULL);
    check("glm-4.5-air", NULL, NULL);
    check("deepseek-v3", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\"}}", "quantization_config");
    check("deepseek-v3", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\"}}", "load_in_4bit");
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
                         "\"bnb_4bit_quant_type\": \"nf4\", \"bnb_4bit_use_double_quant\": true}}", NULL);
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
                         "\"bnb_4bit_quant_storage\": \"bfloat16\"}}", "bnb_4bit_quant_storage");
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_8bit\": true}}",
          "load_in_8bit");
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true, "
                         "\"bnb_4bit_quant_type\": \"int4\"}}", "bnb_4bit_quant_type");
    check("deepseek-v3", "{\"quantization_config\": {\"quant_method\": \"hqq\"}}", "unknown quant_method \"hqq\"");
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"gptq\", \"bits\": 4}}", "not read yet");
    check("glm-4.5-air", "{\"quantization_config\": {\"bits\": 4}}", "quant_method is missing");
    check("glm-4.5-air", "{\"quantization_config\": {\"quant_method\": \"mxfp4\"}}", NULL);
    check("deepseek-v3", "{\"moe_layer_freq\": 2}", "moe_layer_freq");
    check("deepseek-v3", "{\"mlp_bias\": true}", "mlp_bias");
    check("deepseek-v3", "{\"num_experts_per_tok\": 40}", "num_experts_per_tok");
    check("deepseek-v3", "{\"n_group\": 64, \"topk_group\": 1, \"num_experts_per_tok\": 8}", "num_experts_per_tok");
    check("glm-4.5-air", "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 4.0, "
                         "\"original_max_position_embeddings\": 4096}}", NULL);
    check("glm-4.5-air", "{\"rope_scaling\": {\"type\": \"linear\", \"factor\": 4.0}}", "rope_scaling");
    /* YaRN's attention_factor and truncate are computed (engine/model/desc/rope_tables.c) */
    check("deepseek-v3", "{\"rope_scaling\": {\"type\": \"yarn\", \"factor\": 40, \"attention_factor\": 1.5, "
                         "\"truncate\": false, \"original_max_position_embeddings\": 4096}}", NULL);
    if (failures) {
        fprintf(stderr, "model_trainable_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("model_trainable_test: ok\n");
    return 0;
}
