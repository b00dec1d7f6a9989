/* HF config.json -> eng_model_config_t (see model_config.h).
 *
 * Defaults are those of transformers' MixtralConfig, Qwen2MoeConfig,
 * Qwen3MoeConfig and OlmoeConfig (DeepseekV2Config's, DeepseekV3Config's,
 * Glm4MoeConfig's and GptOssConfig's are in model_config_families.c) for
 * every key a file may omit, so a config.json means the same model here as
 * in transformers.  Exceptions, on purpose: the keys that
 * fix the model's size (vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads and the expert width) are required, because a file
 * without them is almost surely not the checkpoint's config, and silently
 * assuming Mixtral-8x7B's sizes would only fail later at a shape check.
 * Features moetune does not implement (RoPE scaling, router jitter,
 * attention dropout, activations other than SiLU, per-layer sliding
 * windows) are refused with MT_ERR_UNSUPPORTED naming the key, rather than
 * trained with different semantics; model_config_families.c records RoPE
 * scaling for its families instead (see there). */
#include "engine/model/hf/model_config.h"

#include "engine/model/hf/read.h"

#include "base/fileio.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* One RoPE parameter dict (flat, or one layer type's of a nested one):
 * only the default (unscaled) rotary embedding over the whole head is
 * implemented.  `key` names the dict in messages. */
static mt_status_t read_rope_dict(eng_cfg_reader_t *r, const char *key, json_t *d, double *theta) {
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
        if (!json_is_number(th)) return eng_cfg_type_error(r, k, "a number", th);
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
static mt_status_t read_rope(eng_cfg_reader_t *r, double def_theta, float *theta) {
    double t;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "rope_theta", def_theta, &t));
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
        if (!json_is_object(rp)) return eng_cfg_type_error(r, key, "an object", rp);
        static const char *const k_layer_types[] = {"full_attention", "sliding_attention"};
        bool nested = false;
        double first = 0;
        for (size_t i = 0; i < sizeof k_layer_types / sizeof k_layer_types[0]; i++) {
            json_t *d = json_object_get(rp, k_layer_types[i]);
            if (!json_is_object(d)) continue;
            char k[64];
            snprintf(k, sizeof k, "%s.%s", key, k_layer_types[i]);
            double ti = t;
            RETURN_ON_ERROR(read_rope_dict(r, k, d, &ti));
            if (nested && ti != first)
                return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                                    "%s: key '%s' gives layer types different rope_theta (%g and %g); one RoPE "
                                    "for all layers is supported",
                                    r->path, key, first, ti);
            nested = true;
            first = ti;
        }
        if (nested) t = first;
        else RETURN_ON_ERROR(read_rope_dict(r, key, rp, &t));
    }
    if (!(t > 0))
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'rope_theta' must be positive", r->path);
    *theta = (float)t;
    return MT_OK;
}

static mt_status_t parse_mixtral(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_MIXTRAL;
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, 8, 1e-5, 4096 * 32));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", true, false, 0, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    RETURN_ON_ERROR(eng_cfg_read_experts(r, c, "num_local_experts", 8, 2));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_local_experts", c->num_experts));
    c->norm_topk_prob = true; /* Mixtral always renormalises the top-k weights */
    c->qkv_bias = false;
    c->qk_norm = false;
    RETURN_ON_ERROR(read_rope(r, 1e6, &c->rope_theta));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "sliding_window", false, true, 0, &c->sliding_window));
    if (c->sliding_window < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'sliding_window' must not be negative",
                            r->path);
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_is_moe[l] = true;
    return MT_OK;
}

/* Qwen sparse layers: i not in mlp_only_layers and (i+1) % decoder_sparse_step == 0. */
static mt_status_t read_qwen_layers(eng_cfg_reader_t *r, eng_model_config_t *c) {
    int step;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "decoder_sparse_step", false, false, 1, &step));
    RETURN_ON_ERROR(eng_cfg_positive(r, "decoder_sparse_step", step));
    bool mlp_only[ENG_MAX_LAYERS] = {false};
    json_t *mo = json_object_get(r->obj, "mlp_only_layers");
    if (mo && !json_is_null(mo)) {
        if (!json_is_array(mo)) return eng_cfg_type_error(r, "mlp_only_layers", "a list of integers", mo);
        for (size_t i = 0; i < json_array_size(mo); i++) {
            json_t *v = json_array_get(mo, i);
            if (!json_is_integer(v)) return eng_cfg_type_error(r, "mlp_only_layers", "a list of integers", v);
            json_int_t l = json_integer_value(v);
            if (l >= 0 && l < c->num_hidden_layers) mlp_only[l] = true; /* others match no layer */
        }
    }
    for (int l = 0; l < c->num_hidden_layers; l++)
        c->layer_is_moe[l] = !mlp_only[l] && c->num_experts > 0 && (l + 1) % step == 0;
    return MT_OK;
}

static mt_status_t read_qwen_common(eng_cfg_reader_t *r, eng_model_config_t *c, int def_nkv, int def_inter,
                                    int def_e, int def_k) {
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, def_nkv, 1e-6, 32768));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", false, false, def_inter, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    /* The expert width sizes the model: required (transformers' default is
     * 1408 for Qwen2-MoE, 768 for Qwen3-MoE), see the note on top. */
    RETURN_ON_ERROR(eng_cfg_get_int(r, "moe_intermediate_size", true, false, 0, &c->moe_intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "moe_intermediate_size", c->moe_intermediate_size));
    RETURN_ON_ERROR(eng_cfg_read_experts(r, c, "num_experts", def_e, def_k));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "norm_topk_prob", false, &c->norm_topk_prob));
    RETURN_ON_ERROR(read_rope(r, 10000.0, &c->rope_theta));
    RETURN_ON_ERROR(read_qwen_layers(r, c));
    return MT_OK;
}

/* Qwen2-MoE attention layer types (Qwen2MoeConfig.__post_init__): layer i
 * slides when use_sliding_window, i is even and i < max_window_layers,
 * unless the file lists layer_types itself.  One window for all layers is
 * all eng_model_config_t can express. */
static mt_status_t qwen2_sliding(eng_cfg_reader_t *r, eng_model_config_t *c) {
    bool use = false;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "use_sliding_window", false, &use));
    int window, max_window_layers;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "sliding_window", false, true, 0, &window));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "max_window_layers", false, false, 28, &max_window_layers));
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

static mt_status_t parse_qwen2_moe(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_QWEN2_MOE;
    RETURN_ON_ERROR(read_qwen_common(r, c, 16, 5632, 60, 4));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "shared_expert_intermediate_size", false, false, 5632,
                                    &c->shared_expert_intermediate_size));
    if (c->shared_expert_intermediate_size < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'shared_expert_intermediate_size' must not be negative", r->path);
    /* Qwen2MoeAttention's q/k/v_proj have bias=True; newer transformers
     * spell it out as the key qkv_bias (default true). */
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "qkv_bias", true, &c->qkv_bias));
    c->qk_norm = false;
    return qwen2_sliding(r, c);
}

static mt_status_t parse_qwen3_moe(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_QWEN3_MOE;
    RETURN_ON_ERROR(read_qwen_common(r, c, 4, 6144, 128, 8));
    c->shared_expert_intermediate_size = 0;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "attention_bias", false, &c->qkv_bias));
    c->qk_norm = true;
    /* Qwen3MoeConfig: sliding_window if use_sliding_window else None; the
     * attention then uses config.sliding_window in every layer. */
    bool use = false;
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "use_sliding_window", false, &use));
    int window;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "sliding_window", false, true, 0, &window));
    c->sliding_window = use ? window : 0;
    if (c->sliding_window < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'sliding_window' must not be negative",
                            r->path);
    return MT_OK;
}

/* OLMoE (OlmoeConfig): every layer sparse, the expert width is
 * intermediate_size, q/k RMSNorm over the whole projection, o_proj has a
 * bias when attention_bias is set (as q/k/v). */
static mt_status_t parse_olmoe(eng_cfg_reader_t *r, eng_model_config_t *c) {
    c->arch = ENG_ARCH_OLMOE;
    /* num_key_value_heads defaults to num_attention_heads (None in OlmoeConfig) */
    json_t *nh = json_object_get(r->obj, "num_attention_heads");
    const int def_nkv = json_is_integer(nh) && json_integer_value(nh) > 0 && json_integer_value(nh) < 1 << 20
                            ? (int)json_integer_value(nh)
                            : 16;
    RETURN_ON_ERROR(eng_cfg_read_common(r, c, def_nkv, 1e-5, 4096));
    double d;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "router_aux_loss_coef", 0.01, &d)); /* OlmoeConfig's default, not 0.001 */
    c->router_aux_loss_coef = (float)d;
    RETURN_ON_ERROR(eng_cfg_get_int(r, "intermediate_size", true, false, 0, &c->intermediate_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "intermediate_size", c->intermediate_size));
    c->moe_intermediate_size = c->intermediate_size;
    c->shared_expert_intermediate_size = 0;
    RETURN_ON_ERROR(eng_cfg_read_experts(r, c, "num_experts", 64, 8));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_experts", c->num_experts));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "norm_topk_prob", false, &c->norm_topk_prob));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "attention_bias", false, &c->qkv_bias));
    c->qk_norm = true;
    c->qk_norm_whole = true;
    json_t *clip = json_object_get(r->obj, "clip_qkv");
    if (clip && !json_is_null(clip)) { /* null: no clamp */
        if (!json_is_number(clip)) return eng_cfg_type_error(r, "clip_qkv", "a number or null", clip);
        const double cq = json_number_value(clip);
        if (!(cq > 0 && cq < 3.4e38))
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key 'clip_qkv' = %g must be positive (or null)",
                                r->path, cq);
        c->clip_qkv = (float)cq;
    }
    RETURN_ON_ERROR(read_rope(r, 10000.0, &c->rope_theta));
    c->sliding_window = 0;
    for (int l = 0; l < c->num_hidden_layers; l++) c->layer_is_moe[l] = true;
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
    eng_cfg_reader_t r = {root, path, err};
    json_t *mt = json_object_get(root, "model_type");
    if (!mt) {
        st = mt_error_set(err, MT_ERR_CONFIG, "%s: missing required key 'model_type'", path);
        goto out;
    }
    if (!json_is_string(mt)) {
        st = eng_cfg_type_error(&r, "model_type", "a string", mt);
        goto out;
    }
    const char *type = json_string_value(mt);
    snprintf(out->model_type, sizeof out->model_type, "%s", type);
    if (strcmp(type, "mixtral") == 0) st = parse_mixtral(&r, out);
    else if (strcmp(type, "qwen2_moe") == 0) st = parse_qwen2_moe(&r, out);
    else if (strcmp(type, "qwen3_moe") == 0) st = parse_qwen3_moe(&r, out);
    else if (strcmp(type, "olmoe") == 0) st = parse_olmoe(&r, out);
    else if (strcmp(type, "deepseek_v3") == 0) st = eng_cfg_parse_deepseek_v3(&r, out);
    else if (strcmp(type, "deepseek_v2") == 0) st = eng_cfg_parse_deepseek_v2(&r, out);
    else if (strcmp(type, "glm4_moe") == 0) st = eng_cfg_parse_glm4_moe(&r, out);
    else if (strcmp(type, "gpt_oss") == 0) st = eng_cfg_parse_gpt_oss(&r, out);
    else
        st = mt_error_set(err, MT_ERR_UNSUPPORTED,
                          "%s: model_type '%s' is not supported (supported: mixtral, qwen2_moe, "
                          "qwen3_moe, olmoe, deepseek_v2, deepseek_v3, glm4_moe, gpt_oss)",
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
