/* Per-element arithmetic of AdamW's lighter moment formats (kernels/adamw.h,
 * kern_moments_t), shared by the host kernel and the CUDA twin so that both
 * store the same bits.
 *
 * bf16 moments: m and v are computed in fp32 (kernels/math/adamw_math.h) and
 * stored rounded to bf16 stochastically: the 16 bits dropped are compared
 * against 16 random bits, so E[stored] = the fp32 value and the slow decay
 * of v (beta2 = 0.999 moves v by less than bf16's half ulp) is not lost to
 * round-to-nearest.  The random bits are a counter-based hash of (the
 * tensor's seed, the step, the element index, m or v): no RNG state, so the
 * result does not depend on thread count, plan, device or a resume.
 *
 * 8-bit moments: bitsandbytes' block-wise 8-bit Adam state: per block of 256
 * elements one fp32 absmax per moment, each element a code into a dynamic
 * map (signed for m, unsigned for v; moments_qmap.h).  A step dequantizes
 * (map[code] * absmax), updates in fp32, takes the new absmax of the block,
 * and quantizes value / absmax to the nearest map entry with bitsandbytes'
 * search (quantize_2D: a binary search from code 127, then the midpoint
 * between the two neighbours decides) and its sign fix for m (a nonzero m
 * never flips sign).  Division is IEEE here (bitsandbytes uses the fast
 * __fdividef): the host and the device must agree bit for bit. */
#ifndef MT_KERNELS_MATH_MOMENTS_MATH_H
#define MT_KERNELS_MATH_MOMENTS_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"
#include "base/hd.h"
#include "kernels/adamw.h"

/* splitmix64's finalizer: a bijective mix, so distinct counters give
 * independent-looking outputs. */
MT_HD uint64_t kern_moments_mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* The per-call key of the stochastic rounding: the tensor's seed and step. */
MT_HD uint64_t kern_moments_sr_key(uint64_t seed, int64_t step) {
    return kern_moments_mix64(seed ^ kern_moments_mix64((uint64_t)step * 0x9e3779b97f4a7c15ull));
}

/* x rounded to bf16 stochastically with the random bits of (key, i, which):
 * which 0 for m, 1 for v.  Non-finite values keep their class (NaN, inf). */
MT_HD uint16_t kern_moments_bf16_sr(float x, uint64_t key, uint64_t i, unsigned which) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7f800000u) == 0x7f800000u) return mt_f32_to_bf16(x);
    const uint32_t r = (uint32_t)(kern_moments_mix64(key + 2 * i + which) >> 48);
    const uint32_t s = u + r; /* carries into the exponent as a rounding up should */
    if ((s & 0x7f800000u) == 0x7f800000u) return (uint16_t)(u >> 16); /* never round up to inf */
    return (uint16_t)(s >> 16);
}

/* Nearest code of x (x = value / absmax, in [-1, 1]) in the 256-entry sorted
 * map q, as bitsandbytes' quantize_2D finds it. */
MT_HD uint8_t kern_moments_quantize(const float *q, int is_signed, float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = is_signed ? -1.0f : 0.0f, upper = 1.0f;
    float val = q[127];
    /* written as selects, not branches: x's side is a coin toss per
     * element, and a mispredicted branch costs more than the whole step */
    for (int i = 64; i > 0; i >>= 1) {
        const int up = x > val;
        lower_pivot = up ? pivot : lower_pivot;
        lower = up ? val : lower;
        upper_pivot = up ? upper_pivot : pivot;
        upper = up ? upper : val;
        pivot += up ? i : -i;
        val = q[pivot];
    }
    if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

/* m's code with bitsandbytes' sign fix: a code whose value has the other
 * sign moves one step toward m's side. */
MT_HD uint8_t kern_moments_quantize_m(const float *q, float m, float absmax) {
    const float x = absmax > 0.0f ? m / absmax : 0.0f;
    int c = kern_moments_quantize(q, 1, x);
    if (signbit(q[c]) != signbit(m) && m != 0.0f) c += m > 0.0f ? 1 : -1;
    return (uint8_t)c;
}

MT_HD uint8_t kern_moments_quantize_v(const float *q, float v, float absmax) {
    return kern_moments_quantize(q, 0, absmax > 0.0f ? v / absmax : 0.0f);
}

#endif
