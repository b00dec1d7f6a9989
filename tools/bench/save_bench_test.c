/* Smoke test of `moetune bench save`: one repeat of the quick start model
 * succeeds and prints the documented JSON keys with positive numbers, and
 * bad command lines are refused with status 2. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/bench/save_bench.h"

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
    return mt_bench_save_main(argc, argv);
}

int main(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    char dir[1024], out[1100];
    snprintf(dir, sizeof dir, "%s", tmp && tmp[0] ? tmp : "/tmp");
    snprintf(out, sizeof out, "%s/save_bench.json", dir);
    fflush(stdout);
    FILE *f = freopen(out, "w", stdout);
    EXPECT(f != NULL, "cannot redirect stdout to %s", out);
    int rc = run((char *[]){"save", "--repeats", "1", "--dir", dir, "--json", NULL});
    fflush(stdout);
    EXPECT(rc == 0, "bench save returned %d", rc);
    FILE *in = fopen(out, "r");
    char line[4096] = "";
    if (in) {
        if (!fgets(line, sizeof line, in)) line[0] = '\0';
        fclose(in);
    }
    const char *keys[] = {"\"bytes\": ", "\"save_s\": ", "\"save_gb_per_s\": ", "\"disk_gb_per_s\": ",
                          "\"ratio_vs_disk\": "};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
        const char *at = strstr(line, keys[i]);
        EXPECT(at && atof(at + strlen(keys[i])) > 0, "no positive %s in: %s", keys[i], line);
    }
    EXPECT(run((char *[]){"save", "--scale", "0", NULL}) == 2, "--scale 0 accepted");
    EXPECT(run((char *[]){"save", "--bogus", NULL}) == 2, "--bogus accepted");
    if (g_failures) fprintf(stderr, "save_bench_test: %d failure(s)\n", g_failures);
    return g_failures != 0;
}
