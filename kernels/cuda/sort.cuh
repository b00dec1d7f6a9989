// Stable key sort shared by moe_plan and embedding_bwd (sort.cu).
#ifndef MT_KERNELS_CUDA_SORT_CUH
#define MT_KERNELS_CUDA_SORT_CUH

#include "kernels/cuda/kern_cuda.cuh"

// Sorts the n keys (each < 2^key_bits, or any int32 with key_bits = 32)
// stably on s: *keys_out gets them ascending and *pos_out[i] the original
// index of keys_out[i].  Both point into s's scratch and stay valid until
// the next op that uses scratch on s.  n > 0.
void kc_sort_positions(kern_stream_t *s, const int32_t *keys, int n, int key_bits,
                       int32_t **keys_out, int32_t **pos_out, const char *what);

#endif
