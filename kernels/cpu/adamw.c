/* Placeholder scalar AdamW so the CPU backend links; the SIMD,
 * multithreaded version replaces this file (issue 6). */
#include "kernels/adamw.h"

#include <math.h>

#include "kernels/dtype.h"

void kern_adamw_cpu(kern_stream_t *s, float *p, float *m, float *v, const float *g,
                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                    const kern_adamw_params_t *hp) {
    (void)s;
    const float bc1 = 1.0f - powf(hp->beta1, (float)hp->step);
    const float bc2_sqrt = sqrtf(1.0f - powf(hp->beta2, (float)hp->step));
    const float step_size = hp->lr / bc1;
    const float decay = 1.0f - hp->lr * hp->weight_decay;
    for (size_t i = 0; i < n; i++) {
        float gi = (g ? g[i] : mt_bf16_to_f32(g_bf16[i])) * hp->grad_scale;
        float pi = p[i] * decay;
        float mi = m[i] + (1.0f - hp->beta1) * (gi - m[i]);
        float vi = v[i] * hp->beta2 + (1.0f - hp->beta2) * gi * gi;
        float denom = sqrtf(vi) / bc2_sqrt + hp->eps;
        pi -= step_size * (mi / denom);
        p[i] = pi;
        m[i] = mi;
        v[i] = vi;
        if (p_bf16) p_bf16[i] = mt_f32_to_bf16(pi);
    }
}
