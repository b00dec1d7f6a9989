/* CPU twins of gpt-oss's ops (see kernels/gpt_oss.h).  Small next to the
 * products around them (one pass over the attention output or the experts'
 * hidden), so they run on the calling thread.  The sink gradient sums its
 * rows in double in (b, t) order: deterministic, and the CUDA twin's
 * reference. */
#include <math.h>

#include "kernels/gpt_oss.h"
#include "kernels/math/gpt_oss_math.h"

void kern_attn_sink_fwd_cpu(kern_stream_t *s, float *out, float *lse, const float *sinks, int B, int T, int nh,
                            int hd) {
    (void)s;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                float *l = &lse[((size_t)b * nh + h) * T + t];
                const float l2 = kern_sink_lse(*l, sinks[h]);
                const float scale = *l == -INFINITY ? 0.0f : expf(*l - l2);
                float *o = out + (((size_t)b * T + t) * nh + h) * hd;
                for (int d = 0; d < hd; d++) o[d] *= scale;
                *l = l2;
            }
}

void kern_attn_sink_bwd_cpu(kern_stream_t *s, float *dsinks, const float *dout, const float *out, const float *lse,
                            const float *sinks, int B, int T, int nh, int hd) {
    (void)s;
    for (int h = 0; h < nh; h++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const size_t row = (((size_t)b * T + t) * nh + h) * hd;
                double dot = 0.0;
                for (int d = 0; d < hd; d++) dot += (double)dout[row + d] * out[row + d];
                const float p_sink = expf(sinks[h] - lse[((size_t)b * nh + h) * T + t]);
                acc -= (double)p_sink * dot;
            }
        dsinks[h] += (float)acc;
    }
}

void kern_swiglu_clamped_fwd_cpu(kern_stream_t *s, float *h, const float *gu, float alpha, float limit, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) h[i] = kern_swiglu_clamped_elem(gu[2 * i], gu[2 * i + 1], alpha, limit);
}

void kern_swiglu_clamped_bwd_cpu(kern_stream_t *s, float *dgu, const float *dh, const float *gu, float alpha,
                                 float limit, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) {
        float dg, du;
        kern_swiglu_clamped_bwd_elem(dh[i], gu[2 * i], gu[2 * i + 1], alpha, limit, &dg, &du);
        dgu[2 * i] = dg; /* after both reads: dgu may alias gu */
        dgu[2 * i + 1] = du;
    }
}

void kern_expert_bias_fwd_cpu(kern_stream_t *s, float *y, const float *b, const int32_t *offsets, int E, int C) {
    (void)s;
    for (int e = 0; e < E; e++)
        for (int32_t r = offsets[e]; r < offsets[e + 1]; r++)
            for (int c = 0; c < C; c++) y[(size_t)r * C + c] += b[(size_t)e * C + c];
}

void kern_expert_bias_bwd_cpu(kern_stream_t *s, float *db, const float *dy, const int32_t *offsets, int E, int C) {
    (void)s;
    for (int e = 0; e < E; e++)
        for (int c = 0; c < C; c++) {
            float acc = 0.0f;
            for (int32_t r = offsets[e]; r < offsets[e + 1]; r++) acc += dy[(size_t)r * C + c];
            db[(size_t)e * C + c] += acc;
        }
}
