/* Sparse MoE block forward/backward (see moe_layer.h).
 *
 * Data flow of the forward pass, n tokens, m = n*k permuted rows:
 *   logits = xn router^T -> router -> (topw, idx) -> plan (counts, perm)
 *   xp = gather(xn) -> per expert: g = xp gate^T, u = xp up^T,
 *   ep = (silu(g) * u) down^T  -> y = sum_k topw * ep   [+ shared]
 * The counts go to the host once per layer (one small D2H copy) because
 * they size the grouped products; everything else stays on the device.
 * h = silu(g) * u is recomputed in backward instead of being saved: it is
 * as large as g and costs one element-wise pass. */
#include "moe/moe_layer.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"

/* One product with the layer's compute dtype: C (F32) = alpha op(A) op(B) + beta C. */
static void mm_in(kern_device_t *dev, mt_dtype_t compute, void *C, const void *A, mt_dtype_t a_dt, const void *B,
                  mt_dtype_t b_dt, int M, int N, int K, bool ta, bool tb, float alpha, float beta) {
    const kern_mm_t p = kern_mm_make(C, A, a_dt, B, b_dt, M, N, K, ta, tb, alpha, beta, compute);
    dev->ops->mm(kern_stream(dev, KERN_STREAM_COMPUTE), &p);
}

static void mm(kern_device_t *dev, const moe_layer_dims_t *d, void *C, const void *A, mt_dtype_t a_dt,
               const void *B, mt_dtype_t b_dt, int M, int N, int K, bool ta, bool tb, float alpha, float beta) {
    mm_in(dev, d->compute, C, A, a_dt, B, b_dt, M, N, K, ta, tb, alpha, beta);
}

/* The router's products run in fp32 whatever the compute dtype: the choice
 * of experts is discrete, and bf16 logits flip near-ties between experts
 * that fp32 keeps apart, which then changes which weights a token trains
 * (the router weight stays fp32 on the device for the same reason). */

/* One grouped product over the experts that have tokens: operands are
 * collected with their dtypes, the flags given when it runs. */
typedef struct {
    void *C;
    const void *A, *B;
    mt_dtype_t a_dt, b_dt;
    int M, N, K;
} group_operands_t;

typedef struct {
    group_operands_t *d;
    kern_mm_t *mm;
    int count;
} groups_t;

static groups_t groups_new(int E) {
    groups_t g = {.d = calloc((size_t)E, sizeof(group_operands_t)), .mm = calloc((size_t)E, sizeof(kern_mm_t))};
    MT_CHECK(g.d && g.mm, "out of host memory for %d expert product descriptors", E);
    return g;
}

static void groups_free(groups_t *g) {
    free(g->d);
    free(g->mm);
}

static void groups_push(groups_t *g, void *C, const void *A, mt_dtype_t a_dt, const void *B, mt_dtype_t b_dt, int M,
                        int N, int K) {
    g->d[g->count++] = (group_operands_t){C, A, B, a_dt, b_dt, M, N, K};
}

static void groups_run(kern_device_t *dev, const moe_layer_dims_t *d, groups_t *g, bool ta, bool tb, float alpha,
                       float beta) {
    for (int i = 0; i < g->count; i++) {
        const group_operands_t *o = &g->d[i];
        g->mm[i] = kern_mm_make(o->C, o->A, o->a_dt, o->B, o->b_dt, o->M, o->N, o->K, ta, tb, alpha, beta,
                                d->compute);
    }
    dev->ops->mm_grouped(kern_stream(dev, KERN_STREAM_COMPUTE), g->mm, g->count);
}

mt_status_t moe_plan_routes(kern_device_t *dev, const moe_layer_dims_t *d, int n, moe_layer_acts_t *a,
                            mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int E = d->E, k = d->k;
    ALLOC_ACT(a->counts, MOE_ACT_COUNTS, int32_t, "moe expert counts");
    ALLOC_ACT(a->offsets, MOE_ACT_OFFSETS, int32_t, "moe expert offsets");
    ALLOC_ACT(a->perm_tok, MOE_ACT_PERM, int32_t, "moe permutation");
    ALLOC_ACT(a->inv, MOE_ACT_INV, int32_t, "moe inverse permutation");
    ops->moe_plan(s, a->counts, a->offsets, a->perm_tok, a->inv, a->idx, n, k, E);
    a->counts_host = malloc((size_t)E * sizeof *a->counts_host);
    a->offsets_host = malloc((size_t)(E + 1) * sizeof *a->offsets_host);
    MT_CHECK(a->counts_host && a->offsets_host, "out of host memory for moe counts");
    kern_memcpy_d2h(dev, s, a->counts_host, a->counts, (size_t)E * sizeof(int32_t));
    kern_memcpy_d2h(dev, s, a->offsets_host, a->offsets, (size_t)(E + 1) * sizeof(int32_t));
    kern_stream_sync(dev, s);
    return MT_OK;
fail:
    return err->code;
}

mt_status_t moe_gather_rows(kern_device_t *dev, const moe_layer_dims_t *d, const float *xn, moe_layer_acts_t *a,
                            mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int n = a->n, m = a->m, H = d->H;
    float *h = NULL;
    /* the gathered inputs, stored in their described dtype (gathered in
     * fp32, then rounded once when that is bf16) */
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    a->xp = kern_alloc(dev, (size_t)(d->acts[MOE_ACT_XP].per_token * n + d->acts[MOE_ACT_XP].fixed) * xp_elem,
                       "moe gathered tokens", err);
    if (!a->xp) goto fail;
    if (xp_dt == MT_F32) {
        ops->moe_gather(s, a->xp, xn, a->perm_tok, m, H);
    } else {
        ALLOC(h, (size_t)m * H, float, "moe gathered tokens (fp32)");
        ops->moe_gather(s, h, xn, a->perm_tok, m, H);
        ops->f32_to_bf16(s, a->xp, h, (size_t)m * H);
        kern_free(dev, h);
    }
    return MT_OK;
fail:
    return err->code;
}

mt_status_t moe_experts_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                const int32_t *counts, const int32_t *offsets, int rows, const void *xp,
                                float *g, float *u, float *ep, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, I = d->I;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    float *h = NULL;
    groups_t gg = groups_new(E);
    ALLOC(h, (size_t)rows * I, float, "moe expert hidden");

    /* g = xp gate^T and u = xp up^T for every expert with tokens */
    for (int pass = 0; pass < 2; pass++) {
        gg.count = 0;
        float *dst = pass == 0 ? g : u;
        void **w = pass == 0 ? p->gate : p->up;
        for (int e = 0; e < E; e++) {
            const int off = offsets[e], cnt = counts[e];
            if (cnt) groups_push(&gg, dst + (size_t)off * I, (const char *)xp + (size_t)off * H * xp_elem, xp_dt, w[e], p->dtype, cnt, I, H);
        }
        groups_run(dev, d, &gg, false, true, 1.0f, 0.0f);
        const kern_lora_t *lora = pass == 0 ? p->lora_gate : p->lora_up;
        for (int e = 0; lora && e < E; e++)
            TRY(kern_lora_fwd(dev, d->compute, &lora[e], dst + (size_t)offsets[e] * I,
                              (const char *)xp + (size_t)offsets[e] * H * xp_elem, xp_dt, counts[e], H, I,
                              err));
    }
    ops->swiglu_fwd(s, h, g, u, (size_t)rows * I);
    gg.count = 0;
    for (int e = 0; e < E; e++) {
        const int off = offsets[e], cnt = counts[e];
        if (cnt) groups_push(&gg, ep + (size_t)off * H, h + (size_t)off * I, MT_F32, p->down[e], p->dtype, cnt, H, I);
    }
    groups_run(dev, d, &gg, false, true, 1.0f, 0.0f);
    for (int e = 0; p->lora_down && e < E; e++)
        TRY(kern_lora_fwd(dev, d->compute, &p->lora_down[e], ep + (size_t)offsets[e] * H,
                          h + (size_t)offsets[e] * I, MT_F32, counts[e], I, H, err));
    kern_free(dev, h);
    groups_free(&gg);
    return MT_OK;
fail:
    moe_dfree(dev, h);
    groups_free(&gg);
    return err->code;
}

mt_status_t moe_layer_forward(kern_device_t *dev, const moe_layer_dims_t *d,
                              const moe_layer_params_t *p, const float *xn, int n, float *y,
                              moe_layer_acts_t *a, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, k = d->k, m = n * k;
    float *sh = NULL;
    memset(a, 0, sizeof *a);
    a->n = n;
    a->m = m;

    ALLOC_ACT(a->logits, MOE_ACT_LOGITS, float, "moe router logits");
    ALLOC_ACT(a->probs, MOE_ACT_PROBS, float, "moe router probs");
    ALLOC_ACT(a->topw, MOE_ACT_TOPW, float, "moe top-k weights");
    ALLOC_ACT(a->idx, MOE_ACT_IDX, int32_t, "moe top-k experts");
    mm_in(dev, MT_F32, a->logits, xn, MT_F32, p->router, MT_F32, n, E, H, false, true, 1.0f, 0.0f);
    TRY(kern_lora_fwd(dev, MT_F32, &p->lora_router, a->logits, xn, MT_F32, n, H, E, err));
    if (d->router_grouped)
        ops->router_group_fwd(s, a->topw, a->idx, a->probs, a->logits, p->router_bias, n, E, k, &d->router_group);
    else
        ops->router_fwd(s, a->topw, a->idx, a->probs, a->logits, n, E, k, d->router_mode);

    TRY(moe_plan_routes(dev, d, n, a, err));

    if (p->ep) {
        TRY(moe_ep_forward(dev, d, p, xn, a, err));
    } else {
        if (p->fetch_experts &&
            p->fetch_experts(p->fetch_ctx, a->counts_host, p->gate, p->up, p->down, err) != MT_OK)
            goto fail;
        TRY(moe_gather_rows(dev, d, xn, a, err));
        ALLOC_ACT(a->g, MOE_ACT_G, float, "moe expert gate activations");
        ALLOC_ACT(a->u, MOE_ACT_U, float, "moe expert up activations");
        ALLOC_ACT(a->ep, MOE_ACT_EP, float, "moe expert outputs");
        TRY(moe_experts_forward(dev, d, p, a->counts_host, a->offsets_host, m, a->xp, a->g, a->u, a->ep, err));
    }
    ops->moe_unpermute_sum(s, y, a->ep, a->topw, a->inv, n, k, H, 0);

    if (d->Is > 0) {
        const int Is = d->Is;
        ALLOC_ACT(a->sg, MOE_ACT_SG, float, "shared expert gate activations");
        ALLOC_ACT(a->su, MOE_ACT_SU, float, "shared expert up activations");
        ALLOC(sh, (size_t)n * Is, float, "shared expert hidden");
        ALLOC_ACT(a->so, MOE_ACT_SO, float, "shared expert output");
        if (p->sh_expert_gate) ALLOC_ACT(a->sgl, MOE_ACT_SGL, float, "shared expert gate logit");
        mm(dev, d, a->sg, xn, MT_F32, p->sh_gate, p->dtype, n, Is, H, false, true, 1.0f, 0.0f);
        TRY(kern_lora_fwd(dev, d->compute, &p->lora_sh_gate, a->sg, xn, MT_F32, n, H, Is, err));
        mm(dev, d, a->su, xn, MT_F32, p->sh_up, p->dtype, n, Is, H, false, true, 1.0f, 0.0f);
        TRY(kern_lora_fwd(dev, d->compute, &p->lora_sh_up, a->su, xn, MT_F32, n, H, Is, err));
        ops->swiglu_fwd(s, sh, a->sg, a->su, (size_t)n * Is);
        mm(dev, d, a->so, sh, MT_F32, p->sh_down, p->dtype, n, H, Is, false, true, 1.0f, 0.0f);
        TRY(kern_lora_fwd(dev, d->compute, &p->lora_sh_down, a->so, sh, MT_F32, n, Is, H, err));
        if (p->sh_expert_gate) {
            mm(dev, d, a->sgl, xn, MT_F32, p->sh_expert_gate, p->dtype, n, 1, H, false, true, 1.0f, 0.0f);
            TRY(kern_lora_fwd(dev, d->compute, &p->lora_sh_expert_gate, a->sgl, xn, MT_F32, n, H, 1, err));
            ops->gate_scale_fwd(s, y, a->so, a->sgl, n, H);
        } else { /* DeepSeek's shared experts: a plain sum (the routed part first, as transformers adds) */
            ops->add(s, y, y, a->so, (size_t)n * H);
        }
        kern_free(dev, sh);
        sh = NULL;
    }
    return MT_OK;
fail:
    /* a peer may be waiting for this device in an exchange it will not join */
    if (p->ep) kern_comm_abort(p->ep->comm);
    moe_dfree(dev, sh);
    moe_layer_acts_release(dev, a);
    return err ? err->code : MT_ERR_BUDGET;
}

mt_status_t moe_experts_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                 const moe_layer_params_t *gp, const int32_t *counts, const int32_t *offsets,
                                 int rows, const void *xp, float *g, float *u, float *dep, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, I = d->I;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    float *h = NULL, *dh = NULL;
    groups_t gg = groups_new(E);
    ALLOC(h, (size_t)rows * I, float, "moe expert hidden (recomputed)");
    ops->swiglu_fwd(s, h, g, u, (size_t)rows * I);
    ALLOC(dh, (size_t)rows * I, float, "moe d(expert hidden)");

#define FOR_EXPERTS(body)                                                   \
    do {                                                                    \
        gg.count = 0;                                                       \
        for (int e = 0; e < E; e++) {                                       \
            const int off = offsets[e], cnt = counts[e];                    \
            if (cnt) { body; }                                              \
        }                                                                   \
    } while (0)

    /* dh = dep down ; d(down) += dep^T h */
    FOR_EXPERTS(groups_push(&gg, dh + (size_t)off * I, dep + (size_t)off * H, MT_F32, p->down[e], p->dtype, cnt, I, H));
    groups_run(dev, d, &gg, false, false, 1.0f, 0.0f);
    FOR_EXPERTS(if (gp->down[e]) groups_push(&gg, gp->down[e], dep + (size_t)off * H, MT_F32, h + (size_t)off * I, MT_F32, H, I, cnt));
    groups_run(dev, d, &gg, true, false, 1.0f, 1.0f);
    for (int e = 0; p->lora_down && e < E; e++) {
        const size_t off = (size_t)offsets[e];
        TRY(kern_lora_bwd(dev, d->compute, &p->lora_down[e], dep + off * H, h + off * I, MT_F32, dh + off * I,
                          counts[e], I, H, err));
    }
    kern_free(dev, h);
    h = NULL;
    /* dg, du in place of g, u (saved activations are not needed after this) */
    ops->swiglu_bwd(s, g, u, dh, g, u, (size_t)rows * I);
    kern_free(dev, dh);
    dh = NULL;
    FOR_EXPERTS(if (gp->gate[e]) groups_push(&gg, gp->gate[e], g + (size_t)off * I, MT_F32, (const char *)xp + (size_t)off * H * xp_elem, xp_dt, I, H, cnt));
    groups_run(dev, d, &gg, true, false, 1.0f, 1.0f);
    FOR_EXPERTS(if (gp->up[e]) groups_push(&gg, gp->up[e], u + (size_t)off * I, MT_F32, (const char *)xp + (size_t)off * H * xp_elem, xp_dt, I, H, cnt));
    groups_run(dev, d, &gg, true, false, 1.0f, 1.0f);
    /* dxp (reusing dep) = dg gate + du up */
    FOR_EXPERTS(groups_push(&gg, dep + (size_t)off * H, g + (size_t)off * I, MT_F32, p->gate[e], p->dtype, cnt, H, I));
    groups_run(dev, d, &gg, false, false, 1.0f, 0.0f);
    FOR_EXPERTS(groups_push(&gg, dep + (size_t)off * H, u + (size_t)off * I, MT_F32, p->up[e], p->dtype, cnt, H, I));
    groups_run(dev, d, &gg, false, false, 1.0f, 1.0f);
#undef FOR_EXPERTS
    for (int e = 0; e < E; e++) {
        const size_t off = (size_t)offsets[e];
        const void *xe = (const char *)xp + off * H * xp_elem;
        if (p->lora_gate)
            TRY(kern_lora_bwd(dev, d->compute, &p->lora_gate[e], g + off * I, xe, xp_dt, dep + off * H,
                              counts[e], H, I, err));
        if (p->lora_up)
            TRY(kern_lora_bwd(dev, d->compute, &p->lora_up[e], u + off * I, xe, xp_dt, dep + off * H,
                              counts[e], H, I, err));
    }
    groups_free(&gg);
    return MT_OK;
fail:
    moe_dfree(dev, h);
    moe_dfree(dev, dh);
    groups_free(&gg);
    return err->code;
}

mt_status_t moe_layer_backward(kern_device_t *dev, const moe_layer_dims_t *d,
                               const moe_layer_params_t *p, const moe_layer_params_t *gp,
                               const float *xn, const float *dy, const float *aux_dp,
                               const float *tok_w, moe_layer_acts_t *a, float *dxn,
                               mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, k = d->k, n = a->n, m = a->m;
    float *dtopw = NULL, *dep = NULL, *dlogits = NULL;
    float *dso = NULL, *dsgl = NULL, *sh = NULL, *dsh = NULL;

    ALLOC(dtopw, (size_t)n * k, float, "moe d(top-k weights)");
    ALLOC(dep, (size_t)m * H, float, "moe d(expert outputs)");
    ops->moe_combine_bwd(s, dep, dtopw, dy, a->ep, a->topw, a->inv, n, k, H);
    if (p->ep) TRY(moe_ep_backward(dev, d, p, gp, a, dep, err));
    else TRY(moe_experts_backward(dev, d, p, gp, a->counts_host, a->offsets_host, m, a->xp, a->g, a->u, dep, err));
    ops->moe_unpermute_sum(s, dxn, dep, NULL, a->inv, n, k, H, 0);
    kern_free(dev, dep);
    dep = NULL;

    ALLOC(dlogits, (size_t)n * E, float, "moe d(router logits)");
    if (d->router_grouped) {
        MT_CHECK(!aux_dp, "moe layer: the grouped sigmoid router has no load-balancing term");
        ops->router_group_bwd(s, dlogits, dtopw, a->probs, a->idx, n, E, k, &d->router_group);
    } else {
        ops->router_bwd(s, dlogits, dtopw, a->probs, a->idx, aux_dp, tok_w, n, E, k, d->router_mode);
    }
    if (gp->router) mm_in(dev, MT_F32, gp->router, dlogits, MT_F32, xn, MT_F32, E, H, n, true, false, 1.0f, 1.0f);
    mm_in(dev, MT_F32, dxn, dlogits, MT_F32, p->router, MT_F32, n, H, E, false, false, 1.0f, 1.0f);
    TRY(kern_lora_bwd(dev, MT_F32, &p->lora_router, dlogits, xn, MT_F32, dxn, n, H, E, err));
    kern_free(dev, dlogits);
    dlogits = NULL;

    if (d->Is > 0) {
        const int Is = d->Is;
        ALLOC(dso, (size_t)n * H, float, "shared expert d(output)");
        if (p->sh_expert_gate) {
            ALLOC(dsgl, n, float, "shared expert d(gate logit)");
            ops->gate_scale_bwd(s, dso, dsgl, dy, a->so, a->sgl, n, H);
            if (gp->sh_expert_gate) mm(dev, d, gp->sh_expert_gate, dsgl, MT_F32, xn, MT_F32, 1, H, n, true, false, 1.0f, 1.0f);
            mm(dev, d, dxn, dsgl, MT_F32, p->sh_expert_gate, p->dtype, n, H, 1, false, false, 1.0f, 1.0f);
            TRY(kern_lora_bwd(dev, d->compute, &p->lora_sh_expert_gate, dsgl, xn, MT_F32, dxn, n, H, 1, err));
        } else { /* ungated: the output's gradient is dy itself */
            kern_memcpy_d2d(dev, s, dso, dy, (size_t)n * H * sizeof(float));
        }
        ALLOC(sh, (size_t)n * Is, float, "shared expert hidden (recomputed)");
        ALLOC(dsh, (size_t)n * Is, float, "shared expert d(hidden)");
        ops->swiglu_fwd(s, sh, a->sg, a->su, (size_t)n * Is);
        mm(dev, d, dsh, dso, MT_F32, p->sh_down, p->dtype, n, Is, H, false, false, 1.0f, 0.0f);
        if (gp->sh_down) mm(dev, d, gp->sh_down, dso, MT_F32, sh, MT_F32, H, Is, n, true, false, 1.0f, 1.0f);
        TRY(kern_lora_bwd(dev, d->compute, &p->lora_sh_down, dso, sh, MT_F32, dsh, n, Is, H, err));
        ops->swiglu_bwd(s, a->sg, a->su, dsh, a->sg, a->su, (size_t)n * Is);
        if (gp->sh_gate) mm(dev, d, gp->sh_gate, a->sg, MT_F32, xn, MT_F32, Is, H, n, true, false, 1.0f, 1.0f);
        if (gp->sh_up) mm(dev, d, gp->sh_up, a->su, MT_F32, xn, MT_F32, Is, H, n, true, false, 1.0f, 1.0f);
        mm(dev, d, dxn, a->sg, MT_F32, p->sh_gate, p->dtype, n, H, Is, false, false, 1.0f, 1.0f);
        mm(dev, d, dxn, a->su, MT_F32, p->sh_up, p->dtype, n, H, Is, false, false, 1.0f, 1.0f);
        TRY(kern_lora_bwd(dev, d->compute, &p->lora_sh_gate, a->sg, xn, MT_F32, dxn, n, H, Is, err));
        TRY(kern_lora_bwd(dev, d->compute, &p->lora_sh_up, a->su, xn, MT_F32, dxn, n, H, Is, err));
    }
    moe_dfree(dev, dso);
    moe_dfree(dev, dsgl);
    moe_dfree(dev, sh);
    moe_dfree(dev, dsh);
    moe_dfree(dev, dtopw);
    moe_layer_acts_release(dev, a);
    return MT_OK;
fail:
    if (p->ep) kern_comm_abort(p->ep->comm); /* as in forward */
    moe_dfree(dev, dtopw);
    moe_dfree(dev, dep);
    moe_dfree(dev, dlogits);
    moe_dfree(dev, dso);
    moe_dfree(dev, dsgl);
    moe_dfree(dev, sh);
    moe_dfree(dev, dsh);
    moe_layer_acts_release(dev, a);
    return err ? err->code : MT_ERR_BUDGET;
}

const int32_t *moe_layer_expert_rows(const moe_layer_acts_t *a) {
    const int32_t *ran = a->ep_acts ? moe_ep_expert_rows(a->ep_acts) : NULL;
    return ran ? ran : a->counts_host;
}

void moe_layer_acts_release(kern_device_t *dev, moe_layer_acts_t *a) {
    void *dev_ptrs[] = {a->logits, a->probs, a->topw, a->idx, a->counts, a->offsets, a->perm_tok,
                        a->inv, a->xp, a->g, a->u, a->ep, a->sg, a->su, a->so, a->sgl};
    for (size_t i = 0; i < sizeof dev_ptrs / sizeof dev_ptrs[0]; i++) moe_dfree(dev, dev_ptrs[i]);
    moe_ep_acts_free(dev, a->ep_acts);
    free(a->counts_host);
    free(a->offsets_host);
    memset(a, 0, sizeof *a);
}
