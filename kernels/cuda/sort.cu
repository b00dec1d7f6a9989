// Stable sort of int32 keys with their positions, for the two ops whose
// determinism rests on grouping equal keys in index order: moe_plan (slots
// by expert) and embedding_bwd (tokens by id).
//
// CUB's radix sort is stable, so the output (keys ascending, equal keys in
// ascending original position) is unique: deterministic by construction,
// whatever the GPU.  Buffers come from the stream's scratch:
//   [keys_out n][pos_in n][pos_out n][CUB temporary storage]
#include "kernels/cuda/sort.cuh"

#include <cub/device/device_radix_sort.cuh>

static __global__ void sort_iota_kernel(int32_t *pos, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) pos[i] = i;
}

static size_t sort_align(size_t b) { return (b + 255) & ~(size_t)255; }

void kc_sort_positions(kern_stream_t *s, const int32_t *keys, int n, int key_bits,
                       int32_t **keys_out, int32_t **pos_out, const char *what) {
    MT_CHECK(n > 0 && key_bits >= 1 && key_bits <= 32, "%s: sort of %d keys of %d bits", what, n,
             key_bits);
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const size_t arr = sort_align((size_t)n * sizeof(int32_t));
    size_t temp_bytes = 0;
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, keys, (int32_t *)nullptr,
                                                  (const int32_t *)nullptr, (int32_t *)nullptr, n,
                                                  0, key_bits, cs));
    char *base = (char *)kern_cuda_scratch(s, 3 * arr + temp_bytes, what);
    int32_t *kout = (int32_t *)base, *pin = (int32_t *)(base + arr), *pout = (int32_t *)(base + 2 * arr);
    sort_iota_kernel<<<kc_blocks((size_t)n, 256), 256, 0, cs>>>(pin, n);
    KC_LAUNCHED(s, what);
    MT_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(base + 3 * arr, temp_bytes, keys, kout, pin, pout,
                                                  n, 0, key_bits, cs));
    KC_LAUNCHED(s, what);
    *keys_out = kout;
    *pos_out = pout;
}
