/* Decoding: ids -> token strings (special added tokens left out when asked,
 * unknown ids skipped) -> the decoder chain -> joined, as the library's
 * Tokenizer::decode does.  Without a decoder the tokens are joined with
 * spaces, as the library joins them.  Each decoder maps a list of strings
 * to a list of strings (decode_chain). */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

typedef struct {
    char **s;
    size_t *n;
    size_t count, cap;
} strlist_t;

static void list_push(strlist_t *l, const char *s, size_t n) {
    if (l->count == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 64;
        l->s = realloc(l->s, l->cap * sizeof *l->s);
        l->n = realloc(l->n, l->cap * sizeof *l->n);
        TOK_CHECK_ALLOC(l->s && l->n, "decoded tokens");
    }
    char *c = malloc(n + 1);
    TOK_CHECK_ALLOC(c, "decoded token");
    memcpy(c, s, n);
    c[n] = 0;
    l->s[l->count] = c;
    l->n[l->count++] = n;
}

static void list_free(strlist_t *l) {
    for (size_t i = 0; i < l->count; i++) free(l->s[i]);
    free(l->s);
    free(l->n);
    memset(l, 0, sizeof *l);
}

typedef struct {
    char *b;
    size_t n, cap;
} buf_t;

static void buf_put(buf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        b->cap = (b->n + n + 1) * 2;
        b->b = realloc(b->b, b->cap);
        TOK_CHECK_ALLOC(b->b, "decoded text");
    }
    memcpy(b->b + b->n, s, n);
    b->n += n;
    b->b[b->n] = 0;
}

static void dec_bytelevel(strlist_t *in, strlist_t *out) {
    buf_t raw = {0};
    for (size_t i = 0; i < in->count; i++) {
        size_t k;
        char *tmp = malloc(in->n[i] + 1);
        TOK_CHECK_ALLOC(tmp, "decoded token");
        if (tok_bytelevel_unmap(in->s[i], in->n[i], tmp, &k)) buf_put(&raw, tmp, k);
        else buf_put(&raw, in->s[i], in->n[i]);
        free(tmp);
    }
    char *text = NULL;
    size_t n = 0, cap = 0;
    tok_utf8_lossy(raw.b ? raw.b : "", raw.n, &text, &n, &cap);
    list_push(out, text ? text : "", n);
    free(text);
    free(raw.b);
}

static bool byte_token(const char *s, size_t n, uint8_t *b) {
    if (n != 6 || strncmp(s, "<0x", 3) || s[5] != '>') return false;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return false;
        v = v * 16 + d;
    }
    *b = (uint8_t)v;
    return true;
}

static void flush_bytes(buf_t *bytes, strlist_t *out) {
    if (!bytes->n) return;
    if (tok_utf8_check((const uint8_t *)bytes->b, bytes->n) == bytes->n) list_push(out, bytes->b, bytes->n);
    else
        for (size_t k = 0; k < bytes->n; k++) list_push(out, "\xEF\xBF\xBD", 3);
    bytes->n = 0;
}

static void dec_bytefallback(strlist_t *in, strlist_t *out) {
    buf_t bytes = {0};
    for (size_t i = 0; i < in->count; i++) {
        uint8_t b;
        if (byte_token(in->s[i], in->n[i], &b)) {
            buf_put(&bytes, (const char *)&b, 1);
            continue;
        }
        flush_bytes(&bytes, out);
        list_push(out, in->s[i], in->n[i]);
    }
    flush_bytes(&bytes, out);
    free(bytes.b);
}

/* Metaspace: the replacement becomes a space, except in the first token
 * where (when a prefix was prepended while encoding) the library drops every
 * replacement character, not only a leading one. */
static void dec_metaspace(const tok_dec_t *d, strlist_t *in, strlist_t *out) {
    for (size_t i = 0; i < in->count; i++) {
        buf_t b = {0};
        const char *s = in->s[i];
        size_t n = in->n[i];
        buf_put(&b, "", 0);
        for (size_t k = 0; k < n;) {
            bool rep = n - k >= d->content_n && !memcmp(s + k, d->content, d->content_n);
            if (rep) {
                if (!(i == 0 && d->prepend)) buf_put(&b, " ", 1);
                k += d->content_n;
            } else {
                buf_put(&b, s + k, 1);
                k++;
            }
        }
        list_push(out, b.b, b.n);
        free(b.b);
    }
}

/* Strip: up to start leading and stop trailing `content` characters; like
 * the library, the kept length is counted as bytes minus the cuts, in chars
 * (so a token with multi-byte characters may keep its trailing cut). */
static size_t char_len(const char *s, size_t n, size_t at) {
    int len = tok_utf8_len((const uint8_t *)s + at, n - at);
    return len ? (size_t)len : 1;
}

static void dec_strip(const tok_dec_t *d, strlist_t *in, strlist_t *out) {
    for (size_t i = 0; i < in->count; i++) {
        const char *s = in->s[i];
        size_t n = in->n[i], cn = d->content_n, start_cut = 0, stop_cut = 0, at = 0;
        while ((int)start_cut < d->start && n - at >= cn && cn && !memcmp(s + at, d->content, cn)) {
            start_cut++;
            at += cn;
        }
        for (size_t e = n; (int)stop_cut < d->stop && e >= cn && cn && !memcmp(s + e - cn, d->content, cn); e -= cn)
            stop_cut++;
        size_t take = n >= start_cut + stop_cut ? n - start_cut - stop_cut : 0, end = at;
        for (size_t c = 0; c < take && end < n; c++) end += char_len(s, n, end);
        list_push(out, s + at, end - at);
    }
}

static void dec_replace(const tok_dec_t *d, pcre2_match_data *md, strlist_t *in, strlist_t *out) {
    for (size_t i = 0; i < in->count; i++) {
        buf_t b = {0};
        size_t at = 0, ms, me;
        while (tok_find(&d->pat, md, in->s[i], in->n[i], at, &ms, &me)) {
            buf_put(&b, in->s[i] + at, ms - at);
            buf_put(&b, d->content, d->content_n);
            at = me;
        }
        buf_put(&b, in->s[i] + at, in->n[i] - at);
        list_push(out, b.b, b.n);
        free(b.b);
    }
}

static void run_decoder(const tok_dec_t *d, pcre2_match_data *md, strlist_t *in, strlist_t *out) {
    buf_t all = {0};
    switch (d->kind) {
    case TOK_D_BYTELEVEL: dec_bytelevel(in, out); break;
    case TOK_D_BYTEFALLBACK: dec_bytefallback(in, out); break;
    case TOK_D_METASPACE: dec_metaspace(d, in, out); break;
    case TOK_D_STRIP: dec_strip(d, in, out); break;
    case TOK_D_REPLACE: dec_replace(d, md, in, out); break;
    case TOK_D_FUSE:
        buf_put(&all, "", 0);
        for (size_t i = 0; i < in->count; i++) buf_put(&all, in->s[i], in->n[i]);
        list_push(out, all.b, all.n);
        free(all.b);
        break;
    }
}

mt_status_t text_tokenizer_decode(const text_tokenizer_t *t, const int32_t *ids, size_t n, bool skip_special,
                                  char **text, size_t *len, mt_error_t *err) {
    (void)err;
    strlist_t a = {0}, b = {0};
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->id_str[id] || (skip_special && t->id_special[id])) continue;
        list_push(&a, t->id_str[id], t->id_len[id]);
    }
    pcre2_match_data *md = pcre2_match_data_create(8, NULL);
    TOK_CHECK_ALLOC(md, "regex match data");
    for (size_t k = 0; k < t->n_dec; k++) {
        run_decoder(&t->dec[k], md, &a, &b);
        list_free(&a);
        a = b;
        memset(&b, 0, sizeof b);
    }
    pcre2_match_data_free(md);
    buf_t out = {0};
    buf_put(&out, "", 0);
    for (size_t i = 0; i < a.count; i++) {
        if (i && !t->has_decoder) buf_put(&out, " ", 1);
        buf_put(&out, a.s[i], a.n[i]);
    }
    list_free(&a);
    *text = out.b;
    *len = out.n;
    return MT_OK;
}
