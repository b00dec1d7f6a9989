/* Derivatives of the activations in elementwise.h, shared by the CPU twin
 * and the CUDA kernels. */
#ifndef MT_KERNELS_MATH_ACT_MATH_H
#define MT_KERNELS_MATH_ACT_MATH_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/hd.h"
#include "kernels/elementwise.h"

/* h = silu(g) * u:  du = dh * (g * sig(g)),
 * dg = (dh * u) * silu'(g),  silu'(g) = sig(g) * (1 + g * (1 - sig(g)))
 * (the CPU twin's order of operations). */
MT_HD void kern_swiglu_bwd_elem(float dh, float g, float u, float *dg, float *du) {
    const float sig = kern_sigmoid(g);
    *du = dh * (g * sig);
    *dg = dh * u * (sig * (1.0f + g * (1.0f - sig)));
}

/* expf as the CPU twins' kern_vf_exp (kernels/cpu/vec.h) computes it, one
 * lane at a time: Cody-Waite reduction, Cephes' degree-7 polynomial, no
 * multiply-add (the CUDA kernels are built with --fmad=false), 2^n as two
 * exact power-of-two products.  Within 1 ulp of expf; what it buys is the
 * same bits on every backend, so an op whose result is rounded to bf16
 * (a tie broken differently would move it by a whole bf16 ulp) gives
 * bit-identical results on the CPU and the GPU. */
MT_HD float kern_exp_cw(float x) {
    if (x != x) return x;
    const float shifter = 12582912.0f; /* 1.5 * 2^23: round to nearest */
    const float xc = x > 89.0f ? 89.0f : x < -104.0f ? -104.0f : x;
    const float t = xc * 1.44269504088896341f + shifter;
    int32_t ti, si;
    memcpy(&ti, &t, sizeof ti);
    memcpy(&si, &shifter, sizeof si);
    const int32_t n = ti - si;
    const float nf = t - shifter;
    float r = xc - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t n1 = n >> 1, n2 = n - n1;
    const int32_t b1 = (n1 + 127) * 8388608, b2 = (n2 + 127) * 8388608; /* << 23 */
    float f1, f2;
    memcpy(&f1, &b1, sizeof f1);
    memcpy(&f2, &b2, sizeof f2);
    return p * f1 * f2;
}

/* SwiGLU with bf16 storage (the routed experts' g, u and h in a bf16 run):
 * the inputs widened exactly, the fp32 formulas of kern_swiglu_fwd /
 * kern_swiglu_bwd_elem with kern_exp_cw, each result rounded to nearest
 * even once.  Both twins call these, so they agree bit for bit. */
MT_HD uint16_t kern_swiglu_bf16_elem(uint16_t g, uint16_t u) {
    const float gf = mt_bf16_to_f32(g);
    return mt_f32_to_bf16(gf / (1.0f + kern_exp_cw(-gf)) * mt_bf16_to_f32(u));
}

MT_HD void kern_swiglu_bwd_bf16_elem(uint16_t dh16, uint16_t g, uint16_t u, uint16_t *dg, uint16_t *du) {
    const float dh = mt_bf16_to_f32(dh16), gf = mt_bf16_to_f32(g), uf = mt_bf16_to_f32(u);
    const float sig = 1.0f / (1.0f + kern_exp_cw(-gf));
    *du = mt_f32_to_bf16(dh * (gf * sig));
    *dg = mt_f32_to_bf16(dh * uf * (sig * (1.0f + gf * (1.0f - sig))));
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
