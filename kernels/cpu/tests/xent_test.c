/* Cross-entropy (kernels/loss.h): per-row loss against a double reference
 * (0 for -100 targets), dlogits = grad_scale * (softmax - onehot) against
 * finite differences of L = grad_scale * sum(loss_rows) from the kernel's
 * forward-only call, zero rows for ignored targets (overwrite, from NaN),
 * dlogits aliasing logits, and large logits (no overflow). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/loss.h"

/* Forward: logsumexp in double, rounded to float once: 1 ulp of the loss;
 * 1e-6 relative + 1e-6 absolute (losses near 0 lose relative accuracy to
 * the subtraction lse - logit of two O(10) numbers: 1e-6 absolute). */
#define FWD_RTOL 1e-6
#define FWD_ATOL 1e-6

/* FD: each loss_rows[r] is a float of O(3), i.e. rounded to 2.4e-7, over
 * 2h; with h = 1e-3 that is ~1.2e-4 absolute noise on gradients of size
 * grad_scale * p (p ~ 1/V), too close. The loss is smooth (third derivative
 * of logsumexp <= 1), so h = 1e-2: truncation ~h^2/6 ~ 2e-5, noise ~1e-5.
 * 2e-3 norm-wise, 2e-2 per element above 5% of the largest. */
#define FD_EPS 1e-2
#define GRAD_NORM_TOL 2e-3
#define GRAD_ELEM_RTOL 2e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *logits, *loss_rows;
    const int32_t *targets;
    int n, V;
    float grad_scale;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_xent_cpu(c->env->s, c->loss_rows, NULL, c->logits, c->targets, c->n, c->V, c->grad_scale);
    double L = 0;
    for (int r = 0; r < c->n; r++) L += c->loss_rows[r];
    return c->grad_scale * L;
}

static void reference(double *lr, const float *logits, const int32_t *t, int n, int V) {
    for (int r = 0; r < n; r++) {
        if (t[r] == KERN_IGNORE_INDEX) {
            lr[r] = 0;
            continue;
        }
        const float *l = logits + (size_t)r * V;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, l[j]);
        for (int j = 0; j < V; j++) s += exp((double)l[j] - mx);
        lr[r] = mx + log(s) - l[t[r]];
    }
}

int main(void) {
    tu_env_t env = tu_env_open();
    tu_rng_t rng;
    tu_rng_seed(&rng, 91);
    enum { N = 7, V = 11 };
    static const int32_t targets[N] = {3, KERN_IGNORE_INDEX, 0, 10, KERN_IGNORE_INDEX, 5, 3};
    const float gs = 0.2f; /* e.g. 1 / (5 counted tokens) */
    ctx_t c = {.env = &env, .targets = targets, .n = N, .V = V, .grad_scale = gs};
    c.logits = tu_rand(&rng, (size_t)N * V, 3.0f);
    c.loss_rows = tu_alloc(N);

    float *lr = tu_alloc(N), *dl = tu_alloc((size_t)N * V);
    tu_fill_nan(lr, N);
    tu_fill_nan(dl, (size_t)N * V);
    kern_xent_cpu(env.s, lr, dl, c.logits, targets, N, V, gs);
    double *ref = tu_alloc_d(N);
    reference(ref, c.logits, targets, N, V);
    tu_check_close("xent loss_rows", lr, ref, N, FWD_RTOL, FWD_ATOL);
    for (int r = 0; r < N; r++) {
        if (targets[r] != KERN_IGNORE_INDEX) continue;
        int nz = 0;
        for (int j = 0; j < V; j++) nz += dl[(size_t)r * V + j] != 0.0f;
        tu_expect(lr[r] == 0.0f && nz == 0,
                  "xent ignored row %d: loss %g and %d nonzero gradients (want 0 and 0)", r,
                  (double)lr[r], nz);
    }
    /* each counted row's gradient sums to 0 (softmax sums to 1) */
    for (int r = 0; r < N; r++) {
        double s = 0;
        for (int j = 0; j < V; j++) s += dl[(size_t)r * V + j];
        tu_expect(fabs(s) < 1e-6, "xent row %d: gradient sums to %g, want 0", r, s);
    }

    double *fd = tu_alloc_d((size_t)N * V);
    tu_fd_grad(loss, &c, c.logits, (size_t)N * V, FD_EPS, 1.0, fd);
    tu_check_grad("xent dlogits (grad_scale 0.2, -100 rows)", dl, fd, (size_t)N * V, GRAD_NORM_TOL,
                  GRAD_ELEM_RTOL, GRAD_FLOOR);

    /* the forward-only call leaves loss_rows equal to the full call's */
    float *lr2 = tu_alloc(N);
    kern_xent_cpu(env.s, lr2, NULL, c.logits, targets, N, V, gs);
    tu_check_bitwise("xent forward-only loss_rows == with-gradient loss_rows", lr2, lr, N);

    /* dlogits aliasing logits gives the same numbers */
    float *alias = tu_copy(c.logits, (size_t)N * V);
    kern_xent_cpu(env.s, lr2, alias, alias, targets, N, V, gs);
    tu_check_bitwise("xent dlogits aliased onto logits", alias, dl, (size_t)N * V);
    tu_check_bitwise("xent loss_rows with aliasing", lr2, lr, N);

    /* large logits: no overflow, exact-ish loss */
    float big[2 * 4] = {1000.0f, -1000.0f, 999.0f, 0.0f, -500.0f, -480.0f, -500.0f, -520.0f};
    const int32_t bt[2] = {2, 1};
    float blr[2], bdl[8];
    kern_xent_cpu(env.s, blr, bdl, big, bt, 2, 4, 1.0f);
    double bref[2];
    reference(bref, big, bt, 2, 4);
    tu_check_close("xent large logits loss", blr, bref, 2, FWD_RTOL, FWD_ATOL);
    int finite = 1;
    for (int j = 0; j < 8; j++) finite &= isfinite(bdl[j]);
    tu_expect(finite, "xent large logits: gradient not finite");

    free(c.logits); free(c.loss_rows); free(lr); free(dl); free(ref); free(fd); free(lr2);
    free(alias);
    tu_env_close(&env);
    return tu_finish("xent_test");
}
