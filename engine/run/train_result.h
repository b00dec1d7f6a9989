/* What a training run reports back to its caller (`moetune train`, the
 * tests): its own header, because the run's end (train.c) and its step
 * loop (train_loop.c) both fill it, and neither should include the other. */
#ifndef MT_ENGINE_RUN_TRAIN_RESULT_H
#define MT_ENGINE_RUN_TRAIN_RESULT_H

#include <stdbool.h>

typedef struct {
    int steps_done;          /* the run's step count at the end (a resumed run's includes the earlier steps) */
    int first_step;          /* steps already done when this run started: those of the resumed checkpoint */
    double first_loss, last_loss;
    bool has_eval;           /* an evaluation ran (engine/run/eval.h): the last one's loss and step */
    double eval_loss;
    int eval_step;
    double seconds;
    double predicted_step_s; /* the planner's prediction for the chosen plan (0 if none) */
    bool model_saved;        /* the final model is in output_dir (save_final) */
    int checkpoints_saved;   /* output_dir/checkpoint-N directories written (save_steps) */
    int stopped_by_signal;   /* SIGINT / SIGTERM stopped the run after a checkpoint (0: it ran to the end) */
    char last_checkpoint[2048]; /* the checkpoint-N written when a signal stopped the run */
    int nvme_base_homes;     /* frozen base weights the NVMe tier holds (a LoRA run's base; 0: none) */
    int nvme_base_unpacked;  /* of them, quantised ones written to it straight from the base checkpoint,
                                never held in host memory */
    int rank, ranks;         /* this process's rank of a multi-rank job and the job's size (0 and 1 alone);
                                only rank 0 wrote output_dir */
} eng_train_result_t;

#endif
