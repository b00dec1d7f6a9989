/* The BPE model on one pre-token, as the library's BPE::merge_word and
 * Word::merge_all do it:
 *   - one initial symbol per character (per byte on byte-level pipelines,
 *     whose vocabulary was mapped back to bytes at load);
 *   - a character outside the vocabulary becomes its <0xNN> byte tokens
 *     (byte_fallback) or the unk token (runs fused with fuse_unk); a pending
 *     unk is emitted only at the next known character or at the end, so it
 *     can follow byte-fallback tokens — the library does this, so do we;
 *   - merges are applied lowest rank first, leftmost on ties, from a min-heap
 *     with stale entries skipped when popped.
 * Token offsets are the running sum of symbol lengths, as Word::add keeps them. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

typedef struct {
    int32_t id, prev, next;
    uint32_t len;
} sym_t;

typedef struct {
    int32_t rank, pos, id;
} merge_t;

static bool merge_less(const merge_t *a, const merge_t *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(merge_t *h, size_t *n, merge_t m) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(&m, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = m;
}

static merge_t heap_pop(merge_t *h, size_t *n) {
    merge_t top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && merge_less(&h[c + 1], &h[c])) c++;
        if (!merge_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = last;
    return top;
}

void tok_tokens_push(text_tokens_t *out, int32_t id, uint32_t s, uint32_t e) {
    if (out->n == out->cap) {
        size_t cap = out->cap ? out->cap * 2 : 256;
        out->ids = realloc(out->ids, cap * sizeof *out->ids);
        out->start = realloc(out->start, cap * sizeof *out->start);
        out->end = realloc(out->end, cap * sizeof *out->end);
        TOK_CHECK_ALLOC(out->ids && out->start && out->end, "tokens");
        out->cap = cap;
    }
    out->ids[out->n] = id;
    out->start[out->n] = s;
    out->end[out->n] = e;
    out->n++;
}

static sym_t *sym_add(tok_work_t *w, size_t *n, int32_t id, uint32_t len) {
    if (*n == w->sym_cap) {
        w->sym_cap = w->sym_cap ? w->sym_cap * 2 : 256;
        w->sym = realloc(w->sym, w->sym_cap * sizeof(sym_t));
        TOK_CHECK_ALLOC(w->sym, "BPE symbols");
    }
    sym_t *s = (sym_t *)w->sym + *n;
    s->id = id;
    s->len = len;
    s->prev = (int32_t)*n - 1;
    s->next = (int32_t)*n + 1;
    (*n)++;
    return s;
}

/* The initial symbols of b[0, n); false when an unknown character has no unk. */
static bool initial_symbols(const text_tokenizer_t *t, tok_work_t *w, const char *b, size_t n, size_t *nsym) {
    int32_t unk_len = 0; /* pending unk bytes, 0 = none */
    for (size_t i = 0; i < n;) {
        size_t cl = 1;
        if (!t->byte_level && (uint8_t)b[i] >= 0x80) cl = (size_t)tok_utf8_len((const uint8_t *)b + i, n - i);
        if (!cl) cl = 1;
        int32_t id = tok_strmap_get(&t->vocab, b + i, cl);
        if (id >= 0) {
            if (unk_len) sym_add(w, nsym, t->unk_id, (uint32_t)unk_len);
            unk_len = 0;
            sym_add(w, nsym, id, (uint32_t)cl);
        } else {
            bool fell_back = false;
            if (t->byte_fallback) {
                fell_back = true;
                for (size_t k = 0; k < cl; k++) fell_back = fell_back && t->byte_ids[(uint8_t)b[i + k]] >= 0;
                for (size_t k = 0; fell_back && k < cl; k++) sym_add(w, nsym, t->byte_ids[(uint8_t)b[i + k]], 1);
            }
            if (!fell_back) {
                if (t->unk_id < 0) return false;
                if (unk_len && !t->fuse_unk) {
                    sym_add(w, nsym, t->unk_id, (uint32_t)unk_len);
                    unk_len = 0;
                }
                unk_len += (int32_t)cl;
            }
        }
        i += cl;
    }
    if (unk_len) sym_add(w, nsym, t->unk_id, (uint32_t)unk_len);
    return true;
}

static void heap_reserve(tok_work_t *w, size_t need) {
    if (need <= w->heap_cap) return;
    while (w->heap_cap < need) w->heap_cap = w->heap_cap ? w->heap_cap * 2 : 256;
    w->heap = realloc(w->heap, w->heap_cap * sizeof(merge_t));
    TOK_CHECK_ALLOC(w->heap, "BPE merge queue");
}

static void push_pair(const text_tokenizer_t *t, tok_work_t *w, size_t *nh, const sym_t *s, int32_t pos) {
    int32_t rank, id;
    if (tok_pairmap_get(&t->merges, s[pos].id, s[s[pos].next].id, &rank, &id)) {
        heap_reserve(w, *nh + 1);
        heap_push((merge_t *)w->heap, nh, (merge_t){rank, pos, id});
    }
}

static void merge_all(const text_tokenizer_t *t, tok_work_t *w, size_t nsym) {
    sym_t *s = (sym_t *)w->sym;
    s[nsym - 1].next = -1;
    size_t nh = 0;
    for (size_t i = 0; i + 1 < nsym; i++) push_pair(t, w, &nh, s, (int32_t)i);
    while (nh) {
        merge_t top = heap_pop((merge_t *)w->heap, &nh);
        sym_t *cur = &s[top.pos];
        if (cur->len == 0 || cur->next < 0) continue;
        sym_t *right = &s[cur->next];
        int32_t rank, id;
        if (!tok_pairmap_get(&t->merges, cur->id, right->id, &rank, &id) || id != top.id) continue;
        cur->id = top.id;
        cur->len += right->len;
        right->len = 0;
        cur->next = right->next;
        if (right->next >= 0) s[right->next].prev = top.pos;
        if (cur->prev >= 0) push_pair(t, w, &nh, s, cur->prev);
        if (cur->next >= 0) push_pair(t, w, &nh, s, top.pos);
    }
}

bool tok_bpe_encode(const text_tokenizer_t *t, tok_work_t *w, tok_range_t r, text_tokens_t *out) {
    const char *b = w->b + r.s;
    size_t n = r.e - r.s;
    if (!n) return true;
    if (t->ignore_merges) {
        int32_t id = tok_strmap_get(&t->vocab, b, n);
        if (id >= 0) {
            tok_tokens_push(out, id, w->o0[r.s], w->o1[r.e - 1]);
            return true;
        }
    }
    size_t nsym = 0;
    if (!initial_symbols(t, w, b, n, &nsym)) return false;
    if (nsym > 1) merge_all(t, w, nsym);
    const sym_t *s = (const sym_t *)w->sym;
    uint32_t at = r.s;
    for (size_t i = 0; i < nsym; i++) {
        if (!s[i].len) continue;
        tok_tokens_push(out, s[i].id, w->o0[at], w->o1[at + s[i].len - 1]);
        at += s[i].len;
    }
    return true;
}
