/* Derivatives of the activations in elementwise.h, shared by the CPU twin
 * and the CUDA kernels. */
#ifndef MT_KERNELS_MATH_ACT_MATH_H
#define MT_KERNELS_MATH_ACT_MATH_H

#include <stdbool.h>
#include <stdint.h>

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

/* kern_dropout's mask: element i is kept when the top 24 bits of
 * splitmix64(seed + (i + 1) * golden), as a fraction of 2^24, are >= p. */
MT_HD bool kern_dropout_keep(uint64_t seed, uint64_t i, float p) {
    uint64_t z = seed + (i + 1) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f) >= p;
}

#endif
