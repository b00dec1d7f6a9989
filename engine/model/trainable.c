/* What a family marked as training (family.c's `trains`) cannot train
 * yet, refused by name before anything is allocated (see model.h). */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "engine/model/model.h"
#include "engine/model/desc/rope_tables.h"
#include "kernels/router_group.h"

/* The grouped sigmoid router's limits (kernels/router_group.h), with the config keys named. */
static mt_status_t check_group_router(const eng_model_config_t *c, const char *path, mt_error_t *err) {
    const int E = c->num_experts, k = c->num_experts_per_tok;
    const int G = c->n_group > 0 ? c->n_group : 1, keep = c->topk_group > 0 ? c->topk_group : 1;
    if (E % G != 0 || E / G < 2)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: n_routed_experts = %d in n_group = %d groups: each group must hold the same number "
                            "of experts, at least 2 (the group score sums the two best)",
                            path, E, G);
    if (G > KERN_ROUTER_GROUP_MAX_GROUPS || keep > G)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: topk_group = %d of n_group = %d groups (n_group at most %d)",
                            path, keep, G, KERN_ROUTER_GROUP_MAX_GROUPS);
    if (k > KERN_ROUTER_GROUP_MAX_K || k > keep * (E / G))
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: num_experts_per_tok = %d exceeds the %d experts of the topk_group = %d kept groups "
                            "(or moetune's limit of %d)",
                            path, k, keep * (E / G), keep, KERN_ROUTER_GROUP_MAX_K);
    return MT_OK;
}

/* What in a quantization_config moetune cannot read (NULL: none, DeepSeek's
 * FP8, gpt-oss's MXFP4 or bitsandbytes 4-bit, which the checkpoint reader
 * keeps as stored or dequantises through base/quant.h).  Methods whose format base/quant.h defines but whose
 * checkpoints are not read yet are named as such; others are unknown. */
static const char *quant_unsupported(json_t *q, char *buf, size_t len) {
    if (!q || json_is_null(q)) return NULL;
    if (!json_is_object(q)) return "it is not an object";
    json_t *m = json_object_get(q, "quant_method");
    if (!json_is_string(m)) return "quant_method is missing (or not a string)";
    const char *method = json_string_value(m);
    if (strcmp(method, "mxfp4") == 0) return NULL;
    if (strcmp(method, "fp8") == 0) {
        json_t *f = json_object_get(q, "fmt");
        if (f && (!json_is_string(f) || strcmp(json_string_value(f), "e4m3") != 0)) return "fmt is not \"e4m3\"";
        json_t *b = json_object_get(q, "weight_block_size");
        if (b && !(json_is_array(b) && json_array_size(b) == 2 && json_integer_value(json_array_get(b, 0)) == 128 &&
                   json_integer_value(json_array_get(b, 1)) == 128))
            return "weight_block_size is not [128, 128]";
        return NULL;
    }
    if (strcmp(method, "bitsandbytes") == 0) {
        /* 4-bit: read as stored (engine/model/io/bnb4.c); LLM.int8's outlier split is not computed */
        if (json_is_true(json_object_get(q, "load_in_8bit")))
            return "quant_method \"bitsandbytes\" with load_in_8bit: 8-bit (LLM.int8) checkpoints are not read "
                   "(docs/quantization.md)";
        if (!json_is_true(json_object_get(q, "load_in_4bit")))
            return "quant_method \"bitsandbytes\" without load_in_4bit: true (moetune reads bitsandbytes' 4-bit "
                   "checkpoints)";
        json_t *qs = json_object_get(q, "bnb_4bit_quant_storage");
        if (qs && !(json_is_string(qs) && strcmp(json_string_value(qs), "uint8") == 0))
            return "bnb_4bit_quant_storage is not \"uint8\" (moetune reads the codes as U8 bytes, as "
                   "bitsandbytes stores them by default)";
        json_t *t = json_object_get(q, "bnb_4bit_quant_type");
        if (t && !(json_is_string(t) && (strcmp(json_string_value(t), "nf4") == 0 ||
                                         strcmp(json_string_value(t), "fp4") == 0)))
            return "bnb_4bit_quant_type is not \"nf4\" or \"fp4\"";
        return NULL;
    }
    if (strcmp(method, "gptq") == 0)
        snprintf(buf, len, "quant_method \"%.64s\": checkpoints stored pre-quantised this way are not read yet "
                 "(docs/quantization.md)", method);
    else
        snprintf(buf, len, "unknown quant_method \"%.64s\"", method);
    return buf;
}

mt_status_t eng_model_check_trainable(const eng_model_config_t *c, const char *overrides_json, const char *dir,
                                      mt_error_t *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.json", dir);
    /* every family: the RoPE tables compute the default RoPE and YaRN
     * (engine/model/desc/rope_tables.h), over whole heads or a partial share */
    const bool yarn = strcmp(c->rope_type, "yarn") == 0;
    if (!eng_rope_type_computed(c))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: rope_scaling type \"%s\" (rope_scaling / rope_parameters): moetune trains %s with "
                            "the default RoPE or YaRN only",
                            path, c->rope_type, c->model_type);
    if (yarn && c->rope_original_max_position_embeddings <= 0)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: YaRN needs rope_scaling.original_max_position_embeddings", path);
    const bool mla = c->arch == ENG_ARCH_DEEPSEEK_V2 || c->arch == ENG_ARCH_DEEPSEEK_V3;
    json_error_t je;
    json_t *root = c->config_json ? json_loads(c->config_json, 0, &je) : NULL;
    json_t *ov = overrides_json ? json_loads(overrides_json, 0, &je) : NULL;
    if (json_is_object(root) && json_is_object(ov)) json_object_update(root, ov); /* the loader's merge */
    json_decref(ov);
    /* FP8 releases (DeepSeek-V3, GLM-4.5-FP8) and gpt-oss's MXFP4: kept as
     * stored in a LoRA run (engine/model/model.c), read dequantised otherwise
     * (engine/model/io/checkpoint.c), saved unquantised (engine/run/save.c) */
    char qbuf[256];
    const char *quant = quant_unsupported(root ? json_object_get(root, "quantization_config") : NULL, qbuf,
                                          sizeof qbuf);
    json_t *mb = root ? json_object_get(root, "mlp_bias") : NULL;
    const bool mlp_bias = mb && json_is_true(mb);
    json_decref(root);
    if (quant)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'quantization_config': %s; moetune reads quant_method \"fp8\" (e4m3, "
                            "weight_block_size [128, 128]), \"mxfp4\" and \"bitsandbytes\" 4-bit checkpoints",
                            path, quant);
    if (!mla && c->arch != ENG_ARCH_GLM4_MOE) return MT_OK;
    /* transformers makes every layer from first_k_dense_replace on sparse;
     * DeepSeek's own code (and the description) also asks i % moe_layer_freq == 0 */
    if (c->moe_layer_freq != 1)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: moe_layer_freq = %d: transformers ignores it (every layer from first_k_dense_replace "
                            "on is sparse) while DeepSeek's code does not; moetune trains only moe_layer_freq 1",
                            path, c->moe_layer_freq);
    /* transformers' DeepseekV2TopkRouter never renormalises the top-k
     * weights; DeepSeek's own code does when norm_topk_prob is set */
    if (c->arch == ENG_ARCH_DEEPSEEK_V2 && c->norm_topk_prob)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: norm_topk_prob is true: transformers' DeepSeek-V2 ignores it and DeepSeek's code "
                            "renormalises; moetune trains DeepSeek-V2 only with norm_topk_prob false",
                            path);
    if (mlp_bias)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: key 'mlp_bias' is true; MLP biases are not described", path);
    if (c->arch == ENG_ARCH_GLM4_MOE) {
        const int rd = c->partial_rotary_factor > 0 && c->partial_rotary_factor < 1
                           ? (int)((double)c->head_dim * (double)c->partial_rotary_factor)
                           : c->head_dim;
        if (rd < 2 || rd % 2 != 0)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "%s: head_dim = %d with partial_rotary_factor = %g rotates %d dims per head; RoPE "
                                "needs an even number, at least 2",
                                path, c->head_dim, (double)c->partial_rotary_factor, rd);
    } else if (c->qk_rope_head_dim % 2 != 0)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: qk_rope_head_dim = %d must be even (RoPE rotates pairs)", path,
                            c->qk_rope_head_dim);
    if (c->num_experts > 0) return check_group_router(c, path, err);
    return MT_OK;
}
