// Rotary position embedding, rotate_half convention (rope.h), in place.
//
// One thread per rotated pair (i, i + hd/2) of one head of one token:
// the pair is read, rotated by +angle (forward) or -angle (backward, the
// transpose of the rotation) and written back by the same thread, so the
// in-place update has no hazards.  Position: pos[b, t] when given (packed
// examples restart at 0), else t.  cos/sin (T, hd/2) are device tables
// built on the host by kern_rope_table.
#include "kernels/cuda/kern_cuda.cuh"

#define ROPE_THREADS 256

template <bool Backward>
static __global__ void rope_kernel(float *x, const float *cos_tab, const float *sin_tab,
                                   const int32_t *pos, size_t pairs, int T, int heads, int hd) {
    const int half = hd / 2;
    for (size_t p = (size_t)blockIdx.x * blockDim.x + threadIdx.x; p < pairs;
         p += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(p % (size_t)half);
        const size_t row = p / (size_t)half; // (b, t, h) flattened
        const size_t bt = row / (size_t)heads;
        const int t = pos ? min(max(pos[bt], 0), T - 1) : (int)(bt % (size_t)T);
        float *xr = x + row * (size_t)hd;
        const float c = cos_tab[(size_t)t * half + i], sn = sin_tab[(size_t)t * half + i];
        const float x1 = xr[i], x2 = xr[i + half];
        if (Backward) {
            xr[i] = x1 * c + x2 * sn;
            xr[i + half] = x2 * c - x1 * sn;
        } else {
            xr[i] = x1 * c - x2 * sn;
            xr[i + half] = x2 * c + x1 * sn;
        }
    }
}

template <bool Backward>
static void rope_launch(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                        const int32_t *pos, int B, int T, int heads, int hd, const char *what) {
    MT_CHECK(hd % 2 == 0, "%s: head_dim %d is odd", what, hd);
    const size_t pairs = (size_t)B * T * heads * (hd / 2);
    if (!pairs) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    rope_kernel<Backward><<<kc_blocks(pairs, ROPE_THREADS), ROPE_THREADS, 0, cs>>>(
        x, cos_tab, sin_tab, pos, pairs, T, heads, hd);
    KC_LAUNCHED(s, what);
}

extern "C" {

void kern_rope_fwd_cuda(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                        const int32_t *pos, int B, int T, int heads, int hd) {
    rope_launch<false>(s, x, cos_tab, sin_tab, pos, B, T, heads, hd, "rope_fwd");
}

void kern_rope_bwd_cuda(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                        const int32_t *pos, int B, int T, int heads, int hd) {
    rope_launch<true>(s, x, cos_tab, sin_tab, pos, B, T, heads, hd, "rope_bwd");
}

} // extern "C"
