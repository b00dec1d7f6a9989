/* `moetune bench gemm --grouped` on the CPU backend: the small geometry's
 * table has every line (2 spreads x (3 products x 2 output dtypes + the dW))
 * with a positive, finite rate, and bad arguments are refused with 2. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/bench/gemm_bench.h"

static int run(int argc, char **argv, char *out, size_t cap) {
    fflush(stdout);
    FILE *tmp = tmpfile();
    if (!tmp) return -1;
    const int saved = dup(1);
    dup2(fileno(tmp), 1);
    const int rc = mt_bench_gemm_main(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(tmp);
    const size_t n = fread(out, 1, cap - 1, tmp);
    out[n] = '\0';
    fclose(tmp);
    return rc;
}

int main(void) {
    int failures = 0;
    static char out[1 << 16];
    char *ok_args[] = {"gemm", "--grouped", "--reps", "2"};
    int rc = run(4, ok_args, out, sizeof out);
    fputs(out, stdout);
    if (rc != 0) {
        fprintf(stderr, "FAIL: bench gemm --grouped returned %d\n", rc);
        failures++;
    }
    int lines = 0;
    for (char *l = strtok(out, "\n"); l; l = strtok(NULL, "\n")) {
        if (strncmp(l, "small ", 6) != 0) continue;
        /* the rate is the first number after the product's name */
        const char *comma = strchr(l, ',');
        const char *num = comma ? strpbrk(comma, "0123456789") : NULL;
        if (num && (strncmp(num, "32", 2) == 0 || strncmp(num, "16", 2) == 0)) num = strpbrk(num + 2, "0123456789");
        const double rate = num ? atof(num) : 0.0;
        if (!(rate > 0.0) || !isfinite(rate)) {
            fprintf(stderr, "FAIL: no positive rate in line '%s'\n", l);
            failures++;
        }
        lines++;
    }
    if (lines != 14) {
        fprintf(stderr, "FAIL: %d lines for the small geometry, expected 14\n", lines);
        failures++;
    }
    char *bad_geom[] = {"gemm", "--grouped", "--geometry", "nope"};
    char *bad_mix[] = {"gemm", "--grouped", "--json"};
    char *bad_alone[] = {"gemm", "--geometry", "small"};
    char **bad[] = {bad_geom, bad_mix, bad_alone};
    const int bad_n[] = {4, 3, 3};
    for (int i = 0; i < 3; i++) {
        rc = run(bad_n[i], bad[i], out, sizeof out);
        if (rc != 2) {
            fprintf(stderr, "FAIL: bad arguments case %d returned %d, expected 2\n", i, rc);
            failures++;
        }
    }
    printf("%s\n", failures ? "FAILED" : "ok");
    return failures ? 1 : 0;
}
