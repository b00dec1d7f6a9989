/* Entry points of the CUDA backend (the device layer reaches them through
 * the entry backend_cuda.c registers, backend_registry.h), plus what the
 * CUDA backend offers beyond the common interface: NCCL for two local GPUs.
 *
 * Everything here links and runs on a machine without a GPU: the probe and
 * the create/init functions then return "no GPU" (CUDA error 35 on the CI
 * machine), they never abort. */
#ifndef MT_KERNELS_CUDA_BACKEND_CUDA_H
#define MT_KERNELS_CUDA_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/device.h"
#include "base/dtype.h"

mt_status_t kern_cuda_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                    mt_error_t *err);
/* Never aborts: false with the reason (e.g. CUDA error 35) when no GPU. */
bool kern_cuda_probe(char *why, size_t why_len);

/* NCCL communicators over local GPUs of this process (ncclCommInitAll), for
 * two-GPU data parallelism.  Other code should use device.h's kern_comm
 * (built on these, one rank per thread); these stay for the backend's own
 * tests. */
typedef struct kern_cuda_nccl kern_cuda_nccl_t;
/* ordinals: ndev CUDA device ordinals. MT_ERR_DEVICE when they cannot be
 * opened (no GPU, too few GPUs, NCCL failure), with the reason. */
mt_status_t kern_cuda_nccl_create(const int *ordinals, int ndev, kern_cuda_nccl_t **out,
                                  mt_error_t *err);
void kern_cuda_nccl_destroy(kern_cuda_nccl_t *nc);
int kern_cuda_nccl_size(const kern_cuda_nccl_t *nc);
/* In-place sum of n floats across the devices: bufs[i] lives on the i-th
 * device of the communicator and the reduction is ordered on streams[i]
 * (streams of devices created on the same ordinals). */
void kern_cuda_nccl_allreduce_sum(kern_cuda_nccl_t *nc, kern_stream_t *const *streams,
                                  float *const *bufs, size_t n);

#endif
