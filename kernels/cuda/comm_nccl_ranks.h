/* NCCL across the processes of an mpirun job (kernels/comm_ranks.h's CUDA
 * side).  MPI only bootstraps it: rank 0's ncclUniqueId is broadcast with
 * MPI_Bcast and every rank joins with ncclCommInitRank on its own device. */
#ifndef MT_KERNELS_CUDA_COMM_NCCL_RANKS_H
#define MT_KERNELS_CUDA_COMM_NCCL_RANKS_H

#include <stddef.h>

#include "base/status.h"
#include "kernels/device.h"

typedef struct kern_nccl_ranks kern_nccl_ranks_t;

/* Collective over every rank of MPI_COMM_WORLD (kern_mpi_init done); dev is
 * this rank's CUDA device. */
mt_status_t kern_nccl_ranks_create(kern_device_t *dev, int rank, int size, kern_nccl_ranks_t **out,
                                   mt_error_t *err);
void kern_nccl_ranks_destroy(kern_nccl_ranks_t *nr);
/* buf (count floats on dev) = the sum over the ranks, in place, on dev's
 * compute stream, which is synchronised before returning.  Only for two
 * ranks: a + b is one rounding and commutative, so both ranks get the bits
 * of the rank-order sum; with three or more NCCL's ring order is not rank
 * order and comm_ranks.c takes the MPI path instead. */
void kern_nccl_ranks_sum_f32(kern_nccl_ranks_t *nr, float *buf, size_t count);

#endif
