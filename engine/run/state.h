/* What a checkpoint-N holds beyond the model so that a stopped run resumes
 * exactly, and how a run finds and loads it.
 *
 * checkpoint-N/ is an HF model directory (config.json, model.safetensors)
 * plus, in the same atomic save (engine/model/io/outdir.h: the completion manifest
 * covers every file):
 *   optimizer.safetensors  per trained parameter NAME: NAME.step (I64
 *                          scalar, its AdamW step count: experts that got no
 *                          tokens are stepped less often), NAME.exp_avg and
 *                          NAME.exp_avg_sq (when step > 0: F32, BF16 with
 *                          optimizer_state bf16, or U8 codes beside
 *                          NAME.exp_avg.absmax and NAME.exp_avg_sq.absmax,
 *                          F32 per 256 elements, with 8bit; the metadata's
 *                          "optimizer_state" names the format) and
 *                          NAME.master (F32, when the model is saved in a
 *                          narrower dtype than the fp32 master);
 *   trainer_state.json     global_step, epoch, the loader's position (epoch,
 *                          row cursor, shuffle seed), the log history, and
 *                          the run's identity (parameter names and shapes,
 *                          adapter settings, hyperparameters) that a resume
 *                          is checked against.
 * The learning-rate schedule is a function of the step, so global_step is
 * its position; the loader's shuffle is a function of (seed, epoch), so
 * the position is (epoch, cursor).  There is no other random state in a
 * training step. */
#ifndef MT_ENGINE_TRAIN_STATE_H
#define MT_ENGINE_TRAIN_STATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/place/types.h"
#include "engine/model/model.h"
#include "engine/model/io/outdir.h"
#include "base/dtype.h"
#include "base/status.h"

#define ENG_TRAINER_STATE_FILE "trainer_state.json"
#define ENG_OPTIM_STATE_FILE "optimizer.safetensors"
/* optimizer.safetensors' metadata key naming the moments' format (fp32,
 * bf16, 8bit; absent in files from before the formats: fp32) */
#define ENG_OPTIM_FORMAT_KEY "optimizer_state"

/* One logged optimizer step or evaluation (HF Trainer's log_history
 * entries: an evaluation's holds eval_loss, eval_runtime,
 * eval_samples_per_second, eval_steps_per_second, epoch and step). */
typedef struct {
    int step;
    double loss, lr, grad_norm;
    bool skipped; /* non-finite, not applied (skip_nonfinite_steps) */
    bool eval;    /* an evaluation after this step: the eval_ fields and epoch, not loss, lr, grad_norm */
    double eval_loss, eval_runtime, eval_samples_per_s, eval_steps_per_s, epoch;
} eng_log_entry_t;

typedef struct {
    int global_step;        /* optimizer steps done (skipped ones included) */
    int nonfinite_skipped;  /* steps skipped for a non-finite loss or gradient */
    eng_log_entry_t *log;   /* (log_count) one entry per step */
    int log_count, log_cap;
} eng_train_state_t;

void eng_train_state_init(eng_train_state_t *ts);
void eng_train_state_free(eng_train_state_t *ts);
void eng_train_state_log(eng_train_state_t *ts, const eng_log_entry_t *e);

/* What a checkpoint save adds to the model's files. */
typedef struct {
    eng_exec_t *exec;  /* the model is the one it runs */
    const eng_run_config_t *rc;
    const eng_train_state_t *ts;
    const eng_loader_t *loader;
    int total_steps;
    mt_dtype_t save_dtype; /* of the model's weights: fp32 masters are kept when narrower */
} eng_train_state_save_t;

/* Writes optimizer.safetensors and trainer_state.json into the open save
 * tx (ctx is an eng_train_state_save_t); the caller commits. */
mt_status_t eng_train_state_write(eng_ckpt_dir_t *tx, void *ctx, mt_error_t *err);

/* Whether optimizer step `done` (1-based, just finished) of `total` ends
 * with a checkpoint under save_strategy (the last step has the final save
 * instead). */
bool eng_train_state_save_due(const eng_run_config_t *rc, int done, int total, int64_t steps_per_epoch);

/* Writes output_dir/checkpoint-n with the model and its training state in
 * one atomic save, then deletes what save_total_limit no longer keeps (only
 * once the new one is complete).  last holds the last complete checkpoint
 * ("" = none), named in the error when the save fails (it is intact then),
 * and receives the new one's path. */
mt_status_t eng_train_state_checkpoint(const eng_train_state_save_t *ss, int n, char *last, size_t cap,
                                       mt_error_t *err);

/* The checkpoint resume_from_checkpoint names: the path as given, or the
 * complete checkpoint-N of output_dir with the largest N (latest: true).
 * Incomplete ones (no completion manifest, or one that does not match) are
 * skipped with a warning on stderr naming them.  out = "" when the config
 * asks for no resume.  No complete checkpoint, or a path that is not one,
 * is MT_ERR_CONFIG naming the key and the directory. */
mt_status_t eng_train_state_resolve(const eng_run_config_t *rc, char *out, size_t cap, mt_error_t *err);

/* Loads a checkpoint's state into the model x runs, opened from the run's base_model
 * and a loader over the run's data: checks the run's identity against it
 * (another model or parameter set, other adapter settings or another
 * dataset is MT_ERR_CONFIG naming the key), writes every trained
 * parameter's master, moments and step count, moves the loader to the
 * saved position and fills ts.  note receives a line about hyperparameters
 * that changed (allowed, as the HF Trainer allows them), or "". */
mt_status_t eng_train_state_load(const char *dir, eng_exec_t *x, const eng_run_config_t *rc,
                                 eng_loader_t *ld, eng_train_state_t *ts, char *note, size_t note_cap,
                                 mt_error_t *err);

/* Deletes the oldest complete checkpoint-N of output_dir until at most
 * limit remain (limit 0: keeps all); keep_n is never deleted (the one just
 * written).  Incomplete ones are left to eng_outdir_recover and warnings. */
void eng_train_state_prune(const char *output_dir, int limit, int keep_n);

#endif
