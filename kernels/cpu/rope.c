/* Rotary embedding on the CPU, rotate_half convention (see rope.h). */
#include "kernels/rope.h"

#include <math.h>
#include <stddef.h>

void kern_rope_table(float *cos_out, float *sin_out, int T, int hd, float theta) {
    const int half = hd / 2;
    for (int i = 0; i < half; i++) {
        /* torch: 1.0 / (base ** (arange(0, dim, 2).float() / dim)), all fp32 */
        const float expo = (float)(2 * i) / (float)hd;
        const float inv_freq = 1.0f / powf(theta, expo);
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            cos_out[(size_t)t * half + i] = cosf(angle);
            sin_out[(size_t)t * half + i] = sinf(angle);
        }
    }
}

static void rope_apply(float *x, const float *cos_tab, const float *sin_tab, int B, int T,
                       int heads, int hd, float sign) {
    const int half = hd / 2;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *c = cos_tab + (size_t)t * half, *sn = sin_tab + (size_t)t * half;
            float *row = x + ((size_t)b * T + t) * (size_t)heads * hd;
            for (int h = 0; h < heads; h++) {
                float *v = row + (size_t)h * hd;
                for (int i = 0; i < half; i++) {
                    const float x1 = v[i], x2 = v[i + half];
                    const float si = sign * sn[i];
                    v[i] = x1 * c[i] - x2 * si;
                    v[i + half] = x2 * c[i] + x1 * si;
                }
            }
        }
}

void kern_rope_fwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       int B, int T, int heads, int hd) {
    (void)s;
    rope_apply(x, cos_tab, sin_tab, B, T, heads, hd, 1.0f);
}

void kern_rope_bwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       int B, int T, int heads, int hd) {
    (void)s;
    rope_apply(x, cos_tab, sin_tab, B, T, heads, hd, -1.0f);
}
