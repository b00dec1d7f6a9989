/* sample_packing (pack.h): rows hold whole examples, targets shift within
 * each example only, seg_start and the batches' positions mark where each
 * example starts, the 1-token example (no target) is dropped and the long
 * one truncated (both counted), trailing attention_mask zeros are cut, the
 * packing is a function of the data and the seed, llm.c streams are
 * refused, and a loader put back where a run stopped (a resume) yields the
 * same packed micro-batches, bit for bit, from a freshly loaded data set. */
#include "engine/data/data.h"

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

enum { T = 8 };

static const char *write_data(void) {
    static char p[1200];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(p, sizeof p, "%s/pack.jsonl", tmp ? tmp : "/tmp");
    FILE *f = fopen(p, "wb");
    if (!f) exit(2);
    /* token ids 10e + t (example e, position t) so every token names its example */
    fputs("{\"input_ids\": [10, 11, 12, 13, 14]}\n", f);
    fputs("{\"input_ids\": [20, 21, 22], \"labels\": [-100, -100, 22]}\n", f);
    fputs("{\"input_ids\": [30, 31, 32, 33, 34, 35, 36]}\n", f);
    fputs("{\"input_ids\": [40, 41]}\n", f);
    fputs("{\"input_ids\": [50, 51, 52, 53, 0, 0], \"attention_mask\": [1, 1, 1, 1, 0, 0]}\n", f);
    fputs("{\"input_ids\": [60]}\n", f); /* no target: dropped */
    fputs("{\"input_ids\": [70, 71, 72, 73, 74, 75, 76, 77, 78, 79]}\n", f); /* truncated to 8 */
    fputs("{\"input_ids\": [80, 81, 82, 83, 84, 85]}\n", f);
    fclose(f);
    return p;
}

static void check_rows(const eng_dataset_t *ds) {
    int seen[9] = {0};
    for (int64_t r = 0; r < ds->num_rows; r++) {
        const int32_t *in = ds->inputs + r * T, *tg = ds->targets + r * T, *sg = ds->seg_start + r * T;
        const uint8_t *mk = ds->mask + r * T;
        for (int t = 0; t < T; t++) {
            if (!mk[t]) { /* padding: to the row's end, its own segment */
                for (int u = t; u < T; u++) EXPECT(!mk[u] && in[u] == 0 && tg[u] == -100 && sg[u] == t);
                break;
            }
            const int e = in[t] / 10, at = in[t] % 10;
            EXPECT(sg[t] == t - at);                     /* the example starts where its token 0 is */
            if (at == 0) seen[e]++;
            const bool last = t + 1 == T || !mk[t + 1] || in[t + 1] / 10 != e;
            if (last) EXPECT(tg[t] == -100);             /* never the next example's first token */
            else if (e == 2 && at == 0) EXPECT(tg[t] == -100); /* its label -100 */
            else EXPECT(tg[t] == in[t + 1]);
        }
    }
    for (int e = 1; e <= 8; e++) EXPECT(seen[e] == (e == 6 ? 0 : 1)); /* whole, once; 60 dropped */
}

static void test_pack(const char *path) {
    eng_dataset_t ds, again, other;
    mt_error_t err = {0};
    eng_data_opts_t o = {.T = T, .vocab_size = 100, .pack = true, .seed = 3};
    EXPECT(eng_dataset_load_opts(&ds, &path, 1, &o, &err) == MT_OK);
    /* 35 real tokens (5+3+7+2+4+8+6, after cutting and truncating) in rows of 8: 5 rows at best */
    EXPECT(ds.examples == 7 && ds.dropped == 1 && ds.truncated == 1 && ds.real_tokens == 35);
    EXPECT(ds.num_rows == 5 && ds.seg_start);
    EXPECT(eng_dataset_efficiency(&ds) == 35.0 / 40.0);
    check_rows(&ds);
    EXPECT(eng_dataset_load_opts(&again, &path, 1, &o, &err) == MT_OK);
    EXPECT(again.num_rows == ds.num_rows &&
           !memcmp(again.inputs, ds.inputs, (size_t)ds.num_rows * T * sizeof(int32_t)) &&
           !memcmp(again.seg_start, ds.seg_start, (size_t)ds.num_rows * T * sizeof(int32_t)));
    o.seed = 4; /* another seed: the same quality, rows possibly in another order */
    EXPECT(eng_dataset_load_opts(&other, &path, 1, &o, &err) == MT_OK && other.num_rows == ds.num_rows);
    check_rows(&other);

    /* batches: seg_start and positions t - seg_start; resume from (epoch, cursor) */
    eng_loader_t a, b;
    eng_batch_t x, y;
    eng_loader_init(&a, &ds, 2, true, 9);
    for (int k = 0; k < 4; k++) eng_loader_next(&a, &x); /* into the second epoch */
    const int epoch = a.epoch;
    const int64_t cursor = a.cursor;
    eng_loader_init(&b, &again, 2, true, 9);
    EXPECT(eng_loader_seek(&b, epoch, cursor));
    for (int k = 0; k < 5; k++) {
        eng_loader_next(&a, &x);
        eng_loader_next(&b, &y);
        const size_t n = (size_t)x.B * T;
        EXPECT(x.B == y.B && x.serial == y.serial && x.seg_start && x.pos && y.seg_start);
        EXPECT(!memcmp(x.inputs, y.inputs, n * 4) && !memcmp(x.targets, y.targets, n * 4) &&
               !memcmp(x.seg_start, y.seg_start, n * 4) && !memcmp(x.pos, y.pos, n * 4));
        for (size_t i = 0; i < n; i++) EXPECT(x.pos[i] == (int32_t)(i % T) - x.seg_start[i]);
    }
    eng_batch_t *kept = eng_loader_take(&a, 2);
    EXPECT(kept[0].seg_start && kept[0].pos && kept[1].seg_start);
    eng_batches_free(kept, 2);
    eng_loader_free(&a);
    eng_loader_free(&b);
    eng_dataset_free(&ds);
    eng_dataset_free(&again);
    eng_dataset_free(&other);
}

/* Padded: what eng_dataset_load always built, and no segments in batches. */
static void test_padded(const char *path) {
    eng_dataset_t a, b;
    mt_error_t err = {0};
    const eng_data_opts_t o = {.T = T, .vocab_size = 100};
    EXPECT(eng_dataset_load_opts(&a, &path, 1, &o, &err) == MT_OK && eng_dataset_load(&b, &path, 1, T, 100, &err) == MT_OK);
    EXPECT(a.num_rows == 8 && !a.seg_start && a.dropped == 0 && a.truncated == 1);
    EXPECT(!memcmp(a.targets, b.targets, (size_t)a.num_rows * T * 4));
    eng_loader_t ld;
    eng_batch_t x;
    eng_loader_init(&ld, &a, 3, false, 1);
    eng_loader_next(&ld, &x);
    EXPECT(!x.seg_start && !x.pos);
    eng_loader_free(&ld);
    eng_dataset_free(&a);
    eng_dataset_free(&b);
}

static void test_refused(void) {
    static char p[1200];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(p, sizeof p, "%s/stream.bin", tmp ? tmp : "/tmp");
    FILE *f = fopen(p, "wb");
    if (!f) exit(2);
    int32_t hdr[256] = {20240520, 1, 20};
    fwrite(hdr, sizeof hdr, 1, f);
    uint16_t tok[20] = {0};
    fwrite(tok, sizeof tok, 1, f);
    fclose(f);
    const char *path = p;
    eng_dataset_t ds;
    mt_error_t err = {0};
    const eng_data_opts_t o = {.T = T, .vocab_size = 100, .pack = true};
    EXPECT(eng_dataset_load_opts(&ds, &path, 1, &o, &err) == MT_ERR_CONFIG && strstr(err.msg, "sample_packing") &&
           strstr(err.msg, "stream.bin"));
}

int main(void) {
    const char *path = write_data();
    test_pack(path);
    test_padded(path);
    test_refused();
    if (failures) fprintf(stderr, "pack_test: %d failure(s)\n", failures);
    else printf("pack_test: all passed\n");
    return failures != 0;
}
