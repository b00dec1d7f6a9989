/* RMSNorm forward and backward on the CPU (see norm.h).
 *
 * - Row sums (sum x^2, and the backward's sum dy*w*xhat) are accumulated in
 *   double: HF computes the variance in fp32, and the extra precision only
 *   moves us closer to the exact value. They run on vec.h's 16 lanes (16
 *   double partials folded in a fixed tree), the per-element math in fp32
 *   in the order of the formulas in norm.h.
 * - Rows are split into fixed blocks of ~NORM_CHUNK elements over the
 *   backend's pool. Rows are independent except for dw: each block sums its
 *   rows (in row order) into its own partial, and the partials are added to
 *   dw in block order. Block sizes depend on dim only, so the result does
 *   not depend on the number of threads. */
#include "kernels/norm.h"

#include <math.h>
#include <stdlib.h>

#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"
#include "base/status.h"

#define NORM_CHUNK 16384

static int rows_per_task(int dim) {
    const int r = NORM_CHUNK / (dim > 0 ? dim : 1);
    return r > 0 ? r : 1;
}

KERN_CPU_CLONES static void fwd_rows(float *y, float *rstd, const float *x, const float *w, int r0,
                                     int r1, int dim, float eps) {
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = y + (size_t)r * dim;
        kern_vdacc_t acc = kern_vdacc_zero();
        int j = 0;
        for (; j + KERN_VL <= dim; j += KERN_VL) {
            const kern_vf_t v = kern_vf_load(xr + j);
            kern_vdacc_add_prod(&acc, v, v);
        }
        if (j < dim) {
            const kern_vf_t v = kern_vf_load_n(xr + j, (size_t)(dim - j), 0.0f);
            kern_vdacc_add_prod(&acc, v, v);
        }
        const double ss = kern_vdacc_hsum(acc);
        const float rs = 1.0f / sqrtf((float)(ss / dim) + eps);
        rstd[r] = rs;
        const kern_vf_t vrs = kern_vf_splat(rs);
        j = 0;
        for (; j + KERN_VL <= dim; j += KERN_VL)
            kern_vf_store(yr + j, kern_vf_load(w + j) * (kern_vf_load(xr + j) * vrs));
        for (; j < dim; j++) yr[j] = w[j] * (xr[j] * rs);
    }
}

/* dx for rows [r0, r1) and pdw[j] = sum over those rows of dy * xhat. */
KERN_CPU_CLONES static void bwd_rows(float *dx, float *pdw, const float *dy, const float *x,
                                     const float *w, const float *rstd, int r0, int r1, int dim) {
    for (int j = 0; j < dim; j++) pdw[j] = 0.0f;
    for (int r = r0; r < r1; r++) {
        const float *xr = x + (size_t)r * dim, *dyr = dy + (size_t)r * dim;
        float *dxr = dx + (size_t)r * dim;
        const float rs = rstd[r];
        const kern_vf_t vrs = kern_vf_splat(rs);
        kern_vdacc_t acc = kern_vdacc_zero();
        int j = 0;
        for (; j + KERN_VL <= dim; j += KERN_VL) {
            const kern_vf_t vdy = kern_vf_load(dyr + j), xhat = kern_vf_load(xr + j) * vrs;
            kern_vdacc_add_prod(&acc, vdy * kern_vf_load(w + j), xhat);
            kern_vf_store(pdw + j, kern_vf_load(pdw + j) + vdy * xhat);
        }
        if (j < dim) {
            const size_t m = (size_t)(dim - j);
            const kern_vf_t vdy = kern_vf_load_n(dyr + j, m, 0.0f);
            const kern_vf_t xhat = kern_vf_load_n(xr + j, m, 0.0f) * vrs;
            kern_vdacc_add_prod(&acc, vdy * kern_vf_load_n(w + j, m, 0.0f), xhat);
            kern_vf_store_n(pdw + j, kern_vf_load_n(pdw + j, m, 0.0f) + vdy * xhat, m);
        }
        const float mean = (float)(kern_vdacc_hsum(acc) / dim);
        const kern_vf_t vmean = kern_vf_splat(mean);
        j = 0;
        for (; j + KERN_VL <= dim; j += KERN_VL) {
            const kern_vf_t dyw = kern_vf_load(dyr + j) * kern_vf_load(w + j);
            kern_vf_store(dxr + j, vrs * (dyw - kern_vf_load(xr + j) * vrs * vmean));
        }
        for (; j < dim; j++) dxr[j] = rs * (dyr[j] * w[j] - xr[j] * rs * mean);
    }
}

typedef struct {
    float *y, *rstd, *dx, *pdw;
    const float *x, *w, *dy, *rstd_in;
    int rows, dim, per;
    float eps;
} norm_job_t;

static void fwd_task(void *ctx, size_t t) {
    const norm_job_t *j = ctx;
    const int r0 = (int)t * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
    fwd_rows(j->y, j->rstd, j->x, j->w, r0, r1, j->dim, j->eps);
}

static void bwd_task(void *ctx, size_t t) {
    const norm_job_t *j = ctx;
    const int r0 = (int)t * j->per, r1 = r0 + j->per < j->rows ? r0 + j->per : j->rows;
    bwd_rows(j->dx, j->pdw + t * (size_t)j->dim, j->dy, j->x, j->w, j->rstd_in, r0, r1, j->dim);
}

void kern_rmsnorm_fwd_cpu(kern_stream_t *s, float *y, float *rstd, const float *x, const float *w,
                          int rows, int dim, float eps) {
    if (rows <= 0 || dim <= 0) return;
    norm_job_t j = {.y = y, .rstd = rstd, .x = x, .w = w, .rows = rows, .dim = dim,
                    .per = rows_per_task(dim), .eps = eps};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)rows, (size_t)j.per), fwd_task, &j);
}

void kern_rmsnorm_bwd_cpu(kern_stream_t *s, float *dx, float *dw, const float *dy, const float *x,
                          const float *w, const float *rstd, int rows, int dim) {
    if (rows <= 0 || dim <= 0) return;
    const int per = rows_per_task(dim);
    const size_t tasks = kern_cpu_tasks((size_t)rows, (size_t)per);
    float *pdw = malloc(tasks * (size_t)dim * sizeof *pdw);
    MT_CHECK_ALLOC(pdw, "rmsnorm backward partial dw");
    norm_job_t j = {.dx = dx, .pdw = pdw, .dy = dy, .x = x, .w = w, .rstd_in = rstd, .rows = rows,
                    .dim = dim, .per = per};
    kern_cpu_parallel_for(s, tasks, bwd_task, &j);
    for (size_t t = 0; t < tasks; t++) {
        const float *p = pdw + t * (size_t)dim;
        for (int c = 0; c < dim; c++) dw[c] += p[c];
    }
    free(pdw);
}
