/* LoRA on a linear layer, built from the device's products (kernels/gemm.h).
 *
 *   forward:  y += s * (xd A^T) B^T,  xd = dropout(x)    A (r, in), B (out, r)
 *   backward: u = dy B;  dB += s * dy^T (xd A^T);  dA += s * u^T xd;
 *             dx += dropout'(s * u A)  (the same mask and scale)
 *
 * PEFT's LoRA layer computes lora_B(lora_A(dropout(x))) * scaling and adds it
 * to the base layer's output; this is that, with the scale folded into the
 * last product (the same number up to the rounding of one product).
 * x A^T is recomputed in backward rather than saved: it is rows x r, and
 * one product of rank r costs little next to the module's own products.
 * Products run in the compute dtype, fp32 accumulation; gradients are fp32. */
#ifndef MT_KERNELS_LORA_H
#define MT_KERNELS_LORA_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/device.h"

typedef struct {
    const void *a, *b; /* working copies, in dtype; a == NULL: the module has no adapter */
    mt_dtype_t dtype;
    float *ga, *gb;    /* gradient targets (fp32, +=); NULL when not wanted */
    int r;
    float scale;
    /* PEFT's lora_dropout on the adapter's input (0 = none): the mask comes
     * from dropout_seed alone (kern_dropout), so backward and any
     * recomputation see the forward's mask */
    float dropout;
    uint64_t dropout_seed;
} kern_lora_t;

/* y (rows, out) += s (x A^T) B^T; x (rows, in) stored as x_dt.  A no-op
 * when l->a is NULL or rows is 0. */
mt_status_t kern_lora_fwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, float *y, const void *x,
                          mt_dtype_t x_dt, int rows, int in, int out, mt_error_t *err);

/* The gradients of the forward above given dy (rows, out): dA, dB into
 * l->ga, l->gb (when set) and dx (rows, in) += (when dx is not NULL). */
mt_status_t kern_lora_bwd(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, const float *dy,
                          const void *x, mt_dtype_t x_dt, float *dx, int rows, int in, int out, mt_error_t *err);

/* The same with dy stored as dy_dt (F32, or BF16 with bf16 compute: the
 * routed experts' gate/up gradients in a bf16 run, which every product
 * would round to bf16 anyway). */
mt_status_t kern_lora_bwd_typed(kern_device_t *dev, mt_dtype_t compute, const kern_lora_t *l, const void *dy,
                                mt_dtype_t dy_dt, const void *x, mt_dtype_t x_dt, float *dx, int rows, int in,
                                int out, mt_error_t *err);

#endif
