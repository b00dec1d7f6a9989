/* Training examples (examples.h): flat growable arrays, doubled as they
 * fill, so a data set of millions of short examples costs a few reallocs. */
#include "engine/data/examples.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void eng_examples_init(eng_examples_t *ex) {
    memset(ex, 0, sizeof *ex);
    ex->off = malloc(sizeof *ex->off);
    MT_CHECK_ALLOC(ex->off, "example offsets");
    ex->off[0] = 0;
}

void eng_examples_free(eng_examples_t *ex) {
    if (!ex) return;
    free(ex->off);
    free(ex->ids);
    free(ex->labels);
    free(ex->mask);
    free(ex->file);
    free(ex->line);
    for (int i = 0; i < ex->num_files; i++) free(ex->files[i]);
    free(ex->files);
    memset(ex, 0, sizeof *ex);
}

int eng_examples_file(eng_examples_t *ex, const char *path) {
    char **f = realloc(ex->files, (size_t)(ex->num_files + 1) * sizeof *f);
    MT_CHECK_ALLOC(f, "example file names");
    ex->files = f;
    f[ex->num_files] = strdup(path);
    MT_CHECK_ALLOC(f[ex->num_files], "example file name");
    return ex->num_files++;
}

static void *grow(void *p, int64_t n, size_t elem, const char *what) {
    void *q = realloc(p, (size_t)n * elem);
    MT_CHECK_ALLOC(q, what);
    return q;
}

void eng_examples_add(eng_examples_t *ex, const int32_t *ids, const int32_t *labels, const uint8_t *mask,
                      int64_t n, int file, int64_t line) {
    if (ex->n + 1 > ex->cap_n) {
        ex->cap_n = ex->cap_n ? 2 * ex->cap_n : 64;
        ex->off = grow(ex->off, ex->cap_n + 1, sizeof *ex->off, "example offsets");
        ex->file = grow(ex->file, ex->cap_n, sizeof *ex->file, "example files");
        ex->line = grow(ex->line, ex->cap_n, sizeof *ex->line, "example lines");
    }
    const int64_t o = ex->off[ex->n];
    if (o + n > ex->cap_tok) {
        int64_t cap = ex->cap_tok ? ex->cap_tok : 1024;
        while (cap < o + n) cap *= 2;
        ex->ids = grow(ex->ids, cap, sizeof *ex->ids, "example token ids");
        ex->labels = grow(ex->labels, cap, sizeof *ex->labels, "example labels");
        ex->mask = grow(ex->mask, cap, sizeof *ex->mask, "example attention masks");
        ex->cap_tok = cap;
    }
    memcpy(ex->ids + o, ids, (size_t)n * sizeof *ids);
    memcpy(ex->labels + o, labels ? labels : ids, (size_t)n * sizeof *ids);
    if (mask) memcpy(ex->mask + o, mask, (size_t)n);
    else memset(ex->mask + o, 1, (size_t)n);
    ex->file[ex->n] = file;
    ex->line[ex->n] = line;
    ex->off[++ex->n] = o + n;
}

const char *eng_example_where(const eng_examples_t *ex, int64_t e, char *buf, int cap) {
    snprintf(buf, (size_t)cap, "%s:%" PRId64, ex->files[ex->file[e]], ex->line[e]);
    return buf;
}
