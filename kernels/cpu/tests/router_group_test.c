/* The grouped sigmoid router (kernels/router_group.h): DeepSeek-V3 and
 * GLM-4.5.
 *
 * Forward against a double reference written from transformers'
 * DeepseekV3TopkRouter (scores, the chosen experts, weights) for: groups
 * that drop the single best expert (the group score is a top-2 sum), the
 * bias steering the choice but not the weights, with and without
 * renormalisation, routed_scaling_factor, one group (GLM-4.5), DeepSeek-V3's
 * shape (E 256, 8 groups, keep 4, top-8), ties to the lower index; and
 * DeepSeek-V2's softmax variant (group = its best expert; greedy).
 * Backward (dlogits, overwrite) against central finite differences of
 * L = sum(weights * Rw) with logits built so that the choice's ranks are far
 * apart compared with the step (FD across a switch of experts is
 * meaningless).  Bad limits are refused (death is not tested: MT_CHECK). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/router_group.h"

/* Forward: sigmoid through expf (<= 1 ulp), a k-term fp32 sum and a
 * divide: a few ulp; 2e-6 relative. */
#define FWD_RTOL 2e-6
#define FWD_ATOL 1e-9
/* FD: h = 1e-3 on logits of size ~3; the loss is a sum of n*k terms <= ~3
 * in fp32 (noise ~1e-7 relative), so the FD noise is ~1e-4 absolute
 * against gradients ~0.1; truncation ~h^2.  Unchosen experts are exactly 0
 * on both sides. */
#define FD_EPS 1e-3
#define GRAD_NORM_TOL 1e-3
#define GRAD_ELEM_RTOL 1e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *logits, *bias, *weights, *scores, *Rw;
    int32_t *idx;
    int n, E, k;
    kern_router_group_t g;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_router_group_fwd_cpu(c->env->s, c->weights, c->idx, c->scores, c->logits, c->bias, c->n, c->E, c->k, &c->g);
    return tu_dot(c->weights, c->Rw, (size_t)c->n * c->k);
}

/* transformers' router in double: groups by the sum of their two best
 * choices, keep topk_group groups, top-k choices among their experts,
 * weights from the unbiased scores.  Ranks compare (value, lower index). */
static int better(double a, int ia, double b, int ib) { return a > b || (a == b && ia < ib); }

static void reference(double *scores, int32_t *idx, double *w, const float *logits, const float *bias, int n, int E,
                      int k, const kern_router_group_t *g) {
    const int G = g->n_group, per = E / G;
    double *ch = malloc((size_t)E * sizeof *ch), gs[64];
    int keep[64];
    MT_CHECK_ALLOC(ch, "choice");
    for (int r = 0; r < n; r++) {
        double *s = scores + (size_t)r * E;
        const float *l = logits + (size_t)r * E;
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        for (int e = 0; e < E; e++) {
            s[e] = g->softmax ? exp((double)l[e] - mx) / sum : 1.0 / (1.0 + exp(-(double)l[e]));
            ch[e] = s[e] + (bias ? bias[e] : 0.0);
        }
        for (int q = 0; q < G; q++) {
            int b1 = -1, b2 = -1;
            for (int e = q * per; e < (q + 1) * per; e++) {
                if (b1 < 0 || better(ch[e], e, ch[b1], b1)) {
                    b2 = b1;
                    b1 = e;
                } else if (b2 < 0 || better(ch[e], e, ch[b2], b2)) {
                    b2 = e;
                }
            }
            gs[q] = g->softmax ? ch[b1] : ch[b1] + ch[b2]; /* V2: the group's best; V3: its top-2 sum */
            keep[q] = 0;
        }
        for (int j = 0; j < g->topk_group; j++) {
            int best = -1;
            for (int q = 0; q < G; q++)
                if (!keep[q] && (best < 0 || better(gs[q], q, gs[best], best))) best = q;
            keep[best] = 1;
        }
        double tot = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                if (!keep[e / per]) continue;
                int taken = 0;
                for (int q = 0; q < j; q++) taken |= idx[(size_t)r * k + q] == e;
                if (!taken && (best < 0 || better(ch[e], e, ch[best], best))) best = e;
            }
            idx[(size_t)r * k + j] = best;
            w[(size_t)r * k + j] = s[best];
            tot += s[best];
        }
        for (int j = 0; j < k; j++) {
            double v = w[(size_t)r * k + j];
            if (g->renorm) v /= tot + 1e-20;
            w[(size_t)r * k + j] = v * g->scale;
        }
    }
    free(ch);
}

static void check_forward(tu_env_t *env, const char *tag, const float *logits, const float *bias, int n, int E, int k,
                          const kern_router_group_t *g) {
    char what[192];
    float *w = tu_alloc((size_t)n * k), *s = tu_alloc((size_t)n * E);
    int32_t *idx = malloc((size_t)n * k * sizeof *idx), *iref = malloc((size_t)n * k * sizeof *iref);
    MT_CHECK_ALLOC(idx, "idx");
    MT_CHECK_ALLOC(iref, "idx ref");
    double *sref = tu_alloc_d((size_t)n * E), *wref = tu_alloc_d((size_t)n * k);
    tu_fill_nan(w, (size_t)n * k);
    tu_fill_nan(s, (size_t)n * E);
    for (int i = 0; i < n * k; i++) idx[i] = -7;
    kern_router_group_fwd_cpu(env->s, w, idx, s, logits, bias, n, E, k, g);
    reference(sref, iref, wref, logits, bias, n, E, k, g);
    snprintf(what, sizeof what, "%s: scores", tag);
    tu_check_close(what, s, sref, (size_t)n * E, FWD_RTOL, FWD_ATOL);
    int bad = 0;
    for (int i = 0; i < n * k; i++) bad += idx[i] != iref[i];
    if (!tu_expect(bad == 0, "%s: %d chosen experts differ from the reference", tag, bad)) {
        for (int r = 0; r < n && r < 4; r++) {
            fprintf(stderr, "  row %d: got", r);
            for (int j = 0; j < k; j++) fprintf(stderr, " %d", idx[r * k + j]);
            fprintf(stderr, ", want");
            for (int j = 0; j < k; j++) fprintf(stderr, " %d", iref[r * k + j]);
            fprintf(stderr, "\n");
        }
    }
    snprintf(what, sizeof what, "%s: weights", tag);
    tu_check_close(what, w, wref, (size_t)n * k, FWD_RTOL, FWD_ATOL);
    free(w); free(s); free(idx); free(iref); free(sref); free(wref);
}

/* Logits whose choices (score + bias) sit on a grid of E distinct levels
 * in a random order per row, 0.8 / E apart, so a step of 1e-3 on a logit
 * (<= 2.5e-4 on its score) never reorders experts; orders in which two
 * groups' scores (top-2 sums of levels) tie are drawn again, so group
 * scores are a whole level apart and groups never reorder either. */
static void gapped(tu_rng_t *rng, float *logits, const float *bias, int n, int E, int G) {
    int *perm = malloc((size_t)E * sizeof *perm);
    MT_CHECK_ALLOC(perm, "permutation");
    const int per = E / G;
    for (int r = 0; r < n; r++) {
        for (int tries = 0;; tries++) {
            MT_CHECK(tries < 1000, "no gapped order of %d experts in %d groups", E, G);
            for (int e = 0; e < E; e++) perm[e] = e;
            tu_shuffle(rng, perm, E);
            int gs[64], ok = 1;
            for (int q = 0; q < G; q++) {
                int b1 = -1, b2 = -1;
                for (int e = q * per; e < (q + 1) * per; e++) {
                    if (perm[e] > b1) {
                        b2 = b1;
                        b1 = perm[e];
                    } else if (perm[e] > b2) {
                        b2 = perm[e];
                    }
                }
                gs[q] = b1 + b2; /* in levels */
                for (int o = 0; o < q; o++) ok &= gs[o] != gs[q];
            }
            if (G == 1 || ok) break;
        }
        for (int e = 0; e < E; e++) {
            const double t = 0.1 + 0.8 * ((double)perm[e] + 0.5) / E;
            const double s = t - (bias ? bias[e] : 0.0);
            logits[(size_t)r * E + e] = (float)log(s / (1.0 - s));
        }
    }
    free(perm);
}

/* DeepSeek-V2's softmax: logits half a unit apart in a random order per
 * row, so scores (and so experts and group maxima) are far apart. */
static void gapped_softmax(tu_rng_t *rng, float *logits, int n, int E) {
    int *perm = malloc((size_t)E * sizeof *perm);
    MT_CHECK_ALLOC(perm, "permutation");
    for (int r = 0; r < n; r++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        tu_shuffle(rng, perm, E);
        for (int e = 0; e < E; e++) logits[(size_t)r * E + e] = 0.5f * (float)perm[e] - 0.25f * (float)E;
    }
    free(perm);
}

static void check_case_g(tu_env_t *env, int n, int E, int k, int G, int keep, int renorm, float scale, int with_bias,
                         int softmax, uint64_t seed) {
    char tag[160], what[200];
    const kern_router_group_t g = {G, keep, renorm, scale, softmax};
    snprintf(tag, sizeof tag, "n=%d E=%d k=%d groups=%d keep=%d renorm=%d scale=%g bias=%d %s", n, E, k, G, keep,
             renorm, (double)scale, with_bias, softmax ? "softmax" : "sigmoid");
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    ctx_t c = {.env = env, .n = n, .E = E, .k = k, .g = g};
    c.bias = with_bias ? tu_rand(&rng, (size_t)E, 0.04f) : NULL;
    c.logits = tu_alloc((size_t)n * E);
    if (softmax) gapped_softmax(&rng, c.logits, n, E);
    else gapped(&rng, c.logits, c.bias, n, E, G);
    c.weights = tu_alloc((size_t)n * k);
    c.scores = tu_alloc((size_t)n * E);
    c.idx = malloc((size_t)n * k * sizeof *c.idx);
    MT_CHECK_ALLOC(c.idx, "idx");
    c.Rw = tu_rand(&rng, (size_t)n * k, 1.0f);
    check_forward(env, tag, c.logits, c.bias, n, E, k, &g);
    /* also on unstructured logits: the selection must still agree */
    float *rl = tu_rand(&rng, (size_t)n * E, 4.0f);
    snprintf(what, sizeof what, "%s (random logits)", tag);
    check_forward(env, what, rl, c.bias, n, E, k, &g);
    free(rl);

    kern_router_group_fwd_cpu(env->s, c.weights, c.idx, c.scores, c.logits, c.bias, n, E, k, &g);
    float *dl = tu_alloc((size_t)n * E);
    tu_fill_nan(dl, (size_t)n * E);
    kern_router_group_bwd_cpu(env->s, dl, c.Rw, c.scores, c.idx, n, E, k, &g);
    double *fd = tu_alloc_d((size_t)n * E);
    tu_fd_grad(loss, &c, c.logits, (size_t)n * E, FD_EPS, 1.0, fd);
    snprintf(what, sizeof what, "%s: dlogits", tag);
    tu_check_grad(what, dl, fd, (size_t)n * E, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    free(c.bias); free(c.logits); free(c.weights); free(c.scores); free(c.idx); free(c.Rw); free(dl); free(fd);
}

static void check_case(tu_env_t *env, int n, int E, int k, int G, int keep, int renorm, float scale, int with_bias,
                       uint64_t seed) {
    check_case_g(env, n, E, k, G, keep, renorm, scale, with_bias, 0, seed);
}

/* Hand-made rows where the group rule, not the raw top-k, decides. */
static void check_groups(tu_env_t *env) {
    enum { E = 8, K = 2 };
    /* two groups of 4.  Group 0 holds the single best score (0.95) but its
     * runner-up is low (sum 0.95 + 0.2); group 1's two best sum higher
     * (0.7 + 0.6): with topk_group 1 the best expert is not chosen. */
    const double sc[E] = {0.95, 0.2, 0.1, 0.05, 0.7, 0.6, 0.3, 0.1};
    float logits[E], w[K], s[E];
    int32_t idx[K];
    for (int e = 0; e < E; e++) logits[e] = (float)log(sc[e] / (1.0 - sc[e]));
    kern_router_group_t g = {2, 1, 1, 1.0f, 0};
    kern_router_group_fwd_cpu(env->s, w, idx, s, logits, NULL, 1, E, K, &g);
    tu_expect(idx[0] == 4 && idx[1] == 5, "groups: want experts 4 5 (group 1 wins on its top-2 sum), got %d %d",
              idx[0], idx[1]);
    tu_expect(fabs(w[0] - 0.7 / 1.3) < 1e-6 && fabs(w[1] - 0.6 / 1.3) < 1e-6,
              "groups: renormalised weights %g %g, want %g %g", (double)w[0], (double)w[1], 0.7 / 1.3, 0.6 / 1.3);
    /* the bias moves the choice and only the choice: +0.5 on expert 7 makes
     * it (and so group 1) first, its weight is still its raw score 0.1 */
    float bias[E] = {0};
    bias[7] = 0.5f;
    g.renorm = 0;
    g.scale = 2.5f;
    kern_router_group_fwd_cpu(env->s, w, idx, s, logits, bias, 1, E, K, &g);
    tu_expect(idx[0] == 4 && idx[1] == 7, "bias: want experts 4 7, got %d %d", idx[0], idx[1]);
    tu_expect(fabs(w[1] - 2.5 * 0.1) < 1e-6, "bias: expert 7's weight %g, want 2.5 * its unbiased score 0.1",
              (double)w[1]);
    /* exact ties: equal logits, lower index first, lower group first */
    for (int e = 0; e < E; e++) logits[e] = 0.25f;
    g = (kern_router_group_t){2, 1, 1, 1.0f, 0};
    kern_router_group_fwd_cpu(env->s, w, idx, s, logits, NULL, 1, E, K, &g);
    tu_expect(idx[0] == 0 && idx[1] == 1, "ties: want experts 0 1, got %d %d", idx[0], idx[1]);
}

int main(void) {
    tu_env_t env = tu_env_open();
    check_groups(&env);
    /* tiny DeepSeek-V3-like: 8 experts, 2 groups, keep 1, top-2 */
    check_case(&env, 7, 8, 2, 2, 1, 1, 2.5f, 1, 11);
    check_case(&env, 7, 8, 2, 2, 1, 0, 1.0f, 1, 12);
    check_case(&env, 5, 16, 3, 4, 2, 1, 1.0f, 0, 13);
    /* GLM-4.5: one group */
    check_case(&env, 6, 16, 4, 1, 1, 1, 2.5f, 1, 14);
    /* DeepSeek-V3's shape: forward against the reference on random logits,
     * backward on a few rows */
    check_case(&env, 3, 256, 8, 8, 4, 1, 2.5f, 1, 15);
    /* DeepSeek-V2: softmax scores, group_limited_greedy (group = its best
     * expert) and greedy (one group), no renormalisation, no bias */
    check_case_g(&env, 7, 16, 3, 4, 2, 0, 1.0f, 0, 1, 16);
    check_case_g(&env, 5, 12, 2, 1, 1, 0, 16.0f, 0, 1, 17);
    check_case_g(&env, 3, 160, 6, 8, 3, 0, 16.0f, 0, 1, 18); /* DeepSeek-V2's shape */
    return tu_finish("router_group_test");
}
