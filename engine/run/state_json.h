/* trainer_state.json read into typed values before anything is loaded.
 *
 * A resume trusts global_step for the learning-rate schedule, the steps
 * left and which checkpoint comes next, and the data position for the
 * loader; a value of the wrong type read as 0 (jansson's default) would
 * resume as a fresh run on trained weights.  So every field a resume uses
 * is checked here for presence, type and range, and global_step against
 * the directory's own number (checkpoint-N holds step N), each failure
 * naming the file, the key, the value found and what was expected.  Kept
 * apart from state.c, which needs a model and an executor, so that the
 * fuzz harness (tools/fuzz/fuzz_trainer_state.c) reaches the reader with
 * nothing else. */
#ifndef MT_ENGINE_RUN_STATE_JSON_H
#define MT_ENGINE_RUN_STATE_JSON_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* One log_history entry as read (loss, learning_rate, grad_norm NaN when null). */
typedef struct {
    int step;
    double loss, lr, grad_norm;
    int skipped;
    int eval; /* an evaluation's entry (it has eval_loss): the fields below, NaN when null */
    double eval_loss, eval_runtime, eval_samples_per_s, eval_steps_per_s, epoch;
} eng_state_log_t;

typedef struct {
    json_t *root;            /* the whole document, for the identity checks */
    int global_step;         /* 0 .. 2e9, == the directory's N when it has one */
    int nonfinite_skipped;   /* 0 .. global_step */
    int64_t epoch, cursor;   /* data position: both >= 0 */
    int64_t rows;            /* examples the run was trained on, >= 0 */
    eng_state_log_t *log;    /* (log_count) */
    int log_count;
} eng_state_doc_t;

/* Parses text (len bytes) of path, checks every field a resume uses.
 * dir_n: the N of the checkpoint-N directory it lies in, or -1 when the
 * directory is not so named (global_step is then not compared).  On
 * MT_OK, doc holds what to free with eng_state_doc_free. */
mt_status_t eng_state_doc_parse(const char *path, const char *text, size_t len, int dir_n, eng_state_doc_t *doc,
                                mt_error_t *err);

void eng_state_doc_free(eng_state_doc_t *doc);

/* N of a directory path ending in "checkpoint-N" (trailing '/' allowed), else -1. */
int eng_state_dir_number(const char *dir);

#endif
