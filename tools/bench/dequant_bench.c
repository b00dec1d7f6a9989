/* dequant_bench: kern_dequant (kernels/dequant.h) on one device, every
 * format, against the plain bf16 -> fp32 widening of the same number of
 * elements measured in the same run (kern_bf16_to_f32: what a bf16 base's
 * working copy costs today).  Prints one line per format: the best of
 * `reps` runs, elements per second, and the ratio to the baseline.
 *
 *   bazel run //tools/bench:dequant_bench -- [cpu|cuda] [elements] [reps]
 *
 * Defaults: cpu, 16M elements (a 4096 x 4096 projection), 5 runs.  Codes
 * and scales are random; the values do not change the work. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/quant.h"
#include "kernels/device.h"
#include "kernels/ops.h"

typedef struct {
    kern_device_t *dev;
    kern_stream_t *s;
    int reps;
} bench_t;

static void *upload_random(bench_t *b, size_t bytes, uint64_t *seed, bool positive_floats) {
    uint8_t *h = malloc(bytes);
    MT_CHECK_ALLOC(h, "bench buffer");
    for (size_t i = 0; i < bytes; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = (uint8_t)(*seed >> 56);
    }
    if (positive_floats)
        for (size_t i = 0; i + 4 <= bytes; i += 4) {
            const float v = 0.01f + (float)h[i] / 256.0f;
            memcpy(h + i, &v, 4);
        }
    void *d = kern_alloc(b->dev, bytes, "bench", NULL);
    kern_memcpy_h2d(b->dev, b->s, d, h, bytes);
    kern_stream_sync(b->dev, b->s);
    free(h);
    return d;
}

/* Best of reps: seconds for one dequant of q (or the baseline when q is NULL). */
static double time_one(bench_t *b, const mt_quant_view_t *q, void *out, const uint16_t *bf16_src, size_t n) {
    double best = 1e30;
    for (int r = 0; r < b->reps; r++) {
        kern_stream_sync(b->dev, b->s);
        const double t0 = mt_now_s();
        if (q) b->dev->ops->dequant(b->s, out, MT_BF16, q);
        else b->dev->ops->bf16_to_f32(b->s, out, bf16_src, n);
        kern_stream_sync(b->dev, b->s);
        const double t = mt_now_s() - t0;
        if (t < best) best = t;
    }
    return best;
}

int main(int argc, char **argv) {
    const bool cuda = argc > 1 && strcmp(argv[1], "cuda") == 0;
    const int64_t want = argc > 2 ? atoll(argv[2]) : (int64_t)16 << 20;
    bench_t b = {.reps = argc > 3 ? atoi(argv[3]) : 5};
    const int64_t cols = 4096, rows = (want + cols - 1) / cols, n = rows * cols;
    if (rows < 8 || b.reps < 1) {
        fprintf(stderr, "dequant_bench: [cpu|cuda] [elements >= 32768] [reps >= 1]\n");
        return 2;
    }
    kern_device_opts_t o = {0};
    mt_error_t err = {0};
    if (kern_device_create(cuda ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU, &o, &b.dev, &err) != MT_OK) {
        fprintf(stderr, "dequant_bench: %s\n", err.msg);
        return 1;
    }
    b.s = kern_stream(b.dev, KERN_STREAM_COMPUTE);
    uint64_t seed = 1;
    void *out = kern_alloc(b.dev, (size_t)n * 4, "out", NULL);
    uint16_t *src = upload_random(&b, (size_t)n * 2, &seed, false);
    const double base = time_one(&b, NULL, out, src, (size_t)n);
    printf("dequant_bench: %s, [%lld, %lld] = %lld elements, best of %d\n", cuda ? "cuda" : "cpu", (long long)rows,
           (long long)cols, (long long)n, b.reps);
    printf("  %-22s %9.3f ms  %7.2f Gelem/s  1.00x\n", "bf16 -> fp32 (baseline)", base * 1e3, (double)n / base / 1e9);
    float map[256];
    mt_bnb_dynamic_map(map);
    float *dmap = upload_random(&b, sizeof map, &seed, true);
    kern_memcpy_h2d(b.dev, b.s, dmap, map, sizeof map);
    const mt_quant_view_t shapes[] = {
        {.format = MT_QUANT_FP8_BLOCK, .block = 128, .block_cols = 128},
        {.format = MT_QUANT_MXFP4, .block = 32},
        {.format = MT_QUANT_NF4, .block = 64},
        {.format = MT_QUANT_NF4, .block = 64, .block2 = 256},
        {.format = MT_QUANT_INT4, .block = 128},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof *shapes; i++) {
        mt_quant_view_t q = shapes[i];
        q.rows = rows;
        q.cols = cols;
        if (q.block2) q.code2 = map; /* marks it double-quantised for mt_quant_expect */
        mt_quant_sizes_t need;
        if (mt_quant_expect(&q, &need, "bench", &err) != MT_OK) {
            fprintf(stderr, "dequant_bench: %s\n", err.msg);
            return 1;
        }
        void *bufs[5] = {0};
        const size_t bytes[5] = {(size_t)need.codes * (q.format == MT_QUANT_INT4 ? 4 : 1), (size_t)need.scales * 4,
                                 (size_t)need.scales_u8, (size_t)need.zeros * 4, (size_t)need.absmax2 * 4};
        for (int k = 0; k < 5; k++)
            if (bytes[k]) bufs[k] = upload_random(&b, bytes[k], &seed, k == 1 || k == 4);
        q.codes = bufs[0];
        q.scales = bufs[1];
        q.scales_u8 = bufs[2];
        q.zeros = bufs[3];
        q.absmax2 = bufs[4];
        if (q.block2) q.code2 = dmap;
        const double t = time_one(&b, &q, out, NULL, 0);
        char name[32];
        snprintf(name, sizeof name, "%s%s -> bf16", mt_quant_format_name(q.format), q.block2 ? " dq" : "");
        printf("  %-22s %9.3f ms  %7.2f Gelem/s  %.2fx  (%.4f bytes/param)\n", name, t * 1e3, (double)n / t / 1e9,
               t / base, mt_quant_bytes_per_param(q.format, q.block, q.block2 != 0));
        for (int k = 0; k < 5; k++)
            if (bufs[k]) kern_free(b.dev, bufs[k]);
    }
    kern_free(b.dev, dmap);
    kern_free(b.dev, src);
    kern_free(b.dev, out);
    kern_device_destroy(b.dev);
    return 0;
}
