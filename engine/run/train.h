/* `moetune train`: the whole run from a validated run config. */
#ifndef MT_ENGINE_TRAIN_H
#define MT_ENGINE_TRAIN_H

#include "engine/config/config.h"
#include "engine/parallel/ranks.h"
#include "engine/run/train_result.h"

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
