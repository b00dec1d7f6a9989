/* `moetune bench adam` (see adam_bench.h): how close host AdamW comes to
 * the memory bandwidth this machine gives its access pattern.
 *
 * What is measured, all in one run on the same arrays and thread pool:
 * - moetune's AdamW (kern_adamw_cpu_isa), fp32 state and gradient: 28 bytes
 *   per parameter (read p m v g, write p m v), and again writing the bf16
 *   working copy too (30 bytes).
 * - the ceiling: an in-place streaming pass with the same traffic and no
 *   arithmetic to speak of (p += g; m += g; v += g, plus the bf16 store for
 *   the 30-byte variant), vectorised with the same instruction set and split
 *   into the same tasks on the same pool, with and without the kernel's
 *   software prefetch; the faster of the two is the ceiling. STREAM's triad
 *   would be the wrong yardstick: it writes a separate array and pays for
 *   write-allocate reads.
 * - a plain fused scalar loop (what one writes first), on one thread and on
 *   all threads, to show what the SIMD and threading buy.
 * - moetune's AdamW with bf16 moments (20 bytes per parameter: p read and
 *   written, m v in bf16, g) and 8-bit moments (16 bytes, plus 8 bytes of
 *   scales per 256), optimizer_state's lighter formats, through
 *   kern_adamw_cpu_pool on the same pool (the ISA choice is the fp32
 *   kernel's only).
 * - the out-of-place update (kern_adamw_cpu_isa_from: reads p m v, writes
 *   the new state to a second set of arrays, swapped in after each run as
 *   speculation does), against the copy of p m v and the in-place update it
 *   replaces (52 bytes per parameter). The out-of-place row counts the same
 *   28 bytes as in place: its vector loop streams the stores past the
 *   cache, so no destination line is read before it is written (a normal
 *   store would read it: 12 bytes more). So do the bf16 and 8-bit moments'
 *   out-of-place updates for the master (their moments' stores are plain:
 *   4 and 2 bytes more).
 * Pages are touched first (in parallel, so they spread as the kernel will
 * use them) and each kernel runs once untimed; the report is the median of
 * --repeats runs, the kernels interleaved so drift on a shared machine hits
 * them alike, and ratios are medians of per-repeat ratios. Buffers are 2 MB
 * aligned; --hugepages also advises transparent huge pages (where
 * measured, within run-to-run noise of plain pages, so the default is plain
 * pages, as the engine's allocations get). */
#include "tools/bench/adam_bench.h"

#include <errno.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/host/adamw_host.h"
#include "kernels/host/threadpool.h"
#include "base/dtype.h"
#include "base/finite.h"
#include "base/clock.h"
#include "tools/build_info.h"

#define MAX_REPEATS 101

typedef struct {
    size_t params;
    int threads;
    int repeats;
    int json;
    int hugepages;
    kern_cpu_isa_t isa;
} bench_opts_t;

typedef struct {
    float *p, *m, *v, *g; /* (n) */
    float *p2, *m2, *v2;  /* (n) the out-of-place update's other state */
    uint16_t *pb;         /* (n) bf16 copy, or NULL for the 28-byte variant */
    size_t n, chunk;
    int prefetch; /* ceiling: software prefetch like moetune's kernel */
    kern_cpu_isa_t isa;
    kern_adamw_params_t hp; /* for the plain loop */
    kern_moments_t mom_bf16, mom_8bit;
    kern_moments_t mom_bf16_2, mom_8bit_2; /* the out-of-place updates' other moments */
    int nonfinite; /* the finite checks' answer (kept, so the scan is not optimised away) */
} bench_arrays_t;

static void *big_alloc(size_t bytes, int hugepages) {
    const size_t align = (size_t)2 << 20;
    bytes = (bytes + align - 1) / align * align;
    void *q = aligned_alloc(align, bytes);
    if (q && hugepages) (void)madvise(q, bytes, MADV_HUGEPAGE); /* advice only */
    return q;
}

static size_t ntasks_of(const bench_arrays_t *a) { return (a->n + a->chunk - 1) / a->chunk; }
static void task_range(const bench_arrays_t *a, size_t task, size_t *b, size_t *e) {
    *b = task * a->chunk;
    *e = *b + a->chunk < a->n ? *b + a->chunk : a->n;
}

/* ---- first touch ---- */

static void fill_task(void *ctx, size_t task) {
    const bench_arrays_t *a = ctx;
    size_t b, e;
    task_range(a, task, &b, &e);
    for (size_t i = b; i < e; i++) {
        const uint32_t h = (uint32_t)(i * 2654435761u);
        a->p[i] = (float)(int32_t)h * 0x1p-37f; /* |p| < 0.016 */
        a->m[i] = 0.0f;
        a->v[i] = 0.0f;
        a->g[i] = 1e-4f + (float)(h >> 20) * 1e-7f; /* positive: keeps the ceiling's v >= 0 */
        a->p2[i] = a->p[i];
        a->m2[i] = 0.0f;
        a->v2[i] = 0.0f;
        if (a->pb) a->pb[i] = 0;
    }
}

/* ---- the ceiling: same traffic, trivial arithmetic ---- */

#define MT_AVX2 __attribute__((target("avx2,fma")))
#define MT_AVX512 __attribute__((target("avx512f,avx2,fma")))

static void ceil_scalar(const bench_arrays_t *a, size_t b, size_t e) {
    for (size_t i = b; i < e; i++) {
        const float g = a->g[i];
        const float p = a->p[i] + g;
        a->p[i] = p;
        a->m[i] += g;
        a->v[i] += g;
        if (a->pb) a->pb[i] = mt_f32_to_bf16(p);
    }
}

/* The same prefetch distance as kernels/cpu/adamw.c (512 bytes). */
#define CEIL_PF_BYTES 512
static inline __attribute__((always_inline)) void ceil_prefetch(const bench_arrays_t *a, size_t i) {
    const size_t d = CEIL_PF_BYTES / sizeof(float);
    _mm_prefetch((const char *)(a->p + i + d), _MM_HINT_T0);
    _mm_prefetch((const char *)(a->m + i + d), _MM_HINT_T0);
    _mm_prefetch((const char *)(a->v + i + d), _MM_HINT_T0);
    _mm_prefetch((const char *)(a->g + i + d), _MM_HINT_T0);
}

MT_AVX2 __attribute__((always_inline)) static inline __m256 ceil_avx2_8(const bench_arrays_t *a,
                                                                       size_t i) {
    const __m256 g = _mm256_loadu_ps(a->g + i);
    const __m256 p = _mm256_add_ps(_mm256_loadu_ps(a->p + i), g);
    _mm256_storeu_ps(a->p + i, p);
    _mm256_storeu_ps(a->m + i, _mm256_add_ps(_mm256_loadu_ps(a->m + i), g));
    _mm256_storeu_ps(a->v + i, _mm256_add_ps(_mm256_loadu_ps(a->v + i), g));
    return p;
}

/* 16 per iteration as two halves, like moetune's AVX2 path */
MT_AVX2 __attribute__((always_inline)) static inline void ceil_avx2_body(const bench_arrays_t *a,
                                                                        size_t b, size_t e,
                                                                        const int pbf16) {
    size_t i = b;
    for (; i + 16 <= e; i += 16) {
        if (a->prefetch) ceil_prefetch(a, i);
        const __m256 lo = ceil_avx2_8(a, i), hi = ceil_avx2_8(a, i + 8);
        if (pbf16) {
            const __m256i pk = _mm256_packus_epi32(_mm256_srli_epi32(_mm256_castps_si256(lo), 16),
                                                   _mm256_srli_epi32(_mm256_castps_si256(hi), 16));
            _mm256_storeu_si256((__m256i *)(a->pb + i), _mm256_permute4x64_epi64(pk, 0xD8));
        }
    }
    ceil_scalar(a, i, e);
}
MT_AVX2 static void ceil_avx2(const bench_arrays_t *a, size_t b, size_t e) {
    if (a->pb) ceil_avx2_body(a, b, e, 1);
    else ceil_avx2_body(a, b, e, 0);
}

MT_AVX512 __attribute__((always_inline)) static inline void ceil_avx512_body(
    const bench_arrays_t *a, size_t b, size_t e, const int pbf16) {
    size_t i = b;
    for (; i + 16 <= e; i += 16) {
        if (a->prefetch) ceil_prefetch(a, i);
        const __m512 g = _mm512_loadu_ps(a->g + i);
        const __m512 p = _mm512_add_ps(_mm512_loadu_ps(a->p + i), g);
        _mm512_storeu_ps(a->p + i, p);
        _mm512_storeu_ps(a->m + i, _mm512_add_ps(_mm512_loadu_ps(a->m + i), g));
        _mm512_storeu_ps(a->v + i, _mm512_add_ps(_mm512_loadu_ps(a->v + i), g));
        if (pbf16) {
            const __m512i h = _mm512_srli_epi32(_mm512_castps_si512(p), 16);
            _mm256_storeu_si256((__m256i *)(a->pb + i), _mm512_cvtepi32_epi16(h));
        }
    }
    ceil_scalar(a, i, e);
}
MT_AVX512 static void ceil_avx512(const bench_arrays_t *a, size_t b, size_t e) {
    if (a->pb) ceil_avx512_body(a, b, e, 1);
    else ceil_avx512_body(a, b, e, 0);
}

static void ceil_task(void *ctx, size_t task) {
    const bench_arrays_t *a = ctx;
    size_t b, e;
    task_range(a, task, &b, &e);
    if (a->isa == KERN_ISA_AVX512) ceil_avx512(a, b, e);
    else if (a->isa == KERN_ISA_AVX2) ceil_avx2(a, b, e);
    else ceil_scalar(a, b, e);
}

/* ---- the plain fused scalar loop: the obvious C translation of the
 * formula, coefficients in float, no SIMD, no care for op order ---- */

static void plain_range(const bench_arrays_t *a, size_t b, size_t e) {
    const kern_adamw_params_t *hp = &a->hp;
    const float bc1 = 1.0f - powf(hp->beta1, (float)hp->step);
    const float bc2_sqrt = sqrtf(1.0f - powf(hp->beta2, (float)hp->step));
    const float step_size = hp->lr / bc1;
    const float decay = 1.0f - hp->lr * hp->weight_decay;
    for (size_t i = b; i < e; i++) {
        const float g = a->g[i] * hp->grad_scale;
        float p = a->p[i] * decay;
        const float m = hp->beta1 * a->m[i] + (1.0f - hp->beta1) * g;
        const float v = hp->beta2 * a->v[i] + (1.0f - hp->beta2) * g * g;
        p -= step_size * m / (sqrtf(v) / bc2_sqrt + hp->eps);
        a->p[i] = p;
        a->m[i] = m;
        a->v[i] = v;
        if (a->pb) a->pb[i] = mt_f32_to_bf16(p);
    }
}

static void plain_task(void *ctx, size_t task) {
    const bench_arrays_t *a = ctx;
    size_t b, e;
    task_range(a, task, &b, &e);
    plain_range(a, b, e);
}

/* ---- measurements ---- */

typedef enum {
    M_CEIL28 = 0,
    M_CEIL28_PF,
    M_OURS28,
    M_CEIL30,
    M_CEIL30_PF,
    M_OURS30,
    M_PLAIN1,
    M_PLAINT,
    M_OURS_BF16,
    M_OURS_8BIT,
    M_SCAN,
    M_FUSED,
    M_OOP,
    M_SAVE,
    M_OOP_BF16,
    M_OOP_8BIT,
    M_COUNT,
} meas_t;

static const char *const k_meas_name[M_COUNT] = {
    "ceiling: in-place stream, 28 B/param",
    "  same, with software prefetch",
    "moetune AdamW, fp32 (28 B/param)",
    "ceiling + bf16 store, 30 B/param",
    "  same, with software prefetch",
    "moetune AdamW + bf16 copy (30 B/param)",
    "plain scalar loop, 1 thread",
    "plain scalar loop, all threads",
    "moetune AdamW, bf16 moments (20 B/param)",
    "moetune AdamW, 8-bit moments (16 B/param)",
    "fp32 AdamW, then a finite scan of p",
    "fp32 AdamW, finite check fused",
    "moetune AdamW, fp32, out of place",
    "copy p m v, then AdamW in place",
    "moetune AdamW, bf16 moments, out of place",
    "moetune AdamW, 8-bit moments, out of place",
};
/* the separate scan reads p once more (32 B); the fused check adds nothing */
static const double k_meas_bytes[M_COUNT] = {28, 28, 28, 30, 30, 30, 28, 28, 20, 16, 32, 28, 28, 52, 20, 16};

static void swap_f(float **x, float **y) {
    float *t = *x;
    *x = *y;
    *y = t;
}

static void swap_mom(kern_moments_t *x, kern_moments_t *y) {
    const kern_moments_t t = *x;
    *x = *y;
    *y = t;
}

static double run_once(meas_t which, bench_arrays_t *a, uint16_t *pb, kern_threadpool_t *pool) {
    a->pb = (which == M_CEIL30 || which == M_CEIL30_PF || which == M_OURS30) ? pb : NULL;
    a->prefetch = which == M_CEIL28_PF || which == M_CEIL30_PF;
    a->hp.step++;
    const double t0 = mt_now_s();
    switch (which) {
    case M_CEIL28:
    case M_CEIL28_PF:
    case M_CEIL30:
    case M_CEIL30_PF: kern_threadpool_parallel_for(pool, ntasks_of(a), ceil_task, a); break;
    case M_OURS28:
    case M_OURS30:
        kern_adamw_cpu_isa(pool, a->isa, a->p, a->m, a->v, a->g, NULL, a->pb, a->n, &a->hp);
        break;
    case M_PLAIN1: plain_range(a, 0, a->n); break;
    case M_PLAINT: kern_threadpool_parallel_for(pool, ntasks_of(a), plain_task, a); break;
    case M_OURS_BF16: kern_adamw_cpu_pool(pool, a->p, &a->mom_bf16, a->g, NULL, NULL, a->n, &a->hp); break;
    case M_OURS_8BIT: kern_adamw_cpu_pool(pool, a->p, &a->mom_8bit, a->g, NULL, NULL, a->n, &a->hp); break;
    case M_SCAN: /* the engine's check before it was fused: one thread, after the update */
        kern_adamw_cpu_isa(pool, a->isa, a->p, a->m, a->v, a->g, NULL, NULL, a->n, &a->hp);
        a->nonfinite = mt_first_nonfinite_f32(a->p, a->n) != MT_ALL_FINITE;
        break;
    case M_FUSED: {
        kern_adamw_params_t hp = a->hp;
        int bad = 0;
        hp.nonfinite = &bad;
        kern_adamw_cpu_isa(pool, a->isa, a->p, a->m, a->v, a->g, NULL, NULL, a->n, &hp);
        a->nonfinite = bad;
        break;
    }
    case M_OOP: /* the new state into the other arrays, which then hold the current one */
        kern_adamw_cpu_isa_from(pool, a->isa, a->p, a->m, a->v, a->p2, a->m2, a->v2, a->g, NULL, NULL, a->n,
                                &a->hp);
        swap_f(&a->p, &a->p2), swap_f(&a->m, &a->m2), swap_f(&a->v, &a->v2);
        break;
    case M_OOP_BF16:
        kern_adamw_cpu_pool_from(pool, a->p, &a->mom_bf16, a->p2, &a->mom_bf16_2, a->g, NULL, NULL, a->n, &a->hp);
        swap_f(&a->p, &a->p2);
        swap_mom(&a->mom_bf16, &a->mom_bf16_2);
        break;
    case M_OOP_8BIT:
        kern_adamw_cpu_pool_from(pool, a->p, &a->mom_8bit, a->p2, &a->mom_8bit_2, a->g, NULL, NULL, a->n, &a->hp);
        swap_f(&a->p, &a->p2);
        swap_mom(&a->mom_8bit, &a->mom_8bit_2);
        break;
    case M_SAVE:
        kern_threadpool_memcpy(pool, a->p2, a->p, a->n * sizeof(float));
        kern_threadpool_memcpy(pool, a->m2, a->m, a->n * sizeof(float));
        kern_threadpool_memcpy(pool, a->v2, a->v, a->n * sizeof(float));
        kern_adamw_cpu_isa(pool, a->isa, a->p, a->m, a->v, a->g, NULL, NULL, a->n, &a->hp);
        break;
    default: break;
    }
    return mt_now_s() - t0;
}

static int cmp_double(const void *x, const void *y) {
    const double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

static int usage(const char *msg) {
    if (msg) fprintf(stderr, "moetune bench adam: %s\n", msg);
    fprintf(stderr,
            "usage: moetune bench adam [--params N] [--threads T] [--repeats R]\n"
            "                          [--isa auto|scalar|avx2|avx512] [--hugepages] [--json]\n"
            "  --params N      parameters (default 200000000; needs ~33 bytes each)\n"
            "  --threads T     threads (default: one per online core)\n"
            "  --repeats R     timed runs per kernel, the median is reported (default 5)\n"
            "  --isa           SIMD path for moetune's AdamW and the ceiling (default auto)\n"
            "  --hugepages     advise transparent huge pages on the buffers\n"
            "  --json          print one JSON object instead of the table\n");
    return 2;
}

static int parse_size(const char *s, size_t lo, size_t hi, size_t *out) {
    if (!s || !*s) return 0;
    errno = 0;
    char *end = NULL;
    const double d = strtod(s, &end); /* accepts 2e8 as well as 200000000 */
    if (errno || *end || d != floor(d) || d < (double)lo || d > (double)hi) return 0;
    *out = (size_t)d;
    return 1;
}

static int parse_opts(int argc, char **argv, bench_opts_t *o) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    *o = (bench_opts_t){.params = 200000000, .threads = ncpu > 0 ? (int)ncpu : 1, .repeats = 5,
                        .hugepages = 0, .isa = KERN_ISA_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        size_t x;
        if (!strcmp(a, "--json")) o->json = 1;
        else if (!strcmp(a, "--hugepages")) o->hugepages = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) return usage(NULL);
        else if (!strcmp(a, "--params")) {
            if (!parse_size(val, 1, (size_t)1 << 40, &x))
                return usage("--params wants a count >= 1");
            o->params = x, i++;
        } else if (!strcmp(a, "--threads")) {
            if (!parse_size(val, 1, 1024, &x)) return usage("--threads wants 1..1024");
            o->threads = (int)x, i++;
        } else if (!strcmp(a, "--repeats")) {
            if (!parse_size(val, 1, MAX_REPEATS, &x)) return usage("--repeats wants 1..101");
            o->repeats = (int)x, i++;
        } else if (!strcmp(a, "--isa")) {
            if (!val) return usage("--isa wants auto, scalar, avx2 or avx512");
            if (!strcmp(val, "auto")) o->isa = KERN_ISA_AUTO;
            else if (!strcmp(val, "scalar")) o->isa = KERN_ISA_SCALAR;
            else if (!strcmp(val, "avx2")) o->isa = KERN_ISA_AVX2;
            else if (!strcmp(val, "avx512")) o->isa = KERN_ISA_AVX512;
            else return usage("--isa wants auto, scalar, avx2 or avx512");
            i++;
        } else {
            char msg[128];
            snprintf(msg, sizeof msg, "unknown option '%s'", a);
            return usage(msg);
        }
    }
    if (o->isa == KERN_ISA_AUTO) o->isa = kern_cpu_isa_best();
    if (!kern_cpu_isa_supported(o->isa)) {
        fprintf(stderr, "moetune bench adam: this CPU cannot run the %s path (best: %s)\n",
                kern_cpu_isa_name(o->isa), kern_cpu_isa_name(kern_cpu_isa_best()));
        return 2;
    }
    return 0;
}

/* Medians of the repeats. Ratios are medians of per-repeat ratios of runs
 * taken back to back, which cancels most of the drift a shared machine
 * shows between repeats; the ceiling of a repeat is the faster of its two
 * variants (with and without software prefetch). */
typedef struct {
    double med[M_COUNT];  /* seconds */
    double ceil28, ceil30; /* seconds, the faster variant */
    double r_ceil, r_ceil30, r_plain1, r_plaint;
} bench_result_t;

static double median(const double *x, int n) {
    double tmp[MAX_REPEATS];
    memcpy(tmp, x, (size_t)n * sizeof *x);
    qsort(tmp, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? tmp[n / 2] : 0.5 * (tmp[n / 2 - 1] + tmp[n / 2]);
}

static bench_result_t summarise(double times[M_COUNT][MAX_REPEATS], int n) {
    bench_result_t r;
    double c28[MAX_REPEATS], c30[MAX_REPEATS], q[4][MAX_REPEATS];
    for (int k = 0; k < M_COUNT; k++) r.med[k] = median(times[k], n);
    for (int i = 0; i < n; i++) {
        c28[i] = fmin(times[M_CEIL28][i], times[M_CEIL28_PF][i]);
        c30[i] = fmin(times[M_CEIL30][i], times[M_CEIL30_PF][i]);
        q[0][i] = c28[i] / times[M_OURS28][i];
        q[1][i] = c30[i] / times[M_OURS30][i];
        q[2][i] = times[M_PLAIN1][i] / times[M_OURS28][i];
        q[3][i] = times[M_PLAINT][i] / times[M_OURS28][i];
    }
    r.ceil28 = median(c28, n);
    r.ceil30 = median(c30, n);
    r.r_ceil = median(q[0], n);
    r.r_ceil30 = median(q[1], n);
    r.r_plain1 = median(q[2], n);
    r.r_plaint = median(q[3], n);
    return r;
}

static void print_report(const bench_opts_t *o, const bench_result_t *res) {
    const double n = (double)o->params;
    const double *med = res->med;
    double pps[M_COUNT], bps[M_COUNT];
    for (int k = 0; k < M_COUNT; k++) {
        pps[k] = n / med[k];
        bps[k] = pps[k] * k_meas_bytes[k];
    }
    const double ceil28 = n * 28 / res->ceil28, ceil30 = n * 30 / res->ceil30;
    const double r_ceil = res->r_ceil, r_ceil30 = res->r_ceil30;
    const double r_plain1 = res->r_plain1, r_plaint = res->r_plaint;
    if (o->json) {
        char build[256];
        mt_build_info_line(build, sizeof build);
        printf("{\"build\": \"%s\", \"params\": %zu, \"threads\": %d, \"isa\": \"%s\", \"repeats\": %d, "
               "\"hugepages\": %s, "
               "\"params_per_s\": %.6g, \"bytes_per_s\": %.6g, \"seconds\": %.6g, "
               "\"ceiling_bytes_per_s\": %.6g, \"ratio_vs_ceiling\": %.4f, "
               "\"bf16_copy_params_per_s\": %.6g, \"bf16_copy_bytes_per_s\": %.6g, "
               "\"bf16_copy_ceiling_bytes_per_s\": %.6g, \"bf16_copy_ratio_vs_ceiling\": %.4f, "
               "\"scalar_1t_params_per_s\": %.6g, \"scalar_threads_params_per_s\": %.6g, "
               "\"ratio_vs_scalar_1t\": %.4f, \"ratio_vs_scalar_threads\": %.4f, "
               "\"bf16_moments_params_per_s\": %.6g, \"q8_moments_params_per_s\": %.6g, "
               "\"finite_scan_params_per_s\": %.6g, \"finite_fused_params_per_s\": %.6g, "
               "\"out_of_place_params_per_s\": %.6g, \"copy_then_update_params_per_s\": %.6g, "
               "\"bf16_moments_out_of_place_params_per_s\": %.6g, \"q8_moments_out_of_place_params_per_s\": %.6g}\n",
               build, o->params, o->threads, kern_cpu_isa_name(o->isa), o->repeats,
               o->hugepages ? "true" : "false", pps[M_OURS28], bps[M_OURS28], med[M_OURS28],
               ceil28, r_ceil, pps[M_OURS30], bps[M_OURS30], ceil30, r_ceil30,
               pps[M_PLAIN1], pps[M_PLAINT], r_plain1, r_plaint, pps[M_OURS_BF16], pps[M_OURS_8BIT],
               pps[M_SCAN], pps[M_FUSED], pps[M_OOP], pps[M_SAVE], pps[M_OOP_BF16], pps[M_OOP_8BIT]);
        return;
    }
    mt_build_info_print(stdout);
    printf("moetune bench adam: %zu params, %d thread(s), %s path, median of %d, huge pages %s\n",
           o->params, o->threads, kern_cpu_isa_name(o->isa), o->repeats,
           o->hugepages ? "advised" : "off");
    printf("  %-40s %9s %12s %9s\n", "", "time (s)", "G params/s", "GB/s");
    for (int k = 0; k < M_COUNT; k++)
        printf("  %-40s %9.4f %12.3f %9.2f\n", k_meas_name[k], med[k], pps[k] * 1e-9,
               bps[k] * 1e-9);
    printf("  ceiling (faster variant):                          %12.3f %9.2f\n", ceil28 / 28e9,
           ceil28 * 1e-9);
    printf("  ceiling + bf16 store (faster variant):             %12.3f %9.2f\n", ceil30 / 30e9,
           ceil30 * 1e-9);
    printf("  moetune / ceiling:                 %6.1f%%   (with bf16 copy: %.1f%%)\n",
           100 * r_ceil, 100 * r_ceil30);
    printf("  moetune / plain scalar loop:       %6.2fx on 1 thread, %.2fx on %d threads\n",
           r_plain1, r_plaint, o->threads);
}

int mt_bench_adam_main(int argc, char **argv) {
    bench_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;

    bench_arrays_t a = {.n = o.params, .isa = o.isa};
    a.hp = (kern_adamw_params_t){.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                                 .weight_decay = 0.01f, .grad_scale = 1.0f, .step = 0};
    a.chunk = kern_adamw_chunk_elems(a.n, o.threads);
    const size_t n = a.n;
    a.p = big_alloc(n * 4, o.hugepages);
    a.m = big_alloc(n * 4, o.hugepages);
    a.v = big_alloc(n * 4, o.hugepages);
    a.g = big_alloc(n * 4, o.hugepages);
    a.p2 = big_alloc(n * 4, o.hugepages);
    a.m2 = big_alloc(n * 4, o.hugepages);
    a.v2 = big_alloc(n * 4, o.hugepages);
    uint16_t *pb = big_alloc(n * 2, o.hugepages);
    void *mb = big_alloc(kern_moments_bytes(KERN_MOMENTS_BF16, n), o.hugepages);
    void *m8 = big_alloc(kern_moments_bytes(KERN_MOMENTS_8BIT, n), o.hugepages);
    void *mb2 = big_alloc(kern_moments_bytes(KERN_MOMENTS_BF16, n), o.hugepages);
    void *m82 = big_alloc(kern_moments_bytes(KERN_MOMENTS_8BIT, n), o.hugepages);
    if (!a.p || !a.m || !a.v || !a.g || !a.p2 || !a.m2 || !a.v2 || !pb || !mb || !m8 || !mb2 || !m82) {
        fprintf(stderr, "moetune bench adam: cannot allocate %.2f GB for %zu params; try a smaller "
                        "--params\n", (double)n * 33 * 1e-9, n);
        free(a.p), free(a.m), free(a.v), free(a.g), free(a.p2), free(a.m2), free(a.v2), free(pb), free(mb),
            free(m8), free(mb2), free(m82);
        return 1;
    }
    /* zeros: the state before a first step in both formats, touched here */
    memset(mb, 0, kern_moments_bytes(KERN_MOMENTS_BF16, n));
    memset(m8, 0, kern_moments_bytes(KERN_MOMENTS_8BIT, n));
    memset(mb2, 0, kern_moments_bytes(KERN_MOMENTS_BF16, n));
    memset(m82, 0, kern_moments_bytes(KERN_MOMENTS_8BIT, n));
    a.mom_bf16 = kern_moments_view(KERN_MOMENTS_BF16, mb, n, 1);
    a.mom_8bit = kern_moments_view(KERN_MOMENTS_8BIT, m8, n, 1);
    a.mom_bf16_2 = kern_moments_view(KERN_MOMENTS_BF16, mb2, n, 1);
    a.mom_8bit_2 = kern_moments_view(KERN_MOMENTS_8BIT, m82, n, 1);
    kern_threadpool_t *pool = kern_threadpool_create(o.threads);

    /* first touch, in the same task split the kernels use */
    a.pb = pb;
    kern_threadpool_parallel_for(pool, ntasks_of(&a), fill_task, &a);
    for (int k = 0; k < M_COUNT; k++) (void)run_once((meas_t)k, &a, pb, pool); /* warm-up */

    double times[M_COUNT][MAX_REPEATS];
    for (int r = 0; r < o.repeats; r++)
        for (int k = 0; k < M_COUNT; k++) times[k][r] = run_once((meas_t)k, &a, pb, pool);
    const bench_result_t res = summarise(times, o.repeats);
    print_report(&o, &res);

    kern_threadpool_destroy(pool);
    free(a.p), free(a.m), free(a.v), free(a.g), free(a.p2), free(a.m2), free(a.v2), free(pb), free(mb), free(m8);
    free(mb2), free(m82);
    return 0;
}
