/* Collectives across the processes ("ranks") of one run, as mpirun starts
 * them: one host copy of the model per rank, each rank with its own local
 * devices (the in-process collective over those is device.h's kern_comm).
 *
 * How a process learns it is a rank: mpirun's environment (Open MPI's
 * OMPI_COMM_WORLD_SIZE, or a PMI/PMIx launcher's PMI_SIZE / PMIX_RANK).
 * Without it there is one rank and MPI is never initialised.  torchrun's
 * WORLD_SIZE > 1 without an MPI launcher is refused, naming mpirun: its
 * rendezvous is not MPI's, and pretending to be one rank of N would train N
 * unsynchronised copies.
 *
 * The gradient sum is the part training depends on: every rank must get the
 * same bits, the rank-order sum 0..R-1 in fp32, so that identical optimizer
 * steps keep the weights identical without broadcasting them.  Host buffers
 * go through MPI (allgather, then a sequential add: kernels/cpu/comm_mpi.c);
 * device buffers through NCCL on a CUDA device when there are two ranks
 * (one commutative add: the same bits), else through host memory and MPI.
 *
 * Every call is collective: each rank makes the same calls in the same
 * order with the same counts, from the thread that created the object. */
#ifndef MT_KERNELS_COMM_RANKS_H
#define MT_KERNELS_COMM_RANKS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "kernels/device.h"

typedef struct kern_ranks kern_ranks_t;

/* Whether mpirun's environment is present (before anything is created:
 * a caller that must not act on every rank at once can ask first). */
bool kern_ranks_launched(void);

/* One rank (no MPI) unless the environment says mpirun started this
 * process; MT_ERR_CONFIG for torchrun-style variables without it. */
mt_status_t kern_ranks_create(kern_ranks_t **out, mt_error_t *err);
/* MPI_Finalize when create initialised MPI (only after every rank is done). */
void kern_ranks_destroy(kern_ranks_t *r);
int kern_ranks_rank(const kern_ranks_t *r);
int kern_ranks_size(const kern_ranks_t *r);
/* This rank's index among the ranks on its node (0 with one rank): which
 * of the node's GPUs it should take. */
int kern_ranks_local_rank(const kern_ranks_t *r);

/* Device buffers passed to kern_ranks_sum_f32 live on dev (this rank's
 * primary device): on CUDA with two ranks, sets up NCCL across the ranks. */
mt_status_t kern_ranks_bind_device(kern_ranks_t *r, kern_device_t *dev, mt_error_t *err);

/* buf (count floats) = the rank-order fp32 sum over the ranks r with
 * contrib[r] (an array of size ranks, the same on every rank), the same
 * bits on every rank.  on_device: buf is a device pointer of the bound
 * device, whose work on it has finished, and a non-contributor's buffer
 * holds zeros (NCCL adds it). */
void kern_ranks_sum_f32(kern_ranks_t *r, float *buf, size_t count, bool on_device, const bool *contrib);
/* recv (ranks * bytes) = every rank's send, in rank order. */
void kern_ranks_allgather(kern_ranks_t *r, const void *send, void *recv, size_t bytes);
/* the largest v over the ranks */
int kern_ranks_max_int(kern_ranks_t *r, int v);
void kern_ranks_barrier(kern_ranks_t *r);
/* Ends every rank of the job with exit code `code` (MPI_Abort): for an
 * error on one rank while the others wait in a collective it will never
 * join.  With one rank it only exits. */
_Noreturn void kern_ranks_abort(kern_ranks_t *r, int code);

#endif
