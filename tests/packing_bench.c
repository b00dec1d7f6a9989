/* Packed vs padded rows on a skewed length mix: tokens/s and wasted
 * positions, one epoch of forward/backward each on the CPU backend.
 *
 *   bazel run -c opt //tests:packing_bench -- tests/fixtures/ref_mixtral [T] [examples]
 *
 * The data: `examples` examples (default 256), 80% of 8 to T/4 tokens and
 * 20% of T/2 to T (fixed seed), the mix chat and instruction data have.
 * Reports per layout the rows, the fraction of positions that are padding,
 * the wall time of the epoch and the real (non-padding) tokens per second;
 * then the speed-up, both measured in this run. */
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "base/rng.h"
#include "tests/harness.h"

static const char *write_mix(int T, int n, int vocab) {
    static char p[1200];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(p, sizeof p, "%s/packing_bench.jsonl", tmp ? tmp : "/tmp");
    FILE *f = fopen(p, "wb");
    if (!f) return NULL;
    uint64_t s = 12345;
    for (int e = 0; e < n; e++) {
        const uint64_t r = mt_splitmix64(&s);
        const int lo = r % 10 < 8 ? 8 : T / 2, hi = r % 10 < 8 ? T / 4 : T;
        const int len = lo + (int)(mt_splitmix64(&s) % (uint64_t)(hi - lo + 1));
        fputs("{\"input_ids\": [", f);
        for (int t = 0; t < len; t++) fprintf(f, "%s%d", t ? ", " : "", (int)(mt_splitmix64(&s) % (uint64_t)vocab));
        fputs("]}\n", f);
    }
    fclose(f);
    return p;
}

static double run(const char *dir, const char *data, int T, bool pack, int mb, const eng_run_config_t *rc) {
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    mt_error_t err = {0};
    kern_device_t *dev = th_cpu_device(0);
    eng_exec_t *x = NULL;
    if (!dev || eng_exec_load(&x, dev, ckpt, rc->model_config_json, NULL, NULL, &err) != MT_OK) {
        fprintf(stderr, "packing_bench: %s\n", err.msg);
        exit(1);
    }
    eng_dataset_t ds;
    const eng_data_opts_t o = {.T = T, .vocab_size = eng_exec_model(x)->cfg.vocab_size, .pack = pack, .seed = 1};
    if (eng_dataset_load_opts(&ds, &data, 1, &o, &err) != MT_OK) {
        fprintf(stderr, "packing_bench: %s\n", err.msg);
        exit(1);
    }
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, mb, true, 1);
    const int64_t batches = eng_loader_batches_per_epoch(&ld);
    eng_micro_stats_t ms;
    const double t0 = mt_now_s();
    for (int64_t k = 0; k < batches; k++) {
        eng_batch_t b;
        eng_loader_next(&ld, &b);
        if (eng_exec_forward_backward(x, &b, 1.0f, NULL, &ms, &err) != MT_OK) {
            fprintf(stderr, "packing_bench: %s\n", err.msg);
            exit(1);
        }
    }
    const double s = mt_now_s() - t0;
    printf("packing_bench: %-6s rows %5lld  wasted %5.1f%%  epoch %7.3f s  %9.0f real tokens/s\n",
           pack ? "packed" : "padded", (long long)ds.num_rows, 100.0 * (1.0 - eng_dataset_efficiency(&ds)), s,
           (double)ds.real_tokens / s);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_exec_free(x);
    kern_device_destroy(dev);
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: packing_bench FIXTURE_DIR [T] [EXAMPLES]\n");
        return 2;
    }
    const int T = argc > 2 ? atoi(argv[2]) : 256, n = argc > 3 ? atoi(argv[3]) : 256;
    eng_run_config_t rc;
    mt_error_t err = {0};
    if (th_run_config_load(argv[1], &rc, &err) != MT_OK) {
        fprintf(stderr, "packing_bench: %s\n", err.msg);
        return 1;
    }
    const char *data = write_mix(T, n, 90);
    if (!data) return 1;
    const double padded = run(argv[1], data, T, false, 4, &rc);
    const double packed = run(argv[1], data, T, true, 4, &rc);
    printf("packing_bench: T=%d, %d examples, micro-batch 4: packed epoch %.2fx faster than padded\n", T, n,
           padded / packed);
    eng_run_config_free(&rc);
    return 0;
}
