/* Rows from examples, padded or packed (see pack.h).
 *
 * Design notes:
 * - First-fit-decreasing keeps the longest examples from being stranded
 *   and is within 11/9 of the fewest rows; "first fit" is found in
 *   O(log rows) with a max-tree over the rows' free space (leaves not yet
 *   used hold T, so the leftmost fit is an open row or the next new one).
 * - Ties in length are ordered by a hash of (seed, example index), so two
 *   seeds give two packings of the same quality and one seed always the
 *   same rows: a resumed run rebuilds exactly the rows it was trained on. */
#include "engine/data/pack.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"
#include "base/status.h"

#define IGNORE_INDEX (-100) /* HF's CrossEntropyLoss ignore_index */

void eng_rows_reserve(eng_rows_t *r, int64_t more, bool packed) {
    const bool need_seg = packed && !r->seg_start;
    if (r->rows + more <= r->cap && !need_seg) return;
    int64_t cap = r->cap ? r->cap : 64;
    while (cap < r->rows + more) cap *= 2;
    size_t n = (size_t)cap * (size_t)r->T;
    r->inputs = realloc(r->inputs, n * sizeof *r->inputs);
    MT_CHECK_ALLOC(r->inputs, "dataset inputs");
    r->targets = realloc(r->targets, n * sizeof *r->targets);
    MT_CHECK_ALLOC(r->targets, "dataset targets");
    r->mask = realloc(r->mask, n * sizeof *r->mask);
    MT_CHECK_ALLOC(r->mask, "dataset mask");
    if (packed || r->seg_start) {
        r->seg_start = realloc(r->seg_start, n * sizeof *r->seg_start);
        MT_CHECK_ALLOC(r->seg_start, "dataset segment starts");
    }
    r->cap = cap;
}

void eng_rows_free(eng_rows_t *r) {
    if (!r) return;
    free(r->inputs);
    free(r->targets);
    free(r->mask);
    free(r->seg_start);
    memset(r, 0, sizeof *r);
}

/* Writes L tokens of example e at offset o of a row (inputs, mask, targets
 * shifted within the example, segment start o). */
static void put_example(const eng_examples_t *ex, int64_t e, int64_t L, int o, int32_t *in, int32_t *tg,
                        uint8_t *mk, int32_t *seg) {
    const int64_t b = ex->off[e];
    for (int64_t t = 0; t < L; t++) {
        in[o + t] = ex->ids[b + t];
        mk[o + t] = ex->mask[b + t];
        tg[o + t] = t + 1 < L ? ex->labels[b + t + 1] : IGNORE_INDEX;
        if (seg) seg[o + t] = o;
    }
}

/* Counts the finished row: real tokens, and mask holes (data.h). */
static void row_done(eng_rows_t *r, const eng_examples_t *ex, int64_t first_example) {
    const int T = r->T;
    const uint8_t *mk = r->mask + r->rows * T;
    int kvl = T;
    while (kvl > 0 && !mk[kvl - 1]) kvl--;
    bool holes = false;
    for (int t = 0; t < T; t++) r->real_tokens += mk[t];
    for (int t = 0; t < kvl && !holes; t++) holes = !mk[t];
    if (holes && r->mask_holes++ == 0)
        eng_example_where(ex, first_example, r->mask_holes_first, (int)sizeof r->mask_holes_first);
    r->rows++;
}

static void add_padded(eng_rows_t *r, const eng_examples_t *ex) {
    const int T = r->T;
    eng_rows_reserve(r, ex->n, false);
    for (int64_t e = 0; e < ex->n; e++) {
        const int64_t n = eng_example_len(ex, e), L = n < T ? n : T;
        int32_t *in = r->inputs + r->rows * T, *tg = r->targets + r->rows * T;
        uint8_t *mk = r->mask + r->rows * T;
        put_example(ex, e, L, 0, in, tg, mk, NULL);
        for (int64_t t = L; t < T; t++) in[t] = 0, mk[t] = 0, tg[t] = IGNORE_INDEX;
        r->truncated += n > T;
        r->examples++;
        row_done(r, ex, e);
    }
}

typedef struct {
    int64_t len, e;
    uint64_t key;
} item_t;

static int by_len_desc(const void *a, const void *b) {
    const item_t *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    if (x->key != y->key) return x->key < y->key ? -1 : 1;
    return x->e < y->e ? -1 : x->e > y->e;
}

/* Leftmost leaf of the max-tree (size leaves, 1-based heap) with value >= L. */
static int64_t first_fit(const int32_t *tree, int64_t size, int64_t L) {
    int64_t i = 1;
    while (i < size) i = tree[2 * i] >= L ? 2 * i : 2 * i + 1;
    return i - size;
}

static void tree_take(int32_t *tree, int64_t size, int64_t leaf, int64_t L) {
    int64_t i = leaf + size;
    tree[i] -= (int32_t)L;
    for (i /= 2; i >= 1; i /= 2) tree[i] = tree[2 * i] > tree[2 * i + 1] ? tree[2 * i] : tree[2 * i + 1];
}

/* The kept examples (trailing padding cut, truncated to T, with a trained
 * target) into items, in first-fit-decreasing order; returns how many. */
static int64_t collect(eng_rows_t *r, const eng_examples_t *ex, uint64_t seed, item_t *items) {
    const int T = r->T;
    int64_t k = 0;
    for (int64_t e = 0; e < ex->n; e++) {
        const int64_t b = ex->off[e];
        int64_t n = eng_example_len(ex, e);
        while (n > 0 && !ex->mask[b + n - 1]) n--;
        const int64_t L = n < T ? n : T;
        int64_t trained = 0;
        for (int64_t t = 1; t < L; t++) trained += ex->labels[b + t] != IGNORE_INDEX;
        if (!trained) {
            r->dropped++;
            continue;
        }
        r->truncated += n > T;
        uint64_t s = seed ^ (uint64_t)e * 0x9e3779b97f4a7c15ull;
        items[k++] = (item_t){.len = L, .e = e, .key = mt_splitmix64(&s)};
    }
    qsort(items, (size_t)k, sizeof *items, by_len_desc);
    return k;
}

static void add_packed(eng_rows_t *r, const eng_examples_t *ex, uint64_t seed) {
    const int T = r->T;
    item_t *items = malloc((size_t)(ex->n ? ex->n : 1) * sizeof *items);
    MT_CHECK_ALLOC(items, "packing order");
    const int64_t k = collect(r, ex, seed, items);
    int64_t size = 1;
    while (size < (k ? k : 1)) size *= 2;
    int32_t *tree = malloc(2 * (size_t)size * sizeof *tree);
    int64_t *bin = malloc((size_t)(k ? k : 1) * sizeof *bin), *count = calloc((size_t)size + 1, sizeof *count);
    MT_CHECK(tree && bin && count, "out of host memory packing %" PRId64 " examples", k);
    for (int64_t i = 0; i < 2 * size; i++) tree[i] = T;
    int64_t nbins = 0;
    for (int64_t i = 0; i < k; i++) {
        bin[i] = first_fit(tree, size, items[i].len);
        tree_take(tree, size, bin[i], items[i].len);
        if (bin[i] + 1 > nbins) nbins = bin[i] + 1;
        count[bin[i] + 1]++;
    }
    for (int64_t b = 0; b < nbins; b++) count[b + 1] += count[b]; /* start of each row's list */
    int64_t *order = malloc((size_t)(k ? k : 1) * sizeof *order), *fill = calloc((size_t)nbins + 1, sizeof *fill);
    MT_CHECK(order && fill, "out of host memory packing %" PRId64 " examples", k);
    for (int64_t i = 0; i < k; i++) order[count[bin[i]] + fill[bin[i]]++] = i;
    eng_rows_reserve(r, nbins, true);
    for (int64_t b = 0; b < nbins; b++) {
        int32_t *in = r->inputs + r->rows * T, *tg = r->targets + r->rows * T, *seg = r->seg_start + r->rows * T;
        uint8_t *mk = r->mask + r->rows * T;
        int o = 0;
        for (int64_t j = count[b]; j < count[b + 1]; j++) {
            const item_t *it = &items[order[j]];
            put_example(ex, it->e, it->len, o, in, tg, mk, seg);
            o += (int)it->len;
            r->examples++;
        }
        for (int t = o; t < T; t++) in[t] = 0, mk[t] = 0, tg[t] = IGNORE_INDEX, seg[t] = o;
        row_done(r, ex, items[order[count[b]]].e);
    }
    free(items), free(tree), free(bin), free(count), free(order), free(fill);
}

void eng_rows_add_examples(eng_rows_t *r, const eng_examples_t *ex, bool pack, uint64_t seed) {
    if (pack) add_packed(r, ex, seed);
    else add_padded(r, ex);
}
