/* trace_summary on a hand-made trace: two phases a second apart, device
 * intervals that overlap (the union is the busy time), copies that count
 * as busy but not as kernels, runtime calls inside and outside a phase. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/profile/trace_summary.h"

static int failures;
#define EXPECT(c, ...)                                           \
    do {                                                         \
        if (!(c)) {                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            failures++;                                          \
        }                                                        \
    } while (0)

#define MS 1000000ull /* ns */

int main(void) {
    /* out of order on purpose: the summary sorts */
    ts_event_t ev[] = {
        {1000 * MS + 0, 1000 * MS + 100 * MS, TS_KERNEL, "late"}, /* phase 1, after a 1 s gap */
        {0, 10 * MS, TS_KERNEL, "gemm"},
        {5 * MS, 20 * MS, TS_KERNEL, "gemm"},        /* overlaps: union 0-20 */
        {30 * MS, 40 * MS, TS_COPY, "[memset]"},     /* busy, not a kernel */
        {200 * MS, 210 * MS, TS_KERNEL, "adamw"},    /* gap of 160 ms < 0.3 s: same phase */
        {2 * MS, 3 * MS, TS_API, "cudaLaunchKernel"},
        {100 * MS, 150 * MS, TS_API, "cudaMemcpyAsync"},
        {600 * MS, 700 * MS, TS_API, "cudaFree"}, /* between the phases: in none */
    };
    const size_t n = sizeof ev / sizeof ev[0];
    ts_phase_t ph[4];
    const int np = ts_phases(ev, n, 0.3, ph, 4);
    EXPECT(np == 2, "%d phases, want 2", np);
    EXPECT(ph[0].start_ns == 0 && ph[0].end_ns == 210 * MS, "phase 0 spans %llu-%llu ns",
           (unsigned long long)ph[0].start_ns, (unsigned long long)ph[0].end_ns);
    EXPECT(fabs(ph[0].busy_s - 0.040) < 1e-12, "phase 0 busy %.9f s, want 0.040 (20 + 10 + 10 ms)", ph[0].busy_s);
    EXPECT(ph[0].kernels == 3 && fabs(ph[0].kernel_s - 0.035) < 1e-12, "phase 0: %ld kernels, %.9f s", ph[0].kernels,
           ph[0].kernel_s);
    EXPECT(ph[1].kernels == 1 && fabs(ph[1].busy_s - 0.1) < 1e-12, "phase 1: %ld kernels, busy %.9f s",
           ph[1].kernels, ph[1].busy_s);
    EXPECT(ts_phases(ev, n, 2.0, ph, 4) == 1, "a 2 s gap makes one phase");

    char *text = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&text, &len);
    const ts_options_t opt = {.gap_s = 0.3, .min_span_s = 0.0, .top = 10};
    ts_report(out, ev, n, &opt);
    fclose(out);
    printf("%s", text);
    EXPECT(strstr(text, "== phase 0: span 0.210 s, device busy 0.040 s (19%), 3 kernels (sum 0.035 s)") != NULL,
           "phase 0's header");
    EXPECT(strstr(text, "== phase 1: span 0.100 s, device busy 0.100 s (100%), 1 kernels") != NULL, "phase 1's header");
    const char *gemm = strstr(text, "      25.00 ms       2  gemm"), *adamw = strstr(text, "adamw");
    EXPECT(gemm && adamw && gemm < adamw, "gemm (25 ms over 2) listed before adamw (10 ms)");
    const char *api = strstr(text, "runtime API:"), *memcpy_line = strstr(text, "      50.00 ms       1  cudaMemcpyAsync");
    EXPECT(api && memcpy_line && memcpy_line > api, "the phase's runtime calls after its kernels");
    EXPECT(strstr(text, "cudaFree") == NULL, "a call between phases is in none");
    free(text);
    text = NULL;
    out = open_memstream(&text, &len); /* an empty trace: nothing to say, nothing to crash on */
    ts_report(out, NULL, 0, &opt);
    fclose(out);
    EXPECT(len == 0, "an empty trace printed %zu bytes", len);
    EXPECT(ts_phases(NULL, 0, 0.3, ph, 4) == 0, "an empty trace has phases");
    free(text);
    if (failures) fprintf(stderr, "trace_summary_test: %d failure(s)\n", failures);
    else printf("trace_summary_test: all checks passed\n");
    return failures ? 1 : 0;
}
