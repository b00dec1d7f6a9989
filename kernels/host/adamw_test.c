/* Tests of the host AdamW kernel (adamw.c).
 *
 * What must hold:
 * 1. The scalar path agrees with a double-precision evaluation of PyTorch's
 *    AdamW formula within a first-order rounding-error bound derived below
 *    (not a hand-tuned tolerance).
 * 2. Every SIMD path and every thread count gives the same bits as the
 *    scalar path (adamw_cpu.h explains why that is by design), on odd
 *    lengths and unaligned starts, with fp32 or bf16 gradients, with and
 *    without the bf16 working copy.
 * 3. The bf16 copy is p rounded to nearest even (mt_f32_to_bf16), NaN and
 *    ties included.
 * 4. The step count enters the bias corrections; multi-step runs stay
 *    within the bound step by step. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/host/adamw_host.h"
#include "kernels/host/threadpool.h"
#include "base/dtype.h"

static int g_failures;

#define EXPECT(cond, ...)                                    \
    do {                                                     \
        if (!(cond)) {                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                    \
            fprintf(stderr, "\n");                           \
            g_failures++;                                    \
        }                                                    \
    } while (0)

/* ---- random inputs ---- */

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}
static float rng_unif(uint64_t *s) { /* [-1, 1) */
    return (float)((double)(rng_next(s) >> 11) * 0x1p-52 - 1.0);
}

/* One tensor's worth of optimizer state, each array starting `off` floats
 * past a 64-byte boundary (so unaligned starts are exercised). */
typedef struct {
    size_t n;
    float *pbuf, *mbuf, *vbuf, *gbuf; /* allocations */
    uint16_t *gbbuf, *pbbuf;
    float *p, *m, *v, *g;             /* (n) */
    uint16_t *gb, *pb;                /* (n) */
} state_t;

static void *alloc64(size_t bytes) {
    void *q = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!q) {
        fprintf(stderr, "out of memory (%zu bytes)\n", bytes);
        abort();
    }
    return q;
}

static void state_init(state_t *s, size_t n, const int off[6]) {
    s->n = n;
    s->pbuf = alloc64((n + 16) * 4);
    s->mbuf = alloc64((n + 16) * 4);
    s->vbuf = alloc64((n + 16) * 4);
    s->gbuf = alloc64((n + 16) * 4);
    s->gbbuf = alloc64((n + 32) * 2);
    s->pbbuf = alloc64((n + 32) * 2);
    s->p = s->pbuf + off[0];
    s->m = s->mbuf + off[1];
    s->v = s->vbuf + off[2];
    s->g = s->gbuf + off[3];
    s->gb = s->gbbuf + off[4];
    s->pb = s->pbbuf + off[5];
}

static void state_free(state_t *s) {
    free(s->pbuf), free(s->mbuf), free(s->vbuf), free(s->gbuf), free(s->gbbuf), free(s->pbbuf);
}

/* Values spread over several binades, as real optimizer state is. */
static void state_fill(state_t *s, uint64_t seed) {
    uint64_t r = seed * 0x9E3779B97F4A7C15ull + 1;
    for (size_t i = 0; i < s->n; i++) {
        s->p[i] = rng_unif(&r) * ldexpf(1.0f, (int)(rng_next(&r) % 8) - 6);
        s->m[i] = rng_unif(&r) * 1e-3f;
        const float a = rng_unif(&r) * 1e-3f;
        s->v[i] = (i % 5 == 0) ? 0.0f : a * a; /* some v = 0: the first step */
        s->g[i] = rng_unif(&r) * ldexpf(1.0f, (int)(rng_next(&r) % 12) - 14);
        s->gb[i] = mt_f32_to_bf16(rng_unif(&r) * 0.01f);
        s->pb[i] = 0xdead;
    }
}

static void state_copy(state_t *dst, const state_t *src) {
    memcpy(dst->p, src->p, src->n * 4);
    memcpy(dst->m, src->m, src->n * 4);
    memcpy(dst->v, src->v, src->n * 4);
    memcpy(dst->g, src->g, src->n * 4);
    memcpy(dst->gb, src->gb, src->n * 2);
    memcpy(dst->pb, src->pb, src->n * 2);
}

/* ---- the double-precision reference and its error bound ----
 *
 * PyTorch's formula in double from the same fp32 inputs, with the
 * hyperparameters as given (widened floats). The kernel rounds each op to
 * fp32 (unit roundoff u = 2^-24) and each coefficient once. First-order
 * error analysis of adamw.c's op sequence gives
 *   |m - m_ref| <= u (|m1| + |g| + 2|g - m|)                       =: u M
 *   |v - v_ref| <= 6u v1         (all terms positive; 6 roundings deep)
 *   |p - p_ref| <= u (|p2| + 2|p1| + (step/den) (M + 10|m1|))
 * where p1 = decayed p, m1, v1, p2 the exact new values, den the exact
 * denominator. We allow twice each bound for second-order terms. */
typedef struct {
    double p, m, v, tp, tm, tv;
} ref_t;

static ref_t ref_elem(const kern_adamw_params_t *hp, float p, float m, float v, float graw) {
    const double u = 0x1p-24;
    const double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, t = (double)hp->step;
    const double g = (double)graw * hp->grad_scale;
    const double p1 = p * (1.0 - lr * hp->weight_decay);
    const double d = g - m;
    const double m1 = m + (1.0 - b1) * d;
    const double v1 = v * b2 + (1.0 - b2) * g * g;
    const double den = sqrt(v1) / sqrt(1.0 - pow(b2, t)) + hp->eps;
    const double step = lr / (1.0 - pow(b1, t));
    const double p2 = p1 - step * m1 / den;
    const double M = fabs(m1) + fabs(g) + 2 * fabs(d);
    ref_t r = {.p = p2, .m = m1, .v = v1};
    r.tm = 2 * u * M;
    r.tv = 2 * 6 * u * v1;
    r.tp = 2 * u * (fabs(p2) + 2 * fabs(p1) + step / den * (M + 10 * fabs(m1)));
    return r;
}

/* Checks one step's result (out) against the reference from the state
 * before the step (in). Reports the first few mismatches. */
static void check_vs_ref(const char *what, const kern_adamw_params_t *hp, const state_t *in,
                         const state_t *out, int gbf16) {
    int reported = 0;
    double worst = 0; /* largest error / bound seen, printed for the record */
    for (size_t i = 0; i < in->n; i++) {
        const float g = gbf16 ? mt_bf16_to_f32(in->gb[i]) : in->g[i];
        const ref_t r = ref_elem(hp, in->p[i], in->m[i], in->v[i], g);
        const double ep = fabs(out->p[i] - r.p), em = fabs(out->m[i] - r.m),
                     ev = fabs(out->v[i] - r.v);
        const int ok = ep <= r.tp && em <= r.tm && ev <= r.tv;
        if (r.tp > 0 && ep / r.tp > worst) worst = ep / r.tp;
        if (!ok && reported++ < 5)
            EXPECT(0,
                   "%s: element %zu of %zu differs from the double reference beyond the bound: "
                   "p %.9g vs %.9g (err %.3g, bound %.3g), m %.9g vs %.9g (err %.3g, bound %.3g), "
                   "v %.9g vs %.9g (err %.3g, bound %.3g)",
                   what, i, in->n, out->p[i], r.p, ep, r.tp, out->m[i], r.m, em, r.tm, out->v[i],
                   r.v, ev, r.tv);
    }
    if (in->n >= 1000) printf("  %s: worst p error = %.2f of the bound\n", what, worst);
}

/* Equal bits, or both NaN (which NaN payload survives an operation with
 * two NaN operands depends on operand order, which we do not promise). */
static int same_f32(float x, float y) { return memcmp(&x, &y, 4) == 0 || (isnan(x) && isnan(y)); }
static int same_bf16(uint16_t x, uint16_t y) {
    return x == y || (isnan(mt_bf16_to_f32(x)) && isnan(mt_bf16_to_f32(y)));
}

static int same_bits(const state_t *a, const state_t *b, int with_pb, const char *what) {
    const size_t n = a->n;
    for (size_t i = 0; i < n; i++) {
        if (!same_f32(a->p[i], b->p[i]) || !same_f32(a->m[i], b->m[i]) ||
            !same_f32(a->v[i], b->v[i]) || (with_pb && !same_bf16(a->pb[i], b->pb[i]))) {
            EXPECT(0,
                   "%s: element %zu of %zu not bit-identical to the scalar path: p %a vs %a, "
                   "m %a vs %a, v %a vs %a, bf16 %04x vs %04x",
                   what, i, n, a->p[i], b->p[i], a->m[i], b->m[i], a->v[i], b->v[i],
                   with_pb ? a->pb[i] : 0, with_pb ? b->pb[i] : 0);
            return 0;
        }
    }
    return 1;
}

static void check_bf16_copy(const state_t *s, const char *what) {
    for (size_t i = 0; i < s->n; i++) {
        const uint16_t want = mt_f32_to_bf16(s->p[i]);
        if (s->pb[i] != want) {
            EXPECT(0, "%s: bf16 copy of element %zu is %04x, want %04x (p = %a)", what, i,
                   s->pb[i], want, s->p[i]);
            return;
        }
    }
}

static kern_adamw_params_t default_hp(void) {
    kern_adamw_params_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                              .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 1};
    return hp;
}

static void run(kern_threadpool_t *pool, kern_cpu_isa_t isa, state_t *s, int gbf16, int pbf16,
                const kern_adamw_params_t *hp) {
    kern_adamw_cpu_isa(pool, isa, s->p, s->m, s->v, gbf16 ? NULL : s->g, gbf16 ? s->gb : NULL,
                       pbf16 ? s->pb : NULL, s->n, hp);
}

static const kern_cpu_isa_t k_isas[] = {KERN_ISA_AVX2, KERN_ISA_AVX512};

static int same_array(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* The out-of-place update on `isa`: from a copy of `in` into buffers of
 * other offsets (holding stale values), it must leave exactly the in-place
 * result `ref` there (p, m, v, the bf16 copy and the finite flag) and its
 * sources as they were. */
static void check_out_of_place(kern_threadpool_t *pool, kern_cpu_isa_t isa, const state_t *in, const state_t *ref,
                               const int off[6], int gbf16, int pbf16, const kern_adamw_params_t *hp,
                               const char *what) {
    const size_t n = in->n;
    const int doff[6] = {off[2], off[0], off[1], off[3], off[4], off[5]};
    state_t src, dst;
    state_init(&src, n, off);
    state_init(&dst, n, doff);
    state_copy(&src, in);
    state_fill(&dst, 977); /* stale state, none of it may show through */
    memcpy(dst.g, in->g, n * 4);
    memcpy(dst.gb, in->gb, n * 2);
    memcpy(dst.pb, in->pb, n * 2);
    kern_adamw_params_t h = *hp;
    int bad = 0;
    h.nonfinite = &bad;
    kern_adamw_cpu_isa_from(pool, isa, src.p, src.m, src.v, dst.p, dst.m, dst.v, gbf16 ? NULL : src.g,
                            gbf16 ? src.gb : NULL, pbf16 ? dst.pb : NULL, n, &h);
    char w2[240];
    snprintf(w2, sizeof w2, "%s [%s, out of place]", what, kern_cpu_isa_name(isa));
    same_bits(ref, &dst, pbf16, w2);
    EXPECT(same_array(src.p, in->p, n) && same_array(src.m, in->m, n) && same_array(src.v, in->v, n),
           "%s: the sources changed", w2);
    int want_bad = 0;
    for (size_t i = 0; i < n; i++) want_bad |= !isfinite(ref->p[i]);
    EXPECT(bad == want_bad, "%s: finite flag %d, want %d", w2, bad, want_bad);
    state_free(&src);
    state_free(&dst);
}

/* One case: the scalar path against the reference, then every SIMD path
 * the CPU has (on a 2-thread pool) against the scalar path, bit for bit. */
static void check_case(kern_threadpool_t *pool, size_t n, const int off[6], int gbf16, int pbf16,
                       const kern_adamw_params_t *hp, uint64_t seed) {
    char what[160];
    snprintf(what, sizeof what, "n=%zu off=%d,%d,%d,%d grad=%s copy=%s wd=%g scale=%g t=%lld", n,
             off[0], off[1], off[2], off[3], gbf16 ? "bf16" : "f32", pbf16 ? "bf16" : "none",
             (double)hp->weight_decay, (double)hp->grad_scale, (long long)hp->step);
    state_t in, ref;
    state_init(&in, n, off);
    state_init(&ref, n, off);
    state_fill(&in, seed);
    state_copy(&ref, &in);
    run(NULL, KERN_ISA_SCALAR, &ref, gbf16, pbf16, hp);
    check_vs_ref(what, hp, &in, &ref, gbf16);
    if (pbf16) check_bf16_copy(&ref, what);
    /* out of place: every path on the small sizes; on the large one the
     * widest only (the scalar loop is the in-place one, and the vector
     * bodies are the same at every size; the sanitizer builds stay fast) */
    const int small = n <= 5000;
    if (small) check_out_of_place(NULL, KERN_ISA_SCALAR, &in, &ref, off, gbf16, pbf16, hp, what);
    for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
        if (!kern_cpu_isa_supported(k_isas[k])) continue;
        if (small || k_isas[k] == kern_cpu_isa_best())
            check_out_of_place(pool, k_isas[k], &in, &ref, off, gbf16, pbf16, hp, what);
        state_t out;
        state_init(&out, n, off);
        state_copy(&out, &in);
        run(pool, k_isas[k], &out, gbf16, pbf16, hp);
        char w2[200];
        snprintf(w2, sizeof w2, "%s [%s]", what, kern_cpu_isa_name(k_isas[k]));
        same_bits(&ref, &out, pbf16, w2);
        state_free(&out);
    }
    state_free(&in);
    state_free(&ref);
}

static void test_lengths_and_offsets(kern_threadpool_t *pool) {
    static const size_t lens[] = {1, 7, 15, 16, 17, 33, 4099, 1000003};
    static const int offs[][6] = {{0, 0, 0, 0, 0, 0}, {1, 2, 3, 1, 3, 1}, {3, 1, 0, 2, 1, 2},
                                  {2, 3, 1, 3, 2, 3}};
    uint64_t seed = 1;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++) {
        for (size_t oi = 0; oi < sizeof offs / sizeof offs[0]; oi++) {
            for (int variant = 0; variant < 4; variant++) {
                /* all four grad/copy combinations on small sizes; on the
                 * large one two suffice (the vector bodies are the same) */
                if (lens[li] > 5000 && oi > 1) continue;
                kern_adamw_params_t hp = default_hp();
                if (variant & 1) hp.weight_decay = 0.0f;
                if (variant & 2) hp.grad_scale = 0.37f;
                check_case(pool, lens[li], offs[oi], variant & 1, (variant >> 1) & 1, &hp,
                           seed++);
            }
        }
    }
}

/* Five steps, t = 1..5: each checked against the reference from the state
 * before it, all paths bit-identical at the end. Also the step count must
 * matter (bias correction), and lerp's large-weight branch (beta1 < 0.5). */
static void test_multistep(kern_threadpool_t *pool) {
    const size_t n = 12345;
    const int off[6] = {1, 0, 2, 3, 0, 1};
    for (int lerp_large = 0; lerp_large < 2; lerp_large++) {
        kern_adamw_params_t hp = default_hp();
        if (lerp_large) hp.beta1 = 0.3f;
        state_t cur[3], prev;
        state_init(&prev, n, off);
        for (int k = 0; k < 3; k++) {
            state_init(&cur[k], n, off);
            state_fill(&cur[k], 99);
        }
        for (int t = 1; t <= 5; t++) {
            hp.step = t;
            state_copy(&prev, &cur[0]);
            run(NULL, KERN_ISA_SCALAR, &cur[0], 0, 1, &hp);
            char what[80];
            snprintf(what, sizeof what, "multistep t=%d beta1=%g", t, (double)hp.beta1);
            check_vs_ref(what, &hp, &prev, &cur[0], 0);
            for (int k = 1; k < 3; k++)
                if (kern_cpu_isa_supported(k_isas[k - 1]))
                    run(pool, k_isas[k - 1], &cur[k], 0, 1, &hp);
            /* next step's gradient */
            uint64_t r = 1000 + (uint64_t)t;
            for (size_t i = 0; i < n; i++) {
                const float g = rng_unif(&r) * 1e-2f;
                for (int k = 0; k < 3; k++) cur[k].g[i] = g;
            }
        }
        for (int k = 1; k < 3; k++)
            if (kern_cpu_isa_supported(k_isas[k - 1]))
                same_bits(&cur[0], &cur[k], 1, kern_cpu_isa_name(k_isas[k - 1]));
        for (int k = 0; k < 3; k++) state_free(&cur[k]);
        state_free(&prev);
    }
    /* t enters through the bias corrections: t=1 and t=1000 must differ */
    state_t a, b;
    state_init(&a, 64, off);
    state_init(&b, 64, off);
    state_fill(&a, 5);
    state_copy(&b, &a);
    kern_adamw_params_t hp = default_hp();
    run(NULL, KERN_ISA_AUTO, &a, 0, 0, &hp);
    hp.step = 1000;
    run(NULL, KERN_ISA_AUTO, &b, 0, 0, &hp);
    EXPECT(memcmp(a.p, b.p, 64 * 4) != 0, "step count 1 vs 1000 gave the same p");
    state_free(&a);
    state_free(&b);
}

/* Same bits with 1, 2 and 4 threads (and no pool), through the public
 * entry point kern_adamw_cpu_pool (pool NULL: the calling thread). */
static void test_determinism(void) {
    const size_t n = 1000003;
    const int off[6] = {0, 1, 2, 3, 0, 0};
    kern_threadpool_t *pools[3] = {kern_threadpool_create(1), kern_threadpool_create(2),
                                   kern_threadpool_create(4)};
    state_t base, out;
    state_init(&base, n, off);
    state_init(&out, n, off);
    state_fill(&base, 7);
    kern_adamw_params_t hp = default_hp();
    hp.step = 3;
    state_t ref;
    state_init(&ref, n, off);
    state_copy(&ref, &base);
    const kern_moments_t rm = {.fmt = KERN_MOMENTS_F32, .m = ref.m, .v = ref.v};
    kern_adamw_cpu_pool(NULL, ref.p, &rm, NULL, ref.gb, ref.pb, n, &hp);
    for (int k = 0; k < 3; k++) {
        state_copy(&out, &base);
        const kern_moments_t om = {.fmt = KERN_MOMENTS_F32, .m = out.m, .v = out.v};
        kern_adamw_cpu_pool(pools[k], out.p, &om, NULL, out.gb, out.pb, n, &hp);
        char what[64];
        snprintf(what, sizeof what, "determinism, %d threads", kern_threadpool_size(pools[k]));
        same_bits(&ref, &out, 1, what);
        kern_threadpool_destroy(pools[k]);
    }
    state_free(&base);
    state_free(&out);
    state_free(&ref);
}

/* The bf16 copy on awkward values: ties (low half exactly 0x8000, both
 * parities), values that round up into the next binade or to infinity,
 * NaN, infinities, subnormals. lr = 0 leaves p as it was, so the copy must
 * be exactly mt_f32_to_bf16 of those bit patterns. A NaN gradient must turn
 * p, m, v into NaN on every path. */
static void test_special_values(kern_threadpool_t *pool) {
    const size_t n = 100;
    const int off[6] = {0, 0, 0, 0, 0, 0};
    static const uint32_t pats[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f7fffffu,
                                    0x7f7fffffu, 0x7f7f8000u, 0xff7fffffu, 0x7f800000u,
                                    0xff800000u, 0x7fc00001u, 0xffa00000u, 0x00000001u,
                                    0x80008000u, 0x00018000u, 0x00000000u, 0xbf808000u};
    state_t in, ref;
    state_init(&in, n, off);
    state_init(&ref, n, off);
    state_fill(&in, 11);
    for (size_t i = 0; i < n; i++) {
        uint32_t u = pats[i % (sizeof pats / sizeof pats[0])];
        if (i >= 64) u = (uint32_t)(i * 2654435761u) | 0x8000u; /* random ties */
        memcpy(&in.p[i], &u, 4);
    }
    kern_adamw_params_t hp = default_hp();
    hp.lr = 0.0f;
    state_copy(&ref, &in);
    run(NULL, KERN_ISA_SCALAR, &ref, 0, 1, &hp);
    for (size_t i = 0; i < n; i++) {
        const uint16_t want = mt_f32_to_bf16(in.p[i]);
        EXPECT(isnan(in.p[i]) ? isnan(mt_bf16_to_f32(ref.pb[i])) : ref.pb[i] == want,
               "special values: bf16 copy of %a is %04x, want %04x", in.p[i], ref.pb[i], want);
    }
    for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
        if (!kern_cpu_isa_supported(k_isas[k])) continue;
        state_t out;
        state_init(&out, n, off);
        state_copy(&out, &in);
        run(pool, k_isas[k], &out, 0, 1, &hp);
        same_bits(&ref, &out, 1, "special values");
        state_free(&out);
    }
    for (kern_cpu_isa_t isa = KERN_ISA_SCALAR; isa <= KERN_ISA_AVX512; isa++)
        if (kern_cpu_isa_supported(isa)) check_out_of_place(pool, isa, &in, &ref, off, 0, 1, &hp, "special values");
    /* Extreme moments and gradients: v from 0 through subnormals to FLT_MAX
     * and infinity, gradients from subnormal to overflowing g*g. Every path
     * must agree (the division and sqrt edge cases). */
    static const float vs[] = {0.0f, 0x1p-149f, 0x1p-126f, 1e-30f, 3.4e38f, INFINITY, 1e-8f};
    static const float gs[] = {0.0f, -0.0f, 0x1p-149f, 1e-30f, -1e19f, 3e30f, 1e-3f, -7.5f};
    const size_t nx = sizeof vs / sizeof vs[0], ngx = sizeof gs / sizeof gs[0];
    state_t ex, exref;
    state_init(&ex, nx * ngx, off);
    state_init(&exref, nx * ngx, off);
    state_fill(&exref, 13);
    for (size_t a = 0; a < nx; a++)
        for (size_t b = 0; b < ngx; b++) {
            exref.v[a * ngx + b] = vs[a];
            exref.g[a * ngx + b] = gs[b];
        }
    const kern_adamw_params_t hp_ex = default_hp();
    state_copy(&ex, &exref);
    run(NULL, KERN_ISA_SCALAR, &exref, 0, 1, &hp_ex);
    for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++) {
        if (!kern_cpu_isa_supported(k_isas[k])) continue;
        state_t out;
        state_init(&out, nx * ngx, off);
        state_copy(&out, &ex);
        run(pool, k_isas[k], &out, 0, 1, &hp_ex);
        same_bits(&exref, &out, 1, "extreme v and g");
        state_free(&out);
    }
    for (kern_cpu_isa_t isa = KERN_ISA_SCALAR; isa <= KERN_ISA_AVX512; isa++)
        if (kern_cpu_isa_supported(isa))
            check_out_of_place(pool, isa, &ex, &exref, off, 0, 1, &hp_ex, "extreme v and g");
    state_free(&ex);
    state_free(&exref);

    /* NaN gradient */
    state_copy(&ref, &in);
    state_fill(&ref, 12);
    ref.g[37] = NAN;
    const kern_adamw_params_t hp_nan = default_hp();
    for (kern_cpu_isa_t isa = KERN_ISA_SCALAR; isa <= KERN_ISA_AVX512; isa++) {
        if (!kern_cpu_isa_supported(isa)) continue;
        state_t out;
        state_init(&out, n, off);
        state_copy(&out, &ref);
        run(pool, isa, &out, 0, 0, &hp_nan);
        EXPECT(isnan(out.p[37]) && isnan(out.m[37]) && isnan(out.v[37]) && !isnan(out.p[36]) &&
                   !isnan(out.p[38]),
               "[%s] a NaN gradient must make that element's p, m, v NaN and no other",
               kern_cpu_isa_name(isa));
        state_free(&out);
    }
    state_free(&in);
    state_free(&ref);
}

int main(void) {
    printf("best path on this CPU: %s\n", kern_cpu_isa_name(kern_cpu_isa_best()));
    for (size_t k = 0; k < sizeof k_isas / sizeof k_isas[0]; k++)
        if (!kern_cpu_isa_supported(k_isas[k]))
            printf("note: this CPU has no %s; that path is not tested here\n",
                   kern_cpu_isa_name(k_isas[k]));
    kern_threadpool_t *pool = kern_threadpool_create(2);
    test_lengths_and_offsets(pool);
    test_multistep(pool);
    test_determinism();
    test_special_values(pool);
    kern_threadpool_destroy(pool);
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("all AdamW checks passed\n");
    return 0;
}
