/* `moetune train`: the whole run from a validated run config. */
#ifndef MT_ENGINE_TRAIN_H
#define MT_ENGINE_TRAIN_H

#include "engine/config/config.h"
#include "engine/parallel/ranks.h"
#include "kernels/device.h"

typedef struct {
    int steps_done;          /* the run's step count at the end (a resumed run's includes the earlier steps) */
    int first_step;          /* steps already done when this run started: those of the resumed checkpoint */
    double first_loss, last_loss;
    double seconds;
    double predicted_step_s; /* the planner's prediction for the chosen plan (0 if none) */
    bool model_saved;        /* the final model is in output_dir (save_final) */
    int checkpoints_saved;   /* output_dir/checkpoint-N directories written (save_steps) */
    int stopped_by_signal;   /* SIGINT / SIGTERM stopped the run after a checkpoint (0: it ran to the end) */
    char last_checkpoint[2048]; /* the checkpoint-N written when a signal stopped the run */
    int rank, ranks;         /* this process's rank of a multi-rank job and the job's size (0 and 1 alone);
                                only rank 0 wrote output_dir */
} eng_train_result_t;

/* Chooses the backend as the config says (auto: CUDA when a GPU is found,
 * else the CPU with a one-line notice; cuda without a GPU is an error). */
mt_status_t eng_open_device(const eng_run_config_t *rc, kern_device_t **out, mt_error_t *err);

/* Refuses an output_dir that overlaps an input, then holds output_dir's run
 * lock (engine/model/io/outdir.h) for the whole run: a second run on the same
 * output_dir fails naming this one's pid.  Started by mpirun or a
 * torchrun-style launch, the process
 * is one rank of a data-parallel job (engine/parallel/ranks.h): rank 0 alone locks
 * and writes output_dir, and an error on any rank ends every rank
 * (kern_ranks_abort) after printing it with the rank's number (the others may be
 * waiting in a collective the failed rank will never join). */
mt_status_t eng_train(const eng_run_config_t *rc, eng_train_result_t *result, mt_error_t *err);
/* eng_train as one rank of ranks (engine/parallel/ranks.h), which the caller opened
 * and closes: closing (MPI_Finalize under mpirun) waits for every rank, so rank 0 can
 * report the job before any rank exits (mpirun ends the job when one exits
 * with an error status, as a stopped run does). */
mt_status_t eng_train_ranked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                             mt_error_t *err);

#endif
