/* Stand-in for NCCL's header in the CPU emulator build (tests/gpu/emu). */
#ifndef MT_TESTS_GPU_EMU_NCCL_H
#define MT_TESTS_GPU_EMU_NCCL_H

typedef enum { ncclSuccess = 0 } ncclResult_t;

static inline const char *ncclGetErrorString(ncclResult_t r) { return r == ncclSuccess ? "no error" : "emulated"; }

#endif
