/* The lighter AdamW moment formats on the host (moments.c): the 8-bit
 * quantizer against bitsandbytes' definition (every map value is its own
 * code, a value between two neighbours goes to the nearer, m never changes
 * sign), the stochastic rounding (unbiased, deterministic, exact on bf16
 * values), the whole update against fp32 moments, and the same bits for
 * any thread count. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/host/adamw_host.h"
#include "kernels/host/moments_simd.h"
#include "kernels/math/moments_math.h"
#include "kernels/math/moments_qmap.h"

static int failures;
#define EXPECT(c)                                                         \
    do {                                                                  \
        if (!(c)) {                                                       \
            fprintf(stderr, "%s:%d: expected %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                   \
        }                                                                 \
    } while (0)

static uint64_t rng = 0x1234567;
static float urand(void) { /* [0, 1) */
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng >> 40) / (float)(1u << 24);
}

static void test_quantizer(void) {
    const float *qs = kern_moments_qmap_signed, *qu = kern_moments_qmap_unsigned;
    EXPECT(qs[255] == 1.0f && qu[255] == 1.0f && qs[127] == 0.0f && qu[0] == 0.0f);
    for (int c = 1; c < 256; c++) EXPECT(qs[c] > qs[c - 1] && qu[c] > qu[c - 1]);
    /* each map value quantizes to its own code */
    for (int c = 0; c < 256; c++) {
        EXPECT(kern_moments_quantize(qu, 0, qu[c]) == c);
        EXPECT(kern_moments_quantize(qs, 1, qs[c]) == c);
    }
    /* a value between two neighbours goes to the nearer one */
    for (int k = 0; k < 20000; k++) {
        const float x = urand() * 2.0f - 1.0f;
        const int c = kern_moments_quantize(qs, 1, x);
        for (int d = 0; d < 256; d++) EXPECT(fabsf(qs[d] - x) >= fabsf(qs[c] - x) * (1 - 1e-6f));
        const float y = fabsf(x);
        const int cu = kern_moments_quantize(qu, 0, y);
        for (int d = 0; d < 256; d++) EXPECT(fabsf(qu[d] - y) >= fabsf(qu[cu] - y) * (1 - 1e-6f));
    }
    /* m never changes sign: a tiny negative m, nearest to the map's +0,
     * moves to the smallest negative code (bitsandbytes' sign fix) */
    EXPECT(qs[kern_moments_quantize_m(qs, 1e-30f, 1.0f)] == 0.0f);
    EXPECT(kern_moments_quantize_m(qs, -1e-30f, 1.0f) == 126 && qs[126] < 0.0f);
    EXPECT(kern_moments_quantize_m(qs, 0.0f, 0.0f) == 127 && kern_moments_quantize_v(qu, 0.0f, 0.0f) == 0);
}

static void test_stochastic_rounding(void) {
    /* exact on bf16 values; unbiased on average; the same bits for the same counter */
    const uint64_t key = kern_moments_sr_key(42, 7);
    for (int k = 0; k < 1000; k++) {
        const float b = mt_bf16_to_f32(mt_f32_to_bf16(urand() - 0.5f));
        EXPECT(kern_moments_bf16_sr(b, key, (uint64_t)k, 0) == mt_f32_to_bf16(b));
    }
    const float x = 1.0f + 1.0f / 512.0f; /* a quarter of the way from 1 to the next bf16 (1 + 2^-7) */
    double sum = 0.0;
    const int N = 200000;
    for (int i = 0; i < N; i++) sum += mt_bf16_to_f32(kern_moments_bf16_sr(x, key, (uint64_t)i, 1));
    /* the mean of N draws of {1, 1 + 2^-7} with p = 1/4: sd of the mean 2^-7 * sqrt(3/16/N) ~ 7.6e-6 */
    EXPECT(fabs(sum / N - x) < 5e-5);
    EXPECT(kern_moments_bf16_sr(x, key, 5, 0) == kern_moments_bf16_sr(x, key, 5, 0));
    EXPECT(kern_moments_bf16_sr(INFINITY, key, 1, 0) == 0x7f80u);
}

typedef struct {
    float *p, *g;
    void *mom;
    size_t bytes;
} st_t;

static void st_init(st_t *s, kern_moments_fmt_t fmt, size_t n) {
    s->p = malloc(n * 4);
    s->g = malloc(n * 4);
    s->bytes = kern_moments_bytes(fmt, n);
    s->mom = calloc(1, s->bytes);
    rng = 99;
    for (size_t i = 0; i < n; i++) s->p[i] = urand() - 0.5f;
}

/* steps of AdamW with gradients from the step's own sequence */
static void st_run(st_t *s, kern_moments_fmt_t fmt, size_t n, kern_threadpool_t *pool, int steps) {
    kern_moments_t mv = kern_moments_view(fmt, s->mom, n, 77);
    for (int t = 1; t <= steps; t++) {
        rng = 1000 + (uint64_t)t;
        for (size_t i = 0; i < n; i++) s->g[i] = (urand() - 0.5f) * (1.0f + (float)(i % 7));
        const kern_adamw_params_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                        .weight_decay = 0.01f, .grad_scale = 1.0f, .step = t};
        kern_adamw_cpu_pool(pool, s->p, &mv, s->g, NULL, NULL, n, &hp);
    }
}

static void test_formats(void) {
    const size_t n = 300000 + 77; /* tasks of several blocks, a partial last block */
    const int steps = 20;
    st_t ref;
    st_init(&ref, KERN_MOMENTS_F32, n);
    st_run(&ref, KERN_MOMENTS_F32, n, NULL, steps);
    float *rm = malloc(n * 4), *rv = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4);
    kern_moments_t rview = kern_moments_view(KERN_MOMENTS_F32, ref.mom, n, 0);
    kern_moments_to_f32(&rview, n, rm, rv);
    kern_threadpool_t *pools[2] = {kern_threadpool_create(2), kern_threadpool_create(3)};
    for (int f = KERN_MOMENTS_BF16; f <= KERN_MOMENTS_8BIT; f++) {
        const kern_moments_fmt_t fmt = (kern_moments_fmt_t)f;
        st_t a;
        st_init(&a, fmt, n);
        st_run(&a, fmt, n, NULL, steps);
        /* the same bits on any thread count */
        for (int k = 0; k < 2; k++) {
            st_t b;
            st_init(&b, fmt, n);
            st_run(&b, fmt, n, pools[k], steps);
            EXPECT(memcmp(a.p, b.p, n * 4) == 0 && memcmp(a.mom, b.mom, a.bytes) == 0);
            free(b.p), free(b.g), free(b.mom);
        }
        /* close to fp32 moments: the update is normalized (|step| <= lr per
         * element and step), so the master drifts by a fraction of lr*steps */
        kern_moments_t av = kern_moments_view(fmt, a.mom, n, 77);
        kern_moments_to_f32(&av, n, m, v);
        double dp = 0, mp = 0, dm = 0, nm = 0, dv = 0, nv = 0;
        for (size_t i = 0; i < n; i++) {
            dp += fabs((double)a.p[i] - ref.p[i]) / (double)n;
            mp = fmax(mp, fabs((double)a.p[i] - ref.p[i]));
            EXPECT(isfinite(a.p[i]));
            dm += fabs((double)m[i] - rm[i]), nm += fabs(rm[i]);
            dv += fabs((double)v[i] - rv[i]), nv += fabs(rv[i]);
        }
        printf("%s: mean |p - p_fp32| %.3g, max %.3g (lr*steps %.3g), mean rel. error m %.3g v %.3g\n",
               kern_moments_fmt_name(fmt), dp, mp, 1e-3 * steps, dm / nm, dv / nv);
        /* an element whose v rounds low in its block moves further than
         * with fp32 moments (8-bit), so the bound is on the mean */
        EXPECT(dp < (fmt == KERN_MOMENTS_BF16 ? 0.01 : 0.1) * 1e-3 * steps);
        /* bf16 keeps 8 bits, the 8-bit map about 2-5 significant bits near a block's top */
        EXPECT(dm / nm < (fmt == KERN_MOMENTS_BF16 ? 0.01 : 0.1));
        EXPECT(dv / nv < (fmt == KERN_MOMENTS_BF16 ? 0.01 : 0.1));
        /* bf16: to_f32 then from_f32 holds the same state (a resume reads
         * bf16 moments so); 8-bit is not closed under it (a block's
         * absmax element may sit on code 0, -0.9937), so checkpoints keep
         * its codes and scales as they are */
        if (fmt == KERN_MOMENTS_BF16) {
            void *copy = calloc(1, a.bytes);
            kern_moments_t cv = kern_moments_view(fmt, copy, n, 77);
            kern_moments_from_f32(&cv, n, m, v);
            EXPECT(memcmp(copy, a.mom, a.bytes) == 0);
            free(copy);
        }
        free(a.p), free(a.g), free(a.mom);
    }
    kern_threadpool_destroy(pools[0]);
    kern_threadpool_destroy(pools[1]);
    free(rm), free(rv), free(m), free(v);
    free(ref.p), free(ref.g), free(ref.mom);
    /* sizes: fp32 8 bytes per element, bf16 4, 8-bit 2 plus 8 bytes per 256 */
    EXPECT(kern_moments_bytes(KERN_MOMENTS_F32, 1 << 20) == 8u << 20);
    EXPECT(kern_moments_bytes(KERN_MOMENTS_BF16, 1 << 20) == 4u << 20);
    EXPECT(kern_moments_bytes(KERN_MOMENTS_8BIT, 1 << 20) == (2u << 20) + 2 * 4 * 4096);
}

/* A block's values for the quantizer edge cases: the map's values, the
 * midpoints between neighbours and the floats just beside them (where the
 * search's tie rule decides), signed zeros, tiny values (m's sign fix),
 * NaN; element 0 sets the block's absmax to 1 so x = value exactly. */
static void edge_block(float *b, const float *q, int blk, float sign) {
    b[0] = 1.0f;
    for (int k = 1; k < 256; k++) {
        const int c = (k + blk * 37) % 255;
        const float mid = (q[c] + q[c + 1]) * 0.5f;
        switch ((k + blk) % 6) {
        case 0: b[k] = q[c]; break;
        case 1: b[k] = mid; break;
        case 2: b[k] = nextafterf(mid, 2.0f); break;
        case 3: b[k] = nextafterf(mid, -2.0f); break;
        case 4: b[k] = (k & 1 ? -1e-30f : 1e-30f) * (float)k; break;
        default: b[k] = k == 5 ? NAN : k == 11 ? -0.0f : k == 17 ? 0.0f : urand() * 2.0f - 1.0f;
        }
        if (sign > 0.0f && !isnan(b[k])) b[k] = fabsf(b[k]);
    }
}

/* The SIMD stores give the scalar definition's bits, edge cases included. */
static void test_simd_store(void) {
    const float *qs = kern_moments_qmap_signed, *qu = kern_moments_qmap_unsigned;
    kern_moments_q8_tables_t tabs;
    kern_moments_q8_tables_init(&tabs);
    const int avx2 = kern_cpu_isa_supported(KERN_ISA_AVX2), avx512 = kern_cpu_isa_supported(KERN_ISA_AVX512);
    if (!avx2) printf("moments_test: this CPU has no AVX2, the SIMD stores are not compared\n");
    for (int blk = 0; blk < 64 && avx2; blk++) {
        float mf[256], vf[256];
        edge_block(mf, qs, blk, -1.0f);
        edge_block(vf, qu, blk, 1.0f);
        if (blk == 1) memset(mf, 0, sizeof mf); /* absmax 0 */
        if (blk == 2) vf[9] = INFINITY;          /* absmax inf: x = 0 or NaN */
        uint8_t rm[256], rv[256], sm[256], sv[256];
        float am = 0.0f, av = 0.0f, sam = -1.0f, sav = -1.0f;
        for (int k = 0; k < 256; k++) am = fmaxf(am, fabsf(mf[k])), av = fmaxf(av, fabsf(vf[k]));
        for (int k = 0; k < 256; k++) {
            rm[k] = kern_moments_quantize_m(qs, mf[k], am);
            rv[k] = kern_moments_quantize_v(qu, vf[k], av);
        }
        for (int w = 0; w < 1 + avx512; w++) {
            if (w) kern_moments_8bit_store_avx512(&tabs, sm, sv, &sam, &sav, mf, vf);
            else kern_moments_8bit_store_avx2(sm, sv, &sam, &sav, mf, vf);
            EXPECT(memcmp(&sam, &am, 4) == 0 && memcmp(&sav, &av, 4) == 0);
            EXPECT(memcmp(sm, rm, 256) == 0 && memcmp(sv, rv, 256) == 0);
            if (w) {
                float em[256];
                kern_moments_8bit_expand_avx512(qs, sm, am, em);
                for (int k = 0; k < 256; k++) EXPECT(memcmp(&em[k], &(float){qs[sm[k]] * am}, 4) == 0);
            }
        }
        /* bf16: the same values, plus infinities and values that would round up to inf */
        mf[3] = INFINITY, mf[4] = -INFINITY, mf[6] = 0x1.fffffep127f, vf[7] = -0x1.ffffp127f;
        uint16_t bm[2][256], bv[2][256];
        const uint64_t key = kern_moments_sr_key(blk, 3), b = 256 * (uint64_t)blk;
        for (int w = 0; w < 1 + avx512; w++) {
            (w ? kern_moments_bf16_store_avx512 : kern_moments_bf16_store_avx2)(bm[w] - b, bv[w] - b, mf, vf, key, b);
            for (int k = 0; k < 256; k++) {
                EXPECT(bm[w][k] == kern_moments_bf16_sr(mf[k], key, b + k, 0));
                EXPECT(bv[w][k] == kern_moments_bf16_sr(vf[k], key, b + k, 1));
            }
        }
    }
}

/* The parts of two moments of n elements hold the same bytes (the padding between them aside). */
static int same_moments(const kern_moments_t *a, const kern_moments_t *b, size_t n) {
    const size_t eb = a->fmt == KERN_MOMENTS_F32 ? 4 : a->fmt == KERN_MOMENTS_BF16 ? 2 : 1;
    int same = memcmp(a->m, b->m, n * eb) == 0 && memcmp(a->v, b->v, n * eb) == 0;
    if (a->fmt == KERN_MOMENTS_8BIT)
        same = same && memcmp(a->m_absmax, b->m_absmax, kern_moments_blocks(n) * 4) == 0 &&
               memcmp(a->v_absmax, b->v_absmax, kern_moments_blocks(n) * 4) == 0;
    return same;
}

/* The out-of-place update of (p, mom) on `isa` over a 2-thread pool, from
 * copies into buffers holding stale values: *bad_out gets its finite flag;
 * the caller compares the destinations with the in-place update. */
typedef struct {
    float *ps, *pd;
    uint16_t *pb;
    void *ms, *md;
} oop_bufs_t;

static void oop_run(kern_threadpool_t *pool, kern_cpu_isa_t isa, kern_moments_fmt_t fmt, size_t n, oop_bufs_t *o,
                    const float *p, const void *mom, const float *g, const uint16_t *gh, const kern_adamw_params_t *hp,
                    int *bad_out) {
    const size_t bytes = kern_moments_bytes(fmt, n);
    memcpy(o->ps, p, n * 4);
    memcpy(o->ms, mom, bytes);
    memset(o->pd, 0x5a, n * 4);
    memset(o->md, 0xa5, bytes);
    const kern_moments_t src = kern_moments_view(fmt, o->ms, n, 77), dst = kern_moments_view(fmt, o->md, n, 77);
    kern_adamw_params_t h = *hp;
    *bad_out = 0;
    h.nonfinite = bad_out;
    kern_adamw_moments_isa_from(pool, isa, o->ps, &src, o->pd, &dst, g, gh, o->pb, n, &h);
    /* the sources as they were */
    EXPECT(memcmp(o->ps, p, n * 4) == 0 && memcmp(o->ms, mom, bytes) == 0);
}

/* The whole update on every path this CPU has: the scalar path's bits; and
 * out of place, the in-place update's bits with the sources untouched. */
static void test_paths(void) {
    kern_threadpool_t *pool = kern_threadpool_create(2);
    const size_t n = 5 * 256 + 77;
    const kern_cpu_isa_t isas[3] = {KERN_ISA_SCALAR, KERN_ISA_AVX2, KERN_ISA_AVX512};
    for (int f = KERN_MOMENTS_F32; f <= KERN_MOMENTS_8BIT; f++)
        for (int gb = 0; gb < 2; gb++) {
            float *p[3], *g = malloc(n * 4);
            uint16_t *gh = malloc(n * 2), *pb[3];
            void *mom[3];
            const size_t bytes = kern_moments_bytes((kern_moments_fmt_t)f, n);
            oop_bufs_t o = {malloc(n * 4), malloc(n * 4), malloc(n * 2), malloc(bytes), malloc(bytes)};
            for (int a = 0; a < 3; a++) {
                p[a] = malloc(n * 4), pb[a] = malloc(n * 2), mom[a] = calloc(1, bytes);
                rng = 5;
                for (size_t i = 0; i < n; i++) p[a][i] = urand() - 0.5f;
            }
            for (int t = 1; t <= 6; t++) {
                rng = 50 + (uint64_t)t;
                for (size_t i = 0; i < n; i++) {
                    /* gradients over many binades; zeros and a non-finite one in block 3 */
                    g[i] = (urand() - 0.5f) * ldexpf(1.0f, (int)(i % 41) - 30);
                    if (i % 97 == 0) g[i] = 0.0f;
                    gh[i] = mt_f32_to_bf16(g[i]);
                }
                if (t == 5) g[3 * 256 + 10] = NAN, gh[3 * 256 + 10] = 0x7fc0;
                const kern_adamw_params_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                                .weight_decay = 0.01f, .grad_scale = 1.0f, .step = t};
                for (int a = 0; a < 3; a++) {
                    if (!kern_cpu_isa_supported(isas[a])) continue;
                    kern_moments_t mv = kern_moments_view((kern_moments_fmt_t)f, mom[a], n, 77);
                    int bad = 0;
                    kern_adamw_params_t h = hp;
                    h.nonfinite = &bad;
                    int oop_bad = 0;
                    oop_run(pool, isas[a], (kern_moments_fmt_t)f, n, &o, p[a], mom[a], gb ? NULL : g, gb ? gh : NULL,
                            &hp, &oop_bad);
                    kern_adamw_moments_isa(NULL, isas[a], p[a], &mv, gb ? NULL : g, gb ? gh : NULL, pb[a], n, &h);
                    /* the fused check: the NaN gradient of step 5 stays in that element */
                    EXPECT(bad == (t >= 5));
                    const kern_moments_t od = kern_moments_view((kern_moments_fmt_t)f, o.md, n, 77);
                    EXPECT(oop_bad == bad);
                    EXPECT(memcmp(o.pd, p[a], n * 4) == 0 && memcmp(o.pb, pb[a], n * 2) == 0);
                    EXPECT(same_moments(&od, &mv, n));
                }
            }
            for (int a = 1; a < 3; a++) {
                if (!kern_cpu_isa_supported(isas[a])) continue;
                EXPECT(memcmp(p[a], p[0], n * 4) == 0 && memcmp(pb[a], pb[0], n * 2) == 0);
                EXPECT(memcmp(mom[a], mom[0], bytes) == 0);
            }
            for (int a = 0; a < 3; a++) free(p[a]), free(pb[a]), free(mom[a]);
            free(g), free(gh);
            free(o.ps), free(o.pd), free(o.pb), free(o.ms), free(o.md);
        }
    kern_threadpool_destroy(pool);
}

/* The fused finite check over the thread pool: any task's NaN or Inf
 * reaches the flag, wherever it is; a finite update leaves it 0. */
static void test_nonfinite_pool(void) {
    const size_t n = 200000 + 77;
    kern_threadpool_t *pool = kern_threadpool_create(3);
    float *p = malloc(n * 4), *g = malloc(n * 4);
    for (int f = KERN_MOMENTS_F32; f <= KERN_MOMENTS_8BIT; f++) {
        void *mom = calloc(1, kern_moments_bytes((kern_moments_fmt_t)f, n));
        kern_moments_t mv = kern_moments_view((kern_moments_fmt_t)f, mom, n, 9);
        const size_t at[4] = {(size_t)-1, 0, n / 2 + 3, n - 1};
        for (int k = 0; k < 4; k++) {
            rng = 7;
            for (size_t i = 0; i < n; i++) p[i] = urand() - 0.5f, g[i] = urand() - 0.5f;
            memset(mom, 0, kern_moments_bytes((kern_moments_fmt_t)f, n));
            if (k) p[at[k]] = k == 2 ? -INFINITY : NAN; /* the decay keeps it non-finite */
            int bad = 0;
            const kern_adamw_params_t hp = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                            .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 1, .nonfinite = &bad};
            kern_adamw_cpu_pool(pool, p, &mv, g, NULL, NULL, n, &hp);
            EXPECT(bad == (k != 0));
        }
        free(mom);
    }
    free(p), free(g);
    kern_threadpool_destroy(pool);
}

int main(void) {
    test_quantizer();
    test_stochastic_rounding();
    test_simd_store();
    test_paths();
    test_nonfinite_pool();
    test_formats();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("moments_test: ok\n");
    return 0;
}
