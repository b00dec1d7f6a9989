/* gpt-oss's CPU kernels (kernels/gpt_oss.h): attention sinks and the
 * clamped SwiGLU, forward against double references written from
 * transformers' formulas, backward against central finite differences.
 *
 * Sinks are tested through what the engine runs: attention_fwd then
 * attn_sink_fwd, and attention_bwd (given the sink-adjusted out and lse)
 * plus attn_sink_bwd, against the reference of eager_attention_forward:
 * the sink concatenated to each row's scores, softmax, the sink dropped.
 *
 * Tolerances:
 *  - forward: fp32 exp / log1p and the attention kernel's own rounding on
 *    O(1) values: 2e-5 relative + 2e-6 absolute (attention_test's);
 *  - gradients: attention_test's FD setting (h = 1e-2, 2e-3 norm-wise, 2e-2
 *    per element above 5% of the largest), which its measurements justify
 *    for the same loss; the sink adds one smooth logit per row;
 *  - SwiGLU: elementwise, inputs kept 2h away from the clamps' kinks.  The
 *    loss noise is fp32 rounding of one h element (~6e-8 x |h| <= 6e-7)
 *    over 2h, ~3e-5 at h = 1e-2; truncation (h^2 x the third derivative,
 *    O(1)) ~1e-4.  So 1e-3 norm-wise, 1e-2 per element above 1% of the
 *    largest gradient (measured: 3e-5 norm-wise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/attention.h"
#include "kernels/gpt_oss.h"
#include "kernels/cpu/tests/testutil.h"

#define FWD_RTOL 2e-5
#define FWD_ATOL 2e-6
#define FD_EPS 1e-2
#define GRAD_NORM_TOL 2e-3
#define GRAD_ELEM_RTOL 2e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *q, *k, *v, *sinks, *R, *out, *lse;
    const int32_t *kv_len;
    int B, T, nh, nkv, hd, window;
} sink_ctx_t;

static void sink_fwd(sink_ctx_t *c) {
    kern_attention_fwd_cpu(c->env->s, c->out, c->lse, c->q, c->k, c->v, c->kv_len, NULL, c->B, c->T, c->nh, c->nkv, c->hd,
                           c->window);
    kern_attn_sink_fwd_cpu(c->env->s, c->out, c->lse, c->sinks, c->B, c->T, c->nh, c->hd);
}

static double sink_loss(void *p) {
    sink_ctx_t *c = p;
    sink_fwd(c);
    return tu_dot(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}

/* transformers' eager attention with sinks, in double: scores over the
 * allowed keys plus the sink, max-subtracted softmax, the sink dropped.
 * lse is the logsumexp over keys and sink. */
static void sink_reference(const sink_ctx_t *c, double *out, double *lse) {
    const int B = c->B, T = c->T, nh = c->nh, hd = c->hd, group = c->nh / c->nkv;
    double *s = tu_alloc_d((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int kvl = !c->kv_len ? T : c->kv_len[b] < 0 ? 0 : c->kv_len[b] > T ? T : c->kv_len[b];
            for (int i = 0; i < T; i++) {
                double mx = c->sinks[h];
                for (int j = 0; j < T; j++) {
                    const bool ok = j <= i && (c->window <= 0 || i - j < c->window) && j < kvl;
                    if (!ok) {
                        s[j] = -INFINITY;
                        continue;
                    }
                    double d = 0;
                    for (int e = 0; e < hd; e++)
                        d += (double)c->q[(((size_t)b * T + i) * nh + h) * hd + e] *
                             c->k[(((size_t)b * T + j) * c->nkv + h / group) * hd + e];
                    s[j] = d / sqrt((double)hd);
                    if (s[j] > mx) mx = s[j];
                }
                double z = exp(c->sinks[h] - mx);
                for (int j = 0; j < T; j++) z += exp(s[j] - mx);
                lse[((size_t)b * nh + h) * T + i] = mx + log(z);
                for (int e = 0; e < hd; e++) {
                    double o = 0;
                    for (int j = 0; j < T; j++)
                        if (s[j] > -INFINITY)
                            o += exp(s[j] - mx) / z * c->v[(((size_t)b * T + j) * c->nkv + h / group) * hd + e];
                    out[(((size_t)b * T + i) * nh + h) * hd + e] = o;
                }
            }
        }
    free(s);
}

static void sink_case(tu_env_t *env, int B, int T, int nh, int nkv, int hd, int window, const int32_t *kv_len,
                      uint64_t seed) {
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "sinks B=%d T=%d nh=%d nkv=%d hd=%d window=%d%s", B, T, nh, nkv, hd, window,
             kv_len ? " padded" : "");
    tu_rng_t r;
    tu_rng_seed(&r, seed);
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    sink_ctx_t c = {env, tu_rand(&r, nq, 1.0f), tu_rand(&r, nk, 1.0f), tu_rand(&r, nk, 1.0f),
                    tu_rand(&r, (size_t)nh, 1.5f), tu_rand(&r, nq, 1.0f), tu_alloc(nq), tu_alloc(nl),
                    kv_len, B, T, nh, nkv, hd, window};
    double *oref = tu_alloc_d(nq), *lref = tu_alloc_d(nl);
    sink_reference(&c, oref, lref);
    sink_fwd(&c);
    snprintf(what, sizeof what, "%s: out", tag);
    tu_check_close(what, c.out, oref, nq, FWD_RTOL, FWD_ATOL);
    snprintf(what, sizeof what, "%s: lse (with the sink)", tag);
    tu_check_close(what, c.lse, lref, nl, FWD_RTOL, FWD_ATOL);

    float *out = tu_copy(c.out, nq), *lse = tu_copy(c.lse, nl);
    float *dq = tu_alloc(nq), *dk = tu_alloc(nk), *dv = tu_alloc(nk), *ds = tu_alloc((size_t)nh);
    kern_attention_bwd_cpu(env->s, dq, dk, dv, c.R, c.q, c.k, c.v, out, lse, kv_len, NULL, B, T, nh, nkv, hd, window);
    for (int h = 0; h < nh; h++) ds[h] = 0.25f; /* accumulates: checked against fd + 0.25 */
    kern_attn_sink_bwd_cpu(env->s, ds, c.R, out, lse, c.sinks, B, T, nh, hd);
    for (int h = 0; h < nh; h++) ds[h] -= 0.25f;

    double *fq = tu_alloc_d(nq), *fk = tu_alloc_d(nk), *fv = tu_alloc_d(nk), *fs = tu_alloc_d((size_t)nh);
    tu_fd_grad(sink_loss, &c, c.q, nq, FD_EPS, 1.0, fq);
    tu_fd_grad(sink_loss, &c, c.k, nk, FD_EPS, 1.0, fk);
    tu_fd_grad(sink_loss, &c, c.v, nk, FD_EPS, 1.0, fv);
    tu_fd_grad(sink_loss, &c, c.sinks, (size_t)nh, FD_EPS, 1.0, fs);
    snprintf(what, sizeof what, "%s: dq", tag);
    tu_check_grad(what, dq, fq, nq, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dk", tag);
    tu_check_grad(what, dk, fk, nk, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dv", tag);
    tu_check_grad(what, dv, fv, nk, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: dsinks", tag);
    tu_check_grad(what, ds, fs, (size_t)nh, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    for (size_t i = 0; i < nq; i++)
        if (!isfinite(dq[i])) {
            tu_expect(false, "%s: dq[%zu] is not finite", tag, i);
            break;
        }

    free(c.q); free(c.k); free(c.v); free(c.sinks); free(c.R); free(c.out); free(c.lse);
    free(oref); free(lref); free(out); free(lse);
    free(dq); free(dk); free(dv); free(ds); free(fq); free(fk); free(fv); free(fs);
}

/* ---- clamped SwiGLU ---- */

static const float k_alpha = 1.702f;

typedef struct {
    tu_env_t *env;
    float *gu, *h, *R;
    float limit;
    size_t n;
} glu_ctx_t;

static double glu_loss(void *p) {
    glu_ctx_t *c = p;
    kern_swiglu_clamped_fwd_cpu(c->env->s, c->h, c->gu, k_alpha, c->limit, c->n);
    return tu_dot(c->h, c->R, c->n);
}

static void glu_case(tu_env_t *env, size_t n, float limit, uint64_t seed) {
    char what[128];
    tu_rng_t r;
    tu_rng_seed(&r, seed);
    glu_ctx_t c = {env, tu_rand(&r, 2 * n, 2.0f * limit), tu_alloc(n), tu_rand(&r, n, 1.0f), limit, n};
    /* keep every input 2h from the clamps' kinks, where a central difference straddles them */
    const double h = 1e-2;
    for (size_t i = 0; i < 2 * n; i++)
        if (fabs(fabs(c.gu[i]) - limit) < 2 * h * fmax(fabs(c.gu[i]), 1.0)) c.gu[i] *= 0.9f;
    double *ref = tu_alloc_d(n);
    int gate_clamped = 0, up_clamped = 0;
    for (size_t i = 0; i < n; i++) {
        const double gate = c.gu[2 * i], up = c.gu[2 * i + 1];
        const double g = gate > limit ? limit : gate, u = up < -limit ? -limit : up > limit ? limit : up;
        gate_clamped += gate > limit;
        up_clamped += fabs(up) > limit;
        ref[i] = (u + 1.0) * g / (1.0 + exp(-(double)k_alpha * g));
    }
    tu_expect(gate_clamped > 0 && up_clamped > 0 && (size_t)up_clamped < n, "swiglu n=%zu: both clamps bind (%d, %d)",
              n, gate_clamped, up_clamped);
    glu_loss(&c);
    snprintf(what, sizeof what, "clamped swiglu n=%zu limit=%g: h", n, (double)limit);
    tu_check_close(what, c.h, ref, n, 1e-6, 1e-7);

    float *dgu = tu_alloc(2 * n);
    tu_fill_nan(dgu, 2 * n);
    kern_swiglu_clamped_bwd_cpu(env->s, dgu, c.R, c.gu, k_alpha, limit, n);
    double *fd = tu_alloc_d(2 * n);
    tu_fd_grad(glu_loss, &c, c.gu, 2 * n, h, 1.0, fd);
    snprintf(what, sizeof what, "clamped swiglu n=%zu limit=%g: d(gate_up)", n, (double)limit);
    tu_check_grad(what, dgu, fd, 2 * n, 1e-3, 1e-2, 1e-2);
    /* in place (dgu aliasing gu), as moe_fused.c calls it: the same bits */
    float *inplace = tu_copy(c.gu, 2 * n);
    kern_swiglu_clamped_bwd_cpu(env->s, inplace, c.R, inplace, k_alpha, limit, n);
    snprintf(what, sizeof what, "clamped swiglu n=%zu: in place", n);
    tu_check_bitwise(what, inplace, dgu, 2 * n);
    free(c.gu); free(c.h); free(c.R); free(ref); free(dgu); free(fd); free(inplace);
}

/* Expert biases against the definition in double (forward exact: one add
 * per element; backward: float sums of a few rows, 1e-6 relative), with an
 * expert that has no rows. */
static void expert_bias_case(tu_env_t *env, int E, int C, uint64_t seed) {
    tu_rng_t r;
    tu_rng_seed(&r, seed);
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (e == 1 ? 0 : 1 + tu_rng_int(&r, 9));
    const int m = off[E];
    float *y = tu_rand(&r, (size_t)m * C, 1.0f), *b = tu_rand(&r, (size_t)E * C, 1.0f);
    float *db = tu_rand(&r, (size_t)E * C, 1.0f);
    double *yref = tu_alloc_d((size_t)m * C), *dbref = tu_alloc_d((size_t)E * C);
    for (int e = 0; e < E; e++)
        for (int c = 0; c < C; c++) {
            dbref[(size_t)e * C + c] = db[(size_t)e * C + c];
            for (int32_t row = off[e]; row < off[e + 1]; row++) {
                yref[(size_t)row * C + c] = (double)y[(size_t)row * C + c] + b[(size_t)e * C + c];
                dbref[(size_t)e * C + c] += y[(size_t)row * C + c];
            }
        }
    kern_expert_bias_bwd_cpu(env->s, db, y, off, E, C);
    kern_expert_bias_fwd_cpu(env->s, y, b, off, E, C);
    char what[96];
    snprintf(what, sizeof what, "expert_bias_fwd E=%d C=%d", E, C);
    tu_check_close(what, y, yref, (size_t)m * C, 1e-7, 0);
    snprintf(what, sizeof what, "expert_bias_bwd (accumulate) E=%d C=%d", E, C);
    tu_check_close(what, db, dbref, (size_t)E * C, 1e-6, 1e-6);
    free(off); free(y); free(b); free(db); free(yref); free(dbref);
}

int main(void) {
    tu_env_t env = tu_env_open();
    /* B, T, nh, nkv, hd, window, kv_len */
    sink_case(&env, 1, 1, 2, 1, 8, 0, NULL, 201);  /* one key: the sink is the only competition */
    sink_case(&env, 2, 7, 4, 2, 8, 0, NULL, 202);  /* GQA */
    sink_case(&env, 2, 9, 4, 2, 8, 3, NULL, 203);  /* sliding window 3 */
    const int32_t kvl[2] = {5, 0};                 /* right padding; row 1 sees no key at all */
    sink_case(&env, 2, 7, 2, 1, 4, 0, kvl, 204);
    glu_case(&env, 257, 7.0f, 301);
    glu_case(&env, 300, 1.0f, 302);
    expert_bias_case(&env, 4, 48, 401);
    expert_bias_case(&env, 9, 300, 402);
    tu_env_close(&env);
    return tu_finish("gpt_oss_test");
}
