/* MT_HD marks small inline functions that both the CPU twins (C) and the
 * CUDA kernels (.cu) compile, so the CPU tests exercise the GPU's
 * per-element arithmetic too. These are the only functions defined in
 * headers. */
#ifndef MT_BASE_HD_H
#define MT_BASE_HD_H

#ifdef __CUDACC__
#define MT_HD __host__ __device__ static inline
#else
#define MT_HD static inline
#endif

#endif
