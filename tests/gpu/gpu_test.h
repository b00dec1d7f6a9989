/* Shared harness of the GPU suite: every CUDA kernel against its CPU twin.
 *
 * A test opens both backends through kern_device_create (so the whole
 * device layer, arena and kernel table included, is what runs), makes
 * every tensor twice (a gt_buf_t holds the CPU and the GPU copy, uploaded
 * from one host array), runs the op on both through dev->ops, and compares
 * the downloaded results:
 *  - outputs the op overwrites are first filled with NaN on both devices,
 *    so an element the kernel forgets shows up as NaN;
 *  - every GPU result is checked for NaN/Inf where the CPU's is finite;
 *  - tolerances are stated by the caller with their reason; "exact" means
 *    bit for bit (ops whose arithmetic is the same sequence on both sides);
 *  - ops with reductions are run twice on the GPU and must give the same
 *    bits (the backend's determinism contract, ops.h).
 *
 * Without a usable GPU, gt_open prints "SKIPPED: <reason>" and exits 0: the
 * targets are also tagged "manual" so `bazel test //...` never runs them,
 * and .ci/run lists them as skipped.  With a GPU: bazel test //tests/gpu/... */
#ifndef MT_TESTS_GPU_GPU_TEST_H
#define MT_TESTS_GPU_GPU_TEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"
#include "kernels/ops.h"

typedef struct {
    const char *name;
    kern_device_t *cpu, *gpu;
    kern_stream_t *sc, *sg; /* compute streams of cpu and gpu */
    uint64_t rng;
    int checks, failures;
} gt_ctx_t;

/* One tensor on both devices. */
typedef struct {
    void *c, *g;
    size_t bytes;
} gt_buf_t;

#define GT_C(b) ((float *)(b).c)
#define GT_G(b) ((float *)(b).g)
#define GT_CI(b) ((int32_t *)(b).c)
#define GT_GI(b) ((int32_t *)(b).g)
#define GT_CU16(b) ((uint16_t *)(b).c)
#define GT_GU16(b) ((uint16_t *)(b).g)

/* Opens the CPU and CUDA devices, or prints SKIPPED and exits 0. */
void gt_open(gt_ctx_t *t, const char *name, uint64_t seed);
/* Prints the summary, closes both devices; returns the exit code. */
int gt_close(gt_ctx_t *t);

/* ---- random inputs (splitmix64; the same seed gives the same data) ---- */
uint64_t gt_u64(gt_ctx_t *t);
int gt_int(gt_ctx_t *t, int n);                  /* [0, n) */
float gt_uniform(gt_ctx_t *t, float lo, float hi);
float *gt_host_rand(gt_ctx_t *t, size_t n, float scale); /* uniform in [-scale, scale) */
float *gt_host_alloc(size_t n);                  /* zeroed */
void *gt_host_bytes(size_t bytes);               /* zeroed */

/* ---- buffers on both devices ---- */
gt_buf_t gt_alloc(gt_ctx_t *t, size_t bytes, const char *tag); /* filled with NaN bytes */
gt_buf_t gt_from_host(gt_ctx_t *t, const void *host, size_t bytes, const char *tag);
void gt_set(gt_ctx_t *t, gt_buf_t *b, const void *host); /* uploads host to both copies */
void gt_poison(gt_ctx_t *t, gt_buf_t *b);                /* 0xFF bytes: NaN floats */
void gt_download(gt_ctx_t *t, const gt_buf_t *b, void *host_cpu, void *host_gpu);
void gt_free(gt_ctx_t *t, gt_buf_t *b);
/* A GPU-only scratch copy of b's GPU data (for determinism re-runs). */
void gt_save_gpu(gt_ctx_t *t, const gt_buf_t *b, void *host);

/* ---- checks (count failures, print what and where) ---- */
void gt_expect(gt_ctx_t *t, bool ok, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* |gpu - cpu| <= atol + rtol * |cpu| elementwise, GPU finite where CPU is. */
bool gt_check_f32(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t n, float atol, float rtol);
/* max |gpu - cpu| <= tol * max(max |cpu|, floor) (normwise, for products
 * with long sums; `floor` is the output's natural scale for outputs that can
 * vanish mathematically and then hold only rounding noise). */
bool gt_check_f32_norm(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t n, float tol,
                       float floor);
/* Bit-identical. */
bool gt_check_exact(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t bytes);
/* The GPU copy is bit-identical to `saved` (a previous run's gt_save_gpu). */
bool gt_check_same_gpu(gt_ctx_t *t, const char *what, const gt_buf_t *b, const void *saved);

#endif
