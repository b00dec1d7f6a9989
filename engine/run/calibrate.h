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
 * Copy streams throttled by backend_options (link_gbps, link_latency_us)
 * are planned at the throttled rate, as the executor will run them.
 * A GPU is measured through the run's own device (eng_calibrate_device). */
#ifndef MT_ENGINE_CALIBRATE_H
#define MT_ENGINE_CALIBRATE_H

#include <stddef.h>

#include "engine/config/config.h"
#include "kernels/device.h"
#include "base/status.h"
#include "scheduler/hw.h"

typedef struct {
    int gemm_n;           /* square GEMM size; 0 = 1024 */
    size_t stream_bytes;  /* bytes per buffer of the bandwidth passes; 0 = 64 MiB */
    int reps;             /* repetitions (best kept); 0 = 3 */
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

/* rc may be NULL (no link throttle). */
mt_status_t eng_calibrate(const eng_run_config_t *rc, const eng_calibrate_opts_t *opts, sched_calibration_t *out,
                          mt_error_t *err);

/* The device a run will use, when its kernels run asynchronously (a GPU):
 * fp32 and bf16 GEMM rates on square products of up to 4096 (a quarter of
 * the device budget at most), pinned host-to-device and device-to-host
 * copy bandwidth (64 MiB copies on the copy streams) and the fixed cost of
 * a 4 KiB copy, device memory bandwidth (a device-to-device copy, bytes
 * read and written), the attention kernels' rate (forward and backward,
 * causal, 16 heads of 128 over 1024 tokens), the device budget; the host's memcpy and streaming
 * bandwidth as eng_calibrate measures them.  Everything allocated here is
 * freed before it returns. */
mt_status_t eng_calibrate_device(kern_device_t *dev, const eng_run_config_t *rc, sched_calibration_t *out,
                                 mt_error_t *err);

#endif
