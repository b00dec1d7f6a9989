/* 16-lane vectors for the CPU kernels (private to kernels/cpu).
 *
 * Why this shape
 * - The build targets x86-64-v2 (SSE4.2), so nothing wider is used unless a
 *   kernel asks for it at run time. Hot loops are written once on GCC's
 *   generic vectors of 16 floats and compiled twice by KERN_CPU_CLONES
 *   (AVX-512 and baseline); the loader picks one per machine (an ifunc).
 *   On AVX-512 a vector is one zmm register. On SSE it is four xmm: slower,
 *   but the lanes, and so the arithmetic, are the same. (An AVX2 clone was
 *   measured: GCC 12 moves 2-register vectors through the stack and it was
 *   no faster than the baseline, so there is none.)
 * - No fused multiply-add anywhere (-std=c17 means -ffp-contract=off, and
 *   nothing here asks for fma): every clone rounds each operation alike,
 *   so results are bit-identical across the clones (vec_exp_test checks
 *   the exp). Reductions keep 16 lane partials and fold them in one fixed
 *   tree (kern_vdacc_hsum), so their order does not depend on the ISA.
 * - These are the only non-MT_HD functions defined in a header: they must
 *   inline into each clone (always_inline), since a call would cross the
 *   target boundary and pass 64-byte vectors through memory.
 *
 * kern_vf_exp: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and
 * Cephes' degree-7 expf polynomial, evaluated without FMA, then 2^n applied
 * as two exact power-of-two products (so overflow gives inf and tiny
 * results go gradually subnormal, as libm's expf). Maximum error 1 ulp
 * where the result is a normal float: an exhaustive run over all 2^32
 * inputs measured 0.990 ulp (vec_exp_test samples 106 M of them); inf,
 * -inf, NaN and overflow/underflow behave like expf. */
#ifndef MT_KERNELS_CPU_VEC_H
#define MT_KERNELS_CPU_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef float kern_vf_t __attribute__((vector_size(64)));    /* 16 x f32 */
typedef int32_t kern_vi_t __attribute__((vector_size(64)));  /* 16 x i32, also lane masks */
typedef float kern_vf8_t __attribute__((vector_size(32)));   /* 8 x f32 (half a kern_vf_t) */
typedef double kern_vd8_t __attribute__((vector_size(64)));  /* 8 x f64 */

/* 16 double lane partials, kept as two 8-lane halves: GCC keeps a 128-byte
 * vector in memory, two 64-byte ones in registers. lo holds lanes 0-7. */
typedef struct {
    kern_vd8_t lo, hi;
} kern_vdacc_t;

#define KERN_VL 16
#define KERN_CPU_CLONES __attribute__((target_clones("avx512f", "default")))
#define KERN_VINLINE static inline __attribute__((always_inline))

/* GCC 12 expands a vector built from one repeated element ({x, .., x}, or
 * x - 0, which it folds to that) lane by lane with masked broadcasts; 0 + x
 * cannot be folded (0 + -0 is +0), so it costs one scalar add and then a
 * single broadcast. Constants still fold at compile time. */
KERN_VINLINE kern_vf_t kern_vf_splat(float x) { return (kern_vf_t){0} + x; }

KERN_VINLINE kern_vf_t kern_vf_load(const float *p) {
    kern_vf_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

KERN_VINLINE void kern_vf_store(float *p, kern_vf_t v) { memcpy(p, &v, sizeof v); }

/* The first n (< 16) floats of p, the other lanes `fill`. */
KERN_VINLINE kern_vf_t kern_vf_load_n(const float *p, size_t n, float fill) {
    float buf[KERN_VL];
    for (int i = 0; i < KERN_VL; i++) buf[i] = fill;
    memcpy(buf, p, n * sizeof *p);
    return kern_vf_load(buf);
}

KERN_VINLINE void kern_vf_store_n(float *p, kern_vf_t v, size_t n) {
    float buf[KERN_VL];
    kern_vf_store(buf, v);
    memcpy(p, buf, n * sizeof *p);
}

/* m ? a : b, lane-wise (m from a vector comparison: all ones or zero). */
KERN_VINLINE kern_vf_t kern_vf_select(kern_vi_t m, kern_vf_t a, kern_vf_t b) {
    return (kern_vf_t)(((kern_vi_t)a & m) | ((kern_vi_t)b & ~m));
}

KERN_VINLINE kern_vf_t kern_vf_max(kern_vf_t a, kern_vf_t b) { return kern_vf_select(a > b, a, b); }

KERN_VINLINE kern_vdacc_t kern_vdacc_zero(void) { return (kern_vdacc_t){{0}, {0}}; }

KERN_VINLINE kern_vd8_t kern_vf_lo_vd(kern_vf_t v) {
    return __builtin_convertvector(__builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7), kern_vd8_t);
}

KERN_VINLINE kern_vd8_t kern_vf_hi_vd(kern_vf_t v) {
    return __builtin_convertvector(__builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15),
                                   kern_vd8_t);
}

/* acc[l] += (double)v[l] */
KERN_VINLINE void kern_vdacc_add(kern_vdacc_t *acc, kern_vf_t v) {
    acc->lo += kern_vf_lo_vd(v);
    acc->hi += kern_vf_hi_vd(v);
}

/* acc[l] += (double)a[l] * (double)b[l] (exact product, one rounding in the add) */
KERN_VINLINE void kern_vdacc_add_prod(kern_vdacc_t *acc, kern_vf_t a, kern_vf_t b) {
    acc->lo += kern_vf_lo_vd(a) * kern_vf_lo_vd(b);
    acc->hi += kern_vf_hi_vd(a) * kern_vf_hi_vd(b);
}

/* Lane sums in one fixed tree: (l, l+8), then (l, l+4), (l, l+2), (0, 1). */
KERN_VINLINE double kern_vdacc_hsum(kern_vdacc_t acc) {
    const kern_vd8_t s = acc.lo + acc.hi;
    double a[4];
    for (int i = 0; i < 4; i++) a[i] = s[i] + s[i + 4];
    for (int i = 0; i < 2; i++) a[i] = a[i] + a[i + 2];
    return a[0] + a[1];
}

KERN_VINLINE float kern_vf_hsum(kern_vf_t v) {
    float a[8];
    for (int i = 0; i < 8; i++) a[i] = v[i] + v[i + 8];
    for (int i = 0; i < 4; i++) a[i] = a[i] + a[i + 4];
    for (int i = 0; i < 2; i++) a[i] = a[i] + a[i + 2];
    return a[0] + a[1];
}

/* Max of the 16 lanes by halving shuffles (max is exact, so any order
 * gives the same value). */
KERN_VINLINE float kern_vf_hmax(kern_vf_t v) {
    v = kern_vf_max(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    v = kern_vf_max(v, __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3));
    v = kern_vf_max(v, __builtin_shufflevector(v, v, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3, 0, 1));
    v = kern_vf_max(v, __builtin_shufflevector(v, v, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0));
    return v[0];
}

/* expf on 16 lanes (see the note at the top of the file). */
KERN_VINLINE kern_vf_t kern_vf_exp(kern_vf_t x) {
    const kern_vf_t shifter = kern_vf_splat(12582912.0f); /* 1.5 * 2^23: round to nearest */
    const kern_vi_t nan = x != x;
    kern_vf_t xc = kern_vf_select(x > kern_vf_splat(89.0f), kern_vf_splat(89.0f), x);
    xc = kern_vf_select(xc < kern_vf_splat(-104.0f), kern_vf_splat(-104.0f), xc);
    const kern_vf_t t = xc * kern_vf_splat(1.44269504088896341f) + shifter;
    const kern_vi_t n = (kern_vi_t)t - (kern_vi_t)shifter;
    const kern_vf_t nf = t - shifter;
    /* ln2 = 0.693359375 - 2.12194440e-4: the first part has 9 significant
     * bits, so nf * it is exact for |n| < 2^15 */
    kern_vf_t r = xc - nf * kern_vf_splat(0.693359375f);
    r = r - nf * kern_vf_splat(-2.12194440e-4f);
    kern_vf_t p = kern_vf_splat(1.9875691500e-4f);
    p = p * r + kern_vf_splat(1.3981999507e-3f);
    p = p * r + kern_vf_splat(8.3334519073e-3f);
    p = p * r + kern_vf_splat(4.1665795894e-2f);
    p = p * r + kern_vf_splat(1.6666665459e-1f);
    p = p * r + kern_vf_splat(5.0000001201e-1f);
    p = p * (r * r) + r + kern_vf_splat(1.0f);
    /* 2^n as 2^(n/2) * 2^(n - n/2): both factors normal for n in [-150, 129] */
    const kern_vi_t n1 = n >> 1, n2 = n - n1;
    const kern_vf_t y = p * (kern_vf_t)((n1 + 127) << 23) * (kern_vf_t)((n2 + 127) << 23);
    return kern_vf_select(nan, x, y);
}

#endif
