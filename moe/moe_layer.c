/* Sparse MoE block forward/backward (see moe_layer.h).
 *
 * Data flow of the forward pass, n tokens, m = n*k permuted rows:
 *   logits = xn router^T -> router -> (topw, idx) -> plan (counts, perm)
 *   xp = gather(xn) -> per expert: g = xp gate^T, u = xp up^T,
 *   ep = (silu(g) * u) down^T  -> y = sum_k topw * ep   [+ shared]
 * The counts go to the host once per layer (one small D2H copy) because
 * they size the grouped products; everything else stays on the device.
 * h = silu(g) * u is recomputed in backward instead of being saved: it is
 * as large as g and costs one element-wise pass.  In a bf16 run g, u, h
 * and ep are bf16 (the products write them so, as autocast's linear layers do),
 * and so are their gradients, xp's as two parts this file sums per token in
 * fp32 (moe_experts.c says what stays fp32 and why).
 *
 * This file is the block's flow: router, combine, shared expert.  The
 * routing plan, the gather and the routed experts' products are
 * moe_experts.c's, and under expert parallelism the routed part is
 * expert_parallel.c's, which calls moe_experts.c in turn; neither calls
 * back here. */
#include "moe/moe_layer.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"
#include "moe/moe_experts.h"

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
        ALLOC_ACT_DESCRIBED(a->g, MOE_ACT_G, "moe expert gate activations");
        ALLOC_ACT_DESCRIBED(a->u, MOE_ACT_U, "moe expert up activations");
        ALLOC_ACT_DESCRIBED(a->ep, MOE_ACT_EP, "moe expert outputs");
        TRY(moe_experts_forward(dev, d, p, a->counts_host, a->offsets_host, m, a->xp, a->g, a->u, a->ep, err));
    }
    /* the combine: bf16 outputs widened exactly, the sum in fp32 */
    if (d->acts[MOE_ACT_EP].dtype == MT_BF16)
        ops->moe_unpermute_sum_bf16(s, y, a->ep, a->topw, a->inv, n, k, H, 0);
    else
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

mt_status_t moe_layer_backward(kern_device_t *dev, const moe_layer_dims_t *d,
                               const moe_layer_params_t *p, const moe_layer_params_t *gp,
                               const float *xn, const float *dy, const float *aux_dp,
                               const float *tok_w, moe_layer_acts_t *a, float *dxn,
                               mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, k = d->k, n = a->n, m = a->m;
    float *dtopw = NULL, *dlogits = NULL;
    void *dep = NULL, *dxu = NULL;
    float *dso = NULL, *dsgl = NULL, *sh = NULL, *dsh = NULL;
    /* bf16 run: the experts' gradients are bf16 as autocast keeps them
     * (moe_experts.c), xp's as two bf16 parts summed here in fp32 */
    const bool bf16 = d->acts[MOE_ACT_EP].dtype == MT_BF16;

    ALLOC(dtopw, (size_t)n * k, float, "moe d(top-k weights)");
    dep = kern_alloc(dev, (size_t)m * H * (bf16 ? sizeof(uint16_t) : sizeof(float)), "moe d(expert outputs)", err);
    if (!dep) goto fail;
    if (bf16) {
        ops->moe_combine_bwd_bf16(s, dep, dtopw, dy, a->ep, a->topw, a->inv, n, k, H);
        ALLOC(dxu, (size_t)m * H, uint16_t, "moe d(expert inputs), up products' part");
    } else {
        ops->moe_combine_bwd(s, dep, dtopw, dy, a->ep, a->topw, a->inv, n, k, H);
    }
    if (p->ep) TRY(moe_ep_backward(dev, d, p, gp, a, dep, dxu, err));
    else TRY(moe_experts_backward(dev, d, p, gp, a->counts_host, a->offsets_host, m, a->xp, a->g, a->u, dep, dxu,
                                  err));
    /* the tokens' rows summed in fp32 (as index_add_ into fp32 hidden
     * states): in a bf16 run every gate part, then every up part */
    if (bf16) {
        ops->moe_unpermute_sum_bf16(s, dxn, dep, NULL, a->inv, n, k, H, 0);
        ops->moe_unpermute_sum_bf16(s, dxn, dxu, NULL, a->inv, n, k, H, 1);
    } else {
        ops->moe_unpermute_sum(s, dxn, dep, NULL, a->inv, n, k, H, 0);
    }
    kern_free(dev, dep);
    dep = NULL;
    moe_dfree(dev, dxu);
    dxu = NULL;

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
    moe_dfree(dev, dxu);
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
