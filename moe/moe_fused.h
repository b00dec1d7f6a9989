/* A MoE block whose experts are fused over E with biases (gpt-oss's
 * GptOssMLP), forward and backward, on any backend.
 *
 *   logits = xn router^T + router_b                         (n, E), fp32
 *   topw, idx: top-k of the logits, softmax over those k    (router_math.h's
 *              softmax -> top-k -> renormalise: the same function of the logits)
 *   per expert e, its rows xp (cnt, H):
 *     gu = xp gate_up[e] + gate_up_b[e]                     (cnt, 2I), gate/up interleaved
 *     h  = clamped SwiGLU(gu)                               (cnt, I)  (kernels/gpt_oss.h)
 *     ep = h down[e] + down_b[e]                            (cnt, H)
 *   y = sum over the k chosen of topw * ep
 *
 * The weights are the checkpoint's tensors as they are: gate_up (E, H, 2I)
 * and down (E, I, H), used as x @ W (not nn.Linear's x @ W^T).  Like
 * transformers' fused parameters, every expert's slice gets a gradient
 * (zero for an expert without tokens), so AdamW moves all of them as torch
 * does.  Saved activations and the routing plan are moe_layer.h's
 * (moe_layer_acts_t; its g holds gu, u is unused), released by
 * moe_layer_acts_release.  Nothing here knows the engine's registry. */
#ifndef MT_MOE_MOE_FUSED_H
#define MT_MOE_MOE_FUSED_H

#include "moe/moe_layer.h"

typedef struct {
    const float *router, *router_b;    /* (E, H), (E): always F32 (moe_layer.c says why) */
    const void *gate_up, *down;        /* (E, H, 2I), (E, I, H) in dtype */
    const float *gate_up_b, *down_b;   /* (E, 2I), (E, H) */
    mt_dtype_t dtype;                  /* the expert matrices' working dtype (F32 or BF16) */
    float alpha, limit;                /* the clamped SwiGLU's (swiglu_alpha, swiglu_limit) */
} moe_fused_params_t;

/* Gradient targets (F32, accumulated); NULL: not wanted (frozen). */
typedef struct {
    float *router, *router_b, *gate_up, *gate_up_b, *down, *down_b;
} moe_fused_grads_t;

mt_status_t moe_fused_forward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_fused_params_t *p,
                              const float *xn, int n, float *y, moe_layer_acts_t *acts, mt_error_t *err);

/* dxn (n, H) is overwritten; aux_dp / tok_w as moe_layer_backward's. */
mt_status_t moe_fused_backward(kern_device_t *dev, const moe_layer_dims_t *d, const moe_fused_params_t *p,
                               const moe_fused_grads_t *gp, const float *xn, const float *dy, const float *aux_dp,
                               const float *tok_w, moe_layer_acts_t *acts, float *dxn, mt_error_t *err);

#endif
