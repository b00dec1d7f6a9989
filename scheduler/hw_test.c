/* Hardware profiles: every profile in configs/hw loads with sane rates;
 * malformed files are refused naming the file, the line and the key;
 * --hw NAME resolution; calibration numbers -> profile. */
#include "scheduler/costmodel.h"
#include "scheduler/hw.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

static const char *k_valid =
    "name: test\n"
    "device:\n"
    "  memory: 80GiB\n"
    "  memory_bandwidth: 2TB/s\n"
    "  memory_bandwidth_achievable: 0.5\n"
    "  peak_tflops: {fp32: 50, tf32: 400, bf16: 800}\n"
    "  achievable: {fp32: 0.5, tf32: 0.5, bf16: 0.5}\n"
    "link:\n"
    "  peak_bandwidth: 64GB/s\n"
    "  h2d_achievable: 0.75\n"
    "  d2h_achievable: 0.5\n"
    "  copy_latency_us: 8\n"
    "host:\n"
    "  memory: 1TiB\n"
    "  pinned: 64GiB\n"
    "  memory_bandwidth: 300GB/s\n"
    "  memory_bandwidth_achievable: 0.5\n"
    "  cores: 32\n";

/* k_valid with line `line` (1-based) replaced by `repl` ("" removes it). */
static void edit(char *out, size_t cap, int line, const char *repl) {
    const char *p = k_valid;
    size_t used = 0;
    for (int l = 1; *p; l++) {
        const char *e = strchr(p, '\n');
        size_t len = (size_t)(e - p) + 1;
        if (l == line) used += (size_t)snprintf(out + used, cap - used, "%s", repl);
        else used += (size_t)snprintf(out + used, cap - used, "%.*s", (int)len, p);
        p = e + 1;
    }
}

static void expect_error(const char *text, const char *n1, const char *n2, int line) {
    sched_hw_t hw;
    mt_error_t err = {0};
    mt_status_t st = sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err);
    if (st != MT_ERR_CONFIG || !strstr(err.msg, n1) || (n2 && !strstr(err.msg, n2))) {
        fprintf(stderr, "hw_test.c:%d: expected an error with '%s' and '%s', got %s: %s\n", line, n1, n2 ? n2 : "",
                mt_status_name(st), err.msg);
        failures++;
    }
}
#define EXPECT_ERROR(text, n1, n2) expect_error(text, n1, n2, __LINE__)

static void test_parse(void) {
    sched_hw_t hw;
    mt_error_t err = {0};
    mt_status_t st = sched_hw_parse(k_valid, strlen(k_valid), "cfg/hw.yaml", &hw, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    EXPECT(hw.device_memory == 80.0 * 1073741824.0 && hw.host_memory == 1099511627776.0, "sizes");
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == 400e12 && sched_hw_flops(&hw, SCHED_RATE_FP32) == 25e12, "flops");
    EXPECT(sched_hw_device_bw(&hw) == 1e12 && sched_hw_host_bw(&hw) == 150e9, "bandwidths");
    EXPECT(sched_hw_h2d_bw(&hw) == 48e9 && sched_hw_d2h_bw(&hw) == 32e9, "link each way");
    EXPECT(fabs(hw.copy_latency_s - 8e-6) < 1e-15 && hw.host_cores == 32, "latency, cores");

    char text[2048];
    edit(text, sizeof text, 3, "  memroy: 80GiB\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:3: unknown key 'device.memroy'", "device.memory");
    edit(text, sizeof text, 18, "");
    EXPECT_ERROR(text, "cfg/hw.yaml: missing key 'host.cores'", NULL);
    edit(text, sizeof text, 3, "  memory: 80\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:3: device.memory: expected a size", NULL);
    edit(text, sizeof text, 9, "  peak_bandwidth: 64GB\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:9: link.peak_bandwidth: expected a bandwidth", NULL);
    edit(text, sizeof text, 9, "  peak_bandwidth: 64Gb/s\n");
    EXPECT_ERROR(text, "link.peak_bandwidth", "64Gb/s");
    edit(text, sizeof text, 10, "  h2d_achievable: 1.5\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:10: link.h2d_achievable: expected a fraction of peak in (0, 1]", NULL);
    edit(text, sizeof text, 6, "  peak_tflops: {fp32: 50, tf32: 400}\n");
    EXPECT_ERROR(text, "missing key 'device.peak_tflops.bf16'", NULL);
    edit(text, sizeof text, 6, "  peak_tflops: {fp32: 50, tf32: 400, bf16: lots}\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:6: device.peak_tflops.bf16: expected a number", NULL);
    edit(text, sizeof text, 18, "  cores: 0\n");
    EXPECT_ERROR(text, "host.cores: expected a positive integer", NULL);
    EXPECT_ERROR("name: x\ndevice: 5\n", "cfg/hw.yaml:2: device: expected a mapping", NULL);
    EXPECT_ERROR("name: x\nname: y\n", "cfg/hw.yaml:2: duplicate key 'name'", NULL);
    EXPECT_ERROR("[1, 2]\n", "must be a mapping", NULL);
    EXPECT_ERROR("name: [\n", "cfg/hw.yaml:", "invalid YAML");
    /* the peer link: absent, through host memory at the slower link direction with two copies' latency */
    EXPECT(sched_hw_peer_via_host(&hw) && sched_hw_peer_bw(&hw) == 32e9 && fabs(sched_hw_peer_latency(&hw) - 16e-6) < 1e-15,
           "peer through host: %g B/s, %g s", sched_hw_peer_bw(&hw), sched_hw_peer_latency(&hw));
    edit(text, sizeof text, 12, "  copy_latency_us: 8\n  peer_bandwidth: 450GB/s\n  peer_achievable: 0.8\n");
    st = sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err);
    EXPECT(st == MT_OK && !sched_hw_peer_via_host(&hw) && fabs(sched_hw_peer_bw(&hw) - 360e9) < 1 &&
               fabs(sched_hw_peer_latency(&hw) - 8e-6) < 1e-15,
           "direct peer link: %s", err.msg);
    edit(text, sizeof text, 12, "  copy_latency_us: 8\n  peer_bandwidth: 450GB/s\n");
    EXPECT_ERROR(text, "missing key 'link.peer_achievable'", "link.peer_bandwidth");
    edit(text, sizeof text, 12, "  copy_latency_us: 8\n  peer_latency_us: 3\n");
    EXPECT_ERROR(text, "need link.peer_bandwidth", NULL);
    /* the optional nvme: section: absent, no rates; given, every key but the name required */
    EXPECT(!hw.has_nvme && sched_hw_nvme_read_bw(&hw) == 0 && sched_hw_nvme_write_bw(&hw) == 0, "no nvme section");
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {read: 26 GB/s, write: 20GB/s, queue_depth: 64}\n");
    st = sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err);
    EXPECT(st == MT_OK && hw.has_nvme && sched_hw_nvme_read_bw(&hw) == 26e9 && sched_hw_nvme_write_bw(&hw) == 20e9 &&
               hw.nvme_queue_depth == 64,
           "nvme section: %s", err.msg);
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {read: 26GB/s, queue_depth: 64}\n");
    EXPECT_ERROR(text, "missing key 'nvme.write'", NULL);
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {name: disks}\n");
    EXPECT_ERROR(text, "missing key 'nvme.read'", NULL);
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {read: 26GB, write: 20GB/s, queue_depth: 64}\n");
    EXPECT_ERROR(text, "cfg/hw.yaml:19: nvme.read: expected a bandwidth", "26GB");
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {read: 26GB/s, write: 20GB/s, queue_depth: 0}\n");
    EXPECT_ERROR(text, "nvme.queue_depth: expected a positive integer", NULL);
    edit(text, sizeof text, 18, "  cores: 32\nnvme: {raed: 26GB/s, write: 20GB/s, queue_depth: 8}\n");
    EXPECT_ERROR(text, "unknown key 'nvme.raed'", "nvme.read");
    edit(text, sizeof text, 18, "  cores: 32\nnvme: 26GB/s\n");
    EXPECT_ERROR(text, "nvme: expected a mapping", NULL);
    EXPECT(sched_hw_load("/nonexistent/hw.yaml", &hw, &err) == MT_ERR_IO && strstr(err.msg, "/nonexistent/hw.yaml"),
           "%s", err.msg);
}

/* The shipped profiles: each loads, and its achievable rates are sane. */
static void test_profiles(void) {
    static const char *names[] = {"rtx4090", "a100-80gb-pcie", "h100-80gb-pcie", "h100-sxm", "h200", "gh200",
                                  "h100-sxm-nvme", "h100-80gb-pcie-nvlink"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        char path[256];
        snprintf(path, sizeof path, "configs/hw/%s.yaml", names[i]);
        sched_hw_t hw;
        mt_error_t err = {0};
        mt_status_t st = sched_hw_load(path, &hw, &err);
        EXPECT(st == MT_OK, "%s", err.msg);
        if (st != MT_OK) continue;
        EXPECT(strcmp(hw.name, names[i]) == 0, "%s: name %s", path, hw.name);
        /* tensor cores beat CUDA cores; links are slower than device memory; host is slower still than HBM */
        EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) > sched_hw_flops(&hw, SCHED_RATE_FP32), "%s: bf16 > fp32", path);
        EXPECT(sched_hw_h2d_bw(&hw) < sched_hw_device_bw(&hw), "%s: link < HBM", path);
        EXPECT(hw.device_memory >= 24e9 && hw.host_memory > hw.device_memory, "%s: capacities", path);
        /* every shipped profile gives its attention and host-work rates (no rule fills them), and its
         * attention kernels run below its products */
        EXPECT(hw.assumed == 0, "%s: rates left to the rules: %#x", path, hw.assumed);
        EXPECT(hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD] < sched_hw_flops(&hw, SCHED_RATE_BF16) &&
                   hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] < sched_hw_flops(&hw, SCHED_RATE_FP32),
               "%s: attention below the matmul rates", path);
    }
    sched_hw_t hw;
    mt_error_t err = {0};
    if (sched_hw_load("configs/hw/h100-80gb-pcie.yaml", &hw, &err) == MT_OK) {
        EXPECT(hw.peak_flops[SCHED_RATE_BF16] == 756e12 && hw.device_memory == 80.0 * 1073741824.0, "h100 pcie");
        EXPECT(fabs(sched_hw_h2d_bw(&hw) - 50.4e9) < 1e3, "PCIe 5 x16: ~50 GB/s each way: %g", sched_hw_h2d_bw(&hw));
    }
    if (sched_hw_load("configs/hw/gh200.yaml", &hw, &err) == MT_OK)
        EXPECT(sched_hw_h2d_bw(&hw) > 300e9, "NVLink-C2C: %g", sched_hw_h2d_bw(&hw));
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "cannot write %s", path);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void test_resolve(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    if (!tmp) tmp = "/tmp";
    char dir[512], path[1200], run[600];
    snprintf(dir, sizeof dir, "%s/hwres", tmp);
    mkdir(dir, 0755);
    snprintf(path, sizeof path, "%s/configs", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/configs/runs", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/configs/hw", dir);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/configs/hw/mybox.yaml", dir);
    write_file(path, k_valid);
    snprintf(run, sizeof run, "%s/configs/runs/run.yaml", dir);
    write_file(run, "base_model: x\n");
    mt_error_t err = {0};
    char out[1200];
    mt_status_t st = sched_hw_resolve("mybox", run, out, sizeof out, &err);
    EXPECT(st == MT_OK && strstr(out, "/configs/runs/../hw/mybox.yaml"), "%s %s", out, err.msg);
    sched_hw_t hw;
    EXPECT(st == MT_OK && sched_hw_load(out, &hw, &err) == MT_OK && strcmp(hw.name, "test") == 0, "load resolved");
    EXPECT(sched_hw_resolve("calibrate", run, out, sizeof out, &err) == MT_OK && strcmp(out, "calibrate") == 0,
           "calibrate");
    /* a file relative to the run config's folder */
    EXPECT(sched_hw_resolve("../hw/mybox.yaml", run, out, sizeof out, &err) == MT_OK && strstr(out, "mybox.yaml"),
           "%s", err.msg);
    st = sched_hw_resolve("nosuchbox", run, out, sizeof out, &err);
    EXPECT(st == MT_ERR_IO && strstr(err.msg, "nosuchbox") && strstr(err.msg, "configs/hw/nosuchbox.yaml"), "%s",
           err.msg);
    st = sched_hw_resolve("bad name", run, out, sizeof out, &err);
    EXPECT(st == MT_ERR_CONFIG, "%s", err.msg);
    /* the repository's profiles by name from the working directory */
    EXPECT(sched_hw_resolve("h100-sxm", NULL, out, sizeof out, &err) == MT_OK, "%s", err.msg);
}

static void test_calibration(void) {
    sched_calibration_t c = {.sgemm_flops = 1e11, .memcpy_bw = 10e9, .stream_bw = 20e9, .cores = 2,
                             .host_memory = 16e9, .link_bw = 0, .link_latency_s = 0};
    sched_hw_t hw;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(hw.measured && strcmp(hw.source, "calibrate") == 0, "measured");
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == 1e11 && sched_hw_flops(&hw, SCHED_RATE_FP32) == 1e11,
           "without a bf16 measurement, bf16 products are taken at the fp32 rate");
    c.bf16_gemm_flops = 2.5e11;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == 2.5e11 && sched_hw_flops(&hw, SCHED_RATE_FP32) == 1e11,
           "bf16 products at their measured rate");
    c.bf16_gemm_flops = 0;
    EXPECT(sched_hw_h2d_bw(&hw) == 10e9 && sched_hw_host_bw(&hw) == 20e9 && sched_hw_device_bw(&hw) == 20e9, "bws");
    c.link_bw = 1e9;
    c.link_latency_s = 5e-6;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(sched_hw_d2h_bw(&hw) == 1e9 && hw.copy_latency_s == 5e-6, "throttled copy streams");
    EXPECT(hw.adamw_bf16_rate == SCHED_ADAMW_BF16_CORE_RATE && (hw.assumed & SCHED_HW_ASSUMED_ADAMW_LITE),
           "lighter moments not measured: the rule's rate");
    c.adamw_bf16_rate = 1e9; /* over the run's 2 threads */
    c.adamw_8bit_rate = 0.6e9;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(hw.adamw_bf16_rate == 0.5e9 && hw.adamw_8bit_rate == 0.3e9 && !(hw.assumed & SCHED_HW_ASSUMED_ADAMW_LITE),
           "lighter moments measured, per core: %g %g", hw.adamw_bf16_rate, hw.adamw_8bit_rate);
}

/* A GPU's calibration: its own rates and budget, fraction 1, one memcpy of
 * host work per byte moved, not the CPU backend's (measured stays false:
 * bf16 auto means bf16 there). */
static void test_device_calibration(void) {
    sched_calibration_t c = {.device_calibrated = true, .sgemm_flops = 50e12, .bf16_gemm_flops = 600e12,
                             .memcpy_bw = 10e9, .stream_bw = 100e9, .cores = 16, .host_memory = 128e9,
                             .link_bw = 55e9, .link_d2h_bw = 50e9, .link_latency_s = 8e-6,
                             .device_memory = 80e9, .device_bw = 2.8e12, .attn_flops = {8e12, 4e12},
                             .adamw_bw = 40e9, .pack_bw = 6e9, .unpack_bw = 3e9, .adamw_bf16_rate = 16e9,
                             .adamw_8bit_rate = 8e9};
    snprintf(c.device_name, sizeof c.device_name, "cuda device 0");
    sched_hw_t hw;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(!hw.measured && strcmp(hw.source, "calibrate") == 0 && strstr(hw.device_name, "cuda device 0"), "gpu");
    EXPECT(sched_hw_flops(&hw, SCHED_RATE_BF16) == 600e12 && sched_hw_flops(&hw, SCHED_RATE_FP32) == 50e12, "rates");
    EXPECT(hw.device_memory == 80e9 && sched_hw_device_bw(&hw) == 2.8e12, "device");
    EXPECT(sched_hw_h2d_bw(&hw) == 55e9 && fabs(sched_hw_d2h_bw(&hw) - 50e9) < 1 && hw.copy_latency_s == 8e-6, "link");
    EXPECT(hw.compute_interference == 0 && hw.host_copy_s_per_byte == 1.0 / 10e9, "host work: one memcpy");
    EXPECT(hw.adamw_bw == 40e9 && hw.pack_bw == 6e9 && hw.unpack_bw == 3e9 &&
               hw.adamw_bf16_rate == 16e9 / hw.host_cores && hw.adamw_8bit_rate == 8e9 / hw.host_cores,
           "measured host rates");
    /* an fp32 run measured the fp32 kernel; the tensor-core path, not
     * measured, comes from the stated rule and is marked so */
    EXPECT(hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_FWD] == 8e12 && hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] == 4e12,
           "measured kernel path");
    EXPECT(hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD] == SCHED_ATTN_TC_SHARE * 600e12 &&
               hw.assumed == SCHED_HW_ASSUMED_ATTN_TC,
           "tc path by rule: %g, assumed %#x", hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD], hw.assumed);
    /* the attention core at its path's and direction's rate, a product at the matmul rate */
    sched_op_t mm = {.matmul = true, .flops = 8e12}, att = mm, att_b = mm, tc = mm;
    att.attention = att_b.attention = tc.attention = tc.attention_tc = true;
    att_b.phase = SCHED_PHASE_BWD;
    EXPECT(sched_op_time(&mm, &hw, SCHED_RATE_BF16) == 8e12 / 600e12 && sched_op_time(&att, &hw, SCHED_RATE_BF16) == 1.0 &&
               sched_op_time(&att_b, &hw, SCHED_RATE_BF16) == 2.0,
           "attention rate: %g %g %g", sched_op_time(&mm, &hw, SCHED_RATE_BF16), sched_op_time(&att, &hw, SCHED_RATE_BF16),
           sched_op_time(&att_b, &hw, SCHED_RATE_BF16));
    EXPECT(sched_op_time(&tc, &hw, SCHED_RATE_BF16) == 8e12 / 300e12, "tensor-core path: %g",
           sched_op_time(&tc, &hw, SCHED_RATE_BF16));
    /* a bf16 run measures the tensor-core path instead */
    c.attn_tc = true;
    sched_hw_from_calibration(&c, &hw);
    EXPECT(hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_BWD] == 4e12 && (hw.assumed & SCHED_HW_ASSUMED_ATTN_KERNEL) &&
               hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] == SCHED_ATTN_KERNEL_SHARE * 50e12,
           "bf16 calibration: tc measured, the kernel by rule");
}

/* k_valid with `line` inserted before the section header `before`. */
static void with_line(char *text, size_t cap, const char *before, const char *line) {
    snprintf(text, cap, "%s", k_valid);
    char *at = strstr(text, before);
    memmove(at + strlen(line), at, strlen(at) + 1);
    memcpy(at, line, strlen(line));
}

/* The attention and host-work keys: given, each wins; left out, the stated
 * rules fill them and say so; no rule gives attention the matmul rate. */
static void test_rate_keys(void) {
    sched_hw_t hw;
    mt_error_t err = {0};
    EXPECT(sched_hw_parse(k_valid, strlen(k_valid), "cfg/hw.yaml", &hw, &err) == MT_OK, "%s", err.msg);
    const double fp32 = sched_hw_flops(&hw, SCHED_RATE_FP32), bf16 = sched_hw_flops(&hw, SCHED_RATE_BF16);
    EXPECT(hw.assumed == (SCHED_HW_ASSUMED_ATTN_KERNEL | SCHED_HW_ASSUMED_ATTN_TC | SCHED_HW_ASSUMED_ADAMW |
                          SCHED_HW_ASSUMED_PACK | SCHED_HW_ASSUMED_UNPACK | SCHED_HW_ASSUMED_ADAMW_LITE),
           "every new rate assumed: %#x", hw.assumed);
    for (int d = 0; d < SCHED_DIR_COUNT; d++) {
        EXPECT(hw.attn_flops[SCHED_ATTN_KERNEL][d] == SCHED_ATTN_KERNEL_SHARE * fp32 &&
                   hw.attn_flops[SCHED_ATTN_TC][d] == SCHED_ATTN_TC_SHARE * bf16 &&
                   hw.attn_flops[SCHED_ATTN_KERNEL][d] < fp32 && hw.attn_flops[SCHED_ATTN_TC][d] < bf16,
               "attention rules, direction %d", d);
    }
    EXPECT(hw.adamw_bw == sched_hw_host_bw(&hw) && hw.pack_bw == sched_hw_host_bw(&hw) / 2 &&
               hw.unpack_bw == sched_hw_host_bw(&hw) / 2 && hw.adamw_bf16_rate == SCHED_ADAMW_BF16_CORE_RATE &&
               hw.adamw_8bit_rate == SCHED_ADAMW_8BIT_CORE_RATE,
           "host rules");
    char line[512];
    sched_hw_assumed_line(&hw, line, sizeof line);
    EXPECT(strstr(line, "0.1 x the fp32 matmul rate") && strstr(line, "0.5 x the bf16 matmul rate") &&
               strstr(line, "host AdamW at host memory bandwidth") && strstr(line, "8-bit moments at 0.30 / 0.18"),
           "assumed line: %s", line);

    char text[4096];
    /* an older profile's one attention rate: the fp32 kernel's, both directions */
    with_line(text, sizeof text, "link:\n", "  attention_tflops: 8\n");
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) == MT_OK &&
               hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_FWD] == 8e12 &&
               hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] == 8e12 && !(hw.assumed & SCHED_HW_ASSUMED_ATTN_KERNEL),
           "device.attention_tflops: %s", err.msg);
    /* the per-direction keys win over it */
    with_line(text, sizeof text, "link:\n",
              "  attention_tflops: 8\n  attention:\n    fwd_tflops: 5\n    bwd_tflops: 4\n"
              "    tc_fwd_tflops: 350\n    tc_bwd_tflops: 300\n");
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) == MT_OK, "%s", err.msg);
    EXPECT(hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_FWD] == 5e12 && hw.attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD] == 4e12 &&
               hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD] == 350e12 && hw.attn_flops[SCHED_ATTN_TC][SCHED_DIR_BWD] == 300e12 &&
               !(hw.assumed & (SCHED_HW_ASSUMED_ATTN_KERNEL | SCHED_HW_ASSUMED_ATTN_TC)),
           "device.attention.*");
    with_line(text, sizeof text, "link:\n", "  attention:\n    tc_fwd: 350\n");
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) != MT_OK &&
               strstr(err.msg, "unknown key 'device.attention.tc_fwd'") && strstr(err.msg, "device.attention.tc_fwd_tflops"),
           "a misspelt attention key: %s", err.msg);
    with_line(text, sizeof text, "link:\n", "  attention:\n    bwd_tflops: -3\n");
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) != MT_OK && strstr(err.msg, "TFLOP/s > 0"),
           "a negative rate: %s", err.msg);
    /* host work */
    snprintf(text, sizeof text, "%s  adamw_bandwidth: 148GB/s\n  pack_bandwidth: 5.9GB/s\n  unpack_bandwidth: 3GB/s\n",
             k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) == MT_OK && hw.adamw_bw == 148e9 &&
               hw.pack_bw == 5.9e9 && hw.unpack_bw == 3e9 &&
               !(hw.assumed & (SCHED_HW_ASSUMED_ADAMW | SCHED_HW_ASSUMED_PACK | SCHED_HW_ASSUMED_UNPACK)),
           "host rates: %s", err.msg);
    snprintf(text, sizeof text, "%s  adamw_bf16_gparams_per_core: 0.5\n  adamw_8bit_gparams_per_core: 0.25\n", k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) == MT_OK && hw.adamw_bf16_rate == 0.5e9 &&
               hw.adamw_8bit_rate == 0.25e9 && !(hw.assumed & SCHED_HW_ASSUMED_ADAMW_LITE),
           "lighter moments' rates: %s", err.msg);
    snprintf(text, sizeof text, "%s  adamw_8bit_gparams_per_core: 0\n", k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) != MT_OK &&
               strstr(err.msg, "host.adamw_8bit_gparams_per_core: expected G parameters/s"),
           "a zero rate: %s", err.msg);
    /* NUMA nodes: host AdamW's rates add up over them; 1 unless given */
    EXPECT(sched_hw_parse(k_valid, strlen(k_valid), "cfg/hw.yaml", &hw, &err) == MT_OK &&
               sched_hw_numa_nodes(&hw) == 1 && sched_hw_adamw_bw(&hw) == hw.adamw_bw,
           "one node by default: %s", err.msg);
    snprintf(text, sizeof text, "%s  adamw_bandwidth: 148GB/s\n  numa_nodes: 2\n", k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) == MT_OK && sched_hw_numa_nodes(&hw) == 2 &&
               hw.adamw_bw == 148e9 && sched_hw_adamw_bw(&hw) == 296e9,
           "two nodes: %s", err.msg);
    snprintf(text, sizeof text, "%s  numa_nodes: 0\n", k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) != MT_OK && strstr(err.msg, "host.numa_nodes"),
           "zero nodes: %s", err.msg);
    snprintf(text, sizeof text, "%s  pack_bandwidth: 5.9\n", k_valid);
    EXPECT(sched_hw_parse(text, strlen(text), "cfg/hw.yaml", &hw, &err) != MT_OK &&
               strstr(err.msg, "host.pack_bandwidth: expected a bandwidth"),
           "a bare number: %s", err.msg);
}

int main(void) {
    test_parse();
    test_rate_keys();
    test_profiles();
    test_resolve();
    test_calibration();
    test_device_calibration();
    if (failures) fprintf(stderr, "hw_test: %d failure(s)\n", failures);
    else printf("hw_test: all passed\n");
    return failures != 0;
}
