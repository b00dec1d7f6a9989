/* Smoke test of `moetune bench staging`: a small run succeeds with every
 * mode, --json prints the documented keys, the host gradients agree across
 * modes, compact moves each block in at most 3 copies per direction, and
 * bad command lines are refused with status 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/bench/staging_bench.h"

static int g_failures;

#define EXPECT(cond, ...)                                        \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            g_failures++;                                        \
        }                                                        \
    } while (0)

static int run(char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    return mt_bench_staging_main(argc, argv);
}

int main(void) {
    const char *dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
    char out[4096], svg[4096];
    snprintf(out, sizeof out, "%s/staging_bench.json", dir);
    snprintf(svg, sizeof svg, "%s/staging_bench.svg", dir);
    fflush(stdout);
    if (!freopen(out, "w", stdout)) {
        fprintf(stderr, "cannot redirect stdout to %s\n", out);
        return 1;
    }
    char *ok[] = {"staging", "--layers", "3", "--experts", "8", "--active", "5", "--hidden", "64", "--inter",
                  "32", "--vocab", "512", "--steps", "1", "--repeats", "2", "--gbps", "4", "--latency-us", "5", "--svg", svg,
                  "--json", NULL};
    const int rc = run(ok);
    fflush(stdout);
    EXPECT(rc == 0, "a small run returned %d", rc);
    static char buf[1 << 16];
    FILE *in = fopen(out, "r");
    size_t got = in ? fread(buf, 1, sizeof buf - 1, in) : 0;
    buf[got] = 0;
    if (in) fclose(in);
    static const char *keys[] = {"\"compact_vs_per_tensor_throughput\"", "\"max_slot_vs_compact_pinned\"",
                                 "\"identical_across_modes\": true", "\"mode\": \"compact\"",
                                 "\"mode\": \"per_tensor\"", "\"mode\": \"max_slot\"", "\"peak_reserved_bytes\"",
                                 "\"waste_pct\"", "\"h2d_mean_copy_bytes\"", "\"wait_s\""};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        EXPECT(strstr(buf, keys[k]) != NULL, "--json output lacks %s: %s", keys[k], buf);
    /* the first mode listed is compact: its per-block copy maxima come first */
    const char *mc = strstr(buf, "\"max_copies_per_block\": [");
    int h2d = 99, d2h = 99;
    EXPECT(mc && sscanf(mc, "\"max_copies_per_block\": [%d, %d]", &h2d, &d2h) == 2 && h2d <= 3 && d2h <= 3,
           "compact moved a block in %d H2D / %d D2H copies (at most 3 expected)", h2d, d2h);
    FILE *s = fopen(svg, "r");
    EXPECT(s != NULL, "--svg %s not written", svg);
    if (s) fclose(s);

    char *bad1[] = {"staging", "--layers", "zero", NULL};
    char *bad2[] = {"staging", "--modes", "compact,bogus", NULL};
    char *bad3[] = {"staging", "--active", "9", "--experts", "8", NULL};
    char *bad4[] = {"staging", "--frobnicate", NULL};
    EXPECT(run(bad1) == 2, "--layers zero accepted");
    EXPECT(run(bad2) == 2, "--modes with an unknown mode accepted");
    EXPECT(run(bad3) == 2, "--active above --experts accepted");
    EXPECT(run(bad4) == 2, "an unknown option accepted");
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    fprintf(stderr, "staging_bench_test: all checks passed\n");
    return 0;
}
