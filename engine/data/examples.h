/* Training examples as readers produce them, before they become rows.
 *
 * An example is what one line of tokenized data holds: its token ids, its
 * labels *unshifted* as HF writes them (labels[t] is the target of the
 * prediction made at t - 1; -100 = not trained) and its attention_mask,
 * plus where it came from (file and line) so every later message can name
 * it.  Readers (tokenized JSONL here; chat templates, alpaca, completion in
 * their own files) append examples; rows of sequence_len positions are
 * built from them afterwards (pack.h: one example per padded row, or
 * several packed), and an evaluation split partitions them by example.
 * Examples are kept whole: truncation to sequence_len happens when rows
 * are built, and is counted there.
 *
 * Storage is one flat array per field, example e owning
 * [off[e], off[e + 1]) of each (no per-example allocation). */
#ifndef MT_ENGINE_DATA_EXAMPLES_H
#define MT_ENGINE_DATA_EXAMPLES_H

#include <stdint.h>

typedef struct {
    int64_t n;        /* examples */
    int64_t *off;     /* (n + 1) start of each example in the arrays below */
    int32_t *ids;     /* (off[n]) token ids */
    int32_t *labels;  /* (off[n]) unshifted labels, -100 = not trained */
    uint8_t *mask;    /* (off[n]) attention_mask: 1 real, 0 padding */
    int32_t *file;    /* (n) index into files */
    int64_t *line;    /* (n) 1-based line in its file */
    char **files;     /* (num_files) paths, owned */
    int num_files;
    int64_t untrained;      /* examples a reader left out for having no trained token (text rows) */
    int64_t cap_n, cap_tok; /* allocated entries (internal) */
} eng_examples_t;

void eng_examples_init(eng_examples_t *ex);
void eng_examples_free(eng_examples_t *ex);
/* Registers a source file and returns its index for eng_examples_add. */
int eng_examples_file(eng_examples_t *ex, const char *path);
/* Appends one example of n tokens (labels NULL: labels = ids; mask NULL:
 * all 1), copied. */
void eng_examples_add(eng_examples_t *ex, const int32_t *ids, const int32_t *labels, const uint8_t *mask,
                      int64_t n, int file, int64_t line);
/* Example e's length and "FILE:LINE" (into buf). */
static inline int64_t eng_example_len(const eng_examples_t *ex, int64_t e) { return ex->off[e + 1] - ex->off[e]; }
const char *eng_example_where(const eng_examples_t *ex, int64_t e, char *buf, int cap);

#endif
