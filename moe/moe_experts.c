/* The routed experts' part of a sparse MoE block (see moe_experts.h): the
 * routing plan, the gathered rows and the experts' grouped products,
 * forward and backward.  Its own file because two callers share it, the
 * single-device block (moe_layer.c) and the owner side of expert
 * parallelism (expert_parallel.c): both call down into this file, which
 * calls neither, so moe_layer.c -> expert_parallel.c -> moe_experts.c is
 * one way and both form exactly the same products. */
#include "moe/moe_experts.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"

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
