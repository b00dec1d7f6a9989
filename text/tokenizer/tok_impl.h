/* The tokenizer's parts, shared by the files of this package only.
 *
 * A loaded tokenizer is a flat description: arrays of normalizers,
 * pre-tokenizers, decoders and post-processors (Sequences flattened, which
 * is what applying them in order means), the BPE model's hash maps, and the
 * added tokens in two tries (matched on the input, matched after
 * normalization).
 *
 * Byte-level pipelines: the library maps every byte to a printable character
 * (GPT-2's table) and runs BPE on those characters.  The map is one to one,
 * so the vocabulary is mapped back to raw bytes at load time and BPE runs on
 * the bytes themselves, one initial symbol per byte; nothing is mapped per
 * encode.
 *
 * Encoding works on a tok_work_t: a byte buffer in which every byte carries
 * the original range [o0, o1) of the input character it came from (the
 * library's alignments), and a list of splits (ranges of that buffer).
 * Transformations append their output to the buffer and move the split to
 * it, so earlier ranges stay valid. */
#ifndef MT_TEXT_TOK_IMPL_H
#define MT_TEXT_TOK_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "base/status.h"
#include "text/tokenizer/tokenizer.h"

/* MT_CHECK_ALLOC for a condition over several allocations. */
#define TOK_CHECK_ALLOC(cond, what) MT_CHECK((cond), "out of host memory allocating %s", (what))

typedef struct {
    uint32_t s, e;
} tok_range_t;

/* ---- utf8.c ---- */
/* Length of the valid UTF-8 character at s[0, n), or 0 if invalid there. */
int tok_utf8_len(const uint8_t *s, size_t n);
/* First invalid byte offset, or len when s is valid UTF-8. */
size_t tok_utf8_check(const uint8_t *s, size_t len);
uint32_t tok_utf8_decode(const uint8_t *s, int *len);
int tok_utf8_encode(uint32_t c, char *out);
bool tok_is_white_space(uint32_t c); /* Unicode White_Space, Rust's char::is_whitespace */
bool tok_is_word(uint32_t c);        /* Rust regex's \w */
bool tok_is_numeric(uint32_t c);     /* Rust's char::is_numeric: categories Nd, Nl, No */
/* GPT-2's byte -> character table and its inverse (-1 for other chars). */
uint32_t tok_byte_char(uint8_t b);
int tok_char_byte(uint32_t c);
/* Appends the byte-level decoding of token string s to a growable buffer, as
 * the ByteLevel decoder does: raw bytes when every character maps to one. */
bool tok_bytelevel_unmap(const char *s, size_t n, char *out, size_t *outn);
/* Appends src to *dst with Rust's from_utf8_lossy: each maximal invalid
 * subsequence becomes U+FFFD. */
void tok_utf8_lossy(const char *src, size_t n, char **dst, size_t *dn, size_t *dcap);

/* ---- strmap.c: byte string -> int32, and (id, id) -> (rank, id) ---- */
typedef struct {
    char *pool;
    size_t pool_n, pool_cap;
    uint32_t *off, *len; /* (cap) key of each slot; len UINT32_MAX = empty */
    int32_t *val;
    size_t cap, n;
} tok_strmap_t;
void tok_strmap_init(tok_strmap_t *m, size_t expect);
void tok_strmap_free(tok_strmap_t *m);
/* Inserts or overwrites. */
void tok_strmap_put(tok_strmap_t *m, const char *k, size_t n, int32_t v);
int32_t tok_strmap_get(const tok_strmap_t *m, const char *k, size_t n); /* -1 if absent */

typedef struct {
    uint64_t *key; /* (cap) a << 32 | b, UINT64_MAX = empty */
    int32_t *rank, *id;
    size_t cap;
} tok_pairmap_t;
void tok_pairmap_init(tok_pairmap_t *m, size_t expect);
void tok_pairmap_free(tok_pairmap_t *m);
void tok_pairmap_put(tok_pairmap_t *m, int32_t a, int32_t b, int32_t rank, int32_t id); /* a later put wins */
bool tok_pairmap_get(const tok_pairmap_t *m, int32_t a, int32_t b, int32_t *rank, int32_t *id);

/* ---- components ---- */
typedef enum { TOK_NFC, TOK_NFD, TOK_NFKC, TOK_NFKD, TOK_N_PREPEND, TOK_N_REPLACE } tok_norm_kind_t;
typedef enum { TOK_ISOLATED, TOK_REMOVED, TOK_MERGED_PREV, TOK_MERGED_NEXT, TOK_CONTIGUOUS } tok_behavior_t;
typedef enum { TOK_PREPEND_ALWAYS, TOK_PREPEND_FIRST, TOK_PREPEND_NEVER } tok_prepend_t;

/* A pattern as the library's Split/Replace take it: a literal string or an
 * Oniguruma regex (compiled with PCRE2, \s \S rewritten to White_Space). */
typedef struct {
    char *lit;
    size_t lit_n;
    pcre2_code *re; /* NULL for a literal */
} tok_pattern_t;

typedef struct {
    tok_norm_kind_t kind;
    tok_pattern_t pat; /* Replace */
    char *content;     /* Prepend's prefix, Replace's content */
    size_t content_n;
} tok_norm_t;

typedef enum { TOK_P_SPLIT, TOK_P_BYTELEVEL, TOK_P_DIGITS, TOK_P_METASPACE } tok_pretok_kind_t;
typedef struct {
    tok_pretok_kind_t kind;
    tok_pattern_t pat; /* Split; ByteLevel's GPT-2 regex when use_regex */
    tok_behavior_t behavior;
    bool invert, add_prefix_space, individual_digits, split;
    tok_prepend_t prepend_scheme;
    char repl[8]; /* Metaspace replacement, UTF-8 */
    size_t repl_n;
} tok_pretok_t;

typedef enum { TOK_D_BYTELEVEL, TOK_D_METASPACE, TOK_D_BYTEFALLBACK, TOK_D_FUSE, TOK_D_STRIP, TOK_D_REPLACE } tok_dec_kind_t;
typedef struct {
    tok_dec_kind_t kind;
    tok_pattern_t pat; /* Replace */
    char *content;     /* Replace's content, Strip's content, Metaspace's replacement */
    size_t content_n;
    int start, stop;   /* Strip */
    bool prepend;      /* Metaspace: prepend_scheme != never */
} tok_dec_t;

typedef enum { TOK_POST_BYTELEVEL, TOK_POST_TEMPLATE, TOK_POST_ROBERTA } tok_post_kind_t;
typedef struct {
    tok_post_kind_t kind;
    bool trim_offsets, add_prefix_space;
    int32_t *before, *after; /* ids the template (or cls/sep) puts around $A */
    size_t n_before, n_after;
} tok_post_t;

typedef struct {
    char *content; /* as written in tokenizer.json */
    size_t n;
    char *match; /* what is matched: the content, normalized when normalized=true */
    size_t match_n;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added_t;

/* A byte trie over added tokens' match strings: each node's children are a
 * linked list of edges (a few hundred tokens share few prefixes). */
typedef struct {
    int32_t *first_edge, *token; /* (nodes) token: index into t->added ending here, or -1; node 0 = root */
    uint8_t *edge_byte;          /* (edges) */
    int32_t *edge_child, *edge_next;
    size_t nodes, node_cap, edges, edge_cap;
    bool root_has[256]; /* a token starts with this byte */
} tok_trie_t;

struct text_tokenizer {
    char *what; /* the file, for messages */
    /* the BPE model */
    tok_strmap_t vocab; /* model-space token (raw bytes when byte_level) -> id */
    tok_pairmap_t merges;
    bool byte_level, byte_fallback, fuse_unk, ignore_merges;
    int32_t unk_id;
    int32_t byte_ids[256]; /* byte_fallback: the id of "<0xNN>", or -1 */
    /* every id */
    char **id_str; /* (n_ids) the token string as in tokenizer.json, NULL for a hole */
    uint32_t *id_len;
    uint8_t *id_special;
    uint16_t *id_lead_ws, *id_trail_ws; /* ByteLevel trim_offsets: leading/trailing 'Ġ' or whitespace chars */
    int32_t n_ids;
    tok_strmap_t by_string; /* token string -> id (vocab and added tokens) */
    /* pipeline */
    tok_norm_t *norm;
    size_t n_norm;
    tok_pretok_t *pretok;
    size_t n_pretok;
    tok_dec_t *dec;
    size_t n_dec;
    bool has_decoder;
    tok_post_t *post;
    size_t n_post;
    tok_added_t *added;
    size_t n_added;
    tok_trie_t trie_raw, trie_norm;
};

/* Compiles an Oniguruma-syntax regex; NULL with err set on failure. */
pcre2_code *tok_regex_compile(const char *pattern, size_t n, const char *where, mt_error_t *err);

/* ---- the work string (encode.c owns it) ---- */
typedef struct {
    int32_t id;
    uint32_t s, e; /* range in the work buffer */
} tok_piece_t;

typedef struct {
    char *b;
    uint32_t *o0, *o1; /* (n) original range of each byte's character */
    size_t n, cap;
    tok_range_t *sp, *sp2; /* splits, and scratch for the next list */
    size_t nsp, nsp2, capsp, capsp2;
    pcre2_match_data *md;
    /* BPE scratch */
    void *sym, *heap;
    size_t sym_cap, heap_cap;
    uint8_t *data_mask; /* (n) per work byte: touches user data */
    tok_range_t *seg;   /* a split's matches and gaps, in order */
    uint8_t *seg_match;
    size_t nseg, seg_cap;
} tok_work_t;

void tok_work_init(tok_work_t *w);
void tok_work_free(tok_work_t *w);
/* Empties the work buffer and loads text[s, e) into it: each byte aligned to
 * its character's range, flagged when any byte of that character is user
 * data (mask, or NULL). */
tok_range_t tok_work_load(tok_work_t *w, const char *text, uint32_t s, uint32_t e, const uint8_t *mask);
/* Makes room for n more bytes in w->b / o0 / o1 (and the data mask). */
void tok_work_reserve(tok_work_t *w, size_t more);
void tok_work_push_split(tok_work_t *w, uint32_t s, uint32_t e); /* onto sp2 */
/* Appends byte c with alignment (a0, a1). */
static inline void tok_work_put(tok_work_t *w, char c, uint32_t a0, uint32_t a1, uint8_t data) {
    w->b[w->n] = c;
    w->o0[w->n] = a0;
    w->o1[w->n] = a1;
    w->data_mask[w->n] = data;
    w->n++;
}

/* normalize.c: normalizes work range r, returns the range of the result. */
tok_range_t tok_normalize(const text_tokenizer_t *t, tok_work_t *w, tok_range_t r);
/* The next non-empty match of p in b[0, n) at or after from (empty regex
 * matches are skipped, as Oniguruma's iteration steps over them). */
bool tok_find(const tok_pattern_t *p, pcre2_match_data *md, const char *b, size_t n, size_t from, size_t *ms,
              size_t *me);
/* Normalizes a standalone string (an added token's content); caller frees. */
char *tok_normalize_string(const text_tokenizer_t *t, const char *s, size_t n, size_t *out_n);
/* pretok.c: runs every pre-tokenizer over w->sp (in place). */
void tok_pretokenize(const text_tokenizer_t *t, tok_work_t *w);
/* Splits w->sp on a pattern with a behaviour (shared with Metaspace). */
void tok_split_pattern(tok_work_t *w, const tok_pattern_t *p, tok_behavior_t behavior, bool invert);
/* bpe.c: encodes work range r (one pre-token), appending to out. */
/* false when a character is unknown and the model has no unk token */
bool tok_bpe_encode(const text_tokenizer_t *t, tok_work_t *w, tok_range_t r, text_tokens_t *out);
void tok_tokens_push(text_tokens_t *out, int32_t id, uint32_t s, uint32_t e);
/* added.c */
void tok_trie_init(tok_trie_t *tr);
void tok_trie_free(tok_trie_t *tr);
void tok_trie_add(tok_trie_t *tr, const char *s, size_t n, int32_t token);
/* Splits b[0, n) on the added tokens of trie as the library does; pieces
 * with id -1 are text between them.  mask (or NULL) flags user-data bytes. */
size_t tok_added_split(const text_tokenizer_t *t, const tok_trie_t *tr, const char *b, size_t n, const uint8_t *mask,
                       tok_piece_t **pieces, size_t *cap);
/* load_pipe.c: the JSON of each pipeline part. */
#include <jansson.h>
mt_status_t tok_load_normalizer(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err);
mt_status_t tok_load_pretokenizer(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err);
mt_status_t tok_load_decoder(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err);
mt_status_t tok_load_post(text_tokenizer_t *t, json_t *j, const char *path, mt_error_t *err);
void tok_pattern_free(tok_pattern_t *p);
/* load_model.c */
mt_status_t tok_load_model(text_tokenizer_t *t, json_t *model, mt_error_t *err);
mt_status_t tok_load_added(text_tokenizer_t *t, json_t *list, mt_error_t *err);

#endif
