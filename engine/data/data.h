/* Training data: tokenized JSONL (axolotl "tokenized" format) and llm.c
 * token files, turned into micro-batches of shifted targets.
 *
 * JSONL lines are read as examples (examples.h) and rows are built from
 * them (pack.h): one example per row, padded, or with sample_packing
 * several whole examples per row.  A padded row of T = sequence_len
 * positions holds:
 *   inputs  (T)  token ids (padding: pad id 0)
 *   targets (T)  the label of the *next* position, i.e. labels[t+1], with
 *               -100 for ignored / padded positions and for the last position
 *               (HF shifts inside the model; we shift once, here).
 *   mask    (T)  attention_mask (1 real, 0 padding), used by the aux loss.
 *   kv_len       per batch row: the keys attention may read, the position
 *               of the row's last mask 1, plus 1 (eng_mask_kv_len). With
 *               right padding that is HF's key-padding mask exactly; a 0
 *               before the last 1 (left padding, holes) is not masked, and
 *               the dataset counts such rows (mask_holes) so the run can
 *               say so once.
 * JSONL: labels absent -> labels = input_ids; examples longer than T are
 * truncated, shorter ones padded with label -100 and mask 0.
 * Packed rows (pack.h) hold the same three arrays with targets shifted
 * within each example, plus seg_start (T): where each position's example
 * starts; batches add pos = t - seg_start, the position within the example.
 * llm.c .bin: one stream; row i is tokens [i*T, i*T + T] (T + 1 tokens),
 * inputs the first T, targets the last T; all mask 1.
 * Token ids >= vocab_size (or < 0) are errors naming file and line / offset
 * (vocab_size <= 0: ids are only checked to fit int32). */
#ifndef MT_ENGINE_DATA_H
#define MT_ENGINE_DATA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/config/config.h"

typedef struct {
    int T;
    int64_t num_rows;
    int32_t *inputs;  /* (num_rows, T) */
    int32_t *targets; /* (num_rows, T) */
    uint8_t *mask;    /* (num_rows, T) */
    int32_t *seg_start; /* (num_rows, T) packed rows (pack.h); NULL: one example per row */
    int64_t mask_holes;          /* rows whose mask has a 0 before its last 1 */
    char mask_holes_first[600];  /* "FILE:LINE" of the first such row */
    int64_t examples;    /* JSONL examples in rows (llm.c streams count none) */
    int64_t truncated;   /* examples longer than T, cut */
    int64_t dropped;     /* packed: examples without a trained target, left out */
    int64_t real_tokens; /* mask-1 positions in all rows */
} eng_dataset_t;

typedef struct {
    int T;           /* sequence_len */
    int vocab_size;  /* <= 0: ids only checked to fit int32 */
    bool pack;       /* sample_packing (pack.h); refused for llm.c .bin files */
    uint64_t seed;   /* packing's tie order */
    /* the run config's entries the paths come from (their type says how a
     * row becomes tokens, text.h), or NULL: every file tokenized; text rows
     * are encoded by `text` */
    const eng_dataset_entry_t *entries;
    const struct eng_text *text;
    /* dataset_prepared_path (prepared.h): JSONL files' examples cached
     * there, or NULL; what happened is counted in *report (may be NULL) */
    const char *prepared_dir;
    struct eng_data_report *report;
} eng_data_opts_t;

/* What reading the files did with the prepared-data cache. */
typedef struct eng_data_report {
    int files_cached;   /* JSONL files whose examples were read from the cache */
    int files_written;  /* ... tokenized and written to it */
    char note[600];     /* the first cache file that failed its checks, or "" */
} eng_data_report_t;

/* Loads and concatenates the files in order (format from extension:
 * .jsonl / .json lines, .bin). */
mt_status_t eng_dataset_load(eng_dataset_t *ds, const char *const *paths, int num_paths, int T,
                             int vocab_size, mt_error_t *err);
mt_status_t eng_dataset_load_opts(eng_dataset_t *ds, const char *const *paths, int num_paths,
                                  const eng_data_opts_t *opts, mt_error_t *err);
void eng_dataset_free(eng_dataset_t *ds);
/* Real tokens over the rows' positions (real_tokens / (num_rows * T)). */
double eng_dataset_efficiency(const eng_dataset_t *ds);

/* Keys attention may read in a row of mask (T): the last 1's position + 1
 * (0 when the row has no 1). */
int eng_mask_kv_len(const uint8_t *mask, int T);
/* When some rows' mask is not right padding (ds->mask_holes > 0), writes a
 * one-line warning for the user into buf and returns true. */
bool eng_dataset_mask_warning(const eng_dataset_t *ds, char *buf, size_t cap);

typedef struct {
    int B, T;        /* B rows actually present (the last batch of an epoch may be smaller) */
    int32_t *inputs; /* (B, T), owned by the loader, valid until the next call */
    int32_t *targets;
    uint8_t *mask;
    int32_t *kv_len; /* (B) eng_mask_kv_len of each row */
    int32_t *seg_start; /* (B, T) packed rows: each position's example start; NULL otherwise */
    int32_t *pos;       /* (B, T) packed rows: t - seg_start, the RoPE position; NULL otherwise */
    bool padded;     /* some kv_len < T */
    int64_t counted; /* number of targets != -100 */
    /* which micro-batch of the run this is, from its place in the data
     * (epoch * batches per epoch + index in the epoch): seeds what must be
     * random per micro-batch yet the same on a rerun or a resume (LoRA's
     * dropout masks) */
    uint64_t serial;
} eng_batch_t;

typedef struct {
    const eng_dataset_t *ds;
    int micro_batch;
    bool shuffle;
    uint64_t seed;
    int64_t *order;  /* permutation of rows for the current epoch */
    int64_t cursor;  /* next position in order */
    int epoch;       /* 0-based */
    int32_t *buf_inputs, *buf_targets, *buf_kv_len, *buf_seg, *buf_pos;
    uint8_t *buf_mask;
} eng_loader_t;

/* Micro-batches walk the rows in order (or in a per-epoch permutation
 * drawn from seed and epoch when shuffle), the last one of an epoch being
 * smaller when rows do not divide evenly, as torch's DataLoader does. */
void eng_loader_init(eng_loader_t *ld, const eng_dataset_t *ds, int micro_batch, bool shuffle,
                     uint64_t seed);
void eng_loader_free(eng_loader_t *ld);
/* Puts the loader where it was after some batches of a run with the same
 * dataset, micro-batch size, shuffle and seed (a resumed run): epoch and
 * cursor as they were.  False when they do not fit the dataset. */
bool eng_loader_seek(eng_loader_t *ld, int epoch, int64_t cursor);
/* Fills *batch with the next micro-batch, starting a new epoch when one
 * ends; returns true when this batch starts a new epoch (after the first). */
bool eng_loader_next(eng_loader_t *ld, eng_batch_t *batch);
/* Micro-batches in one epoch. */
int64_t eng_loader_batches_per_epoch(const eng_loader_t *ld);
/* The next k micro-batches as copies that outlive the loader's buffers (a
 * step that holds all of its micro-batches at once); free them with
 * eng_batches_free. */
eng_batch_t *eng_loader_take(eng_loader_t *ld, int k);
void eng_batches_free(eng_batch_t *bs, int k);

#endif
