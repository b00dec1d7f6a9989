/* mt_first_nonfinite_f32: the first NaN / +Inf / -Inf is found wherever it
 * sits (first element, inside a vector block, in the scalar tail, after a
 * block boundary, at an unaligned start), finite extremes (FLT_MAX,
 * subnormals, -0) are not flagged, and the coordinate string is right. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/finite.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

int main(void) {
    enum { N = 3000 };
    float *x = malloc((N + 1) * sizeof *x);
    if (!x) return 1;
    for (int i = 0; i <= N; i++) x[i] = (i % 3 == 0) ? FLT_MAX : (i % 3 == 1) ? -FLT_MIN / 4 : -0.0f;
    expect(mt_first_nonfinite_f32(x, N + 1) == MT_ALL_FINITE, "finite extremes flagged");
    expect(mt_first_nonfinite_f32(x, 0) == MT_ALL_FINITE, "empty buffer flagged");
    const size_t at[] = {0, 7, 255, 256, 257, 511, 700, 767, 768, 999, 1023, 1024, 1025, 2047, 2500};
    const float vals[] = {NAN, INFINITY, -INFINITY};
    for (size_t a = 0; a < sizeof at / sizeof at[0]; a++)
        for (int v = 0; v < 3; v++) {
            const float keep = x[at[a]];
            x[at[a]] = vals[v];
            char what[96];
            snprintf(what, sizeof what, "%g at %zu not found first", (double)vals[v], at[a]);
            expect(mt_first_nonfinite_f32(x, N) == at[a], what);
            if (at[a] > 0) {
                snprintf(what, sizeof what, "%g at %zu (unaligned start) not found", (double)vals[v], at[a]);
                expect(mt_first_nonfinite_f32(x + 1, N - 1) == at[a] - 1, what);
            }
            x[at[a] + 1 <= N ? at[a] + 1 : at[a]] = NAN; /* a later hit must not win */
            expect(mt_first_nonfinite_f32(x, N) == at[a], "a later hit won");
            for (int i = 0; i <= N; i++) x[i] = (i % 3 == 0) ? FLT_MAX : (i % 3 == 1) ? -FLT_MIN / 4 : -0.0f;
            (void)keep;
        }
    x[N] = NAN; /* past n: not looked at */
    expect(mt_first_nonfinite_f32(x, N) == MT_ALL_FINITE, "element past n was read");
    expect(strcmp(mt_nonfinite_name(NAN), "NaN") == 0 && strcmp(mt_nonfinite_name(-INFINITY), "-Inf") == 0 &&
               strcmp(mt_nonfinite_name(INFINITY), "+Inf") == 0,
           "names");
    char buf[64];
    const int64_t shape[3] = {4, 5, 6};
    mt_index_to_str(buf, sizeof buf, 2 * 30 + 3 * 6 + 5, 3, shape);
    expect(strcmp(buf, "[2, 3, 5]") == 0, "coordinate of element 83 in (4, 5, 6)");
    free(x);
    if (failures) return 1;
    printf("finite_test: ok\n");
    return 0;
}
