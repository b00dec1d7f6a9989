/* The routed experts' part of a sparse MoE block (moe_layer.h), shared by
 * the single-device block (moe_layer.c), gpt-oss's fused block (its
 * routing plan) and the owner side of expert parallelism
 * (expert_parallel.c).  Private to moe/. */
#ifndef MT_MOE_MOE_EXPERTS_H
#define MT_MOE_MOE_EXPERTS_H

#include "kernels/device.h"
#include "moe/moe_layer.h"

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
 * receive the gate and up projections and the experts' outputs, each in
 * its described dtype (F32, or BF16 with bf16 compute).  One product per
 * expert with rows, as a grouped GEMM.  Shared by the single-device block
 * and the owner side of expert parallelism, so both form exactly the same
 * products. */
mt_status_t moe_experts_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                const int32_t *counts, const int32_t *offsets, int rows, const void *xp,
                                void *g, void *u, void *ep, mt_error_t *err);

/* Its backward.  dep (rows, H), the outputs' gradient in the outputs'
 * dtype (bf16 in a bf16 run, as autocast gives a bf16 tensor's gradient),
 * is replaced by xp's gradient: in an fp32 run all of it (fp32; dxu is not
 * used), in a bf16 run the gate products' part dg gate, with the up
 * products' part du up in dxu (rows, H), each bf16, rounded once: the
 * caller sums the two in fp32 (moe_unpermute_sum_bf16 twice), so every
 * data-gradient product writes bf16 with beta 0, the kind cuBLAS groups.
 * g and u are overwritten with their gradients, in their dtype; weight
 * gradients accumulate (+=) in fp32 into gp's experts (a NULL target is
 * skipped). */
mt_status_t moe_experts_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_layer_params_t *p,
                                 const moe_layer_params_t *gp, const int32_t *counts, const int32_t *offsets,
                                 int rows, const void *xp, void *g, void *u, void *dep, void *dxu,
                                 mt_error_t *err);

#endif
