/* The one check family for CUDA, cuBLAS/cuBLASLt and NCCL calls.
 *
 * A failed call is a fatal error (status.h): the message names the call as
 * written, file:line, the library's error name and text, and the device that
 * was current, then aborts through mt_fatal's hook.  Recoverable situations
 * (no GPU, budget larger than free memory, cudaMalloc refused) are checked
 * by hand where they happen and returned as mt_status_t instead.
 *
 * Included by C (backend_cuda.c, gemm_cuda.c) and by the .cu files, so the
 * macros expand to plain C. */
#ifndef MT_KERNELS_CUDA_CUDA_CHECK_H
#define MT_KERNELS_CUDA_CUDA_CHECK_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include "base/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The current device ordinal for messages; -1 when even that query fails. */
int kern_cuda_current_device(void);

#ifdef __cplusplus
}
#endif

#define MT_CUDA_CHECK(call)                                                                     \
    do {                                                                                        \
        cudaError_t mt_e_ = (call);                                                             \
        if (mt_e_ != cudaSuccess)                                                               \
            mt_fatal(__FILE__, __LINE__, "CUDA error %d (%s: %s) in %s on device %d", (int)mt_e_, \
                     cudaGetErrorName(mt_e_), cudaGetErrorString(mt_e_), #call,                 \
                     kern_cuda_current_device());                                               \
    } while (0)

#define MT_CUBLAS_CHECK(call)                                                                   \
    do {                                                                                        \
        cublasStatus_t mt_s_ = (call);                                                          \
        if (mt_s_ != CUBLAS_STATUS_SUCCESS)                                                     \
            mt_fatal(__FILE__, __LINE__, "cuBLAS error %d (%s: %s) in %s on device %d",         \
                     (int)mt_s_, cublasLtGetStatusName(mt_s_), cublasLtGetStatusString(mt_s_), \
                     #call, kern_cuda_current_device());                                        \
    } while (0)

#define MT_NCCL_CHECK(call)                                                                     \
    do {                                                                                        \
        ncclResult_t mt_r_ = (call);                                                            \
        if (mt_r_ != ncclSuccess)                                                               \
            mt_fatal(__FILE__, __LINE__, "NCCL error %d (%s) in %s on device %d", (int)mt_r_,  \
                     ncclGetErrorString(mt_r_), #call, kern_cuda_current_device());             \
    } while (0)

#endif
