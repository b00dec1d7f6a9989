/* HF config.json -> eng_model_config_t (see model_config.h).
 *
 * Defaults are those of transformers' MixtralConfig, Qwen2MoeConfig,
 * Qwen3MoeConfig and OlmoeConfig (and DeepseekV2Config, DeepseekV3Config,
 * Glm4MoeConfig, GptOssConfig for the families described for inspect and
 * plan only, at the end of this file) for every key a file may omit, so a config.json means the
 * same model here as in transformers.  Exceptions, on purpose: the keys that
 * fix the model's size (vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads and the expert width) are required, because a file
 * without them is almost surely not the checkpoint's config, and silently
 * assuming Mixtral-8x7B's sizes would only fail later at a shape check.
 * Features moetune does not implement (RoPE scaling, router jitter,
 * attention dropout, activations other than SiLU, per-layer sliding
 * windows) are refused with MT_ERR_UNSUPPORTED naming the key, rather than
 * trained with different semantics; the described-only families record
 * them instead (see there). */
#include "engine/model_config.h"

#include "base/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_t *obj;
    const char *path;
    mt_error_t *err;
} reader_t;

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

static mt_status_t type_error(reader_t *r, const char *key, const char *want, const json_t *v) {
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must be %s, found %s", r->path, key,
                        want, json_type_name(v));
}

/* required: missing key is an error; nullable: JSON null counts as absent. */
static mt_status_t get_int(reader_t *r, const char *key, bool required, bool nullable, int def,
                           int *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v || (nullable && json_is_null(v))) {
        if (required)
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: missing required key '%s'", r->path, key);
        *out = def;
        return MT_OK;
    }
    if (!json_is_integer(v)) return type_error(r, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' = %lld is out of range", r->path,
                            key, (long long)x);
    *out = (int)x;
    return MT_OK;
}

static mt_status_t get_double(reader_t *r, const char *key, double def, double *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_number(v)) return type_error(r, key, "a number", v);
    *out = json_number_value(v);
    return MT_OK;
}

static mt_status_t get_bool(reader_t *r, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_boolean(v)) return type_error(r, key, "true or false", v);
    *out = json_is_true(v);
    return MT_OK;
}

static mt_status_t positive(reader_t *r, const char *key, int v) {
    if (v > 0) return MT_OK;
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must be positive, found %d", r->path,
                        key, v);
}

#define TRY(x)                          \
    do {                                \
        mt_status_t st_ = (x);          \
        if (st_ != MT_OK) return st_;   \
    } while (0)

/* One RoPE parameter dict (flat, or one layer type's of a nested one):
 * only the default (unscaled) rotary embedding over the whole head is
 * implemented.  `key` names the dict in messages. */
static mt_status_t read_rope_dict(reader_t *r, const char *key, json_t *d, double *theta) {
    char k[96];
    json_t *ty = json_object_get(d, "rope_type");
    if (!ty) ty = json_object_get(d, "type"); /* transformers 4's spelling inside rope_scaling */
    if (ty && !(json_is_string(ty) && strcmp(json_string_value(ty), "default") == 0))
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key '%s' is set to a scaled RoPE variant (rope_type %s); only the default "
                            "rotary embedding is supported",
                            r->path, key, json_is_string(ty) ? json_string_value(ty) : "?");
    json_t *th = json_object_get(d, "rope_theta");
    if (th && !json_is_null(th)) {
        snprintf(k, sizeof k, "%s.rope_theta", key);
        if (!json_is_number(th)) return type_error(r, k, "a number", th);
        *theta = json_number_value(th);
    }
    json_t *pf = json_object_get(d, "partial_rotary_factor");
    if (pf && !json_is_null(pf) && !(json_is_number(pf) && json_number_value(pf) == 1.0))
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key '%s.partial_rotary_factor' is set; rotating part of each head is not "
                            "supported (only 1.0)",
                            r->path, key);
    return MT_OK;
}

/* RoPE, as transformers 5 reads it (convert_rope_params_to_dict): a
 * non-empty rope_scaling (transformers 4) takes the place of
 * rope_parameters; the dict's rope_theta wins over a top-level rope_theta,
 * which wins over the family's default.  rope_parameters may be nested by
 * layer type ({"full_attention": {...}, "sliding_attention": {...}}, for a
 * config that declares layer_types); moetune has one RoPE for all layers,
 * so every layer type's must agree. */
static mt_status_t read_rope(reader_t *r, double def_theta, float *theta) {
    double t;
    TRY(get_double(r, "rope_theta", def_theta, &t));
    json_t *pf = json_object_get(r->obj, "partial_rotary_factor");
    if (pf && !json_is_null(pf) && !(json_is_number(pf) && json_number_value(pf) == 1.0))
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'partial_rotary_factor' is set; rotating part of each head is not supported "
                            "(only 1.0)",
                            r->path);
    const char *key = "rope_scaling";
    json_t *rp = json_object_get(r->obj, key);
    const bool scaling_set = rp && !json_is_null(rp) && !json_is_false(rp) &&
                             !(json_is_object(rp) && json_object_size(rp) == 0);
    if (!scaling_set) {
        key = "rope_parameters";
        rp = json_object_get(r->obj, key);
    }
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return type_error(r, key, "an object", rp);
        static const char *const k_layer_types[] = {"full_attention", "sliding_attention"};
        bool nested = false;
        double first = 0;
        for (size_t i = 0; i < sizeof k_layer_types / sizeof k_layer_types[0]; i++) {
            json_t *d = json_object_get(rp, k_layer_types[i]);
            if (!json_is_object(d)) continue;
            char k[64];
            snprintf(k, sizeof k, "%s.%s", key, k_layer_types[i]);
            double ti = t;
            TRY(read_rope_dict(r, k, d, &ti));
            if (nested && ti != first)
                return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                                    "%s: key '%s' gives layer types different rope_theta (%g and %g); one RoPE "
                                    "for all layers is supported",
                                    r->path, key, first, ti);
            nested = true;
            first = ti;
        }
        if (nested) t = first;
        else TRY(read_rope_dict(r, key, rp, &t));
    }
    if (!(t > 0))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'rope_theta' must be positive", r->path);
    *theta = (float)t;
    return MT_OK;
}

static mt_status_t read_common(reader_t *r, eng_model_config_t *c, int def_nkv, double def_eps,
                               int def_max_pos) {
    TRY(get_int(r, "vocab_size", true, false, 0, &c->vocab_size));
    TRY(positive(r, "vocab_size", c->vocab_size));
    TRY(get_int(r, "hidden_size", true, false, 0, &c->hidden_size));
    TRY(positive(r, "hidden_size", c->hidden_size));
    TRY(get_int(r, "num_hidden_layers", true, false, 0, &c->num_hidden_layers));
    TRY(positive(r, "num_hidden_layers", c->num_hidden_layers));
    if (c->num_hidden_layers > ENG_MAX_LAYERS)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'num_hidden_layers' = %d exceeds moetune's limit of %d", r->path,
                            c->num_hidden_layers, ENG_MAX_LAYERS);
    TRY(get_int(r, "num_attention_heads", true, false, 0, &c->num_attention_heads));
    TRY(positive(r, "num_attention_heads", c->num_attention_heads));
    /* null means "same as num_attention_heads" (MHA) in every config class. */
    json_t *kv = json_object_get(r->obj, "num_key_value_heads");
    TRY(get_int(r, "num_key_value_heads", false, true,
                kv && json_is_null(kv) ? c->num_attention_heads : def_nkv, &c->num_key_value_heads));
    TRY(positive(r, "num_key_value_heads", c->num_key_value_heads));
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'num_attention_heads' (%d) must be a multiple of "
                            "'num_key_value_heads' (%d)",
                            r->path, c->num_attention_heads, c->num_key_value_heads);
    /* getattr(config, "head_dim", None) or hidden_size // num_attention_heads */
    TRY(get_int(r, "head_dim", false, true, 0, &c->head_dim));
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads;
    TRY(positive(r, "head_dim", c->head_dim));

    json_t *act = json_object_get(r->obj, "hidden_act");
    if (act && !json_is_string(act)) return type_error(r, "hidden_act", "a string", act);
    if (act && strcmp(json_string_value(act), "silu") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'hidden_act' = \"%s\" is not supported (only \"silu\")", r->path,
                            json_string_value(act));
    double d;
    TRY(get_double(r, "rms_norm_eps", def_eps, &d));
    /* x / sqrt(mean(x^2) + eps): eps <= 0 divides by zero (or takes the root
     * of a negative number) on a zero row, and a NaN there routes nowhere. */
    if (!(d > 0 && d < 1))
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'rms_norm_eps' = %g must be positive and below 1", r->path, d);
    c->rms_norm_eps = (float)d;
    TRY(get_int(r, "max_position_embeddings", false, false, def_max_pos, &c->max_position_embeddings));
    TRY(get_bool(r, "tie_word_embeddings", false, &c->tie_word_embeddings));
    TRY(get_bool(r, "output_router_logits", false, &c->output_router_logits));
    TRY(get_double(r, "router_aux_loss_coef", 0.001, &d));
    c->router_aux_loss_coef = (float)d;
    TRY(get_double(r, "router_jitter_noise", 0.0, &d));
    if (d > 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'router_jitter_noise' = %g is not supported (only 0)", r->path, d);
    TRY(get_double(r, "attention_dropout", 0.0, &d));
    if (d > 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'attention_dropout' = %g is not supported (only 0)", r->path, d);
    return MT_OK;
}

/* The routed-expert count.  transformers accepts both spellings for every
 * MoE family (transformers 5 writes Qwen3-MoE's as num_local_experts, older
 * versions num_experts), so either is read, and both present must agree;
 * with neither, the family's transformers default applies, as it does
 * there. */
static mt_status_t read_experts(reader_t *r, eng_model_config_t *c, const char *key_e, int def_e,
                                int def_k) {
    const char *alias = strcmp(key_e, "num_experts") == 0 ? "num_local_experts" : "num_experts";
    const bool has_key = json_object_get(r->obj, key_e) != NULL, has_alias = json_object_get(r->obj, alias) != NULL;
    if (has_alias && !has_key) key_e = alias;
    TRY(get_int(r, key_e, false, false, def_e, &c->num_experts));
    if (has_key && has_alias) {
        int other;
        TRY(get_int(r, alias, true, false, 0, &other));
        if (other != c->num_experts)
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: '%s' = %d and '%s' = %d disagree", r->path, key_e,
                                c->num_experts, alias, other);
    }
    TRY(get_int(r, "num_experts_per_tok", false, false, def_k, &c->num_experts_per_tok));
    if (c->num_experts < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must not be negative", r->path, key_e);
    if (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'num_experts_per_tok' = %d must be between 1 and %s (%d)",
                            r->path, c->num_experts_per_tok, key_e, c->num_experts);
    return MT_OK;
}

static mt_status_t parse_mixtral(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_MIXTRAL;
    TRY(read_common(r, c, 8, 1e-5, 4096 * 32));
    TRY(get_int(r, "intermediate_size", true, false, 0, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    TRY(read_experts(r, c, "num_local_experts", 8, 2));
    TRY(positive(r, "num_local_experts", c->num_experts));
    c->norm_topk_prob = true; /* Mixtral always renormalises the top-k weights */
    c->qkv_bias = false;
    c->qk_norm = false;
    TRY(read_rope(r, 1e6, &c->rope_theta));
    TRY(get_int(r, "sliding_window", false, true, 0, &c->sliding_window));
    if (c->sliding_window < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'sliding_window' must not be negative",
                            r->path);
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_is_moe[l] = true;
    return MT_OK;
}

/* Qwen sparse layers: i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0. */
static mt_status_t read_qwen_layers(reader_t *r, eng_model_config_t *c) {
    int step;
    TRY(get_int(r, "decoder_sparse_step", false, false, 1, &step));
    TRY(positive(r, "decoder_sparse_step", step));
    bool mlp_only[ENG_MAX_LAYERS] = {false};
    json_t *mo = json_object_get(r->obj, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo)) return type_error(r, "mlp_only_layers", "a list of integers", mo);
        for (size_t i = 0; i < json_array_size(mo); i++) {
            json_t *v = json_array_get(mo, i);
            if (!json_is_integer(v)) return type_error(r, "mlp_only_layers", "a list of integers", v);
            json_int_t l = json_integer_value(v);
            if (l >= 0 && l < c->num_hidden_layers) mlp_only[l] = true; /* others match no layer */
        }
    }
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = !mlp_only[l] && c->num_experts > 0 && (l + 1) % step == 0;
    return MT_OK;
}

static mt_status_t read_qwen_common(reader_t *r, eng_model_config_t *c, int def_nkv, int def_inter,
                                    int def_e, int def_k) {
    TRY(read_common(r, c, def_nkv, 1e-6, 32768));
    TRY(get_int(r, "intermediate_size", false, false, def_inter, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    /* The expert width sizes the model: required (transformers' default is
     * 1408 for Qwen2-MoE, 768 for Qwen3-MoE), see the note on top. */
    TRY(get_int(r, "moe_intermediate_size", true, false, 0, &c->moe_intermediate_size));
    TRY(positive(r, "moe_intermediate_size", c->moe_intermediate_size));
    TRY(read_experts(r, c, "num_experts", def_e, def_k));
    TRY(get_bool(r, "norm_topk_prob", false, &c->norm_topk_prob));
    TRY(read_rope(r, 10000.0, &c->rope_theta));
    TRY(read_qwen_layers(r, c));
    return MT_OK;
}

/* Qwen2-MoE attention layer types (Qwen2MoeConfig.__post_init__): layer i
 * slides when use_sliding_window, i is even and i < max_window_layers,
 * unless the file lists layer_types itself.  One window for all layers is
 * all eng_model_config_t can express. */
static mt_status_t qwen2_sliding(reader_t *r, eng_model_config_t *c) {
    bool use = false;
    TRY(get_bool(r, "use_sliding_window", false, &use));
    int window, max_window_layers;
    TRY(get_int(r, "sliding_window", false, true, 0, &window));
    TRY(get_int(r, "max_window_layers", false, false, 28, &max_window_layers));
    json_t *lt = json_object_get(r->obj, "layer_types");
    int nslide = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) {
        bool slide;
        if (lt && !json_is_null(lt)) {
            json_t *v = json_is_array(lt) ? json_array_get(lt, (size_t)l) : NULL;
            if (!json_is_string(v))
                return mt_error_set(r->err, MT_ERR_CONFIG,
                                    "%s: key 'layer_types' must list a string for each of the %d "
                                    "layers",
                                    r->path, c->num_hidden_layers);
            /* transformers 5 also reads the older name "attention" as full attention */
            const char *ty = json_string_value(v);
            slide = strcmp(ty, "sliding_attention") == 0;
            if (!slide && strcmp(ty, "full_attention") != 0 && strcmp(ty, "attention") != 0)
                return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                                    "%s: key 'layer_types' gives layer %d the type \"%s\"; only "
                                    "\"full_attention\" and \"sliding_attention\" are supported",
                                    r->path, l, ty);
        } else {
            slide = use && (l + 1) % 2 != 0 && l < max_window_layers;
        }
        nslide += slide;
    }
    if (nslide == 0 || window == 0) {
        c->sliding_window = 0;
    } else if (nslide == c->num_hidden_layers) {
        c->sliding_window = window;
    } else {
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'use_sliding_window' is true and gives sliding-window "
                            "attention to %d of %d layers; per-layer windows are not supported",
                            r->path, nslide, c->num_hidden_layers);
    }
    return MT_OK;
}

static mt_status_t parse_qwen2_moe(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_QWEN2_MOE;
    TRY(read_qwen_common(r, c, 16, 5632, 60, 4));
    TRY(get_int(r, "shared_expert_intermediate_size", false, false, 5632,
                &c->shared_expert_intermediate_size));
    if (c->shared_expert_intermediate_size < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'shared_expert_intermediate_size' must not be negative", r->path);
    /* Qwen2MoeAttention's q/k/v_proj have bias=True; newer transformers
     * spell it out as the key qkv_bias (default true). */
    TRY(get_bool(r, "qkv_bias", true, &c->qkv_bias));
    c->qk_norm = false;
    return qwen2_sliding(r, c);
}

static mt_status_t parse_qwen3_moe(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_QWEN3_MOE;
    TRY(read_qwen_common(r, c, 4, 6144, 128, 8));
    c->shared_expert_intermediate_size = 0;
    TRY(get_bool(r, "attention_bias", false, &c->qkv_bias));
    c->qk_norm = true;
    /* Qwen3MoeConfig: sliding_window if use_sliding_window else None; the
     * attention then uses config.sliding_window in every layer. */
    bool use = false;
    TRY(get_bool(r, "use_sliding_window", false, &use));
    int window;
    TRY(get_int(r, "sliding_window", false, true, 0, &window));
    c->sliding_window = use ? window : 0;
    if (c->sliding_window < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'sliding_window' must not be negative",
                            r->path);
    return MT_OK;
}

/* OLMoE (OlmoeConfig): every layer sparse, the expert width is
 * intermediate_size, q/k RMSNorm over the whole projection, o_proj has a
 * bias when attention_bias is set (as q/k/v). */
static mt_status_t parse_olmoe(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_OLMOE;
    /* num_key_value_heads defaults to num_attention_heads (None in OlmoeConfig) */
    json_t *nh = json_object_get(r->obj, "num_attention_heads");
    const int def_nkv = json_is_integer(nh) && json_integer_value(nh) > 0 && json_integer_value(nh) < 1 << 20
                            ? (int)json_integer_value(nh)
                            : 16;
    TRY(read_common(r, c, def_nkv, 1e-5, 4096));
    double d;
    TRY(get_double(r, "router_aux_loss_coef", 0.01, &d)); /* OlmoeConfig's default, not 0.001 */
    c->router_aux_loss_coef = (float)d;
    TRY(get_int(r, "intermediate_size", true, false, 0, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    TRY(read_experts(r, c, "num_experts", 64, 8));
    TRY(positive(r, "num_experts", c->num_experts));
    TRY(get_bool(r, "norm_topk_prob", false, &c->norm_topk_prob));
    TRY(get_bool(r, "attention_bias", false, &c->qkv_bias));
    c->qk_norm = true;
    c->qk_norm_whole = true;
    json_t *clip = json_object_get(r->obj, "clip_qkv");
    if (clip && !json_is_null(clip)) { /* null: no clamp */
        if (!json_is_number(clip)) return type_error(r, "clip_qkv", "a number or null", clip);
        const double cq = json_number_value(clip);
        if (!(cq > 0 && cq < 3.4e38))
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'clip_qkv' = %g must be positive (or null)",
                                r->path, cq);
        c->clip_qkv = (float)cq;
    }
    TRY(read_rope(r, 10000.0, &c->rope_theta));
    c->sliding_window = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_is_moe[l] = true;
    return MT_OK;
}

/* ---- families described for inspect and plan (DeepSeek-V2/V3, GLM-4.5, gpt-oss) ----
 *
 * Defaults are those of transformers' DeepseekV2Config, DeepseekV3Config,
 * Glm4MoeConfig and GptOssConfig.  These families have no block code yet;
 * their configs are read in full so that `inspect` and `plan` describe
 * them exactly, and RoPE scaling (YaRN) is recorded rather than refused,
 * since nothing computes with it yet. */

static mt_status_t get_string(reader_t *r, const char *key, const char *def, char *out, size_t cap) {
    json_t *v = json_object_get(r->obj, key);
    if (!v || json_is_null(v)) {
        snprintf(out, cap, "%s", def);
        return MT_OK;
    }
    if (!json_is_string(v)) return type_error(r, key, "a string", v);
    if (strlen(json_string_value(v)) >= cap)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' = \"%s\" is longer than %zu characters", r->path,
                            key, json_string_value(v), cap - 1);
    snprintf(out, cap, "%s", json_string_value(v));
    return MT_OK;
}

static mt_status_t nonneg(reader_t *r, const char *key, int v) {
    if (v >= 0) return MT_OK;
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must not be negative, found %d", r->path, key, v);
}

/* A number inside a RoPE dict (absent or null: left as it is). */
static mt_status_t rope_num(reader_t *r, const char *dict_key, json_t *d, const char *name, float *out) {
    json_t *v = json_object_get(d, name);
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_number(v)) {
        char k[96];
        snprintf(k, sizeof k, "%s.%s", dict_key, name);
        return type_error(r, k, "a number", v);
    }
    *out = (float)json_number_value(v);
    return MT_OK;
}

static const char *const k_rope_types[] = {"default", "linear", "dynamic", "yarn", "longrope", "llama3"};

/* One RoPE dict: its type and the parameters YaRN and partial rotation use. */
static mt_status_t read_rope_params(reader_t *r, const char *key, json_t *d, eng_model_config_t *c, double *theta) {
    json_t *ty = json_object_get(d, "rope_type");
    if (!ty) ty = json_object_get(d, "type"); /* transformers 4's spelling */
    if (ty && !json_is_null(ty)) {
        if (!json_is_string(ty)) {
            char k[96];
            snprintf(k, sizeof k, "%s.rope_type", key);
            return type_error(r, k, "a string", ty);
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
    TRY(rope_num(r, key, d, "rope_theta", &th));
    *theta = th;
    TRY(rope_num(r, key, d, "partial_rotary_factor", &c->partial_rotary_factor));
    TRY(rope_num(r, key, d, "factor", &c->rope_factor));
    float omp = (float)c->rope_original_max_position_embeddings;
    TRY(rope_num(r, key, d, "original_max_position_embeddings", &omp));
    c->rope_original_max_position_embeddings = (int)omp;
    TRY(rope_num(r, key, d, "beta_fast", &c->rope_beta_fast));
    TRY(rope_num(r, key, d, "beta_slow", &c->rope_beta_slow));
    TRY(rope_num(r, key, d, "mscale", &c->rope_mscale));
    TRY(rope_num(r, key, d, "mscale_all_dim", &c->rope_mscale_all_dim));
    return MT_OK;
}

/* RoPE of the described-only families, as transformers 5 reads it: a set
 * rope_scaling takes the place of rope_parameters; a dict nested by layer
 * type is read from its full_attention entry.  `def_yarn` is gpt-oss's
 * default when the file has no rope_scaling key at all. */
static mt_status_t read_rope_scaled(reader_t *r, eng_model_config_t *c, double def_theta, double def_partial,
                                    bool def_yarn) {
    double t;
    TRY(get_double(r, "rope_theta", def_theta, &t));
    double pf;
    TRY(get_double(r, "partial_rotary_factor", def_partial, &pf));
    c->partial_rotary_factor = (float)pf;
    snprintf(c->rope_type, sizeof c->rope_type, "default");
    const char *key = "rope_scaling";
    json_t *rp = json_object_get(r->obj, key);
    if (!rp && def_yarn && !json_object_get(r->obj, "rope_parameters")) {
        /* GptOssConfig's rope_scaling default */
        snprintf(c->rope_type, sizeof c->rope_type, "yarn");
        c->rope_factor = 32.0f;
        c->rope_beta_fast = 32.0f;
        c->rope_beta_slow = 1.0f;
        c->rope_original_max_position_embeddings = 4096;
    }
    const bool scaling_set = rp && !json_is_null(rp) && !(json_is_object(rp) && json_object_size(rp) == 0);
    if (!scaling_set) {
        key = "rope_parameters";
        rp = json_object_get(r->obj, key);
    }
    if (rp && !json_is_null(rp)) {
        if (!json_is_object(rp)) return type_error(r, key, "an object", rp);
        json_t *full = json_object_get(rp, "full_attention");
        char k[64];
        if (json_is_object(full)) {
            snprintf(k, sizeof k, "%s.full_attention", key);
            rp = full;
        } else {
            snprintf(k, sizeof k, "%s", key);
        }
        TRY(read_rope_params(r, k, rp, c, &t));
    }
    if (!(t > 0)) return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'rope_theta' must be positive", r->path);
    if (!(c->partial_rotary_factor > 0 && c->partial_rotary_factor <= 1))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'partial_rotary_factor' = %g must be in (0, 1]", r->path,
                            (double)c->partial_rotary_factor);
    c->rope_theta = (float)t;
    return MT_OK;
}

/* num_key_value_heads' default where the config class defaults it to num_attention_heads. */
static int heads_or(reader_t *r, int def) {
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
static mt_status_t read_deepseek_moe(reader_t *r, eng_model_config_t *c, int def_e, int def_k, int def_shared,
                                     double def_scale, int def_group, int def_topk_group, int def_dense,
                                     bool def_norm) {
    const char *ek = json_object_get(r->obj, "n_routed_experts") || !json_object_get(r->obj, "num_experts")
                         ? "n_routed_experts"
                         : "num_experts";
    TRY(get_int(r, ek, false, true, def_e, &c->num_experts));
    TRY(nonneg(r, ek, c->num_experts));
    json_t *k = json_object_get(r->obj, "num_experts_per_tok");
    if (c->num_experts > 0 && def_k == 0 && (!k || json_is_null(k)))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: missing required key 'num_experts_per_tok' (with %s = %d)",
                            r->path, ek, c->num_experts);
    TRY(get_int(r, "num_experts_per_tok", false, true, def_k, &c->num_experts_per_tok));
    if (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'num_experts_per_tok' = %d must be between 1 and %s (%d)",
                            r->path, c->num_experts_per_tok, ek, c->num_experts);
    TRY(get_int(r, "moe_intermediate_size", true, false, 0, &c->moe_intermediate_size));
    TRY(positive(r, "moe_intermediate_size", c->moe_intermediate_size));
    TRY(get_int(r, "n_shared_experts", false, true, def_shared, &c->n_shared_experts));
    TRY(nonneg(r, "n_shared_experts", c->n_shared_experts));
    c->shared_expert_intermediate_size = c->n_shared_experts * c->moe_intermediate_size;
    double d;
    TRY(get_double(r, "routed_scaling_factor", def_scale, &d));
    c->routed_scaling_factor = (float)d;
    TRY(get_int(r, "n_group", false, true, def_group, &c->n_group));
    TRY(get_int(r, "topk_group", false, true, def_topk_group, &c->topk_group));
    TRY(nonneg(r, "n_group", c->n_group));
    TRY(nonneg(r, "topk_group", c->topk_group));
    if (c->n_group > 0 && c->num_experts % c->n_group != 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' (%d) must be a multiple of 'n_group' (%d)", r->path,
                            ek, c->num_experts, c->n_group);
    if (c->n_group > 0 && c->topk_group > c->n_group)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'topk_group' (%d) must not exceed 'n_group' (%d)",
                            r->path, c->topk_group, c->n_group);
    TRY(get_bool(r, "norm_topk_prob", def_norm, &c->norm_topk_prob));
    TRY(get_int(r, "first_k_dense_replace", false, false, def_dense, &c->first_k_dense_replace));
    TRY(nonneg(r, "first_k_dense_replace", c->first_k_dense_replace));
    TRY(get_int(r, "moe_layer_freq", false, false, 1, &c->moe_layer_freq));
    TRY(positive(r, "moe_layer_freq", c->moe_layer_freq));
    TRY(get_int(r, "num_nextn_predict_layers", false, true, 0, &c->num_nextn_predict_layers));
    TRY(nonneg(r, "num_nextn_predict_layers", c->num_nextn_predict_layers));
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = c->num_experts > 0 && l >= c->first_k_dense_replace && l % c->moe_layer_freq == 0;
    /* aux_loss_alpha is DeepSeek's name for the balance loss weight */
    if (json_object_get(r->obj, "aux_loss_alpha")) {
        TRY(get_double(r, "aux_loss_alpha", 0.001, &d));
        c->router_aux_loss_coef = (float)d;
    }
    return MT_OK;
}

/* MLA (DeepSeek-V2/V3): the latent ranks and head splits. */
static mt_status_t read_mla(reader_t *r, eng_model_config_t *c) {
    c->mla = true;
    TRY(get_int(r, "q_lora_rank", false, true, 1536, &c->q_lora_rank));
    json_t *q = json_object_get(r->obj, "q_lora_rank");
    if (q && json_is_null(q)) c->q_lora_rank = 0; /* null: q_proj directly (DeepSeek-V2-Lite) */
    TRY(nonneg(r, "q_lora_rank", c->q_lora_rank));
    TRY(get_int(r, "kv_lora_rank", false, false, 512, &c->kv_lora_rank));
    TRY(positive(r, "kv_lora_rank", c->kv_lora_rank));
    TRY(get_int(r, "qk_nope_head_dim", false, false, 128, &c->qk_nope_head_dim));
    TRY(nonneg(r, "qk_nope_head_dim", c->qk_nope_head_dim));
    TRY(get_int(r, "qk_rope_head_dim", false, false, 64, &c->qk_rope_head_dim));
    TRY(positive(r, "qk_rope_head_dim", c->qk_rope_head_dim));
    TRY(get_int(r, "v_head_dim", false, false, 128, &c->v_head_dim));
    TRY(positive(r, "v_head_dim", c->v_head_dim));
    /* transformers: head_dim = qk_rope_head_dim (the rotary part); every
     * head has its own k and v, decompressed from the latent */
    c->head_dim = c->qk_rope_head_dim;
    c->num_key_value_heads = c->num_attention_heads;
    TRY(get_bool(r, "rope_interleave", true, &c->rope_interleave));
    bool bias = false;
    TRY(get_bool(r, "attention_bias", false, &bias));
    if (bias)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'attention_bias' is true; MLA projections with biases are not described "
                            "(only false)",
                            r->path);
    return MT_OK;
}

static mt_status_t parse_deepseek_v3(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_DEEPSEEK_V3;
    TRY(read_common(r, c, heads_or(r, 128), 1e-6, 4096));
    TRY(get_int(r, "intermediate_size", false, false, 18432, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    TRY(read_mla(r, c));
    TRY(read_deepseek_moe(r, c, 256, 8, 1, 2.5, 8, 4, 3, true));
    /* DeepSeek-V3 routes by sigmoid scores with a bias-corrected,
     * group-limited top-k (transformers implements nothing else); a file
     * naming another method is not this model */
    char s[32];
    TRY(get_string(r, "scoring_func", "sigmoid", s, sizeof s));
    if (strcmp(s, "sigmoid") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'scoring_func' = \"%s\": DeepSeek-V3 routing is \"sigmoid\"", r->path, s);
    TRY(get_string(r, "topk_method", "noaux_tc", s, sizeof s));
    if (strcmp(s, "noaux_tc") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'topk_method' = \"%s\": DeepSeek-V3 routing is \"noaux_tc\"", r->path, s);
    c->routing = ENG_ROUTE_SIGMOID_GROUP_BIAS;
    c->router_score_bias = c->num_experts > 0;
    TRY(read_rope_scaled(r, c, 10000.0, 1.0, false));
    return MT_OK;
}

static mt_status_t parse_deepseek_v2(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_DEEPSEEK_V2;
    TRY(read_common(r, c, heads_or(r, 32), 1e-6, 2048));
    TRY(get_int(r, "intermediate_size", false, false, 11008, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    TRY(read_mla(r, c));
    /* num_experts_per_tok has no default (None): required when experts exist */
    TRY(read_deepseek_moe(r, c, 64, 0, 2, 1.0, 0, 0, 0, false));
    char s[32];
    TRY(get_string(r, "scoring_func", "softmax", s, sizeof s));
    if (strcmp(s, "softmax") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'scoring_func' = \"%s\": DeepSeek-V2 routing is \"softmax\"", r->path, s);
    TRY(get_string(r, "topk_method", "greedy", s, sizeof s));
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
    TRY(read_rope_scaled(r, c, 10000.0, 1.0, false));
    return MT_OK;
}

/* GLM-4.5 (Glm4MoeConfig): GQA attention with q/k/v biases when
 * attention_bias, optional per-head q/k norm, half of each head rotated,
 * DeepSeek-V3's router and shared experts, a dense first layer. */
static mt_status_t parse_glm4_moe(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_GLM4_MOE;
    TRY(read_common(r, c, 8, 1e-5, 131072));
    TRY(get_int(r, "intermediate_size", false, false, 10944, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    TRY(read_deepseek_moe(r, c, 128, 8, 1, 1.0, 1, 1, 1, true));
    c->moe_layer_freq = 1;
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = c->num_experts > 0 && l >= c->first_k_dense_replace;
    c->routing = ENG_ROUTE_SIGMOID_GROUP_BIAS;
    c->router_score_bias = c->num_experts > 0;
    TRY(get_bool(r, "attention_bias", false, &c->qkv_bias));
    TRY(get_bool(r, "use_qk_norm", false, &c->qk_norm));
    TRY(read_rope_scaled(r, c, 10000.0, 0.5, false));
    return MT_OK;
}

/* gpt-oss (GptOssConfig): alternating sliding / full attention with a
 * learned sink per head, biases on every projection, a router with a bias
 * taking top-k then softmax, fused experts with biases and a clamped
 * SwiGLU. */
static mt_status_t parse_gpt_oss(reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_GPT_OSS;
    json_t *hd = json_object_get(r->obj, "head_dim");
    TRY(read_common(r, c, 8, 1e-5, 131072));
    if (!hd) c->head_dim = 64; /* GptOssConfig's default, not hidden_size / heads */
    double d;
    TRY(get_double(r, "router_aux_loss_coef", 0.9, &d));
    c->router_aux_loss_coef = (float)d;
    TRY(get_int(r, "intermediate_size", false, false, 2880, &c->intermediate_size));
    TRY(positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    TRY(read_experts(r, c, "num_local_experts", 128, 4));
    TRY(positive(r, "num_local_experts", c->num_experts));
    /* the original release's name for top-k, written beside transformers' */
    if (json_object_get(r->obj, "experts_per_token")) {
        int k;
        TRY(get_int(r, "experts_per_token", true, false, 0, &k));
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
    TRY(get_double(r, "swiglu_limit", 7.0, &d));
    c->swiglu_limit = (float)d;
    TRY(get_int(r, "sliding_window", false, true, 128, &c->sliding_window));
    TRY(nonneg(r, "sliding_window", c->sliding_window));
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
    TRY(read_rope_scaled(r, c, 150000.0, 1.0, true));
    return MT_OK;
}

mt_status_t eng_model_config_parse(const char *json_text, const char *path,
                                   const char *overrides_json, eng_model_config_t *out,
                                   mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (!path) path = "config.json";
    json_error_t jerr;
    json_t *root = json_loads(json_text, 0, &jerr);
    if (!root)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: not valid JSON: %s (line %d, column %d)", path,
                            jerr.text, jerr.line, jerr.column);
    mt_status_t st = MT_OK;
    if (!json_is_object(root)) {
        st = mt_error_set(err, MT_ERR_CONFIG, "%s: top level must be a JSON object", path);
        goto out;
    }
    if (overrides_json) {
        json_t *ov = json_loads(overrides_json, 0, &jerr);
        if (!ov || !json_is_object(ov)) {
            st = mt_error_set(err, MT_ERR_CONFIG, "model config overrides for %s: %s", path,
                              ov ? "must be a JSON object" : jerr.text);
            json_decref(ov);
            goto out;
        }
        json_object_update(root, ov);
        json_decref(ov);
    }
    reader_t r = {root, path, err};
    json_t *mt = json_object_get(root, "model_type");
    if (!mt) {
        st = mt_error_set(err, MT_ERR_CONFIG, "%s: missing required key 'model_type'", path);
        goto out;
    }
    if (!json_is_string(mt)) {
        st = type_error(&r, "model_type", "a string", mt);
        goto out;
    }
    const char *type = json_string_value(mt);
    snprintf(out->model_type, sizeof out->model_type, "%s", type);
    if (strcmp(type, "mixtral") == 0) st = parse_mixtral(&r, out);
    else if (strcmp(type, "qwen2_moe") == 0) st = parse_qwen2_moe(&r, out);
    else if (strcmp(type, "qwen3_moe") == 0) st = parse_qwen3_moe(&r, out);
    else if (strcmp(type, "olmoe") == 0) st = parse_olmoe(&r, out);
    else if (strcmp(type, "deepseek_v3") == 0) st = parse_deepseek_v3(&r, out);
    else if (strcmp(type, "deepseek_v2") == 0) st = parse_deepseek_v2(&r, out);
    else if (strcmp(type, "glm4_moe") == 0) st = parse_glm4_moe(&r, out);
    else if (strcmp(type, "gpt_oss") == 0) st = parse_gpt_oss(&r, out);
    else
        st = mt_error_set(err, MT_ERR_UNSUPPORTED,
                          "%s: model_type '%s' is not supported (supported: mixtral, qwen2_moe, "
                          "qwen3_moe, olmoe; inspect and plan only: deepseek_v2, deepseek_v3, glm4_moe, gpt_oss)",
                          path, type);
    if (st == MT_OK) {
        /* the trained families' RoPE: the default one, over the whole head */
        if (!out->rope_type[0]) snprintf(out->rope_type, sizeof out->rope_type, "default");
        if (out->partial_rotary_factor == 0) out->partial_rotary_factor = 1.0f;
        if (out->routed_scaling_factor == 0) out->routed_scaling_factor = 1.0f;
        out->config_json = strdup(json_text);
        MT_CHECK_ALLOC(out->config_json, "config.json text");
    }
out:
    json_decref(root);
    if (st != MT_OK) eng_model_config_free(out);
    return st;
}

mt_status_t eng_model_config_load(const char *dir, const char *overrides_json,
                                  eng_model_config_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    size_t n = strlen(dir) + sizeof "/config.json";
    char *path = malloc(n);
    MT_CHECK_ALLOC(path, "path");
    snprintf(path, n, "%s/config.json", dir);
    FILE *fp;
    mt_status_t ost = mt_fopen_regular(path, "model config", &fp, err);
    if (ost != MT_OK) {
        free(path);
        return ost;
    }
    size_t cap = 1 << 14, len = 0;
    char *text = malloc(cap);
    MT_CHECK_ALLOC(text, "config.json text");
    size_t got;
    while ((got = fread(text + len, 1, cap - len - 1, fp)) > 0) {
        len += got;
        if (cap - len - 1 == 0) {
            cap *= 2;
            text = realloc(text, cap);
            MT_CHECK_ALLOC(text, "config.json text");
        }
    }
    bool bad = ferror(fp);
    fclose(fp);
    text[len] = '\0';
    mt_status_t st = bad ? mt_error_set(err, MT_ERR_IO, "%s: read failed", path)
                         : eng_model_config_parse(text, path, overrides_json, out, err);
    free(text);
    free(path);
    return st;
}

void eng_model_config_free(eng_model_config_t *cfg) {
    free(cfg->config_json);
    cfg->config_json = NULL;
}
