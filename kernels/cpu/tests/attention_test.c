/* Causal GQA attention (kernels/attention.h).
 *
 * Forward: out and lse against a naive double reference (explicit mask,
 * softmax over the allowed keys). Backward: dq, dk, dv (overwrite; outputs
 * preset to NaN so a kernel that reads them fails) against central finite
 * differences of L = sum(out * R), with the saved out/lse of the forward.
 * Shapes: T = 1, 7, 33; nh/nkv = 1, 2 (and 4); sliding windows narrower
 * than T; B = 2 so batch offsets are exercised. Also: determinism (two
 * backward runs are bit-identical) and that a window >= T equals no window. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/attention.h"
#include "kernels/cpu/tests/testutil.h"

/* Forward: the kernel's sgemm sums hd products in fp32 and its softmax uses
 * expf; errors are a few ulp of O(1) values. 2e-5 relative + 2e-6 absolute. */
#define FWD_RTOL 2e-5
#define FWD_ATOL 2e-6

/* FD: perturbing one q row changes hd outputs, one k/v row up to
 * T*group*hd outputs, each an O(1) fp32 value with ~6e-8 relative rounding,
 * so L's noise is ~sqrt(T*hd*group)*6e-8 ~ 2e-6 and the FD noise is that
 * over 2h. Truncation (softmax curvature x h^2) stays below 1e-4 at h = 1e-2.
 * Measured on T=33: the dk error scales as 1/h (3e-3 at h=3e-4, 6e-4 at
 * 1e-3, 9e-5 at 1e-2), i.e. it is rounding noise, so h = 1e-2 is used.
 * Tolerances: 2e-3 norm-wise, 2e-2 per element above a floor of 5% of the
 * largest gradient (20x the measured error). */
#define FD_EPS 1e-2
#define GRAD_NORM_TOL 2e-3
#define GRAD_ELEM_RTOL 2e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *q, *k, *v, *R, *out, *lse;
    int B, T, nh, nkv, hd, window;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_attention_fwd_cpu(c->env->s, c->out, c->lse, c->q, c->k, c->v, c->B, c->T, c->nh, c->nkv,
                           c->hd, c->window);
    return tu_dot(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}

static int allowed(int i, int j, int window) { return j <= i && (window <= 0 || i - j < window); }

/* Naive reference: materialised masked score matrix, softmax in double. */
static void reference(double *out, double *lse, const float *q, const float *k, const float *v,
                      int B, int T, int nh, int nkv, int hd, int window) {
    const int group = nh / nkv;
    const double scale = 1.0 / sqrt((double)hd);
    double *s = tu_alloc_d((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int hk = h / group; /* HF repeat_kv: query head h reads kv head h / group */
            for (int i = 0; i < T; i++) {
                const float *qi = q + (((size_t)b * T + i) * nh + h) * hd;
                double mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    s[j] = -INFINITY;
                    if (!allowed(i, j, window)) continue;
                    const float *kj = k + (((size_t)b * T + j) * nkv + hk) * hd;
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)qi[c] * kj[c];
                    s[j] = d * scale;
                    if (s[j] > mx) mx = s[j];
                }
                double sum = 0;
                for (int j = 0; j < T; j++) sum += allowed(i, j, window) ? exp(s[j] - mx) : 0.0;
                lse[((size_t)b * nh + h) * T + i] = mx + log(sum);
                double *oi = out + (((size_t)b * T + i) * nh + h) * hd;
                for (int c = 0; c < hd; c++) oi[c] = 0;
                for (int j = 0; j < T; j++) {
                    if (!allowed(i, j, window)) continue;
                    const double pr = exp(s[j] - mx) / sum;
                    const float *vj = v + (((size_t)b * T + j) * nkv + hk) * hd;
                    for (int c = 0; c < hd; c++) oi[c] += pr * vj[c];
                }
            }
        }
    free(s);
}

static void run_case(tu_env_t *env, int B, int T, int nh, int nkv, int hd, int window,
                     uint64_t seed) {
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "B=%d T=%d nh=%d nkv=%d hd=%d window=%d", B, T, nh, nkv, hd, window);
    printf("case %s\n", tag);
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    const size_t nl = (size_t)B * nh * T;
    ctx_t c = {.env = env, .B = B, .T = T, .nh = nh, .nkv = nkv, .hd = hd, .window = window};
    /* scale 1.5 gives peaked-but-not-one-hot softmax rows with hd up to 16 */
    c.q = tu_rand(&rng, nq, 1.5f);
    c.k = tu_rand(&rng, nk, 1.5f);
    c.v = tu_rand(&rng, nk, 1.0f);
    c.R = tu_rand(&rng, nq, 1.0f);
    c.out = tu_alloc(nq);
    c.lse = tu_alloc(nl);

    /* forward vs reference */
    double *oref = tu_alloc_d(nq), *lref = tu_alloc_d(nl);
    reference(oref, lref, c.q, c.k, c.v, B, T, nh, nkv, hd, window);
    tu_fill_nan(c.out, nq); /* outputs are overwritten */
    tu_fill_nan(c.lse, nl);
    kern_attention_fwd_cpu(env->s, c.out, c.lse, c.q, c.k, c.v, B, T, nh, nkv, hd, window);
    snprintf(what, sizeof what, "%s: forward out", tag);
    tu_check_close(what, c.out, oref, nq, FWD_RTOL, FWD_ATOL);
    snprintf(what, sizeof what, "%s: forward lse", tag);
    tu_check_close(what, c.lse, lref, nl, FWD_RTOL, FWD_ATOL);

    /* backward with the forward's saved out and lse */
    float *out_saved = tu_copy(c.out, nq), *lse_saved = tu_copy(c.lse, nl);
    float *dq = tu_alloc(nq), *dk = tu_alloc(nk), *dv = tu_alloc(nk);
    tu_fill_nan(dq, nq);
    tu_fill_nan(dk, nk);
    tu_fill_nan(dv, nk);
    kern_attention_bwd_cpu(env->s, dq, dk, dv, c.R, c.q, c.k, c.v, out_saved, lse_saved, B, T, nh,
                           nkv, hd, window);

    /* determinism: a second run, from different garbage, is bit-identical */
    float *dq2 = tu_alloc(nq), *dk2 = tu_alloc(nk), *dv2 = tu_alloc(nk);
    for (size_t i = 0; i < nq; i++) dq2[i] = 7.0f;
    for (size_t i = 0; i < nk; i++) dk2[i] = dv2[i] = -3.0f;
    kern_attention_bwd_cpu(env->s, dq2, dk2, dv2, c.R, c.q, c.k, c.v, out_saved, lse_saved, B, T,
                           nh, nkv, hd, window);
    snprintf(what, sizeof what, "%s: dq deterministic and overwritten", tag);
    tu_check_bitwise(what, dq2, dq, nq);
    snprintf(what, sizeof what, "%s: dk deterministic and overwritten", tag);
    tu_check_bitwise(what, dk2, dk, nk);
    snprintf(what, sizeof what, "%s: dv deterministic and overwritten", tag);
    tu_check_bitwise(what, dv2, dv, nk);

    double *fq = tu_alloc_d(nq), *fk = tu_alloc_d(nk), *fv = tu_alloc_d(nk);
    tu_fd_grad(loss, &c, c.q, nq, FD_EPS, 1.0, fq);
    tu_fd_grad(loss, &c, c.k, nk, FD_EPS, 1.0, fk);
    tu_fd_grad(loss, &c, c.v, nk, FD_EPS, 1.0, fv);
    snprintf(what, sizeof what, "%s: dq", tag);
    tu_check_grad(what, dq, fq, nq, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dk", tag);
    tu_check_grad(what, dk, fk, nk, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dv", tag);
    tu_check_grad(what, dv, fv, nk, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);

    /* a window of at least T masks nothing more than causality */
    if (window == 0 && T > 1) {
        float *o2 = tu_alloc(nq), *l2 = tu_alloc(nl);
        kern_attention_fwd_cpu(env->s, o2, l2, c.q, c.k, c.v, B, T, nh, nkv, hd, T);
        snprintf(what, sizeof what, "%s: window=T equals no window", tag);
        tu_check_bitwise(what, o2, out_saved, nq);
        free(o2);
        free(l2);
    }

    free(c.q); free(c.k); free(c.v); free(c.R); free(c.out); free(c.lse);
    free(oref); free(lref); free(out_saved); free(lse_saved);
    free(dq); free(dk); free(dv); free(dq2); free(dk2); free(dv2);
    free(fq); free(fk); free(fv);
}

int main(void) {
    tu_env_t env = tu_env_open();
    /* B, T, nh, nkv, hd, window */
    run_case(&env, 1, 1, 2, 1, 8, 0, 101);  /* T = 1: a single key, softmax = 1 */
    run_case(&env, 2, 1, 2, 2, 4, 0, 102);
    run_case(&env, 2, 7, 4, 2, 8, 0, 103);  /* GQA, group 2 */
    run_case(&env, 1, 7, 2, 2, 8, 0, 104);  /* MHA, group 1 */
    run_case(&env, 2, 7, 4, 4, 4, 3, 105);  /* sliding window 3 */
    run_case(&env, 1, 33, 4, 2, 8, 0, 106);
    run_case(&env, 1, 33, 2, 2, 16, 0, 107);
    run_case(&env, 1, 33, 4, 2, 8, 5, 108); /* window 5 with GQA */
    run_case(&env, 1, 33, 8, 2, 4, 1, 109); /* window 1: attends to itself only; group 4 */
    tu_env_close(&env);
    return tu_finish("attention_test");
}
