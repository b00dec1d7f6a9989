/* What the MoE blocks (moe_layer.c, moe_fused.c) share.  The allocation
 * macros name their tensor and, failing, go to the function's `fail:`
 * cleanup (dev, err and, for ALLOC_ACT, the layer's dims `d` and token
 * count `n` in scope). */
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

#endif
