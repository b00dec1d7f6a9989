/* Smoke test of `moetune bench adam`: a small run succeeds, --json prints
 * the documented keys, and bad command lines are refused with status 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/bench/adam_bench.h"

static int g_failures;

#define EXPECT(cond, ...)                                    \
    do {                                                     \
        if (!(cond)) {                                       \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                    \
            fprintf(stderr, "\n");                           \
            g_failures++;                                    \
        }                                                    \
    } while (0)

static int run(char **argv) {
    int argc = 0;
    while (argv[argc]) argc++;
    return mt_bench_adam_main(argc, argv);
}

int main(void) {
    /* --json output goes to a file so the test can read it back */
    const char *dir = getenv("TEST_TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/adam_bench.json", dir ? dir : "/tmp");
    fflush(stdout);
    FILE *f = freopen(path, "w", stdout);
    if (!f) {
        fprintf(stderr, "cannot redirect stdout to %s\n", path);
        return 1;
    }
    char *ok_args[] = {"adam", "--params", "100003", "--threads", "2", "--repeats", "3", "--json",
                       NULL};
    const int rc = run(ok_args);
    fflush(stdout);
    EXPECT(rc == 0, "a small run returned %d", rc);

    char buf[4096] = {0};
    FILE *in = fopen(path, "r");
    EXPECT(in != NULL, "cannot read back %s", path);
    if (in) {
        size_t got = fread(buf, 1, sizeof buf - 1, in);
        buf[got] = 0;
        fclose(in);
    }
    static const char *keys[] = {"\"params_per_s\"", "\"bytes_per_s\"", "\"ceiling_bytes_per_s\"",
                                 "\"ratio_vs_ceiling\"", "\"ratio_vs_scalar_1t\"",
                                 "\"bf16_copy_ratio_vs_ceiling\"", "\"bf16_moments_params_per_s\"",
                                 "\"q8_moments_params_per_s\"", "\"out_of_place_params_per_s\"",
                                 "\"copy_then_update_params_per_s\"", "\"bf16_moments_out_of_place_params_per_s\"",
                                 "\"q8_moments_out_of_place_params_per_s\""};
    for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++)
        EXPECT(strstr(buf, keys[k]) != NULL, "--json output lacks %s: %s", keys[k], buf);
    EXPECT(buf[0] == '{' && strchr(buf, '}') != NULL, "--json output is not one object: %s", buf);
    EXPECT(strstr(buf, "\"params\": 100003,") != NULL, "--params not honoured: %s", buf);

    char *bad1[] = {"adam", "--params", "0", NULL};
    char *bad2[] = {"adam", "--frobnicate", NULL};
    char *bad3[] = {"adam", "--isa", "sse9", NULL};
    char *bad4[] = {"adam", "--threads", NULL};
    EXPECT(run(bad1) == 2, "--params 0 was accepted");
    EXPECT(run(bad2) == 2, "an unknown option was accepted");
    EXPECT(run(bad3) == 2, "an unknown --isa was accepted");
    EXPECT(run(bad4) == 2, "--threads without a value was accepted");

    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    fprintf(stderr, "adam bench smoke test passed\n");
    return 0;
}
