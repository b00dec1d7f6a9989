/* Predicted step of data parallel training on several devices of one host
 * sharing one host copy of the model (engine/multi_device.h).
 *
 * Each device has its own link to host memory, so the devices' transfers
 * do not share bandwidth: a device's forward and backward over its share
 * of the step's micro-batches is the single-device simulation of a
 * workload with that share (grad_accum = K / N), planned within one
 * device's budgets.  Then, as the engine runs it (serially, no overlap):
 *   reduce   the gradients summed in rank order: device-resident ones as
 *            an allreduce between the devices (2 (N-1)/N of the gradient
 *            bytes each way per device, over the slower direction of the
 *            link), host-resident ones added on the host (N-1 passes
 *            reading two buffers and writing one, at host memory bandwidth);
 *   optim    the one optimizer step on device 0: the simulated step's
 *            norm, AdamW and working-copy update tasks, each resource's
 *            busy time summed, the longest;
 *   refresh  the other devices' resident weights: from the host master
 *            (host AdamW, H2D on every device's own link at once), or from
 *            device 0's working copy (device AdamW: D2H then H2D).
 * step = forward/backward + reduce + optim + refresh. */
#ifndef MT_SCHEDULER_DATA_PARALLEL_H
#define MT_SCHEDULER_DATA_PARALLEL_H

#include "base/status.h"
#include "scheduler/costmodel.h"
#include "scheduler/plan.h"

typedef struct {
    int devices;
    int micro_per_device;
    double fwd_bwd_s;     /* one device's forward and backward of its micro-batches, with its transfers */
    double reduce_s, optim_s, refresh_s;
    double step_s;
    double tokens_per_s;  /* the whole step's tokens (all devices) per second */
    double reduce_device_bytes, reduce_host_bytes; /* gradients summed between devices / on the host */
    /* per device, each over its own link: device 0 (which also runs the
     * optimizer) and every other device */
    double h2d_bytes[2], d2h_bytes[2];
} sched_dp_result_t;

/* w: one device's share (its grad_accum the micro-batches per device);
 * plan: that share's plan; host_bw: host memory bytes/s (sched_hw_host_bw). */
mt_status_t sched_dp_predict(const sched_workload_t *w, const sched_plan_t *plan, int devices, double host_bw,
                             sched_dp_result_t *out, mt_error_t *err);

#endif
