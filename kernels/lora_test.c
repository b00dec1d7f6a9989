/* kern_lora_fwd / kern_lora_bwd on the CPU device against finite
 * differences, with and without dropout.  The LoRA term is linear in each
 * of A, B and x separately, so a central difference with a step of 1 is
 * exact up to rounding: gradients must agree to fp32 accumulation noise. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device.h"
#include "kernels/lora.h"

static int failures;

enum { ROWS = 7, IN = 12, OUT = 9, R = 3 };

static float frand(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / 16777216.0f * 2.0f - 1.0f;
}

/* sum(dy * lora(x)) for host tensors, through the device. */
static double objective(kern_device_t *dev, const kern_lora_t *tmpl, const float *x, const float *a, const float *b,
                        const float *dy) {
    float *dx = kern_alloc(dev, sizeof(float) * ROWS * IN, "x", NULL);
    float *da = kern_alloc(dev, sizeof(float) * R * IN, "a", NULL);
    float *db = kern_alloc(dev, sizeof(float) * OUT * R, "b", NULL);
    float *dyv = kern_alloc(dev, sizeof(float) * ROWS * OUT, "y", NULL);
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    kern_memcpy_h2d(dev, s, dx, x, sizeof(float) * ROWS * IN);
    kern_memcpy_h2d(dev, s, da, a, sizeof(float) * R * IN);
    kern_memcpy_h2d(dev, s, db, b, sizeof(float) * OUT * R);
    kern_memset(dev, s, dyv, 0, sizeof(float) * ROWS * OUT);
    kern_lora_t l = *tmpl;
    l.a = da;
    l.b = db;
    mt_error_t err = {0};
    kern_lora_fwd(dev, MT_F32, &l, dyv, dx, MT_F32, ROWS, IN, OUT, &err);
    float y[ROWS * OUT];
    kern_memcpy_d2h(dev, s, y, dyv, sizeof y);
    kern_stream_sync(dev, s);
    double sum = 0;
    for (int i = 0; i < ROWS * OUT; i++) sum += (double)dy[i] * y[i];
    kern_free(dev, dx);
    kern_free(dev, da);
    kern_free(dev, db);
    kern_free(dev, dyv);
    return sum;
}

static void check(const char *what, const float *got, float *param, int n, kern_device_t *dev, const kern_lora_t *l,
                  float *x, float *a, float *b, const float *dy) {
    double worst = 0, scale = 0;
    for (int i = 0; i < n; i++) {
        const float keep = param[i];
        param[i] = keep + 1.0f;
        const double up = objective(dev, l, x, a, b, dy);
        param[i] = keep - 1.0f;
        const double down = objective(dev, l, x, a, b, dy);
        param[i] = keep;
        const double fd = (up - down) / 2.0;
        worst = fmax(worst, fabs(fd - got[i]));
        scale = fmax(scale, fabs(fd));
    }
    const bool ok = worst <= 1e-4 * fmax(scale, 1.0);
    printf("%-28s max |analytic - finite difference| %.2e (largest %.2e) %s\n", what, worst, scale, ok ? "ok" : "FAIL");
    if (!ok) failures++;
}

static void run_case(kern_device_t *dev, float dropout) {
    uint64_t seed = 12345;
    float x[ROWS * IN], a[R * IN], b[OUT * R], dy[ROWS * OUT];
    for (int i = 0; i < ROWS * IN; i++) x[i] = frand(&seed);
    for (int i = 0; i < R * IN; i++) a[i] = frand(&seed);
    for (int i = 0; i < OUT * R; i++) b[i] = frand(&seed);
    for (int i = 0; i < ROWS * OUT; i++) dy[i] = frand(&seed);
    kern_lora_t l = {.dtype = MT_F32, .r = R, .scale = 1.5f, .dropout = dropout, .dropout_seed = 99};

    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    float *dxv = kern_alloc(dev, sizeof x, "x", NULL), *dav = kern_alloc(dev, sizeof a, "a", NULL);
    float *dbv = kern_alloc(dev, sizeof b, "b", NULL), *ddy = kern_alloc(dev, sizeof dy, "dy", NULL);
    float *ga = kern_alloc(dev, sizeof a, "ga", NULL), *gb = kern_alloc(dev, sizeof b, "gb", NULL);
    float *gx = kern_alloc(dev, sizeof x, "gx", NULL);
    kern_memcpy_h2d(dev, s, dxv, x, sizeof x);
    kern_memcpy_h2d(dev, s, dav, a, sizeof a);
    kern_memcpy_h2d(dev, s, dbv, b, sizeof b);
    kern_memcpy_h2d(dev, s, ddy, dy, sizeof dy);
    kern_memset(dev, s, ga, 0, sizeof a);
    kern_memset(dev, s, gb, 0, sizeof b);
    kern_memset(dev, s, gx, 0, sizeof x);
    kern_lora_t lb = l;
    lb.a = dav;
    lb.b = dbv;
    lb.ga = ga;
    lb.gb = gb;
    mt_error_t err = {0};
    kern_lora_bwd(dev, MT_F32, &lb, ddy, dxv, MT_F32, gx, ROWS, IN, OUT, &err);
    float hga[R * IN], hgb[OUT * R], hgx[ROWS * IN];
    kern_memcpy_d2h(dev, s, hga, ga, sizeof hga);
    kern_memcpy_d2h(dev, s, hgb, gb, sizeof hgb);
    kern_memcpy_d2h(dev, s, hgx, gx, sizeof hgx);
    kern_stream_sync(dev, s);
    char what[64];
    snprintf(what, sizeof what, "dA (dropout %.2f)", (double)dropout);
    check(what, hga, a, R * IN, dev, &l, x, a, b, dy);
    snprintf(what, sizeof what, "dB (dropout %.2f)", (double)dropout);
    check(what, hgb, b, OUT * R, dev, &l, x, a, b, dy);
    snprintf(what, sizeof what, "dx (dropout %.2f)", (double)dropout);
    check(what, hgx, x, ROWS * IN, dev, &l, x, a, b, dy);
    if (dropout > 0) { /* the mask really drops: some input columns get no gradient through it */
        int zeros = 0;
        for (int i = 0; i < ROWS * IN; i++) zeros += hgx[i] == 0.0f;
        printf("dropout %.2f: %d of %d input gradients are zero\n", (double)dropout, zeros, ROWS * IN);
        if (zeros == 0) failures++;
    }
    float *bufs[] = {dxv, dav, dbv, ddy, ga, gb, gx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kern_free(dev, bufs[i]);
}

int main(void) {
    kern_device_t *dev = NULL;
    kern_device_opts_t o = {0};
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 2;
    }
    run_case(dev, 0.0f);
    run_case(dev, 0.3f);
    kern_device_destroy(dev);
    if (failures) fprintf(stderr, "lora_test: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
