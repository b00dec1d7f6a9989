/* Text datasets (see text.h): the tokenizer and the chat template read from
 * the model's folder, and the rows that need no template: plain text,
 * Alpaca instructions and labelled segments.  Conversations are chat.c's.
 *
 * Design notes:
 * - Special tokens come from tokenizer_config.json as transformers reads
 *   them (a string, or an AddedToken object with "content"); the template
 *   sees the same names (bos_token, eos_token, ...), as transformers passes
 *   its special_tokens_map to apply_chat_template.
 * - The template: chat_template.jinja beside the tokenizer wins over
 *   tokenizer_config.json's chat_template, as in transformers 5; a
 *   tokenizer_config whose chat_template is a list of named templates uses
 *   the one named "default". */
#include "engine/data/text.h"

#include "engine/data/chat.h"
#include "engine/data/prepared.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"

#define IGNORE_INDEX (-100)
#define CONFIG_MAX_BYTES (64u << 20)

static const char *const k_special_names[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                              "sep_token", "cls_token", "mask_token"};

mt_status_t eng_text_encode(const eng_text_t *t, const char *text, size_t len, bool add_special, const char *where,
                            eng_text_example_t *ex, mt_error_t *err) {
    eng_text_example_free(ex);
    return eng_text_append(t, text, len, NULL, NULL, add_special, true, ex, where, err);
}

const char *eng_text_token(const eng_text_t *t, int32_t id) { return text_tokenizer_token(t->tok, id); }

int32_t eng_text_vocab_size(const eng_text_t *t) { return text_tokenizer_vocab_size(t->tok); }

/* ---- opening ------------------------------------------------------------- */

/* A special token as tokenizer_config.json writes it: "text" or {"content": "text", ...}. */
static const char *token_text(const json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v) && json_is_string(json_object_get(v, "content")))
        return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* The template text: chat_template.jinja, else tokenizer_config.json's
 * chat_template (a string, or a list of {name, template}: "default"). */
static mt_status_t template_source(const char *dir, json_t *cfg, const char *cfg_path, char **src, char *origin,
                                   size_t cap, mt_error_t *err) {
    char path[2200];
    snprintf(path, sizeof path, "%s/chat_template.jinja", dir);
    struct stat sb;
    if (stat(path, &sb) == 0) {
        size_t len;
        snprintf(origin, cap, "%s", path);
        return mt_read_regular_file(path, "chat template", CONFIG_MAX_BYTES, src, &len, err);
    }
    const json_t *ct = cfg ? json_object_get(cfg, "chat_template") : NULL;
    if (json_is_array(ct)) {
        size_t i;
        const json_t *e;
        const json_t *found = NULL;
        json_array_foreach(ct, i, e) if (json_is_string(json_object_get(e, "name")) &&
                                         strcmp(json_string_value(json_object_get(e, "name")), "default") == 0) found =
            json_object_get(e, "template");
        ct = found;
    }
    if (!json_is_string(ct))
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: no chat template (neither %s nor a chat_template string in %s); set chat_template: "
                            "to one of %s, or chat_template: jinja with chat_template_jinja",
                            dir, path, cfg_path, text_template_names());
    snprintf(origin, cap, "%s", cfg_path);
    *src = strdup(json_string_value(ct));
    MT_CHECK_ALLOC(*src, "chat template");
    return MT_OK;
}

static void fingerprint_add(eng_text_t *t, const void *p, size_t n) {
    eng_prep_key_t k = {{t->fingerprint[0], t->fingerprint[1]}};
    eng_prep_key_add(&k, p, n);
    t->fingerprint[0] = k.h[0];
    t->fingerprint[1] = k.h[1];
}

/* The bytes of a file the encoding depends on, into the fingerprint
 * (a missing file adds nothing: it is then the same as before). */
static mt_status_t fingerprint_file(eng_text_t *t, const char *path, mt_error_t *err) {
    struct stat sb;
    if (stat(path, &sb) != 0) return MT_OK;
    char *buf;
    size_t len;
    mt_status_t st = mt_read_regular_file(path, "tokenizer file", CONFIG_MAX_BYTES * 8, &buf, &len, err);
    if (st != MT_OK) return st;
    fingerprint_add(t, buf, len);
    free(buf);
    return MT_OK;
}

static mt_status_t open_template(eng_text_t *t, const eng_text_opts_t *o, json_t *cfg, const char *cfg_path,
                                 mt_error_t *err) {
    char *src = NULL, origin[2300];
    mt_status_t st = MT_OK;
    if (strcmp(o->chat_template, "tokenizer_default") == 0) {
        st = template_source(o->tokenizer_dir, cfg, cfg_path, &src, origin, sizeof origin, err);
    } else if (strcmp(o->chat_template, "jinja") == 0) {
        snprintf(origin, sizeof origin, "chat_template_jinja");
        src = strdup(o->chat_template_jinja ? o->chat_template_jinja : "");
        MT_CHECK_ALLOC(src, "chat template");
    } else {
        const char *named = text_template_named(o->chat_template);
        if (!named)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "chat_template: '%s' is not a template moetune knows; expected tokenizer_default, "
                                "jinja or one of %s",
                                o->chat_template, text_template_names());
        snprintf(origin, sizeof origin, "chat_template %s", o->chat_template);
        src = strdup(named);
        MT_CHECK_ALLOC(src, "chat template");
    }
    if (st == MT_OK) st = text_template_parse(src, strlen(src), origin, &t->tmpl, err);
    if (st == MT_OK) fingerprint_add(t, src, strlen(src) + 1);
    free(src);
    return st;
}

/* tokenizer_config.json's special tokens: the template's variables, and
 * the BOS and EOS ids the plain formats add. */
static mt_status_t read_specials(eng_text_t *t, json_t *cfg, const char *cfg_path, mt_error_t *err) {
    t->special = json_object();
    MT_CHECK_ALLOC(t->special, "special tokens");
    t->bos_id = t->eos_id = -1;
    for (size_t i = 0; i < sizeof k_special_names / sizeof *k_special_names; i++) {
        const json_t *v = cfg ? json_object_get(cfg, k_special_names[i]) : NULL;
        if (!v || json_is_null(v)) continue;
        const char *s = token_text(v);
        if (!s)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s is neither a string nor {\"content\": ...}", cfg_path,
                                k_special_names[i]);
        json_object_set_new(t->special, k_special_names[i], json_string(s));
        if (i == 0) t->bos_id = text_tokenizer_token_id(t->tok, s);
        if (i == 1) {
            t->eos_id = text_tokenizer_token_id(t->tok, s);
            snprintf(t->eos_text, sizeof t->eos_text, "%s", s);
        }
    }
    return MT_OK;
}

mt_status_t eng_text_open(const eng_text_opts_t *o, eng_text_t **out, mt_error_t *err) {
    *out = NULL;
    eng_text_t *t = calloc(1, sizeof *t);
    MT_CHECK_ALLOC(t, "text dataset reader");
    t->train_on_inputs = o->train_on_inputs;
    char path[2200], cfg_path[2200];
    snprintf(path, sizeof path, "%s/tokenizer.json", o->tokenizer_dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/tokenizer_config.json", o->tokenizer_dir);
    const eng_prep_key_t k0 = eng_prep_key_start();
    t->fingerprint[0] = k0.h[0];
    t->fingerprint[1] = k0.h[1];
    fingerprint_add(t, &o->train_on_inputs, sizeof o->train_on_inputs);
    mt_status_t st = text_tokenizer_load(path, &t->tok, err);
    if (st == MT_OK) st = fingerprint_file(t, path, err);
    if (st == MT_OK) st = fingerprint_file(t, cfg_path, err);
    json_t *cfg = NULL;
    struct stat sb;
    if (st == MT_OK && stat(cfg_path, &sb) == 0) {
        char *text;
        size_t len;
        st = mt_read_regular_file(cfg_path, "tokenizer config", CONFIG_MAX_BYTES, &text, &len, err);
        if (st == MT_OK) {
            json_error_t je;
            cfg = json_loadb(text, len, 0, &je);
            free(text);
            if (!json_is_object(cfg))
                st = mt_error_set(err, MT_ERR_FORMAT, "%s:%d: not a JSON object (%s)", cfg_path, je.line, je.text);
        }
    }
    if (st == MT_OK) st = read_specials(t, cfg, cfg_path, err);
    if (st == MT_OK && o->need_template) st = open_template(t, o, cfg, cfg_path, err);
    json_decref(cfg);
    if (st != MT_OK) {
        eng_text_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

mt_status_t eng_text_open_for(const eng_run_config_t *rc, const eng_dataset_entry_t *entries, int num_entries,
                              eng_text_t **out, mt_error_t *err) {
    *out = NULL;
    bool need = false, chat = false, completion = false;
    for (int i = 0; i < num_entries; i++) {
        const eng_data_type_t ty = entries[i].type;
        need |= ty == ENG_DATA_CHAT_TEMPLATE || ty == ENG_DATA_ALPACA || ty == ENG_DATA_INPUT_OUTPUT;
        chat |= ty == ENG_DATA_CHAT_TEMPLATE;
        completion |= ty == ENG_DATA_COMPLETION;
    }
    const char *dir = rc->tokenizer_config[0] ? rc->tokenizer_config : rc->base_model;
    char path[2200];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    struct stat sb;
    if (!need && !(completion && stat(path, &sb) == 0)) return MT_OK;
    const eng_text_opts_t o = {.tokenizer_dir = dir, .chat_template = rc->chat_template,
                               .chat_template_jinja = rc->chat_template_jinja,
                               .train_on_inputs = rc->train_on_inputs, .need_template = chat};
    mt_status_t st = eng_text_open(&o, out, err);
    return st == MT_OK ? MT_OK : mt_error_prefix(err, "%s: ", rc->source_path);
}

void eng_text_free(eng_text_t *t) {
    if (!t) return;
    text_tokenizer_free(t->tok);
    text_template_free(t->tmpl);
    json_decref(t->special);
    free(t);
}

/* ---- rows without a template --------------------------------------------- */

/* row[key] as a string; absent, null or another type is an error naming it
 * (optional: absent gives ""). */
static mt_status_t field(const json_t *row, const char *key, bool optional, const char **out, const char *where,
                         mt_error_t *err) {
    const json_t *v = json_object_get(row, key);
    if ((!v || json_is_null(v)) && optional) {
        *out = "";
        return MT_OK;
    }
    if (!json_is_string(v))
        return mt_error_set(err, MT_ERR_DATA, "%s: \"%s\" is %s; expected a string", where, key,
                            v ? "not a string" : "missing");
    *out = json_string_value(v);
    return MT_OK;
}

/* axolotl's _tokenize: with the tokenizer's special tokens, EOS appended
 * unless the text already ends with it; strip_bos drops a leading BOS. */
static mt_status_t encode_part(const eng_text_t *t, const char *s, bool trained, bool add_eos, bool strip_bos,
                               eng_text_example_t *ex, const char *where, mt_error_t *err) {
    const size_t first = ex->n;
    mt_status_t st = eng_text_append(t, s, strlen(s), NULL, NULL, true, trained, ex, where, err);
    if (st != MT_OK) return st;
    if (!trained && !t->train_on_inputs)
        for (size_t i = first; i < ex->n; i++) ex->labels[i] = IGNORE_INDEX;
    if (strip_bos && ex->n > first && t->bos_id >= 0 && ex->ids[first] == t->bos_id) {
        memmove(ex->ids + first, ex->ids + first + 1, (ex->n - first - 1) * sizeof *ex->ids);
        memmove(ex->labels + first, ex->labels + first + 1, (ex->n - first - 1) * sizeof *ex->labels);
        ex->n--;
    }
    if (add_eos && t->eos_id >= 0 && (ex->n == first || ex->ids[ex->n - 1] != t->eos_id))
        eng_text_push(ex, t->eos_id, trained || t->train_on_inputs ? t->eos_id : IGNORE_INDEX);
    return MT_OK;
}

static mt_status_t completion_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row,
                                  const char *where, eng_text_example_t *ex, mt_error_t *err) {
    const char *s;
    mt_status_t st = field(row, d->field, false, &s, where, err);
    if (st != MT_OK) return st;
    ex->split = true;
    return encode_part(t, s, true, true, false, ex, where, err);
}

/* axolotl's Alpaca prompt, with and without an input. */
static mt_status_t alpaca_row(const eng_text_t *t, const json_t *row, const char *where, eng_text_example_t *ex,
                              mt_error_t *err) {
    const char *ins, *in, *out;
    mt_status_t st = field(row, "instruction", false, &ins, where, err);
    if (st == MT_OK) st = field(row, "input", true, &in, where, err);
    if (st == MT_OK) st = field(row, "output", false, &out, where, err);
    if (st != MT_OK) return st;
    const char *head = in[0] ? "Below is an instruction that describes a task, paired with an input that provides "
                               "further context. Write a response that appropriately completes the request.\n\n"
                             : "Below is an instruction that describes a task. Write a response that appropriately "
                               "completes the request.\n\n";
    size_t cap = strlen(head) + strlen(ins) + strlen(in) + 64;
    char *prompt = malloc(cap);
    MT_CHECK_ALLOC(prompt, "Alpaca prompt");
    if (in[0]) snprintf(prompt, cap, "%s### Instruction:\n%s\n\n### Input:\n%s\n\n### Response:\n", head, ins, in);
    else snprintf(prompt, cap, "%s### Instruction:\n%s\n\n### Response:\n", head, ins);
    st = encode_part(t, prompt, false, false, false, ex, where, err);
    free(prompt);
    if (st == MT_OK) st = encode_part(t, out, true, true, true, ex, where, err);
    return st;
}

static mt_status_t input_output_row(const eng_text_t *t, const json_t *row, const char *where,
                                    eng_text_example_t *ex, mt_error_t *err) {
    const json_t *segs = json_object_get(row, "segments");
    if (!json_is_array(segs))
        return mt_error_set(err, MT_ERR_DATA, "%s: \"segments\" is %s; expected a list of {text, label}", where,
                            segs ? "not a list" : "missing");
    size_t i;
    const json_t *s;
    json_array_foreach(segs, i, s) {
        const json_t *text = json_object_get(s, "text"), *label = json_object_get(s, "label");
        if (!json_is_string(text) || !json_is_boolean(label))
            return mt_error_set(err, MT_ERR_DATA, "%s: segments[%zu] is not {\"text\": string, \"label\": bool}", where,
                                i);
        const size_t first = ex->n;
        mt_status_t st = eng_text_append(t, json_string_value(text), json_string_length(text), NULL, NULL, false,
                                         true, ex, where, err);
        if (st != MT_OK) return st;
        if (!json_is_true(label) && !t->train_on_inputs)
            for (size_t k = first; k < ex->n; k++) ex->labels[k] = IGNORE_INDEX;
    }
    return MT_OK;
}

mt_status_t eng_text_row(const eng_text_t *t, const eng_dataset_entry_t *d, const json_t *row, const char *where,
                         eng_text_example_t *ex, mt_error_t *err) {
    eng_text_example_free(ex);
    if (!json_is_object(row)) return mt_error_set(err, MT_ERR_DATA, "%s: expected a JSON object", where);
    switch (d->type) {
    case ENG_DATA_COMPLETION: return completion_row(t, d, row, where, ex, err);
    case ENG_DATA_ALPACA: return alpaca_row(t, row, where, ex, err);
    case ENG_DATA_INPUT_OUTPUT: return input_output_row(t, row, where, ex, err);
    case ENG_DATA_CHAT_TEMPLATE: return eng_text_chat_row(t, d, row, where, ex, err);
    case ENG_DATA_TOKENIZED: break;
    }
    return mt_error_set(err, MT_ERR_DATA, "%s: tokenized rows are not text", where);
}
