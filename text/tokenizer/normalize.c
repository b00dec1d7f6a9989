/* Normalizers, with the library's alignments (each output byte keeps the
 * original range of the input character it came from):
 *   - Prepend: the prefix takes the first character's range (nothing is
 *     prepended to an empty string);
 *   - Replace: the content takes the range of the match's last byte;
 *   - NFC/NFD/NFKC/NFKD (utf8proc): the text is cut before each character
 *     that cannot interact with what precedes it (ASCII, or a starter with
 *     no decomposition that never composes as a second character), each
 *     chunk is normalized on its own (which gives the same text as the whole)
 *     and each output character takes the range of the input character its
 *     decomposition starts in: a composed character the range of its base,
 *     a ligature's letters that of the ligature, as the library's alignments
 *     do.  (The library's Hangul alignments can point past the text; those
 *     are not followed.) */
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "text/tokenizer/tok_impl.h"

static bool chunk_boundary(uint32_t c) {
    if (c < 0x80) return true;
    if ((c >= 0x1100 && c <= 0x11FF) || (c >= 0xAC00 && c <= 0xD7A3)) return false; /* Hangul */
    const utf8proc_property_t *p = utf8proc_get_property((utf8proc_int32_t)c);
    bool second = p->comb_index != UINT16_MAX && p->comb_index >= 0x8000;
    return p->combining_class == 0 && !second && p->decomp_seqindex == UINT16_MAX;
}

static utf8proc_option_t unicode_options(tok_norm_kind_t k) {
    switch (k) {
    case TOK_NFC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE;
    case TOK_NFD: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE;
    case TOK_NFKC: return UTF8PROC_STABLE | UTF8PROC_COMPOSE | UTF8PROC_COMPAT;
    default: return UTF8PROC_STABLE | UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT;
    }
}

static size_t decomposed_len(uint32_t c, utf8proc_option_t opt) {
    utf8proc_int32_t buf[32];
    int last = 0;
    utf8proc_ssize_t k = utf8proc_decompose_char((utf8proc_int32_t)c, buf, 32, opt, &last);
    return k > 0 ? (size_t)k : 1;
}

/* Appends the normalization of chunk [s, e) of the work buffer. */
static void put_chunk(tok_work_t *w, uint32_t s, uint32_t e, utf8proc_option_t opt) {
    if (e - s <= 4) { /* one character: copy it when it is inert */
        int len;
        uint32_t c = tok_utf8_decode((const uint8_t *)w->b + s, &len);
        if ((uint32_t)len == e - s && chunk_boundary(c)) {
            tok_work_reserve(w, (size_t)len);
            for (uint32_t i = s; i < e; i++) tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
            return;
        }
    }
    utf8proc_uint8_t *out = NULL;
    utf8proc_ssize_t n = utf8proc_map((const utf8proc_uint8_t *)w->b + s, (utf8proc_ssize_t)(e - s), &out, opt);
    MT_CHECK(n >= 0, "utf8proc could not normalize valid UTF-8: %s", utf8proc_errmsg(n));
    tok_work_reserve(w, (size_t)n);
    /* Output character j maps to the input character whose decomposition
     * holds the start of j's decomposition, both counted along the stream of
     * decomposed code points. */
    utf8proc_option_t dopt = (opt & UTF8PROC_COMPAT) | UTF8PROC_DECOMPOSE;
    uint32_t in_at = s, in_next = s;
    size_t in_end = 0, out_pos = 0;
    for (utf8proc_ssize_t j = 0; j < n;) {
        int olen, ilen;
        uint32_t c = tok_utf8_decode(out + j, &olen);
        while (out_pos >= in_end && in_next < e) {
            in_at = in_next;
            uint32_t ic = tok_utf8_decode((const uint8_t *)w->b + in_next, &ilen);
            in_end += decomposed_len(ic, dopt);
            in_next += (uint32_t)ilen;
        }
        for (int k = 0; k < olen; k++)
            tok_work_put(w, (char)out[j + k], w->o0[in_at], w->o1[in_at], w->data_mask[in_at]);
        out_pos += decomposed_len(c, dopt);
        j += olen;
    }
    free(out);
}

static tok_range_t norm_unicode(tok_work_t *w, tok_range_t r, tok_norm_kind_t kind) {
    utf8proc_option_t opt = unicode_options(kind);
    uint32_t out_s = (uint32_t)w->n;
    uint32_t i = r.s;
    while (i < r.e) {
        if ((uint8_t)w->b[i] < 0x80 && (i + 1 == r.e || (uint8_t)w->b[i + 1] < 0x80)) {
            tok_work_reserve(w, 1);
            tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
            i++;
            continue;
        }
        uint32_t e = i;
        int len;
        tok_utf8_decode((const uint8_t *)w->b + e, &len);
        e += (uint32_t)len;
        while (e < r.e && !chunk_boundary(tok_utf8_decode((const uint8_t *)w->b + e, &len))) e += (uint32_t)len;
        put_chunk(w, i, e, opt);
        i = e;
    }
    return (tok_range_t){out_s, (uint32_t)w->n};
}

bool tok_find(const tok_pattern_t *p, pcre2_match_data *md, const char *b, size_t n, size_t from, size_t *ms,
              size_t *me) {
    while (from < n) {
        if (!p->re) {
            const char *hit = p->lit_n ? memmem(b + from, n - from, p->lit, p->lit_n) : NULL;
            if (!hit) return false;
            *ms = (size_t)(hit - b);
            *me = *ms + p->lit_n;
            return true;
        }
        int rc = pcre2_match(p->re, (PCRE2_SPTR)b, n, from, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc < 0) return false;
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        if (ov[1] > ov[0]) {
            *ms = ov[0];
            *me = ov[1];
            return true;
        }
        /* an empty match: go on after it, one character further */
        from = ov[0] + 1;
        while (from < n && ((uint8_t)b[from] & 0xC0) == 0x80) from++;
    }
    return false;
}

static tok_range_t norm_replace(tok_work_t *w, tok_range_t r, const tok_norm_t *nm) {
    uint32_t out_s = (uint32_t)w->n;
    size_t at = 0, ms, me, n = r.e - r.s;
    while (tok_find(&nm->pat, w->md, w->b + r.s, n, at, &ms, &me)) {
        tok_work_reserve(w, (ms - at) + nm->content_n);
        for (size_t i = r.s + at; i < r.s + ms; i++) tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
        uint32_t last = r.s + (uint32_t)me - 1;
        for (size_t k = 0; k < nm->content_n; k++)
            tok_work_put(w, nm->content[k], w->o0[last], w->o1[last], w->data_mask[last]);
        at = me;
    }
    tok_work_reserve(w, n - at);
    for (size_t i = r.s + at; i < r.e; i++) tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
    return (tok_range_t){out_s, (uint32_t)w->n};
}

static tok_range_t norm_prepend(tok_work_t *w, tok_range_t r, const char *p, size_t pn) {
    if (r.e == r.s) return r;
    uint32_t out_s = (uint32_t)w->n;
    tok_work_reserve(w, pn + (r.e - r.s));
    for (size_t k = 0; k < pn; k++) tok_work_put(w, p[k], w->o0[r.s], w->o1[r.s], w->data_mask[r.s]);
    for (uint32_t i = r.s; i < r.e; i++) tok_work_put(w, w->b[i], w->o0[i], w->o1[i], w->data_mask[i]);
    return (tok_range_t){out_s, (uint32_t)w->n};
}

tok_range_t tok_normalize(const text_tokenizer_t *t, tok_work_t *w, tok_range_t r) {
    for (size_t i = 0; i < t->n_norm; i++) {
        const tok_norm_t *nm = &t->norm[i];
        switch (nm->kind) {
        case TOK_N_PREPEND: r = norm_prepend(w, r, nm->content, nm->content_n); break;
        case TOK_N_REPLACE: r = norm_replace(w, r, nm); break;
        default: r = norm_unicode(w, r, nm->kind); break;
        }
    }
    return r;
}
