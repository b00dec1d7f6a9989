// AdamW on the device (adamw.h), for optimizer state kept on the GPU.
//
// One thread per element, grid-stride.  The arithmetic is adamw_math.h's,
// the host kernel's exact op order; with --fmad=false (this file's build)
// the only fused op is the explicit fmaf of torch's lerp, and sqrtf and
// division are IEEE, so the device update is bit-identical to the host one.
// Coefficients are computed once on the host, as the host kernel does.
#include "kernels/cuda/kern_cuda.cuh"

extern "C" {
#include "kernels/math/adamw_math.h"
}

#define ADAMW_THREADS 256

static __global__ void adamw_kernel(float *p, float *m, float *v, const float *g,
                                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                                    kern_adamw_coef_t c) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const float gi = g ? g[i] : mt_bf16_to_f32(g_bf16[i]);
        float mi = m[i], vi = v[i];
        const float pi = kern_adamw_elem(&c, p[i], &mi, &vi, gi);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (p_bf16) p_bf16[i] = mt_f32_to_bf16(pi);
    }
}

extern "C" void kern_adamw_cuda(kern_stream_t *s, float *p, float *m, float *v, const float *g,
                                const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                                const kern_adamw_params_t *hp) {
    MT_CHECK(hp != NULL, "kern_adamw_cuda: hyperparameters are NULL");
    MT_CHECK((g == NULL) != (g_bf16 == NULL),
             "kern_adamw_cuda: pass exactly one of g (fp32) and g_bf16 (got %s)",
             g ? "both" : "neither");
    MT_CHECK(hp->step >= 1, "kern_adamw_cuda: step must be >= 1 (got %lld)", (long long)hp->step);
    if (n == 0) return;
    const kern_adamw_coef_t c = kern_adamw_coef(hp);
    cudaStream_t cs = kern_cuda_stream_begin(s);
    adamw_kernel<<<kc_blocks(n, ADAMW_THREADS), ADAMW_THREADS, 0, cs>>>(p, m, v, g, g_bf16, p_bf16,
                                                                        n, c);
    KC_LAUNCHED(s, "adamw");
}
