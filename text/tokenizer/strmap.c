/* Open-addressing hash maps for the vocabulary (bytes -> id) and the merges
 * ((id, id) -> rank and merged id).  Load factor at most 1/2; linear probing.
 * Both are built once at load and only read while encoding. */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer/tok_impl.h"

static uint64_t hash_bytes(const char *k, size_t n) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a, then a final mix */
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)k[i]) * 1099511628211ull;
    h ^= h >> 29;
    return h * 0xbf58476d1ce4e5b9ull;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < n) c *= 2;
    return c;
}

void tok_strmap_init(tok_strmap_t *m, size_t expect) {
    memset(m, 0, sizeof *m);
    m->cap = pow2_at_least(expect * 2 + 1);
    m->off = malloc(m->cap * sizeof *m->off);
    m->len = malloc(m->cap * sizeof *m->len);
    m->val = malloc(m->cap * sizeof *m->val);
    TOK_CHECK_ALLOC(m->off && m->len && m->val, "token map");
    memset(m->len, 0xFF, m->cap * sizeof *m->len);
}

void tok_strmap_free(tok_strmap_t *m) {
    free(m->pool);
    free(m->off);
    free(m->len);
    free(m->val);
    memset(m, 0, sizeof *m);
}

static size_t strmap_find(const tok_strmap_t *m, const char *k, size_t n) {
    size_t i = hash_bytes(k, n) & (m->cap - 1);
    while (m->len[i] != UINT32_MAX && !(m->len[i] == n && memcmp(m->pool + m->off[i], k, n) == 0))
        i = (i + 1) & (m->cap - 1);
    return i;
}

static void strmap_grow(tok_strmap_t *m) {
    tok_strmap_t bigger = *m;
    bigger.cap = m->cap * 2;
    bigger.off = malloc(bigger.cap * sizeof *bigger.off);
    bigger.len = malloc(bigger.cap * sizeof *bigger.len);
    bigger.val = malloc(bigger.cap * sizeof *bigger.val);
    TOK_CHECK_ALLOC(bigger.off && bigger.len && bigger.val, "token map");
    memset(bigger.len, 0xFF, bigger.cap * sizeof *bigger.len);
    for (size_t i = 0; i < m->cap; i++) {
        if (m->len[i] == UINT32_MAX) continue;
        size_t j = strmap_find(&bigger, m->pool + m->off[i], m->len[i]);
        bigger.off[j] = m->off[i];
        bigger.len[j] = m->len[i];
        bigger.val[j] = m->val[i];
    }
    free(m->off);
    free(m->len);
    free(m->val);
    *m = bigger;
}

void tok_strmap_put(tok_strmap_t *m, const char *k, size_t n, int32_t v) {
    if ((m->n + 1) * 2 > m->cap) strmap_grow(m);
    size_t i = strmap_find(m, k, n);
    if (m->len[i] != UINT32_MAX) { m->val[i] = v; return; }
    if (m->pool_n + n > m->pool_cap) {
        size_t cap = m->pool_cap ? m->pool_cap : 4096;
        while (cap < m->pool_n + n) cap *= 2;
        m->pool = realloc(m->pool, cap);
        TOK_CHECK_ALLOC(m->pool, "token map strings");
        m->pool_cap = cap;
    }
    if (n) memcpy(m->pool + m->pool_n, k, n);
    m->off[i] = (uint32_t)m->pool_n;
    m->len[i] = (uint32_t)n;
    m->val[i] = v;
    m->pool_n += n;
    m->n++;
}

int32_t tok_strmap_get(const tok_strmap_t *m, const char *k, size_t n) {
    if (!m->cap) return -1;
    size_t i = strmap_find(m, k, n);
    return m->len[i] == UINT32_MAX ? -1 : m->val[i];
}

static size_t pair_slot(uint64_t key, size_t cap) {
    uint64_t h = key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 20) & (cap - 1);
}

void tok_pairmap_init(tok_pairmap_t *m, size_t expect) {
    m->cap = pow2_at_least(expect * 2 + 1);
    m->key = malloc(m->cap * sizeof *m->key);
    m->rank = malloc(m->cap * sizeof *m->rank);
    m->id = malloc(m->cap * sizeof *m->id);
    TOK_CHECK_ALLOC(m->key && m->rank && m->id, "merges map");
    memset(m->key, 0xFF, m->cap * sizeof *m->key);
}

void tok_pairmap_free(tok_pairmap_t *m) {
    free(m->key);
    free(m->rank);
    free(m->id);
    memset(m, 0, sizeof *m);
}

void tok_pairmap_put(tok_pairmap_t *m, int32_t a, int32_t b, int32_t rank, int32_t id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = pair_slot(key, m->cap);
    while (m->key[i] != UINT64_MAX) {
        if (m->key[i] == key) break; /* a repeated merge: the later one wins, as in the library's map */
        i = (i + 1) & (m->cap - 1);
    }
    m->key[i] = key;
    m->rank[i] = rank;
    m->id[i] = id;
}

bool tok_pairmap_get(const tok_pairmap_t *m, int32_t a, int32_t b, int32_t *rank, int32_t *id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = pair_slot(key, m->cap);
    while (m->key[i] != UINT64_MAX) {
        if (m->key[i] == key) {
            *rank = m->rank[i];
            *id = m->id[i];
            return true;
        }
        i = (i + 1) & (m->cap - 1);
    }
    return false;
}
