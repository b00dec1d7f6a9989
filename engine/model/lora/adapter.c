/* PEFT adapter files; the format and the fused-expert conversion are
 * described in adapter.h. */
#include "engine/model/lora/adapter.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/safetensors.h"

#define PEFT_PREFIX "base_model.model."

void eng_lora_config_select(const eng_lora_config_t *c, eng_lora_select_t *out) {
    *out = (eng_lora_select_t){.modules = (const char *const *)c->target_modules,
                               .num_modules = c->num_target_modules,
                               .regex = c->target_regex,
                               .r = c->r,
                               .modules_to_save = (const char *const *)c->modules_to_save,
                               .num_modules_to_save = c->num_modules_to_save};
}

double eng_lora_scale(const eng_lora_config_t *c) {
    return c->use_rslora ? c->lora_alpha / sqrt((double)c->r) : c->lora_alpha / (double)c->r;
}

static char *dupstr(const char *s) {
    char *d = strdup(s);
    MT_CHECK_ALLOC(d, "string");
    return d;
}

static void free_list(char **l, int n) {
    for (int i = 0; i < n; i++) free(l[i]);
    free(l);
}

void eng_lora_config_free(eng_lora_config_t *c) {
    free(c->base_model_name_or_path);
    free_list(c->target_modules, c->num_target_modules);
    free(c->target_regex);
    free_list(c->target_parameters, c->num_target_parameters);
    free_list(c->modules_to_save, c->num_modules_to_save);
    memset(c, 0, sizeof *c);
}

/* A list of strings or null; a lone string is allowed only where PEFT allows it (regex). */
static mt_status_t str_list(const char *path, const char *key, json_t *v, char ***out, int *n, mt_error_t *err) {
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_array(v))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' must be a list of strings or null", path, key);
    size_t len = json_array_size(v);
    *out = calloc(len + 1, sizeof **out);
    MT_CHECK_ALLOC(*out, "adapter config list");
    for (size_t i = 0; i < len; i++) {
        json_t *s = json_array_get(v, i);
        if (!json_is_string(s))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' item %zu is not a string", path, key, i);
        (*out)[(*n)++] = dupstr(json_string_value(s));
    }
    return MT_OK;
}

/* An option whose presence with any non-empty value changes the math. */
static bool non_empty(json_t *v) {
    if (!v || json_is_null(v) || json_is_false(v)) return false;
    if (json_is_object(v)) return json_object_size(v) > 0;
    if (json_is_array(v)) return json_array_size(v) > 0;
    return true;
}

static mt_status_t parse_config(const char *path, json_t *root, eng_lora_config_t *c, mt_error_t *err) {
    if (!json_is_object(root)) return mt_error_set(err, MT_ERR_FORMAT, "%s: not a JSON object", path);
    json_t *v = json_object_get(root, "peft_type");
    if (!json_is_string(v) || strcmp(json_string_value(v), "LORA") != 0)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: key 'peft_type' is %s; moetune reads LORA adapters only",
                            path, json_is_string(v) ? json_string_value(v) : "missing");
    v = json_object_get(root, "task_type");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "CAUSAL_LM") != 0))
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: key 'task_type' is %s; moetune trains CAUSAL_LM adapters",
                            path, json_is_string(v) ? json_string_value(v) : "not a string");
    v = json_object_get(root, "base_model_name_or_path");
    if (json_is_string(v)) c->base_model_name_or_path = dupstr(json_string_value(v));

    v = json_object_get(root, "r");
    if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 65536)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'r' must be an integer in [1, 65536]", path);
    c->r = (int)json_integer_value(v);
    v = json_object_get(root, "lora_alpha");
    if (!json_is_number(v) || !(json_number_value(v) > 0))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'lora_alpha' must be a number > 0", path);
    c->lora_alpha = json_number_value(v);
    v = json_object_get(root, "lora_dropout");
    c->lora_dropout = json_is_number(v) ? json_number_value(v) : 0.0;
    if (v && !json_is_null(v) && (!json_is_number(v) || c->lora_dropout < 0 || c->lora_dropout >= 1))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'lora_dropout' must be a number in [0, 1)", path);
    v = json_object_get(root, "use_rslora");
    if (v && !json_is_boolean(v) && !json_is_null(v))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'use_rslora' must be true or false", path);
    c->use_rslora = json_is_true(v);

    /* options that change y = W x + s B A x */
    if (json_is_true(json_object_get(root, "use_dora")))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'use_dora' is true; moetune computes plain LoRA, not DoRA", path);
    v = json_object_get(root, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'bias' is '%s'; moetune supports bias \"none\" only (biases stay frozen)", path,
                            json_is_string(v) ? json_string_value(v) : "?");
    if (json_is_true(json_object_get(root, "fan_in_fan_out")))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'fan_in_fan_out' is true; MoE checkpoints store nn.Linear [out, in] weights, "
                            "so it must be false",
                            path);
    static const char *const k_patterns[] = {"rank_pattern", "alpha_pattern", "layers_to_transform",
                                             "layer_replication", "lora_bias", "use_qalora", "megatron_config"};
    for (size_t i = 0; i < sizeof k_patterns / sizeof *k_patterns; i++)
        if (non_empty(json_object_get(root, k_patterns[i])))
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: key '%s' is set; moetune uses one rank and one alpha for every module of "
                                "every layer and no adapter bias; remove it",
                                path, k_patterns[i]);
    v = json_object_get(root, "init_lora_weights");
    if (v && !json_is_boolean(v) && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "gaussian") == 0))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'init_lora_weights' is %s%s%s; inits that rewrite the base weights (PiSSA, "
                            "OLoRA, LoftQ, CorDA, EVA) are not supported: use true, false or \"gaussian\"",
                            path, json_is_string(v) ? "'" : "", json_is_string(v) ? json_string_value(v) : "not a bool",
                            json_is_string(v) ? "'" : "");

    mt_status_t st;
    v = json_object_get(root, "target_modules");
    if (json_is_string(v)) c->target_regex = dupstr(json_string_value(v));
    else if ((st = str_list(path, "target_modules", v, &c->target_modules, &c->num_target_modules, err))) return st;
    if ((st = str_list(path, "target_parameters", json_object_get(root, "target_parameters"), &c->target_parameters,
                       &c->num_target_parameters, err)))
        return st;
    if ((st = str_list(path, "modules_to_save", json_object_get(root, "modules_to_save"), &c->modules_to_save,
                       &c->num_modules_to_save, err)))
        return st;
    if (!c->target_regex && c->num_target_modules == 0 && c->num_target_parameters == 0)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'target_modules' is missing or empty", path);
    return MT_OK;
}

mt_status_t eng_lora_config_read(const char *path, eng_lora_config_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    json_error_t je;
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!root) {
        FILE *f = fopen(path, "rb");
        if (!f) return mt_error_set(err, MT_ERR_IO, "%s: cannot open", path);
        fclose(f);
        return mt_error_set(err, MT_ERR_FORMAT, "%s:%d: not valid JSON: %s", path, je.line, je.text);
    }
    mt_status_t st = parse_config(path, root, out, err);
    json_decref(root);
    if (st != MT_OK) eng_lora_config_free(out);
    return st;
}

static json_t *json_list(char **l, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_string(l[i]));
    return a;
}

mt_status_t eng_lora_config_write(const char *path, const eng_lora_config_t *c, mt_error_t *err) {
    json_t *o = json_object();
    json_object_set_new(o, "peft_type", json_string("LORA"));
    json_object_set_new(o, "task_type", json_string("CAUSAL_LM"));
    json_object_set_new(o, "base_model_name_or_path",
                        c->base_model_name_or_path ? json_string(c->base_model_name_or_path) : json_null());
    json_object_set_new(o, "r", json_integer(c->r));
    json_object_set_new(o, "lora_alpha", json_real(c->lora_alpha));
    json_object_set_new(o, "lora_dropout", json_real(c->lora_dropout));
    json_object_set_new(o, "target_modules", c->target_regex ? json_string(c->target_regex)
                                                             : json_list(c->target_modules, c->num_target_modules));
    if (c->num_target_parameters)
        json_object_set_new(o, "target_parameters", json_list(c->target_parameters, c->num_target_parameters));
    json_object_set_new(o, "bias", json_string("none"));
    json_object_set_new(o, "fan_in_fan_out", json_false());
    json_object_set_new(o, "use_rslora", json_boolean(c->use_rslora));
    json_object_set_new(o, "use_dora", json_false());
    json_object_set_new(o, "init_lora_weights", json_true());
    json_object_set_new(o, "modules_to_save",
                        c->num_modules_to_save ? json_list(c->modules_to_save, c->num_modules_to_save) : json_null());
    json_object_set_new(o, "inference_mode", json_true());
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(o);
    MT_CHECK_ALLOC(text, "adapter_config.json text");
    size_t n = strlen(text);
    char *withnl = malloc(n + 2);
    MT_CHECK_ALLOC(withnl, "adapter_config.json text");
    memcpy(withnl, text, n);
    withnl[n] = '\n';
    free(text);
    mt_status_t st = eng_write_file_atomic(path, withnl, n + 1, err);
    free(withnl);
    return st;
}

/* ---- weights ---------------------------------------------------------------- */

void eng_lora_weights_free(eng_lora_weights_t *w) {
    for (int i = 0; i < w->count; i++) {
        free(w->pairs[i].a);
        free(w->pairs[i].b);
    }
    for (int i = 0; i < w->num_saved; i++) free(w->saved[i].data);
    free(w->pairs);
    free(w->saved);
    memset(w, 0, sizeof *w);
}

const eng_lora_pair_t *eng_lora_weights_find(const eng_lora_weights_t *w, int param) {
    for (int i = 0; i < w->count; i++)
        if (w->pairs[i].param == param) return &w->pairs[i];
    return NULL;
}

static bool ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && strcmp(s + n - m, suf) == 0;
}

static mt_status_t check_shape(const char *path, const eng_st_tensor_t *t, int64_t d0, int64_t d1,
                               const char *what, mt_error_t *err) {
    if (t->ndim == 2 && (int64_t)t->shape[0] == d0 && (int64_t)t->shape[1] == d1) return MT_OK;
    char got[64] = "[";
    for (int i = 0; i < t->ndim && i < 4; i++)
        snprintf(got + strlen(got), sizeof got - strlen(got), "%s%llu", i ? ", " : "", (unsigned long long)t->shape[i]);
    strncat(got, "]", sizeof got - strlen(got) - 1);
    return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s has shape %s; the base model needs [%lld, %lld] (%s)", path,
                        t->name, got, (long long)d0, (long long)d1, what);
}

static float *read_tensor(const eng_st_file_t *f, const eng_st_tensor_t *t, mt_error_t *err, mt_status_t *st) {
    float *buf = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *buf);
    MT_CHECK_ALLOC(buf, "adapter tensor");
    *st = eng_st_read_f32(f, t, buf, err);
    if (*st != MT_OK) {
        free(buf);
        return NULL;
    }
    return buf;
}

/* One fused ParamWrapper (A, B) of a layer; `nest` 0 = `experts.lora_*`, 1 = `experts.base_layer.lora_*`. */
typedef struct {
    int layer, nest;
    const eng_st_tensor_t *a, *b;
} fused_t;

typedef struct {
    const char *path;
    const eng_model_desc_t *d;
    int r;
    float **a, **b, **full; /* (d->count) each */
    int *rank;              /* (d->count) a fused pair's rank; 0 = r */
} reader_t;

static mt_status_t put_slot(reader_t *rd, float **slot, float *buf, const char *tensor, mt_error_t *err) {
    if (*slot) {
        free(buf);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: its module's adapter is given twice (per-expert and "
                            "fused keys for the same expert?)", rd->path, tensor);
    }
    *slot = buf;
    return MT_OK;
}

/* Both factors of parameter p from a fused tensor, with their rank. */
static mt_status_t put(reader_t *rd, int p, float *a, float *b, int rank, const char *tensor, mt_error_t *err) {
    mt_status_t st = put_slot(rd, &rd->a[p], a, tensor, err);
    if (st != MT_OK) {
        free(b);
        return st;
    }
    rd->rank[p] = rank;
    return put_slot(rd, &rd->b[p], b, tensor, err);
}

/* Per-expert factors of a fused pair: A (E*rf, in) read as (E, rf, in), B
 * (out, E*rf) read as (out, rf, E); expert e's A_e is rows e*rf.., its B_e
 * column k is B's column k*E + e (PEFT's get_delta_factors). */
static float *fused_a(const float *A, int e, int rf, int k0, int nk, int64_t in) {
    float *o = malloc((size_t)nk * (size_t)in * sizeof *o);
    MT_CHECK_ALLOC(o, "per-expert lora_A");
    memcpy(o, A + ((size_t)e * rf + k0) * (size_t)in, (size_t)nk * (size_t)in * sizeof *o);
    return o;
}

static float *fused_b(const float *B, int e, int E, int rf, int64_t o0, int64_t no, int k0, int nk) {
    float *o = malloc((size_t)no * (size_t)nk * sizeof *o);
    MT_CHECK_ALLOC(o, "per-expert lora_B");
    for (int64_t i = 0; i < no; i++)
        for (int k = 0; k < nk; k++) o[(size_t)i * nk + k] = B[(size_t)(o0 + i) * E * rf + (size_t)(k0 + k) * E + e];
    return o;
}

/* gate_up written from per-expert gate and up adapters is rank 2r with a
 * block-diagonal B (gate rows use only the first r columns): then it splits
 * back into two rank-r pairs exactly. */
static bool block_diagonal(const float *B, int E, int rf, int64_t I) {
    const int h = rf / 2;
    for (int64_t o = 0; o < 2 * I; o++)
        for (int k = 0; k < rf; k++) {
            bool off = o < I ? k >= h : k < h;
            for (int e = 0; e < E && off; e++)
                if (B[(size_t)o * E * rf + (size_t)k * E + e] != 0.0f) return false;
        }
    return true;
}

/* Splits one fused ParamWrapper pair into per-expert pairs (see adapter.h). */
static mt_status_t convert_fused(reader_t *rd, const eng_st_file_t *f, const fused_t *fu, mt_error_t *err) {
    const eng_model_desc_t *d = rd->d;
    const char *path = rd->path;
    const int E = d->num_experts, r = rd->r;
    if (!fu->a || !fu->b)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: layer %d: fused expert adapter has lora_%s but no lora_%s",
                            path, fu->layer, fu->a ? "A" : "B", fu->a ? "B" : "A");
    const int pg = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_GATE, 0);
    if (pg < 0 || E < 1)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: layer %d of this model has no routed experts", path,
                            fu->a->name, fu->layer);
    const int64_t I = d->params[pg].shape[0], H = d->params[pg].shape[1];
    if (fu->a->ndim != 2 || fu->b->ndim != 2 || fu->a->shape[0] % (uint64_t)E != 0 ||
        fu->b->shape[1] != fu->a->shape[0])
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensors %s / %s: a fused expert adapter needs lora_A [E*r, in] and lora_B "
                            "[out, E*r] with E = %d",
                            path, fu->a->name, fu->b->name, E);
    const int rf = (int)(fu->a->shape[0] / (uint64_t)E);
    const int64_t in = (int64_t)fu->a->shape[1], out = (int64_t)fu->b->shape[0];
    const bool gate_up = out == 2 * I && in == H, down = out == H && in == I;
    if (!gate_up && !down)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensors %s [%d, %lld] / %s [%lld, %d] fit neither gate_up_proj (in %lld, out %lld) "
                            "nor down_proj (in %lld, out %lld) of layer %d",
                            path, fu->a->name, E * rf, (long long)in, fu->b->name, (long long)out, E * rf,
                            (long long)H, (long long)(2 * I), (long long)I, (long long)H, fu->layer);
    if (rf != r && !(gate_up && rf == 2 * r))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: rank %d per expert; adapter_config.json says r = %d",
                            path, fu->a->name, rf, r);
    mt_status_t st;
    float *A = read_tensor(f, fu->a, err, &st);
    if (!A) return st;
    float *B = read_tensor(f, fu->b, err, &st);
    if (!B) {
        free(A);
        return st;
    }
    const bool split = gate_up && rf == 2 * r && block_diagonal(B, E, rf, I);
    for (int e = 0; e < E && st == MT_OK; e++) {
        if (down) {
            int p = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_DOWN, e);
            st = put(rd, p, fused_a(A, e, rf, 0, rf, in), fused_b(B, e, E, rf, 0, H, 0, rf), rf, fu->a->name, err);
            continue;
        }
        /* gate rows first, then up rows (transformers 5's gate_up_proj) */
        const int pgate = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_GATE, e);
        const int pup = eng_model_desc_find_role(d, fu->layer, ENG_P_EXP_UP, e);
        const int nk = split ? r : rf, k_up = split ? r : 0;
        st = put(rd, pgate, fused_a(A, e, rf, 0, nk, in), fused_b(B, e, E, rf, 0, I, 0, nk), nk, fu->a->name, err);
        if (st == MT_OK)
            st = put(rd, pup, fused_a(A, e, rf, k_up, nk, in), fused_b(B, e, E, rf, I, I, k_up, nk), nk,
                     fu->a->name, err);
    }
    free(A);
    free(B);
    return st;
}

/* Sorts a tensor into per-module slots or the fused list. */
static mt_status_t take_tensor(reader_t *rd, const eng_st_file_t *f, const eng_st_tensor_t *t, fused_t *fused,
                               int *num_fused, mt_error_t *err) {
    const eng_model_desc_t *d = rd->d;
    const char *path = rd->path;
    if (strncmp(t->name, PEFT_PREFIX, strlen(PEFT_PREFIX)) != 0)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: a PEFT adapter's names start with '%s'", path,
                            t->name, PEFT_PREFIX);
    const char *rest = t->name + strlen(PEFT_PREFIX);
    const bool is_a = ends_with(rest, ".lora_A.weight"), is_b = ends_with(rest, ".lora_B.weight");
    mt_status_t st = MT_OK;
    if (!is_a && !is_b) { /* modules_to_save: the parameter's own name */
        int p = eng_model_desc_find(d, rest);
        if (p < 0)
            return mt_error_set(err, MT_ERR_FORMAT,
                                "%s: tensor %s is neither a lora_A/lora_B weight nor a parameter of the base model",
                                path, t->name);
        const eng_param_spec_t *ps = &d->params[p];
        if ((uint64_t)ps->numel != t->numel || t->ndim != ps->ndim ||
            (t->ndim >= 1 && (int64_t)t->shape[0] != ps->shape[0]) ||
            (t->ndim == 2 && (int64_t)t->shape[1] != ps->shape[1]))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s has %llu elements in %d dims; the base model's %s "
                                "is [%lld%s%lld]", path, t->name, (unsigned long long)t->numel, t->ndim, ps->name,
                                (long long)ps->shape[0], ps->ndim == 2 ? ", " : "", ps->ndim == 2 ? (long long)ps->shape[1] : 0LL);
        float *buf = read_tensor(f, t, err, &st);
        return buf ? put_slot(rd, &rd->full[p], buf, t->name, err) : st;
    }
    char module[256];
    size_t mlen = strlen(rest) - strlen(".lora_A.weight");
    if (mlen + 8 >= sizeof module)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s: name too long", path, t->name);
    memcpy(module, rest, mlen);
    module[mlen] = '\0';

    int layer = -1, pos = 0;
    char block[64];
    if (sscanf(module, "model.layers.%d.%63[^.].experts%n", &layer, block, &pos) == 2 && pos > 0 &&
        (module[pos] == '\0' || strcmp(module + pos, ".base_layer") == 0)) {
        int nest = module[pos] ? 1 : 0, k = 0;
        while (k < *num_fused && !(fused[k].layer == layer && fused[k].nest == nest)) k++;
        if (k == *num_fused) {
            fused[k] = (fused_t){.layer = layer, .nest = nest};
            (*num_fused)++;
        }
        const eng_st_tensor_t **slot = is_a ? &fused[k].a : &fused[k].b;
        if (*slot) return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s is given twice", path, t->name);
        *slot = t;
        return MT_OK;
    }

    strcat(module, ".weight");
    int p = eng_model_desc_find(d, module);
    if (p < 0 || !eng_lora_role_is_linear(d->params[p].role)) {
        module[mlen] = '\0';
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor %s adapts '%s', which is not a linear module of this %s "
                            "model", path, t->name, module, eng_model_desc_family_name(d));
    }
    const eng_param_spec_t *ps = &d->params[p];
    const int64_t out = ps->shape[0], in = ps->ndim == 2 ? ps->shape[1] : 1;
    if ((st = is_a ? check_shape(path, t, rd->r, in, "lora_A is [r, in]", err)
                   : check_shape(path, t, out, rd->r, "lora_B is [out, r]", err)))
        return st;
    float *buf = read_tensor(f, t, err, &st);
    return buf ? put_slot(rd, is_a ? &rd->a[p] : &rd->b[p], buf, t->name, err) : st;
}

mt_status_t eng_lora_weights_read(const char *path, const eng_model_desc_t *d, int r, eng_lora_weights_t *out,
                                  mt_error_t *err) {
    memset(out, 0, sizeof *out);
    eng_st_file_t f;
    mt_status_t st = eng_st_open(path, &f, err);
    if (st != MT_OK) return st;
    reader_t rd = {.path = path, .d = d, .r = r};
    rd.a = calloc((size_t)d->count + 1, sizeof *rd.a);
    rd.b = calloc((size_t)d->count + 1, sizeof *rd.b);
    rd.full = calloc((size_t)d->count + 1, sizeof *rd.full);
    rd.rank = calloc((size_t)d->count + 1, sizeof *rd.rank);
    fused_t *fused = calloc((size_t)f.count + 1, sizeof *fused);
    MT_CHECK(rd.a && rd.b && rd.full && rd.rank && fused, "out of host memory allocating %s", "adapter slots");
    int num_fused = 0;
    for (int i = 0; i < f.count && st == MT_OK; i++) st = take_tensor(&rd, &f, &f.tensors[i], fused, &num_fused, err);
    for (int k = 0; k < num_fused && st == MT_OK; k++) st = convert_fused(&rd, &f, &fused[k], err);

    int pairs = 0, saved = 0;
    for (int p = 0; p < d->count && st == MT_OK; p++) {
        if (!rd.a[p] != !rd.b[p])
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: %s has lora_%s but no lora_%s", path, d->params[p].name,
                              rd.a[p] ? "A" : "B", rd.a[p] ? "B" : "A");
        pairs += rd.a[p] != NULL;
        saved += rd.full[p] != NULL;
    }
    if (st == MT_OK && pairs + saved == 0)
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: holds no adapter tensor", path);
    if (st == MT_OK) {
        out->pairs = calloc((size_t)pairs + 1, sizeof *out->pairs);
        out->saved = calloc((size_t)saved + 1, sizeof *out->saved);
        MT_CHECK(out->pairs && out->saved, "out of host memory allocating %s", "adapter lists");
        for (int p = 0; p < d->count; p++) {
            if (rd.a[p]) {
                const eng_param_spec_t *ps = &d->params[p];
                out->pairs[out->count++] = (eng_lora_pair_t){.param = p, .out = ps->shape[0],
                                                             .in = ps->ndim == 2 ? ps->shape[1] : 1,
                                                             .r = rd.rank[p] ? rd.rank[p] : r,
                                                             .a = rd.a[p], .b = rd.b[p]};
                rd.a[p] = rd.b[p] = NULL;
            }
            if (rd.full[p]) {
                out->saved[out->num_saved++] = (eng_lora_full_t){.param = p, .data = rd.full[p]};
                rd.full[p] = NULL;
            }
        }
    }
    for (int p = 0; p < d->count; p++) {
        free(rd.a[p]);
        free(rd.b[p]);
        free(rd.full[p]);
    }
    free(rd.a);
    free(rd.b);
    free(rd.full);
    free(rd.rank);
    free(fused);
    eng_st_close(&f);
    if (st != MT_OK) eng_lora_weights_free(out);
    return st;
}

mt_status_t eng_lora_weights_write(const char *path, const eng_model_desc_t *d, const eng_lora_weights_t *w,
                                   const char *const *meta_kv, int meta_count, mt_error_t *err) {
    const int n = 2 * w->count + w->num_saved;
    eng_st_write_tensor_t *t = calloc((size_t)n + 1, sizeof *t);
    char (*names)[300] = calloc((size_t)n + 1, sizeof *names);
    int64_t (*shapes)[2] = calloc((size_t)n + 1, sizeof *shapes);
    MT_CHECK(t && names && shapes, "out of host memory allocating %s", "adapter write list");
    int k = 0;
    mt_status_t st = MT_OK;
    /* description order, pairs and saved modules interleaved as the model lists them */
    int ip = 0, is = 0;
    while ((ip < w->count || is < w->num_saved) && st == MT_OK) {
        bool take_pair = is >= w->num_saved || (ip < w->count && w->pairs[ip].param < w->saved[is].param);
        if (take_pair) {
            const eng_lora_pair_t *pr = &w->pairs[ip++];
            const char *nm = d->params[pr->param].name;
            size_t ml = strlen(nm) - strlen(".weight");
            for (int ab = 0; ab < 2; ab++, k++) {
                snprintf(names[k], sizeof names[k], PEFT_PREFIX "%.*s.lora_%c.weight", (int)ml, nm, ab ? 'B' : 'A');
                shapes[k][0] = ab ? pr->out : pr->r;
                shapes[k][1] = ab ? pr->r : pr->in;
                t[k] = (eng_st_write_tensor_t){.name = names[k], .dtype = ENG_ST_F32, .ndim = 2, .shape = shapes[k],
                                               .f32 = ab ? pr->b : pr->a};
            }
        } else {
            const eng_lora_full_t *sv = &w->saved[is++];
            const eng_param_spec_t *ps = &d->params[sv->param];
            snprintf(names[k], sizeof names[k], PEFT_PREFIX "%s", ps->name);
            shapes[k][0] = ps->shape[0];
            shapes[k][1] = ps->shape[1];
            t[k] = (eng_st_write_tensor_t){.name = names[k], .dtype = ENG_ST_F32, .ndim = ps->ndim,
                                           .shape = shapes[k], .f32 = sv->data};
            k++;
        }
    }
    st = eng_st_write(path, t, k, meta_kv, meta_count, err);
    free(t);
    free(names);
    free(shapes);
    return st;
}

mt_status_t eng_lora_weights_match(const eng_lora_weights_t *w, const eng_lora_plan_t *p, const eng_model_desc_t *d,
                                   const char *path, mt_error_t *err) {
    /* both lists are in description order: walk them together */
    int i = 0, j = 0;
    while (i < w->count || j < p->count) {
        const int wp = i < w->count ? w->pairs[i].param : d->count;
        const int pp = j < p->count ? p->targets[j].param : d->count;
        if (wp == pp) {
            i++;
            j++;
            continue;
        }
        const bool missing = pp < wp;
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: %s %s, but the run's lora_target_modules %s it; use the adapter's own targets "
                            "or start a new adapter",
                            path, d->params[missing ? pp : wp].name,
                            missing ? "has no adapter in the file" : "has an adapter in the file",
                            missing ? "select" : "do not select");
    }
    for (int k = 0; k < p->num_saved; k++) {
        bool found = false;
        for (int m = 0; m < w->num_saved && !found; m++) found = w->saved[m].param == p->saved[k];
        if (!found)
            return mt_error_set(err, MT_ERR_CONFIG, "%s: modules_to_save %s is not in the file", path,
                                d->params[p->saved[k]].name);
    }
    return MT_OK;
}
