/* vec.h's 16-lane exp (the one every CPU softmax, SwiGLU and cross-entropy
 * uses) against double-precision exp, and its ISA clones against each other.
 *
 * - Accuracy: every 61st float bit pattern over the whole range (70 M
 *   values, both signs, all exponents) plus every 7th float with
 *   2^-10 <= |x| <= 20 (36 M), where softmax arguments live. Where exp(x) is a normal float the error
 *   must be <= 1 ulp of the correctly rounded result (vec.h states 1 ulp;
 *   an exhaustive run of all 2^32 patterns measured 0.99 ulp). Where the
 *   result is subnormal, within one subnormal step (1.4e-45) absolute;
 *   where it overflows, +inf.
 * - Special values: NaN -> NaN, +inf -> +inf, -inf -> 0, +-0 -> 1,
 *   x > 88.73 -> inf, x < -104 -> 0.
 * - The AVX-512, AVX2 and baseline builds of the same loop give
 *   bit-identical results (no FMA contraction, same lanes): compared on
 *   every input above, for the ISAs this CPU has.
 * - act_math.h's one-lane kern_exp_cw, which the CUDA kernels share, gives
 *   the same bits as the vector one on every input above. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/cpu/vec.h"
#include "kernels/math/act_math.h"

#define ULP_TOL 1.0 /* vec.h's stated bound */
#define SUBNORMAL_STEP 1.401298464324817e-45

#define EXP_LOOP(name, target)                                             \
    target static void name(float *y, const float *x, size_t n) {          \
        for (size_t i = 0; i < n; i += KERN_VL)                            \
            kern_vf_store(y + i, kern_vf_exp(kern_vf_load(x + i)));        \
    }

EXP_LOOP(exp_avx512, __attribute__((target("avx512f"))))
EXP_LOOP(exp_avx2, __attribute__((target("avx2"))))
EXP_LOOP(exp_base, )

typedef struct {
    double max_ulp;
    float worst_x;
    long bad, isa_mismatch, scalar_mismatch;
} stats_t;

/* n must be a multiple of 16. */
static void check_block(stats_t *st, const float *x, float *y, float *y2, size_t n) {
    exp_base(y, x, n);
    for (size_t i = 0; i < n; i++) {
        const double e = exp((double)x[i]);
        const float got = y[i];
        if (isnan(x[i])) {
            if (!isnan(got)) st->bad++;
            continue;
        }
        if (e > 3.4028234663852886e38) { /* overflows float */
            if (!(isinf(got) && got > 0)) st->bad++;
            continue;
        }
        if (e < 1.1754943508222875e-38) { /* subnormal or zero result */
            if (fabs((double)got - e) > SUBNORMAL_STEP) st->bad++;
            continue;
        }
        const float ef = (float)e;
        const double ulp = (double)nextafterf(ef, INFINITY) - ef;
        const double u = fabs((double)got - e) / ulp;
        if (u > st->max_ulp) st->max_ulp = u, st->worst_x = x[i];
        if (u > ULP_TOL) st->bad++;
    }
    for (size_t i = 0; i < n; i++) {
        const float e1 = kern_exp_cw(x[i]);
        st->scalar_mismatch += memcmp(&e1, &y[i], sizeof e1) != 0;
    }
    if (__builtin_cpu_supports("avx512f")) {
        exp_avx512(y2, x, n);
        st->isa_mismatch += memcmp(y, y2, n * sizeof *y) != 0;
    }
    if (__builtin_cpu_supports("avx2")) {
        exp_avx2(y2, x, n);
        st->isa_mismatch += memcmp(y, y2, n * sizeof *y) != 0;
    }
}

int main(void) {
    enum { BLK = 1 << 16 };
    float *x = malloc(BLK * sizeof *x), *y = malloc(BLK * sizeof *y), *y2 = malloc(BLK * sizeof *y2);
    if (!x || !y || !y2) return 1;
    stats_t st = {0};
    /* every 61st bit pattern of all 2^32 */
    size_t k = 0;
    for (uint64_t b = 0; b < (1ull << 32); b += 61) {
        const uint32_t u = (uint32_t)b;
        memcpy(&x[k++], &u, sizeof u);
        if (k == BLK) check_block(&st, x, y, y2, k), k = 0;
    }
    /* dense: every 7th float with 2^-10 <= |x| <= 20, both signs */
    uint32_t lo, hi;
    const float flo = 0x1p-10f, fhi = 20.0f;
    memcpy(&lo, &flo, sizeof lo);
    memcpy(&hi, &fhi, sizeof hi);
    for (uint32_t u = lo; u <= hi; u += 7)
        for (int sgn = 0; sgn < 2; sgn++) {
            const uint32_t v = u | (sgn ? 0x80000000u : 0u);
            memcpy(&x[k++], &v, sizeof v);
            if (k == BLK) check_block(&st, x, y, y2, k), k = 0;
        }
    while (k % KERN_VL) x[k++] = 0.0f;
    check_block(&st, x, y, y2, k);
    printf("max error %.4f ulp at x = %.9g; %ld out of tolerance; %ld ISA mismatches; %ld scalar mismatches\n",
           st.max_ulp, st.worst_x, st.bad, st.isa_mismatch, st.scalar_mismatch);
    tu_expect(st.scalar_mismatch == 0, "kern_exp_cw differs from kern_vf_exp on %ld inputs", st.scalar_mismatch);
    tu_expect(st.bad == 0, "%ld results beyond %.1f ulp (or wrong special cases); worst %.4f ulp at %.9g",
              st.bad, ULP_TOL, st.max_ulp, st.worst_x);
    tu_expect(st.isa_mismatch == 0, "%ld blocks differ between the AVX-512/AVX2/baseline builds",
              st.isa_mismatch);

    /* special values, one vector */
    float sx[KERN_VL] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 88.73f, 89.5f, 1e30f,
                         -104.5f, -1e30f, 1.0f, -1.0f, 88.7f, -87.3f, 0.5f, -0.5f};
    float sy[KERN_VL];
    exp_base(sy, sx, KERN_VL);
    tu_expect(isnan(sy[0]), "exp(NaN) = %g, want NaN", sy[0]);
    tu_expect(isinf(sy[1]) && sy[1] > 0, "exp(inf) = %g, want inf", sy[1]);
    tu_expect(sy[2] == 0.0f, "exp(-inf) = %g, want 0", sy[2]);
    tu_expect(sy[3] == 1.0f && sy[4] == 1.0f, "exp(+-0) = %g %g, want 1", sy[3], sy[4]);
    for (int i = 5; i < 8; i++) tu_expect(isinf(sy[i]), "exp(%g) = %g, want inf", sx[i], sy[i]);
    for (int i = 8; i < 10; i++) tu_expect(sy[i] == 0.0f, "exp(%g) = %g, want 0", sx[i], sy[i]);
    free(x);
    free(y);
    free(y2);
    return tu_finish("vec_exp_test");
}
