/* The routed experts' part of a sparse MoE block (see moe_experts.h): the
 * routing plan, the gathered rows and the experts' grouped products,
 * forward and backward.  Its own file because two callers share it, the
 * single-device block (moe_layer.c) and the owner side of expert
 * parallelism (expert_parallel.c): both call down into this file, which
 * calls neither, so moe_layer.c -> expert_parallel.c -> moe_experts.c is
 * one way and both form exactly the same products.
 *
 * Precision in a bf16 run (d->compute BF16 and the description's G/U
 * dtype BF16), as PyTorch autocast keeps a linear layer's output:
 *  - the gate and up products write g and u in bf16 (fp32 accumulation,
 *    rounded once; beta 0, so cuBLAS can run them as one grouped call),
 *    and h = silu(g) * u, read only by the down product, is bf16 too
 *    (computed in fp32 from the widened g and u, rounded once);
 *  - LoRA on gate/up: the product writes an fp32 scratch, the adapter's
 *    term is added in fp32 and the sum rounded to bf16 once, the same on
 *    every backend (rounding the product first and again after the add
 *    would round twice); those products stay out of the grouped call;
 *  - the experts' outputs ep are bf16 too (the down product writes them,
 *    LoRA on down as above), read by the combine (moe_layer.c), which
 *    widens them and sums in fp32;
 *  - backward, the activation gradients are bf16 as autocast gives a
 *    tensor's gradient its dtype: dep (the combine's backward rounds it),
 *    dh = dep down (written bf16, beta 0), dg and du (the SwiGLU's
 *    backward from the bf16 dh, over g and u), and xp's gradient as two
 *    bf16 parts, dg gate and du up, each written with beta 0 and summed
 *    per token in fp32 by the caller.  So every data-gradient product is
 *    of the kind cuBLAS groups (gate's and up's parts in one call); the
 *    fused gate_up of transformers 5 rounds their sum once instead, a
 *    difference of one rounding that buys the grouped call and saves an
 *    fp32 (rows, H) buffer.  LoRA's backward terms go through fp32 scratch
 *    as in the forward;
 *  - weight gradients as autocast forms a bf16 weight's: each expert's
 *    dW = dy^T x is written bf16 (fp32 accumulation, rounded once, beta 0:
 *    the kind cuBLAS groups) into a scratch and then added into its fp32
 *    accumulator (weight_grads), so one grouped call takes every expert's
 *    product where cuBLAS refuses bf16 inputs with an fp32 output, and
 *    an fp32 run's products add into the accumulators directly (beta 1). */
#include "moe/moe_experts.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"

/* One grouped product over the experts that have tokens: operands are
 * collected with their dtypes, the flags given when it runs. */
typedef struct {
    void *C;
    const void *A, *B;
    mt_dtype_t c_dt, a_dt, b_dt;
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

static void groups_push(groups_t *g, void *C, mt_dtype_t c_dt, const void *A, mt_dtype_t a_dt, const void *B,
                        mt_dtype_t b_dt, int M, int N, int K) {
    g->d[g->count++] = (group_operands_t){C, A, B, c_dt, a_dt, b_dt, M, N, K};
}

static void groups_run(kern_device_t *dev, const moe_layer_dims_t *d, groups_t *g, bool ta, bool tb, float alpha,
                       float beta) {
    for (int i = 0; i < g->count; i++) {
        const group_operands_t *o = &g->d[i];
        g->mm[i] = kern_mm_make(o->C, o->A, o->a_dt, o->B, o->b_dt, o->M, o->N, o->K, ta, tb, alpha, beta,
                                d->compute);
        g->mm[i].C.dtype = o->c_dt; /* a bf16 C: rounded once from the fp32 accumulator */
    }
    dev->ops->mm_grouped(kern_stream(dev, KERN_STREAM_COMPUTE), g->mm, g->count);
}

/* The weight-gradient products pushed on gg (C (M, N), an expert's fp32
 * accumulator, += A^T B with A (K, M) and B (K, N) its rows): in an
 * fp32 run straight into the accumulators; in a bf16 run each written bf16
 * into a scratch and then added into its accumulator, the experts taken in
 * chunks whose scratch stays under WGRAD_CHUNK_BYTES (one expert at
 * least).  Empties gg. */
#define WGRAD_CHUNK_BYTES ((size_t)512 << 20)
#define WGRAD_ALIGN ((size_t)256)

static mt_status_t weight_grads(kern_device_t *dev, const moe_layer_dims_t *d, groups_t *gg, bool bf16,
                                mt_error_t *err) {
    const int n = gg->count;
    gg->count = 0;
    if (n == 0) return MT_OK;
    if (!bf16) {
        gg->count = n;
        groups_run(dev, d, gg, true, false, 1.0f, 1.0f);
        gg->count = 0;
        return MT_OK;
    }
    size_t biggest = 0, total = 0;
    for (int i = 0; i < n; i++) {
        const size_t b = ((size_t)gg->d[i].M * gg->d[i].N * 2 + WGRAD_ALIGN - 1) & ~(WGRAD_ALIGN - 1);
        if (b > biggest) biggest = b;
        total += b;
    }
    size_t cap = biggest > WGRAD_CHUNK_BYTES ? biggest : WGRAD_CHUNK_BYTES;
    if (cap > total) cap = total;
    groups_t chunk = groups_new(n);
    float **dst = malloc((size_t)n * sizeof *dst);
    const uint16_t **src = malloc((size_t)n * sizeof *src);
    size_t *numel = malloc((size_t)n * sizeof *numel);
    MT_CHECK(dst && src && numel, "out of host memory for %d weight-gradient descriptors", n);
    char *scratch = kern_alloc(dev, cap, "moe expert weight gradients (bf16)", err);
    mt_status_t st = scratch ? MT_OK : err->code;
    for (int at = 0; at < n && st == MT_OK;) {
        size_t used = 0;
        chunk.count = 0;
        for (; at < n; at++) {
            const group_operands_t *o = &gg->d[at];
            const size_t numel_at = (size_t)o->M * o->N;
            const size_t bytes = (numel_at * 2 + WGRAD_ALIGN - 1) & ~(WGRAD_ALIGN - 1);
            if (used + bytes > cap) break;
            const int c = chunk.count;
            dst[c] = o->C, src[c] = (const uint16_t *)(scratch + used), numel[c] = numel_at;
            groups_push(&chunk, scratch + used, MT_BF16, o->A, o->a_dt, o->B, o->b_dt, o->M, o->N, o->K);
            used += bytes;
        }
        groups_run(dev, d, &chunk, true, false, 1.0f, 0.0f);
        dev->ops->add_bf16_many(kern_stream(dev, KERN_STREAM_COMPUTE), dst, src, numel, chunk.count);
    }
    moe_dfree(dev, scratch);
    free(dst);
    free(src);
    free(numel);
    groups_free(&chunk);
    return st;
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

/* One of the experts' products: y = x w^T for every expert with rows, x
 * (rows, K) stored as x_dt, y (rows, N) as y_dt, plus LoRA.  A bf16 y with
 * an adapter goes through the fp32 scratch acc (rows, N): product and
 * adapter summed in fp32, rounded once. */
typedef struct {
    const void *x;
    mt_dtype_t x_dt;
    int K;
    void *y;
    mt_dtype_t y_dt;
    int N;
} expert_io_t;

static mt_status_t expert_products(kern_device_t *dev, const moe_layer_dims_t *d, groups_t *gg, void *const *w,
                                   mt_dtype_t w_dt, const kern_lora_t *lora, const int32_t *counts,
                                   const int32_t *offsets, int rows, const expert_io_t *io, float *acc,
                                   mt_error_t *err) {
    const int E = d->E, K = io->K, N = io->N;
    const size_t x_elem = mt_dtype_size(io->x_dt);
    const bool via_acc = lora && io->y_dt != MT_F32;
    void *out = via_acc ? acc : io->y;
    const mt_dtype_t out_dt = via_acc ? MT_F32 : io->y_dt;
    const size_t out_elem = mt_dtype_size(out_dt);
    gg->count = 0;
    for (int e = 0; e < E; e++) {
        const int off = offsets[e], cnt = counts[e];
        if (cnt)
            groups_push(gg, (char *)out + (size_t)off * N * out_elem, out_dt,
                        (const char *)io->x + (size_t)off * K * x_elem, io->x_dt, w[e], w_dt, cnt, N, K);
    }
    groups_run(dev, d, gg, false, true, 1.0f, 0.0f);
    for (int e = 0; lora && e < E; e++) {
        mt_status_t st = kern_lora_fwd(dev, d->compute, &lora[e], (float *)out + (size_t)offsets[e] * N,
                                       (const char *)io->x + (size_t)offsets[e] * K * x_elem, io->x_dt, counts[e],
                                       K, N, err);
        if (st != MT_OK) return st;
    }
    if (via_acc) dev->ops->f32_to_bf16(kern_stream(dev, KERN_STREAM_COMPUTE), io->y, acc, (size_t)rows * N);
    return MT_OK;
}

/* g and u's dtype (h's too): bf16 only with bf16 compute, since the
 * backward stores dg/du in it on the strength of every reader rounding
 * them to the compute dtype. */
static mt_dtype_t gu_dtype(const moe_layer_dims_t *d) {
    const mt_dtype_t dt = d->acts[MOE_ACT_G].dtype;
    MT_CHECK(dt == d->acts[MOE_ACT_U].dtype, "moe experts: g described as %s but u as %s", mt_dtype_name(dt),
             mt_dtype_name(d->acts[MOE_ACT_U].dtype));
    MT_CHECK(dt == MT_F32 || (dt == MT_BF16 && d->compute == MT_BF16),
             "moe experts: g/u described as %s with %s compute (F32, or BF16 with BF16 compute)", mt_dtype_name(dt),
             mt_dtype_name(d->compute));
    return dt;
}

/* The experts' outputs' dtype: bf16 only with bf16 compute, as g's. */
static mt_dtype_t ep_dtype(const moe_layer_dims_t *d) {
    const mt_dtype_t dt = d->acts[MOE_ACT_EP].dtype;
    MT_CHECK(dt == MT_F32 || (dt == MT_BF16 && d->compute == MT_BF16),
             "moe experts: outputs described as %s with %s compute (F32, or BF16 with BF16 compute)",
             mt_dtype_name(dt), mt_dtype_name(d->compute));
    return dt;
}

mt_status_t moe_experts_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                const int32_t *counts, const int32_t *offsets, int rows, const void *xp,
                                void *g, void *u, void *ep, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int E = d->E, I = d->I, H = d->H;
    const mt_dtype_t dt = gu_dtype(d), xp_dt = d->acts[MOE_ACT_XP].dtype, ep_dt = ep_dtype(d);
    void *h = NULL;
    float *acc = NULL;
    groups_t gg = groups_new(2 * E);
    if (dt != MT_F32 && (p->lora_gate || p->lora_up))
        ALLOC(acc, (size_t)rows * I, float, "moe expert gate/up + LoRA (fp32)");

    /* g = xp gate^T and u = xp up^T for every expert with tokens: in one
     * grouped call when neither has an adapter (each call to cuBLAS's
     * grouped GEMM costs the host a fixed few hundred microseconds) */
    const expert_io_t gate_io = {xp, xp_dt, H, g, dt, I}, up_io = {xp, xp_dt, H, u, dt, I};
    if (!p->lora_gate && !p->lora_up) {
        gg.count = 0;
        const size_t x_elem = mt_dtype_size(xp_dt), y_elem = mt_dtype_size(dt);
        for (int m = 0; m < 2; m++)
            for (int e = 0; e < E; e++)
                if (counts[e])
                    groups_push(&gg, (char *)(m ? u : g) + (size_t)offsets[e] * I * y_elem, dt,
                                (const char *)xp + (size_t)offsets[e] * H * x_elem, xp_dt, (m ? p->up : p->gate)[e],
                                p->dtype, counts[e], I, H);
        groups_run(dev, d, &gg, false, true, 1.0f, 0.0f);
    } else {
        TRY(expert_products(dev, d, &gg, p->gate, p->dtype, p->lora_gate, counts, offsets, rows, &gate_io, acc,
                            err));
        TRY(expert_products(dev, d, &gg, p->up, p->dtype, p->lora_up, counts, offsets, rows, &up_io, acc, err));
    }
    moe_dfree(dev, acc);
    acc = NULL;
    h = kern_alloc(dev, (size_t)rows * I * mt_dtype_size(dt), "moe expert hidden", err);
    if (!h) goto fail;
    if (dt == MT_F32) ops->swiglu_fwd(s, h, g, u, (size_t)rows * I);
    else ops->swiglu_fwd_bf16(s, h, g, u, (size_t)rows * I);
    /* ep = h down^T */
    if (ep_dt != MT_F32 && p->lora_down) ALLOC(acc, (size_t)rows * H, float, "moe expert outputs + LoRA (fp32)");
    const expert_io_t down_io = {h, dt, I, ep, ep_dt, H};
    TRY(expert_products(dev, d, &gg, p->down, p->dtype, p->lora_down, counts, offsets, rows, &down_io, acc, err));
    moe_dfree(dev, acc);
    kern_free(dev, h);
    groups_free(&gg);
    return MT_OK;
fail:
    moe_dfree(dev, h);
    moe_dfree(dev, acc);
    groups_free(&gg);
    return err->code;
}

/* The dtype of the backward's activation gradients (dep, dh, dg/du and
 * the experts' input-gradient products): bf16 exactly when g, u and ep are
 * (both come from the description's compute-class activations), as
 * autocast gives a tensor's gradient the tensor's dtype. */
static mt_dtype_t grad_dtype(const moe_layer_dims_t *d) {
    const mt_dtype_t dt = gu_dtype(d);
    MT_CHECK(ep_dtype(d) == dt, "moe experts: outputs described as %s but g/u as %s (the backward wants one dtype)",
             mt_dtype_name(ep_dtype(d)), mt_dtype_name(dt));
    return dt;
}

#define AT(ptr, row, width, esize) ((char *)(ptr) + (size_t)(row) * (width) * (esize))

/* The down product's backward: dh (rows, I) = dep down (+ LoRA's term,
 * summed in the fp32 scratch and rounded once when dh is bf16), and
 * d(down) += dep^T h with h recomputed from g and u; dep, h and dh in
 * dtype dt.  The dh products write dt with beta 0, so in a bf16 run they
 * are of the kind cuBLAS groups. */
static mt_status_t down_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                 const moe_layer_params_t *gp, groups_t *gg, const int32_t *counts,
                                 const int32_t *offsets, int rows, const void *g, const void *u, const void *dep,
                                 void *dh, mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, I = d->I;
    const mt_dtype_t dt = grad_dtype(d);
    const size_t elem = mt_dtype_size(dt);
    void *h = NULL;
    float *acc = NULL;
    h = kern_alloc(dev, (size_t)rows * I * elem, "moe expert hidden (recomputed)", err);
    if (!h) goto fail;
    if (dt == MT_F32) ops->swiglu_fwd(s, h, g, u, (size_t)rows * I);
    else ops->swiglu_fwd_bf16(s, h, g, u, (size_t)rows * I);
    if (dt != MT_F32 && p->lora_down) ALLOC(acc, (size_t)rows * I, float, "moe d(expert hidden) + LoRA (fp32)");
    void *out = acc ? (void *)acc : dh;
    const mt_dtype_t out_dt = acc ? MT_F32 : dt;
    gg->count = 0;
    for (int e = 0; e < E; e++)
        if (counts[e])
            groups_push(gg, AT(out, offsets[e], I, mt_dtype_size(out_dt)), out_dt, AT(dep, offsets[e], H, elem), dt,
                        p->down[e], p->dtype, counts[e], I, H);
    groups_run(dev, d, gg, false, false, 1.0f, 0.0f);
    gg->count = 0;
    for (int e = 0; e < E; e++)
        if (counts[e] && gp->down[e])
            groups_push(gg, gp->down[e], MT_F32, AT(dep, offsets[e], H, elem), dt, AT(h, offsets[e], I, elem), dt,
                        H, I, counts[e]);
    TRY(weight_grads(dev, d, gg, dt != MT_F32, err));
    for (int e = 0; p->lora_down && e < E; e++) {
        const int off = offsets[e];
        TRY(kern_lora_bwd_typed(dev, d->compute, &p->lora_down[e], AT(dep, off, H, elem), dt, AT(h, off, I, elem),
                                dt, (float *)out + (size_t)off * I, counts[e], I, H, err));
    }
    if (acc) ops->f32_to_bf16(s, dh, acc, (size_t)rows * I);
    moe_dfree(dev, acc);
    kern_free(dev, h);
    return MT_OK;
fail:
    moe_dfree(dev, acc);
    moe_dfree(dev, h);
    return err->code;
}

/* xp's gradient in a bf16 run, as two parts each written bf16 with beta 0
 * (the kind cuBLAS groups, all experts' gate and up products in one call):
 * dxg = dg gate into dxg, dxu = du up into dxu, each rounded once from its
 * fp32 accumulator, their sum left to the caller's fp32 scatter-add.  With
 * LoRA on the module its products go through the fp32 scratch, the
 * adapter's term added there (and its factors' gradients formed) before
 * the one rounding. */
static mt_status_t input_grads_bf16(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                    groups_t *gg, const int32_t *counts, const int32_t *offsets, int rows,
                                    const void *xp, const void *dg, const void *du, void *dxg, void *dxu,
                                    mt_error_t *err) {
    const int H = d->H, E = d->E, I = d->I;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt);
    void *const *w[2] = {p->gate, p->up};
    const kern_lora_t *lora[2] = {p->lora_gate, p->lora_up};
    const void *dy[2] = {dg, du};
    void *dx[2] = {dxg, dxu};
    float *acc = NULL;
    gg->count = 0;
    for (int m = 0; m < 2; m++)
        for (int e = 0; !lora[m] && e < E; e++)
            if (counts[e])
                groups_push(gg, AT(dx[m], offsets[e], H, 2), MT_BF16, AT(dy[m], offsets[e], I, 2), MT_BF16, w[m][e],
                            p->dtype, counts[e], H, I);
    if (gg->count) groups_run(dev, d, gg, false, false, 1.0f, 0.0f);
    for (int m = 0; m < 2; m++) {
        if (!lora[m]) continue;
        if (!acc) ALLOC(acc, (size_t)rows * H, float, "moe d(expert inputs) + LoRA (fp32)");
        gg->count = 0;
        for (int e = 0; e < E; e++)
            if (counts[e])
                groups_push(gg, acc + (size_t)offsets[e] * H, MT_F32, AT(dy[m], offsets[e], I, 2), MT_BF16, w[m][e],
                            p->dtype, counts[e], H, I);
        groups_run(dev, d, gg, false, false, 1.0f, 0.0f);
        for (int e = 0; e < E; e++) {
            const int off = offsets[e];
            TRY(kern_lora_bwd_typed(dev, d->compute, &lora[m][e], AT(dy[m], off, I, 2), MT_BF16,
                                    AT(xp, off, H, xp_elem), xp_dt, acc + (size_t)off * H, counts[e], H, I, err));
        }
        dev->ops->f32_to_bf16(kern_stream(dev, KERN_STREAM_COMPUTE), dx[m], acc, (size_t)rows * H);
    }
    moe_dfree(dev, acc);
    return MT_OK;
fail:
    moe_dfree(dev, acc);
    return err->code;
}

mt_status_t moe_experts_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                 const moe_layer_params_t *gp, const int32_t *counts, const int32_t *offsets,
                                 int rows, const void *xp, void *g, void *u, void *dep, void *dxu,
                                 mt_error_t *err) {
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int H = d->H, E = d->E, I = d->I;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype, dt = grad_dtype(d);
    const size_t xp_elem = mt_dtype_size(xp_dt), elem = mt_dtype_size(dt);
    void *dh = NULL;
    groups_t gg = groups_new(2 * E);
    MT_CHECK(dt == MT_F32 || dxu, "moe experts: a bf16 backward needs the up products' input-gradient buffer");
    dh = kern_alloc(dev, (size_t)rows * I * elem, "moe d(expert hidden)", err);
    if (!dh) goto fail;
    TRY(down_backward(dev, d, p, gp, &gg, counts, offsets, rows, g, u, dep, dh, err));
    /* dg, du in place of g, u (saved activations are not needed after this) */
    if (dt == MT_F32) ops->swiglu_bwd(s, g, u, dh, g, u, (size_t)rows * I);
    else ops->swiglu_bwd_bf16(s, g, u, dh, g, u, (size_t)rows * I);
    kern_free(dev, dh);
    dh = NULL;

#define FOR_EXPERTS(body)                                                   \
    do {                                                                    \
        gg.count = 0;                                                       \
        for (int e = 0; e < E; e++) {                                       \
            const int off = offsets[e], cnt = counts[e];                    \
            if (cnt) { body; }                                              \
        }                                                                   \
    } while (0)

    /* d(gate) += dg^T xp and d(up) += du^T xp, all experts' in one go */
    FOR_EXPERTS(if (gp->gate[e]) groups_push(&gg, gp->gate[e], MT_F32, AT(g, off, I, elem), dt,
                                             AT(xp, off, H, xp_elem), xp_dt, I, H, cnt));
    for (int e = 0; e < E; e++)
        if (counts[e] && gp->up[e])
            groups_push(&gg, gp->up[e], MT_F32, AT(u, offsets[e], I, elem), dt, AT(xp, offsets[e], H, xp_elem), xp_dt,
                        I, H, counts[e]);
    TRY(weight_grads(dev, d, &gg, dt != MT_F32, err));
    if (dt != MT_F32) {
        /* dep is read no more: it takes the gate products' part */
        TRY(input_grads_bf16(dev, d, p, &gg, counts, offsets, rows, xp, g, u, dep, dxu, err));
        groups_free(&gg);
        return MT_OK;
    }
    /* fp32: dxp (reusing dep) = dg gate + du up */
    float *dxp = dep;
    FOR_EXPERTS(groups_push(&gg, dxp + (size_t)off * H, MT_F32, AT(g, off, I, elem), dt, p->gate[e], p->dtype, cnt,
                            H, I));
    groups_run(dev, d, &gg, false, false, 1.0f, 0.0f);
    FOR_EXPERTS(groups_push(&gg, dxp + (size_t)off * H, MT_F32, AT(u, off, I, elem), dt, p->up[e], p->dtype, cnt,
                            H, I));
    groups_run(dev, d, &gg, false, false, 1.0f, 1.0f);
    for (int e = 0; e < E; e++) {
        const size_t off = (size_t)offsets[e];
        if (p->lora_gate)
            TRY(kern_lora_bwd_typed(dev, d->compute, &p->lora_gate[e], AT(g, off, I, elem), dt,
                                    AT(xp, off, H, xp_elem), xp_dt, dxp + off * H, counts[e], H, I, err));
        if (p->lora_up)
            TRY(kern_lora_bwd_typed(dev, d->compute, &p->lora_up[e], AT(u, off, I, elem), dt,
                                    AT(xp, off, H, xp_elem), xp_dt, dxp + off * H, counts[e], H, I, err));
    }
#undef FOR_EXPERTS
    groups_free(&gg);
    return MT_OK;
fail:
    moe_dfree(dev, dh);
    groups_free(&gg);
    return err->code;
}
#undef AT
