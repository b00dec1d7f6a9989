/* RMSNorm forward and backward on the CPU (see norm.h). Row sums are
 * accumulated in double: HF computes the variance in fp32, and the extra
 * precision only moves us closer to the exact value. */
#include "kernels/norm.h"

#include <math.h>
#include <stddef.h>

void kern_rmsnorm_fwd_cpu(kern_stream_t *s, float *y, float *rstd, const float *x, const float *w,
                          int rows, int dim, float eps) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        double ss = 0.0;
        for (int j = 0; j < dim; j++) ss += (double)xr[j] * xr[j];
        float rs = 1.0f / sqrtf((float)(ss / dim) + eps);
        rstd[r] = rs;
        for (int j = 0; j < dim; j++) yr[j] = w[j] * (xr[j] * rs);
    }
}

void kern_rmsnorm_bwd_cpu(kern_stream_t *s, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int rows, int dim) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim, *dyr = dy + (size_t)r * dim;
        float *dxr = dx + (size_t)r * dim;
        const float rs = rstd[r];
        double dot = 0.0;
        for (int j = 0; j < dim; j++) {
            float xhat = xr[j] * rs;
            dot += (double)(dyr[j] * w[j]) * xhat;
            dw[j] += dyr[j] * xhat;
        }
        const float mean = (float)(dot / dim);
        for (int j = 0; j < dim; j++) dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * mean);
    }
}
