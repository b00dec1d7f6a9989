/* Derivatives of the activations in elementwise.h, shared by the CPU twin
 * and the CUDA kernels. */
#ifndef MT_KERNELS_ACT_MATH_H
#define MT_KERNELS_ACT_MATH_H

#include "kernels/elementwise.h"
#include "base/hd.h"

/* h = silu(g) * u:  du = dh * (g * sig(g)),
 * dg = (dh * u) * silu'(g),  silu'(g) = sig(g) * (1 + g * (1 - sig(g)))
 * (the CPU twin's order of operations). */
MT_HD void kern_swiglu_bwd_elem(float dh, float g, float u, float *dg, float *du) {
    const float sig = kern_sigmoid(g);
    *du = dh * (g * sig);
    *dg = dh * u * (sig * (1.0f + g * (1.0f - sig)));
}

/* d sigmoid(x) / dx from sigmoid(x). */
MT_HD float kern_sigmoid_grad(float sig) { return sig * (1.0f - sig); }

#endif
