/* What the MoE blocks (moe_layer.c, moe_fused.c, moe_experts.c,
 * expert_parallel.c) share, and the allocation macros of all block code:
 * the engine's layers (engine/layers/ops_common.h) allocate with ALLOC and
 * TRY too, so there is one definition of each.  The macros name their
 * tensor and, failing, go to the function's `fail:` cleanup (dev, err and,
 * for ALLOC_ACT, the layer's dims `d` and token count `n` in scope).  The
 * routed experts' shared products are moe_experts.h's. */
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

/* A saved activation stored in whichever dtype its description says (the
 * routed experts' g, u and ep: bf16 in a bf16 run, fp32 otherwise). */
#define ALLOC_ACT_DESCRIBED(ptr, id, tag)                                                                      \
    do {                                                                                                       \
        const moe_act_size_t *sz_ = &d->acts[(id)];                                                            \
        (ptr) = kern_alloc(dev, (size_t)(sz_->per_token * n + sz_->fixed) * mt_dtype_size(sz_->dtype), (tag),  \
                           err);                                                                               \
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

/* Expert parallelism's halves of the block (expert_parallel.c): in forward,
 * after moe_plan_routes, fill a->ep (m, H) with the outputs of this
 * device's rows, wherever their experts live; in backward, replace dep
 * (m, H, in the outputs' dtype) with the gathered rows' gradient, in
 * moe_experts_backward's form (in a bf16 run the gate part in dep, the up
 * part in dxu).  Failing, the caller aborts the communicator and releases
 * a. */
mt_status_t moe_ep_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                           const float *xn, moe_layer_acts_t *a, mt_error_t *err);
mt_status_t moe_ep_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                            const moe_layer_params_t *gp, moe_layer_acts_t *a, void *dep, void *dxu, mt_error_t *err);
void moe_ep_acts_free(kern_device_t *dev, struct moe_ep_acts *ea);
const int32_t *moe_ep_expert_rows(const struct moe_ep_acts *ea);

#endif
