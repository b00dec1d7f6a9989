/* Collectives across the processes ("ranks") of one run: one host copy of
 * the model per rank, each rank with its own local devices (the in-process
 * collective over those is device.h's kern_comm).
 *
 * How a process learns it is a rank, and how the ranks talk, is up to the
 * transports the program links (ranks_registry.h; //kernels/backends:ranks
 * links both of these), asked in this order:
 * - mpirun's environment (Open MPI's OMPI_COMM_WORLD_SIZE, or a PMI/PMIx
 *   launcher's PMI_SIZE / PMIX_RANK): MPI (kernels/cpu/comm_mpi.c).
 * - else torchrun's (WORLD_SIZE > 1 with RANK, MASTER_ADDR, MASTER_PORT):
 *   the ranks meet over TCP at rank 0 (kernels/cpu/comm_tcp.c).
 * - else one rank, and nothing is initialised (also when the program links
 *   no transport).
 *
 * The gradient sum is the part training depends on: every rank must get the
 * same bits, the rank-order sum 0..R-1 in fp32, so that identical optimizer
 * steps keep the weights identical without broadcasting them.  Host buffers
 * are gathered and added in rank order (comm_ranks.c, over either
 * transport); device buffers go through the device backend's own sum where
 * one is linked and gives those bits (NCCL on CUDA devices with two ranks,
 * one commutative add: kernels/cuda/comm_nccl_ranks.c,
 * //kernels/backends:nccl_ranks), else through host memory.
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

/* Whether a linked transport's launcher (mpirun, torchrun) started this
 * process (before anything is created: a caller that must not act on every
 * rank at once can ask first). */
bool kern_ranks_launched(void);

/* One rank unless the environment says a launcher started this process;
 * MT_ERR_CONFIG naming the variable for a torchrun-style launch that lacks
 * or garbles one, and the rendezvous's errors (comm_tcp.h). */
mt_status_t kern_ranks_create(kern_ranks_t **out, mt_error_t *err);
/* Closes the connections, or MPI_Finalize when create initialised MPI
 * (only after every rank is done). */
void kern_ranks_destroy(kern_ranks_t *r);
int kern_ranks_rank(const kern_ranks_t *r);
int kern_ranks_size(const kern_ranks_t *r);
/* This rank's index among the ranks on its node (0 with one rank): which
 * of the node's GPUs it should take. */
int kern_ranks_local_rank(const kern_ranks_t *r);
/* What started the ranks, for messages: "mpirun", "a torchrun-style
 * launch" or "one process". */
const char *kern_ranks_launcher(const kern_ranks_t *r);

/* Device buffers passed to kern_ranks_sum_f32 live on dev (this rank's
 * primary device): where the device's backend has a sum across ranks for
 * this many ranks (NCCL on CUDA with two), sets it up. */
mt_status_t kern_ranks_bind_device(kern_ranks_t *r, kern_device_t *dev, mt_error_t *err);

/* buf (count floats) = the rank-order fp32 sum over the ranks r with
 * contrib[r] (an array of size ranks, the same on every rank), the same
 * bits on every rank.  on_device: buf is a device pointer of the bound
 * device, whose work on it has finished, and a non-contributor's buffer
 * holds zeros (a device sum adds it). */
void kern_ranks_sum_f32(kern_ranks_t *r, float *buf, size_t count, bool on_device, const bool *contrib);
/* recv (ranks * bytes) = every rank's send, in rank order. */
void kern_ranks_allgather(kern_ranks_t *r, const void *send, void *recv, size_t bytes);
/* the largest v over the ranks */
int kern_ranks_max_int(kern_ranks_t *r, int v);
void kern_ranks_barrier(kern_ranks_t *r);
/* Ends every rank of the job with exit code `code` (MPI_Abort; over TCP the
 * closed connections end the others at their next collective): for an
 * error on one rank while the others wait in a collective it will never
 * join.  With one rank it only exits. */
_Noreturn void kern_ranks_abort(kern_ranks_t *r, int code);

#endif
