/* `moetune bench gemm`: matrix-product throughput of the backend's kernel
 * table against the machine's peak, measured in one run.
 *
 * CPU backend: OpenBLAS sgemm through kern_mm (fp32 compute), in GFLOP/s
 * against the theoretical fp32 peak of this CPU (cores x clock x FLOPs per
 * cycle, from /proc/cpuinfo and the widest FMA the CPU has; the assumptions
 * are printed; a VM may report a clock it does not sustain, and some CPUs
 * have one AVX-512 FMA unit, so read the percentage with that in mind).
 * Beside each fp32 line, bf16 lines (kern_mm with bf16 compute, A and B
 * stored BF16, C F32) measured in the same run, with their ratio to fp32:
 * on the CPU one line per bf16 path this CPU has (convert + sgemm always,
 * vdpbf16ps with avx512_bf16; the default is marked), against the same
 * fp32 peak (so bf16 may exceed 100%).
 * CUDA backend (when a GPU is present, or --backend cuda): the same table
 * through cuBLASLt (fp32 and bf16 via the kernel table), in TFLOP/s.  The shapes are the step's: square
 * products, a linear layer's forward and weight gradient, and the grouped
 * expert products of a MoE layer.
 * --grouped: a MoE layer's expert products at real geometries, one product
 * per expert against cuBLAS's grouped GEMM (gemm_grouped_bench.c). */
#include "tools/bench/gemm_bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/run/report.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "base/clock.h"
#include "tools/build_info.h"

typedef struct {
    const char *name;
    int M, N, K;
    bool ta, tb;
    int groups; /* > 1: a grouped product of `groups` experts, each M x N x K */
} shape_t;

static const shape_t k_shapes[] = {
    {"square 512", 512, 512, 512, false, false, 1},
    {"square 1024", 1024, 1024, 1024, false, false, 1},
    {"square 2048", 2048, 2048, 2048, false, false, 1},
    {"linear fwd 2048x1024 <- 1024 (x W^T)", 2048, 1024, 1024, false, true, 1},
    {"weight grad 1024x1024 <- 2048 (dY^T X)", 1024, 1024, 2048, true, false, 1},
    {"8 experts: 256 tok x 1024 -> 2816", 256, 2816, 1024, false, true, 8},
};

/* How one line's products are made. */
typedef struct {
    const char *name;
    bool bf16;        /* kern_mm, bf16 compute, A/B stored BF16, C F32 */
    int cpu_path;     /* CPU: kern_cpu_bf16_path_t; -1: the kernel table */
} variant_t;

/* Theoretical fp32 peak: cores x MHz x FLOPs/cycle (2 FMA units of the
 * widest vector width: AVX-512 32 lanes*2, AVX2 16*2). */
static double cpu_peak_gflops(char *why, size_t n) {
    const long cores = sysconf(_SC_NPROCESSORS_ONLN);
    double mhz = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "cpu MHz", 7) == 0) {
            const char *c = strchr(line, ':');
            if (c) mhz = atof(c + 1);
            break;
        }
    if (f) fclose(f);
    __builtin_cpu_init();
    const bool avx512 = __builtin_cpu_supports("avx512f"), avx2 = __builtin_cpu_supports("avx2");
    const int flops_per_cycle = avx512 ? 64 : avx2 ? 32 : 8;
    snprintf(why, n, "%ld cores x %.0f MHz x %d FLOP/cycle (%s, 2 FMA units assumed)", cores, mhz,
             flops_per_cycle, avx512 ? "AVX-512" : avx2 ? "AVX2+FMA" : "SSE");
    return (double)cores * mhz * 1e-3 * flops_per_cycle;
}

static void fill(float *x, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f;
    }
}

/* Median seconds of one product (or grouped product). */
static double time_shape(kern_device_t *dev, const shape_t *sh, const variant_t *v, int reps,
                         mt_error_t *err) {
    const size_t a_n = (size_t)sh->M * sh->K * sh->groups, b_n = (size_t)sh->K * sh->N * sh->groups,
                 c_n = (size_t)sh->M * sh->N * sh->groups;
    float *ha = malloc(a_n * sizeof *ha), *hb = malloc(b_n * sizeof *hb);
    MT_CHECK(ha && hb, "out of memory");
    fill(ha, a_n, 1);
    fill(hb, b_n, 2);
    if (v->bf16) { /* stored BF16: the first half of each buffer */
        for (size_t i = 0; i < a_n; i++) ((uint16_t *)ha)[i] = mt_f32_to_bf16(ha[i]);
        for (size_t i = 0; i < b_n; i++) ((uint16_t *)hb)[i] = mt_f32_to_bf16(hb[i]);
    }
    const size_t ab_size = v->bf16 ? 2 : 4;
    float *a = kern_alloc(dev, a_n * sizeof(float), "bench A", err);
    float *b = a ? kern_alloc(dev, b_n * sizeof(float), "bench B", err) : NULL;
    float *c = b ? kern_alloc(dev, c_n * sizeof(float), "bench C", err) : NULL;
    double result = -1;
    if (c) {
        kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(dev, s, a, ha, a_n * ab_size);
        kern_memcpy_h2d(dev, s, b, hb, b_n * ab_size);
        kern_mm_t *mm = calloc((size_t)sh->groups, sizeof *mm);
        MT_CHECK_ALLOC(mm, "descriptors");
        for (int g = 0; g < sh->groups; g++) {
            const size_t ao = (size_t)g * sh->M * sh->K, bo = (size_t)g * sh->K * sh->N;
            mm[g] = (kern_mm_t){
                .C = {c + (size_t)g * sh->M * sh->N, MT_F32, sh->M, sh->N},
                .A = {(char *)a + ao * ab_size, v->bf16 ? MT_BF16 : MT_F32, sh->ta ? sh->K : sh->M,
                      sh->ta ? sh->M : sh->K},
                .B = {(char *)b + bo * ab_size, v->bf16 ? MT_BF16 : MT_F32, sh->tb ? sh->N : sh->K,
                      sh->tb ? sh->K : sh->N},
                .trans_a = sh->ta, .trans_b = sh->tb, .alpha = 1.0f, .beta = 0.0f,
                .compute = v->bf16 ? MT_BF16 : MT_F32};
        }
        double *t = malloc((size_t)(reps + 1) * sizeof *t);
        MT_CHECK_ALLOC(t, "timings");
        for (int r = 0; r <= reps; r++) { /* r = 0 warms up */
            kern_stream_sync(dev, s);
            const double t0 = mt_now_s();
            if (v->cpu_path >= 0)
                kern_mm_grouped_cpu_path(s, mm, sh->groups, (kern_cpu_bf16_path_t)v->cpu_path);
            else if (v->bf16 || sh->groups > 1) dev->ops->mm_grouped(s, mm, sh->groups);
            else dev->ops->mm(s, mm);
            kern_stream_sync(dev, s);
            t[r] = mt_now_s() - t0;
        }
        /* median of the timed repetitions */
        for (int i = 1; i <= reps; i++)
            for (int j = i + 1; j <= reps; j++)
                if (t[j] < t[i]) {
                    const double tmp = t[i];
                    t[i] = t[j];
                    t[j] = tmp;
                }
        result = t[1 + reps / 2];
        free(t);
        free(mm);
    }
    if (c) kern_free(dev, c);
    if (b) kern_free(dev, b);
    if (a) kern_free(dev, a);
    free(ha);
    free(hb);
    return result;
}

int mt_bench_gemm_main(int argc, char **argv) {
    int reps = 0;
    bool json = false, want_cuda = false, grouped = false;
    const char *geometry = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) json = true;
        else if (strcmp(argv[i], "--grouped") == 0) grouped = true;
        else if (strcmp(argv[i], "--geometry") == 0 && i + 1 < argc) geometry = argv[++i];
        else if (strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = atoi(argv[++i]);
        else if (strcmp(argv[i], "--backend") == 0 && i + 1 < argc) want_cuda = strcmp(argv[++i], "cuda") == 0;
        else {
            fprintf(stderr, "usage: moetune bench gemm [--backend cpu|cuda] [--reps N] [--json]\n"
                            "       moetune bench gemm --grouped [--backend cpu|cuda] [--geometry "
                            "qwen3-30b-a3b|mixtral-8x7b|small] [--reps N]\n");
            return 2;
        }
    }
    if (grouped && json) {
        fprintf(stderr, "moetune bench gemm: --grouped prints a table only (no --json)\n");
        return 2;
    }
    if (geometry && !grouped) {
        fprintf(stderr, "moetune bench gemm: --geometry goes with --grouped\n");
        return 2;
    }
    if (reps < 1) reps = grouped ? 10 : 5;
    mt_error_t err = {0};
    char why[256];
    const bool cuda = want_cuda;
    if (cuda && !kern_cuda_available(why, sizeof why)) {
        fprintf(stderr, "moetune bench gemm: no usable GPU (%s)\n", why);
        return 1;
    }
    kern_device_t *dev = NULL;
    if (kern_device_create(cuda ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU, NULL, &dev, &err) != MT_OK) {
        fprintf(stderr, "moetune bench gemm: %s\n", err.msg);
        return 1;
    }
    if (grouped) {
        char build[256];
        mt_build_info_line(build, sizeof build);
        printf("%s\nbackend %s\n", build, dev->vt->name);
        const int grc = mt_bench_gemm_grouped(dev, cuda, geometry, reps);
        kern_device_destroy(dev);
        return grc;
    }
    char peak_why[256] = "";
    const double peak = cuda ? 0 : cpu_peak_gflops(peak_why, sizeof peak_why);
    /* fp32 first (the ratios' baseline), then the bf16 lines */
    variant_t vars[2 + KERN_CPU_BF16_PATHS];
    char var_names[KERN_CPU_BF16_PATHS][64];
    int nv = 0;
    vars[nv++] = (variant_t){"fp32", false, -1};
    if (cuda) {
        vars[nv++] = (variant_t){"bf16", true, -1};
    } else {
        for (int pth = 0; pth < KERN_CPU_BF16_PATHS; pth++) {
            if (!kern_cpu_bf16_path_available((kern_cpu_bf16_path_t)pth)) continue;
            snprintf(var_names[pth], sizeof var_names[pth], "bf16 %s%s",
                     kern_cpu_bf16_path_name((kern_cpu_bf16_path_t)pth),
                     pth == (int)kern_cpu_bf16_path_default() ? " (default)" : "");
            vars[nv++] = (variant_t){var_names[pth], true, pth};
        }
    }
    char build[256];
    mt_build_info_line(build, sizeof build);
    if (!json) {
        printf("%s\n", build);
        printf("backend %s; %s\n", dev->vt->name, cuda ? "" : peak_why);
        printf("%-40s %-34s %10s %10s %8s\n", "shape", "compute", cuda ? "TFLOP/s" : "GFLOP/s",
               "% of peak", "vs fp32");
    } else {
        printf("{\"build\": \"%s\", \"backend\": \"%s\", \"peak_gflops\": %.1f, \"results\": [", build,
               dev->vt->name, peak);
    }
    int rc = 0, lines = 0;
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0] && rc == 0; i++) {
        const shape_t *sh = &k_shapes[i];
        double fp32_gflops = 0;
        for (int vi = 0; vi < nv; vi++) {
            const double s = time_shape(dev, sh, &vars[vi], reps, &err);
            if (s < 0) {
                fprintf(stderr, "moetune bench gemm: %s\n", err.msg);
                rc = 1;
                break;
            }
            const double gflops = 2.0 * sh->M * sh->N * sh->K * sh->groups / s / 1e9;
            if (vi == 0) fp32_gflops = gflops;
            const double ratio = fp32_gflops > 0 ? gflops / fp32_gflops : 0;
            if (json)
                printf("%s{\"shape\": \"%s\", \"compute\": \"%s\", \"gflops\": %.2f, "
                       "\"fraction_of_peak\": %.4f, \"vs_fp32\": %.3f}",
                       lines++ ? ", " : "", sh->name, vars[vi].name, gflops,
                       peak > 0 ? gflops / peak : 0, ratio);
            else
                printf("%-40s %-34s %10.2f %9.1f%% %7.2fx\n", vi ? "" : sh->name, vars[vi].name,
                       cuda ? gflops / 1e3 : gflops, peak > 0 ? 100 * gflops / peak : 0, ratio);
        }
    }
    if (json) printf("]}\n");
    kern_device_destroy(dev);
    return rc;
}
