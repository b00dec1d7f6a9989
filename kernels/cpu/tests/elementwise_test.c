/* Element-wise ops (kernels/elementwise.h): SwiGLU forward against a double
 * reference and backward against finite differences (also with dg/du
 * aliasing g/u, which the contract allows), the bf16 backward too; bias forward and backward
 * (accumulate); add (aliased output), axpy, scale, sumsq, bf16 round trips;
 * clamp forward and backward. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "base/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/host/threadpool.h"

/* FD on element-wise ops: each perturbation changes one output, so L's
 * rounding noise is ~1 ulp of an O(1) value (1e-7) over 2h = 2e-3, ~1e-4
 * absolute; SiLU's third derivative is O(1), truncation ~h^2 = 1e-6. */
#define FD_EPS 1e-3
#define GRAD_NORM_TOL 1e-3
#define GRAD_ELEM_RTOL 1e-2
#define GRAD_FLOOR 0.05

typedef struct {
    tu_env_t *env;
    float *g, *u, *h, *R, *y0, *b;
    int rows, cols;
} ctx_t;

static double swiglu_loss(void *p) {
    ctx_t *c = p;
    const size_t n = (size_t)c->rows * c->cols;
    kern_swiglu_fwd_cpu(c->env->s, c->h, c->g, c->u, n);
    return tu_dot(c->h, c->R, n);
}

/* The bf16 SwiGLU's backward against FD of the fp32 forward on the same
 * (bf16-exact) g and u: its dg and du are the exact gradient rounded once
 * to bf16, so on top of FD's noise each element may be off by half a bf16
 * ulp, 2^-9 of it (inside GRAD_ELEM_RTOL), and the whole by up to 2^-9 in
 * norm, which replaces GRAD_NORM_TOL (1e-3 < 2^-9 ~ 2e-3 would fail on
 * the rounding alone, which autocast's bf16 gradients carry too). */
static void test_swiglu_bf16(tu_env_t *env) {
    printf("swiglu bf16 backward\n");
    tu_rng_t rng;
    tu_rng_seed(&rng, 22);
    const int rows = 5, cols = 41; /* 205: full 16-lane blocks and a scalar tail */
    const size_t n = (size_t)rows * cols;
    ctx_t c = {.env = env, .rows = rows, .cols = cols};
    c.g = tu_rand(&rng, n, 4.0f);
    c.u = tu_rand(&rng, n, 1.0f);
    c.R = tu_rand(&rng, n, 1.0f);
    c.h = tu_alloc(n);
    uint16_t *g16 = malloc(n * 2), *u16 = malloc(n * 2), *r16 = malloc(n * 2), *dg16 = malloc(n * 2),
             *du16 = malloc(n * 2);
    MT_CHECK(g16 && u16 && r16 && dg16 && du16, "out of memory for bf16 swiglu buffers");
    mt_convert_from_f32(g16, MT_BF16, c.g, n);
    mt_convert_from_f32(u16, MT_BF16, c.u, n);
    mt_convert_from_f32(r16, MT_BF16, c.R, n);
    mt_convert_to_f32(c.g, g16, MT_BF16, n); /* the FD runs on the exact widened values */
    mt_convert_to_f32(c.u, u16, MT_BF16, n);
    mt_convert_to_f32(c.R, r16, MT_BF16, n);
    kern_swiglu_bwd_bf16_cpu(env->s, dg16, du16, r16, g16, u16, n);
    float *dg = tu_alloc(n), *du = tu_alloc(n);
    mt_convert_to_f32(dg, dg16, MT_BF16, n);
    mt_convert_to_f32(du, du16, MT_BF16, n);
    double *fg = tu_alloc_d(n), *fu = tu_alloc_d(n);
    tu_fd_grad(swiglu_loss, &c, c.g, n, FD_EPS, 1.0, fg);
    tu_fd_grad(swiglu_loss, &c, c.u, n, FD_EPS, 1.0, fu);
    tu_check_grad("swiglu bf16 dg", dg, fg, n, 0x1p-9 + GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    tu_check_grad("swiglu bf16 du", du, fu, n, 0x1p-9 + GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    /* dg over g, du over u, as the experts' backward calls it */
    kern_swiglu_bwd_bf16_cpu(env->s, g16, u16, r16, g16, u16, n);
    tu_expect(memcmp(g16, dg16, n * 2) == 0 && memcmp(u16, du16, n * 2) == 0,
              "swiglu bf16 backward aliased onto g/u differs from the separate call");
    free(c.g); free(c.u); free(c.R); free(c.h); free(g16); free(u16); free(r16); free(dg16); free(du16);
    free(dg); free(du); free(fg); free(fu);
}

static double bias_loss(void *p) {
    ctx_t *c = p;
    const size_t n = (size_t)c->rows * c->cols;
    memcpy(c->h, c->y0, n * sizeof *c->h);
    kern_bias_fwd_cpu(c->env->s, c->h, c->b, c->rows, c->cols);
    return tu_dot(c->h, c->R, n);
}

static void test_swiglu(tu_env_t *env) {
    printf("swiglu\n");
    tu_rng_t rng;
    tu_rng_seed(&rng, 21);
    const int rows = 6, cols = 37;
    const size_t n = (size_t)rows * cols;
    ctx_t c = {.env = env, .rows = rows, .cols = cols};
    c.g = tu_rand(&rng, n, 4.0f); /* covers silu's negative dip and saturation */
    c.u = tu_rand(&rng, n, 1.0f);
    c.R = tu_rand(&rng, n, 1.0f);
    c.h = tu_alloc(n);
    c.g[0] = 30.0f; /* sigmoid saturates to 1 */
    c.g[1] = -30.0f;
    c.g[2] = 0.0f;

    kern_swiglu_fwd_cpu(env->s, c.h, c.g, c.u, n);
    double *ref = tu_alloc_d(n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)c.g[i] / (1.0 + exp(-(double)c.g[i])) * c.u[i];
    /* expf, a divide and two products: a few ulp */
    tu_check_close("swiglu forward", c.h, ref, n, 1e-6, 1e-7);

    float *dg = tu_alloc(n), *du = tu_alloc(n);
    tu_fill_nan(dg, n);
    tu_fill_nan(du, n);
    kern_swiglu_bwd_cpu(env->s, dg, du, c.R, c.g, c.u, n);
    double *fg = tu_alloc_d(n), *fu = tu_alloc_d(n);
    tu_fd_grad(swiglu_loss, &c, c.g, n, FD_EPS, 1.0, fg);
    tu_fd_grad(swiglu_loss, &c, c.u, n, FD_EPS, 1.0, fu);
    tu_check_grad("swiglu dg", dg, fg, n, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);
    tu_check_grad("swiglu du", du, fu, n, GRAD_NORM_TOL, GRAD_ELEM_RTOL, GRAD_FLOOR);

    /* aliasing allowed by the contract: dg over g, du over u */
    float *ga = tu_copy(c.g, n), *ua = tu_copy(c.u, n);
    kern_swiglu_bwd_cpu(env->s, ga, ua, c.R, ga, ua, n);
    tu_check_bitwise("swiglu dg aliased onto g", ga, dg, n);
    tu_check_bitwise("swiglu du aliased onto u", ua, du, n);

    free(c.g); free(c.u); free(c.R); free(c.h); free(ref);
    free(dg); free(du); free(fg); free(fu); free(ga); free(ua);
}

static void test_bias(tu_env_t *env) {
    printf("bias\n");
    tu_rng_t rng;
    tu_rng_seed(&rng, 22);
    const int rows = 5, cols = 13;
    const size_t n = (size_t)rows * cols;
    ctx_t c = {.env = env, .rows = rows, .cols = cols};
    c.y0 = tu_rand(&rng, n, 1.0f);
    c.b = tu_rand(&rng, (size_t)cols, 1.0f);
    c.R = tu_rand(&rng, n, 1.0f);
    c.h = tu_copy(c.y0, n);
    kern_bias_fwd_cpu(env->s, c.h, c.b, rows, cols);
    double *ref = tu_alloc_d(n);
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < cols; j++)
            ref[(size_t)r * cols + j] = (double)c.y0[(size_t)r * cols + j] + c.b[j];
    tu_check_close("bias forward (y += b)", c.h, ref, n, 1e-7, 0); /* one rounding */

    float *db = tu_alloc((size_t)cols);
    for (int j = 0; j < cols; j++) db[j] = 1.0f; /* accumulate onto 1 */
    kern_bias_bwd_cpu(env->s, db, c.R, rows, cols);
    for (int j = 0; j < cols; j++) db[j] -= 1.0f;
    double *fb = tu_alloc_d((size_t)cols);
    tu_fd_grad(bias_loss, &c, c.b, (size_t)cols, FD_EPS, 1.0, fb);
    tu_check_grad("bias db (accumulated onto 1)", db, fb, (size_t)cols, GRAD_NORM_TOL,
                  GRAD_ELEM_RTOL, GRAD_FLOOR);
    free(c.y0); free(c.b); free(c.R); free(c.h); free(ref); free(db); free(fb);
}

static void test_misc(tu_env_t *env) {
    printf("add / axpy / scale / sumsq / bf16\n");
    tu_rng_t rng;
    tu_rng_seed(&rng, 23);
    const size_t n = 1000;
    float *a = tu_rand(&rng, n, 2.0f), *b = tu_rand(&rng, n, 2.0f), *y = tu_alloc(n);
    double *ref = tu_alloc_d(n);

    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] + b[i];
    kern_add_cpu(env->s, y, a, b, n);
    tu_check_close("add", y, ref, n, 1e-7, 0);
    float *a2 = tu_copy(a, n);
    kern_add_cpu(env->s, a2, a2, b, n); /* y may alias a */
    tu_check_bitwise("add with y aliasing a", a2, y, n);

    memcpy(y, a, n * sizeof *y);
    kern_axpy_cpu(env->s, y, -0.75f, b, n);
    for (size_t i = 0; i < n; i++) ref[i] = (double)a[i] - 0.75 * b[i];
    tu_check_close("axpy", y, ref, n, 2.5e-7, 1e-7); /* product + sum, <= 2 roundings (or 1 with FMA) */

    memcpy(y, a, n * sizeof *y);
    kern_scale_cpu(env->s, y, 3.0f, n);
    for (size_t i = 0; i < n; i++) ref[i] = 3.0 * a[i];
    tu_check_close("scale", y, ref, n, 1e-7, 0);

    float ss = -1.0f;
    kern_sumsq_cpu(env->s, &ss, a, n);
    double ssr = 0;
    for (size_t i = 0; i < n; i++) ssr += (double)a[i] * a[i];
    /* accumulated in double then rounded once: within 1 ulp */
    tu_expect(fabs(ss - ssr) <= 1.2e-7 * ssr, "sumsq %.9g vs %.9g", (double)ss, ssr);
    /* the host variant on pools of any size (or none): the same bits, over
     * enough elements for many tasks */
    const size_t big = 200003;
    float *x = malloc(big * sizeof *x);
    MT_CHECK_ALLOC(x, "sumsq input");
    for (size_t i = 0; i < big; i++) x[i] = (float)((i * 2654435761u) % 10007) * 1e-3f - 5.0f;
    float on_stream = -1.0f;
    kern_sumsq_cpu(env->s, &on_stream, x, big);
    for (int threads = 0; threads <= 3; threads++) {
        kern_threadpool_t *pool = threads ? kern_threadpool_create(threads) : NULL;
        float hs = -1.0f;
        kern_sumsq_host(pool, &hs, x, big);
        tu_expect(memcmp(&hs, &on_stream, sizeof hs) == 0, "sumsq on a host pool of %d: %.9g, on the stream %.9g",
                  threads, (double)hs, (double)on_stream);
        if (pool) kern_threadpool_destroy(pool);
    }
    free(x);
    kern_sumsq_cpu(env->s, &ss, a, 0);
    tu_expect(ss == 0.0f, "sumsq of 0 elements overwrites with 0, got %g", (double)ss);

    uint16_t *h = malloc(n * sizeof *h);
    MT_CHECK_ALLOC(h, "bf16 buffer");
    a[0] = 1.00390625f;  /* exactly halfway between two bf16 values: ties to even (1.0) */
    a[1] = 1.01171875f;  /* halfway, rounds up to the even 1.015625 */
    a[2] = -0.0f;
    a[3] = INFINITY;
    a[4] = NAN;
    a[5] = FLT_MAX; /* rounds up past the largest bf16: inf, as torch gives */
    a[6] = 1e-40f;  /* subnormal */
    kern_f32_to_bf16_cpu(env->s, h, a, n);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad += h[i] != mt_f32_to_bf16(a[i]);
    tu_expect(bad == 0, "f32_to_bf16: %d of %zu differ from dtype.h's rounding", bad, n);
    tu_expect(h[0] == 0x3f80 && h[1] == 0x3f82, "bf16 ties to even: got %#x %#x", h[0], h[1]);
    tu_expect((h[4] & 0x7f80) == 0x7f80 && (h[4] & 0x7f) != 0, "bf16 of NaN must be NaN, got %#x",
              h[4]);
    tu_expect(h[5] == 0x7f80, "bf16 of FLT_MAX must round to +inf (0x7f80), got %#x", h[5]);
    kern_bf16_to_f32_cpu(env->s, y, h, n);
    bad = 0;
    for (size_t i = 0; i < n; i++) {
        if (isnan(a[i])) { bad += !isnan(y[i]); continue; }
        if (isinf(a[i]) || a[i] == FLT_MAX) { bad += !isinf(y[i]); continue; }
        if (fabsf(a[i]) < FLT_MIN) { bad += fabsf(y[i] - a[i]) > 0x1p-133f; continue; } /* subnormal: absolute ulp */
        /* bf16 keeps 8 significant bits: half an ulp is <= 2^-8 relative */
        bad += fabsf(y[i] - a[i]) > fabsf(a[i]) * 0x1p-8f;
    }
    tu_expect(bad == 0, "bf16 round trip: %d elements off by more than 2^-8 relative", bad);
    free(a); free(b); free(y); free(ref); free(a2); free(h);
}

/* clamp (clip_qkv): values inside, at and beyond +-c, NaN; the backward
 * passes the gradient exactly where torch's clamp does (inclusive bounds),
 * also in place. */
static void test_clamp(tu_env_t *env) {
    const float c = 1.5f;
    const float x[] = {-3.0f, -1.5f, -1.4999999f, 0.0f, 0.7f, 1.5f, 1.5000001f, 8.0f, NAN};
    const float want[] = {-1.5f, -1.5f, -1.4999999f, 0.0f, 0.7f, 1.5f, 1.5f, 1.5f, NAN};
    const float pass[] = {0, 1, 1, 1, 1, 1, 0, 0, 0};
    enum { N = sizeof x / sizeof x[0] };
    float y[N], dy[N], dx[N];
    kern_clamp_fwd_cpu(env->s, y, x, c, N);
    int bad = 0;
    for (int i = 0; i < N; i++) bad += isnan(want[i]) ? !isnan(y[i]) : y[i] != want[i];
    tu_expect(bad == 0, "clamp_fwd: %d of %d wrong", bad, N);
    for (int i = 0; i < N; i++) dy[i] = 0.25f * (float)(i + 1);
    kern_clamp_bwd_cpu(env->s, dx, dy, x, c, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += dx[i] != pass[i] * dy[i];
    tu_expect(bad == 0, "clamp_bwd: %d of %d wrong (the gradient passes where -c <= x <= c)", bad, N);
    memcpy(y, x, sizeof y);
    kern_clamp_fwd_cpu(env->s, y, y, c, N); /* in place */
    kern_clamp_bwd_cpu(env->s, dy, dy, x, c, N);
    bad = 0;
    for (int i = 0; i < N; i++) bad += (isnan(want[i]) ? !isnan(y[i]) : y[i] != want[i]) || dy[i] != dx[i];
    tu_expect(bad == 0, "clamp in place: %d of %d differ", bad, N);
}

int main(void) {
    tu_env_t env = tu_env_open();
    test_swiglu(&env);
    test_swiglu_bf16(&env);
    test_bias(&env);
    test_misc(&env);
    test_clamp(&env);
    tu_env_close(&env);
    return tu_finish("elementwise_test");
}
