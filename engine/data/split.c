/* The evaluation split (see split.h).
 *
 * Choice: a partial Fisher-Yates over the example indices, driven by
 * splitmix64 from seed ^ a constant of its own, so the held-out set does
 * not move with the loader's shuffle (also seeded by `seed`) and depends on
 * nothing but (seed, number of examples, how many).  The examples keep
 * their order on both sides, so shuffle: false trains in file order. */
#include "engine/data/split.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/rng.h"

#define SPLIT_STREAM 0x6576616c73706c74ull /* "evalsplt": keeps the split's stream apart from the loader's */

mt_status_t eng_split_count(int64_t num_examples, double size, const char *key, int64_t *n_eval, mt_error_t *err) {
    *n_eval = 0;
    if (!(size > 0) || !isfinite(size))
        return mt_error_set(err, MT_ERR_CONFIG, "%s: %g; expected a fraction in (0, 1) or a count >= 1", key, size);
    int64_t n;
    if (size < 1) {
        n = (int64_t)ceil(size * (double)num_examples);
    } else {
        if (size != floor(size))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "%s: %g; a value >= 1 is a count of examples and must be whole (a fraction is "
                                "below 1)",
                                key, size);
        n = size >= 9.2e18 ? INT64_MAX : (int64_t)size;
    }
    if (n >= num_examples)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: %g holds out %lld of the %lld examples, leaving none to train on; hold out fewer",
                            key, size, (long long)n, (long long)num_examples);
    *n_eval = n;
    return MT_OK;
}

/* Uniform in [0, n) by rejection (no modulo bias). */
static uint64_t below(uint64_t *s, uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t v;
    do v = mt_splitmix64(s);
    while (v >= limit);
    return v % n;
}

void eng_split_choose(int64_t num_examples, int64_t n_eval, uint64_t seed, bool *held) {
    MT_CHECK(n_eval >= 0 && n_eval <= num_examples, "eng_split_choose: %lld of %lld", (long long)n_eval,
             (long long)num_examples);
    int64_t *idx = malloc((size_t)(num_examples > 0 ? num_examples : 1) * sizeof *idx);
    MT_CHECK_ALLOC(idx, "evaluation split");
    for (int64_t i = 0; i < num_examples; i++) idx[i] = i, held[i] = false;
    uint64_t s = seed ^ SPLIT_STREAM;
    for (int64_t i = 0; i < n_eval; i++) { /* idx[0..i) are chosen */
        const int64_t j = i + (int64_t)below(&s, (uint64_t)(num_examples - i));
        const int64_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        held[idx[i]] = true;
    }
    free(idx);
}

void eng_dataset_select(const eng_dataset_t *ds, const bool *held, bool want, eng_dataset_t *out) {
    memset(out, 0, sizeof *out);
    out->T = ds->T;
    int64_t n = 0;
    for (int64_t r = 0; r < ds->num_rows; r++) n += held[r] == want;
    const size_t cells = (size_t)(n > 0 ? n : 1) * (size_t)ds->T;
    out->inputs = malloc(cells * sizeof *out->inputs);
    out->targets = malloc(cells * sizeof *out->targets);
    out->mask = malloc(cells * sizeof *out->mask);
    MT_CHECK(out->inputs && out->targets && out->mask, "out of host memory selecting %lld examples", (long long)n);
    const size_t T = (size_t)ds->T;
    for (int64_t r = 0; r < ds->num_rows; r++) {
        if (held[r] != want) continue;
        const size_t from = (size_t)r * T, to = (size_t)out->num_rows * T;
        memcpy(out->inputs + to, ds->inputs + from, T * sizeof *out->inputs);
        memcpy(out->targets + to, ds->targets + from, T * sizeof *out->targets);
        memcpy(out->mask + to, ds->mask + from, T * sizeof *out->mask);
        out->num_rows++;
    }
    /* the warning about mask holes is the whole dataset's, given before a split */
}

mt_status_t eng_dataset_split(eng_dataset_t *ds, double size, uint64_t seed, const char *key, eng_dataset_t *eval,
                              mt_error_t *err) {
    memset(eval, 0, sizeof *eval);
    int64_t n_eval;
    mt_status_t st = eng_split_count(ds->num_rows, size, key, &n_eval, err);
    if (st != MT_OK) return st;
    bool *held = malloc((size_t)ds->num_rows * sizeof *held);
    MT_CHECK_ALLOC(held, "evaluation split");
    eng_split_choose(ds->num_rows, n_eval, seed, held);
    eng_dataset_t train;
    eng_dataset_select(ds, held, true, eval);
    eng_dataset_select(ds, held, false, &train);
    free(held);
    eng_dataset_free(ds);
    *ds = train;
    return MT_OK;
}

int64_t eng_dataset_counted(const eng_dataset_t *ds) {
    int64_t n = 0;
    const size_t cells = (size_t)ds->num_rows * (size_t)ds->T;
    for (size_t i = 0; i < cells; i++) n += ds->targets[i] != -100;
    return n;
}
