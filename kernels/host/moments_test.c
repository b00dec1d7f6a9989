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

int main(void) {
    test_quantizer();
    test_stochastic_rounding();
    test_formats();
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("moments_test: ok\n");
    return 0;
}
