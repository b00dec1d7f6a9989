/* Calibration on the machine at hand (small sizes, so it is quick): every
 * measured rate is positive and finite, the profile made from it plans
 * with those rates, and a throttled link is planned at its throttle. */
#include "engine/run/calibrate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define EXPECT(c, ...)                                                                  \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

int main(void) {
    eng_calibrate_opts_t o = {.gemm_n = 128, .stream_bytes = (size_t)4 << 20, .reps = 2};
    sched_calibration_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_calibrate(NULL, &o, &c, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    /* lower bounds far below any machine this runs on (and above zero): 100 MFLOP/s, 10 MB/s */
    EXPECT(isfinite(c.sgemm_flops) && c.sgemm_flops > 1e8, "sgemm %g FLOP/s", c.sgemm_flops);
    EXPECT(isfinite(c.bf16_gemm_flops) && c.bf16_gemm_flops > 1e8, "bf16 gemm %g FLOP/s", c.bf16_gemm_flops);
    EXPECT(isfinite(c.memcpy_bw) && c.memcpy_bw > 1e7, "memcpy %g B/s", c.memcpy_bw);
    EXPECT(isfinite(c.stream_bw) && c.stream_bw > 1e7, "stream %g B/s", c.stream_bw);
    EXPECT(c.cores >= 1 && c.host_memory > 1e8, "cores %d memory %g", c.cores, c.host_memory);
    EXPECT(c.link_bw == 0 && c.link_latency_s == 0, "no throttle without a run config");
    sched_hw_t hw;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == c.bf16_gemm_flops && sched_hw_h2d_bw(&hw) == c.memcpy_bw,
           "profile from the measurement");

    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.link_gbps = 2.5;
    rc.link_latency_us = 20;
    st = eng_calibrate(&rc, &o, &c, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_h2d_bw(&hw) == 2.5e9 && fabs(hw.copy_latency_s - 20e-6) < 1e-15, "throttled link %g",
           sched_hw_h2d_bw(&hw));
    eng_run_config_free(&rc);
    if (failures) fprintf(stderr, "calibrate_test: %d failure(s)\n", failures);
    else printf("calibrate_test: sgemm %.1f GFLOP/s, memcpy %.1f GB/s, stream %.1f GB/s, %d cores\n",
                c.sgemm_flops / 1e9, c.memcpy_bw / 1e9, c.stream_bw / 1e9, c.cores);
    return failures != 0;
}
