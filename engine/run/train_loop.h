/* The step loop of `moetune train` (engine/run/train.h), apart from the
 * run's set-up (engine/run/session.h) and its end (train.c): what one
 * optimizer step does, how it is reported and logged, and which steps end
 * with a checkpoint or a stop.  Private to engine/run. */
#ifndef MT_ENGINE_RUN_TRAIN_LOOP_H
#define MT_ENGINE_RUN_TRAIN_LOOP_H

#include "engine/run/session.h"
#include "engine/run/train_result.h"

/* Runs the optimizer steps of run from its training state's step to its
 * total, saving checkpoints as save_strategy says.  result gets the steps
 * done, the first and last loss, the checkpoints saved and the seconds the
 * steps took; a signal stops the run after a checkpoint
 * (result->stopped_by_signal, result->last_checkpoint) and returns MT_OK.
 * A step that fails or diverges returns its error, naming the step. */
mt_status_t eng_train_steps(eng_run_t *run, eng_train_result_t *result, mt_error_t *err);

#endif
