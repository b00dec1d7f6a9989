/* The GPU suite's harness (see gpu_test.h). */
#include "tests/gpu/gpu_test.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

/* Device budgets: the CPU arena is MAP_NORESERVE (costs nothing unused);
 * 1 GiB of GPU memory fits every test's tensors with room to spare. */
#define GT_CPU_BUDGET ((size_t)1 << 30)
#define GT_GPU_BUDGET ((size_t)1 << 30)

#ifdef GT_EMULATE
/* The emulator build (tests/gpu/emu): the "GPU" is a second CPU device whose
 * kernel table is kern_ops_cuda, i.e. the CUDA kernels' sources compiled for
 * the CPU emulator. */
void gt_open(gt_ctx_t *t, const char *name, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->name = name;
    t->rng = seed;
    mt_error_t err;
    kern_device_opts_t o = {.device_budget_bytes = GT_CPU_BUDGET};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &t->cpu, &err) != MT_OK ||
        kern_device_create(KERN_BACKEND_CPU, &o, &t->gpu, &err) != MT_OK) {
        fprintf(stderr, "%s: cannot open the CPU backend: %s\n", name, err.msg);
        exit(1);
    }
    t->gpu->ops = &kern_ops_cuda;
    t->sc = kern_stream(t->cpu, KERN_STREAM_COMPUTE);
    t->sg = kern_stream(t->gpu, KERN_STREAM_COMPUTE);
    printf("%s: CUDA kernels run by the CPU emulator (tests/gpu/emu): their indexing, barriers and "
           "shuffles are real, their numerics are the host's\n",
           name);
}
#else
void gt_open(gt_ctx_t *t, const char *name, uint64_t seed) {
    memset(t, 0, sizeof *t);
    t->name = name;
    t->rng = seed;
    char why[512];
    if (!kern_cuda_available(why, sizeof why)) {
        printf("SKIPPED: %s: %s\n", name, why);
        fflush(stdout);
        exit(0);
    }
    mt_error_t err;
    kern_device_opts_t o = {.device_budget_bytes = GT_CPU_BUDGET};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &t->cpu, &err) != MT_OK) {
        fprintf(stderr, "%s: cannot open the CPU backend: %s\n", name, err.msg);
        exit(1);
    }
    o.device_budget_bytes = GT_GPU_BUDGET;
    if (kern_device_create(KERN_BACKEND_CUDA, &o, &t->gpu, &err) != MT_OK) {
        fprintf(stderr, "%s: a GPU was found (%s) but the CUDA backend did not open: %s\n", name,
                why, err.msg);
        exit(1);
    }
    t->sc = kern_stream(t->cpu, KERN_STREAM_COMPUTE);
    t->sg = kern_stream(t->gpu, KERN_STREAM_COMPUTE);
    printf("%s: %s\n", name, why);
}
#endif

int gt_close(gt_ctx_t *t) {
    kern_device_destroy(t->gpu);
    kern_device_destroy(t->cpu);
    printf("%s: %d checks, %d failed\n", t->name, t->checks, t->failures);
    if (t->failures) printf("FAILED\n");
    else printf("PASSED\n");
    return t->failures ? 1 : 0;
}

uint64_t gt_u64(gt_ctx_t *t) {
    uint64_t z = (t->rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

int gt_int(gt_ctx_t *t, int n) { return (int)(gt_u64(t) % (uint64_t)n); }

float gt_uniform(gt_ctx_t *t, float lo, float hi) {
    const double u = (double)(gt_u64(t) >> 11) * (1.0 / 9007199254740992.0);
    return (float)(lo + (hi - lo) * u);
}

void *gt_host_bytes(size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    MT_CHECK_ALLOC(p, "test host buffer");
    return p;
}

float *gt_host_alloc(size_t n) { return gt_host_bytes(n * sizeof(float)); }

float *gt_host_rand(gt_ctx_t *t, size_t n, float scale) {
    float *x = gt_host_alloc(n);
    for (size_t i = 0; i < n; i++) x[i] = gt_uniform(t, -scale, scale);
    return x;
}

gt_buf_t gt_alloc(gt_ctx_t *t, size_t bytes, const char *tag) {
    gt_buf_t b = {.bytes = bytes};
    mt_error_t err;
    b.c = kern_alloc(t->cpu, bytes, tag, &err);
    MT_CHECK(b.c != NULL, "%s: CPU alloc of %s: %s", t->name, tag, err.msg);
    b.g = kern_alloc(t->gpu, bytes, tag, &err);
    MT_CHECK(b.g != NULL, "%s: GPU alloc of %s: %s", t->name, tag, err.msg);
    gt_poison(t, &b);
    return b;
}

void gt_poison(gt_ctx_t *t, gt_buf_t *b) {
    kern_memset(t->cpu, t->sc, b->c, 0xFF, b->bytes);
    kern_memset(t->gpu, t->sg, b->g, 0xFF, b->bytes);
    kern_stream_sync(t->cpu, t->sc);
    kern_stream_sync(t->gpu, t->sg);
}

void gt_set(gt_ctx_t *t, gt_buf_t *b, const void *host) {
    kern_memcpy_h2d(t->cpu, t->sc, b->c, host, b->bytes);
    kern_memcpy_h2d(t->gpu, t->sg, b->g, host, b->bytes);
    kern_stream_sync(t->cpu, t->sc);
    kern_stream_sync(t->gpu, t->sg);
}

gt_buf_t gt_from_host(gt_ctx_t *t, const void *host, size_t bytes, const char *tag) {
    gt_buf_t b = gt_alloc(t, bytes, tag);
    gt_set(t, &b, host);
    return b;
}

void gt_download(gt_ctx_t *t, const gt_buf_t *b, void *host_cpu, void *host_gpu) {
    if (host_cpu) kern_memcpy_d2h(t->cpu, t->sc, host_cpu, b->c, b->bytes);
    if (host_gpu) kern_memcpy_d2h(t->gpu, t->sg, host_gpu, b->g, b->bytes);
    kern_stream_sync(t->cpu, t->sc);
    kern_stream_sync(t->gpu, t->sg);
}

void gt_save_gpu(gt_ctx_t *t, const gt_buf_t *b, void *host) { gt_download(t, b, NULL, host); }

void gt_free(gt_ctx_t *t, gt_buf_t *b) {
    kern_device_sync(t->gpu);
    kern_free(t->cpu, b->c);
    kern_free(t->gpu, b->g);
    b->c = b->g = NULL;
}

void gt_expect(gt_ctx_t *t, bool ok, const char *fmt, ...) {
    t->checks++;
    if (ok) return;
    t->failures++;
    va_list ap;
    va_start(ap, fmt);
    printf("FAIL %s: ", t->name);
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

static bool check_f32(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t n, float atol,
                      float rtol, bool normwise, float floor) {
    float *c = gt_host_alloc(n), *g = gt_host_alloc(n);
    gt_download(t, b, c, g);
    double refmax = 0.0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(c[i]) && fabs(c[i]) > refmax) refmax = fabs(c[i]);
    const double scale = refmax > floor ? refmax : (double)floor;
    size_t bad = 0, first = 0, nonfinite = 0;
    double worst = 0.0;
    size_t worst_i = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(c[i]) && !isfinite(g[i])) {
            if (!nonfinite++ && !bad) first = i;
            bad++;
            continue;
        }
        if (!isfinite(c[i])) { /* the CPU's own NaN/Inf must be matched in kind */
            const bool same = (isnan(c[i]) && isnan(g[i])) || c[i] == g[i];
            if (!same && !bad++) first = i;
            continue;
        }
        const double d = fabs((double)g[i] - (double)c[i]);
        const double lim = normwise ? (double)atol * scale : (double)atol + (double)rtol * fabs(c[i]);
        if (d > worst) {
            worst = d;
            worst_i = i;
        }
        if (d > lim && !bad++) first = i;
    }
    t->checks++;
    if (bad) {
        t->failures++;
        printf("FAIL %s: %s: %zu of %zu elements out of tolerance (%s %g%s%g), %zu non-finite; "
               "first at %zu: cpu %.9g gpu %.9g; worst |diff| %.3g at %zu (cpu %.9g)\n",
               t->name, what, bad, n, normwise ? "normwise" : "atol", (double)atol,
               normwise ? "" : " rtol ", normwise ? 0.0 : (double)rtol, nonfinite, first,
               (double)c[first], (double)g[first], worst, worst_i, n ? (double)c[worst_i] : 0.0);
    } else {
        printf("ok   %s: max |diff| %.3g (max |ref| %.3g)\n", what, worst, refmax);
    }
    free(c);
    free(g);
    return bad == 0;
}

bool gt_check_f32(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t n, float atol, float rtol) {
    return check_f32(t, what, b, n, atol, rtol, false, 0.0f);
}

bool gt_check_f32_norm(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t n, float tol,
                       float floor) {
    return check_f32(t, what, b, n, tol, 0.0f, true, floor);
}

bool gt_check_exact(gt_ctx_t *t, const char *what, const gt_buf_t *b, size_t bytes) {
    /* the download moves the whole buffer; the first `bytes` of it are compared */
    const size_t room = bytes > b->bytes ? bytes : b->bytes;
    unsigned char *c = gt_host_bytes(room), *g = gt_host_bytes(room);
    gt_download(t, b, c, g);
    size_t first = bytes;
    for (size_t i = 0; i < bytes && first == bytes; i++)
        if (c[i] != g[i]) first = i;
    t->checks++;
    if (first < bytes) {
        t->failures++;
        const size_t w = first / 4 * 4;
        uint32_t cw = 0, gw = 0;
        if (w + 4 <= bytes) {
            memcpy(&cw, c + w, 4);
            memcpy(&gw, g + w, 4);
        }
        printf("FAIL %s: %s: not bit-identical, first difference at byte %zu (word %zu: cpu 0x%08x "
               "gpu 0x%08x)\n",
               t->name, what, first, w / 4, cw, gw);
    } else {
        printf("ok   %s: bit-identical (%zu bytes)\n", what, bytes);
    }
    free(c);
    free(g);
    return first == bytes;
}

bool gt_check_same_gpu(gt_ctx_t *t, const char *what, const gt_buf_t *b, const void *saved) {
    unsigned char *g = gt_host_bytes(b->bytes);
    gt_download(t, b, NULL, g);
    const bool same = memcmp(g, saved, b->bytes) == 0;
    gt_expect(t, same, "%s: a second GPU run gave different bits (non-deterministic)", what);
    if (same) printf("ok   %s: deterministic across runs\n", what);
    free(g);
    return same;
}
