/* What the engine-level tests in tests/ share: a failure counter with the
 * "FAIL file:line: ..." report, a fixture's run config, a CPU device, the
 * fixture's data and AdamW settings, and a training result (per-step loss
 * and gradient norm, the final weights) with the two comparisons the tests
 * make of two results: bit-identical, or within a relative tolerance.
 *
 * Each test keeps its own plans, its own training loop (they drive the
 * engine in different ways: one executor, several devices, layer-major)
 * and its own tolerances with their reasons; the harness only does the
 * arithmetic and the reporting the same way everywhere. */
#ifndef MOETUNE_TESTS_HARNESS_H
#define MOETUNE_TESTS_HARNESS_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim.h"
#include "engine/model/io/safetensors.h"

/* Counts a failed check and prints where it failed; the test goes on, so
 * one run reports every check that fails.  A macro only to take the
 * caller's __FILE__ and __LINE__. */
#define TH_CHECK(cond, ...)                                      \
    do {                                                         \
        if (!(cond)) th_fail(__FILE__, __LINE__, __VA_ARGS__);   \
    } while (0)

void th_fail(const char *file, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The checks that failed so far. */
int th_failures(void);

/* Prints "N failure(s)" or "all passed"; the test's exit status. */
int th_finish(void);

/* The tests that run in either precision take "--bf16" as their first
 * argument (bf16 mixed precision; fp32 without it) and fixtures after it:
 * the compute dtype, and the index of the first fixture in argv. */
int th_parse_compute(int argc, char **argv, mt_dtype_t *compute);

/* The last part of a fixture's path, for messages. */
const char *th_base_name(const char *dir);

/* |a - b| relative to the larger of the two (1e-30 for two zeros). */
double th_rel(double a, double b);

/* Loads dir/run.yaml. */
mt_status_t th_run_config_load(const char *dir, eng_run_config_t *rc, mt_error_t *err);

/* A CPU device with a device budget (0: none); a failure is a failed check
 * and NULL. */
kern_device_t *th_cpu_device(size_t budget);

/* The run's AdamW settings, clipping as the run config has it. */
eng_optim_hparams_t th_hparams(const eng_run_config_t *rc);

/* The run's datasets, tokenized for a vocabulary of `vocab` words. */
mt_status_t th_dataset_load(eng_dataset_t *ds, const eng_run_config_t *rc, int vocab, mt_error_t *err);

/* Tensor `name` of a safetensors fixture as floats (malloc'ed; numel out
 * when not NULL), or NULL when the file has no such tensor or it cannot be
 * read (said on stderr): a reference the test then reports missing. */
float *th_st_read(const eng_st_file_t *f, const char *name, uint64_t *numel);

enum { TH_MAX_STEPS = 8 };

/* A training run's outcome: per optimizer step the loss (the mean over the
 * micro-batches, as engine/run/train.c logs it) and the gradient norm, and the
 * final fp32 master weights per parameter. */
typedef struct {
    double loss[TH_MAX_STEPS], norm[TH_MAX_STEPS];
    float **weights; /* per parameter, numel[i] floats */
    size_t *numel;
    char **names;
    int nparams;
    bool ok; /* every step ran */
} th_result_t;

/* Copies every parameter's master weights (and names) out of x. */
void th_result_read_weights(th_result_t *r, eng_exec_t *x);
void th_result_free(th_result_t *r);
/* The bytes of the fp32 weights read (what a device budget is set against). */
size_t th_result_bytes(const th_result_t *r);

/* Losses and gradient norms of `steps` steps: exact, bit-identical; else the
 * first step's loss bit-identical (same weights, same forward) and the rest
 * within `tol` relative. */
void th_compare_steps(const char *what, const th_result_t *a, const th_result_t *b, int steps, bool exact,
                      double tol);

/* Final weights: exact, every tensor bit-identical; else within `tol`
 * relative in L2 over the whole model and per tensor, except the tensors
 * whose names contain `noise` (NULL: none), which count only in the
 * whole-model bound.  Prints one line with the differing tensors, the
 * whole-model and worst-tensor differences and the worst element. */
void th_compare_weights(const char *what, const th_result_t *a, const th_result_t *b, bool exact, double tol,
                        const char *noise);

#endif
