/* NCCL across the processes of a multi-rank job (kernels/comm_ranks.h's
 * CUDA side, reached through the device sum entry comm_nccl_ranks.c
 * registers, kernels/ranks_registry.h).  The ranks' own transport (MPI
 * under mpirun, TCP under a torchrun-style launch) only bootstraps it: rank
 * 0 makes the unique id, comm_ranks.c hands it to every rank, and each
 * joins with ncclCommInitRank on its own device. */
#ifndef MT_KERNELS_CUDA_COMM_NCCL_RANKS_H
#define MT_KERNELS_CUDA_COMM_NCCL_RANKS_H

#include <stddef.h>

#include "base/status.h"
#include "kernels/device.h"

typedef struct kern_nccl_ranks kern_nccl_ranks_t;

/* The bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES; checked in the .c). */
enum { KERN_NCCL_ID_BYTES = 128 };

/* Rank 0's part: a fresh unique id for the job. */
mt_status_t kern_nccl_ranks_unique_id(unsigned char id[KERN_NCCL_ID_BYTES], mt_error_t *err);
/* Collective over every rank, each with rank 0's id; dev is this rank's
 * CUDA device. */
mt_status_t kern_nccl_ranks_create(kern_device_t *dev, int rank, int size, const unsigned char id[KERN_NCCL_ID_BYTES],
                                   kern_nccl_ranks_t **out, mt_error_t *err);
void kern_nccl_ranks_destroy(kern_nccl_ranks_t *nr);
/* buf (count floats on dev) = the sum over the ranks, in place, on dev's
 * compute stream, which is synchronised before returning.  Only for two
 * ranks: a + b is one rounding and commutative, so both ranks get the bits
 * of the rank-order sum; with three or more NCCL's ring order is not rank
 * order and comm_ranks.c sums through host memory instead. */
void kern_nccl_ranks_sum_f32(kern_nccl_ranks_t *nr, float *buf, size_t count);

#endif
