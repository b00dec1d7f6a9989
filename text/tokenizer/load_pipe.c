/* tokenizer.json's normalizer, pre_tokenizer, decoder and post_processor.
 * Sequences are flattened into the tokenizer's arrays.  A type this package
 * does not implement is refused with its JSON path and type name. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

#define GROW_ONE(arr, n, what)                              \
    do {                                                    \
        (arr) = realloc((arr), ((n) + 1) * sizeof *(arr));  \
        TOK_CHECK_ALLOC((arr), (what));                      \
        memset(&(arr)[(n)], 0, sizeof *(arr));              \
    } while (0)

static mt_status_t unsupported(const text_tokenizer_t *t, const char *path, const char *type, mt_error_t *err) {
    return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: %s: type \"%s\" is not supported (docs/tokenizers.md lists "
                        "what is)", t->what, path, type);
}

static const char *type_of(json_t *j) {
    json_t *ty = json_object_get(j, "type");
    return json_is_string(ty) ? json_string_value(ty) : NULL;
}

static char *dup_string(json_t *s, size_t *n) {
    *n = json_string_length(s);
    char *c = malloc(*n + 1);
    TOK_CHECK_ALLOC(c, "tokenizer string");
    memcpy(c, json_string_value(s), *n);
    c[*n] = 0;
    return c;
}

/* A string member; MT_ERR_FORMAT naming path.key when it is missing. */
static mt_status_t get_string(const text_tokenizer_t *t, json_t *j, const char *key, const char *path, char **out,
                              size_t *n, mt_error_t *err) {
    json_t *s = json_object_get(j, key);
    if (!json_is_string(s))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.%s: expected a string", t->what, path, key);
    *out = dup_string(s, n);
    return MT_OK;
}

static bool get_bool(json_t *j, const char *key, bool dflt) {
    json_t *b = json_object_get(j, key);
    return json_is_boolean(b) ? json_is_true(b) : dflt;
}

void tok_pattern_free(tok_pattern_t *p) {
    free(p->lit);
    if (p->re) pcre2_code_free(p->re);
    memset(p, 0, sizeof *p);
}

static mt_status_t load_pattern(const text_tokenizer_t *t, json_t *j, const char *path, tok_pattern_t *p,
                                mt_error_t *err) {
    json_t *pat = json_object_get(j, "pattern");
    json_t *s = json_object_get(pat, "String"), *re = json_object_get(pat, "Regex");
    if (json_is_string(s)) {
        p->lit = dup_string(s, &p->lit_n);
        return MT_OK;
    }
    if (json_is_string(re)) {
        char where[512];
        snprintf(where, sizeof where, "%s: %s.pattern.Regex", t->what, path);
        p->re = tok_regex_compile(json_string_value(re), json_string_length(re), where, err);
        return p->re ? MT_OK : err->code;
    }
    return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.pattern: expected {\"String\": ...} or {\"Regex\": ...}",
                        t->what, path);
}

mt_status_t tok_load_normalizer(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err) {
    if (json_is_null(j) || !j) return MT_OK;
    const char *ty = type_of(j);
    if (!ty) return mt_error_set(err, MT_ERR_FORMAT, "%s: %s: expected an object with a \"type\"", t->what, path);
    if (!strcmp(ty, "Sequence")) {
        json_t *list = json_object_get(j, "normalizers");
        size_t i;
        json_t *e;
        json_array_foreach(list, i, e) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.normalizers[%zu]", path, i);
            mt_status_t st = tok_load_normalizer(t, e, sub, err);
            if (st) return st;
        }
        return MT_OK;
    }
    tok_norm_kind_t kind;
    if (!strcmp(ty, "NFC")) kind = TOK_NFC;
    else if (!strcmp(ty, "NFD")) kind = TOK_NFD;
    else if (!strcmp(ty, "NFKC")) kind = TOK_NFKC;
    else if (!strcmp(ty, "NFKD")) kind = TOK_NFKD;
    else if (!strcmp(ty, "Prepend")) kind = TOK_N_PREPEND;
    else if (!strcmp(ty, "Replace")) kind = TOK_N_REPLACE;
    else return unsupported(t, path, ty, err);
    GROW_ONE(t->norm, t->n_norm, "normalizers");
    tok_norm_t *n = &t->norm[t->n_norm++];
    n->kind = kind;
    if (kind == TOK_N_PREPEND) return get_string(t, j, "prepend", path, &n->content, &n->content_n, err);
    if (kind == TOK_N_REPLACE) {
        mt_status_t st = load_pattern(t, j, path, &n->pat, err);
        return st ? st : get_string(t, j, "content", path, &n->content, &n->content_n, err);
    }
    return MT_OK;
}

static mt_status_t load_behavior(const text_tokenizer_t *t, json_t *j, const char *path, tok_behavior_t *b,
                                 mt_error_t *err) {
    const char *s = json_string_value(json_object_get(j, "behavior"));
    static const char *const names[] = {"Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; s && i < 5; i++)
        if (!strcmp(s, names[i])) {
            *b = (tok_behavior_t)i;
            return MT_OK;
        }
    return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.behavior: \"%s\" is not one of Isolated, Removed, "
                        "MergedWithPrevious, MergedWithNext, Contiguous", t->what, path, s ? s : "(missing)");
}

/* Metaspace's replacement and prepend_scheme (or the older add_prefix_space). */
static mt_status_t load_metaspace(const text_tokenizer_t *t, json_t *j, const char *path, char *repl, size_t *repl_n,
                                  tok_prepend_t *scheme, mt_error_t *err) {
    json_t *r = json_object_get(j, "replacement");
    if (!json_is_string(r) || json_string_length(r) == 0 || json_string_length(r) > 4)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.replacement: expected one character", t->what, path);
    *repl_n = json_string_length(r);
    memcpy(repl, json_string_value(r), *repl_n);
    const char *ps = json_string_value(json_object_get(j, "prepend_scheme"));
    *scheme = get_bool(j, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    if (ps && !strcmp(ps, "first")) *scheme = TOK_PREPEND_FIRST;
    else if (ps && !strcmp(ps, "never")) *scheme = TOK_PREPEND_NEVER;
    else if (ps && !strcmp(ps, "always")) *scheme = TOK_PREPEND_ALWAYS;
    else if (ps) return mt_error_set(err, MT_ERR_FORMAT, "%s: %s.prepend_scheme: \"%s\"", t->what, path, ps);
    return MT_OK;
}

/* GPT-2's pre-tokenizer regex, which ByteLevel(use_regex=true) applies. */
#define TOK_GPT2_REGEX "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+"

mt_status_t tok_load_pretokenizer(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err) {
    if (json_is_null(j) || !j) return MT_OK;
    const char *ty = type_of(j);
    if (!ty) return mt_error_set(err, MT_ERR_FORMAT, "%s: %s: expected an object with a \"type\"", t->what, path);
    if (!strcmp(ty, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(j, "pretokenizers"), i, e) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.pretokenizers[%zu]", path, i);
            mt_status_t st = tok_load_pretokenizer(t, e, sub, err);
            if (st) return st;
        }
        return MT_OK;
    }
    if (t->n_pretok && t->pretok[t->n_pretok - 1].kind == TOK_P_BYTELEVEL)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: %s: a pre-tokenizer after ByteLevel is not supported",
                            t->what, path);
    tok_pretok_t p = {0};
    mt_status_t st = MT_OK;
    if (!strcmp(ty, "Split")) {
        p.kind = TOK_P_SPLIT;
        p.invert = get_bool(j, "invert", false);
        st = load_behavior(t, j, path, &p.behavior, err);
        if (!st) st = load_pattern(t, j, path, &p.pat, err);
    } else if (!strcmp(ty, "ByteLevel")) {
        p.kind = TOK_P_BYTELEVEL;
        p.add_prefix_space = get_bool(j, "add_prefix_space", true);
        if (get_bool(j, "use_regex", true))
            p.pat.re = tok_regex_compile(TOK_GPT2_REGEX, strlen(TOK_GPT2_REGEX), "GPT-2's regex", err);
        if (get_bool(j, "use_regex", true) && !p.pat.re) st = err->code;
        t->byte_level = true;
    } else if (!strcmp(ty, "Digits")) {
        p.kind = TOK_P_DIGITS;
        p.individual_digits = get_bool(j, "individual_digits", false);
    } else if (!strcmp(ty, "Metaspace")) {
        p.kind = TOK_P_METASPACE;
        p.split = get_bool(j, "split", true);
        st = load_metaspace(t, j, path, p.repl, &p.repl_n, &p.prepend_scheme, err);
    } else {
        return unsupported(t, path, ty, err);
    }
    GROW_ONE(t->pretok, t->n_pretok, "pre-tokenizers");
    t->pretok[t->n_pretok++] = p;
    return st;
}

mt_status_t tok_load_decoder(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err) {
    if (json_is_null(j) || !j) return MT_OK;
    t->has_decoder = true;
    const char *ty = type_of(j);
    if (!ty) return mt_error_set(err, MT_ERR_FORMAT, "%s: %s: expected an object with a \"type\"", t->what, path);
    if (!strcmp(ty, "Sequence")) {
        size_t i;
        json_t *e;
        json_array_foreach(json_object_get(j, "decoders"), i, e) {
            char sub[256];
            snprintf(sub, sizeof sub, "%s.decoders[%zu]", path, i);
            mt_status_t st = tok_load_decoder(t, e, sub, err);
            if (st) return st;
        }
        return MT_OK;
    }
    static const char *const names[] = {"ByteLevel", "Metaspace", "ByteFallback", "Fuse", "Strip", "Replace"};
    int kind = -1;
    for (int i = 0; i < 6; i++)
        if (!strcmp(ty, names[i])) kind = i;
    if (kind < 0) return unsupported(t, path, ty, err);
    GROW_ONE(t->dec, t->n_dec, "decoders");
    tok_dec_t *d = &t->dec[t->n_dec++];
    d->kind = (tok_dec_kind_t)kind;
    if (d->kind == TOK_D_METASPACE) {
        char repl[8];
        size_t n = 0;
        tok_prepend_t scheme;
        mt_status_t st = load_metaspace(t, j, path, repl, &n, &scheme, err);
        if (st) return st;
        d->content = malloc(n + 1);
        TOK_CHECK_ALLOC(d->content, "decoder");
        memcpy(d->content, repl, n);
        d->content_n = n;
        d->prepend = scheme != TOK_PREPEND_NEVER;
    } else if (d->kind == TOK_D_STRIP) {
        d->start = (int)json_integer_value(json_object_get(j, "start"));
        d->stop = (int)json_integer_value(json_object_get(j, "stop"));
        return get_string(t, j, "content", path, &d->content, &d->content_n, err);
    } else if (d->kind == TOK_D_REPLACE) {
        mt_status_t st = load_pattern(t, j, path, &d->pat, err);
        return st ? st : get_string(t, j, "content", path, &d->content, &d->content_n, err);
    }
    return MT_OK;
}
