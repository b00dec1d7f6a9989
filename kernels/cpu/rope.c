/* Rotary embedding on the CPU, rotate_half convention (see rope.h). The
 * per-element formulas are the header's, in the same order, on vec.h's
 * lanes when hd/2 is a multiple of 16 or hd is 16 (scalar otherwise). */
#include "kernels/rope.h"

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"

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

typedef struct {
    float *x;
    const float *cos_tab, *sin_tab;
    const int32_t *pos; /* (B, T) or NULL */
    int B, T, heads, hd, per;
    float sign;
} rope_job_t;

/* Rows (b, t) in [r0, r1): every head of the row rotated by its position
 * (t, or pos[b, t]). */
KERN_CPU_CLONES static void rope_rows(const rope_job_t *J, int r0, int r1) {
    const int half = J->hd / 2;
    const kern_vf_t pm = {-1, -1, -1, -1, -1, -1, -1, -1, 1, 1, 1, 1, 1, 1, 1, 1};
    for (int row = r0; row < r1; row++) {
        const int p = J->pos ? J->pos[row] : row % J->T;
        const int t = p < 0 ? 0 : p >= J->T ? J->T - 1 : p;
        const float *c = J->cos_tab + (size_t)t * half, *sn = J->sin_tab + (size_t)t * half;
        float *xr = J->x + (size_t)row * J->heads * J->hd;
        float cs2[KERN_VL], sn2[KERN_VL]; /* hd 16: [c | c] and [sign s | sign s] */
        if (half == KERN_VL / 2)
            for (int i = 0; i < half; i++) {
                cs2[i] = cs2[i + half] = c[i];
                sn2[i] = sn2[i + half] = J->sign * sn[i];
            }
        for (int h = 0; h < J->heads; h++) {
            float *v = xr + (size_t)h * J->hd;
            int i = 0;
            if (half == KERN_VL / 2) { /* hd 16: the head is one vector [x1 | x2] */
                const kern_vf_t v16 = kern_vf_load(v);
                const kern_vf_t sw = __builtin_shufflevector(v16, v16, 8, 9, 10, 11, 12, 13, 14, 15,
                                                             0, 1, 2, 3, 4, 5, 6, 7); /* [x2 | x1] */
                const kern_vf_t c2 = kern_vf_load(cs2), s2 = kern_vf_load(sn2);
                /* [x1 c - x2 s | x2 c + x1 s]: a - b is a + (-b) exactly */
                kern_vf_store(v, v16 * c2 + sw * s2 * pm);
                continue;
            }
            if (half % KERN_VL == 0) {
                const kern_vf_t sg = kern_vf_splat(J->sign);
                for (; i < half; i += KERN_VL) {
                    const kern_vf_t x1 = kern_vf_load(v + i), x2 = kern_vf_load(v + i + half);
                    const kern_vf_t ci = kern_vf_load(c + i), si = sg * kern_vf_load(sn + i);
                    kern_vf_store(v + i, x1 * ci - x2 * si);
                    kern_vf_store(v + i + half, x2 * ci + x1 * si);
                }
            }
            for (; i < half; i++) {
                const float x1 = v[i], x2 = v[i + half];
                const float si = J->sign * sn[i];
                v[i] = x1 * c[i] - x2 * si;
                v[i + half] = x2 * c[i] + x1 * si;
            }
        }
    }
}

static void rope_task(void *ctx, size_t t) {
    const rope_job_t *J = ctx;
    const int rows = J->B * J->T;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < rows ? r0 + J->per : rows;
    rope_rows(J, r0, r1);
}

/* Rows are independent: fixed blocks of rows over the backend's pool. */
static void rope_apply(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int B, int T, int heads, int hd, float sign) {
    const int width = heads * hd;
    if (B <= 0 || T <= 0 || width <= 0) return;
    rope_job_t J = {.x = x, .cos_tab = cos_tab, .sin_tab = sin_tab, .pos = pos, .B = B, .T = T, .heads = heads,
                    .hd = hd, .per = width < 16384 ? 16384 / width : 1, .sign = sign};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)B * T, (size_t)J.per), rope_task, &J);
}

void kern_rope_fwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int B, int T, int heads, int hd) {
    rope_apply(s, x, cos_tab, sin_tab, pos, B, T, heads, hd, 1.0f);
}

void kern_rope_bwd_cpu(kern_stream_t *s, float *x, const float *cos_tab, const float *sin_tab,
                       const int32_t *pos, int B, int T, int heads, int hd) {
    rope_apply(s, x, cos_tab, sin_tab, pos, B, T, heads, hd, -1.0f);
}
