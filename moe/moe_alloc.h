/* What the MoE blocks (moe_layer.c, moe_fused.c, expert_parallel.c)
 * share, and the allocation macros of all block code: the engine's layers
 * (engine/layers/ops_common.h) allocate with ALLOC and TRY too, so there is
 * one definition of each.  The macros name their tensor and, failing, go
 * to the function's `fail:` cleanup (dev, err and, for ALLOC_ACT, the
 * layer's dims `d` and token count `n` in scope). */
#ifndef MT_MOE_MOE_ALLOC_H
#define MT_MOE_MOE_ALLOC_H

#include "base/dtype.h"
#include "kernels/device.h"
#include "moe/moe_layer.h"

#define ALLOC(ptr, count, type, tag)                                                  \
    do {                                                                              \
        (ptr) = (type *)kern_alloc(dev, (size_t)(count) * sizeof(type), (tag), err); \
        if (!(ptr)) goto fail;                                                        \
    } while (0)

/* A saved activation, sized by the caller's description (moe_layer_dims_t.acts). */
#define ALLOC_ACT(ptr, id, type, tag)                                                                          \
    do {                                                                                                       \
        const moe_act_size_t *sz_ = &d->acts[(id)];                                                            \
        MT_CHECK(mt_dtype_size(sz_->dtype) == sizeof(type), "%s: described as %s elements", (tag),             \
                 mt_dtype_name(sz_->dtype));                                                                   \
        (ptr) = (type *)kern_alloc(dev, (size_t)(sz_->per_token * n + sz_->fixed) * mt_dtype_size(sz_->dtype), \
                                   (tag), err);                                                                \
        if (!(ptr)) goto fail;                                                                                 \
    } while (0)

/* A step that can fail (an allocation): on to the cleanup. */
#define TRY(call)                       \
    do {                                \
        if ((call) != MT_OK) goto fail; \
    } while (0)

static inline void moe_dfree(kern_device_t *dev, void *p) {
    if (p) kern_free(dev, p);
}

/* After the router chose a->idx: the tokens' permutation by expert
 * (counts, offsets, the permutation and its inverse, saved for backward)
 * and the counts and offsets on the host, which size the grouped products.
 * Failing (an allocation), the caller releases a. */
mt_status_t moe_plan_routes(kern_device_t *dev, const moe_layer_dims_t *d, int n, moe_layer_acts_t *a,
                            mt_error_t *err);

/* The gathered rows a->xp (a->m rows in the described XP dtype) of xn in
 * routing order; needs moe_plan_routes first. */
mt_status_t moe_gather_rows(kern_device_t *dev, const moe_layer_dims_t *d, const float *xn, moe_layer_acts_t *a,
                            mt_error_t *err);

/* The routed experts on `rows` gathered rows xp: expert e's counts[e] rows
 * start at row offsets[e] of xp, g, u (rows, I) and ep (rows, H), which
 * receive the gate and up projections and the experts' outputs.  One
 * product per expert with rows, as a grouped GEMM.  Shared by the
 * single-device block and the owner side of expert parallelism, so both
 * form exactly the same products. */
mt_status_t moe_experts_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                const int32_t *counts, const int32_t *offsets, int rows, const void *xp,
                                float *g, float *u, float *ep, mt_error_t *err);

/* Its backward: dep (rows, H), the outputs' gradient, is replaced by xp's;
 * g and u are overwritten; weight gradients accumulate (+=) into gp's
 * experts (a NULL target is skipped). */
mt_status_t moe_experts_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                 const moe_layer_params_t *gp, const int32_t *counts, const int32_t *offsets,
                                 int rows, const void *xp, float *g, float *u, float *dep, mt_error_t *err);

/* Expert parallelism's halves of the block (expert_parallel.c): in forward,
 * after moe_plan_routes, fill a->ep (m, H) with the outputs of this
 * device's rows, wherever their experts live; in backward, replace dep
 * (m, H) with the gathered rows' gradient.  Failing, the caller aborts the
 * communicator and releases a. */
mt_status_t moe_ep_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                           const float *xn, moe_layer_acts_t *a, mt_error_t *err);
mt_status_t moe_ep_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                            const moe_layer_params_t *gp, moe_layer_acts_t *a, float *dep, mt_error_t *err);
void moe_ep_acts_free(kern_device_t *dev, struct moe_ep_acts *ea);
const int32_t *moe_ep_expert_rows(const struct moe_ep_acts *ea);

#endif
