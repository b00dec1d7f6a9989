/* tokenizer.json's BPE model, added tokens and post-processor, and the
 * regex compiler the patterns share. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

/* Oniguruma's \s (and so the library's) is Unicode White_Space; PCRE2's,
 * even with UCP, leaves out U+0085.  Rewrite \s and \S to the property. */
pcre2_code *tok_regex_compile(const char *pattern, size_t n, const char *where, mt_error_t *err) {
    char *pc = malloc(n * 16 + 1);
    TOK_CHECK_ALLOC(pc, "regex");
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (pattern[i] == '\\' && i + 1 < n && (pattern[i + 1] == 's' || pattern[i + 1] == 'S')) {
            k += (size_t)sprintf(pc + k, "\\%c{White_Space}", pattern[i + 1] == 's' ? 'p' : 'P');
            i++;
        } else if (pattern[i] == '\\' && i + 1 < n) {
            pc[k++] = pattern[i++];
            pc[k++] = pattern[i];
        } else {
            pc[k++] = pattern[i];
        }
    }
    int code;
    PCRE2_SIZE off;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pc, k, PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &off, NULL);
    free(pc);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: regex /%.*s/ does not compile at offset %zu: %s", where, (int)n,
                     pattern, (size_t)off, (const char *)msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* best effort: interpreted when JIT is unavailable */
    return re;
}

static void set_id(text_tokenizer_t *t, int32_t id, const char *s, size_t n) {
    if (id >= t->n_ids) {
        int32_t cap = t->n_ids ? t->n_ids : 1024;
        while (cap <= id) cap *= 2;
        t->id_str = realloc(t->id_str, (size_t)cap * sizeof *t->id_str);
        t->id_len = realloc(t->id_len, (size_t)cap * sizeof *t->id_len);
        t->id_special = realloc(t->id_special, (size_t)cap);
        TOK_CHECK_ALLOC(t->id_str && t->id_len && t->id_special, "token table");
        for (int32_t i = t->n_ids; i < cap; i++) {
            t->id_str[i] = NULL;
            t->id_len[i] = 0;
            t->id_special[i] = 0;
        }
        t->n_ids = cap;
    }
    free(t->id_str[id]);
    t->id_str[id] = malloc(n + 1);
    TOK_CHECK_ALLOC(t->id_str[id], "token string");
    memcpy(t->id_str[id], s, n);
    t->id_str[id][n] = 0;
    t->id_len[id] = (uint32_t)n;
}

static mt_status_t load_vocab(text_tokenizer_t *t, json_t *vocab, char *buf, mt_error_t *err) {
    const char *key;
    json_t *v;
    tok_strmap_init(&t->vocab, json_object_size(vocab));
    tok_strmap_init(&t->by_string, json_object_size(vocab) + 64);
    json_object_foreach(vocab, key, v) {
        json_int_t id = json_integer_value(v);
        if (!json_is_integer(v) || id < 0 || id >= INT32_MAX / 2)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: model.vocab[\"%s\"]: expected a token id", t->what, key);
        size_t n = strlen(key), bn;
        set_id(t, (int32_t)id, key, n);
        tok_strmap_put(&t->by_string, key, n, (int32_t)id);
        if (!t->byte_level) tok_strmap_put(&t->vocab, key, n, (int32_t)id);
        else if (tok_bytelevel_unmap(key, n, buf, &bn)) tok_strmap_put(&t->vocab, buf, bn, (int32_t)id);
        if (n == 6 && !strncmp(key, "<0x", 3) && key[5] == '>') {
            unsigned b;
            if (sscanf(key + 3, "%2X", &b) == 1) t->byte_ids[b] = (int32_t)id;
        }
    }
    return MT_OK;
}

static mt_status_t load_merges(text_tokenizer_t *t, json_t *merges, mt_error_t *err) {
    size_t i;
    json_t *m;
    tok_pairmap_init(&t->merges, json_array_size(merges));
    char *joined = NULL;
    size_t cap = 0;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t an, bn;
        if (json_is_string(m)) {
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp) {
                free(joined);
                return mt_error_set(err, MT_ERR_FORMAT, "%s: model.merges[%zu]: \"%s\" is not \"a b\"", t->what, i, a);
            }
            an = (size_t)(sp - a);
            b = sp + 1;
            bn = strlen(b);
        } else if (json_array_size(m) == 2 && json_is_string(json_array_get(m, 0))) {
            a = json_string_value(json_array_get(m, 0));
            an = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            bn = json_string_length(json_array_get(m, 1));
        } else {
            free(joined);
            return mt_error_set(err, MT_ERR_FORMAT, "%s: model.merges[%zu]: expected \"a b\" or [a, b]", t->what, i);
        }
        if (an + bn + 1 > cap) {
            cap = (an + bn + 1) * 2;
            joined = realloc(joined, cap);
            TOK_CHECK_ALLOC(joined, "merge");
        }
        memcpy(joined, a, an);
        memcpy(joined + an, b, bn);
        int32_t ia = tok_strmap_get(&t->by_string, a, an), ib = tok_strmap_get(&t->by_string, b, bn);
        int32_t id = tok_strmap_get(&t->by_string, joined, an + bn);
        if (ia < 0 || ib < 0 || id < 0) {
            free(joined);
            return mt_error_set(err, MT_ERR_FORMAT, "%s: model.merges[%zu]: \"%.*s\" + \"%.*s\" is not in the "
                                "vocabulary", t->what, i, (int)an, a, (int)bn, b);
        }
        tok_pairmap_put(&t->merges, ia, ib, (int32_t)i, id);
    }
    free(joined);
    return MT_OK;
}

mt_status_t tok_load_model(text_tokenizer_t *t, json_t *model, mt_error_t *err) {
    const char *ty = json_string_value(json_object_get(model, "type"));
    if (!json_is_object(model))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: model: expected an object", t->what);
    if (ty && strcmp(ty, "BPE"))
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: model: type \"%s\" is not supported: moetune's tokenizer "
                            "implements BPE models only (WordPiece and Unigram are refused)", t->what, ty);
    json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
    if (!json_is_object(vocab) || !json_is_array(merges))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: model: expected a BPE \"vocab\" object and \"merges\" array",
                            t->what);
    const char *bad[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++)
        if (json_is_string(json_object_get(model, bad[i])))
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: model.%s is not supported", t->what, bad[i]);
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) != 0.0)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: model.dropout is not supported (encoding would be random)",
                            t->what);
    t->byte_fallback = json_is_true(json_object_get(model, "byte_fallback"));
    t->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    size_t longest = 0;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) if (strlen(key) > longest) longest = strlen(key);
    char *buf = malloc(longest + 1);
    TOK_CHECK_ALLOC(buf, "vocabulary");
    mt_status_t st = load_vocab(t, vocab, buf, err);
    free(buf);
    if (st) return st;
    json_t *unk = json_object_get(model, "unk_token");
    t->unk_id = json_is_string(unk) ? tok_strmap_get(&t->by_string, json_string_value(unk), json_string_length(unk))
                                    : -1;
    if (!t->byte_fallback)
        for (int b = 0; b < 256; b++) t->byte_ids[b] = -1;
    return load_merges(t, merges, err);
}

mt_status_t tok_load_added(text_tokenizer_t *t, json_t *list, mt_error_t *err) {
    size_t i;
    json_t *a;
    tok_trie_init(&t->trie_raw);
    tok_trie_init(&t->trie_norm);
    if (!json_is_array(list)) return MT_OK;
    t->added = calloc(json_array_size(list) + 1, sizeof *t->added);
    TOK_CHECK_ALLOC(t->added, "added tokens");
    json_array_foreach(list, i, a) {
        json_t *c = json_object_get(a, "content"), *id = json_object_get(a, "id");
        if (!json_is_string(c) || !json_is_integer(id) || json_integer_value(id) < 0 ||
            json_integer_value(id) >= INT32_MAX / 2)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: added_tokens[%zu]: expected \"id\" and \"content\"",
                                t->what, i);
        tok_added_t *d = &t->added[t->n_added++];
        d->n = json_string_length(c);
        d->content = malloc(d->n + 1);
        TOK_CHECK_ALLOC(d->content, "added token");
        memcpy(d->content, json_string_value(c), d->n + 1);
        d->id = (int32_t)json_integer_value(id);
        d->special = json_is_true(json_object_get(a, "special"));
        d->lstrip = json_is_true(json_object_get(a, "lstrip"));
        d->rstrip = json_is_true(json_object_get(a, "rstrip"));
        d->single_word = json_is_true(json_object_get(a, "single_word"));
        json_t *norm = json_object_get(a, "normalized");
        d->normalized = json_is_boolean(norm) ? json_is_true(norm) : !d->special;
        set_id(t, d->id, d->content, d->n);
        t->id_special[d->id] = d->special;
        tok_strmap_put(&t->by_string, d->content, d->n, d->id);
    }
    /* special tokens first, as the library builds its matchers */
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < t->n_added; k++) {
            tok_added_t *d = &t->added[k];
            if (d->special != (pass == 0)) continue;
            if (d->normalized) {
                d->match = tok_normalize_string(t, d->content, d->n, &d->match_n);
                tok_trie_add(&t->trie_norm, d->match, d->match_n, (int32_t)k);
            } else {
                tok_trie_add(&t->trie_raw, d->content, d->n, (int32_t)k);
            }
        }
    return MT_OK;
}

static mt_status_t template_ids(const text_tokenizer_t *t, json_t *tpl, json_t *specials, const char *path,
                                tok_post_t *p, mt_error_t *err) {
    size_t i;
    json_t *item;
    bool after = false;
    json_array_foreach(tpl, i, item) {
        if (json_object_get(item, "Sequence")) {
            after = true;
            continue;
        }
        const char *name = json_string_value(json_object_get(json_object_get(item, "SpecialToken"), "id"));
        json_t *ids = json_object_get(json_object_get(specials, name ? name : ""), "ids");
        if (!name || !json_is_array(ids))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.single[%zu]: a special token missing from "
                                "special_tokens", t->what, path, i);
        size_t k;
        json_t *id;
        json_array_foreach(ids, k, id) {
            int32_t **arr = after ? &p->after : &p->before;
            size_t *n = after ? &p->n_after : &p->n_before;
            *arr = realloc(*arr, (*n + 1) * sizeof **arr);
            TOK_CHECK_ALLOC(*arr, "template");
            (*arr)[(*n)++] = (int32_t)json_integer_value(id);
        }
    }
    return MT_OK;
}

static bool get_bool_default(json_t *j, const char *key, bool dflt) {
    json_t *b = json_object_get(j, key);
    return json_is_boolean(b) ? json_is_true(b) : dflt;
}

mt_status_t tok_load_post(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err) {
    if (!j || json_is_null(j)) return MT_OK;
    const char *ty = json_string_value(json_object_get(j, "type"));
    if (ty && !strcmp(ty, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(j, "processors"), i, e) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.processors[%zu]", path, i);
            mt_status_t st = tok_load_post(t, e, sub, err);
            if (st) return st;
        }
        return MT_OK;
    }
    tok_post_t p = {0};
    p.trim_offsets = get_bool_default(j, "trim_offsets", true);
    p.add_prefix_space = get_bool_default(j, "add_prefix_space", true);
    if (ty && !strcmp(ty, "ByteLevel")) p.kind = TOK_POST_BYTELEVEL;
    else if (ty && !strcmp(ty, "TemplateProcessing")) {
        p.kind = TOK_POST_TEMPLATE;
        mt_status_t st = template_ids(t, json_object_get(j, "single"), json_object_get(j, "special_tokens"), path, &p,
                                      err);
        if (st) return st;
    } else if (ty && !strcmp(ty, "RobertaProcessing")) {
        p.kind = TOK_POST_ROBERTA;
        p.before = malloc(sizeof *p.before);
        p.after = malloc(sizeof *p.after);
        TOK_CHECK_ALLOC(p.before && p.after, "post-processor");
        p.before[0] = (int32_t)json_integer_value(json_array_get(json_object_get(j, "cls"), 1));
        p.after[0] = (int32_t)json_integer_value(json_array_get(json_object_get(j, "sep"), 1));
        p.n_before = p.n_after = 1;
    } else {
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: %s: type \"%s\" is not supported", t->what, path,
                            ty ? ty : "(missing)");
    }
    t->post = realloc(t->post, (t->n_post + 1) * sizeof *t->post);
    TOK_CHECK_ALLOC(t->post, "post-processors");
    t->post[t->n_post++] = p;
    return MT_OK;
}
