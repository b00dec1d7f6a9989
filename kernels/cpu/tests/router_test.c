/* Router (kernels/moe_ops.h): softmax -> top-k (-> renormalise).
 *
 * Forward against a double reference (probs, the selected experts in
 * descending order, weights with and without renormalisation), tie-breaking
 * towards the lower index, k = 1 and k = E edge cases, the Qwen3-MoE shape
 * (E = 128, k = 8). Backward (dlogits, overwrite) against finite
 * differences of
 *   L = sum(weights * Rw) + sum_r tok_w[r] * sum_e aux_dp[e] * probs[r, e]
 * (the aux term is what the contract's aux_dp * tok_w stands for: the
 * load-balancing loss is linear in the mean probabilities), in both modes,
 * with aux_dp NULL, with tok_w NULL (weight 1) and with both set.
 * Logits are built with gaps between ranks far larger than the FD step so a
 * perturbation never changes the top-k set (FD across a switch is meaningless).
 * Non-finite rows (a NaN or +Inf logit makes every prob NaN): top-k still
 * returns k distinct experts in [0, E), in index order, finite rows beside
 * them are untouched, and the plan and backward over them stay in bounds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/moe_ops.h"

/* Forward: expf, an fp32 sum of E terms and a divide. The crude bound is
 * ~E/2 ulp of the sum (64 ulp ~ 4e-6 at E = 128); measured worst 3e-7.
 * 4e-6 relative, with a tiny absolute floor. */
#define FWD_RTOL 4e-6
#define FWD_ATOL 1e-9

/* FD: h = 1e-3; a logit perturbation changes a whole row (E probs, k
 * weights) of outputs <= 1, so L's noise is ~sqrt(E) * 6e-8 and the FD
 * noise ~sqrt(E) * 3e-5 absolute (3e-4 at E = 128); softmax truncation ~h^2.
 * Gradients of unselected experts are tiny (p_e * ...), so elements are
 * compared above a floor of 5% of the largest; norm-wise 2e-3. */
#define FD_EPS 1e-3
#define GRAD_NORM_TOL 2e-3
#define GRAD_ELEM_RTOL 2e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *logits, *weights, *probs, *Rw;
    int32_t *idx;
    const float *aux_dp, *tok_w;
    int n, E, k;
    kern_router_mode_t mode;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_router_fwd_cpu(c->env->s, c->weights, c->idx, c->probs, c->logits, c->n, c->E, c->k,
                        c->mode);
    double L = tu_dot(c->weights, c->Rw, (size_t)c->n * c->k);
    if (c->aux_dp)
        for (int r = 0; r < c->n; r++) {
            const double tw = c->tok_w ? c->tok_w[r] : 1.0;
            L += tw * tu_dot(c->aux_dp, c->probs + (size_t)r * c->E, (size_t)c->E);
        }
    return L;
}

/* Row r: logits = gap * (a random permutation of 0..E-1, centred) + noise
 * of at most gap/4, so neighbouring ranks differ by at least gap/2. */
static void gapped_logits(tu_rng_t *rng, float *logits, int n, int E, float gap) {
    int *perm = malloc((size_t)E * sizeof *perm);
    MT_CHECK_ALLOC(perm, "permutation");
    for (int r = 0; r < n; r++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        tu_shuffle(rng, perm, E);
        for (int e = 0; e < E; e++)
            logits[(size_t)r * E + e] = gap * ((float)perm[e] - 0.5f * (float)(E - 1)) +
                                        0.25f * gap * (float)(2.0 * tu_rng_uniform(rng) - 1.0);
    }
    free(perm);
}

/* Reference forward; idx_ref by stable selection on the double probs. */
static void reference(double *probs, int32_t *idx, double *w, const float *logits, int n, int E,
                      int k, kern_router_mode_t mode) {
    for (int r = 0; r < n; r++) {
        const float *l = logits + (size_t)r * E;
        double mx = -INFINITY, sum = 0;
        for (int e = 0; e < E; e++) mx = fmax(mx, l[e]);
        for (int e = 0; e < E; e++) sum += exp((double)l[e] - mx);
        double *p = probs + (size_t)r * E;
        for (int e = 0; e < E; e++) p[e] = exp((double)l[e] - mx) / sum;
        double tot = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= idx[(size_t)r * k + q] == e;
                /* ties: lower index wins, compared on the logits (exact) */
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            idx[(size_t)r * k + j] = best;
            w[(size_t)r * k + j] = p[best];
            tot += p[best];
        }
        if (mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM)
            for (int j = 0; j < k; j++) w[(size_t)r * k + j] /= tot;
    }
}

static const char *mode_name(kern_router_mode_t m) {
    return m == KERN_ROUTER_SOFTMAX_TOPK_RENORM ? "renorm" : "topk";
}

static void check_forward(tu_env_t *env, const char *tag, const float *logits, int n, int E, int k,
                          kern_router_mode_t mode) {
    char what[192];
    float *w = tu_alloc((size_t)n * k), *p = tu_alloc((size_t)n * E);
    int32_t *idx = malloc((size_t)n * k * sizeof *idx), *iref = malloc((size_t)n * k * sizeof *iref);
    MT_CHECK_ALLOC(idx, "idx");
    MT_CHECK_ALLOC(iref, "idx ref");
    double *pref = tu_alloc_d((size_t)n * E), *wref = tu_alloc_d((size_t)n * k);
    tu_fill_nan(w, (size_t)n * k);
    tu_fill_nan(p, (size_t)n * E);
    for (int i = 0; i < n * k; i++) idx[i] = -7;
    kern_router_fwd_cpu(env->s, w, idx, p, logits, n, E, k, mode);
    reference(pref, iref, wref, logits, n, E, k, mode);
    snprintf(what, sizeof what, "%s %s: probs", tag, mode_name(mode));
    tu_check_close(what, p, pref, (size_t)n * E, FWD_RTOL, FWD_ATOL);
    int bad = 0;
    for (int i = 0; i < n * k; i++) bad += idx[i] != iref[i];
    if (!tu_expect(bad == 0, "%s %s: %d selected experts differ from the reference", tag,
                   mode_name(mode), bad)) {
        for (int r = 0; r < n && r < 4; r++) {
            fprintf(stderr, "  row %d: got", r);
            for (int j = 0; j < k; j++) fprintf(stderr, " %d", idx[r * k + j]);
            fprintf(stderr, ", want");
            for (int j = 0; j < k; j++) fprintf(stderr, " %d", iref[r * k + j]);
            fprintf(stderr, "\n");
        }
    }
    snprintf(what, sizeof what, "%s %s: weights", tag, mode_name(mode));
    tu_check_close(what, w, wref, (size_t)n * k, FWD_RTOL, FWD_ATOL);
    free(w); free(p); free(idx); free(iref); free(pref); free(wref);
}

/* aux: 0 = none, 1 = aux_dp with tok_w NULL, 2 = aux_dp and tok_w */
static void check_backward(tu_env_t *env, int n, int E, int k, kern_router_mode_t mode, int aux,
                           float gap, uint64_t seed) {
    char tag[128], what[192];
    snprintf(tag, sizeof tag, "n=%d E=%d k=%d %s aux=%s", n, E, k, mode_name(mode),
             aux == 0 ? "none" : aux == 1 ? "dp" : "dp+tok_w");
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    ctx_t c = {.env = env, .n = n, .E = E, .k = k, .mode = mode};
    c.logits = tu_alloc((size_t)n * E);
    gapped_logits(&rng, c.logits, n, E, gap);
    c.weights = tu_alloc((size_t)n * k);
    c.probs = tu_alloc((size_t)n * E);
    c.idx = malloc((size_t)n * k * sizeof *c.idx);
    MT_CHECK_ALLOC(c.idx, "idx");
    c.Rw = tu_rand(&rng, (size_t)n * k, 1.0f);
    float *aux_dp = tu_rand(&rng, (size_t)E, 1.0f);
    float *tok_w = tu_rand(&rng, (size_t)n, 1.0f);
    tok_w[0] = 0.0f; /* e.g. a padding token */
    c.aux_dp = aux ? aux_dp : NULL;
    c.tok_w = aux == 2 ? tok_w : NULL;

    check_forward(env, tag, c.logits, n, E, k, mode);

    kern_router_fwd_cpu(env->s, c.weights, c.idx, c.probs, c.logits, n, E, k, mode);
    float *dl = tu_alloc((size_t)n * E);
    tu_fill_nan(dl, (size_t)n * E);
    kern_router_bwd_cpu(env->s, dl, c.Rw, c.probs, c.idx, c.aux_dp, c.tok_w, n, E, k, mode);
    double *fd = tu_alloc_d((size_t)n * E);
    tu_fd_grad(loss, &c, c.logits, (size_t)n * E, FD_EPS, 1.0, fd);
    snprintf(what, sizeof what, "%s: dlogits", tag);
    tu_check_grad(what, dl, fd, (size_t)n * E, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);

    free(c.logits); free(c.weights); free(c.probs); free(c.idx); free(c.Rw);
    free(aux_dp); free(tok_w); free(dl); free(fd);
}

static void check_ties(tu_env_t *env) {
    /* exact ties in the logits give exactly equal probs: lower index first */
    enum { E = 6, K = 3 };
    const float logits[2 * E] = {
        0.5f, 0.5f, 0.5f, 0.5f, 0.5f, 0.5f, /* all equal: 0, 1, 2 */
        1.0f, 3.0f, -2.0f, 3.0f, 1.0f, 3.0f, /* three-way tie for first: 1, 3, 5 */
    };
    float w[2 * K], p[2 * E];
    int32_t idx[2 * K];
    kern_router_fwd_cpu(env->s, w, idx, p, logits, 2, E, K, KERN_ROUTER_SOFTMAX_TOPK_RENORM);
    tu_expect(idx[0] == 0 && idx[1] == 1 && idx[2] == 2,
              "ties: all-equal row must pick 0 1 2, got %d %d %d", idx[0], idx[1], idx[2]);
    tu_expect(idx[3] == 1 && idx[4] == 3 && idx[5] == 5,
              "ties: row 2 must pick 1 3 5, got %d %d %d", idx[3], idx[4], idx[5]);
    for (int j = 0; j < 2 * K; j++)
        tu_expect(fabsf(w[j] - 1.0f / 3.0f) < 1e-6f, "ties: renormalised weight %d = %g, want 1/3",
                  j, (double)w[j]);
    /* k = E in topk mode: weights are the probs in descending order */
    const float l2[E] = {0.1f, -1.0f, 2.0f, 0.3f, -0.5f, 1.2f};
    float w2[E], p2[E];
    int32_t i2[E];
    kern_router_fwd_cpu(env->s, w2, i2, p2, l2, 1, E, E, KERN_ROUTER_SOFTMAX_TOPK);
    const int32_t want[E] = {2, 5, 3, 0, 4, 1};
    int bad = 0;
    for (int j = 0; j < E; j++) bad += i2[j] != want[j] || w2[j] != p2[want[j]];
    tu_expect(bad == 0, "k = E: order or weights wrong in %d places", bad);
}

/* NaN ranks lowest (ties by index): a row whose probabilities are all NaN
 * selects experts 0..k-1; a -Inf logit is an ordinary zero probability. */
static void check_nonfinite(tu_env_t *env) {
    enum { N = 6, E = 5, K = 3 };
    const float inf = INFINITY, nan = NAN;
    const float logits[N * E] = {
        nan, 1.0f, 2.0f, 3.0f, 4.0f,   /* one NaN: the sum, so every prob, is NaN */
        nan, nan, nan, nan, nan,       /* all NaN */
        1.0f, inf, 0.0f, 2.0f, -1.0f,  /* +Inf: Inf - Inf = NaN */
        -inf, -inf, -inf, -inf, -inf,  /* all -Inf: max -Inf, -Inf - -Inf = NaN */
        -inf, 1.0f, -inf, 0.5f, -inf,  /* -Inf are zero probs: 1, 3, then 0 (tie, lowest index) */
        0.1f, 0.2f, 0.3f, 0.4f, 0.5f,  /* finite: 4, 3, 2 */
    };
    const int32_t want[N * K] = {0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 1, 3, 0, 4, 3, 2};
    float w[N * K], p[N * E], dl[N * E], dw[N * K];
    int32_t idx[N * K];
    for (int mode = 0; mode < 2; mode++) {
        for (int i = 0; i < N * K; i++) idx[i] = -7;
        kern_router_fwd_cpu(env->s, w, idx, p, logits, N, E, K, (kern_router_mode_t)mode);
        int bad = 0;
        for (int i = 0; i < N * K; i++) bad += idx[i] != want[i];
        tu_expect(bad == 0, "non-finite %s: %d selected experts differ from NaN-lowest order", mode_name(mode), bad);
        for (int r = 0; r < 4; r++)
            tu_expect(isnan(p[r * E]) && isnan(w[r * K]), "non-finite %s: row %d should give NaN probs/weights",
                      mode_name(mode), r);
        tu_expect(isfinite(w[5 * K]) && w[5 * K] > w[5 * K + 1],
                  "non-finite %s: the finite row's weights must stay finite and descending", mode_name(mode));
        tu_expect(p[4 * E] == 0.0f && isfinite(w[4 * K]), "non-finite %s: -Inf logit must be a zero prob", mode_name(mode));

        int32_t counts[E], offsets[E + 1], perm[N * K], inv[N * K];
        kern_moe_plan_cpu(env->s, counts, offsets, perm, inv, idx, N, K, E);
        tu_expect(offsets[E] == N * K, "non-finite %s: plan covers %d of %d slots", mode_name(mode), offsets[E], N * K);
        for (int i = 0; i < N * K; i++) dw[i] = 1.0f;
        kern_router_bwd_cpu(env->s, dl, dw, p, idx, NULL, NULL, N, E, K, (kern_router_mode_t)mode);
        tu_expect(isfinite(dl[5 * E]), "non-finite %s: the finite row's gradient must stay finite", mode_name(mode));
    }
}

int main(void) {
    tu_env_t env = tu_env_open();
    check_ties(&env);
    check_nonfinite(&env);
    uint64_t seed = 40;
    for (int mode = 0; mode < 2; mode++)
        for (int aux = 0; aux < 3; aux++) {
            check_backward(&env, 7, 8, 2, (kern_router_mode_t)mode, aux, 0.5f, ++seed); /* Mixtral */
            check_backward(&env, 5, 6, 3, (kern_router_mode_t)mode, aux, 0.5f, ++seed);
        }
    check_backward(&env, 4, 8, 1, KERN_ROUTER_SOFTMAX_TOPK, 1, 0.5f, ++seed);
    check_backward(&env, 4, 8, 1, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 2, 0.5f, ++seed); /* weight = 1 */
    check_backward(&env, 3, 5, 5, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 2, 0.5f, ++seed); /* k = E */
    check_backward(&env, 3, 60, 4, KERN_ROUTER_SOFTMAX_TOPK, 2, 0.08f, ++seed);     /* Qwen2-MoE-like */
    check_backward(&env, 3, 128, 8, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 2, 0.05f, ++seed); /* Qwen3 */
    check_backward(&env, 3, 128, 8, KERN_ROUTER_SOFTMAX_TOPK, 0, 0.05f, ++seed);
    tu_env_close(&env);
    return tu_finish("router_test");
}
