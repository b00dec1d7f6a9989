/* Which way the CPU forms bf16 products (gemm_internal.h's
 * kern_cpu_bf16_path_t), asked of the CPU at run time.  Its own file
 * because both product routes ask it: gemm_typed.c picks the route with it
 * and gemm_dpbf16.c refuses to run where the CPU lacks the instructions, so
 * neither route calls into the other. */
#include "kernels/cpu/gemm_internal.h"

const char *kern_cpu_bf16_path_name(kern_cpu_bf16_path_t path) {
    switch (path) {
    case KERN_CPU_BF16_SGEMM: return "bf16->fp32 + sgemm";
    case KERN_CPU_BF16_DPBF16: return "avx512bf16 vdpbf16ps";
    default: return "?";
    }
}

bool kern_cpu_bf16_path_available(kern_cpu_bf16_path_t path) {
    switch (path) {
    case KERN_CPU_BF16_SGEMM: return true;
    case KERN_CPU_BF16_DPBF16:
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    default: return false;
    }
}

kern_cpu_bf16_path_t kern_cpu_bf16_path_default(void) {
    return kern_cpu_bf16_path_available(KERN_CPU_BF16_DPBF16) ? KERN_CPU_BF16_DPBF16
                                                               : KERN_CPU_BF16_SGEMM;
}
