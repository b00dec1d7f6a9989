/* Rows from examples (examples.h): one example per padded row, or several
 * examples packed into each row (sample_packing).
 *
 * A row holds T = sequence_len positions (data.h has the layout: inputs,
 * shifted targets with -100, mask).  An example of n tokens is truncated to
 * T (counted in `truncated`), and within it position t's target is
 * labels[t + 1]; its last kept position has none (-100).
 *
 * Padded (pack false): example e is row e, bit for bit the rows moetune
 * always built; no example is dropped, even one with no trained token
 * (that row still routes tokens for the aux loss, as before).
 *
 * Packed (pack true): an example's trailing attention_mask zeros are cut
 * first (pre-padded data packs by its real tokens); an example left with no
 * trained target is dropped (counted in `dropped`: it would add compute and
 * aux-loss tokens and no language-model loss).  The rest are placed
 * first-fit-decreasing into rows of T (length descending, ties in an order
 * drawn from seed, so the packing is a function of the data and the seed);
 * each row holds whole examples one after another, then padding (inputs 0,
 * targets -100, mask 0).  Targets never cross an example's end: the last
 * token of one example does not predict the first of the next.
 * seg_start (rows, T) is where each position's example starts in its row
 * (padding: where the padding starts); attention lets a token see only its
 * own example and RoPE restarts positions there (kernels/attention.h,
 * kernels/rope.h).  Rows are shuffled per epoch by the loader as always. */
#ifndef MT_ENGINE_DATA_PACK_H
#define MT_ENGINE_DATA_PACK_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/data/examples.h"

typedef struct {
    int T;
    int64_t rows, cap;
    int32_t *inputs, *targets; /* (rows, T) */
    uint8_t *mask;             /* (rows, T) */
    int32_t *seg_start;        /* (rows, T) when packed, else NULL */
    int64_t mask_holes;        /* rows whose mask has a 0 before its last 1 */
    char mask_holes_first[600];
    int64_t examples;   /* examples that became (part of) rows */
    int64_t truncated;  /* of those, longer than T and cut */
    int64_t dropped;    /* packed only: examples with no trained target */
    int64_t real_tokens; /* mask-1 positions over all rows */
} eng_rows_t;

/* Room for `more` rows (seg_start too when `packed`). */
void eng_rows_reserve(eng_rows_t *r, int64_t more, bool packed);
void eng_rows_free(eng_rows_t *r);
/* Appends rows built from every example of ex, padded or packed (above). */
void eng_rows_add_examples(eng_rows_t *r, const eng_examples_t *ex, bool pack, uint64_t seed);

#endif
