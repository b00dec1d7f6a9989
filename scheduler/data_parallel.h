/* Predicted step of data parallel training on several devices of one host
 * sharing one host copy of the model (engine/parallel/devices.h), with MoE
 * layers whose plan says expert_parallel split between two devices.
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
 *   refresh  the other devices' resident working copies of the tensors the
 *            step updated (trainable ones: a LoRA block's frozen base stays):
 *            from the host master (host AdamW, H2D on every device's own
 *            link at once), or from device 0's working copy (device AdamW:
 *            D2H then H2D).
 * step = forward/backward + reduce + optim + refresh.
 *
 * Expert parallel blocks (N = 2; plan expert_parallel): the simulated share
 * runs them at their expert parallel costs (sched_workload_t.ep_blocks:
 * own experts only, the token exchange on the critical path); the
 * reduction sums only their replicated tensors' gradients; with host AdamW
 * the other device's experts' updates queue on the same host; with device
 * AdamW each device updates its own experts in place and only the
 * replicated tensors are refreshed. */
#ifndef MT_SCHEDULER_DATA_PARALLEL_H
#define MT_SCHEDULER_DATA_PARALLEL_H

#include "base/status.h"
#include "scheduler/costmodel.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"

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
    /* expert parallel blocks: rows each device sends the other per step
     * (through host memory also counted in h2d_bytes / d2h_bytes) */
    double peer_bytes;
    int expert_parallel_blocks;
    double host_optim_s;  /* host optimizer busy time of device 0's simulated step */
    double peak_device[2];/* per device (device 0, every other), bytes */
    double peak[SCHED_MEM_COUNT]; /* the simulated share's peaks */
} sched_dp_result_t;

/* w: one device's share (its grad_accum the micro-batches per device);
 * plan: that share's plan; host_bw: host memory bytes/s (sched_hw_host_bw). */
mt_status_t sched_dp_predict(const sched_workload_t *w, const sched_plan_t *plan, int devices, double host_bw,
                             sched_dp_result_t *out, mt_error_t *err);

/* Data or expert parallel per MoE layer on two devices.
 *
 * Three layouts are planned and predicted with sched_dp_predict: every
 * layer data parallel; every MoE layer expert parallel (the planner's
 * placement search run on that layout, so the memory expert parallel frees
 * is spent like any other); and the mix: from the faster of the two that
 * fits, MoE layers are switched to the other layout one at a time, the
 * largest predicted saving first, keeping every placement, where that
 * predicts a faster step within the budgets, until no switch helps.  The mix is therefore never slower than the
 * better uniform layout.  opts->parallel picks the plan the run uses:
 * auto the mix, data and expert the uniform ones. */
enum { SCHED_LAYOUT_DATA = 0, SCHED_LAYOUT_MIX, SCHED_LAYOUT_EXPERT, SCHED_LAYOUT_COUNT };

typedef struct {
    bool planned[SCHED_LAYOUT_COUNT]; /* expert and mix: only with MoE layers */
    bool feasible[SCHED_LAYOUT_COUNT];
    sched_plan_t plan[SCHED_LAYOUT_COUNT];
    sched_dp_result_t dp[SCHED_LAYOUT_COUNT];
    int chosen;            /* the layout the run uses */
    int switches;          /* MoE layers the mix switched from its start */
    int simulations;
} sched_parallel_result_t;

/* w: one device's share (grad_accum = K / 2); opts->devices must be 2. */
mt_status_t sched_parallel_plan(const sched_workload_t *w, const sched_planner_opts_t *opts, double host_bw,
                                sched_parallel_result_t *out, mt_error_t *err);
void sched_parallel_result_free(sched_parallel_result_t *r);

#endif
