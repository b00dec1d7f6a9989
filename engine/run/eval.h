/* Evaluation during and after training: the evaluation set (held out of
 * the training data by val_set_size, or test_datasets), when it is run
 * (eval_steps), and one pass over it.
 *
 * The eval loss is the cross entropy of every trained target (label !=
 * -100) of the whole evaluation set, summed and divided by their number:
 * the token mean over the set, not a mean of the batches' means (which
 * would weigh a short last batch or a batch of short examples more).  No
 * aux loss is added.  eval_ppl = exp(eval_loss).
 *
 * The pass is forward only, through the run's executor under its plan
 * (eng_exec_forward): no gradient, no optimizer state, nothing saved, LoRA
 * adapters applied with dropout off; it reads no random state and moves no
 * loader, so a run with evaluation trains the same bits as one without. */
#ifndef MT_ENGINE_RUN_EVAL_H
#define MT_ENGINE_RUN_EVAL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"

typedef struct {
    double loss;      /* summed token cross entropy / counted targets */
    double ppl;       /* exp(loss) */
    int64_t counted;  /* trained targets of the set */
    int64_t tokens;   /* positions run (padding included) */
    int64_t examples;
    int batches;
    double seconds;
} eng_eval_result_t;

/* The evaluation set of a run whose training data is *train: test_datasets
 * read (tokens checked against vocab), or val_set_size examples moved out
 * of *train (engine/data/split.h, from seed); eval is left empty (zeroed)
 * when the run has neither.  A set without a trained target is refused. */
mt_status_t eng_eval_open_set(const eng_run_config_t *rc, int vocab, eng_dataset_t *train, eng_dataset_t *eval,
                              mt_error_t *err);

/* Whether optimizer step `done` (1-based) of `total` ends with an
 * evaluation: every eval_steps steps (HF Trainer's eval_strategy "steps",
 * which adds none at the end); eval_steps unset: after the last step only;
 * 0: never. */
bool eng_eval_due(const eng_run_config_t *rc, const eng_dataset_t *eval, int done, int total);

/* One pass over eval in batches of eval_batch_size (micro_batch_size when
 * unset), in order, on x. */
mt_status_t eng_eval_run(eng_exec_t *x, const eng_run_config_t *rc, const eng_dataset_t *eval,
                         eng_eval_result_t *out, mt_error_t *err);

#endif
