/* Calibration: measure the machine at hand so that `--hw calibrate` plans
 * for it (scheduler/hw.h turns the numbers into a profile).
 *
 * What is measured, each as the best of a few repetitions (the first run
 * pays page faults and thread start-up):
 *  - fp32 GEMM rate: square products through the CPU backend's kernel
 *    table (OpenBLAS sgemm), the rate the engine's matmuls run at;
 *  - memcpy bandwidth: one thread copying a buffer much larger than the
 *    caches (the CPU backend's copy streams are memcpy);
 *  - host memory bandwidth: a streaming a = b + s*c pass on every core
 *    (what host AdamW and gradient accumulation are bound by);
 *  - with backend_options.compute_threads (compute kept on its own cores):
 *    how much longer a product takes there while one host core copies
 *    flat out (the median of 15 each way), which the simulator uses to
 *    slow compute by the host cores' share of copy and optimizer work.
 *  - the attention kernels at the run's shape (eng_calibrate_attn_t): the
 *    tensor-core path (its CPU twin here) when the run is bf16 and the path
 *    takes the shape, else the fp32 kernel; each direction, the sequence
 *    shortened to keep it to a fraction of a second;
 *  - the host's work beside the copies and the optimizer, with the threads
 *    the run gives it: packing fp32 into bf16 staging on the staging pool's
 *    pack threads (moe_staging_default_pack_threads: one beside the CPU
 *    backend, one per 2 cores up to 16 on a GPU's host), unpacking
 *    gradients on the same threads, and host AdamW over every core at a
 *    size that leaves the caches (16 M parameters, 448 MB of traffic).
 * Copy streams throttled by backend_options (link_gbps, link_latency_us)
 * are planned at the throttled rate, as the executor will run them.
 *  - where the run has the NVMe tier (memory.nvme.path), that directory's
 *    raw O_DIRECT read and write rates at the store's queue depth (256 MiB
 *    through a file of its own, removed after), which the plan's NVMe
 *    array then is.
 * A GPU is measured through the run's own device (eng_calibrate_device). */
#ifndef MT_ENGINE_CALIBRATE_H
#define MT_ENGINE_CALIBRATE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/config/config.h"
#include "engine/model/hf/model_config.h"
#include "kernels/device.h"
#include "base/status.h"
#include "scheduler/hw.h"

/* The attention shape a run calibrates at (eng_calibrate_attn_of). */
typedef struct {
    int B, T, heads, kv_heads, head_dim;
    bool bf16;            /* bf16 working copies: the tensor-core path, where it takes the shape */
    bool packed;          /* sample_packing: rows of several examples, which only the fp32 kernel takes */
} eng_calibrate_attn_t;

/* The run's shape: its micro-batch and sequence, the model's heads (MLA:
 * the one head width its kernels see, the wider of q/k and v). */
void eng_calibrate_attn_of(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16,
                           eng_calibrate_attn_t *out);

typedef struct {
    int gemm_n;           /* square GEMM size; 0 = 1024 */
    size_t stream_bytes;  /* bytes per buffer of the bandwidth passes; 0 = 64 MiB */
    int reps;             /* repetitions (best kept); 0 = 3 */
    size_t adam_params;   /* host AdamW's size; 0 = 16 M parameters */
    double attn_flops;    /* the attention measurement's FLOPs per pass (the sequence shortened to fit);
                           * 0 = 2e9 */
} eng_calibrate_opts_t;

/* The interference probe on its own, for measuring beside a run: a pinned
 * CPU device with `compute_threads` compute cores and a thread on a host
 * core that copies on demand.  open returns NULL when there is nothing to
 * split (one core, or compute_threads <= 0); a pair times a 512^3 product
 * with the host core idle, then copying flat out, and returns busy / idle. */
typedef struct eng_interference_probe eng_interference_probe_t;
eng_interference_probe_t *eng_interference_probe_open(int compute_threads);
double eng_interference_probe_pair(eng_interference_probe_t *p);
void eng_interference_probe_close(eng_interference_probe_t *p);

/* memory.nvme.path's raw O_DIRECT rates at the store's queue depth (256
 * MiB through a file of its own, removed after) into out's nvme fields,
 * when rc has the tier; nothing otherwise.  An error names the key and
 * the directory. */
mt_status_t eng_calibrate_nvme(const eng_run_config_t *rc, sched_calibration_t *out, mt_error_t *err);

/* rc may be NULL (no link throttle); attn NULL: 16 heads of 128, fp32. */
mt_status_t eng_calibrate(const eng_run_config_t *rc, const eng_calibrate_attn_t *attn,
                          const eng_calibrate_opts_t *opts, sched_calibration_t *out, mt_error_t *err);

/* The device a run will use, when its kernels run asynchronously (a GPU):
 * fp32 and bf16 GEMM rates on square products of up to 4096 (a quarter of
 * the device budget at most), pinned host-to-device and device-to-host
 * copy bandwidth (64 MiB copies on the copy streams) and the fixed cost of
 * a 4 KiB copy, device memory bandwidth (a device-to-device copy, bytes
 * read and written), the attention kernels' rates at the run's shape attn
 * (NULL: 16 heads of 128 over 1024 tokens, fp32; the sequence shortened to
 * fit a quarter of the budget), the device budget; the host's memcpy,
 * streaming, pack, unpack and AdamW rates as eng_calibrate measures them.
 * Everything allocated here is freed before it returns. */
mt_status_t eng_calibrate_device(kern_device_t *dev, const eng_run_config_t *rc, const eng_calibrate_attn_t *attn,
                                 sched_calibration_t *out, mt_error_t *err);

#endif
