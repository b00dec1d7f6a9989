/* MPI underneath kernels/comm_ranks.h: the world of processes mpirun
 * started, and the collectives the cross-rank interface builds on (the
 * gradient sum and the max are comm_ranks.c's, over the gather).
 * comm_ranks.c reaches these only through the transport entry comm_mpi.c
 * registers (kernels/ranks_registry.h); the engine never does.
 *
 * Everything runs on MPI_COMM_WORLD from the thread that called
 * kern_mpi_init (MPI_THREAD_FUNNELED): the engine's device threads never
 * touch MPI. */
#ifndef MT_KERNELS_CPU_COMM_MPI_H
#define MT_KERNELS_CPU_COMM_MPI_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* MPI_Init_thread unless MPI is up already (*initialised says whether this
 * call did it; MPI cannot be initialised again after MPI_Finalize, which is
 * reported as an error), then this process's rank, the world's size and the
 * rank's index among the ranks of its node. */
mt_status_t kern_mpi_init(int *rank, int *size, int *local_rank, bool *initialised, mt_error_t *err);
/* MPI_Finalize; for the caller whose kern_mpi_init initialised MPI. */
void kern_mpi_finalize(void);

/* recv (size * bytes) = every rank's send (bytes), in rank order. */
void kern_mpi_allgather(const void *send, void *recv, size_t bytes);
void kern_mpi_barrier(void);
_Noreturn void kern_mpi_abort(int code);

#endif
