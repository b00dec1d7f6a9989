/* RMSNorm (kernels/norm.h): forward against a double reference, backward
 * (dx overwrite, dw accumulate) against central finite differences of
 * L = sum(y * R), for a hidden-size shape and for Qwen3's per-head q/k-norm
 * shape (rows = tokens * heads, dim = head_dim, one weight of head_dim). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/norm.h"

/* Forward: fp32 kernel vs double reference. Each y is a few fp32 roundings
 * (sum of squares in double, one sqrtf, a divide, two products): a few ulp,
 * so 1e-5 relative (~80 ulp) with a 1e-6 floor for tiny values. */
#define FWD_RTOL 1e-5
#define FWD_ATOL 1e-6

/* FD: h = 1e-3 (inputs are O(1)); truncation error O(h^2 * f''') ~ 1e-6
 * relative; rounding noise in L is ~dim fp32 roundings of O(1) outputs,
 * ~1e-6 absolute, divided by 2h -> ~5e-4 absolute on O(1) gradients. Hence
 * 1e-3 norm-wise, 1e-2 per element above a floor of 5% of the largest. */
#define FD_EPS 1e-3
#define GRAD_NORM_TOL 1e-3
#define GRAD_ELEM_RTOL 1e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *x, *w, *R, *y, *rstd;
    int rows, dim;
    float eps;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_rmsnorm_fwd_cpu(c->env->s, c->y, c->rstd, c->x, c->w, c->rows, c->dim, c->eps);
    return tu_dot(c->y, c->R, (size_t)c->rows * c->dim);
}

/* x is uniform in [-scale, scale); row 0 is 30x larger (rstd small). With a
 * small scale, mean(x^2) is comparable to eps, the regime where eps matters. */
static void run_case(tu_env_t *env, const char *name, int rows, int dim, float eps, float scale,
                     uint64_t seed) {
    printf("case %s: rows=%d dim=%d eps=%g scale=%g\n", name, rows, dim, (double)eps,
           (double)scale);
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    const size_t n = (size_t)rows * dim;
    ctx_t c = {.env = env, .rows = rows, .dim = dim, .eps = eps};
    c.x = tu_rand(&rng, n, scale);
    c.w = tu_rand(&rng, (size_t)dim, 1.0f);
    for (int j = 0; j < dim; j++) c.w[j] += 1.0f; /* weights near 1 as trained models have */
    c.R = tu_rand(&rng, n, 1.0f);
    c.y = tu_alloc(n);
    c.rstd = tu_alloc((size_t)rows);
    for (int j = 0; j < dim; j++) c.x[j] *= 30.0f;

    /* forward vs reference */
    kern_rmsnorm_fwd_cpu(env->s, c.y, c.rstd, c.x, c.w, rows, dim, eps);
    double *yref = tu_alloc_d(n), *rref = tu_alloc_d((size_t)rows);
    for (int r = 0; r < rows; r++) {
        double ss = 0;
        for (int j = 0; j < dim; j++) ss += (double)c.x[(size_t)r * dim + j] * c.x[(size_t)r * dim + j];
        rref[r] = 1.0 / sqrt(ss / dim + eps);
        for (int j = 0; j < dim; j++)
            yref[(size_t)r * dim + j] = (double)c.w[j] * c.x[(size_t)r * dim + j] * rref[r];
    }
    char what[128];
    snprintf(what, sizeof what, "%s: forward y", name);
    tu_check_close(what, c.y, yref, n, FWD_RTOL, FWD_ATOL);
    snprintf(what, sizeof what, "%s: forward rstd", name);
    tu_check_close(what, c.rstd, rref, (size_t)rows, FWD_RTOL, 0);

    /* backward: dx overwrite (NaN sentinel), dw accumulate (+0.25 preset) */
    float *dx = tu_alloc(n), *dw = tu_alloc((size_t)dim);
    tu_fill_nan(dx, n);
    for (int j = 0; j < dim; j++) dw[j] = 0.25f;
    kern_rmsnorm_fwd_cpu(env->s, c.y, c.rstd, c.x, c.w, rows, dim, eps);
    kern_rmsnorm_bwd_cpu(env->s, dx, dw, c.R, c.x, c.w, c.rstd, rows, dim);
    for (int j = 0; j < dim; j++) dw[j] -= 0.25f;

    double *fdx = tu_alloc_d(n), *fdw = tu_alloc_d((size_t)dim);
    tu_fd_grad(loss, &c, c.x, n, FD_EPS, scale, fdx);
    tu_fd_grad(loss, &c, c.w, (size_t)dim, FD_EPS, 1.0, fdw);
    snprintf(what, sizeof what, "%s: dx", name);
    tu_check_grad(what, dx, fdx, n, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dw (accumulated onto 0.25)", name);
    /* the -0.25 after accumulation costs up to 1 ulp of 0.25 (3e-8) absolute */
    tu_check_grad(what, dw, fdw, (size_t)dim, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);

    /* dw really accumulates: a second backward adds the same amount again */
    float *dw2 = tu_alloc((size_t)dim), *dx2 = tu_alloc(n);
    kern_rmsnorm_bwd_cpu(env->s, dx2, dw2, c.R, c.x, c.w, c.rstd, rows, dim);
    kern_rmsnorm_bwd_cpu(env->s, dx2, dw2, c.R, c.x, c.w, c.rstd, rows, dim);
    double *twice = tu_alloc_d((size_t)dim);
    for (int j = 0; j < dim; j++) twice[j] = 2.0 * dw[j];
    snprintf(what, sizeof what, "%s: dw after two backwards = 2 x one", name);
    tu_check_close(what, dw2, twice, (size_t)dim, 1e-5, 1e-6);
    snprintf(what, sizeof what, "%s: dx overwritten, not accumulated", name);
    tu_check_close_f(what, dx2, dx, n, 0, 0);

    free(c.x); free(c.w); free(c.R); free(c.y); free(c.rstd);
    free(yref); free(rref); free(dx); free(dw); free(fdx); free(fdw);
    free(dw2); free(dx2); free(twice);
}

int main(void) {
    tu_env_t env = tu_env_open();
    run_case(&env, "hidden", 5, 64, 1e-6f, 1.0f, 1);
    /* mean(x^2) ~ 3e-5 vs eps 1e-5: eps changes rstd by ~15% */
    run_case(&env, "small_x_eps_matters", 3, 48, 1e-5f, 1e-2f, 2);
    /* Qwen3 q_norm: 3 tokens x 4 heads = 12 rows of head_dim 16, one w (16) */
    run_case(&env, "qk_norm_per_head", 3 * 4, 16, 1e-6f, 1.0f, 3);
    run_case(&env, "single_row", 1, 8, 1e-6f, 1.0f, 4);
    tu_env_close(&env);
    return tu_finish("rmsnorm_test");
}
