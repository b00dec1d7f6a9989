/* Stand-in for cuBLASLt's header in the CPU emulator build (tests/gpu/emu). */
#ifndef MT_TESTS_GPU_EMU_CUBLASLT_H
#define MT_TESTS_GPU_EMU_CUBLASLT_H

typedef struct emu_lt *cublasLtHandle_t;
typedef enum { CUBLAS_STATUS_SUCCESS = 0 } cublasStatus_t;

static inline const char *cublasLtGetStatusName(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "CUBLAS_STATUS_SUCCESS" : "emulated";
}
static inline const char *cublasLtGetStatusString(cublasStatus_t s) {
    return s == CUBLAS_STATUS_SUCCESS ? "success" : "emulated";
}

#endif
