/* adapter_config.json: PEFT's LoRA settings (see adapter.h for what a
 * loaded adapter computes). */
#include "engine/model/lora/config.h"

#include <jansson.h>
#include <math.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/safetensors.h"

void eng_lora_config_select(const eng_lora_config_t *c, eng_lora_select_t *out) {
    *out = (eng_lora_select_t){.modules = (const char *const *)c->target_modules,
                               .num_modules = c->num_target_modules,
                               .regex = c->target_regex,
                               .params = (const char *const *)c->target_parameters,
                               .num_params = c->num_target_parameters,
                               .r = c->r,
                               .modules_to_save = (const char *const *)c->modules_to_save,
                               .num_modules_to_save = c->num_modules_to_save};
}

double eng_lora_scale_of(const eng_lora_config_t *c, int r, double alpha) {
    return c->use_rslora ? alpha / sqrt((double)r) : alpha / (double)r;
}

double eng_lora_scale(const eng_lora_config_t *c) {
    return eng_lora_scale_of(c, c->r, c->lora_alpha);
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

static void free_patterns(eng_lora_pattern_t *p, int n) {
    for (int i = 0; i < n; i++) free(p[i].key);
    free(p);
}

void eng_lora_config_free(eng_lora_config_t *c) {
    free_patterns(c->rank_pattern, c->num_rank_pattern);
    free_patterns(c->alpha_pattern, c->num_alpha_pattern);
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

/* PEFT's get_pattern_key: re.match(rf"(.*\.)?({key})$", name). */
static bool pattern_compile(const char *key, regex_t *re) {
    size_t n = strlen(key) + 16;
    char *anch = malloc(n);
    MT_CHECK_ALLOC(anch, "LoRA pattern key");
    snprintf(anch, n, "^(.*\\.)?(%s)$", key);
    const int rc = regcomp(re, anch, REG_EXTENDED | REG_NOSUB);
    free(anch);
    return rc == 0;
}

/* Python's class escapes mean something else, or nothing, to POSIX regex:
 * refused rather than matched differently. */
static bool python_only(const char *key) {
    for (const char *p = key; *p; p++)
        if (*p == '\\' && p[1]) {
            if (strchr("dDwWsSbBAZ", p[1])) return true;
            p++;
        }
    return false;
}

/* rank_pattern (integer values in [1, 65536]) or alpha_pattern (numbers > 0), file order kept. */
static mt_status_t pattern_map(const char *path, const char *name, json_t *v, bool rank, eng_lora_pattern_t **out,
                               int *n, mt_error_t *err) {
    *out = NULL;
    *n = 0;
    if (!v || json_is_null(v)) return MT_OK;
    if (!json_is_object(v))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' must be an object of pattern: %s", path, name,
                            rank ? "rank" : "alpha");
    *out = calloc(json_object_size(v) + 1, sizeof **out);
    MT_CHECK_ALLOC(*out, "adapter config pattern");
    const char *key;
    json_t *val;
    json_object_foreach(v, key, val) {
        const bool ok = rank ? json_is_integer(val) && json_integer_value(val) >= 1 && json_integer_value(val) <= 65536
                             : json_is_number(val) && json_number_value(val) > 0;
        if (!ok)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s['%s'] must be %s", path, name, key,
                                rank ? "an integer in [1, 65536]" : "a number > 0");
        const char *unbounded = eng_lora_regex_unbounded(key);
        if (unbounded)
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: %s key '%.200s' is refused: %s", path, name, key,
                                unbounded);
        regex_t re;
        if (python_only(key) || !pattern_compile(key, &re))
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: %s key '%s' is not a regular expression moetune reads (POSIX extended: write "
                                "[0-9] for \\d, [A-Za-z0-9_] for \\w)",
                                path, name, key);
        regfree(&re);
        (*out)[*n].key = dupstr(key);
        (*out)[(*n)++].value = json_number_value(val);
    }
    return MT_OK;
}

static mt_status_t parse_basics(const char *path, json_t *root, eng_lora_config_t *c, mt_error_t *err) {
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
    return MT_OK;
}

/* Options that change y = W x + s B A x in ways moetune does not compute. */
static mt_status_t refuse_options(const char *path, json_t *root, mt_error_t *err) {
    if (json_is_true(json_object_get(root, "use_dora")))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'use_dora' is true; moetune computes plain LoRA, not DoRA", path);
    json_t *v = json_object_get(root, "bias");
    if (v && !json_is_null(v) && (!json_is_string(v) || strcmp(json_string_value(v), "none") != 0))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'bias' is '%s'; moetune supports bias \"none\" only (biases stay frozen)", path,
                            json_is_string(v) ? json_string_value(v) : "?");
    if (json_is_true(json_object_get(root, "fan_in_fan_out")))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'fan_in_fan_out' is true; MoE checkpoints store nn.Linear [out, in] weights, "
                            "so it must be false",
                            path);
    static const char *const k_refused[] = {"layers_to_transform", "layer_replication", "lora_bias", "use_qalora",
                                            "megatron_config"};
    for (size_t i = 0; i < sizeof k_refused / sizeof *k_refused; i++)
        if (non_empty(json_object_get(root, k_refused[i])))
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: key '%s' is set; moetune adapts every layer a target names, with no adapter "
                                "bias; remove it",
                                path, k_refused[i]);
    v = json_object_get(root, "init_lora_weights");
    if (v && !json_is_boolean(v) && !json_is_null(v) &&
        !(json_is_string(v) && strcmp(json_string_value(v), "gaussian") == 0))
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "%s: key 'init_lora_weights' is %s%s%s; inits that rewrite the base weights (PiSSA, "
                            "OLoRA, LoftQ, CorDA, EVA) are not supported: use true, false or \"gaussian\"",
                            path, json_is_string(v) ? "'" : "", json_is_string(v) ? json_string_value(v) : "not a bool",
                            json_is_string(v) ? "'" : "");
    return MT_OK;
}

static mt_status_t parse_lists(const char *path, json_t *root, eng_lora_config_t *c, mt_error_t *err) {
    mt_status_t st;
    json_t *v = json_object_get(root, "target_modules");
    if (json_is_string(v)) {
        c->target_regex = dupstr(json_string_value(v));
        const char *unbounded = eng_lora_regex_unbounded(c->target_regex);
        if (unbounded)
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: target_modules '%.200s' is refused: %s", path,
                                c->target_regex, unbounded);
    } else if ((st = str_list(path, "target_modules", v, &c->target_modules, &c->num_target_modules, err))) return st;
    if ((st = str_list(path, "target_parameters", json_object_get(root, "target_parameters"), &c->target_parameters,
                       &c->num_target_parameters, err)))
        return st;
    if ((st = str_list(path, "modules_to_save", json_object_get(root, "modules_to_save"), &c->modules_to_save,
                       &c->num_modules_to_save, err)))
        return st;
    if (!c->target_regex && c->num_target_modules == 0 && c->num_target_parameters == 0)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: keys 'target_modules' and 'target_parameters' are missing or "
                            "empty", path);
    if ((st = pattern_map(path, "rank_pattern", json_object_get(root, "rank_pattern"), true, &c->rank_pattern,
                          &c->num_rank_pattern, err)))
        return st;
    return pattern_map(path, "alpha_pattern", json_object_get(root, "alpha_pattern"), false, &c->alpha_pattern,
                       &c->num_alpha_pattern, err);
}

static mt_status_t parse_config(const char *path, json_t *root, eng_lora_config_t *c, mt_error_t *err) {
    mt_status_t st = parse_basics(path, root, c, err);
    if (st == MT_OK) st = refuse_options(path, root, err);
    if (st == MT_OK) st = parse_lists(path, root, c, err);
    return st;
}

static const char k_rewrite_key[] = ".*\\.gate_up_proj";

/* The first entry whose key matches name, or NULL; `rewrite` stands for
 * PEFT's appended `.*\.gate_up_proj` entry. */
static const eng_lora_pattern_t *pattern_find(const eng_lora_pattern_t *p, int n, const char *name,
                                              const eng_lora_pattern_t *rewrite) {
    for (int i = 0; i < n; i++) {
        regex_t re;
        if (!pattern_compile(p[i].key, &re)) continue; /* checked when read */
        const bool hit = regexec(&re, name, 0, NULL, 0) == 0;
        regfree(&re);
        if (hit) return rewrite && strcmp(p[i].key, k_rewrite_key) == 0 ? rewrite : &p[i];
    }
    if (!rewrite) return NULL;
    regex_t re;
    MT_CHECK(pattern_compile(k_rewrite_key, &re), "PEFT's gate_up_proj pattern does not compile");
    const bool hit = regexec(&re, name, 0, NULL, 0) == 0;
    regfree(&re);
    return hit ? rewrite : NULL;
}

void eng_lora_config_lookup(const eng_lora_config_t *c, const char *name, bool gate_up_rewrite, int *r,
                            double *alpha, const char **rank_key) {
    char key[] = ".*\\.gate_up_proj";
    const eng_lora_pattern_t r2 = {key, 2.0 * c->r}, a2 = {key, 2.0 * c->lora_alpha};
    const eng_lora_pattern_t *rv = pattern_find(c->rank_pattern, c->num_rank_pattern, name,
                                                gate_up_rewrite ? &r2 : NULL);
    const eng_lora_pattern_t *av = pattern_find(c->alpha_pattern, c->num_alpha_pattern, name,
                                                gate_up_rewrite ? &a2 : NULL);
    *r = rv ? (int)rv->value : c->r;
    *alpha = av ? av->value : c->lora_alpha;
    if (rank_key) *rank_key = !rv ? NULL : rv == &r2 ? k_rewrite_key : rv->key;
}

bool eng_lora_config_names(const eng_lora_config_t *c, const char *leaf, const char *const *probes, int num_probes) {
    const size_t ln = strlen(leaf);
    for (int i = 0; i < c->num_target_modules; i++) {
        const char *t = c->target_modules[i];
        const size_t tn = strlen(t);
        if (strcmp(t, "all-linear") == 0 || strcmp(t, leaf) == 0) return true;
        if (tn > ln && t[tn - ln - 1] == '.' && strcmp(t + tn - ln, leaf) == 0) return true;
    }
    if (!c->target_regex) return false;
    if (strcmp(c->target_regex, "all-linear") == 0) return true;
    size_t n = strlen(c->target_regex) + 8;
    char *anch = malloc(n);
    MT_CHECK_ALLOC(anch, "LoRA target regex");
    snprintf(anch, n, "^(%s)$", c->target_regex);
    regex_t re;
    const bool ok = regcomp(&re, anch, REG_EXTENDED | REG_NOSUB) == 0;
    free(anch);
    bool hit = false;
    for (int i = 0; ok && i < num_probes && !hit; i++) hit = regexec(&re, probes[i], 0, NULL, 0) == 0;
    if (ok) regfree(&re);
    return hit;
}

void eng_lora_config_add_pattern(eng_lora_config_t *c, bool rank, const char *key, double value) {
    eng_lora_pattern_t **p = rank ? &c->rank_pattern : &c->alpha_pattern;
    int *n = rank ? &c->num_rank_pattern : &c->num_alpha_pattern;
    eng_lora_pattern_t *grown = realloc(*p, (size_t)(*n + 1) * sizeof **p);
    MT_CHECK_ALLOC(grown, "adapter config pattern");
    *p = grown;
    grown[*n].key = dupstr(key);
    grown[(*n)++].value = value;
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

static json_t *json_patterns(const eng_lora_pattern_t *p, int n, bool rank) {
    json_t *o = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(o, p[i].key, rank ? json_integer((json_int_t)p[i].value) : json_real(p[i].value));
    return o;
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
    if (c->num_rank_pattern)
        json_object_set_new(o, "rank_pattern", json_patterns(c->rank_pattern, c->num_rank_pattern, true));
    if (c->num_alpha_pattern)
        json_object_set_new(o, "alpha_pattern", json_patterns(c->alpha_pattern, c->num_alpha_pattern, false));
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

