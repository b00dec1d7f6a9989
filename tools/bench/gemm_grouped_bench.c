/* `moetune bench gemm --grouped`: the routed experts' products of one MoE
 * layer, one product per expert against one grouped call, measured in the
 * same run on the same buffers.
 *
 * Per geometry and token spread, the four products the layer issues per
 * projection shape (each over every expert, one kern_mm_grouped call):
 *   forward of gate/up    y_e (M_e, I) = x_e (M_e, H) W_e^T
 *   forward of down       y_e (M_e, H) = h_e (M_e, I) W_e^T
 *   dX of gate/up         dx_e (M_e, H) = dy_e (M_e, I) W_e
 *   dW of gate/up         dW_e (I, H) += dy_e^T x_e   (fp32 accumulator, beta 1)
 * with x, W and dy stored BF16, bf16 compute (fp32 accumulation) and the
 * forward and dX written as F32 and as BF16 (the dW is always F32).
 * Spreads: even (every expert the same rows) and uneven (experts take 0, 1,
 * 2 and 5 shares of the rows in turn, so a quarter get none, as a skewed
 * router leaves them).
 *
 * CUDA: each line three times, MOETUNE_GROUPED_GEMM=loop (one cuBLASLt call
 * per expert), =grouped (cuBLAS's grouped GEMM) and =auto (the default's
 * choice between them), TFLOP/s and grouped / loop;
 * the median of --reps timed calls after one warm-up (a refusal of the
 * grouped call by cuBLAS is said on stderr, and the line then measures the
 * loop twice).  Geometries: Qwen3-30B-A3B (128 experts top-8, 4096 tokens,
 * hidden 2048, moe_intermediate 768) and Mixtral-8x7B (8 experts top-2,
 * 4096 tokens, hidden 4096, intermediate 14336).
 * CPU: the CPU twin's one path, in GFLOP/s, on a small geometry by default
 * (8 experts, 256 rows, 256 x 128) so a test of the command stays fast;
 * --geometry names one of the above to run it on the CPU anyway. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/dtype.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "tools/bench/gemm_bench.h"

typedef struct {
    const char *name;
    int experts, rows; /* routed rows: tokens x top-k */
    int hidden, inter;
} geometry_t;

static const geometry_t k_geometries[] = {
    {"qwen3-30b-a3b", 128, 4096 * 8, 2048, 768},
    {"mixtral-8x7b", 8, 4096 * 2, 4096, 14336},
    {"small", 8, 256, 256, 128},
};

/* One line: per expert e, C (M_e or I, ...) as the product kind says. */
typedef enum { FWD_UP, FWD_DOWN, DX_UP, DW_UP, KINDS } kind_t;
static const char *const k_kind_names[KINDS] = {"forward gate/up", "forward down", "dX gate/up", "dW gate/up"};

static void fill_bf16(uint16_t *h, size_t n, uint32_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        h[i] = mt_f32_to_bf16((float)((seed >> 9) & 0xffff) / 65536.0f - 0.5f);
    }
}

/* Rows per expert: even, or 0, 1, 2, 5 shares in turn (the remainder to the
 * last expert with rows). */
static void spread(const geometry_t *g, bool uneven, int *counts) {
    static const int shares[4] = {0, 1, 2, 5};
    int total_shares = 0, given = 0, last = 0;
    for (int e = 0; e < g->experts; e++) total_shares += uneven ? shares[e % 4] : 1;
    for (int e = 0; e < g->experts; e++) {
        counts[e] = (int)((long long)g->rows * (uneven ? shares[e % 4] : 1) / total_shares);
        given += counts[e];
        if (counts[e] > 0) last = e;
    }
    counts[last] += g->rows - given;
}

/* The descriptors of one line over the packed buffers (x/dy/h rows, W per
 * expert, C rows or per-expert dW). */
static void describe(const geometry_t *g, const int *counts, kind_t kind, mt_dtype_t out_dt, void *act,
                     void *w, void *c, kern_mm_t *mm) {
    const int H = g->hidden, I = g->inter;
    size_t row = 0;
    for (int e = 0; e < g->experts; e++) {
        const int me = counts[e];
        const size_t we = (size_t)e * H * I;
        uint16_t *a = (uint16_t *)act, *wp = (uint16_t *)w + we;
        char *cp = (char *)c;
        kern_mm_t p;
        switch (kind) {
        case FWD_UP: /* x (me, H), W (I, H) */
            p = kern_mm_make((float *)(cp + row * I * mt_dtype_size(out_dt)), a + row * H, MT_BF16, wp, MT_BF16,
                             me, I, H, false, true, 1.0f, 0.0f, MT_BF16);
            break;
        case FWD_DOWN: /* h (me, I), W (H, I) */
            p = kern_mm_make((float *)(cp + row * H * mt_dtype_size(out_dt)), a + row * I, MT_BF16, wp, MT_BF16,
                             me, H, I, false, true, 1.0f, 0.0f, MT_BF16);
            break;
        case DX_UP: /* dy (me, I), W (I, H) */
            p = kern_mm_make((float *)(cp + row * H * mt_dtype_size(out_dt)), a + row * I, MT_BF16, wp, MT_BF16,
                             me, H, I, false, false, 1.0f, 0.0f, MT_BF16);
            break;
        default: /* dW (I, H) += dy^T (I, me) x (me, H); dy and x share act here */
            p = kern_mm_make((float *)cp + we, a + row * I, MT_BF16, a + row * H, MT_BF16, I, H, me, true, false,
                             1.0f, 1.0f, MT_BF16);
            break;
        }
        if (kind != DW_UP) p.C.dtype = out_dt;
        mm[e] = p;
        row += (size_t)me;
    }
}

/* Median seconds of `reps` calls after one warm-up. */
static double time_line(kern_device_t *dev, kern_stream_t *s, const kern_mm_t *mm, int count, int reps) {
    double *t = malloc((size_t)reps * sizeof *t);
    MT_CHECK_ALLOC(t, "timings");
    dev->ops->mm_grouped(s, mm, count);
    for (int r = 0; r < reps; r++) {
        kern_stream_sync(dev, s);
        const double t0 = mt_now_s();
        dev->ops->mm_grouped(s, mm, count);
        kern_stream_sync(dev, s);
        t[r] = mt_now_s() - t0;
    }
    for (int i = 0; i < reps; i++)
        for (int j = i + 1; j < reps; j++)
            if (t[j] < t[i]) {
                const double x = t[i];
                t[i] = t[j];
                t[j] = x;
            }
    const double med = t[reps / 2];
    free(t);
    return med;
}

/* Every line of one geometry; returns 0, or 1 when the device cannot hold it. */
static int bench_geometry(kern_device_t *dev, const geometry_t *g, int reps, bool cuda, mt_error_t *err) {
    const size_t H = (size_t)g->hidden, I = (size_t)g->inter, R = (size_t)g->rows, E = (size_t)g->experts;
    /* act holds x (R, H) and dy (R, I) side by side in one (R, H + I) span:
     * sized for the larger of the two reads at each row offset */
    const size_t wide = H > I ? H : I, act_n = R * wide, w_n = E * H * I;
    const size_t c_n = act_n > w_n ? act_n : w_n; /* floats: the widest output or the dW */
    uint16_t *h = malloc((act_n > w_n ? act_n : w_n) * 2);
    int *counts = malloc(E * sizeof *counts);
    kern_mm_t *mm = malloc(E * sizeof *mm);
    MT_CHECK(h && counts && mm, "out of host memory for the %s geometry", g->name);
    void *act = kern_alloc(dev, act_n * 2, "bench activations", err);
    void *w = act ? kern_alloc(dev, w_n * 2, "bench expert weights", err) : NULL;
    void *c = w ? kern_alloc(dev, c_n * 4, "bench outputs", err) : NULL;
    int rc = c ? 0 : 1;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    if (c) {
        fill_bf16(h, act_n, 1);
        kern_memcpy_h2d(dev, s, act, h, act_n * 2);
        fill_bf16(h, w_n, 2);
        kern_memcpy_h2d(dev, s, w, h, w_n * 2);
        kern_memset(dev, s, c, 0, c_n * 4);
        kern_stream_sync(dev, s);
    }
    for (int uneven = 0; uneven < 2 && rc == 0; uneven++) {
        spread(g, uneven, counts);
        for (int k = 0; k < KINDS; k++)
            for (int o = 0; o < (k == DW_UP ? 1 : 2); o++) {
                const mt_dtype_t out_dt = o ? MT_BF16 : MT_F32;
                describe(g, counts, (kind_t)k, out_dt, act, w, c, mm);
                const double flops = 2.0 * (double)R * (double)H * (double)I;
                char line[96];
                snprintf(line, sizeof line, "%s %s, %s", uneven ? "uneven" : "even", k_kind_names[k],
                         k == DW_UP ? "F32 +=" : mt_dtype_name(out_dt));
                if (!cuda) {
                    const double t = time_line(dev, s, mm, g->experts, reps);
                    printf("%-14s %-36s %10.2f %10s %10s\n", g->name, line, flops / t / 1e9, "-", "-");
                    continue;
                }
                setenv("MOETUNE_GROUPED_GEMM", "loop", 1);
                const double tl = time_line(dev, s, mm, g->experts, reps);
                setenv("MOETUNE_GROUPED_GEMM", "grouped", 1);
                const double tg = time_line(dev, s, mm, g->experts, reps);
                setenv("MOETUNE_GROUPED_GEMM", "auto", 1);
                const double ta = time_line(dev, s, mm, g->experts, reps);
                printf("%-14s %-36s %10.1f %10.1f %9.2fx %10.1f\n", g->name, line, flops / tl / 1e12,
                       flops / tg / 1e12, tl / tg, flops / ta / 1e12);
                fflush(stdout);
            }
    }
    unsetenv("MOETUNE_GROUPED_GEMM");
    if (c) kern_free(dev, c);
    if (w) kern_free(dev, w);
    if (act) kern_free(dev, act);
    free(h);
    free(counts);
    free(mm);
    return rc;
}

int mt_bench_gemm_grouped(kern_device_t *dev, bool cuda, const char *geometry, int reps) {
    mt_error_t err = {0};
    const size_t ng = sizeof k_geometries / sizeof k_geometries[0];
    bool known = geometry == NULL;
    for (size_t i = 0; i < ng && !known; i++) known = strcmp(geometry, k_geometries[i].name) == 0;
    if (!known) {
        fprintf(stderr, "moetune bench gemm: --geometry %s: expected qwen3-30b-a3b, mixtral-8x7b or small\n",
                geometry);
        return 2;
    }
    printf("expert products of one MoE layer, bf16 inputs, fp32 accumulation; median of %d after a warm-up\n",
           reps);
    printf("%-14s %-36s %10s %10s %10s %10s\n", "geometry", "products (all experts)",
           cuda ? "loop TF/s" : "cpu GF/s", cuda ? "group TF/s" : "", cuda ? "group/loop" : "",
           cuda ? "auto TF/s" : "");
    for (size_t i = 0; i < ng; i++) {
        const geometry_t *g = &k_geometries[i];
        const bool small = strcmp(g->name, "small") == 0;
        if (geometry ? strcmp(geometry, g->name) != 0 : small == cuda) continue;
        if (bench_geometry(dev, g, reps, cuda, &err) != 0) {
            fprintf(stderr, "moetune bench gemm: %s geometry: %s\n", g->name, err.msg);
            return 1;
        }
    }
    return 0;
}
