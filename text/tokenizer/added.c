/* Added tokens: found in the text before anything else, as the library's
 * AddedVocabulary::find_matches does it.  The matcher there is Aho-Corasick,
 * leftmost-longest, non-overlapping, resuming after each match's end even
 * when single_word discards it; here a trie walked from each position gives
 * the same matches.  The user-data rule removes a special token from the set
 * wherever its match would touch a flagged byte, so a shorter or later token
 * may match instead, exactly as if that special token did not exist there. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

static int32_t trie_node(tok_trie_t *tr) {
    if (tr->nodes == tr->node_cap) {
        tr->node_cap = tr->node_cap ? tr->node_cap * 2 : 64;
        tr->first_edge = realloc(tr->first_edge, tr->node_cap * sizeof *tr->first_edge);
        tr->token = realloc(tr->token, tr->node_cap * sizeof *tr->token);
        TOK_CHECK_ALLOC(tr->first_edge && tr->token, "added-token trie");
    }
    tr->first_edge[tr->nodes] = -1;
    tr->token[tr->nodes] = -1;
    return (int32_t)tr->nodes++;
}

void tok_trie_init(tok_trie_t *tr) {
    memset(tr, 0, sizeof *tr);
    trie_node(tr);
}

void tok_trie_free(tok_trie_t *tr) {
    free(tr->first_edge);
    free(tr->token);
    free(tr->edge_byte);
    free(tr->edge_child);
    free(tr->edge_next);
    memset(tr, 0, sizeof *tr);
}

static int32_t trie_child(const tok_trie_t *tr, int32_t node, uint8_t b) {
    for (int32_t e = tr->first_edge[node]; e >= 0; e = tr->edge_next[e])
        if (tr->edge_byte[e] == b) return tr->edge_child[e];
    return -1;
}

void tok_trie_add(tok_trie_t *tr, const char *s, size_t n, int32_t token) {
    if (!n) return;
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = trie_child(tr, node, (uint8_t)s[i]);
        if (c < 0) {
            c = trie_node(tr);
            if (tr->edges == tr->edge_cap) {
                tr->edge_cap = tr->edge_cap ? tr->edge_cap * 2 : 64;
                tr->edge_byte = realloc(tr->edge_byte, tr->edge_cap);
                tr->edge_child = realloc(tr->edge_child, tr->edge_cap * sizeof *tr->edge_child);
                tr->edge_next = realloc(tr->edge_next, tr->edge_cap * sizeof *tr->edge_next);
                TOK_CHECK_ALLOC(tr->edge_byte && tr->edge_child && tr->edge_next, "added-token trie");
            }
            size_t e = tr->edges++;
            tr->edge_byte[e] = (uint8_t)s[i];
            tr->edge_child[e] = c;
            tr->edge_next[e] = tr->first_edge[node];
            tr->first_edge[node] = (int32_t)e;
        }
        node = c;
    }
    if (tr->token[node] < 0) tr->token[node] = token; /* the first of equal tokens wins */
    tr->root_has[(uint8_t)s[0]] = true;
}

static bool touches(const uint8_t *mask, size_t s, size_t e) {
    if (!mask) return false;
    for (size_t i = s; i < e; i++)
        if (mask[i]) return true;
    return false;
}

/* The longest allowed token starting at i: its end, or 0. */
static size_t longest_at(const text_tokenizer_t *t, const tok_trie_t *tr, const char *b, size_t n, size_t i,
                         const uint8_t *mask, int32_t *token) {
    size_t best = 0;
    int32_t node = 0;
    for (size_t j = i; j < n; j++) {
        node = trie_child(tr, node, (uint8_t)b[j]);
        if (node < 0) break;
        int32_t k = tr->token[node];
        if (k >= 0 && !(t->added[k].special && touches(mask, i, j + 1))) {
            best = j + 1;
            *token = k;
        }
    }
    return best;
}

static uint32_t char_before(const char *b, size_t i, size_t *start) {
    size_t k = i - 1;
    while (k > 0 && ((uint8_t)b[k] & 0xC0) == 0x80) k--;
    int len;
    *start = k;
    return tok_utf8_decode((const uint8_t *)b + k, &len);
}

static bool ends_with_word(const char *b, size_t i) {
    size_t k;
    return i > 0 && tok_is_word(char_before(b, i, &k));
}

static bool starts_with_word(const char *b, size_t i, size_t n) {
    int len;
    return i < n && tok_is_word(tok_utf8_decode((const uint8_t *)b + i, &len));
}

static void piece_push(tok_piece_t **p, size_t *np, size_t *cap, int32_t id, size_t s, size_t e) {
    if (*np == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        *p = realloc(*p, *cap * sizeof **p);
        TOK_CHECK_ALLOC(*p, "added-token pieces");
    }
    (*p)[(*np)++] = (tok_piece_t){id, (uint32_t)s, (uint32_t)e};
}

size_t tok_added_split(const text_tokenizer_t *t, const tok_trie_t *tr, const char *b, size_t n, const uint8_t *mask,
                       tok_piece_t **pieces, size_t *cap) {
    size_t np = 0, start_offset = 0, pos = 0;
    while (pos < n && tr->nodes > 1) {
        size_t i = pos, end = 0;
        int32_t k = -1;
        for (; i < n; i++) {
            if (!tr->root_has[(uint8_t)b[i]]) continue;
            end = longest_at(t, tr, b, n, i, mask, &k);
            if (end) break;
        }
        if (!end) break;
        pos = end;
        const tok_added_t *a = &t->added[k];
        size_t start = i, stop = end;
        if (a->single_word && (ends_with_word(b, start) || starts_with_word(b, stop, n))) continue;
        if (a->lstrip) {
            size_t s = start;
            while (s > 0) {
                size_t cs;
                if (!tok_is_white_space(char_before(b, s, &cs))) break;
                s = cs;
            }
            start = s > start_offset ? s : start_offset;
        }
        if (a->rstrip) {
            while (stop < n) {
                int len;
                if (!tok_is_white_space(tok_utf8_decode((const uint8_t *)b + stop, &len))) break;
                stop += (size_t)len;
            }
        }
        if (start_offset < start) piece_push(pieces, &np, cap, -1, start_offset, start);
        piece_push(pieces, &np, cap, a->id, start, stop);
        start_offset = stop;
    }
    if (start_offset != n) piece_push(pieces, &np, cap, -1, start_offset, n);
    return np;
}
