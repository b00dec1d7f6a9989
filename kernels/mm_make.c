/* kern_mm_make: typed views from the fp32 argument list (see gemm.h). */
#include "kernels/gemm.h"

kern_mm_t kern_mm_make(float *C, const void *A, mt_dtype_t a_dt, const void *B, mt_dtype_t b_dt, int M, int N,
                       int K, bool trans_a, bool trans_b, float alpha, float beta, mt_dtype_t compute) {
    return (kern_mm_t){
        .C = {.data = C, .dtype = MT_F32, .rows = M, .cols = N},
        .A = {.data = (void *)A, .dtype = a_dt, .rows = trans_a ? K : M, .cols = trans_a ? M : K},
        .B = {.data = (void *)B, .dtype = b_dt, .rows = trans_b ? N : K, .cols = trans_b ? K : N},
        .trans_a = trans_a,
        .trans_b = trans_b,
        .alpha = alpha,
        .beta = beta,
        .compute = compute,
    };
}
