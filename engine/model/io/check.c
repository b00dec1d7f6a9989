/* A checkpoint's tensors against config.json (see checkpoint.h).
 *
 * Run when a run is planned, from the safetensors headers alone (opening a
 * checkpoint maps it and parses its headers; no weight is read), so that a
 * config.json whose sizes disagree with the weights is reported as that,
 * naming the key that sets the disagreeing dimension, rather than as a
 * memory budget the wrong sizes do not fit, or steps later.
 *
 * Tensors config.json does not explain (an expert past num_local_experts, a
 * layer past num_hidden_layers) mean the config and the weights are not a
 * pair, so they are an error unless the run says allow_unused_tensors, or
 * the family is known to carry tensors transformers ignores on load
 * (k_ignored below): those stay a note, as in transformers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"

/* Names transformers drops on load (a model class's
 * _keys_to_ignore_on_load_unexpected, or buffers older checkpoints saved). */
typedef enum {
    IGN_SUFFIX,      /* any family: the name ends in `text` */
    IGN_EXTRA_LAYER, /* model_type `text`: layers past num_hidden_layers (multi-token prediction) */
} ignore_kind_t;

static const struct {
    ignore_kind_t kind;
    const char *text;
} k_ignored[] = {
    {IGN_SUFFIX, ".rotary_emb.inv_freq"},
    {IGN_EXTRA_LAYER, "deepseek_v3"}, /* model.layers.61.*: DeepSeek-V3's MTP layer */
    {IGN_EXTRA_LAYER, "glm4_moe"},    /* model.layers.46.* (GLM-4.5-Air), .92.* (GLM-4.5): their MTP layer */
};

static const char *experts_key(const eng_model_config_t *c) {
    switch (c->arch) {
    case ENG_ARCH_MIXTRAL:
    case ENG_ARCH_GPT_OSS: return "num_local_experts";
    case ENG_ARCH_DEEPSEEK_V2:
    case ENG_ARCH_DEEPSEEK_V3:
    case ENG_ARCH_GLM4_MOE: return "n_routed_experts";
    default: return "num_experts";
    }
}

static const char *expert_width_key(const eng_model_config_t *c) {
    return c->arch == ENG_ARCH_MIXTRAL || c->arch == ENG_ARCH_OLMOE || c->arch == ENG_ARCH_GPT_OSS
               ? "intermediate_size"
               : "moe_intermediate_size";
}

/* The config.json key(s) that set dimension d of p's shape. */
static const char *dim_keys(const eng_model_config_t *c, const eng_param_spec_t *p, int d) {
    static const char *const hidden = "hidden_size";
    const char *q = "num_attention_heads x head_dim (head_dim defaults to hidden_size / num_attention_heads)";
    const char *kv = "num_key_value_heads x head_dim (head_dim defaults to hidden_size / num_attention_heads)";
    switch (p->role) {
    case ENG_P_EMBED:
    case ENG_P_LM_HEAD: return d == 0 ? "vocab_size" : hidden;
    case ENG_P_ATTN_NORM:
    case ENG_P_MLP_NORM:
    case ENG_P_FINAL_NORM:
    case ENG_P_O_BIAS: return hidden;
    case ENG_P_Q: return d == 0 ? q : hidden;
    case ENG_P_K:
    case ENG_P_V: return d == 0 ? kv : hidden;
    case ENG_P_O: return d == 0 ? hidden : q;
    case ENG_P_Q_BIAS: return q;
    case ENG_P_K_BIAS:
    case ENG_P_V_BIAS: return kv;
    case ENG_P_Q_NORM: return p->shape[0] == c->head_dim ? "head_dim" : q;
    case ENG_P_K_NORM: return p->shape[0] == c->head_dim ? "head_dim" : kv;
    case ENG_P_ROUTER: return d == 0 ? experts_key(c) : hidden;
    case ENG_P_EXP_GATE:
    case ENG_P_EXP_UP: return d == 0 ? expert_width_key(c) : hidden;
    case ENG_P_EXP_DOWN: return d == 0 ? hidden : expert_width_key(c);
    case ENG_P_SHARED_GATE:
    case ENG_P_SHARED_UP:
    case ENG_P_SHARED_DOWN: {
        const char *w = c->n_shared_experts > 0 ? "n_shared_experts x moe_intermediate_size"
                                                : "shared_expert_intermediate_size";
        return (d == 0) == (p->role != ENG_P_SHARED_DOWN) ? w : hidden;
    }
    case ENG_P_Q_A: return d == 0 ? "q_lora_rank" : hidden;
    case ENG_P_Q_A_NORM: return "q_lora_rank";
    case ENG_P_Q_B: return d == 0 ? "num_attention_heads x (qk_nope_head_dim + qk_rope_head_dim)" : "q_lora_rank";
    case ENG_P_KV_A: return d == 0 ? "kv_lora_rank + qk_rope_head_dim" : hidden;
    case ENG_P_KV_A_NORM: return "kv_lora_rank";
    case ENG_P_KV_B: return d == 0 ? "num_attention_heads x (qk_nope_head_dim + v_head_dim)" : "kv_lora_rank";
    case ENG_P_ATTN_SINKS: return "num_attention_heads";
    case ENG_P_ROUTER_B:
    case ENG_P_ROUTER_BIAS: return experts_key(c);
    case ENG_P_EXP_GATE_UP_FUSED: return d == 0 ? experts_key(c) : d == 1 ? hidden : "2 x intermediate_size";
    case ENG_P_EXP_GATE_UP_BIAS: return d == 0 ? experts_key(c) : "2 x intermediate_size";
    case ENG_P_EXP_DOWN_FUSED: return d == 0 ? experts_key(c) : d == 1 ? "intermediate_size" : hidden;
    case ENG_P_EXP_DOWN_BIAS: return d == 0 ? experts_key(c) : hidden;
    case ENG_P_SHARED_EXPERT_GATE: return d == 0 ? "(1: one gate per token)" : hidden;
    case ENG_P_DENSE_GATE:
    case ENG_P_DENSE_UP: return d == 0 ? "intermediate_size" : hidden;
    case ENG_P_DENSE_DOWN: return d == 0 ? hidden : "intermediate_size";
    default: return "?";
    }
}

static void shape_str(char *buf, size_t cap, int ndim, const int64_t *s64, const uint64_t *su) {
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int i = 0; i < ndim && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? ", " : "", s64 ? (long long)s64[i] : (long long)su[i]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}

/* The integer after `key` ("layers.", "experts.") in name, or -1. */
static long index_after(const char *name, const char *key) {
    const char *p = strstr(name, key);
    if (!p) return -1;
    char *end;
    long v = strtol(p + strlen(key), &end, 10);
    return end != p + strlen(key) && *end == '.' ? v : -1;
}

static bool ignored_by_transformers(const eng_model_config_t *c, const char *name) {
    for (size_t i = 0; i < sizeof k_ignored / sizeof k_ignored[0]; i++) {
        if (k_ignored[i].kind == IGN_SUFFIX) {
            const size_t n = strlen(name), m = strlen(k_ignored[i].text);
            if (n >= m && strcmp(name + n - m, k_ignored[i].text) == 0) return true;
        } else if (strcmp(c->model_type, k_ignored[i].text) == 0 &&
                   index_after(name, "model.layers.") >= c->num_hidden_layers) {
            return true;
        }
    }
    return false;
}

/* Why config.json does not explain name, for the message. */
static void why_unexplained(const eng_model_config_t *c, const char *name, char *buf, size_t cap) {
    const long layer = index_after(name, "model.layers."), expert = index_after(name, ".experts.");
    if (layer >= c->num_hidden_layers)
        snprintf(buf, cap, "layer %ld, while num_hidden_layers is %d", layer, c->num_hidden_layers);
    else if (expert >= 0 && expert >= c->num_experts)
        snprintf(buf, cap, "expert %ld, while %s is %d", expert, experts_key(c), c->num_experts);
    else
        snprintf(buf, cap, "a tensor %s does not have", c->model_type);
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* One described tensor p against the checkpoint's headers: there (or as
 * gpt-oss's MXFP4 pair), with the shape config.json implies, an FP8 one
 * with its block scales. */
static mt_status_t check_described(const eng_checkpoint_t *ck, const eng_model_config_t *cfg,
                                   const eng_param_spec_t *p, const char *config_path, mt_error_t *err) {
    char want[128], got[128];
    shape_str(want, sizeof want, p->ndim, p->shape, NULL);
    const eng_ckpt_entry_t *e = eng_checkpoint_find(ck, p->name);
    const eng_ckpt_entry_t *mb, *ms;
    int64_t mshape[3];
    if (!e && eng_checkpoint_find_mxfp4(ck, p->name, &mb, &ms, mshape)) {
        /* gpt-oss's MXFP4 experts: compare the shape they dequantise to */
        bool ok = p->ndim == 3;
        for (int d = 0; ok && d < 3; d++) ok = mshape[d] == p->shape[d];
        if (ok) return MT_OK;
        shape_str(got, sizeof got, 3, mshape, NULL);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s disagrees with the checkpoint: MXFP4 tensor '%s_blocks' in %s dequantises to %s "
                            "but %s implies %s (%s). Use the config.json that came with these weights",
                            config_path, p->name, ck->files[mb->file].path, got, config_path, want,
                            dim_keys(cfg, p, 0));
    }
    if (!e) {
        /* _blocks / _scales there but not the MXFP4 pair: name them, not the tensor they encode */
        mt_status_t mst = eng_checkpoint_mxfp4_check(ck, p->name, err);
        if (mst != MT_OK) return mst;
        /* a routed expert may be stored fused (transformers 5): say where it was looked for too */
        const char *at = p->expert >= 0 ? strstr(p->name, ".experts.") : NULL;
        char alt[200] = "";
        if (at) { /* transformers 5 names Mixtral's block_sparse_moe `mlp` */
            const char *bsm = strstr(p->name, ".block_sparse_moe.");
            const int keep = (int)((bsm && bsm < at ? bsm : at) - p->name);
            snprintf(alt, sizeof alt, "; nor fused, as '%.*s%s.experts.%s'", keep, p->name,
                     bsm && bsm < at ? ".mlp" : "", p->role == ENG_P_EXP_DOWN ? "down_proj" : "gate_up_proj");
        }
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: missing tensor '%s', which %s implies with shape %s (%s)%s", ck->dir, p->name,
                            config_path, want, dim_keys(cfg, p, 0), alt);
    }
    if (eng_checkpoint_is_bnb4(ck, e)) { /* U8 [n/2, 1]: the quant_state holds the shape to compare */
        eng_bnb4_t b;
        return eng_checkpoint_bnb4_read(ck, e, p->ndim, p->shape, false, &b, err);
    }
    const eng_st_tensor_t *t = e->tensor;
    const eng_ckpt_entry_t *scales;
    if (t->dtype == ENG_ST_F8_E4M3) { /* FP8: its block scales must be there, of the right shape */
        mt_status_t fst = eng_checkpoint_fp8_scales(ck, e, &scales, err);
        if (fst != MT_OK) return fst;
    }
    int bad = t->ndim == p->ndim ? -1 : 0;
    for (int d = 0; bad < 0 && d < p->ndim; d++)
        if ((int64_t)t->shape[d] != p->shape[d]) bad = d;
    if (bad >= 0) {
        shape_str(got, sizeof got, t->ndim, NULL, t->shape);
        char dimv[64] = "";
        if (t->ndim == p->ndim)
            snprintf(dimv, sizeof dimv, " (%lld in the checkpoint)", (long long)t->shape[bad]);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s disagrees with the checkpoint: tensor '%s' in %s has shape %s but %s "
                            "implies %s; dimension %d is %lld, set by %s%s. Use the config.json that "
                            "came with these weights",
                            config_path, p->name, ck->files[e->file].path, got, config_path, want, bad,
                            (long long)p->shape[bad], dim_keys(cfg, p, bad), dimv);
    }
    return MT_OK;
}

mt_status_t eng_checkpoint_check(const eng_checkpoint_t *ck, const eng_model_config_t *cfg,
                                 const eng_model_desc_t *spec, const char *config_path, bool allow_unused,
                                 mt_error_t *err) {
    /* parameters, then buffers (DeepSeek-V3's e_score_correction_bias): both are the checkpoint's */
    const int described = spec->count + spec->num_buffers;
    for (int i = 0; i < described; i++) {
        const eng_param_spec_t *p = i < spec->count ? &spec->params[i] : &spec->buffers[i - spec->count];
        mt_status_t st = check_described(ck, cfg, p, config_path, err);
        if (st != MT_OK) return st;
    }
    /* Tensors nothing in the spec names: a merge of two sorted lists. */
    const size_t nnames = described > 0 ? (size_t)described : 1;
    const char **names = malloc(nnames * sizeof *names);
    MT_CHECK_ALLOC(names, "spec names");
    for (int i = 0; i < described; i++)
        names[i] = i < spec->count ? spec->params[i].name : spec->buffers[i - spec->count].name;
    qsort(names, (size_t)described, sizeof *names, cmp_str);
    int j = 0, unexplained = 0;
    const char *first = NULL;
    for (int i = 0; i < ck->count; i++) {
        const char *n = ck->entries[i].name;
        while (j < described && strcmp(names[j], n) < 0) j++;
        if (j < described && strcmp(names[j], n) == 0) continue;
        /* FP8 scales and MXFP4 pairs read with the weight they encode */
        if (eng_checkpoint_dequant_part(ck, names, described, n)) continue;
        if (ignored_by_transformers(cfg, n)) continue;
        if (!first) first = n;
        unexplained++;
    }
    free(names);
    if (unexplained == 0 || allow_unused) return MT_OK;
    char why[160];
    why_unexplained(cfg, first, why, sizeof why);
    return mt_error_set(err, MT_ERR_FORMAT,
                        "%s holds %d tensor(s) that %s does not explain, first '%s' (%s): the config and the "
                        "weights do not belong together. Use the config.json that came with these weights, or "
                        "set allow_unused_tensors: true in the run config to train without them (they are not "
                        "saved)",
                        ck->dir, unexplained, config_path, first, why);
}
