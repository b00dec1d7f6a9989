/* Calibration on the machine at hand (small sizes, so it is quick): every
 * measured rate is positive and finite, the profile made from it plans
 * with those rates, and a throttled link is planned at its throttle. */
#include "engine/run/calibrate.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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
    eng_calibrate_opts_t o = {.gemm_n = 128, .stream_bytes = (size_t)4 << 20, .reps = 2,
                              .adam_params = (size_t)1 << 20, .attn_flops = 2e8};
    sched_calibration_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_calibrate(NULL, NULL, &o, &c, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    /* lower bounds far below any machine this runs on (and above zero): 100 MFLOP/s, 10 MB/s */
    EXPECT(isfinite(c.sgemm_flops) && c.sgemm_flops > 1e8, "sgemm %g FLOP/s", c.sgemm_flops);
    EXPECT(isfinite(c.bf16_gemm_flops) && c.bf16_gemm_flops > 1e8, "bf16 gemm %g FLOP/s", c.bf16_gemm_flops);
    EXPECT(isfinite(c.memcpy_bw) && c.memcpy_bw > 1e7, "memcpy %g B/s", c.memcpy_bw);
    EXPECT(isfinite(c.stream_bw) && c.stream_bw > 1e7, "stream %g B/s", c.stream_bw);
    EXPECT(c.cores >= 1 && c.host_memory > 1e8, "cores %d memory %g", c.cores, c.host_memory);
    EXPECT(c.link_bw == 0 && c.link_latency_s == 0, "no throttle without a run config");
    /* the host's work beside the copies, and the fp32 attention kernel (no run shape: fp32) */
    EXPECT(isfinite(c.pack_bw) && c.pack_bw > 1e7 && isfinite(c.unpack_bw) && c.unpack_bw > 1e7, "pack %g unpack %g B/s",
           c.pack_bw, c.unpack_bw);
    EXPECT(isfinite(c.adamw_bw) && c.adamw_bw > 1e7, "AdamW %g B/s", c.adamw_bw);
    EXPECT(isfinite(c.adamw_bf16_rate) && c.adamw_bf16_rate > 1e5 && isfinite(c.adamw_8bit_rate) &&
               c.adamw_8bit_rate > 1e5,
           "AdamW with bf16 / 8-bit moments %g / %g parameters/s", c.adamw_bf16_rate, c.adamw_8bit_rate);
    EXPECT(!c.attn_tc && isfinite(c.attn_flops[SCHED_DIR_FWD]) && c.attn_flops[SCHED_DIR_FWD] > 1e7 &&
               isfinite(c.attn_flops[SCHED_DIR_BWD]) && c.attn_flops[SCHED_DIR_BWD] > 1e7,
           "attention %g / %g FLOP/s", c.attn_flops[SCHED_DIR_FWD], c.attn_flops[SCHED_DIR_BWD]);
    sched_hw_t hw;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == c.bf16_gemm_flops && sched_hw_h2d_bw(&hw) == c.memcpy_bw,
           "profile from the measurement");
    EXPECT(hw.pack_bw == c.pack_bw && hw.unpack_bw == c.unpack_bw && hw.adamw_bw == c.adamw_bw &&
               hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] == c.attn_flops[SCHED_DIR_BWD] &&
               hw.assumed == SCHED_HW_ASSUMED_ATTN_TC,
           "measured rates in the profile, only the unmeasured path assumed: %#x", hw.assumed);

    /* a bf16 run of a shape the tensor-core path takes measures it (the
     * CPU twin); packed rows and odd head dims fall back to the fp32 kernel */
    eng_calibrate_attn_t a = {.B = 1, .T = 4096, .heads = 4, .kv_heads = 2, .head_dim = 64, .bf16 = true};
    st = eng_calibrate(NULL, &a, &o, &c, &err);
    EXPECT(st == MT_OK && c.attn_tc && c.attn_flops[SCHED_DIR_FWD] > 1e7, "tc twin: %s %g", err.msg,
           c.attn_flops[SCHED_DIR_FWD]);
    sched_hw_from_calibration(&c, &hw);
    EXPECT(hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD] == c.attn_flops[SCHED_DIR_FWD] &&
               (hw.assumed & SCHED_HW_ASSUMED_ATTN_KERNEL) && !(hw.assumed & SCHED_HW_ASSUMED_ATTN_TC),
           "tc path measured");
    a.head_dim = 12;
    st = eng_calibrate(NULL, &a, &o, &c, &err);
    EXPECT(st == MT_OK && !c.attn_tc && c.attn_flops[SCHED_DIR_BWD] > 1e7, "head dim 12: the fp32 kernel");
    a.head_dim = 64, a.packed = true;
    st = eng_calibrate(NULL, &a, &o, &c, &err);
    EXPECT(st == MT_OK && !c.attn_tc, "packed rows: the fp32 kernel");

    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.link_gbps = 2.5;
    rc.link_latency_us = 20;
    st = eng_calibrate(&rc, NULL, &o, &c, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_h2d_bw(&hw) == 2.5e9 && fabs(hw.copy_latency_s - 20e-6) < 1e-15, "throttled link %g",
           sched_hw_h2d_bw(&hw));
    EXPECT(!c.nvme_read_bw && !hw.has_nvme, "no NVMe tier, no NVMe rates");

    /* a run with the NVMe tier: its directory's raw rates become the plan's
     * array (the test's own directory, on the disk under the test), nothing
     * left behind; a directory that is not there is an error naming it */
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(rc.memory_nvme_path, sizeof rc.memory_nvme_path, "%s/nvme-cal", tmp ? tmp : "/tmp");
    EXPECT(mkdir(rc.memory_nvme_path, 0700) == 0 || errno == EEXIST, "mkdir %s", rc.memory_nvme_path);
    st = eng_calibrate(&rc, NULL, &o, &c, &err);
    EXPECT(st == MT_OK && c.nvme_read_bw > 1e6 && c.nvme_write_bw > 1e6 && c.nvme_queue_depth == 8, "nvme: %s %g %g",
           err.msg, c.nvme_read_bw, c.nvme_write_bw);
    sched_hw_from_calibration(&c, &hw);
    EXPECT(hw.has_nvme && sched_hw_nvme_read_bw(&hw) == c.nvme_read_bw &&
               sched_hw_nvme_write_bw(&hw) == c.nvme_write_bw && strstr(hw.nvme_name, "nvme-cal (measured)"),
           "the NVMe array from the measurement: %s", hw.nvme_name);
    EXPECT(rmdir(rc.memory_nvme_path) == 0, "calibration left files in %s", rc.memory_nvme_path);
    strcat(rc.memory_nvme_path, "/missing");
    st = eng_calibrate(&rc, NULL, &o, &c, &err);
    EXPECT(st == MT_ERR_IO && strstr(err.msg, "memory.nvme.path") && strstr(err.msg, "nvme-cal/missing"),
           "missing NVMe directory: %s", err.msg);
    eng_run_config_free(&rc);
    if (failures) fprintf(stderr, "calibrate_test: %d failure(s)\n", failures);
    else printf("calibrate_test: sgemm %.1f GFLOP/s, memcpy %.1f GB/s, stream %.1f GB/s, %d cores; pack %.2f GB/s, "
                "unpack %.2f GB/s, AdamW %.1f GB/s, attention %.1f/%.1f GFLOP/s\n",
                c.sgemm_flops / 1e9, c.memcpy_bw / 1e9, c.stream_bw / 1e9, c.cores, c.pack_bw / 1e9, c.unpack_bw / 1e9,
                c.adamw_bw / 1e9, c.attn_flops[0] / 1e9, c.attn_flops[1] / 1e9);
    return failures != 0;
}
