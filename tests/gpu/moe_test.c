/* GPU suite: router forward/backward (with the aux-loss term), the
 * permutation plan over ragged experts with zero-token experts, gather,
 * un-permute, the combine's backward and the shared-expert gate.
 *
 * Tolerances and why:
 *  - router probs/weights: fp32 softmax whose sum runs in another order and
 *    whose expf is within 2 ulp: rtol 1e-5; the top-k indices must be
 *    identical: logits are drawn with gaps of >= 8% between probabilities,
 *    so rounding cannot swap two experts;
 *  - router dlogits = p (dp - sum p dp): the sum is double on both sides,
 *    rounded once: atol 1e-7 (|p| <= 1, |dp| ~ 1) + rtol 1e-5;
 *  - plan, gather, unpermute_sum, combine dsrc: integer results or the same
 *    float operations in the same order (the GPU build does not fuse
 *    multiply-adds): bit-identical;
 *  - combine dw and gate dglogit: double dot products in another order,
 *    rounded once: rtol 1e-6 (+ atol 1e-6 for dots that cancel);
 *  - gate sigmoid: device expf within 2 ulp: rtol 4e-6.
 *  - grouped sigmoid router (DeepSeek-V3, GLM-4.5): one code path per row
 *    (router_group_math.h) on both sides, expf within 2 ulp: scores and
 *    weights rtol 4e-6; indices identical (choices on a grid 0.8 / E apart,
 *    group scores whole grid steps apart); dlogits, from the same inputs,
 *    the same float operations: rtol 1e-6;
 * Non-finite router rows (NaN, +Inf, all -Inf logits): the indices must be
 * identical (NaN ranks lowest, ties by index: k distinct valid experts), and
 * NaN probabilities/weights matched in kind; the plan over them exact. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "tests/gpu/gpu_test.h"

/* Logits whose softmax has no near-ties: a permutation of a spaced grid. */
static float *router_logits(gt_ctx_t *t, int n, int E) {
    float *l = gt_host_alloc((size_t)n * E);
    int *perm = gt_host_bytes((size_t)E * sizeof(int));
    for (int r = 0; r < n; r++) {
        for (int e = 0; e < E; e++) perm[e] = e;
        for (int e = E - 1; e > 0; e--) {
            const int j = gt_int(t, e + 1), x = perm[e];
            perm[e] = perm[j];
            perm[j] = x;
        }
        const float step = gt_uniform(t, 0.08f, 0.5f), shift = gt_uniform(t, -3.0f, 3.0f);
        for (int e = 0; e < E; e++) l[(size_t)r * E + e] = shift + step * (float)perm[e];
    }
    free(perm);
    return l;
}

static void router_case(gt_ctx_t *t, int n, int E, int k, kern_router_mode_t mode, int aux, int tokw) {
    float *hl = router_logits(t, n, E);
    float *hdw = gt_host_rand(t, (size_t)n * k, 1.0f), *haux = gt_host_rand(t, (size_t)E, 0.3f);
    float *htw = gt_host_rand(t, (size_t)n, 1.0f);
    gt_buf_t L = gt_from_host(t, hl, (size_t)n * E * 4, "logits");
    gt_buf_t W = gt_alloc(t, (size_t)n * k * 4, "weights"), I = gt_alloc(t, (size_t)n * k * 4, "idx");
    gt_buf_t P = gt_alloc(t, (size_t)n * E * 4, "probs"), DL = gt_alloc(t, (size_t)n * E * 4, "dlogits");
    gt_buf_t DW = gt_from_host(t, hdw, (size_t)n * k * 4, "dweights");
    gt_buf_t AUX = gt_from_host(t, haux, (size_t)E * 4, "aux_dp"), TW = gt_from_host(t, htw, (size_t)n * 4, "tok_w");
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "n=%d E=%d k=%d %s", n, E, k, mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM ? "renorm" : "no-renorm");
    t->cpu->ops->router_fwd(t->sc, GT_C(W), GT_CI(I), GT_C(P), GT_C(L), n, E, k, mode);
    t->gpu->ops->router_fwd(t->sg, GT_G(W), GT_GI(I), GT_G(P), GT_G(L), n, E, k, mode);
    snprintf(what, sizeof what, "router_fwd probs %s", tag);
    gt_check_f32(t, what, &P, (size_t)n * E, 1e-9f, 1e-5f);
    snprintf(what, sizeof what, "router_fwd idx %s", tag);
    gt_check_exact(t, what, &I, I.bytes);
    snprintf(what, sizeof what, "router_fwd weights %s", tag);
    gt_check_f32(t, what, &W, (size_t)n * k, 1e-9f, 1e-5f);

    /* Backward from the CPU's probs and idx on both sides. */
    float *hp = gt_host_alloc((size_t)n * E);
    int32_t *hi = gt_host_bytes((size_t)n * k * 4);
    gt_download(t, &P, hp, NULL);
    gt_download(t, &I, hi, NULL);
    gt_set(t, &P, hp);
    gt_set(t, &I, hi);
    const float *ac = aux ? GT_C(AUX) : NULL, *ag = aux ? GT_G(AUX) : NULL;
    const float *tc = tokw ? GT_C(TW) : NULL, *tg = tokw ? GT_G(TW) : NULL;
    t->cpu->ops->router_bwd(t->sc, GT_C(DL), GT_C(DW), GT_C(P), GT_CI(I), ac, tc, n, E, k, mode);
    t->gpu->ops->router_bwd(t->sg, GT_G(DL), GT_G(DW), GT_G(P), GT_GI(I), ag, tg, n, E, k, mode);
    snprintf(what, sizeof what, "router_bwd dlogits %s aux=%d tok_w=%d", tag, aux, tokw);
    gt_check_f32(t, what, &DL, (size_t)n * E, 1e-7f, 1e-5f);
    gt_buf_t *bufs[] = {&L, &W, &I, &P, &DL, &DW, &AUX, &TW};
    for (size_t i = 0; i < 8; i++) gt_free(t, bufs[i]);
    free(hl);
    free(hdw);
    free(haux);
    free(htw);
    free(hp);
    free(hi);
}

/* Logits whose choices (score + bias) sit on a shuffled grid of E levels
 * with no two groups' top-2 sums equal, so rounding cannot swap experts or
 * groups. */
static float *group_logits(gt_ctx_t *t, const float *bias, int n, int E, int G) {
    float *l = gt_host_alloc((size_t)n * E);
    int *perm = gt_host_bytes((size_t)E * sizeof(int));
    const int per = E / G;
    for (int r = 0; r < n; r++) {
        for (int ok = 0; !ok;) {
            for (int e = 0; e < E; e++) perm[e] = e;
            for (int e = E - 1; e > 0; e--) {
                const int j = gt_int(t, e + 1), x = perm[e];
                perm[e] = perm[j];
                perm[j] = x;
            }
            int gs[64];
            ok = 1;
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
                gs[q] = b1 + b2;
                for (int o = 0; o < q; o++) ok &= gs[o] != gs[q];
            }
        }
        for (int e = 0; e < E; e++) {
            const double sc = 0.1 + 0.8 * ((double)perm[e] + 0.5) / E - bias[e];
            l[(size_t)r * E + e] = (float)log(sc / (1.0 - sc));
        }
    }
    free(perm);
    return l;
}

static void router_group_case_s(gt_ctx_t *t, int n, int E, int k, int G, int keep, int renorm, float scale,
                                int softmax) {
    const kern_router_group_t g = {G, keep, renorm, scale, softmax};
    float *hb = gt_host_rand(t, (size_t)E, 0.04f);
    /* softmax: the spaced grid of router_logits (group maxima distinct), no bias */
    float *hl = softmax ? router_logits(t, n, E) : group_logits(t, hb, n, E, G);
    float *hdw = gt_host_rand(t, (size_t)n * k, 1.0f);
    gt_buf_t L = gt_from_host(t, hl, (size_t)n * E * 4, "logits"), B = gt_from_host(t, hb, (size_t)E * 4, "bias");
    gt_buf_t W = gt_alloc(t, (size_t)n * k * 4, "weights"), I = gt_alloc(t, (size_t)n * k * 4, "idx");
    gt_buf_t S = gt_alloc(t, (size_t)n * E * 4, "scores"), DL = gt_alloc(t, (size_t)n * E * 4, "dlogits");
    gt_buf_t DW = gt_from_host(t, hdw, (size_t)n * k * 4, "dweights");
    char tag[96], what[160];
    snprintf(tag, sizeof tag, "n=%d E=%d k=%d groups=%d keep=%d renorm=%d %s", n, E, k, G, keep, renorm,
             softmax ? "softmax" : "sigmoid");
    t->cpu->ops->router_group_fwd(t->sc, GT_C(W), GT_CI(I), GT_C(S), GT_C(L), softmax ? NULL : GT_C(B), n, E, k, &g);
    t->gpu->ops->router_group_fwd(t->sg, GT_G(W), GT_GI(I), GT_G(S), GT_G(L), softmax ? NULL : GT_G(B), n, E, k, &g);
    snprintf(what, sizeof what, "router_group_fwd scores %s", tag);
    gt_check_f32(t, what, &S, (size_t)n * E, 1e-9f, 4e-6f);
    snprintf(what, sizeof what, "router_group_fwd idx %s", tag);
    gt_check_exact(t, what, &I, I.bytes);
    snprintf(what, sizeof what, "router_group_fwd weights %s", tag);
    gt_check_f32(t, what, &W, (size_t)n * k, 1e-9f, 4e-6f);
    /* backward from the CPU's scores and idx on both sides */
    float *hs = gt_host_alloc((size_t)n * E);
    int32_t *hi = gt_host_bytes((size_t)n * k * 4);
    gt_download(t, &S, hs, NULL);
    gt_download(t, &I, hi, NULL);
    gt_set(t, &S, hs);
    gt_set(t, &I, hi);
    t->cpu->ops->router_group_bwd(t->sc, GT_C(DL), GT_C(DW), GT_C(S), GT_CI(I), n, E, k, &g);
    t->gpu->ops->router_group_bwd(t->sg, GT_G(DL), GT_G(DW), GT_G(S), GT_GI(I), n, E, k, &g);
    snprintf(what, sizeof what, "router_group_bwd dlogits %s", tag);
    gt_check_f32(t, what, &DL, (size_t)n * E, 1e-9f, 1e-6f);
    gt_buf_t *bufs[] = {&L, &B, &W, &I, &S, &DL, &DW};
    for (size_t i = 0; i < 7; i++) gt_free(t, bufs[i]);
    free(hb);
    free(hl);
    free(hdw);
    free(hs);
    free(hi);
}

/* Routing with ragged expert loads: experts e with e % 5 == 1 get no token,
 * low experts are favoured; each token's k experts are distinct. */
static int32_t *ragged_idx(gt_ctx_t *t, int n, int k, int E) {
    int32_t *idx = gt_host_bytes((size_t)n * k * 4 + 4);
    for (int r = 0; r < n; r++)
        for (int s = 0; s < k; s++) {
            int e, dup;
            do {
                e = gt_int(t, 3) ? gt_int(t, (E + 3) / 4) : gt_int(t, E);
                dup = e % 5 == 1 && E > 2;
                for (int q = 0; q < s; q++) dup |= idx[(size_t)r * k + q] == e;
            } while (dup);
            idx[(size_t)r * k + s] = e;
        }
    return idx;
}

static void permute_case(gt_ctx_t *t, int n, int k, int E, int H) {
    const int m = n * k;
    int32_t *hidx = ragged_idx(t, n, k, E);
    float *hx = gt_host_rand(t, (size_t)n * H + 1, 1.0f), *hw = gt_host_rand(t, (size_t)m + 1, 1.0f);
    float *hsrc = gt_host_rand(t, (size_t)m * H + 1, 1.0f), *hy = gt_host_rand(t, (size_t)n * H + 1, 1.0f);
    float *hdy = gt_host_rand(t, (size_t)n * H + 1, 1.0f), *hg = gt_host_rand(t, (size_t)n + 1, 4.0f);
    gt_buf_t IDX = gt_from_host(t, hidx, (size_t)m * 4 + 4, "idx");
    gt_buf_t CNT = gt_alloc(t, (size_t)E * 4, "counts"), OFF = gt_alloc(t, (size_t)(E + 1) * 4, "offsets");
    gt_buf_t PT = gt_alloc(t, (size_t)m * 4 + 4, "perm_tok"), INV = gt_alloc(t, (size_t)m * 4 + 4, "inv");
    char tag[64], what[160];
    snprintf(tag, sizeof tag, "n=%d k=%d E=%d H=%d", n, k, E, H);
    t->cpu->ops->moe_plan(t->sc, GT_CI(CNT), GT_CI(OFF), GT_CI(PT), GT_CI(INV), GT_CI(IDX), n, k, E);
    t->gpu->ops->moe_plan(t->sg, GT_GI(CNT), GT_GI(OFF), GT_GI(PT), GT_GI(INV), GT_GI(IDX), n, k, E);
    snprintf(what, sizeof what, "moe_plan counts %s", tag);
    gt_check_exact(t, what, &CNT, CNT.bytes);
    snprintf(what, sizeof what, "moe_plan offsets %s", tag);
    gt_check_exact(t, what, &OFF, OFF.bytes);
    snprintf(what, sizeof what, "moe_plan perm_tok %s", tag);
    gt_check_exact(t, what, &PT, PT.bytes);
    snprintf(what, sizeof what, "moe_plan inv %s", tag);
    gt_check_exact(t, what, &INV, INV.bytes);
    int32_t *hc = gt_host_bytes((size_t)E * 4);
    gt_download(t, &CNT, hc, NULL);
    int zero = 0;
    for (int e = 0; e < E; e++) zero += hc[e] == 0;
    gt_expect(t, m == 0 || zero > 0, "moe_plan %s: the fixture should leave some expert without tokens", tag);

    gt_buf_t X = gt_from_host(t, hx, ((size_t)n * H + 1) * 4, "x");
    gt_buf_t XP = gt_alloc(t, ((size_t)m * H + 1) * 4, "x permuted");
    t->cpu->ops->moe_gather(t->sc, GT_C(XP), GT_C(X), GT_CI(PT), m, H);
    t->gpu->ops->moe_gather(t->sg, GT_G(XP), GT_G(X), GT_GI(PT), m, H);
    snprintf(what, sizeof what, "moe_gather %s", tag);
    gt_check_exact(t, what, &XP, XP.bytes);

    gt_buf_t SRC = gt_from_host(t, hsrc, ((size_t)m * H + 1) * 4, "expert out");
    gt_buf_t WT = gt_from_host(t, hw, ((size_t)m + 1) * 4, "router weights");
    gt_buf_t Y = gt_alloc(t, ((size_t)n * H + 1) * 4, "y");
    t->cpu->ops->moe_unpermute_sum(t->sc, GT_C(Y), GT_C(SRC), GT_C(WT), GT_CI(INV), n, k, H, 0);
    t->gpu->ops->moe_unpermute_sum(t->sg, GT_G(Y), GT_G(SRC), GT_G(WT), GT_GI(INV), n, k, H, 0);
    snprintf(what, sizeof what, "moe_unpermute_sum weighted overwrite %s", tag);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_set(t, &Y, hy);
    t->cpu->ops->moe_unpermute_sum(t->sc, GT_C(Y), GT_C(SRC), NULL, GT_CI(INV), n, k, H, 1);
    t->gpu->ops->moe_unpermute_sum(t->sg, GT_G(Y), GT_G(SRC), NULL, GT_GI(INV), n, k, H, 1);
    snprintf(what, sizeof what, "moe_unpermute_sum unweighted accumulate %s", tag);
    gt_check_exact(t, what, &Y, Y.bytes);

    gt_buf_t DY = gt_from_host(t, hdy, ((size_t)n * H + 1) * 4, "dy");
    gt_buf_t DSRC = gt_alloc(t, ((size_t)m * H + 1) * 4, "dsrc"), DWT = gt_alloc(t, ((size_t)m + 1) * 4, "dw");
    t->cpu->ops->moe_combine_bwd(t->sc, GT_C(DSRC), GT_C(DWT), GT_C(DY), GT_C(SRC), GT_C(WT), GT_CI(INV), n, k, H);
    t->gpu->ops->moe_combine_bwd(t->sg, GT_G(DSRC), GT_G(DWT), GT_G(DY), GT_G(SRC), GT_G(WT), GT_GI(INV), n, k, H);
    snprintf(what, sizeof what, "moe_combine_bwd dsrc %s", tag);
    gt_check_exact(t, what, &DSRC, DSRC.bytes);
    snprintf(what, sizeof what, "moe_combine_bwd dw %s", tag);
    gt_check_f32(t, what, &DWT, (size_t)m + 1, 1e-6f, 1e-6f);

    /* bf16 expert outputs (a bf16 run's): each twin's bf16 op against the
     * other, and the GPU's against the CPU's fp32 op on the widened values */
    uint16_t *hs16 = gt_host_bytes(((size_t)m * H + 1) * 2);
    float *hsw = gt_host_alloc((size_t)m * H + 1);
    for (size_t i = 0; i < (size_t)m * H + 1; i++) hs16[i] = mt_f32_to_bf16(hsrc[i]), hsw[i] = mt_bf16_to_f32(hs16[i]);
    gt_buf_t S16 = gt_from_host(t, hs16, ((size_t)m * H + 1) * 2, "expert out (bf16)");
    gt_buf_t SW = gt_from_host(t, hsw, ((size_t)m * H + 1) * 4, "expert out (bf16, widened)");
    /* the bf16 combine backward's dsrc is bf16: against the fp32 op's,
     * rounded once on the CPU */
    gt_buf_t D16 = gt_alloc(t, ((size_t)m * H + 1) * 2, "dsrc (bf16)");
    for (int twin = 0; twin < 2; twin++) {
        const char *vs = twin ? "CPU fp32 op on the widened src" : "CPU";
        gt_set(t, &Y, hy);
        if (twin) t->cpu->ops->moe_unpermute_sum(t->sc, GT_C(Y), GT_C(SW), GT_C(WT), GT_CI(INV), n, k, H, 1);
        else t->cpu->ops->moe_unpermute_sum_bf16(t->sc, GT_C(Y), GT_CU16(S16), GT_C(WT), GT_CI(INV), n, k, H, 1);
        t->gpu->ops->moe_unpermute_sum_bf16(t->sg, GT_G(Y), GT_GU16(S16), GT_G(WT), GT_GI(INV), n, k, H, 1);
        snprintf(what, sizeof what, "moe_unpermute_sum_bf16 weighted accumulate %s vs %s", tag, vs);
        gt_check_exact(t, what, &Y, Y.bytes);
        if (twin) {
            t->cpu->ops->moe_combine_bwd(t->sc, GT_C(DSRC), GT_C(DWT), GT_C(DY), GT_C(SW), GT_C(WT), GT_CI(INV), n, k,
                                         H);
            t->cpu->ops->f32_to_bf16(t->sc, GT_CU16(D16), GT_C(DSRC), (size_t)m * H);
        } else {
            t->cpu->ops->moe_combine_bwd_bf16(t->sc, GT_CU16(D16), GT_C(DWT), GT_C(DY), GT_CU16(S16), GT_C(WT),
                                              GT_CI(INV), n, k, H);
        }
        t->gpu->ops->moe_combine_bwd_bf16(t->sg, GT_GU16(D16), GT_G(DWT), GT_G(DY), GT_GU16(S16), GT_G(WT),
                                          GT_GI(INV), n, k, H);
        snprintf(what, sizeof what, "moe_combine_bwd_bf16 dsrc %s vs %s", tag, vs);
        gt_check_exact(t, what, &D16, (size_t)m * H * 2);
        snprintf(what, sizeof what, "moe_combine_bwd_bf16 dw %s vs %s", tag, vs);
        gt_check_f32(t, what, &DWT, (size_t)m + 1, 1e-6f, 1e-6f);
    }
    /* unweighted, accumulating: the gather's backward from a bf16 run's two
     * input-gradient parts (moe_layer.c) */
    gt_set(t, &Y, hy);
    t->cpu->ops->moe_unpermute_sum_bf16(t->sc, GT_C(Y), GT_CU16(S16), NULL, GT_CI(INV), n, k, H, 1);
    t->gpu->ops->moe_unpermute_sum_bf16(t->sg, GT_G(Y), GT_GU16(S16), NULL, GT_GI(INV), n, k, H, 1);
    snprintf(what, sizeof what, "moe_unpermute_sum_bf16 unweighted accumulate %s", tag);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_free(t, &S16);
    gt_free(t, &SW);
    gt_free(t, &D16);
    free(hs16);
    free(hsw);

    gt_buf_t G = gt_from_host(t, hg, ((size_t)n + 1) * 4, "gate logit");
    gt_buf_t DG = gt_alloc(t, ((size_t)n + 1) * 4, "dgate"), DX = gt_alloc(t, ((size_t)n * H + 1) * 4, "dx");
    gt_set(t, &Y, hy);
    t->cpu->ops->gate_scale_fwd(t->sc, GT_C(Y), GT_C(X), GT_C(G), n, H);
    t->gpu->ops->gate_scale_fwd(t->sg, GT_G(Y), GT_G(X), GT_G(G), n, H);
    snprintf(what, sizeof what, "gate_scale_fwd %s", tag);
    gt_check_f32(t, what, &Y, (size_t)n * H + 1, 1e-7f, 4e-6f);
    t->cpu->ops->gate_scale_bwd(t->sc, GT_C(DX), GT_C(DG), GT_C(DY), GT_C(X), GT_C(G), n, H);
    t->gpu->ops->gate_scale_bwd(t->sg, GT_G(DX), GT_G(DG), GT_G(DY), GT_G(X), GT_G(G), n, H);
    snprintf(what, sizeof what, "gate_scale_bwd dx %s", tag);
    gt_check_f32(t, what, &DX, (size_t)n * H + 1, 1e-7f, 4e-6f);
    snprintf(what, sizeof what, "gate_scale_bwd dglogit %s", tag);
    gt_check_f32(t, what, &DG, (size_t)n + 1, 1e-6f, 1e-5f);

    gt_buf_t *bufs[] = {&IDX, &CNT, &OFF, &PT, &INV, &X, &XP, &SRC, &WT, &Y, &DY, &DSRC, &DWT, &G, &DG, &DX};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    free(hidx);
    free(hx);
    free(hw);
    free(hsrc);
    free(hy);
    free(hdy);
    free(hg);
    free(hc);
}

/* Rows of the logits poisoned with NaN / +Inf / -Inf among finite ones. */
static void router_nonfinite_case(gt_ctx_t *t, int n, int E, int k, kern_router_mode_t mode) {
    float *hl = router_logits(t, n, E);
    for (int r = 0; r < n; r++) {
        float *row = hl + (size_t)r * E;
        switch (r % 5) {
        case 0: row[gt_int(t, E)] = NAN; break;
        case 1: row[gt_int(t, E)] = INFINITY; break;
        case 2: for (int e = 0; e < E; e++) row[e] = -INFINITY; break;
        case 3: for (int e = 0; e < E; e++) if (e % 3) row[e] = -INFINITY; break;
        default: break; /* finite */
        }
    }
    gt_buf_t L = gt_from_host(t, hl, (size_t)n * E * 4, "logits");
    gt_buf_t W = gt_alloc(t, (size_t)n * k * 4, "weights"), I = gt_alloc(t, (size_t)n * k * 4, "idx");
    gt_buf_t P = gt_alloc(t, (size_t)n * E * 4, "probs");
    gt_buf_t CNT = gt_alloc(t, (size_t)E * 4, "counts"), OFF = gt_alloc(t, (size_t)(E + 1) * 4, "offsets");
    gt_buf_t PT = gt_alloc(t, (size_t)n * k * 4, "perm_tok"), INV = gt_alloc(t, (size_t)n * k * 4, "inv");
    char what[160];
    t->cpu->ops->router_fwd(t->sc, GT_C(W), GT_CI(I), GT_C(P), GT_C(L), n, E, k, mode);
    t->gpu->ops->router_fwd(t->sg, GT_G(W), GT_GI(I), GT_G(P), GT_G(L), n, E, k, mode);
    snprintf(what, sizeof what, "router_fwd non-finite idx n=%d E=%d k=%d", n, E, k);
    gt_check_exact(t, what, &I, I.bytes);
    snprintf(what, sizeof what, "router_fwd non-finite probs n=%d E=%d k=%d", n, E, k);
    gt_check_f32(t, what, &P, (size_t)n * E, 1e-9f, 1e-5f);
    snprintf(what, sizeof what, "router_fwd non-finite weights n=%d E=%d k=%d", n, E, k);
    gt_check_f32(t, what, &W, (size_t)n * k, 1e-9f, 1e-5f);
    int32_t *hi = gt_host_bytes((size_t)n * k * 4);
    gt_download(t, &I, hi, NULL);
    int bad = 0;
    for (int r = 0; r < n; r++)
        for (int s = 0; s < k; s++) {
            const int32_t e = hi[(size_t)r * k + s];
            bad += e < 0 || e >= E;
            for (int q = 0; q < s; q++) bad += hi[(size_t)r * k + q] == e;
        }
    gt_expect(t, bad == 0, "router_fwd non-finite: %d slots out of range or repeated", bad);
    t->cpu->ops->moe_plan(t->sc, GT_CI(CNT), GT_CI(OFF), GT_CI(PT), GT_CI(INV), GT_CI(I), n, k, E);
    t->gpu->ops->moe_plan(t->sg, GT_GI(CNT), GT_GI(OFF), GT_GI(PT), GT_GI(INV), GT_GI(I), n, k, E);
    gt_check_exact(t, "moe_plan after non-finite routing: offsets", &OFF, OFF.bytes);
    gt_check_exact(t, "moe_plan after non-finite routing: inv", &INV, INV.bytes);
    gt_buf_t *bufs[] = {&L, &W, &I, &P, &CNT, &OFF, &PT, &INV};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    free(hl);
    free(hi);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "moe_test", 0x30e);
    router_case(&t, 1, 2, 1, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 0, 0);
    router_case(&t, 37, 8, 2, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 1, 0);   /* Mixtral */
    router_case(&t, 100, 60, 4, KERN_ROUTER_SOFTMAX_TOPK, 1, 1);        /* Qwen2-MoE */
    router_case(&t, 64, 128, 8, KERN_ROUTER_SOFTMAX_TOPK_RENORM, 1, 1); /* Qwen3-MoE */
    router_case(&t, 9, 256, 8, KERN_ROUTER_SOFTMAX_TOPK, 0, 0);
    router_group_case_s(&t, 37, 8, 2, 2, 1, 1, 2.5f, 0);   /* tiny DeepSeek-V3 */
    router_group_case_s(&t, 50, 16, 4, 1, 1, 1, 1.0f, 0);  /* GLM-4.5: one group */
    router_group_case_s(&t, 300, 256, 8, 8, 4, 1, 2.5f, 0); /* DeepSeek-V3 (> one block of rows) */
    router_group_case_s(&t, 20, 64, 6, 8, 3, 0, 1.0f, 0);
    router_group_case_s(&t, 40, 160, 6, 8, 3, 0, 16.0f, 1); /* DeepSeek-V2: softmax, group_limited_greedy */
    router_group_case_s(&t, 40, 64, 6, 1, 1, 0, 1.0f, 1);   /* DeepSeek-V2-Lite: greedy */
    router_nonfinite_case(&t, 20, 8, 2, KERN_ROUTER_SOFTMAX_TOPK_RENORM);
    router_nonfinite_case(&t, 20, 60, 4, KERN_ROUTER_SOFTMAX_TOPK);
    router_nonfinite_case(&t, 10, 128, 8, KERN_ROUTER_SOFTMAX_TOPK_RENORM);
    permute_case(&t, 0, 2, 8, 16);
    permute_case(&t, 1, 1, 3, 5);
    permute_case(&t, 37, 2, 8, 64);
    permute_case(&t, 500, 8, 128, 96);
    permute_case(&t, 2048, 4, 60, 33);
    return gt_close(&t);
}
