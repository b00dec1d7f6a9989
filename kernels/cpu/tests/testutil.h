/* Shared helpers of the CPU kernel tests.
 *
 * Why these and not more: every op test does the same four things, and doing
 * them one way keeps the tolerances comparable across ops.
 *  - a deterministic RNG (splitmix64), so a failure reproduces bit for bit;
 *  - a CPU backend whose compute stream the kernels receive, so kernels that
 *    use the backend's thread pool are exercised exactly as the engine runs
 *    them (tensors are plain host buffers: on the CPU backend device pointers
 *    are host addressable, which only these kernel tests rely on). It is made
 *    with kern_cpu_device_create, not kern_device_create, so these tests link
 *    only the CPU backend and never need the CUDA toolchain; no arena is
 *    reserved, kern_alloc is not used here (device_test covers it);
 *  - comparisons against double-precision references with an explicit
 *    tolerance (the caller states it and its reason);
 *  - a central finite-difference driver in double: the loss is a scalar
 *    L = sum(out * R) accumulated in double from the fp32 kernel's forward,
 *    each fp32 input is perturbed by +/- h and the step actually taken after
 *    rounding to float is used as the denominator.
 *
 * Failures are counted (tu_expect / tu_check_*), printed with what and where,
 * and tu_finish turns the count into the exit code. */
#ifndef MT_KERNELS_CPU_TESTS_TESTUTIL_H
#define MT_KERNELS_CPU_TESTS_TESTUTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"

/* ---- deterministic random numbers ---- */
typedef struct {
    uint64_t state;
} tu_rng_t;

void tu_rng_seed(tu_rng_t *r, uint64_t seed);
uint64_t tu_rng_u64(tu_rng_t *r);
double tu_rng_uniform(tu_rng_t *r);         /* [0, 1) */
int tu_rng_int(tu_rng_t *r, int n);         /* [0, n) */
void tu_fill(tu_rng_t *r, float *x, size_t n, float scale); /* uniform in [-scale, scale) */
void tu_shuffle(tu_rng_t *r, int *v, int n);

/* ---- buffers (abort through MT_CHECK_ALLOC when the host is out of memory) ---- */
float *tu_alloc(size_t n);                        /* zeroed */
float *tu_rand(tu_rng_t *r, size_t n, float scale);
float *tu_copy(const float *x, size_t n);
double *tu_alloc_d(size_t n);                     /* zeroed */
void tu_fill_nan(float *x, size_t n);             /* sentinel for "overwrite" outputs */
double tu_dot(const float *a, const float *b, size_t n); /* sum a*b in double */

/* ---- the device the kernels run on ---- */
typedef struct {
    kern_device_t *dev;
    kern_stream_t *s; /* compute stream */
} tu_env_t;

tu_env_t tu_env_open(void);
void tu_env_close(tu_env_t *env);

/* ---- failure accounting ---- */
/* Records a failure (printing the message) when cond is false; returns cond. */
bool tu_expect(bool cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int tu_failures(void);
/* Prints a summary line and returns the process exit code. */
int tu_finish(const char *test_name);

/* ---- comparisons ---- */
/* Element-wise |got - ref| <= atol + rtol * |ref|, or got == ref (so an
 * infinity matches only the same infinity). Prints the worst element
 * and the count of violations; returns true when all pass. */
bool tu_check_close(const char *what, const float *got, const double *ref, size_t n, double rtol,
                    double atol);
/* Same, for two fp32 arrays (e.g. aliased vs not aliased call). */
bool tu_check_close_f(const char *what, const float *got, const float *ref, size_t n, double rtol,
                      double atol);
bool tu_check_bitwise(const char *what, const float *got, const float *ref, size_t n);

/* Gradient comparison, two criteria that must both hold:
 *   norm-wise  ||analytic - fd|| / ||fd|| <= norm_tol, and
 *   per element |analytic - fd| <= elem_rtol * max(|fd|, floor_frac * max|fd|)
 * The floor keeps near-zero elements (where FD noise dominates) from
 * failing on relative error alone. When ||fd|| is 0 the analytic gradient
 * must be 0 within 1e-6. Prints the norm-wise error for the log. */
bool tu_check_grad(const char *what, const float *analytic, const double *fd, size_t n,
                   double norm_tol, double elem_rtol, double floor_frac);

/* ---- finite differences ---- */
/* Returns the scalar loss for the current contents of the inputs. */
typedef double (*tu_loss_fn)(void *ctx);

/* fd[i] = (L(x_i + h) - L(x_i - h)) / (actual step) with
 * h = rel_eps * max(|x_i|, scale): relative for large inputs, and for
 * inputs near 0 relative to `scale`, the typical magnitude of the tensor.
 * x is restored exactly afterwards. */
void tu_fd_grad(tu_loss_fn loss, void *ctx, float *x, size_t n, double rel_eps, double scale,
                double *fd);

#endif
