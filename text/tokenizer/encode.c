/* The encode pipeline: added tokens on the input, then per piece normalize,
 * normalized added tokens, pre-tokenize, BPE; then the post-processors.
 * Everything allocated for one call lives in a tok_work_t freed at its end,
 * so a loaded tokenizer is never written while encoding. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

char *tok_normalize_string(const text_tokenizer_t *t, const char *s, size_t n, size_t *out_n) {
    tok_work_t w;
    tok_work_init(&w);
    tok_range_t r = tok_normalize(t, &w, tok_work_load(&w, s, 0, (uint32_t)n, NULL));
    char *out = malloc(r.e - r.s + 1);
    TOK_CHECK_ALLOC(out, "normalized added token");
    memcpy(out, w.b + r.s, r.e - r.s);
    out[r.e - r.s] = 0;
    *out_n = r.e - r.s;
    tok_work_free(&w);
    return out;
}

static bool model_encode(const text_tokenizer_t *t, tok_work_t *w, tok_range_t r, text_tokens_t *out) {
    if (r.e == r.s) return true;
    w->nsp = 1;
    w->sp[0] = r;
    tok_pretokenize(t, w);
    for (size_t i = 0; i < w->nsp; i++)
        if (!tok_bpe_encode(t, w, w->sp[i], out)) return false;
    return true;
}

/* One piece of the input between non-normalized added tokens. */
static bool encode_piece(const text_tokenizer_t *t, tok_work_t *w, const char *text, tok_piece_t p,
                         const uint8_t *mask, tok_piece_t **sub, size_t *sub_cap, text_tokens_t *out) {
    tok_range_t r = tok_normalize(t, w, tok_work_load(w, text, p.s, p.e, mask));
    if (t->trie_norm.nodes <= 1) return model_encode(t, w, r, out);
    size_t ns = tok_added_split(t, &t->trie_norm, w->b + r.s, r.e - r.s, mask ? w->data_mask + r.s : NULL, sub,
                                sub_cap);
    for (size_t k = 0; k < ns; k++) {
        tok_piece_t q = (*sub)[k];
        tok_range_t qr = {r.s + q.s, r.s + q.e};
        if (q.id >= 0) tok_tokens_push(out, q.id, w->o0[qr.s], w->o1[qr.e - 1]);
        else if (!model_encode(t, w, qr, out)) return false;
    }
    return true;
}

/* Whitespace characters at the start (end) of text[s, e): an added token's
 * value is the text it matched. */
static uint32_t ws_run(const char *text, uint32_t s, uint32_t e, bool from_end) {
    uint32_t n = 0;
    if (!from_end) {
        while (s < e) {
            int len;
            uint32_t c = tok_utf8_decode((const uint8_t *)text + s, &len);
            if (!(c == 0x120 || tok_is_white_space(c))) break;
            n++;
            s += (uint32_t)len;
        }
        return n;
    }
    while (e > s) {
        uint32_t k = e - 1;
        while (k > s && ((uint8_t)text[k] & 0xC0) == 0x80) k--;
        int len;
        uint32_t c = tok_utf8_decode((const uint8_t *)text + k, &len);
        if (!(c == 0x120 || tok_is_white_space(c))) break;
        n++;
        e = k;
    }
    return n;
}

/* Moves a token's start forward (or its end back) by k characters of the
 * text, not past the other end: the library trims offsets counted in
 * characters (Python's), so a trimmed prefix space that took the range of a
 * 3-byte character removes all 3 bytes.  An end with fewer than k characters
 * before it stays, as the library leaves an end smaller than k. */
static uint32_t step_chars(const char *text, uint32_t s, uint32_t e, uint32_t k, bool forward) {
    if (forward) {
        while (k-- && s < e) {
            int len = tok_utf8_len((const uint8_t *)text + s, e - s);
            s += len ? (uint32_t)len : 1;
        }
        return s;
    }
    uint32_t at = e;
    while (k--) {
        if (at == 0) return e;
        at--;
        while (at > 0 && ((uint8_t)text[at] & 0xC0) == 0x80) at--;
    }
    return at > s ? at : s;
}

/* ByteLevel's trim_offsets, the library's process_offsets. */
static void trim_offsets(const text_tokenizer_t *t, const char *text, bool add_prefix_space, text_tokens_t *out,
                         size_t first, const uint8_t *is_added) {
    for (size_t i = first; i < out->n; i++) {
        int32_t id = out->ids[i];
        uint32_t lead, trail;
        if (is_added[i - first]) {
            lead = ws_run(text, out->start[i], out->end[i], false);
            trail = ws_run(text, out->start[i], out->end[i], true);
        } else {
            lead = t->id_lead_ws[id];
            trail = t->id_trail_ws[id];
        }
        if (lead) {
            bool is_first = i == first || out->start[i] == 0;
            if (is_first && add_prefix_space && lead == 1) lead = 0;
            out->start[i] = step_chars(text, out->start[i], out->end[i], lead, true);
        }
        if (trail) out->end[i] = step_chars(text, out->start[i], out->end[i], trail, false);
    }
}

static void wrap_special(text_tokens_t *out, size_t first, const tok_post_t *p) {
    size_t body = out->n - first;
    for (size_t k = 0; k < p->n_before + p->n_after; k++) tok_tokens_push(out, 0, 0, 0);
    memmove(out->ids + first + p->n_before, out->ids + first, body * sizeof *out->ids);
    memmove(out->start + first + p->n_before, out->start + first, body * sizeof *out->start);
    memmove(out->end + first + p->n_before, out->end + first, body * sizeof *out->end);
    for (size_t k = 0; k < p->n_before; k++) {
        out->ids[first + k] = p->before[k];
        out->start[first + k] = out->end[first + k] = 0;
    }
    for (size_t k = 0; k < p->n_after; k++) {
        size_t at = first + p->n_before + body + k;
        out->ids[at] = p->after[k];
        out->start[at] = out->end[at] = 0;
    }
}

static void post_process(const text_tokenizer_t *t, const char *text, bool add_special, text_tokens_t *out,
                         size_t first, const uint8_t *is_added) {
    for (size_t k = 0; k < t->n_post; k++) {
        const tok_post_t *p = &t->post[k];
        if (p->kind != TOK_POST_TEMPLATE && p->trim_offsets) trim_offsets(t, text, p->add_prefix_space, out, first,
                                                                          is_added);
        if (p->kind != TOK_POST_BYTELEVEL && add_special) wrap_special(out, first, p);
    }
}

mt_status_t text_tokenizer_encode(const text_tokenizer_t *t, const char *text, size_t len, const uint8_t *from_data,
                                  bool add_special_tokens, text_tokens_t *out, mt_error_t *err) {
    size_t bad = tok_utf8_check((const uint8_t *)text, len);
    if (bad < len)
        return mt_error_set(err, MT_ERR_DATA, "text to tokenize is not valid UTF-8 at byte %zu (0x%02X)", bad,
                            (unsigned)(uint8_t)text[bad]);
    if (len >= UINT32_MAX / 4)
        return mt_error_set(err, MT_ERR_DATA, "text to tokenize is %zu bytes, over the 1 GiB a call takes", len);
    tok_work_t w;
    tok_work_init(&w);
    tok_piece_t *pieces = NULL, *sub = NULL;
    size_t cap = 0, sub_cap = 0, first = out->n;
    size_t np = tok_added_split(t, &t->trie_raw, text, len, from_data, &pieces, &cap);
    uint8_t *is_added = NULL;
    size_t added_cap = 0;
    bool ok = true;
    for (size_t i = 0; i < np && ok; i++) {
        size_t before = out->n;
        if (pieces[i].id >= 0) tok_tokens_push(out, pieces[i].id, pieces[i].s, pieces[i].e);
        else ok = encode_piece(t, &w, text, pieces[i], from_data, &sub, &sub_cap, out);
        if (out->n - first > added_cap) {
            added_cap = (out->n - first) * 2;
            is_added = realloc(is_added, added_cap);
            TOK_CHECK_ALLOC(is_added, "tokens");
        }
        for (size_t k = before; k < out->n; k++) is_added[k - first] = pieces[i].id >= 0;
    }
    free(pieces);
    free(sub);
    tok_work_free(&w);
    if (!ok) {
        out->n = first;
        free(is_added);
        return mt_error_set(err, MT_ERR_DATA, "%s: a character is not in the vocabulary and the model has no unk "
                            "token", t->what);
    }
    post_process(t, text, add_special_tokens, out, first, is_added);
    free(is_added);
    return MT_OK;
}
