/* The config.json keys every family reads (see read.h): the model's sizes,
 * heads, norm, activation, dropout and the routed experts, with the
 * family's defaults passed in.
 *
 * Its own file, beside the getters (read.c) and below the families'
 * parsers (model_config.c, model_config_families.c) that call it. */
#include <jansson.h>
#include <string.h>

#include "engine/model/hf/model_config.h"
#include "engine/model/hf/read.h"

mt_status_t eng_cfg_read_common(eng_cfg_reader_t *r, eng_model_config_t *c, int def_nkv, double def_eps,
                               int def_max_pos) {
    RETURN_ON_ERROR(eng_cfg_get_int(r, "vocab_size", true, false, 0, &c->vocab_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "vocab_size", c->vocab_size));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "hidden_size", true, false, 0, &c->hidden_size));
    RETURN_ON_ERROR(eng_cfg_positive(r, "hidden_size", c->hidden_size));
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_hidden_layers", true, false, 0, &c->num_hidden_layers));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_hidden_layers", c->num_hidden_layers));
    if (c->num_hidden_layers > ENG_MAX_LAYERS)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'num_hidden_layers' = %d exceeds moetune's limit of %d", r->path,
                            c->num_hidden_layers, ENG_MAX_LAYERS);
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_attention_heads", true, false, 0, &c->num_attention_heads));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_attention_heads", c->num_attention_heads));
    /* null means "same as num_attention_heads" (MHA) in every config class. */
    json_t *kv = json_object_get(r->obj, "num_key_value_heads");
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_key_value_heads", false, true,
                                    kv && json_is_null(kv) ? c->num_attention_heads : def_nkv,
                                    &c->num_key_value_heads));
    RETURN_ON_ERROR(eng_cfg_positive(r, "num_key_value_heads", c->num_key_value_heads));
    if (c->num_attention_heads % c->num_key_value_heads != 0)
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'num_attention_heads' (%d) must be a multiple of "
                            "'num_key_value_heads' (%d)",
                            r->path, c->num_attention_heads, c->num_key_value_heads);
    /* getattr(config, "head_dim", None) or hidden_size // num_attention_heads */
    RETURN_ON_ERROR(eng_cfg_get_int(r, "head_dim", false, true, 0, &c->head_dim));
    if (c->head_dim == 0) c->head_dim = c->hidden_size / c->num_attention_heads;
    RETURN_ON_ERROR(eng_cfg_positive(r, "head_dim", c->head_dim));

    json_t *act = json_object_get(r->obj, "hidden_act");
    if (act && !json_is_string(act)) return eng_cfg_type_error(r, "hidden_act", "a string", act);
    if (act && strcmp(json_string_value(act), "silu") != 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'hidden_act' = \"%s\" is not supported (only \"silu\")", r->path,
                            json_string_value(act));
    double d;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "rms_norm_eps", def_eps, &d));
    /* x / sqrt(mean(x^2) + eps): eps <= 0 divides by zero (or takes the root
     * of a negative number) on a zero row, and a NaN there routes nowhere. */
    if (!(d > 0 && d < 1))
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'rms_norm_eps' = %g must be positive and below 1", r->path, d);
    c->rms_norm_eps = (float)d;
    RETURN_ON_ERROR(
        eng_cfg_get_int(r, "max_position_embeddings", false, false, def_max_pos, &c->max_position_embeddings));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "tie_word_embeddings", false, &c->tie_word_embeddings));
    RETURN_ON_ERROR(eng_cfg_get_bool(r, "output_router_logits", false, &c->output_router_logits));
    RETURN_ON_ERROR(eng_cfg_get_double(r, "router_aux_loss_coef", 0.001, &d));
    c->router_aux_loss_coef = (float)d;
    RETURN_ON_ERROR(eng_cfg_get_double(r, "router_jitter_noise", 0.0, &d));
    if (d > 0)
        return mt_error_set(r->err, MT_ERR_UNSUPPORTED,
                            "%s: key 'router_jitter_noise' = %g is not supported (only 0)", r->path, d);
    RETURN_ON_ERROR(eng_cfg_get_double(r, "attention_dropout", 0.0, &d));
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
mt_status_t eng_cfg_read_experts(eng_cfg_reader_t *r, eng_model_config_t *c, const char *key_e, int def_e,
                                int def_k) {
    const char *alias = strcmp(key_e, "num_experts") == 0 ? "num_local_experts" : "num_experts";
    const bool has_key = json_object_get(r->obj, key_e) != NULL, has_alias = json_object_get(r->obj, alias) != NULL;
    if (has_alias && !has_key) key_e = alias;
    RETURN_ON_ERROR(eng_cfg_get_int(r, key_e, false, false, def_e, &c->num_experts));
    if (has_key && has_alias) {
        int other;
        RETURN_ON_ERROR(eng_cfg_get_int(r, alias, true, false, 0, &other));
        if (other != c->num_experts)
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: '%s' = %d and '%s' = %d disagree", r->path, key_e,
                                c->num_experts, alias, other);
    }
    RETURN_ON_ERROR(eng_cfg_get_int(r, "num_experts_per_tok", false, false, def_k, &c->num_experts_per_tok));
    if (c->num_experts < 0)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must not be negative", r->path, key_e);
    if (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->num_experts_per_tok > c->num_experts))
        return mt_error_set(r->err, MT_ERR_CONFIG,
                            "%s: key 'num_experts_per_tok' = %d must be between 1 and %s (%d)",
                            r->path, c->num_experts_per_tok, key_e, c->num_experts);
    return MT_OK;
}
