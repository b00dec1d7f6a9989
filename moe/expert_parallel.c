/* Expert parallelism for the sparse MoE block (see expert_parallel.h).
 *
 * Layouts.  A source device's gathered rows xp (m, H) are sorted by
 * expert, so the rows for owner q's experts [lo_q, hi_q) are the one slice
 * [offsets[lo_q], offsets[hi_q]).  The owner stacks what it receives by
 * source, rank 0 first; within a source's block the rows keep the source's
 * order (by expert, then by the source's permutation).  Every exchange
 * below is one kern_comm_alltoallv between those two layouts, one way or
 * the other, so the per-pair sizes come from two tables: the source's
 * offsets_host, and the owner's received counts (moe_ep_acts_t).
 *
 * Calls go one way: the block (moe_layer.c) calls in here, and this file
 * calls moe_experts.c for the gather and the owner's products, never back
 * into the block. */
#include "moe/expert_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "moe/moe_alloc.h"
#include "moe/moe_experts.h"
#include "moe/moe_layer.h"

void moe_ep_range(int E, int nranks, int rank, int *lo, int *hi) {
    *lo = (int)((int64_t)rank * E / nranks);
    *hi = (int)((int64_t)(rank + 1) * E / nranks);
}

/* What the owner keeps from forward for backward. */
struct moe_ep_acts {
    int nranks;
    int32_t *rcounts; /* (nranks, E) host: rows from each source per expert, 0 for others' experts */
    int32_t *roffs;   /* (nranks, E) host: the first row of each, within its source's block */
    int32_t *rbase;   /* (nranks + 1) host: the first row of each source's block; rbase[nranks] = R */
    int32_t *ran;     /* (E) host: rows each expert ran here, from every source (0: another rank's) */
    void *xp;         /* (R, H) received rows, in the described XP dtype */
    void *g, *u;      /* (R, I) gate and up projections of the received rows, in the described
                       * G/U dtype (moe_layer.h) */
};

void moe_ep_acts_free(kern_device_t *dev, struct moe_ep_acts *ea) {
    if (!ea) return;
    moe_dfree(dev, ea->xp);
    moe_dfree(dev, ea->g);
    moe_dfree(dev, ea->u);
    free(ea->rcounts);
    free(ea->roffs);
    free(ea->rbase);
    free(ea->ran);
    free(ea);
}

/* Device memory for `bytes` that may be 0 (a rank can receive no rows). */
static void *ep_alloc(kern_device_t *dev, size_t bytes, const char *tag, mt_error_t *err) {
    return kern_alloc(dev, bytes ? bytes : 16, tag, err);
}

/* The element counts and offsets of one exchange of rows of `width`
 * elements: to_owners true sends this device's rows to their experts'
 * owners (forward's inputs, backward's output gradients), false the owner's
 * results back to their sources. */
typedef struct {
    size_t *sc, *so, *rc, *ro; /* 4 arrays of nranks */
} xfer_t;

static void xfer_fill(xfer_t *x, const struct moe_ep_acts *ea, const moe_layer_acts_t *a, int E, size_t width,
                      bool to_owners) {
    const int N = ea->nranks;
    for (int q = 0; q < N; q++) {
        int lo, hi;
        moe_ep_range(E, N, q, &lo, &hi);
        const size_t mine_off = (size_t)a->offsets_host[lo] * width; /* my rows for q's experts */
        const size_t mine_cnt = (size_t)(a->offsets_host[hi] - a->offsets_host[lo]) * width;
        const size_t theirs_off = (size_t)ea->rbase[q] * width; /* q's rows for my experts */
        const size_t theirs_cnt = (size_t)(ea->rbase[q + 1] - ea->rbase[q]) * width;
        x->sc[q] = to_owners ? mine_cnt : theirs_cnt;
        x->so[q] = to_owners ? mine_off : theirs_off;
        x->rc[q] = to_owners ? theirs_cnt : mine_cnt;
        x->ro[q] = to_owners ? theirs_off : mine_off;
    }
}

mt_status_t moe_ep_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                           const float *xn, moe_layer_acts_t *a, mt_error_t *err) {
    const moe_ep_t *ep = p->ep;
    const int N = kern_comm_size(ep->comm), rank = ep->rank, E = d->E, H = d->H, I = d->I, n = a->n;
    const mt_dtype_t xp_dt = d->acts[MOE_ACT_XP].dtype;
    const size_t xp_elem = mt_dtype_size(xp_dt), gu_elem = mt_dtype_size(d->acts[MOE_ACT_G].dtype);
    const mt_dtype_t ep_dt = d->acts[MOE_ACT_EP].dtype; /* the outputs cross as the experts wrote them */
    const size_t ep_elem = mt_dtype_size(ep_dt);
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    int32_t *cnt_dev = NULL, *cnt_host = NULL, *total = NULL;
    void *ep_r = NULL;
    size_t *arrays = NULL;
    if (rank < 0 || rank >= N)
        return mt_error_set(err, MT_ERR_CONFIG, "moe expert parallel: rank %d of a communicator of %d", rank, N);
    if (p->lora_gate || p->lora_up || p->lora_down)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "moe expert parallel: LoRA on routed experts is not supported yet (use data "
                            "parallelism for this layer)");
    int lo, hi;
    moe_ep_range(E, N, rank, &lo, &hi);
    const int own = hi - lo;

    struct moe_ep_acts *ea = calloc(1, sizeof *ea);
    MT_CHECK_ALLOC(ea, "expert-parallel state");
    a->ep_acts = ea; /* released with a, whatever happens below */
    ea->nranks = N;
    ea->rcounts = calloc((size_t)N * E, sizeof *ea->rcounts);
    ea->roffs = calloc((size_t)N * E, sizeof *ea->roffs);
    ea->rbase = calloc((size_t)N + 1, sizeof *ea->rbase);
    total = calloc((size_t)E, sizeof *total);
    arrays = calloc(4 * (size_t)N, sizeof *arrays);
    MT_CHECK(ea->rcounts && ea->roffs && ea->rbase && total && arrays,
             "out of host memory for the expert-parallel tables of %d ranks", N);
    xfer_t x = {arrays, arrays + N, arrays + 2 * N, arrays + 3 * N};

    /* 1. counts: to each owner the tokens per expert it owns, from the
     * device plan (a->counts), so every rank can size what it receives */
    for (int q = 0; q < N; q++) {
        int qlo, qhi;
        moe_ep_range(E, N, q, &qlo, &qhi);
        x.sc[q] = (size_t)(qhi - qlo);
        x.so[q] = (size_t)qlo;
        x.rc[q] = (size_t)own;
        x.ro[q] = (size_t)q * own;
    }
    cnt_dev = ep_alloc(dev, (size_t)N * own * sizeof(int32_t), "moe expert-parallel counts", err);
    if (!cnt_dev) goto fail;
    TRY(kern_comm_alltoallv(ep->comm, rank, a->counts, x.sc, x.so, cnt_dev, x.rc, x.ro, MT_I32, err));
    /* the sizes of every exchange below live on the host (as the
     * single-device block's counts do: they size the grouped products) */
    cnt_host = malloc(((size_t)N * own + 1) * sizeof *cnt_host);
    MT_CHECK_ALLOC(cnt_host, "expert-parallel counts");
    kern_memcpy_d2h(dev, s, cnt_host, cnt_dev, (size_t)N * own * sizeof(int32_t));
    kern_stream_sync(dev, s);
    for (int q = 0; q < N; q++) {
        int32_t row = 0;
        for (int e = lo; e < hi; e++) {
            const int32_t c = cnt_host[(size_t)q * own + (e - lo)];
            MT_CHECK(c >= 0, "moe expert parallel: rank %d sent %d rows for expert %d", q, c, e);
            ea->rcounts[(size_t)q * E + e] = c;
            ea->roffs[(size_t)q * E + e] = row;
            row += c;
        }
        ea->rbase[q + 1] = ea->rbase[q] + row;
    }
    free(cnt_host);
    cnt_host = NULL;
    kern_free(dev, cnt_dev);
    cnt_dev = NULL;
    const int R = ea->rbase[N];

    /* 2. this device's rows to their owners */
    TRY(moe_gather_rows(dev, d, xn, a, err));
    ea->xp = ep_alloc(dev, (size_t)R * H * xp_elem, "moe expert-parallel received tokens", err);
    if (!ea->xp) goto fail;
    xfer_fill(&x, ea, a, E, (size_t)H, true);
    TRY(kern_comm_alltoallv(ep->comm, rank, a->xp, x.sc, x.so, ea->xp, x.rc, x.ro, xp_dt, err));
    /* the owners hold what backward needs of them */
    kern_free(dev, a->xp);
    a->xp = NULL;

    /* 3. this rank's experts with rows from any device: streamed weights come now */
    ea->ran = total; /* kept: moe_layer_expert_rows */
    for (int e = 0; e < E; e++) total[e] = 0;
    for (int q = 0; q < N; q++)
        for (int e = lo; e < hi; e++) total[e] += ea->rcounts[(size_t)q * E + e];
    if (p->fetch_experts && p->fetch_experts(p->fetch_ctx, total, p->gate, p->up, p->down, err) != MT_OK) goto fail;

    /* 4. the owner's products, one source at a time in rank order */
    ea->g = ep_alloc(dev, (size_t)R * I * gu_elem, "moe expert-parallel gate activations", err);
    if (!ea->g) goto fail;
    ea->u = ep_alloc(dev, (size_t)R * I * gu_elem, "moe expert-parallel up activations", err);
    if (!ea->u) goto fail;
    ep_r = ep_alloc(dev, (size_t)R * H * ep_elem, "moe expert-parallel outputs", err);
    if (!ep_r) goto fail;
    for (int q = 0; q < N; q++) {
        const int base = ea->rbase[q], rows = ea->rbase[q + 1] - base;
        if (rows)
            TRY(moe_experts_forward(dev, d, p, ea->rcounts + (size_t)q * E, ea->roffs + (size_t)q * E, rows,
                                    (const char *)ea->xp + (size_t)base * H * xp_elem,
                                    (char *)ea->g + (size_t)base * I * gu_elem,
                                    (char *)ea->u + (size_t)base * I * gu_elem,
                                    (char *)ep_r + (size_t)base * H * ep_elem, err));
    }

    /* 5. the outputs back to their sources, for the combine there */
    ALLOC_ACT_DESCRIBED(a->ep, MOE_ACT_EP, "moe expert outputs");
    xfer_fill(&x, ea, a, E, (size_t)H, false);
    TRY(kern_comm_alltoallv(ep->comm, rank, ep_r, x.sc, x.so, a->ep, x.rc, x.ro, ep_dt, err));
    kern_free(dev, ep_r);
    free(arrays);
    return MT_OK;
fail:
    moe_dfree(dev, cnt_dev);
    moe_dfree(dev, ep_r);
    free(cnt_host);
    if (ea->ran != total) free(total);
    free(arrays);
    return err->code;
}

const int32_t *moe_ep_expert_rows(const struct moe_ep_acts *ea) { return ea->ran; }

/* Source q's weight gradients for the experts an earlier source already
 * wrote: formed in zeroed scratch and then added, as one device forms a
 * later micro-batch's gradient apart and folds it in (engine/exec/exec.c).  A
 * product accumulating into a non-zero target (beta 1) rounds otherwise
 * once its inner dimension is cut into blocks.  *gq points the written
 * experts at the scratch (scratch[e] NULL for the others). */
static mt_status_t scratch_grads(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *gp,
                                 const int32_t *counts, const bool *written, moe_layer_params_t *gq, float **scratch,
                                 mt_error_t *err) {
    const size_t each = (size_t)d->I * d->H;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    for (int e = 0; e < d->E; e++) {
        if (!counts[e] || !written[e]) continue;
        scratch[e] = kern_alloc(dev, 3 * each * sizeof(float), "moe expert-parallel gradients of a later source",
                                err);
        if (!scratch[e]) return err->code;
        kern_memset(dev, s, scratch[e], 0, 3 * each * sizeof(float));
        if (gp->gate[e]) gq->gate[e] = scratch[e];
        if (gp->up[e]) gq->up[e] = scratch[e] + each;
        if (gp->down[e]) gq->down[e] = scratch[e] + 2 * each;
    }
    return MT_OK;
}

/* target += scratch for every expert scratch_grads redirected, then frees it. */
static void fold_scratch(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *gp, float **scratch) {
    const size_t each = (size_t)d->I * d->H;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    for (int e = 0; e < d->E; e++) {
        if (!scratch[e]) continue;
        float *dst[3] = {gp->gate[e], gp->up[e], gp->down[e]};
        for (int k = 0; k < 3; k++)
            if (dst[k]) dev->ops->add(s, dst[k], dst[k], scratch[e] + k * each, each);
        kern_free(dev, scratch[e]);
        scratch[e] = NULL;
    }
}

mt_status_t moe_ep_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                            const moe_layer_params_t *gp, moe_layer_acts_t *a, void *dep, void *dxu,
                            mt_error_t *err) {
    const moe_ep_t *ep = p->ep;
    struct moe_ep_acts *ea = a->ep_acts;
    MT_CHECK(ea, "moe expert parallel: backward without an expert-parallel forward");
    const int N = ea->nranks, E = d->E, H = d->H, I = d->I;
    const size_t xp_elem = mt_dtype_size(d->acts[MOE_ACT_XP].dtype);
    const size_t gu_elem = mt_dtype_size(d->acts[MOE_ACT_G].dtype);
    /* the gradients cross in the outputs' dtype, as the experts' backward
     * reads and writes them (bf16 in a bf16 run, in two parts) */
    const mt_dtype_t g_dt = d->acts[MOE_ACT_EP].dtype;
    const size_t g_elem = mt_dtype_size(g_dt);
    void *dep_r = NULL, *dxu_r = NULL;
    size_t *arrays = calloc(4 * (size_t)N, sizeof *arrays);
    MT_CHECK_ALLOC(arrays, "expert-parallel transfer sizes");
    xfer_t x = {arrays, arrays + N, arrays + 2 * N, arrays + 3 * N};
    const int R = ea->rbase[N];
    bool *written = calloc((size_t)E, sizeof *written);
    float **scratch = calloc((size_t)E, sizeof *scratch);
    MT_CHECK(written && scratch, "out of memory for expert-parallel gradient scratch");

    /* the output gradients to the experts' owners */
    dep_r = ep_alloc(dev, (size_t)R * H * g_elem, "moe expert-parallel d(outputs)", err);
    if (!dep_r) goto fail;
    if (dxu) {
        dxu_r = ep_alloc(dev, (size_t)R * H * g_elem, "moe expert-parallel d(inputs), up products' part", err);
        if (!dxu_r) goto fail;
    }
    xfer_fill(&x, ea, a, E, (size_t)H, true);
    TRY(kern_comm_alltoallv(ep->comm, ep->rank, dep, x.sc, x.so, dep_r, x.rc, x.ro, g_dt, err));
    /* per source in rank order: the weight gradients accumulate in the
     * order the sources' micro-batches would on one device, each later
     * source's formed apart and added (scratch_grads) */
    for (int q = 0; q < N; q++) {
        const int base = ea->rbase[q], rows = ea->rbase[q + 1] - base;
        if (!rows) continue;
        const int32_t *cq = ea->rcounts + (size_t)q * E;
        moe_layer_params_t gq = *gp;
        void **ptrs = calloc((size_t)3 * E, sizeof *ptrs);
        MT_CHECK_ALLOC(ptrs, "expert-parallel gradient table");
        memcpy(ptrs, gp->gate, (size_t)E * sizeof *ptrs);
        memcpy(ptrs + E, gp->up, (size_t)E * sizeof *ptrs);
        memcpy(ptrs + 2 * E, gp->down, (size_t)E * sizeof *ptrs);
        gq.gate = ptrs, gq.up = ptrs + E, gq.down = ptrs + 2 * E;
        mt_status_t st = scratch_grads(dev, d, gp, cq, written, &gq, scratch, err);
        if (st == MT_OK)
            st = moe_experts_backward(dev, d, p, &gq, cq, ea->roffs + (size_t)q * E, rows,
                                      (const char *)ea->xp + (size_t)base * H * xp_elem,
                                      (char *)ea->g + (size_t)base * I * gu_elem,
                                      (char *)ea->u + (size_t)base * I * gu_elem,
                                      (char *)dep_r + (size_t)base * H * g_elem,
                                      dxu_r ? (char *)dxu_r + (size_t)base * H * g_elem : NULL, err);
        if (st == MT_OK) fold_scratch(dev, d, gp, scratch);
        for (int e = 0; e < E; e++) {
            if (scratch[e]) kern_free(dev, scratch[e]); /* after a failure */
            scratch[e] = NULL;
            written[e] |= cq[e] > 0;
        }
        free(ptrs);
        if (st != MT_OK) goto fail;
    }
    /* the input gradients back to the tokens' devices */
    xfer_fill(&x, ea, a, E, (size_t)H, false);
    TRY(kern_comm_alltoallv(ep->comm, ep->rank, dep_r, x.sc, x.so, dep, x.rc, x.ro, g_dt, err));
    if (dxu) TRY(kern_comm_alltoallv(ep->comm, ep->rank, dxu_r, x.sc, x.so, dxu, x.rc, x.ro, g_dt, err));
    kern_free(dev, dep_r);
    moe_dfree(dev, dxu_r);
    free(arrays);
    free(written);
    free(scratch);
    return MT_OK;
fail:
    moe_dfree(dev, dep_r);
    moe_dfree(dev, dxu_r);
    free(arrays);
    free(written);
    free(scratch);
    return err->code;
}
