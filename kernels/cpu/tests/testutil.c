/* Shared helpers of the CPU kernel tests (see testutil.h).
 *
 * The failure counter is the one piece of file-level state: it belongs to
 * the test process (one test binary = one counter), as in arena_test.c. */
#include "kernels/cpu/tests/testutil.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/backend_cpu.h"
#include "base/status.h"

static int g_failures;

void tu_rng_seed(tu_rng_t *r, uint64_t seed) { r->state = seed * 0x9E3779B97F4A7C15ull + 1; }

uint64_t tu_rng_u64(tu_rng_t *r) { /* splitmix64 */
    uint64_t z = (r->state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double tu_rng_uniform(tu_rng_t *r) { return (double)(tu_rng_u64(r) >> 11) * 0x1.0p-53; }

int tu_rng_int(tu_rng_t *r, int n) { return (int)(tu_rng_uniform(r) * n); }

void tu_fill(tu_rng_t *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = (float)((2.0 * tu_rng_uniform(r) - 1.0) * scale);
}

void tu_shuffle(tu_rng_t *r, int *v, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = tu_rng_int(r, i + 1);
        int t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

float *tu_alloc(size_t n) {
    float *p = calloc(n ? n : 1, sizeof *p);
    MT_CHECK_ALLOC(p, "test buffer");
    return p;
}

float *tu_rand(tu_rng_t *r, size_t n, float scale) {
    float *p = tu_alloc(n);
    tu_fill(r, p, n, scale);
    return p;
}

float *tu_copy(const float *x, size_t n) {
    float *p = tu_alloc(n);
    if (n) memcpy(p, x, n * sizeof *p);
    return p;
}

double *tu_alloc_d(size_t n) {
    double *p = calloc(n ? n : 1, sizeof *p);
    MT_CHECK_ALLOC(p, "test buffer (double)");
    return p;
}

void tu_fill_nan(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = NAN;
}

double tu_dot(const float *a, const float *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)a[i] * (double)b[i];
    return s;
}

tu_env_t tu_env_open(void) {
    tu_env_t env = {0};
    kern_device_opts_t opts = {.device_budget_bytes = 1 << 20};
    mt_error_t err = {0};
    mt_status_t st = kern_cpu_device_create(&opts, &env.dev, &err);
    MT_CHECK(st == MT_OK, "cannot create the CPU test device: %s", err.msg);
    env.s = env.dev->streams[KERN_STREAM_COMPUTE];
    return env;
}

void tu_env_close(tu_env_t *env) {
    for (int r = 0; r < KERN_STREAM_COUNT; r++) env->dev->vt->stream_sync(env->dev->streams[r]);
    env->dev->vt->destroy(env->dev);
    env->dev = NULL;
    env->s = NULL;
}

bool tu_expect(bool cond, const char *fmt, ...) {
    if (cond) return true;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "FAIL: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    g_failures++;
    return false;
}

int tu_failures(void) { return g_failures; }

int tu_finish(const char *test_name) {
    if (g_failures) {
        fprintf(stderr, "%s: %d failure(s)\n", test_name, g_failures);
        return 1;
    }
    printf("%s: all checks passed\n", test_name);
    return 0;
}

bool tu_check_close(const char *what, const float *got, const double *ref, size_t n, double rtol,
                    double atol) {
    size_t bad = 0, worst = 0;
    double worst_ratio = -1.0;
    for (size_t i = 0; i < n; i++) {
        if ((double)got[i] == ref[i]) continue; /* equal, infinities included (e.g. lse = -inf) */
        /* a reference infinity is matched only by itself (above) */
        const double lim = isfinite(ref[i]) ? atol + rtol * fabs(ref[i]) : 0.0;
        const double d = isfinite(ref[i]) ? fabs((double)got[i] - ref[i]) : INFINITY;
        const double ratio = isnan(d) ? INFINITY : d / (lim > 0 ? lim : 1e-300);
        if (!(d <= lim)) bad++;
        if (ratio > worst_ratio) {
            worst_ratio = ratio;
            worst = i;
        }
    }
    if (bad) {
        fprintf(stderr,
                "FAIL: %s: %zu of %zu elements outside |got-ref| <= %g + %g*|ref|; worst [%zu]: "
                "got %.9g ref %.9g\n",
                what, bad, n, atol, rtol, worst, (double)got[worst], ref[worst]);
        g_failures++;
        return false;
    }
    return true;
}

bool tu_check_close_f(const char *what, const float *got, const float *ref, size_t n, double rtol,
                      double atol) {
    double *r = tu_alloc_d(n);
    for (size_t i = 0; i < n; i++) r[i] = ref[i];
    bool ok = tu_check_close(what, got, r, n, rtol, atol);
    free(r);
    return ok;
}

bool tu_check_bitwise(const char *what, const float *got, const float *ref, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &ref[i], sizeof got[i]) != 0) {
            fprintf(stderr, "FAIL: %s: element %zu differs: %.9g vs %.9g (expected bit-identical)\n",
                    what, i, (double)got[i], (double)ref[i]);
            g_failures++;
            return false;
        }
    }
    return true;
}

bool tu_check_grad(const char *what, const float *analytic, const double *fd, size_t n,
                   double norm_tol, double elem_rtol, double floor_frac) {
    double num = 0.0, den = 0.0, maxfd = 0.0;
    bool finite = true;
    for (size_t i = 0; i < n; i++) {
        const double d = (double)analytic[i] - fd[i];
        if (!isfinite(analytic[i])) finite = false;
        num += d * d;
        den += fd[i] * fd[i];
        if (fabs(fd[i]) > maxfd) maxfd = fabs(fd[i]);
    }
    if (!finite) {
        for (size_t i = 0; i < n; i++)
            if (!isfinite(analytic[i])) {
                fprintf(stderr, "FAIL: %s: analytic gradient [%zu] = %g is not finite\n", what, i,
                        (double)analytic[i]);
                break;
            }
        g_failures++;
        return false;
    }
    if (den == 0.0) {
        const bool ok = sqrt(num) <= 1e-6;
        if (!ok) {
            fprintf(stderr, "FAIL: %s: finite differences are all 0 but ||analytic|| = %g\n", what,
                    sqrt(num));
            g_failures++;
        }
        return ok;
    }
    const double rel = sqrt(num / den);
    size_t bad = 0, worst = 0;
    double worst_ratio = -1.0;
    const double floor_v = floor_frac * maxfd;
    for (size_t i = 0; i < n; i++) {
        const double lim = elem_rtol * fmax(fabs(fd[i]), floor_v);
        const double d = fabs((double)analytic[i] - fd[i]);
        if (d > lim) bad++;
        if (d / lim > worst_ratio) {
            worst_ratio = d / lim;
            worst = i;
        }
    }
    printf("  %-44s n=%-5zu norm-wise rel err %.2e (tol %.0e), worst element at %.2f of its tol\n",
           what, n, rel, norm_tol, worst_ratio);
    bool ok = true;
    if (rel > norm_tol) {
        fprintf(stderr, "FAIL: %s: norm-wise relative error %.3e > %.1e\n", what, rel, norm_tol);
        ok = false;
    }
    if (bad) {
        fprintf(stderr,
                "FAIL: %s: %zu of %zu elements off by more than %g relative (floor %g); worst "
                "[%zu]: analytic %.9g, finite difference %.9g\n",
                what, bad, n, elem_rtol, floor_v, worst, (double)analytic[worst], fd[worst]);
        ok = false;
    }
    if (!ok) g_failures++;
    return ok;
}

void tu_fd_grad(tu_loss_fn loss, void *ctx, float *x, size_t n, double rel_eps, double scale,
                double *fd) {
    for (size_t i = 0; i < n; i++) {
        const float x0 = x[i];
        const double h = rel_eps * fmax(fabs((double)x0), scale);
        const float xp = (float)((double)x0 + h), xm = (float)((double)x0 - h);
        x[i] = xp;
        const double lp = loss(ctx);
        x[i] = xm;
        const double lm = loss(ctx);
        x[i] = x0;
        fd[i] = (lp - lm) / ((double)xp - (double)xm);
    }
}
