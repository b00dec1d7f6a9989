/* MoE block with experts fused over E and biases (see moe_fused.h).
 *
 * The routing plan (counts, offsets, permutation) and the gathered rows are
 * moe_layer.c's; what differs is the experts: one product per expert
 * against its slice of the fused tensor (x @ W, no transpose), a bias per
 * expert on its rows, and the clamped SwiGLU of the interleaved gate/up.
 * h is recomputed in backward from the saved gu (as moe_layer.c recomputes
 * its SwiGLU): one element-wise pass instead of m * I saved floats. */
#include "moe/moe_fused.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"
#include "moe/moe_experts.h"

/* One product over the experts that have rows: C_e = op(A_e) op(B_e), each
 * given by its base pointer and per-expert strides (in elements); rows of
 * the permuted operands start at offsets[e] * row elements. */
typedef struct {
    kern_mm_t *mm;
    int count;
} fused_groups_t;

static void run_groups(kern_device_t *dev, fused_groups_t *g) {
    dev->ops->mm_grouped(kern_stream(dev, KERN_STREAM_COMPUTE), g->mm, g->count);
    g->count = 0;
}

static void push(fused_groups_t *g, const moe_layer_dims_t *d, void *C, const void *A, mt_dtype_t a_dt,
                 const void *B, mt_dtype_t b_dt, int M, int N, int K, bool ta, bool tb, float beta) {
    g->mm[g->count++] = kern_mm_make(C, A, a_dt, B, b_dt, M, N, K, ta, tb, 1.0f, beta, d->compute);
}

/* Expert e's slice of a fused tensor of `per` elements each. */
static const void *slice(const void *base, mt_dtype_t dt, int e, size_t per) {
    return (const char *)base + (size_t)e * per * mt_dtype_size(dt);
}

mt_status_t moe_fused_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_fused_params_t *p,
                              const float *xn, int n, float *y, moe_layer_acts_t *a, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, k = d->k, I = d->I, m = n * k;
    float *h = NULL;
    fused_groups_t gg = {calloc((size_t)E, sizeof(kern_mm_t)), 0};
    MT_CHECK_ALLOC(gg.mm, "expert product descriptors");
    memset(a, 0, sizeof *a);
    a->n = n;
    a->m = m;

    ALLOC_ACT(a->logits, MOE_ACT_LOGITS, float, "moe router logits");
    ALLOC_ACT(a->probs, MOE_ACT_PROBS, float, "moe router probs");
    ALLOC_ACT(a->topw, MOE_ACT_TOPW, float, "moe top-k weights");
    ALLOC_ACT(a->idx, MOE_ACT_IDX, int32_t, "moe top-k experts");
    {
        const kern_mm_t r = kern_mm_make(a->logits, xn, MT_F32, p->router, MT_F32, n, E, H, false, true, 1.0f, 0.0f,
                                         MT_F32);
        ops->mm(s, &r);
    }
    ops->bias_fwd(s, a->logits, p->router_b, n, E);
    ops->router_fwd(s, a->topw, a->idx, a->probs, a->logits, n, E, k, d->router_mode);

    TRY(moe_plan_routes(dev, d, n, a, err));

    /* the gathered rows in their described dtype (rounded once when bf16) */
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    a->xp = kern_alloc(dev, (size_t)m * H * xp_elem, "moe gathered tokens", err);
    if (!a->xp) goto fail;
    if (xp_dt == MT_F32) {
        ops->moe_gather(s, a->xp, xn, a->perm_tok, m, H);
    } else {
        ALLOC(h, (size_t)m * H, float, "moe gathered tokens (fp32)");
        ops->moe_gather(s, h, xn, a->perm_tok, m, H);
        ops->f32_to_bf16(s, a->xp, h, (size_t)m * H);
        kern_free(dev, h);
        h = NULL;
    }
    ALLOC_ACT(a->g, MOE_ACT_G, float, "moe expert gate_up (interleaved)");
    ALLOC(h, (size_t)m * I, float, "moe expert hidden");
    ALLOC_ACT(a->ep, MOE_ACT_EP, float, "moe expert outputs");

    const size_t gu_per = (size_t)H * 2 * I, down_per = (size_t)I * H;
    for (int e = 0; e < E; e++) {
        const int off = a->offsets_host[e], cnt = a->counts_host[e];
        if (cnt)
            push(&gg, d, (float *)a->g + (size_t)off * 2 * I, (const char *)a->xp + (size_t)off * H * xp_elem,
                 xp_dt, slice(p->gate_up, p->dtype, e, gu_per), p->dtype, cnt, 2 * I, H, false, false, 0.0f);
    }
    run_groups(dev, &gg);
    ops->expert_bias_fwd(s, a->g, p->gate_up_b, a->offsets, E, 2 * I);
    ops->swiglu_clamped_fwd(s, h, a->g, p->alpha, p->limit, (size_t)m * I);
    for (int e = 0; e < E; e++) {
        const int off = a->offsets_host[e], cnt = a->counts_host[e];
        if (cnt)
            push(&gg, d, (float *)a->ep + (size_t)off * H, h + (size_t)off * I, MT_F32,
                 slice(p->down, p->dtype, e, down_per), p->dtype, cnt, H, I, false, false, 0.0f);
    }
    run_groups(dev, &gg);
    ops->expert_bias_fwd(s, a->ep, p->down_b, a->offsets, E, H);
    kern_free(dev, h);
    h = NULL;
    ops->moe_unpermute_sum(s, y, a->ep, a->topw, a->inv, n, k, H, 0);
    free(gg.mm);
    return MT_OK;
fail:
    moe_dfree(dev, h);
    free(gg.mm);
    moe_layer_acts_release(dev, a);
    return err ? err->code : MT_ERR_BUDGET;
}

mt_status_t moe_fused_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_fused_params_t *p,
                               const moe_fused_grads_t *gp, const float *xn, const float *dy, const float *aux_dp,
                               const float *tok_w, moe_layer_acts_t *a, float *dxn, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, k = d->k, I = d->I, n = a->n, m = a->m;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    const size_t gu_per = (size_t)H * 2 * I, down_per = (size_t)I * H;
    float *dtopw = NULL, *dep = NULL, *h = NULL, *dh = NULL, *dlogits = NULL;
    fused_groups_t gg = {calloc((size_t)E, sizeof(kern_mm_t)), 0};
    MT_CHECK_ALLOC(gg.mm, "expert product descriptors");

    ALLOC(dtopw, (size_t)n * k, float, "moe d(top-k weights)");
    ALLOC(dep, (size_t)m * H, float, "moe d(expert outputs)");
    ops->moe_combine_bwd(s, dep, dtopw, dy, a->ep, a->topw, a->inv, n, k, H);
    ALLOC(h, (size_t)m * I, float, "moe expert hidden (recomputed)");
    ops->swiglu_clamped_fwd(s, h, a->g, p->alpha, p->limit, (size_t)m * I);
    ALLOC(dh, (size_t)m * I, float, "moe d(expert hidden)");

#define FOR_EXPERTS(body)                                                \
    for (int e = 0; e < E; e++) {                                        \
        const int off = a->offsets_host[e], cnt = a->counts_host[e];     \
        if (cnt) { body; }                                               \
    }
    /* dh = dep down[e]^T; d(down[e]) += h^T dep; d(down_b[e]) += colsum(dep) */
    FOR_EXPERTS(push(&gg, d, dh + (size_t)off * I, dep + (size_t)off * H, MT_F32,
                     slice(p->down, p->dtype, e, down_per), p->dtype, cnt, I, H, false, true, 0.0f));
    run_groups(dev, &gg);
    if (gp->down) {
        FOR_EXPERTS(push(&gg, d, gp->down + (size_t)e * down_per, h + (size_t)off * I, MT_F32, dep + (size_t)off * H,
                         MT_F32, I, H, cnt, true, false, 1.0f));
        run_groups(dev, &gg);
    }
    if (gp->down_b) ops->expert_bias_bwd(s, gp->down_b, dep, a->offsets, E, H);
    kern_free(dev, h);
    h = NULL;
    /* d(gu) in place of the saved gu (not needed after this) */
    ops->swiglu_clamped_bwd(s, a->g, dh, a->g, p->alpha, p->limit, (size_t)m * I);
    kern_free(dev, dh);
    dh = NULL;
    if (gp->gate_up) {
        FOR_EXPERTS(push(&gg, d, gp->gate_up + (size_t)e * gu_per, (const char *)a->xp + (size_t)off * H * xp_elem,
                         xp_dt, (float *)a->g + (size_t)off * 2 * I, MT_F32, H, 2 * I, cnt, true, false, 1.0f));
        run_groups(dev, &gg);
    }
    if (gp->gate_up_b) ops->expert_bias_bwd(s, gp->gate_up_b, a->g, a->offsets, E, 2 * I);
    /* d(xp) (reusing dep) = d(gu) gate_up[e]^T */
    FOR_EXPERTS(push(&gg, d, dep + (size_t)off * H, (float *)a->g + (size_t)off * 2 * I, MT_F32,
                     slice(p->gate_up, p->dtype, e, gu_per), p->dtype, cnt, H, 2 * I, false, true, 0.0f));
    run_groups(dev, &gg);
#undef FOR_EXPERTS
    ops->moe_unpermute_sum(s, dxn, dep, NULL, a->inv, n, k, H, 0);
    kern_free(dev, dep);
    dep = NULL;

    ALLOC(dlogits, (size_t)n * E, float, "moe d(router logits)");
    ops->router_bwd(s, dlogits, dtopw, a->probs, a->idx, aux_dp, tok_w, n, E, k, d->router_mode);
    if (gp->router) {
        const kern_mm_t r = kern_mm_make(gp->router, dlogits, MT_F32, xn, MT_F32, E, H, n, true, false, 1.0f, 1.0f,
                                         MT_F32);
        ops->mm(s, &r);
    }
    if (gp->router_b) ops->bias_bwd(s, gp->router_b, dlogits, n, E);
    {
        const kern_mm_t r = kern_mm_make(dxn, dlogits, MT_F32, p->router, MT_F32, n, H, E, false, false, 1.0f, 1.0f,
                                         MT_F32);
        ops->mm(s, &r);
    }
    kern_free(dev, dlogits);
    moe_dfree(dev, dtopw);
    free(gg.mm);
    moe_layer_acts_release(dev, a);
    return MT_OK;
fail:
    moe_dfree(dev, dtopw);
    moe_dfree(dev, dep);
    moe_dfree(dev, h);
    moe_dfree(dev, dh);
    moe_dfree(dev, dlogits);
    free(gg.mm);
    moe_layer_acts_release(dev, a);
    return err ? err->code : MT_ERR_BUDGET;
}
