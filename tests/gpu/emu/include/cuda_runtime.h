/* Stand-in for <cuda_runtime.h> in the CPU emulator build: the runtime API
 * types plus the emulated device-side language (cuda_emu.h). */
#ifndef MT_TESTS_GPU_EMU_CUDA_RUNTIME_H
#define MT_TESTS_GPU_EMU_CUDA_RUNTIME_H

#include "cuda_runtime_api.h"
#include "cuda_emu.h"

#endif
