/* Hardware profiles: what the cost model knows about a machine.
 *
 * A profile is a YAML file (configs/hw/NAME.yaml) with datasheet peaks and
 * an "achievable" fraction for each rate, each with its source and reason
 * in a comment there; or it is measured on the machine at hand by the
 * calibration entry point (`--hw calibrate`): the measurement lives in the
 * engine (engine/run/calibrate.c, it needs the CPU backend), the scheduler only
 * turns the measured numbers into a profile.
 *
 * File layout (every key required unless marked optional):
 *
 *   name: h100-80gb-pcie
 *   device:
 *     name: "NVIDIA H100 80GB PCIe"          # optional
 *     memory: 80GiB                           # capacity (sizes: B, KB..TB, KiB..TiB)
 *     memory_bandwidth: 2.0TB/s               # datasheet peak
 *     memory_bandwidth_achievable: 0.85       # fraction of peak
 *     peak_tflops: {fp32: 51.2, tf32: 378, bf16: 756}   # dense (no sparsity)
 *     achievable: {fp32: 0.7, tf32: 0.6, bf16: 0.65}
 *     attention:                              # optional: what moetune's attention kernels
 *       fwd_tflops: 4.9                       # achieve, model FLOP/s as the cost model counts
 *       bwd_tflops: 4.9                       # them (4 and 10 x causal pairs x head dim):
 *       tc_fwd_tflops: 350                    # fwd/bwd the fp32 kernel, tc_fwd/tc_bwd the
 *       tc_bwd_tflops: 300                    # tensor-core path bf16 runs take (sched_op_t.attention_tc)
 *     attention_tflops: 4.9                   # optional, older profiles: the fp32 kernel's one rate
 *                                             # for both directions (fwd_tflops / bwd_tflops win)
 *   link:
 *     name: "PCIe 5.0 x16"                    # optional
 *     peak_bandwidth: 63GB/s                  # per direction
 *     h2d_achievable: 0.8
 *     d2h_achievable: 0.8
 *     copy_latency_us: 10                     # fixed cost of one copy
 *     peer_bandwidth: 450GB/s                 # optional: direct device-to-device link per
 *                                             # direction (NVLink, PCIe peer-to-peer); absent:
 *                                             # two devices exchange through host memory
 *     peer_achievable: 0.8                    # required with peer_bandwidth
 *     peer_latency_us: 15                     # optional: fixed cost of one exchange; absent:
 *                                             # copy_latency_us
 *   host:
 *     name: "2x Xeon 8480+"                   # optional
 *     memory: 1TiB
 *     pinned: 256GiB                          # page-locked memory the OS grants
 *     memory_bandwidth: 614GB/s
 *     memory_bandwidth_achievable: 0.5
 *     cores: 112                              # the cores of one NUMA node (below)
 *     numa_nodes: 2                           # optional (default 1): NUMA nodes (sockets) with
 *                                             # cores and memory of their own; host AdamW runs
 *                                             # every node's cores on the state homed on that
 *                                             # node, so its rates below (and the gradient
 *                                             # norm's sums) scale by this count
 *     adamw_bandwidth: 148GB/s                # optional: host AdamW's memory traffic on one node
 *                                             # (the registry's adam_bytes_per_param per parameter)
 *     adamw_bf16_gparams_per_core: 0.30       # optional: host AdamW with bf16 moments, G
 *     adamw_8bit_gparams_per_core: 0.18       # parameters per second on one core (those kernels
 *                                             # are bound by arithmetic where fp32's is bound by
 *                                             # memory: the step takes the slower of the two)
 *     pack_bandwidth: 5.9GB/s                 # optional: bytes packed into pinned staging per
 *                                             # second ahead of an H2D copy (copies of the host
 *                                             # homes, already in the working dtype), by the run's
 *                                             # pack threads
 *     unpack_bandwidth: 8GB/s                 # optional: gradient bytes copied from staging into
 *                                             # host memory per second after a D2H (on the pack
 *                                             # threads; a later micro-batch's add costs 1.5x,
 *                                             # costmodel.h)
 *   nvme:                                     # optional section: an NVMe array for the third
 *                                             # tier (memory.nvme in the run config); given,
 *                                             # read, write and queue_depth are required
 *     name: "4x PCIe 5.0 NVMe, RAID 0"        # optional
 *     read: 26GB/s                            # sustained sequential O_DIRECT rates of the
 *     write: 20GB/s                           # whole array, large requests (moetune bench nvme
 *                                             # measures a directory's)
 *     queue_depth: 64                         # requests in flight those rates need
 *
 * A rate left out is filled by a stated rule and marked in sched_hw_t.assumed
 * (plans print which): attention fwd/bwd: attention_tflops when given, else
 * SCHED_ATTN_KERNEL_SHARE of the fp32 matmul rate; tc_fwd/tc_bwd:
 * SCHED_ATTN_TC_SHARE of the bf16 matmul rate; adamw_bandwidth: host memory
 * bandwidth x achievable; adamw_*_gparams_per_core: SCHED_ADAMW_BF16_CORE_RATE
 * and SCHED_ADAMW_8BIT_CORE_RATE; pack_bandwidth and unpack_bandwidth: half of it
 * (a copy reads and writes each byte).  No rule assumes attention runs at
 * the matmul rate: measured kernels run an order of magnitude below it.
 *
 * Errors name the file, the line and the key (`device.peak_tflops.bf16`). */
#ifndef MT_SCHEDULER_HW_H
#define MT_SCHEDULER_HW_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef enum { SCHED_RATE_FP32 = 0, SCHED_RATE_TF32, SCHED_RATE_BF16, SCHED_RATE_COUNT } sched_rate_t;

/* The attention kernels: the fp32 kernel, and the tensor-core path bf16
 * runs take where it handles the shape (cuDNN's SDPA on CUDA, its twin on
 * the CPU); each forward and backward. */
typedef enum { SCHED_ATTN_KERNEL = 0, SCHED_ATTN_TC, SCHED_ATTN_PATH_COUNT } sched_attn_path_t;
typedef enum { SCHED_DIR_FWD = 0, SCHED_DIR_BWD, SCHED_DIR_COUNT } sched_dir_t;

/* The stated rules for rates a profile leaves out (see the file note):
 * measured on an H200, the fp32 kernel ran at 4.9 TFLOP/s against 50.3 for
 * fp32 GEMMs (0.1); cuDNN's SDPA at 300-361 TFLOP/s against ~540-690 that
 * profiles give bf16 GEMMs (0.5). */
#define SCHED_ATTN_KERNEL_SHARE 0.1
#define SCHED_ATTN_TC_SHARE 0.5

/* sched_hw_t.assumed: which rates came from a rule, not the profile */
enum {
    SCHED_HW_ASSUMED_ATTN_KERNEL = 1u << 0,
    SCHED_HW_ASSUMED_ATTN_TC = 1u << 1,
    SCHED_HW_ASSUMED_ADAMW = 1u << 2,
    SCHED_HW_ASSUMED_PACK = 1u << 3,
    SCHED_HW_ASSUMED_UNPACK = 1u << 4,
    SCHED_HW_ASSUMED_ADAMW_LITE = 1u << 5,
};

/* Host AdamW with bf16 and 8-bit moments per core, parameters/s, where a
 * profile does not say: `moetune bench adam --threads 1` on one core of a
 * Xeon with AVX-512 (0.297 and 0.178 G/s; an AVX2-only core is slower). */
#define SCHED_ADAMW_BF16_CORE_RATE 0.30e9
#define SCHED_ADAMW_8BIT_CORE_RATE 0.18e9

typedef struct {
    char name[64];
    char source[1024];         /* the file read, or "calibrate" */
    char device_name[128], link_name[128], host_name[128];
    bool measured;             /* the CPU backend, calibrated (a calibrated GPU is not: see
                                * sched_hw_from_calibration) */
    /* device */
    double device_memory;      /* bytes */
    double device_bw_peak;     /* bytes/s */
    double device_bw_frac;
    double peak_flops[SCHED_RATE_COUNT]; /* FLOP/s, dense */
    double flops_frac[SCHED_RATE_COUNT];
    /* FLOP/s of the attention kernels per path and direction (always > 0
     * after a load: absent keys filled by the rules above) */
    double attn_flops[SCHED_ATTN_PATH_COUNT][SCHED_DIR_COUNT];
    double attention_legacy;   /* device.attention_tflops as read (NaN: absent) */
    /* link, per direction */
    double link_bw_peak;       /* bytes/s */
    double h2d_frac, d2h_frac;
    double copy_latency_s;
    /* device to device (expert parallel's token exchange); peer_bw_peak 0:
     * no direct link, the exchange goes through host memory */
    double peer_bw_peak;       /* bytes/s per direction */
    double peer_frac;
    double peer_latency_s;     /* < 0: copy_latency_s */
    /* host */
    double host_memory, pinned_memory; /* bytes */
    double host_bw_peak;       /* bytes/s */
    double host_bw_frac;
    int host_cores;            /* of one NUMA node */
    int numa_nodes;            /* >= 1: nodes host AdamW runs on side by side (sched_hw_adamw_bw) */
    double adamw_bw;           /* bytes/s of host AdamW memory traffic on one node */
    double adamw_bf16_rate, adamw_8bit_rate; /* parameters/s of host AdamW with bf16 or 8-bit moments,
                                              * per core (their arithmetic's bound; see costmodel.h) */
    double pack_bw;            /* bytes/s packed into staging ahead of an H2D copy */
    double unpack_bw;          /* bytes/s of gradients copied from staging after a D2H copy */
    unsigned assumed;          /* SCHED_HW_ASSUMED_* */
    /* Where the host's copy and optimizer work slows the device's compute
     * (the CPU backend, whose "device" cores share a physical core or the
     * memory system with the host's): compute runs 1 + interference x
     * (the host cores' busy fraction) times as long, and every byte copied
     * costs the host host_copy_s_per_byte.  0 on a GPU (DMA engines). */
    double compute_interference;
    double host_copy_s_per_byte;
    /* NVMe array (the optional nvme: section): has_nvme false, rates 0 */
    bool has_nvme;
    char nvme_name[128];
    double nvme_read_bw, nvme_write_bw; /* bytes/s, sustained, whole array */
    int nvme_queue_depth;
} sched_hw_t;

/* Achievable rates: peak x fraction. */
double sched_hw_flops(const sched_hw_t *hw, sched_rate_t r);
double sched_hw_device_bw(const sched_hw_t *hw);
double sched_hw_h2d_bw(const sched_hw_t *hw);
double sched_hw_d2h_bw(const sched_hw_t *hw);
double sched_hw_host_bw(const sched_hw_t *hw);
/* The NUMA nodes host AdamW runs on (numa_nodes; 1 where unset). */
int sched_hw_numa_nodes(const sched_hw_t *hw);
/* Host AdamW's memory traffic over every NUMA node: adamw_bw x the nodes. */
double sched_hw_adamw_bw(const sched_hw_t *hw);
/* The NVMe array's sustained rates; 0 without an nvme: section. */
double sched_hw_nvme_read_bw(const sched_hw_t *hw);
double sched_hw_nvme_write_bw(const sched_hw_t *hw);
/* Device to device, per direction: the direct link's achievable rate, or
 * through host memory (no peer_bandwidth) the slower link direction, the
 * bytes then also crossing each device's own link. */
bool sched_hw_peer_via_host(const sched_hw_t *hw);
double sched_hw_peer_bw(const sched_hw_t *hw);
double sched_hw_peer_latency(const sched_hw_t *hw); /* one exchange's fixed cost */
const char *sched_rate_name(sched_rate_t r);
/* The rates a profile left out, filled by the stated rules (see the file
 * note), as one line for reports ("" when none was). */
void sched_hw_assumed_line(const sched_hw_t *hw, char *buf, size_t cap);

mt_status_t sched_hw_parse(const char *yaml_text, size_t len, const char *path, sched_hw_t *out, mt_error_t *err);
mt_status_t sched_hw_load(const char *path, sched_hw_t *out, mt_error_t *err);

/* `--hw NAME|FILE` -> a file path, or "calibrate" (returned as is).  FILE
 * (contains '/' or ends in .yaml): as given, else relative to the run
 * config's folder.  NAME: NAME.yaml looked up in <run config folder>/../hw,
 * $MOETUNE_HW_DIR, $BUILD_WORKSPACE_DIRECTORY/configs/hw (bazel run) and
 * ./configs/hw, in that order.  run_config may be NULL.  Not found: an
 * error listing every place tried. */
mt_status_t sched_hw_resolve(const char *spec, const char *run_config, char *path, size_t cap, mt_error_t *err);

/* What the calibration (engine/run/calibrate.c) measures on the machine at hand. */
typedef struct {
    double sgemm_flops;     /* fp32 GEMM FLOP/s through the CPU backend's kernel table */
    double bf16_gemm_flops; /* bf16-compute GEMM FLOP/s (fp32 activations times bf16 weights, as a bf16 run
                             * forms them); 0: not measured, taken as sgemm_flops */
    double memcpy_bw;       /* bytes/s copied by a large memcpy */
    double stream_bw;       /* bytes/s moved by a streaming read-modify-write pass (host bandwidth) */
    int cores;
    double host_memory;     /* physical memory, bytes */
    double link_bw;         /* copy streams' throttle (backend_options.link_gbps), 0 = unthrottled (memcpy) */
    double link_latency_s;  /* copy streams' per-copy latency */
    /* compute kept on its own cores (backend_options.compute_threads): a
     * GEMM's time on them while one host core copies flat out, over its time
     * alone, minus 1; 0 when compute is not kept apart */
    double compute_interference;
    /* Set by a calibration of a GPU (eng_calibrate_device): the rates above
     * are the device's (sgemm_flops, bf16_gemm_flops), link_bw is host to
     * device and link_latency_s the fixed cost of one copy, both measured. */
    bool device_calibrated;
    char device_name[64];
    double device_memory;   /* the device budget, bytes */
    double device_bw;       /* bytes/s read and written by a device-to-device copy */
    double link_d2h_bw;     /* bytes/s device to host */
    /* The attention kernels at the run's shape, model FLOPs per second:
     * the path the run takes (attn_tc: the tensor-core path), each
     * direction; 0: not measured (the profile's rule fills it) */
    bool attn_tc;
    double attn_flops[SCHED_DIR_COUNT];
    /* Host work on the copy path and the optimizer, with the threads the
     * run uses (bytes/s as sched_hw_t counts them; 0: not measured) */
    double adamw_bw, pack_bw, unpack_bw;
    /* Host AdamW with bf16 and 8-bit moments over the run's threads,
     * parameters/s (0: not measured) */
    double adamw_bf16_rate, adamw_8bit_rate;
    /* The run's NVMe directory (memory.nvme.path), raw O_DIRECT at the
     * store's queue depth: bytes/s; 0 when the run has none */
    double nvme_read_bw, nvme_write_bw;
    int nvme_queue_depth;
    char nvme_path[1024];
} sched_calibration_t;

/* A profile from measured numbers, every fraction 1.  The CPU backend:
 * "device" memory is host memory and each transfer costs the host two
 * memcpys.  A GPU (device_calibrated): its measured rates, budget and
 * link; the host packs each transfer into pinned staging with one memcpy,
 * and nothing the host does slows the device's compute. */
void sched_hw_from_calibration(const sched_calibration_t *c, sched_hw_t *out);
/* Only c's NVMe directory (when it was measured) as out's nvme: section,
 * named "<path> (measured)". */
void sched_hw_set_measured_nvme(const sched_calibration_t *c, sched_hw_t *out);
/* Fills the rates a profile (or a calibration) left at 0 or NaN by the
 * stated rules, marking each in hw->assumed. */
void sched_hw_fill_rates(sched_hw_t *hw);

#endif
