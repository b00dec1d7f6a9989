/* config.json of DeepSeek-V2/V3, GLM-4.5 and gpt-oss (see model_config.h):
 * the families whose configs say more than the decoder's keys (MLA's ranks
 * and head widths, grouped routers, RoPE scaling and partial rotation,
 * attention sinks, fused experts), read in full here, apart from
 * model_config.c's decoder families, which refuse what they do not
 * implement.  What these families cannot train is refused by
 * engine/model/trainable.c; the reader and getters are read.h's. */
#include <stdio.h>
#include <string.h>

#include "engine/model/hf/model_config.h"
#include "engine/model/hf/read.h"

/* ---- DeepSeek-V2/V3, GLM-4.5, gpt-oss ----
 *
 * Defaults are those of transformers' DeepseekV2Config, DeepseekV3Config,
 * Glm4MoeConfig and GptOssConfig.  Their configs are read in full so that
 * `inspect` and `plan` describe them exactly, and RoPE scaling is recorded
 * rather than refused; training computes YaRN (engine/model/desc/rope_tables.h) and
 * refuses the other scaled variants (engine/model/trainable.c). */

static mt_status_t get_string(eng_cfg_reader_t *r, const char *key, const char *def, char *out, size_t cap) {
    json_t *v = json_object_get(r->obj, key);
    if (!v || json_is_null(v)) {
        snprintf(out, cap, "%s", def);
        return MT_OK;
    }
    if (!json_is_string(v)) return eng_cfg_type_error(r, key, "a string", v);
    if (strlen(json_string_value(v)) >= cap)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' = \"%s\" is longer than %zu characters", r->path,
                            key, json_string_value(v), cap - 1);
    snprintf(out, cap, "%s", json_string_value(v));
    return MT_OK;
}

static mt_status_t nonneg(eng_cfg_reader_t *r, const char *key, int v) {
    if (v >= 0) return MT_OK;
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must not be negative, found %d", r->path, key, v);
}

/* A number inside a RoPE dict (absent or null: left as it is). */
static mt_status_t rope_num(eng_cfg_reader_t *r, const char *dict_key, json_t *d, const char *name, float *out) {
    json_t *v = json_object_get(d, name);
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_number(v)) {
        char k[96];
        snprintf(k, sizeof k, "%s.%s", dict_key, name);
        return eng_cfg_type_error(r, k, "a number", v);
    }
    *out = (float)json_number_value(v);
    return MT_OK;
}

static const char *const k_rope_types[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};

/* One RoPE dict: its type and the parameters YaRN and partial rotation use. */
static mt_status_t read_rope_params(eng_cfg_reader_t *r, const char *key, json_t *d, eng_model_config_t *c, double *theta) {
    json_t *ty = json_object_get(d, "rope_type");
    if (!ty) ty = json_object_get(d, "type"); /* transformers 4's spelling */
    if (ty && !json_is_null(ty)) {
        if (!json_is_string(ty)) {
            char k[96];
            snprintf(k, sizeof k, "%s.rope_type", key);
            return eng_cfg_type_error(r, k, "a string", ty);
        }
        const char *s = json_string_value(ty);
        bool known = false;
        for (size_t i = 0; i < sizeof k_rope_types / sizeof k_rope_types[0]; i++) known |= strcmp(s, k_rope_types[i]) == 0;
        if (!known)
            return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                                "%s: key '%s.rope_type' = \"%s\" is not a RoPE type transformers knows (default, "
                                "linear, dynamic, yarn, longrope, llama3)",
                                r->path, key, s);
        snprintf(c->rope_type, sizeof c->rope_type, "%s", s);
    }
    float th = (float)*theta;
    RETURN_ON_ERROR(rope_num(r, key, d, "rope_theta", &th));
    *theta = th;
    RETURN_ON_ERROR(rope_num(r, key, d, "partial_rotary_factor", &c->partial_rotary_factor));
    RETURN_ON_ERROR(rope_num(r, key, d, "factor", &c->rope_factor));
    float omp = (float)c->rope_original_max_position_embeddings;
    RETURN_ON_ERROR(rope_num(r, key, d, "original_max_position_embeddings", &omp));
    c->rope_original_max_position_embeddings = (int)omp;
    RETURN_ON_ERROR(rope_num(r, key, d, "beta_fast", &c->rope_beta_fast));
    RETURN_ON_ERROR(rope_num(r, key, d, "beta_slow", &c->rope_beta_slow));
    RETURN_ON_ERROR(rope_num(r, key, d, "mscale", &c->rope_mscale));
    RETURN_ON_ERROR(rope_num(r, key, d, "mscale_all_dim", &c->rope_mscale_all_dim));
    RETURN_ON_ERROR(rope_num(r, key, d, "attention_factor", &c->rope_attention_factor));
    json_t *tr = json_object_get(d, "truncate");
    if (tr && !json_is_null(tr)) {
        if (!json_is_boolean(tr)) {
            char k[96];
            snprintf(k, sizeof k, "%s.truncate", key);
            return eng_cfg_type_error(r, k, "true or false", tr);
        }
        c->rope_truncate = json_is_true(tr);
    }
    return MT_OK;
}

/* RoPE of these families, as transformers 5 reads it: a set
 * rope_scaling takes the place of rope_parameters; a dict nested by layer
 * type is read from its full_attention entry.  `def_yarn` is gpt-oss's
 * default when the file has no rope_scaling key at all. */
static mt_status_t read_rope_scaled(eng_cfg_reader_t *r, eng_model_config_t *c, double def_theta, double def_partial,
                                    bool def_yarn) {
    double t;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "rope_theta", def_theta, &t));
    double pf;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "partial_rotary_factor", def_partial, &pf));
    c->partial_rotary_factor = (float)pf;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    c->rope_truncate = true; /* transformers' YaRN when the dict has no 'truncate' */
    const char *key = "rope_scaling";
    json_t *rp = json_object_get(r->obj, key);
    if (!rp && def_yarn && !json_object_get(r->obj, "rope_parameters")) {
        /* GptOssConfig's rope_scaling default */
        snprintf(c->rope_type, sizeof c->rope_type, "yarn");
        c->rope_factor = 32.0f;
        c->rope_beta_fast = 32.0f;
        c->rope_beta_slow = 1.0f;
        c->rope_original_max_position_embeddings = 4096;
        c->rope_truncate = false;
    }
    const bool scaling_set = rp && !json_is_null(rp) && !(json_is_object(rp) && json_object_size(rp) == 0);
    if (!scaling_set) {
        key = "rope_parameters";
        rp = json_object_get(r->obj, key);
    }
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return eng_cfg_type_error(r, key, "an object", rp);
        json_t *full = json_object_get(rp, "full_attention");
        char k[64];
        if (json_is_object(full)) {
            snprintf(k, sizeof k, "%s.full_attention", key);
            rp = full;
        } else {
            snprintf(k, sizeof k, "%s", key);
        }
        RETURN_ON_ERROR(read_rope_params(r, k, rp, c, &t));
    }
    if (!(t > 0)) return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'rope_theta' must be positive", r->path);
    if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'partial_rotary_factor' = %g must be in (0, 1]", r->path,
                            (double)c->partial_rotary_factor);
    c->rope_theta = (float)t;
    return MT_OK;
}

/* num_key_value_heads' default where the config class defaults it to num_attention_heads. */
static int heads_or(eng_cfg_reader_t *r, int def) {
    json_t *nh = json_object_get(r->obj, "num_attention_heads");
    return json_is_integer(nh) && json_integer_value(nh) > 0 && json_integer_value(nh) < 1 << 20
               ? (int)json_integer_value(nh)
               : def;
}

/* The routed experts of DeepSeek and GLM: n_routed_experts (alias
 * num_experts, transformers' attribute_map), top-k, shared experts, groups,
 * and which layers are sparse: i >= first_k_dense_replace and
 * i % moe_layer_freq == 0 (DeepSeek's own code; transformers checks only
 * the first, and every published config has moe_layer_freq 1). */
static mt_status_t read_deepseek_moe(eng_cfg_reader_t *r, eng_model_config_t *c, int def_e, int def_k, int def_shared,
                                     double def_scale, int def_group, int def_topk_group, int def_dense,
                                     bool def_norm) {
    const char *ek = json_object_get(r->obj, "n_routed_experts") || !json_object_get(r->obj, "num_experts")
                         ? "n_routed_experts"
                         : "num_experts";
    RETURN_ON_ERROR(eng_cfg_get_int(r, ek, false, true, def_e, &c->num_experts));
    RETURN_ON_ERROR(nonneg(r, ek, c->num_experts));
    json_t *k = json_object_get(r->obj, "num_experts_per_tok");
    if (c->num_experts > 0 && def_k == 0 && (!k || json_is_null(k)))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: missing required key 'num_experts_per_tok' (with %s = %d)",
                            r->path, ek, c->num_experts);
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_experts_per_tok", false, true, def_k, &c->num_experts_per_tok));
    if (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'num_experts_per_tok' = %d must be between 1 and %s (%d)",
                            r->path, c->num_experts_per_tok, ek, c->num_experts);
    RETURN_ON_ERROR(eng_cfg_get_int(r, "moe_intermediate_size", true, false, 0, &c->moe_intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "moe_intermediate_size", c->moe_intermediate_size));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "n_shared_experts", false, true, def_shared, &c->n_shared_experts));
    RETURN_ON_ERROR(nonneg(r, "n_shared_experts", c->n_shared_experts));
    c->shared_expert_intermediate_size = c->n_shared_experts * c->moe_intermediate_size;
    double d;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "routed_scaling_factor", def_scale, &d));
    c->routed_scaling_factor = (float)d;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "n_group", false, true, def_group, &c->n_group));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "topk_group", false, true, def_topk_group, &c->topk_group));
    RETURN_ON_ERROR(nonneg(r, "n_group", c->n_group));
    RETURN_ON_ERROR(nonneg(r, "topk_group", c->topk_group));
    if (c->n_group > 0 && c->num_experts % c->n_group != 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' (%d) must be a multiple of 'n_group' (%d)", r->path,
                            ek, c->num_experts, c->n_group);
    if (c->n_group > 0 && c->topk_group > c->n_group)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'topk_group' (%d) must not exceed 'n_group' (%d)",
                            r->path, c->topk_group, c->n_group);
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "norm_topk_prob", def_norm, &c->norm_topk_prob));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "first_k_dense_replace", false, false, def_dense, &c->first_k_dense_replace));
    RETURN_ON_ERROR(nonneg(r, "first_k_dense_replace", c->first_k_dense_replace));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "moe_layer_freq", false, false, 1, &c->moe_layer_freq));
    RETURN_ON_ERROR(eng_cfg_positive(r, "moe_layer_freq", c->moe_layer_freq));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_nextn_predict_layers", false, true, 0, &c->num_nextn_predict_layers));
    RETURN_ON_ERROR(nonneg(r, "num_nextn_predict_layers", c->num_nextn_predict_layers));
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = c->num_experts > 0 && l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
    /* aux_loss_alpha is DeepSeek's name for the balance loss weight */
    if (json_object_get(r->obj, "aux_loss_alpha")) {
        RETURN_ON_ERROR(eng_cfg_get_double(r, "aux_loss_alpha", 0.001, &d));
        c->router_aux_loss_coef = (float)d;
    }
    return MT_OK;
}

/* MLA (DeepSeek-V2/V3): the latent ranks and head splits. */
static mt_status_t read_mla(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->mla = true;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "q_lora_rank", false, true, 1536, &c->q_lora_rank));
    json_t *q = json_object_get(r->obj, "q_lora_rank");
    if (q && json_is_null(q)) c->q_lora_rank = 0; /* null: q_proj directly (DeepSeek-V2-Lite) */
    RETURN_ON_ERROR(nonneg(r, "q_lora_rank", c->q_lora_rank));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "kv_lora_rank", false, false, 512, &c->kv_lora_rank));
    RETURN_ON_ERROR(eng_cfg_positive(r, "kv_lora_rank", c->kv_lora_rank));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "qk_nope_head_dim", false, false, 128, &c->qk_nope_head_dim));
    RETURN_ON_ERROR(nonneg(r, "qk_nope_head_dim", c->qk_nope_head_dim));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "qk_rope_head_dim", false, false, 64, &c->qk_rope_head_dim));
    RETURN_ON_ERROR(eng_cfg_positive(r, "qk_rope_head_dim", c->qk_rope_head_dim));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "v_head_dim", false, false, 128, &c->v_head_dim));
    RETURN_ON_ERROR(eng_cfg_positive(r, "v_head_dim", c->v_head_dim));
    /* transformers: head_dim = qk_rope_head_dim (the rotary part); every
     * head has its own k and v, decompressed from the latent */
    c->head_dim = c->qk_rope_head_dim;
    c->num_key_value_heads = c->num_attention_heads;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "rope_interleave", true, &c->rope_interleave));
    bool bias = false;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "attention_bias", false, &bias));
    if (bias)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'attention_bias' is true; MLA projections with biases are not described "
                            "(only false)",
                            r->path);
    return MT_OK;
}

mt_status_t eng_cfg_parse_deepseek_v3(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_DEEPSEEK_V3;
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, heads_or(r, 128), 1e-6, 4096));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", false, false, 18432, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    RETURN_ON_ERROR(read_mla(r, c));
    RETURN_ON_ERROR(read_deepseek_moe(r, c, 256, 8, 1, 2.5, 8, 4, 3, true));
    /* DeepSeek-V3 routes by sigmoid scores with a bias-corrected,
     * group-limited top-k (transformers implements nothing else); a file
     * naming another method is not this model */
    char s[32];
    RETURN_ON_ERROR(get_string(r, "scoring_func", "sigmoid", s, sizeof s));
    if (strcmp(s, "sigmoid") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'scoring_func' = \"%s\": DeepSeek-V3 routing is \"sigmoid\"", r->path, s);
    RETURN_ON_ERROR(get_string(r, "topk_method", "noaux_tc", s, sizeof s));
    if (strcmp(s, "noaux_tc") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'topk_method' = \"%s\": DeepSeek-V3 routing is \"noaux_tc\"", r->path, s);
    c->routing = ENG_ROUTE_SIGMOID_GROUP_BIAS;
    c->router_score_bias = c->num_experts > 0;
    RETURN_ON_ERROR(read_rope_scaled(r, c, 10000.0, 1.0, false));
    return MT_OK;
}

mt_status_t eng_cfg_parse_deepseek_v2(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_DEEPSEEK_V2;
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, heads_or(r, 32), 1e-6, 2048));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", false, false, 11008, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    RETURN_ON_ERROR(read_mla(r, c));
    /* transformers' DeepSeek-V2 rotates adjacent pairs (complex products)
     * whatever the file says: moetune's interleaved RoPE, the same q.k */
    c->rope_interleave = true;
    /* num_experts_per_tok has no default (None): required when experts exist */
    RETURN_ON_ERROR(read_deepseek_moe(r, c, 64, 0, 2, 1.0, 0, 0, 0, false));
    char s[32];
    RETURN_ON_ERROR(get_string(r, "scoring_func", "softmax", s, sizeof s));
    if (strcmp(s, "softmax") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'scoring_func' = \"%s\": DeepSeek-V2 routing is \"softmax\"", r->path, s);
    RETURN_ON_ERROR(get_string(r, "topk_method", "greedy", s, sizeof s));
    if (strcmp(s, "greedy") == 0) {
        c->routing = ENG_ROUTE_SOFTMAX;
    } else if (strcmp(s, "group_limited_greedy") == 0) {
        if (c->n_group < 1 || c->topk_group < 1)
            return mt_error_set(r->err, MT_ERR_CONFIG,
                                "%s: key 'topk_method' = \"group_limited_greedy\" needs 'n_group' and 'topk_group'",
                                r->path);
        c->routing = ENG_ROUTE_SOFTMAX_GROUP;
    } else {
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'topk_method' = \"%s\" is not supported for DeepSeek-V2 (greedy, "
                            "group_limited_greedy)",
                            r->path, s);
    }
    RETURN_ON_ERROR(read_rope_scaled(r, c, 10000.0, 1.0, false));
    return MT_OK;
}

/* GLM-4.5 (Glm4MoeConfig): GQA attention with q/k/v biases when
 * attention_bias, optional per-head q/k norm, half of each head rotated,
 * DeepSeek-V3's router and shared experts, a dense first layer. */
mt_status_t eng_cfg_parse_glm4_moe(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_GLM4_MOE;
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, 8, 1e-5, 131072));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", false, false, 10944, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    RETURN_ON_ERROR(read_deepseek_moe(r, c, 128, 8, 1, 1.0, 1, 1, 1, true));
    c->moe_layer_freq = 1;
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = c->num_experts > 0 && l >= c->first_k_dense_replace;
    c->routing = ENG_ROUTE_SIGMOID_GROUP_BIAS;
    c->router_score_bias = c->num_experts > 0;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "attention_bias", false, &c->qkv_bias));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "use_qk_norm", false, &c->qk_norm));
    RETURN_ON_ERROR(read_rope_scaled(r, c, 10000.0, 0.5, false));
    return MT_OK;
}

/* gpt-oss (GptOssConfig): alternating sliding / full attention with a
 * learned sink per head, biases on every projection, a router with a bias
 * taking top-k then softmax, fused experts with biases and a clamped
 * SwiGLU. */
mt_status_t eng_cfg_parse_gpt_oss(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_GPT_OSS;
    json_t *hd = json_object_get(r->obj, "head_dim");
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, 8, 1e-5, 131072));
    if (!hd) c->head_dim = 64; /* GptOssConfig's default, not hidden_size / heads */
    double d;
    /* transformers 5's GptOssConfig default */
    RETURN_ON_ERROR(eng_cfg_get_double(r, "router_aux_loss_coef", 0.001, &d));
    c->router_aux_loss_coef = (float)d;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", false, false, 2880, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    RETURN_ON_ERROR(eng_cfg_read_experts(r, c, "num_local_experts", 128, 4));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_local_experts", c->num_experts));
    /* the original release's name for top-k, written beside transformers' */
    if (json_object_get(r->obj, "experts_per_token")) {
        int k;
        RETURN_ON_ERROR(eng_cfg_get_int(r, "experts_per_token", true, false, 0, &k));
        if (k != c->num_experts_per_tok)
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: 'experts_per_token' = %d and 'num_experts_per_tok' = %d "
                                "disagree", r->path, k, c->num_experts_per_tok);
    }
    c->norm_topk_prob = true; /* softmax over the k chosen logits */
    c->routing = ENG_ROUTE_TOPK_SOFTMAX;
    c->qkv_bias = true;       /* GptOssConfig sets attention_bias = True whatever the file says */
    c->attn_sinks = true;
    c->router_bias = true;
    c->experts_fused = true;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "swiglu_limit", 7.0, &d));
    c->swiglu_limit = (float)d;
    if (!(c->swiglu_limit > 0))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'swiglu_limit' = %g must be positive", r->path,
                            (double)c->swiglu_limit);
    RETURN_ON_ERROR(eng_cfg_get_double(r, "swiglu_alpha", 1.702, &d));
    c->swiglu_alpha = (float)d;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "sliding_window", false, true, 128, &c->sliding_window));
    RETURN_ON_ERROR(nonneg(r, "sliding_window", c->sliding_window));
    json_t *lt = json_object_get(r->obj, "layer_types");
    for (int l = 0; l < c->num_hidden_layers; l++) {
        bool full = (l + 1) % 2 == 0; /* default: sliding on even layers */
        if (lt && !json_is_null(lt)) {
            json_t *v = json_is_array(lt) && json_array_size(lt) == (size_t)c->num_hidden_layers
                            ? json_array_get(lt, (size_t)l)
                            : NULL;
            if (!json_is_string(v))
                return mt_error_set(r->err, MT_ERR_CONFIG,
                                    "%s: key 'layer_types' must list a string for each of the %d layers", r->path,
                                    c->num_hidden_layers);
            const char *ty = json_string_value(v);
            full = strcmp(ty, "full_attention") == 0;
            if (!full && strcmp(ty, "sliding_attention") != 0)
                return mt_error_set(r->err, MT_ERR_CONFIG,
                                    "%s: key 'layer_types' gives layer %d the type \"%s\"; expected "
                                    "\"full_attention\" or \"sliding_attention\"",
                                    r->path, l, ty);
        }
        c->layer_full_attention[l] = full;
        c->layer_is_moe[l] = true;
    }
    RETURN_ON_ERROR(read_rope_scaled(r, c, 150000.0, 1.0, true));
    return MT_OK;
}

