/* Causal GQA attention with the key-padding mask (kernels/attention.h).
 *
 * Forward: out and lse against a naive double reference (explicit mask,
 * softmax over the allowed keys; out = 0 and lse = -inf for a query with
 * none). Backward: dq, dk, dv (overwrite; outputs preset to NaN so a kernel
 * that reads them fails) against central finite differences of
 * L = sum(out * R), with the saved out/lse of the forward.
 * Shapes: T = 1, 7, 33; nh/nkv = 1, 2 (and 4); sliding windows narrower
 * than T; B = 2 so batch offsets are exercised. Also: determinism (two
 * backward runs are bit-identical) and that a window >= T equals no window.
 *
 * seg_start (packed rows): the reference masks keys before each query's
 * example start; forward against it, backward by finite differences.
 *
 * kv_len (right padding): cases with kv_len < T, 0 (a row of padding only)
 * and > T (clamped), alone and with windows that leave padded queries no
 * key. Besides the reference and finite differences:
 *  - kv_len NULL, all T and all > T give bit-identical out, lse, dq, dk, dv
 *    (kv_len == T changes nothing);
 *  - queries with no key: out 0, lse -inf, dq 0, exactly; padded keys get
 *    dk = dv = 0 exactly;
 *  - real tokens are unaffected: queries i < kv_len[b] get the same out and
 *    lse as without kv_len, and when dout is 0 at the padded queries (their
 *    labels are -100) dq, dk, dv at real positions are the same too. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/attention.h"
#include "kernels/cpu/attention_blas.h"
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
    const int32_t *kv_len, *seg; /* seg: seg_start (B, T) of packed rows, or NULL */
    int B, T, nh, nkv, hd, window;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    kern_attention_fwd_cpu(c->env->s, c->out, c->lse, c->q, c->k, c->v, c->kv_len, c->seg, c->B, c->T,
                           c->nh, c->nkv, c->hd, c->window);
    return tu_dot(c->out, c->R, (size_t)c->B * c->T * c->nh * c->hd);
}

/* Row b's valid keys as attention.h defines them: kv_len[b] clamped to [0, T]. */
static int kvl_of(const int32_t *kv_len, int b, int T) {
    return !kv_len ? T : kv_len[b] < 0 ? 0 : kv_len[b] > T ? T : kv_len[b];
}

static int allowed(int i, int j, int window, int kvl, int seg) {
    return j <= i && (window <= 0 || i - j < window) && j < kvl && j >= seg;
}

/* Naive reference: materialised masked score matrix, softmax in double;
 * a query with no allowed key gets out 0 and lse -inf. */
static void reference(double *out, double *lse, const float *q, const float *k, const float *v,
                      const int32_t *kv_len, const int32_t *segs, int B, int T, int nh, int nkv, int hd,
                      int window) {
    const int group = nh / nkv;
    const double scale = 1.0 / sqrt((double)hd);
    double *s = tu_alloc_d((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int hk = h / group; /* HF repeat_kv: query head h reads kv head h / group */
            const int kvl = kvl_of(kv_len, b, T);
            for (int i = 0; i < T; i++) {
                const int seg = segs ? segs[(size_t)b * T + i] : 0;
                const float *qi = q + (((size_t)b * T + i) * nh + h) * hd;
                double mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    s[j] = -INFINITY;
                    if (!allowed(i, j, window, kvl, seg)) continue;
                    const float *kj = k + (((size_t)b * T + j) * nkv + hk) * hd;
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += (double)qi[c] * kj[c];
                    s[j] = d * scale;
                    if (s[j] > mx) mx = s[j];
                }
                double *oi = out + (((size_t)b * T + i) * nh + h) * hd;
                for (int c = 0; c < hd; c++) oi[c] = 0;
                if (mx == -INFINITY) { /* no key */
                    lse[((size_t)b * nh + h) * T + i] = -INFINITY;
                    continue;
                }
                double sum = 0;
                for (int j = 0; j < T; j++) sum += allowed(i, j, window, kvl, seg) ? exp(s[j] - mx) : 0.0;
                lse[((size_t)b * nh + h) * T + i] = mx + log(sum);
                for (int j = 0; j < T; j++) {
                    if (!allowed(i, j, window, kvl, seg)) continue;
                    const double pr = exp(s[j] - mx) / sum;
                    const float *vj = v + (((size_t)b * T + j) * nkv + hk) * hd;
                    for (int c = 0; c < hd; c++) oi[c] += pr * vj[c];
                }
            }
        }
    free(s);
}

/* Values equal element by element (+0 == -0), at the positions keep(b, t) selects. */
typedef bool (*pos_fn)(const int32_t *kv_len, int b, int t, int T);
static bool real_pos(const int32_t *kv_len, int b, int t, int T) { return t < kvl_of(kv_len, b, T); }

static void check_same_at(const char *what, const float *got, const float *ref, const int32_t *kv_len,
                          int B, int T, size_t per_pos, pos_fn keep) {
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            if (!keep(kv_len, b, t, T)) continue;
            const size_t o = ((size_t)b * T + t) * per_pos;
            for (size_t c = 0; c < per_pos; c++)
                if (!(got[o + c] == ref[o + c])) {
                    tu_expect(false, "%s: b=%d t=%d [%zu]: %.9g vs %.9g (expected equal)", what, b, t, c,
                              (double)got[o + c], (double)ref[o + c]);
                    return;
                }
        }
}

static void fwd(tu_env_t *env, ctx_t *c, float *out, float *lse, const int32_t *kv_len) {
    kern_attention_fwd_cpu(env->s, out, lse, c->q, c->k, c->v, kv_len, c->seg, c->B, c->T, c->nh,
                           c->nkv, c->hd, c->window);
}

static void bwd(tu_env_t *env, ctx_t *c, float *dq, float *dk, float *dv, const float *dout,
                const float *out, const float *lse, const int32_t *kv_len) {
    kern_attention_bwd_cpu(env->s, dq, dk, dv, dout, c->q, c->k, c->v, out, lse, kv_len, c->seg, c->B,
                           c->T, c->nh, c->nkv, c->hd, c->window);
}

/* kv_len NULL, all T and all T + 5 give the same bits (forward and backward). */
static void check_full_lengths(tu_env_t *env, ctx_t *c, const char *tag) {
    const int B = c->B, T = c->T;
    const size_t nq = (size_t)B * T * c->nh * c->hd, nk = (size_t)B * T * c->nkv * c->hd;
    const size_t nl = (size_t)B * c->nh * T;
    int32_t *full = malloc((size_t)B * sizeof *full), *over = malloc((size_t)B * sizeof *over);
    MT_CHECK(full && over, "kv_len");
    for (int b = 0; b < B; b++) full[b] = T, over[b] = T + 5;
    float *o0 = tu_alloc(nq), *l0 = tu_alloc(nl), *q0 = tu_alloc(nq), *k0 = tu_alloc(nk), *v0 = tu_alloc(nk);
    fwd(env, c, o0, l0, NULL);
    bwd(env, c, q0, k0, v0, c->R, o0, l0, NULL);
    const int32_t *lens[2] = {full, over};
    for (int x = 0; x < 2; x++) {
        char what[260];
        float *o = tu_alloc(nq), *l = tu_alloc(nl), *dq = tu_alloc(nq), *dk = tu_alloc(nk), *dv = tu_alloc(nk);
        fwd(env, c, o, l, lens[x]);
        bwd(env, c, dq, dk, dv, c->R, o, l, lens[x]);
#define SAME(name, a, b, n)                                                                    \
    snprintf(what, sizeof what, "%s: kv_len %s vs NULL: %s bit-identical", tag, x ? "T+5" : "T", name); \
    tu_check_bitwise(what, a, b, n)
        SAME("out", o, o0, nq);
        SAME("lse", l, l0, nl);
        SAME("dq", dq, q0, nq);
        SAME("dk", dk, k0, nk);
        SAME("dv", dv, v0, nk);
#undef SAME
        free(o), free(l), free(dq), free(dk), free(dv);
    }
    free(o0), free(l0), free(q0), free(k0), free(v0), free(full), free(over);
}

/* With kv_len: exact zeros where attention.h promises them, and real tokens
 * as without padding. out/lse/dq/dk/dv are this case's results. */
static void check_padding(tu_env_t *env, ctx_t *c, const char *tag, const float *out, const float *lse,
                          const float *dq, const float *dk, const float *dv) {
    const int B = c->B, T = c->T, nh = c->nh, nkv = c->nkv, hd = c->hd;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    char what[260];
    int empty = 0;
    for (int b = 0; b < B; b++) {
        const int kvl = kvl_of(c->kv_len, b, T);
        for (int i = 0; i < T; i++) {
            bool any = false;
            for (int j = 0; j < T; j++) any |= allowed(i, j, c->window, kvl, 0) != 0;
            for (int h = 0; h < nh && !any; h++) {
                const size_t o = (((size_t)b * T + i) * nh + h) * hd;
                bool zero = lse[((size_t)b * nh + h) * T + i] == -INFINITY;
                for (int d = 0; d < hd; d++) zero &= out[o + d] == 0.0f && dq[o + d] == 0.0f;
                tu_expect(zero, "%s: b=%d query %d has no key: want out 0, lse -inf, dq 0", tag, b, i);
                empty++;
            }
            for (int g = 0; g < nkv && i >= kvl; g++) { /* key i is padding */
                const size_t o = (((size_t)b * T + i) * nkv + g) * hd;
                bool zero = true;
                for (int d = 0; d < hd; d++) zero &= dk[o + d] == 0.0f && dv[o + d] == 0.0f;
                tu_expect(zero, "%s: b=%d padded key %d: want dk = dv = 0", tag, b, i);
            }
        }
    }
    printf("  %s: %d (query, head) rows with no key\n", tag, empty);

    /* real queries: out and lse as without kv_len */
    float *o0 = tu_alloc(nq), *l0 = tu_alloc(nl), *lt = tu_alloc(nl), *l0t = tu_alloc(nl);
    fwd(env, c, o0, l0, NULL);
    snprintf(what, sizeof what, "%s: real queries' out as without kv_len", tag);
    check_same_at(what, out, o0, c->kv_len, B, T, (size_t)nh * hd, real_pos);
    for (int b = 0; b < B; b++) /* lse (B, nh, T) -> (B, T, nh) to reuse check_same_at */
        for (int h = 0; h < nh; h++)
            for (int t = 0; t < T; t++) {
                lt[((size_t)b * T + t) * nh + h] = lse[((size_t)b * nh + h) * T + t];
                l0t[((size_t)b * T + t) * nh + h] = l0[((size_t)b * nh + h) * T + t];
            }
    snprintf(what, sizeof what, "%s: real queries' lse as without kv_len", tag);
    check_same_at(what, lt, l0t, c->kv_len, B, T, nh, real_pos);

    /* dout 0 at padded queries: gradients at real positions as without kv_len */
    float *R0 = tu_copy(c->R, nq);
    for (int b = 0; b < B; b++)
        for (int t = kvl_of(c->kv_len, b, T); t < T; t++)
            for (size_t x = 0; x < (size_t)nh * hd; x++) R0[((size_t)b * T + t) * nh * hd + x] = 0.0f;
    float *a_q = tu_alloc(nq), *a_k = tu_alloc(nk), *a_v = tu_alloc(nk);
    float *b_q = tu_alloc(nq), *b_k = tu_alloc(nk), *b_v = tu_alloc(nk);
    bwd(env, c, a_q, a_k, a_v, R0, out, lse, c->kv_len);
    bwd(env, c, b_q, b_k, b_v, R0, o0, l0, NULL);
    snprintf(what, sizeof what, "%s: dq at real queries (padded dout 0) as without kv_len", tag);
    check_same_at(what, a_q, b_q, c->kv_len, B, T, (size_t)nh * hd, real_pos);
    snprintf(what, sizeof what, "%s: dk at real keys (padded dout 0) as without kv_len", tag);
    check_same_at(what, a_k, b_k, c->kv_len, B, T, (size_t)nkv * hd, real_pos);
    snprintf(what, sizeof what, "%s: dv at real keys (padded dout 0) as without kv_len", tag);
    check_same_at(what, a_v, b_v, c->kv_len, B, T, (size_t)nkv * hd, real_pos);
    free(o0), free(l0), free(lt), free(l0t), free(R0);
    free(a_q), free(a_k), free(a_v), free(b_q), free(b_k), free(b_v);
}

static void run_case(tu_env_t *env, int B, int T, int nh, int nkv, int hd, int window,
                     const int32_t *kv_len, const int32_t *seg, uint64_t seed) {
    char tag[160], what[220];
    int n = snprintf(tag, sizeof tag, "B=%d T=%d nh=%d nkv=%d hd=%d window=%d kv_len=", B, T, nh,
                     nkv, hd, window);
    if (!kv_len) snprintf(tag + n, sizeof tag - (size_t)n, "NULL");
    for (int b = 0; kv_len && b < B && n < (int)sizeof tag - 12; b++)
        n += snprintf(tag + n, sizeof tag - (size_t)n, "%s%d", b ? "," : "", kv_len[b]);
    if (seg) snprintf(tag + n, sizeof tag - (size_t)n, " packed");
    printf("case %s\n", tag);
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    const size_t nl = (size_t)B * nh * T;
    ctx_t c = {.env = env, .kv_len = kv_len, .seg = seg, .B = B, .T = T, .nh = nh, .nkv = nkv, .hd = hd,
               .window = window};
    /* scale 1.5 gives peaked-but-not-one-hot softmax rows with hd up to 16 */
    c.q = tu_rand(&rng, nq, 1.5f);
    c.k = tu_rand(&rng, nk, 1.5f);
    c.v = tu_rand(&rng, nk, 1.0f);
    c.R = tu_rand(&rng, nq, 1.0f);
    c.out = tu_alloc(nq);
    c.lse = tu_alloc(nl);

    /* forward vs reference */
    double *oref = tu_alloc_d(nq), *lref = tu_alloc_d(nl);
    reference(oref, lref, c.q, c.k, c.v, kv_len, seg, B, T, nh, nkv, hd, window);
    tu_fill_nan(c.out, nq); /* outputs are overwritten */
    tu_fill_nan(c.lse, nl);
    fwd(env, &c, c.out, c.lse, kv_len);
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
    bwd(env, &c, dq, dk, dv, c.R, out_saved, lse_saved, kv_len);

    /* determinism: a second run, from different garbage, is bit-identical */
    float *dq2 = tu_alloc(nq), *dk2 = tu_alloc(nk), *dv2 = tu_alloc(nk);
    for (size_t i = 0; i < nq; i++) dq2[i] = 7.0f;
    for (size_t i = 0; i < nk; i++) dk2[i] = dv2[i] = -3.0f;
    bwd(env, &c, dq2, dk2, dv2, c.R, out_saved, lse_saved, kv_len);
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

    if (seg) {
        /* packed rows: the reference and finite differences above */
    } else if (kv_len) {
        check_padding(env, &c, tag, out_saved, lse_saved, dq, dk, dv);
    } else {
        check_full_lengths(env, &c, tag);
        /* a window of at least T masks nothing more than causality */
        if (window == 0 && T > 1) {
            float *o2 = tu_alloc(nq), *l2 = tu_alloc(nl);
            kern_attention_fwd_cpu(env->s, o2, l2, c.q, c.k, c.v, NULL, NULL, B, T, nh, nkv, hd, T);
            snprintf(what, sizeof what, "%s: window=T equals no window", tag);
            tu_check_bitwise(what, o2, out_saved, nq);
            free(o2);
            free(l2);
        }
    }

    free(c.q); free(c.k); free(c.v); free(c.R); free(c.out); free(c.lse);
    free(oref); free(lref); free(out_saved); free(lse_saved);
    free(dq); free(dk); free(dv); free(dq2); free(dk2); free(dv2);
    free(fq); free(fk); free(fv);
}

/* max |got - ref| / max(max |ref|, 1e-3): the normwise distance. */
static double norm_dist(const float *got, const float *ref, size_t n) {
    double d = 0.0, m = 1e-3;
    for (size_t i = 0; i < n; i++) {
        if (isinf(ref[i]) && got[i] == ref[i]) continue;
        d = fmax(d, fabs((double)got[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return d / m;
}

static int non_bf16(const float *x, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += mt_bf16_to_f32(mt_f32_to_bf16(x[i])) != x[i];
    return bad;
}

/* The twin of the CUDA tensor-core path (_tc): bf16-rounded results within
 * bf16's reach of the fp32 kernel (inputs rounded to 8 significant bits move
 * scores and outputs by ~2^-8 relative; 3e-2 of the norm leaves room for the
 * sums, while a twin that dropped a mask or the scale is off by O(1)); lse
 * stays fp32 and close; and it refuses what the CUDA path refuses by rule,
 * leaving the outputs untouched. */
static void tc_twin_case(tu_env_t *env, int window, const int32_t *kv_len, uint64_t seed) {
    const int B = 2, T = 37, nh = 4, nkv = 2, hd = 16;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    float *q = tu_rand(&rng, nq, 1.0f), *k = tu_rand(&rng, nk, 1.0f), *v = tu_rand(&rng, nk, 1.0f);
    float *dout = tu_rand(&rng, nq, 1.0f);
    float *o = tu_alloc(nq), *l = tu_alloc(nl), *ot = tu_alloc(nq), *lt = tu_alloc(nl);
    float *g[6];
    for (int i = 0; i < 6; i++) g[i] = tu_alloc(i % 3 == 0 ? nq : nk);
    kern_attention_fwd_cpu(env->s, o, l, q, k, v, kv_len, NULL, B, T, nh, nkv, hd, window);
    tu_expect(kern_attention_fwd_tc_cpu(env->s, ot, lt, q, k, v, MT_F32, kv_len, NULL, B, T, nh, nkv, hd, window),
              "tc twin refused a shape it must run");
    tu_expect(non_bf16(ot, nq) == 0, "tc twin out: %d values are not bf16", non_bf16(ot, nq));
    tu_expect(norm_dist(ot, o, nq) < 3e-2, "tc twin out %.3g of the norm from fp32 (window %d)", norm_dist(ot, o, nq),
              window);
    tu_expect(norm_dist(lt, l, nl) < 3e-2, "tc twin lse %.3g from fp32", norm_dist(lt, l, nl));
    kern_attention_bwd_cpu(env->s, g[0], g[1], g[2], dout, q, k, v, o, l, kv_len, NULL, B, T, nh, nkv, hd, window);
    tu_expect(kern_attention_bwd_tc_cpu(env->s, g[3], g[4], g[5], dout, q, k, v, ot, MT_F32, lt, kv_len, NULL, B, T, nh, nkv,
                                        hd, window),
              "tc twin refused a backward it must run");
    for (int i = 0; i < 3; i++) {
        const size_t n = i == 0 ? nq : nk;
        tu_expect(non_bf16(g[3 + i], n) == 0, "tc twin gradient %d is not bf16", i);
        tu_expect(norm_dist(g[3 + i], g[i], n) < 3e-2, "tc twin gradient %d %.3g of the norm from fp32", i,
                  norm_dist(g[3 + i], g[i], n));
    }
    /* bf16 storage (dt MT_BF16, as a bf16 run saves q, k, v and out): the
     * same bits as fp32 storage of the same values */
    uint16_t *q16 = malloc(nq * 2), *k16 = malloc(nk * 2), *v16 = malloc(nk * 2), *o16 = malloc(nq * 2);
    for (size_t i = 0; i < nq; i++) q16[i] = mt_f32_to_bf16(q[i]);
    for (size_t i = 0; i < nk; i++) k16[i] = mt_f32_to_bf16(k[i]), v16[i] = mt_f32_to_bf16(v[i]);
    float *lb = tu_alloc(nl), *gb[3];
    for (int i = 0; i < 3; i++) gb[i] = tu_alloc(i == 0 ? nq : nk);
    tu_expect(kern_attention_fwd_tc_cpu(env->s, o16, lb, q16, k16, v16, MT_BF16, kv_len, NULL, B, T, nh, nkv, hd,
                                        window),
              "tc twin refused bf16 storage");
    int diff = 0;
    for (size_t i = 0; i < nq; i++) diff += mt_bf16_to_f32(o16[i]) != ot[i];
    for (size_t i = 0; i < nl; i++) diff += memcmp(&lb[i], &lt[i], sizeof lb[i]) != 0;
    tu_expect(kern_attention_bwd_tc_cpu(env->s, gb[0], gb[1], gb[2], dout, q16, k16, v16, o16, MT_BF16, lb, kv_len,
                                        NULL, B, T, nh, nkv, hd, window),
              "tc twin refused a bf16-storage backward");
    for (int i = 0; i < 3; i++) diff += memcmp(gb[i], g[3 + i], (i == 0 ? nq : nk) * sizeof(float)) != 0;
    tu_expect(diff == 0, "tc twin with bf16 storage differs from fp32 storage of the same values (%d)", diff);
    free(q16), free(k16), free(v16), free(o16), free(lb);
    for (int i = 0; i < 3; i++) free(gb[i]);
    /* refusals: packed segments, head dim not a multiple of 8, heads not a multiple of kv heads */
    int32_t *seg = calloc((size_t)B * T, sizeof *seg);
    tu_fill_nan(ot, nq);
    tu_expect(!kern_attention_fwd_tc_cpu(env->s, ot, lt, q, k, v, MT_F32, kv_len, seg, B, T, nh, nkv, hd, window),
              "tc twin ran packed segments");
    tu_expect(!kern_attention_fwd_tc_cpu(env->s, ot, lt, q, k, v, MT_F32, kv_len, NULL, B, T, nh, nkv, 12, window),
              "tc twin ran head dim 12");
    tu_expect(!kern_attention_bwd_tc_cpu(env->s, g[3], g[4], g[5], dout, q, k, v, o, MT_F32, l, kv_len, NULL, B, T, 3, 2, 8,
                                         window),
              "tc twin ran 3 heads over 2 kv heads");
    tu_expect(isnan(ot[0]) && isnan(ot[nq - 1]), "a refused tc call wrote its output");
    free(seg), free(q), free(k), free(v), free(dout), free(o), free(l), free(ot), free(lt);
    for (int i = 0; i < 6; i++) free(g[i]);
}

/* The fraction of got's elements within tol * max|ref| of ref's. */
static double frac_close(const float *got, const float *ref, size_t n, double tol) {
    double m = 1e-30;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)ref[i]));
    size_t close = 0;
    for (size_t i = 0; i < n; i++) close += fabs((double)got[i] - ref[i]) <= tol * m;
    return (double)close / (double)(n ? n : 1);
}

/* The twin's inner roundings (bf16_p: P before P V and P^T dout, dS before
 * dS K and dS^T q, as cuDNN holds them for its tensor-core products), on
 * bf16 inputs: the vector and sgemm paths implement them independently and
 * agree to fp32 sum order on nearly every element (an element whose P sits
 * on a bf16 rounding boundary may round apart in two fp32 computations, so
 * the count, not the maximum, is bounded), while the roundings really move
 * the results (bf16_p false differs on most elements by more than that,
 * and by no more than bf16's reach). */
static void tc_inner_rounding_case(tu_env_t *env, uint64_t seed) {
    const int B = 2, T = 45, nh = 4, nkv = 2, hd = 16, window = 0;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    float *in[4] = {tu_rand(&rng, nq, 1.5f), tu_rand(&rng, nk, 1.5f), tu_rand(&rng, nk, 1.0f), tu_rand(&rng, nq, 1.0f)};
    for (int i = 0; i < 4; i++)
        for (size_t j = 0; j < (i == 1 || i == 2 ? nk : nq); j++) in[i][j] = mt_bf16_to_f32(mt_f32_to_bf16(in[i][j]));
    const float *q = in[0], *k = in[1], *v = in[2], *dout = in[3];
    float *o[3], *l[3], *g[3][3]; /* vec with bf16_p, sgemm with bf16_p, vec without */
    for (int r = 0; r < 3; r++) {
        o[r] = tu_alloc(nq), l[r] = tu_alloc(nl);
        for (int i = 0; i < 3; i++) g[r][i] = tu_alloc(i == 0 ? nq : nk);
    }
    kern_attention_fwd_cpu_vec_p(env->s, o[0], l[0], q, k, v, NULL, NULL, B, T, nh, nkv, hd, window, true);
    kern_attention_fwd_cpu_blas_p(env->s, o[1], l[1], q, k, v, NULL, NULL, B, T, nh, nkv, hd, window, true);
    kern_attention_fwd_cpu_vec_p(env->s, o[2], l[2], q, k, v, NULL, NULL, B, T, nh, nkv, hd, window, false);
    kern_attention_bwd_cpu_vec_p(env->s, g[0][0], g[0][1], g[0][2], dout, q, k, v, o[0], l[0], NULL, NULL, B, T, nh,
                                 nkv, hd, window, true);
    kern_attention_bwd_cpu_blas_p(env->s, g[1][0], g[1][1], g[1][2], dout, q, k, v, o[0], l[0], NULL, NULL, B, T, nh,
                                  nkv, hd, window, true);
    kern_attention_bwd_cpu_vec_p(env->s, g[2][0], g[2][1], g[2][2], dout, q, k, v, o[0], l[0], NULL, NULL, B, T, nh,
                                 nkv, hd, window, false);
    const char *names[4] = {"out", "dq", "dk", "dv"};
    for (int t = 0; t < 4; t++) {
        const size_t n = t == 0 ? nq : t == 1 ? nq : nk;
        const float *a = t == 0 ? o[0] : g[0][t - 1], *b = t == 0 ? o[1] : g[1][t - 1];
        const float *c = t == 0 ? o[2] : g[2][t - 1];
        const double same = frac_close(b, a, n, 1e-5), moved = 1.0 - frac_close(c, a, n, 1e-5);
        printf("tc inner roundings, %s: vector and sgemm paths agree on %.4f of elements; without the roundings "
               "%.4f differ, by %.3g of the norm\n",
               names[t], same, moved, norm_dist(c, a, n));
        tu_expect(same >= 0.99, "bf16_p %s: vector and sgemm paths agree on only %.4f of elements", names[t], same);
        tu_expect(moved >= 0.5, "bf16_p %s: only %.4f of elements move with the roundings", names[t], moved);
        tu_expect(norm_dist(c, a, n) < 2e-2, "bf16_p %s moves %.3g of the norm", names[t], norm_dist(c, a, n));
    }
    for (int r = 0; r < 3; r++) {
        free(o[r]), free(l[r]);
        for (int i = 0; i < 3; i++) free(g[r][i]);
    }
    for (int i = 0; i < 4; i++) free(in[i]);
}

int main(void) {
    tu_env_t env = tu_env_open();
    /* B, T, nh, nkv, hd, window, kv_len */
    run_case(&env, 1, 1, 2, 1, 8, 0, NULL, NULL, 101);  /* T = 1: a single key, softmax = 1 */
    run_case(&env, 2, 1, 2, 2, 4, 0, NULL, NULL, 102);
    run_case(&env, 2, 7, 4, 2, 8, 0, NULL, NULL, 103);  /* GQA, group 2 */
    run_case(&env, 1, 7, 2, 2, 8, 0, NULL, NULL, 104);  /* MHA, group 1 */
    run_case(&env, 2, 7, 4, 4, 4, 3, NULL, NULL, 105);  /* sliding window 3 */
    run_case(&env, 1, 33, 4, 2, 8, 0, NULL, NULL, 106);
    run_case(&env, 1, 33, 2, 2, 16, 0, NULL, NULL, 107);
    run_case(&env, 1, 33, 4, 2, 8, 5, NULL, NULL, 108); /* window 5 with GQA */
    run_case(&env, 1, 33, 8, 2, 4, 1, NULL, NULL, 109); /* window 1: attends to itself only; group 4 */
    /* key padding */
    const int32_t l1[2] = {0, 1}, l2[2] = {4, 7}, l3[3] = {17, 0, 25}, l4[2] = {10, 1}, l5[2] = {3, 16};
    run_case(&env, 2, 1, 2, 1, 8, 0, l1, NULL, 110);  /* T = 1: a padding-only row, and a full one */
    run_case(&env, 2, 7, 4, 2, 8, 0, l2, NULL, 111);  /* right padding; the second row full */
    run_case(&env, 3, 21, 2, 1, 8, 0, l3, NULL, 112); /* past a 16-key block, an empty row, > T */
    run_case(&env, 2, 21, 4, 2, 8, 5, l4, NULL, 113); /* window 5: padded queries i >= kv_len + 4 see no key */
    run_case(&env, 2, 20, 4, 2, 4, 1, l5, NULL, 114); /* window 1: every padded query is empty */
    /* packed examples (seg_start): lengths 3, 1, 9, 4 (+ padding, its own
     * segment, in row 0), a window 3 across example edges */
    int32_t sg[2 * 21];
    const int lens[2][5] = {{3, 1, 9, 4, 4}, {12, 9, 0, 0, 0}};
    for (int b = 0; b < 2; b++)
        for (int e = 0, at = 0; e < 5 && lens[b][e]; at += lens[b][e], e++)
            for (int t = 0; t < lens[b][e]; t++) sg[b * 21 + at + t] = at;
    const int32_t lp[2] = {17, 21};
    run_case(&env, 2, 21, 4, 2, 8, 0, lp, sg, 115);
    run_case(&env, 2, 21, 4, 2, 8, 3, lp, sg, 116);
    run_case(&env, 2, 21, 2, 2, 16, 0, NULL, sg, 117);
    const int32_t lt[2] = {20, 37};
    tc_twin_case(&env, 0, NULL, 118);
    tc_twin_case(&env, 5, lt, 119);
    tc_inner_rounding_case(&env, 120);
    tu_env_close(&env);
    return tu_finish("attention_test");
}
