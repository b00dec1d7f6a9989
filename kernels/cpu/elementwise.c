/* Element-wise ops and reductions on the CPU (see elementwise.h). Plain
 * loops the compiler vectorises; the per-element math is shared with CUDA
 * through kernels/elementwise.h's MT_HD functions. */
#include "kernels/elementwise.h"

#include "kernels/dtype.h"

void kern_add_cpu(kern_stream_t *s, float *y, const float *a, const float *b, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void kern_axpy_cpu(kern_stream_t *s, float *y, float alpha, const float *x, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void kern_scale_cpu(kern_stream_t *s, float *x, float alpha, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) x[i] *= alpha;
}

void kern_bias_fwd_cpu(kern_stream_t *s, float *y, const float *b, int rows, int cols) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * cols;
        for (int c = 0; c < cols; c++) yr[c] += b[c];
    }
}

void kern_bias_bwd_cpu(kern_stream_t *s, float *db, const float *dy, int rows, int cols) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        const float *dr = dy + (size_t)r * cols;
        for (int c = 0; c < cols; c++) db[c] += dr[c];
    }
}

void kern_swiglu_fwd_cpu(kern_stream_t *s, float *h, const float *g, const float *u, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) h[i] = kern_silu(g[i]) * u[i];
}

void kern_swiglu_bwd_cpu(kern_stream_t *s, float *dg, float *du, const float *dh, const float *g,
                         const float *u, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) {
        const float gi = g[i], ui = u[i], d = dh[i];
        const float sig = kern_sigmoid(gi);
        const float silu = gi * sig;
        dg[i] = d * ui * (sig * (1.0f + gi * (1.0f - sig)));
        du[i] = d * silu;
    }
}

void kern_sumsq_cpu(kern_stream_t *s, float *out, const float *x, size_t n) {
    (void)s;
    double acc = 0.0;
    for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    *out = (float)acc;
}

void kern_f32_to_bf16_cpu(kern_stream_t *s, uint16_t *dst, const float *src, size_t n) {
    (void)s;
    mt_convert_from_f32(dst, MT_BF16, src, n);
}

void kern_bf16_to_f32_cpu(kern_stream_t *s, float *dst, const uint16_t *src, size_t n) {
    (void)s;
    mt_convert_to_f32(dst, src, MT_BF16, n);
}

