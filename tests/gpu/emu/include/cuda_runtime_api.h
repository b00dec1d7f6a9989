/* Stand-in for the CUDA runtime API header in the CPU emulator build of the
 * CUDA kernels (tests/gpu/emu): only the types and names the kernels' shared
 * headers mention.  Nothing here talks to a GPU. */
#ifndef MT_TESTS_GPU_EMU_CUDA_RUNTIME_API_H
#define MT_TESTS_GPU_EMU_CUDA_RUNTIME_API_H

typedef struct emu_stream *cudaStream_t;
typedef struct emu_event *cudaEvent_t;
typedef enum { cudaSuccess = 0, cudaErrorNotReady = 600, cudaErrorEmulated = 999 } cudaError_t;

static inline const char *cudaGetErrorName(cudaError_t e) {
    return e == cudaSuccess ? "cudaSuccess" : "cudaErrorEmulated";
}
static inline const char *cudaGetErrorString(cudaError_t e) {
    return e == cudaSuccess ? "no error" : "error in the CPU emulator";
}

#endif
