/* The evaluation split: HF's counts (a fraction rounds up, a count is
 * whole), refusals naming the key, a choice that depends on the seed alone
 * (same seed, same examples; another seed, others), disjoint sides that
 * keep every example once and in order. */
#include "engine/data/split.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define EXPECT(c)                                                                       \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

static void test_counts(void) {
    mt_error_t err;
    int64_t n;
    EXPECT(eng_split_count(40, 0.2, "val_set_size", &n, &err) == MT_OK && n == 8);
    EXPECT(eng_split_count(41, 0.2, "val_set_size", &n, &err) == MT_OK && n == 9); /* ceil(8.2) */
    EXPECT(eng_split_count(10, 0.01, "val_set_size", &n, &err) == MT_OK && n == 1);
    EXPECT(eng_split_count(40, 3, "val_set_size", &n, &err) == MT_OK && n == 3);
    EXPECT(eng_split_count(40, 40, "val_set_size", &n, &err) == MT_ERR_CONFIG && strstr(err.msg, "none to train"));
    EXPECT(eng_split_count(1, 0.5, "val_set_size", &n, &err) == MT_ERR_CONFIG && strstr(err.msg, "val_set_size"));
    EXPECT(eng_split_count(40, 2.5, "val_set_size", &n, &err) == MT_ERR_CONFIG && strstr(err.msg, "whole"));
    EXPECT(eng_split_count(40, 0, "val_set_size", &n, &err) == MT_ERR_CONFIG);
}

static void test_choice(void) {
    enum { N = 200, K = 37 };
    bool a[N], b[N], c[N];
    eng_split_choose(N, K, 42, a);
    eng_split_choose(N, K, 42, b);
    eng_split_choose(N, K, 43, c);
    int na = 0, same_ab = 1, diff_ac = 0;
    for (int i = 0; i < N; i++) {
        na += a[i];
        same_ab &= a[i] == b[i];
        diff_ac += a[i] != c[i];
    }
    EXPECT(na == K);
    EXPECT(same_ab);
    EXPECT(diff_ac > 0);
    /* not simply the first or last K */
    int first = 0, last = 0;
    for (int i = 0; i < K; i++) first += a[i], last += a[N - 1 - i];
    EXPECT(first < K && last < K);
}

static void test_split_dataset(void) {
    enum { R = 20, T = 3 };
    eng_dataset_t ds = {.T = T, .num_rows = R};
    ds.inputs = malloc(sizeof(int32_t) * R * T);
    ds.targets = malloc(sizeof(int32_t) * R * T);
    ds.mask = malloc(R * T);
    for (int i = 0; i < R * T; i++) ds.inputs[i] = i, ds.targets[i] = i % 3 == 2 ? -100 : i, ds.mask[i] = 1;
    EXPECT(eng_dataset_counted(&ds) == R * 2);
    eng_dataset_t ev;
    mt_error_t err;
    EXPECT(eng_dataset_split(&ds, 0.25, 7, "val_set_size", &ev, &err) == MT_OK);
    EXPECT(ev.num_rows == 5 && ds.num_rows == 15 && ev.T == T);
    /* every example once, each side in order, rows intact */
    int seen[R] = {0};
    int prev = -1;
    for (int64_t r = 0; r < ev.num_rows; r++) {
        int orig = ev.inputs[r * T] / T;
        EXPECT(orig > prev);
        prev = orig;
        seen[orig]++;
        EXPECT(ev.inputs[r * T + 2] == orig * T + 2 && ev.targets[r * T + 2] == -100);
    }
    prev = -1;
    for (int64_t r = 0; r < ds.num_rows; r++) {
        int orig = ds.inputs[r * T] / T;
        EXPECT(orig > prev);
        prev = orig;
        seen[orig]++;
    }
    for (int i = 0; i < R; i++) EXPECT(seen[i] == 1);
    eng_dataset_free(&ds);
    eng_dataset_free(&ev);
}

int main(void) {
    test_counts();
    test_choice();
    test_split_dataset();
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    else printf("all passed\n");
    return failures ? 1 : 0;
}
