/* Token permutation and combine (kernels/moe_ops.h): moe_plan, moe_gather,
 * moe_unpermute_sum, moe_combine_bwd, and the Qwen2-MoE shared-expert gate.
 *
 * - plan: counts/offsets, grouping by ascending expert with tokens ascending
 *   inside an expert, inv a bijection with perm_tok[inv[r,s]] == r; ragged
 *   experts and experts with zero tokens.
 * - plan -> gather -> unpermute_sum(w = NULL) recovers k * x (and with
 *   accumulate adds onto y).
 * - gather's backward is unpermute_sum(w = NULL): FD check.
 * - combine forward = unpermute_sum(w); its backward = combine_bwd (dsrc
 *   overwrite, dw overwrite): FD over src and w.
 * - the bf16 run's combine backward (bf16 dsrc) and gather backward from
 *   two bf16 parts: FD, and the rounding rule bit for bit.
 * - gate_scale: forward y += sigmoid(g) x against a reference, backward
 *   (overwrite) against FD. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "base/dtype.h"
#include "kernels/moe_ops.h"

/* FD on these (bi)linear maps: truncation is zero for gather/combine-by-src
 * and O(h^2) for sigmoid; noise is ~sqrt(k*H) ulp of O(1) outputs over 2h,
 * ~1e-4 absolute. 1e-3 norm-wise, 1e-2 per element above 5% of the max. */
#define FD_EPS 1e-3
#define GRAD_NORM_TOL 1e-3
#define GRAD_ELEM_RTOL 1e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *x, *src, *w, *y, *R, *glogit;
    const int32_t *perm_tok, *inv;
    int n, k, H, m;
} ctx_t;

static double gather_loss(void *p) {
    ctx_t *c = p;
    kern_moe_gather_cpu(c->env->s, c->y, c->x, c->perm_tok, c->m, c->H);
    return tu_dot(c->y, c->R, (size_t)c->m * c->H);
}

static double combine_loss(void *p) {
    ctx_t *c = p;
    kern_moe_unpermute_sum_cpu(c->env->s, c->y, c->src, c->w, c->inv, c->n, c->k, c->H, 0);
    return tu_dot(c->y, c->R, (size_t)c->n * c->H);
}

static double gate_loss(void *p) {
    ctx_t *c = p;
    memset(c->y, 0, (size_t)c->n * c->H * sizeof *c->y);
    kern_gate_scale_fwd_cpu(c->env->s, c->y, c->x, c->glogit, c->n, c->H);
    return tu_dot(c->y, c->R, (size_t)c->n * c->H);
}

/* A bf16 run's backward ops, on c's routing (c->src, c->w, c->R as the
 * combine's FD case left them; dsrc and fsrc its fp32 gradient and FD):
 *   - combine_bwd_bf16 writes dsrc in bf16: the fp32 op's dsrc rounded
 *     once (bit for bit), so against FD within FD's noise plus half a bf16
 *     ulp, 2^-9 in norm (added to the tolerance: the rounding autocast's
 *     bf16 gradient carries too);
 *   - the gather's backward from the experts' two bf16 input-gradient
 *     parts, unpermute_sum_bf16 of the gate part then (accumulating) of the
 *     up part, against FD of the gather with their fp32 sum as dY. */
static void bf16_backward_case(tu_env_t *env, ctx_t *c, const char *tag, const int32_t *inv, const float *dsrc,
                               const double *fsrc) {
    const int n = c->n, k = c->k, H = c->H, m = c->m;
    const size_t mh = (size_t)m * H;
    char what[160];
    uint16_t *s16 = malloc(mh * 2), *d16 = malloc(mh * 2), *want = malloc(mh * 2);
    float *dw = tu_alloc((size_t)m), *dwide = tu_alloc(mh);
    MT_CHECK(s16 && d16 && want, "out of memory for bf16 combine buffers");
    mt_convert_from_f32(s16, MT_BF16, c->src, mh);
    kern_moe_combine_bwd_bf16_cpu(env->s, d16, dw, c->R, s16, c->w, inv, n, k, H);
    mt_convert_from_f32(want, MT_BF16, dsrc, mh);
    snprintf(what, sizeof what, "%s: combine_bwd_bf16 dsrc is the fp32 dsrc rounded once", tag);
    tu_expect(memcmp(d16, want, mh * 2) == 0, "%s", what);
    mt_convert_to_f32(dwide, d16, MT_BF16, mh);
    snprintf(what, sizeof what, "%s: combine_bwd_bf16 dsrc", tag);
    tu_check_grad(what, dwide, fsrc, mh, 0x1p-9 + GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);

    tu_rng_t rng;
    tu_rng_seed(&rng, 77);
    float *pg = tu_rand(&rng, mh, 1.0f), *pu = tu_rand(&rng, mh, 1.0f);
    uint16_t *g16 = malloc(mh * 2), *u16 = malloc(mh * 2);
    MT_CHECK(g16 && u16, "out of memory for bf16 gradient parts");
    mt_convert_from_f32(g16, MT_BF16, pg, mh);
    mt_convert_from_f32(u16, MT_BF16, pu, mh);
    float *dx = tu_alloc((size_t)n * H), *R = tu_alloc(mh), *y = tu_alloc(mh);
    tu_fill_nan(dx, (size_t)n * H);
    kern_moe_unpermute_sum_bf16_cpu(env->s, dx, g16, NULL, inv, n, k, H, 0);
    kern_moe_unpermute_sum_bf16_cpu(env->s, dx, u16, NULL, inv, n, k, H, 1);
    for (size_t i = 0; i < mh; i++) R[i] = mt_bf16_to_f32(g16[i]) + mt_bf16_to_f32(u16[i]);
    ctx_t gc = *c;
    gc.R = R;
    gc.y = y;
    double *fd = tu_alloc_d((size_t)n * H);
    tu_fd_grad(gather_loss, &gc, gc.x, (size_t)n * H, FD_EPS, 1.0, fd);
    snprintf(what, sizeof what, "%s: gather dx from two bf16 parts", tag);
    tu_check_grad(what, dx, fd, (size_t)n * H, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    free(s16); free(d16); free(want); free(dw); free(dwide);
    free(pg); free(pu); free(g16); free(u16); free(dx); free(R); free(y); free(fd);
}

/* k distinct experts per token (as top-k gives), drawn from `allowed`. */
static void make_idx(tu_rng_t *rng, int32_t *idx, int n, int k, const int *allowed, int na) {
    int *pool = malloc((size_t)na * sizeof *pool);
    MT_CHECK_ALLOC(pool, "pool");
    for (int r = 0; r < n; r++) {
        memcpy(pool, allowed, (size_t)na * sizeof *pool);
        tu_shuffle(rng, pool, na);
        for (int s = 0; s < k; s++) idx[(size_t)r * k + s] = pool[s];
    }
    free(pool);
}

static void check_plan(const char *tag, const int32_t *idx, const int32_t *counts,
                       const int32_t *offsets, const int32_t *perm_tok, const int32_t *inv, int n,
                       int k, int E) {
    const int m = n * k;
    int bad = 0;
    for (int e = 0; e < E; e++) {
        int want = 0;
        for (int i = 0; i < m; i++) want += idx[i] == e;
        bad += counts[e] != want;
    }
    tu_expect(bad == 0, "%s: %d expert counts wrong", tag, bad);
    bad = offsets[0] != 0;
    for (int e = 0; e < E; e++) bad += offsets[e + 1] != offsets[e] + counts[e];
    tu_expect(bad == 0 && offsets[E] == m, "%s: offsets are not the prefix sum of counts (end %d, m %d)",
              tag, offsets[E], m);
    /* rows of expert e: exactly the tokens routed to e, ascending */
    bad = 0;
    for (int e = 0; e < E; e++) {
        int j = offsets[e];
        for (int r = 0; r < n; r++) {
            bool routed = false;
            for (int s = 0; s < k; s++) routed |= idx[(size_t)r * k + s] == e;
            if (!routed) continue;
            if (j >= offsets[e + 1] || perm_tok[j] != r) bad++;
            j++;
        }
    }
    tu_expect(bad == 0, "%s: perm_tok is not grouped by ascending expert with ascending tokens (%d)",
              tag, bad);
    /* inv: a bijection onto [0, m), pointing into its expert's range at its token */
    char *seen = calloc((size_t)m + 1, 1);
    MT_CHECK_ALLOC(seen, "seen");
    bad = 0;
    for (int r = 0; r < n; r++)
        for (int s = 0; s < k; s++) {
            const int j = inv[(size_t)r * k + s], e = idx[(size_t)r * k + s];
            if (j < 0 || j >= m || seen[j] || perm_tok[j] != r || j < offsets[e] ||
                j >= offsets[e + 1]) {
                bad++;
                continue;
            }
            seen[j] = 1;
        }
    tu_expect(bad == 0, "%s: inv is not a consistent bijection (%d bad slots)", tag, bad);
    free(seen);
}

static void run_case(tu_env_t *env, const char *tag, int n, int k, int E, int H, const int *allowed,
                     int na, uint64_t seed) {
    printf("case %s: n=%d k=%d E=%d H=%d\n", tag, n, k, E, H);
    char what[160];
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    const int m = n * k;
    int32_t *idx = malloc((size_t)m * sizeof *idx), *counts = malloc((size_t)E * sizeof *counts);
    int32_t *offsets = malloc((size_t)(E + 1) * sizeof *offsets);
    int32_t *perm_tok = malloc((size_t)m * sizeof *perm_tok), *inv = malloc((size_t)m * sizeof *inv);
    MT_CHECK(idx && counts && offsets && perm_tok && inv, "out of memory");
    make_idx(&rng, idx, n, k, allowed, na);
    for (int e = 0; e < E; e++) counts[e] = -1; /* outputs are overwritten */
    kern_moe_plan_cpu(env->s, counts, offsets, perm_tok, inv, idx, n, k, E);
    check_plan(tag, idx, counts, offsets, perm_tok, inv, n, k, E);
    int empty = 0;
    for (int e = 0; e < E; e++) empty += counts[e] == 0;
    printf("  %d of %d experts received no token\n", empty, E);

    /* gather then unpermute_sum(w = NULL) = k * x */
    ctx_t c = {.env = env, .n = n, .k = k, .H = H, .m = m, .perm_tok = perm_tok, .inv = inv};
    c.x = tu_rand(&rng, (size_t)n * H, 1.0f);
    float *xp = tu_alloc((size_t)m * H), *y = tu_alloc((size_t)n * H);
    kern_moe_gather_cpu(env->s, xp, c.x, perm_tok, m, H);
    int bad = 0;
    for (int j = 0; j < m; j++)
        bad += memcmp(xp + (size_t)j * H, c.x + (size_t)perm_tok[j] * H, (size_t)H * sizeof *xp) != 0;
    tu_expect(bad == 0, "%s: gather rows differ from src[perm_tok] (%d rows)", tag, bad);
    tu_fill_nan(y, (size_t)n * H);
    kern_moe_unpermute_sum_cpu(env->s, y, xp, NULL, inv, n, k, H, 0);
    double *ref = tu_alloc_d((size_t)n * H);
    for (size_t i = 0; i < (size_t)n * H; i++) ref[i] = (double)k * c.x[i];
    /* k-1 fp32 additions of the same value: exact for k <= 2, <= k ulp after */
    snprintf(what, sizeof what, "%s: gather -> unpermute_sum(w=NULL) == k*x", tag);
    tu_check_close(what, y, ref, (size_t)n * H, 1.2e-7 * k, 0);
    /* accumulate: adds onto y */
    float *y2 = tu_copy(y, (size_t)n * H);
    kern_moe_unpermute_sum_cpu(env->s, y2, xp, NULL, inv, n, k, H, 1);
    for (size_t i = 0; i < (size_t)n * H; i++) ref[i] = 2.0 * y[i];
    snprintf(what, sizeof what, "%s: unpermute_sum accumulate adds onto y", tag);
    tu_check_close(what, y2, ref, (size_t)n * H, 1.2e-7 * k, 0);

    /* gather backward = unpermute_sum(dY, w = NULL), against FD */
    c.y = tu_alloc((size_t)m * H);
    c.R = tu_rand(&rng, (size_t)m * H, 1.0f);
    float *dx = tu_alloc((size_t)n * H);
    kern_moe_unpermute_sum_cpu(env->s, dx, c.R, NULL, inv, n, k, H, 0);
    double *fd = tu_alloc_d((size_t)n * H);
    tu_fd_grad(gather_loss, &c, c.x, (size_t)n * H, FD_EPS, 1.0, fd);
    snprintf(what, sizeof what, "%s: gather dx = unpermute_sum(dy)", tag);
    tu_check_grad(what, dx, fd, (size_t)n * H, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    free(c.y);
    free(c.R);

    /* combine: y = sum_s w[r,s] src[inv[r,s]]; backward = combine_bwd */
    c.src = tu_rand(&rng, (size_t)m * H, 1.0f);
    c.w = tu_rand(&rng, (size_t)m, 1.0f);
    c.y = tu_alloc((size_t)n * H);
    c.R = tu_rand(&rng, (size_t)n * H, 1.0f);
    tu_fill_nan(c.y, (size_t)n * H);
    kern_moe_unpermute_sum_cpu(env->s, c.y, c.src, c.w, inv, n, k, H, 0);
    for (int r = 0; r < n; r++)
        for (int h = 0; h < H; h++) {
            double acc = 0;
            for (int s = 0; s < k; s++)
                acc += (double)c.w[(size_t)r * k + s] * c.src[(size_t)inv[(size_t)r * k + s] * H + h];
            ref[(size_t)r * H + h] = acc;
        }
    /* k products and sums of O(1) values: a few ulp of the largest term */
    snprintf(what, sizeof what, "%s: combine forward", tag);
    tu_check_close(what, c.y, ref, (size_t)n * H, 1e-6, 1e-6 * k);

    float *dsrc = tu_alloc((size_t)m * H), *dw = tu_alloc((size_t)m);
    tu_fill_nan(dsrc, (size_t)m * H);
    tu_fill_nan(dw, (size_t)m);
    kern_moe_combine_bwd_cpu(env->s, dsrc, dw, c.R, c.src, c.w, inv, n, k, H);
    double *fsrc = tu_alloc_d((size_t)m * H), *fw = tu_alloc_d((size_t)m);
    tu_fd_grad(combine_loss, &c, c.src, (size_t)m * H, FD_EPS, 1.0, fsrc);
    tu_fd_grad(combine_loss, &c, c.w, (size_t)m, FD_EPS, 1.0, fw);
    snprintf(what, sizeof what, "%s: combine dsrc", tag);
    tu_check_grad(what, dsrc, fsrc, (size_t)m * H, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    snprintf(what, sizeof what, "%s: combine dw", tag);
    tu_check_grad(what, dw, fw, (size_t)m, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    bf16_backward_case(env, &c, tag, inv, dsrc, fsrc);

    free(idx); free(counts); free(offsets); free(perm_tok); free(inv);
    free(c.x); free(xp); free(y); free(y2); free(ref); free(dx); free(fd);
    free(c.src); free(c.w); free(c.y); free(c.R); free(dsrc); free(dw); free(fsrc); free(fw);
}

static void test_gate_scale(tu_env_t *env) {
    printf("case gate_scale\n");
    tu_rng_t rng;
    tu_rng_seed(&rng, 77);
    enum { N = 6, H = 11 };
    ctx_t c = {.env = env, .n = N, .H = H};
    c.x = tu_rand(&rng, (size_t)N * H, 1.0f);
    c.glogit = tu_rand(&rng, N, 3.0f);
    c.glogit[0] = 0.0f;
    c.glogit[1] = -20.0f; /* gate nearly closed: its gradient is ~2e-9 */
    c.y = tu_alloc((size_t)N * H);
    c.R = tu_rand(&rng, (size_t)N * H, 1.0f);

    float *y = tu_rand(&rng, (size_t)N * H, 1.0f), *y0 = tu_copy(y, (size_t)N * H);
    kern_gate_scale_fwd_cpu(env->s, y, c.x, c.glogit, N, H);
    double *ref = tu_alloc_d((size_t)N * H);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < H; h++)
            ref[(size_t)r * H + h] = (double)y0[(size_t)r * H + h] +
                                     c.x[(size_t)r * H + h] / (1.0 + exp(-(double)c.glogit[r]));
    tu_check_close("gate_scale forward (y += sigmoid(g) x)", y, ref, (size_t)N * H, 1e-6, 1e-7);

    float *dx = tu_alloc((size_t)N * H), *dg = tu_alloc(N);
    tu_fill_nan(dx, (size_t)N * H);
    tu_fill_nan(dg, N);
    kern_gate_scale_bwd_cpu(env->s, dx, dg, c.R, c.x, c.glogit, N, H);
    double *fx = tu_alloc_d((size_t)N * H), *fg = tu_alloc_d(N);
    tu_fd_grad(gate_loss, &c, c.x, (size_t)N * H, FD_EPS, 1.0, fx);
    tu_fd_grad(gate_loss, &c, c.glogit, N, FD_EPS, 1.0, fg);
    tu_check_grad("gate_scale dx", dx, fx, (size_t)N * H, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    tu_check_grad("gate_scale dglogit", dg, fg, N, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    free(c.x); free(c.glogit); free(c.y); free(c.R); free(y); free(y0); free(ref);
    free(dx); free(dg); free(fx); free(fg);
}

int main(void) {
    tu_env_t env = tu_env_open();
    /* ragged: tokens route only to experts 0 2 3 5, so 1 4 6 7 get no token */
    static const int ragged[] = {0, 2, 3, 5};
    run_case(&env, "ragged_zero_experts", 10, 2, 8, 5, ragged, 4, 1);
    static const int all8[] = {0, 1, 2, 3, 4, 5, 6, 7};
    run_case(&env, "mixtral_like", 13, 2, 8, 6, all8, 8, 2);
    run_case(&env, "k3", 7, 3, 8, 4, all8, 8, 3);
    /* every token picks the same two experts: one expert gets everything */
    static const int two[] = {6, 1};
    run_case(&env, "two_experts_only", 5, 2, 8, 3, two, 2, 4);
    static const int one[] = {3};
    run_case(&env, "single_token_k1", 1, 1, 4, 7, one, 1, 5);
    test_gate_scale(&env);
    tu_env_close(&env);
    return tu_finish("moe_permute_test");
}
