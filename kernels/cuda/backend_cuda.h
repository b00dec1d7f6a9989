/* Entry points of the CUDA backend used by kernels/device.c. */
#ifndef MT_KERNELS_CUDA_BACKEND_CUDA_H
#define MT_KERNELS_CUDA_BACKEND_CUDA_H

#include <stdbool.h>
#include <stddef.h>

#include "kernels/device.h"

mt_status_t kern_cuda_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                    mt_error_t *err);
/* Never aborts: false with the reason (e.g. CUDA error 35) when no GPU. */
bool kern_cuda_probe(char *why, size_t why_len);

#endif
