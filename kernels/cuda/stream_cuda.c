/* What every CUDA kernel entry point asks of its stream (declared in
 * backend_cuda_internal.h): make the stream's device current, hand out the
 * stream's scratch, opt in to shared memory, check a launch.
 *
 * Its own file, below everything else of the backend: the .cu kernels, the
 * products (gemm_cuda.c, gemm_mm_cuda.c), NCCL and the device itself
 * (backend_cuda.c) all call these, while these call none of them, so the
 * backend's files call each other in one direction only. */
#include <stdio.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"

int kern_cuda_current_device(void) {
    int d = -1;
    if (cudaGetDevice(&d) != cudaSuccess) {
        (void)cudaGetLastError();
        return -1;
    }
    return d;
}

void kern_cuda_set_device(int ordinal) { MT_CUDA_CHECK(cudaSetDevice(ordinal)); }

cudaStream_t kern_cuda_stream_begin(kern_stream_t *s) {
    MT_CHECK(s != NULL, "CUDA kernel called with a NULL stream (use kern_stream(dev, role))");
    kern_cuda_set_device(s->dev->ordinal);
    return s->cs;
}

size_t kern_cuda_scratch_capacity(const kern_stream_t *s) { return s->scratch_bytes; }

void *kern_cuda_scratch(kern_stream_t *s, size_t bytes, const char *what) {
    MT_CHECK(bytes <= s->scratch_bytes,
             "%s needs %zu bytes of stream scratch, the %s stream of CUDA device %d has %zu "
             "(KERN_CUDA_SCRATCH_*_BYTES in kernels/cuda/backend_cuda_internal.h)",
             what, bytes, s->role == KERN_STREAM_COMPUTE ? "compute" : "copy", s->dev->ordinal,
             s->scratch_bytes);
    return s->scratch;
}

void kern_cuda_smem_optin(kern_stream_t *s, const void *kernel, size_t bytes, const char *what) {
    MT_CHECK(bytes <= s->dev->max_smem_optin,
             "%s needs %zu bytes of shared memory per block, CUDA device %d allows %zu", what, bytes,
             s->dev->ordinal, s->dev->max_smem_optin);
    if (bytes > 48 * 1024)
        MT_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)bytes));
}

void kern_cuda_after_launch(kern_stream_t *s, const char *file, int line, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess && s->dev->sync_check) e = cudaStreamSynchronize(s->cs);
    if (e != cudaSuccess)
        mt_fatal(file, line, "CUDA error %d (%s: %s) in kernel %s on device %d%s", (int)e,
                 cudaGetErrorName(e), cudaGetErrorString(e), what, s->dev->ordinal,
                 s->dev->sync_check ? "" : " (set MOETUNE_CUDA_SYNC=1 to attribute faults)");
}
