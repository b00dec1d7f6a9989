/* Loading tokenizer.json, freeing, and the vocabulary look-ups.
 *
 * Order matters: the pre-tokenizer is read before the model (a ByteLevel
 * pre-tokenizer makes the vocabulary byte-level, mapped back to raw bytes),
 * and the normalizer before the added tokens (normalized ones are matched
 * by their normalized content, as the library matches them). */
#include <stdlib.h>
#include <string.h>

#include "base/fileio.h"
#include "text/tokenizer/tok_impl.h"

/* ByteLevel trim_offsets counts leading/trailing 'Ġ' (U+0120) or whitespace
 * characters of each token string. */
static void count_trim(text_tokenizer_t *t) {
    t->id_lead_ws = calloc((size_t)t->n_ids, sizeof *t->id_lead_ws);
    t->id_trail_ws = calloc((size_t)t->n_ids, sizeof *t->id_trail_ws);
    TOK_CHECK_ALLOC(t->id_lead_ws && t->id_trail_ws, "token table");
    for (int32_t id = 0; id < t->n_ids; id++) {
        const uint8_t *s = (const uint8_t *)t->id_str[id];
        if (!s) continue;
        uint32_t n = t->id_len[id], i = 0, lead = 0, trail = 0, run = 0;
        bool leading = true;
        while (i < n) {
            int len;
            uint32_t c = tok_utf8_decode(s + i, &len);
            bool ws = c == 0x120 || tok_is_white_space(c);
            if (leading && ws) lead++;
            else leading = false;
            run = ws ? run + 1 : 0;
            i += (uint32_t)len;
        }
        trail = run;
        t->id_lead_ws[id] = (uint16_t)(lead > 65535 ? 65535 : lead);
        t->id_trail_ws[id] = (uint16_t)(trail > 65535 ? 65535 : trail);
    }
}

static mt_status_t load_parts(text_tokenizer_t *t, json_t *root, mt_error_t *err) {
    if (!json_is_object(root)) return mt_error_set(err, MT_ERR_FORMAT, "%s: expected a JSON object", t->what);
    mt_status_t st = tok_load_normalizer(t, json_object_get(root, "normalizer"), "normalizer", err);
    if (!st) st = tok_load_pretokenizer(t, json_object_get(root, "pre_tokenizer"), "pre_tokenizer", err);
    if (!st) st = tok_load_model(t, json_object_get(root, "model"), err);
    if (!st) st = tok_load_added(t, json_object_get(root, "added_tokens"), err);
    if (!st) st = tok_load_post(t, json_object_get(root, "post_processor"), "post_processor", err);
    if (!st) st = tok_load_decoder(t, json_object_get(root, "decoder"), "decoder", err);
    if (st) return st;
    count_trim(t);
    return MT_OK;
}

mt_status_t text_tokenizer_load_string(const char *json, size_t len, const char *what, text_tokenizer_t **out,
                                       mt_error_t *err) {
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json, len, JSON_ALLOW_NUL, &jerr);
    if (!root)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: line %d: %s", what, jerr.line, jerr.text);
    text_tokenizer_t *t = calloc(1, sizeof *t);
    TOK_CHECK_ALLOC(t, "tokenizer");
    t->what = strdup(what);
    TOK_CHECK_ALLOC(t->what, "tokenizer");
    t->unk_id = -1;
    mt_status_t st = load_parts(t, root, err);
    json_decref(root);
    if (st) {
        text_tokenizer_free(t);
        return st;
    }
    *out = t;
    return MT_OK;
}

mt_status_t text_tokenizer_load(const char *path, text_tokenizer_t **out, mt_error_t *err) {
    *out = NULL;
    char *buf = NULL;
    size_t n = 0;
    mt_status_t st = mt_read_regular_file(path, "tokenizer.json", (size_t)1 << 31, &buf, &n, err);
    if (st) return st;
    st = text_tokenizer_load_string(buf, n, path, out, err);
    free(buf);
    return st;
}

void text_tokenizer_free(text_tokenizer_t *t) {
    if (!t) return;
    tok_strmap_free(&t->vocab);
    tok_strmap_free(&t->by_string);
    tok_pairmap_free(&t->merges);
    for (int32_t i = 0; i < t->n_ids; i++) free(t->id_str[i]);
    free(t->id_str);
    free(t->id_len);
    free(t->id_special);
    free(t->id_lead_ws);
    free(t->id_trail_ws);
    for (size_t i = 0; i < t->n_norm; i++) {
        tok_pattern_free(&t->norm[i].pat);
        free(t->norm[i].content);
    }
    free(t->norm);
    for (size_t i = 0; i < t->n_pretok; i++) tok_pattern_free(&t->pretok[i].pat);
    free(t->pretok);
    for (size_t i = 0; i < t->n_dec; i++) {
        tok_pattern_free(&t->dec[i].pat);
        free(t->dec[i].content);
    }
    free(t->dec);
    for (size_t i = 0; i < t->n_post; i++) {
        free(t->post[i].before);
        free(t->post[i].after);
    }
    free(t->post);
    for (size_t i = 0; i < t->n_added; i++) {
        free(t->added[i].content);
        free(t->added[i].match);
    }
    free(t->added);
    tok_trie_free(&t->trie_raw);
    tok_trie_free(&t->trie_norm);
    free(t->what);
    free(t);
}

int32_t text_tokenizer_token_id(const text_tokenizer_t *t, const char *token) {
    return tok_strmap_get(&t->by_string, token, strlen(token));
}

const char *text_tokenizer_token(const text_tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids ? t->id_str[id] : NULL;
}

int32_t text_tokenizer_vocab_size(const text_tokenizer_t *t) {
    int32_t n = t->n_ids;
    while (n > 0 && !t->id_str[n - 1]) n--;
    return n;
}

bool text_tokenizer_is_special(const text_tokenizer_t *t, int32_t id) {
    return id >= 0 && id < t->n_ids && t->id_special[id];
}

void text_tokens_free(text_tokens_t *toks) {
    free(toks->ids);
    free(toks->start);
    free(toks->end);
    memset(toks, 0, sizeof *toks);
}
