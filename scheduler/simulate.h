/* Simulator: one optimizer step (all micro-batches) of a workload under a
 * plan, on four resources that each run their tasks in issue order: the
 * compute stream, the H2D and D2H copy streams, and the host (host AdamW
 * and gradient accumulation, on a thread pool bound by host memory
 * bandwidth).
 *
 * The mechanics are the executor's (engine/exec), and must stay so:
 *
 * forward, blocks 0..N-1, then backward N-1..0, per micro-batch:
 *  - weights STREAM: an H2D fetch before each use (forward and again
 *    backward) of w_fetch_bytes (routed experts: those with tokens).  The
 *    tied head also fetches block 0's weights when block 0 is streamed.
 *  - activations OFFLOAD: D2H of the saved activations after the forward
 *    (compute goes on), H2D before the backward (after that D2H is done).
 *  - activations RECOMPUTE: only the block input is kept; the backward
 *    first re-runs the forward (recompute_s on the compute stream).
 *  - prefetch window W: uses that need an H2D copy take slots of a ring of
 *    W + 1; the copies for such a use start once the compute of the use
 *    W + 1 slots earlier has ended (W = 0: fetch, compute, fetch, ...).
 *  - uses that send activations (OFFLOAD, forward) or gradients (grads
 *    HOST, backward) D2H take slots of a second ring of W + 1: their
 *    compute waits until the D2H of the use W + 1 slots earlier has ended
 *    (backpressure: device memory and staging for D2H stay bounded).
 *  - grads HOST: after each backward, D2H of the block's gradients (experts
 *    with tokens), then on the host: copy (first micro-batch) or add into
 *    the host gradient buffer.  grads DEVICE with optimizer HOST: the
 *    gradients go D2H once, after the block's backward in the last
 *    micro-batch.
 *  - optimizer HOST, no clipping (max_grad_norm = 0): host AdamW of a block
 *    starts when its last gradients are on the host, overlapping the rest
 *    of the backward.  With clipping: the global norm needs every gradient
 *    first, so host AdamW of all blocks starts after the norm (host part
 *    after the last gradient arrives; device part after the backward).
 *  - optimizer DEVICE: AdamW on the compute stream after the backward
 *    (after the global norm when clipping).
 *  - weights RESIDENT with optimizer HOST: the updated working copy goes
 *    H2D after the block's host AdamW.  Weights STREAM with optimizer
 *    DEVICE: the updated working copy goes D2H (to its home on the host)
 *    after the device AdamW.
 *  - grads HOST with optimizer DEVICE is not a valid plan.
 *
 * Memory (events at task starts and ends; frees before allocations at
 * equal times):
 *  device: resident weights, DEVICE grads, DEVICE optimizer state (whole
 *    step); streamed weights from fetch start to the end of their use;
 *    saved activations from forward start (KEEP, OFFLOAD) to the end of the
 *    backward (KEEP) or of the D2H (OFFLOAD; again from the H2D fetch to
 *    the end of the backward); RECOMPUTE: the input from forward start, the
 *    rest during the backward; temporaries while the block computes; HOST
 *    gradients from the backward start to the end of their D2H.
 *  pinned: the bytes of every copy in flight (staging).
 *  host: home copies of streamed weights, HOST optimizer state and the host
 *    gradient buffer (whole step); offloaded activations from D2H start to
 *    the end of their H2D. */
#ifndef MT_SCHEDULER_SIMULATE_H
#define MT_SCHEDULER_SIMULATE_H

#include <stdbool.h>

#include "kernels/status.h"
#include "scheduler/costmodel.h"
#include "scheduler/plan.h"

typedef enum { SCHED_RES_COMPUTE = 0, SCHED_RES_H2D, SCHED_RES_D2H, SCHED_RES_HOST, SCHED_RES_COUNT } sched_resource_t;
typedef enum { SCHED_MEM_DEVICE = 0, SCHED_MEM_PINNED, SCHED_MEM_HOST, SCHED_MEM_COUNT } sched_mem_t;

typedef enum {
    SCHED_TASK_FWD = 0,
    SCHED_TASK_BWD,          /* recomputation included */
    SCHED_TASK_FETCH_W,
    SCHED_TASK_FETCH_ACT,
    SCHED_TASK_OFFLOAD_ACT,
    SCHED_TASK_GRAD_D2H,
    SCHED_TASK_GRAD_HOST,    /* copy / accumulate into the host gradient buffer */
    SCHED_TASK_NORM,
    SCHED_TASK_ADAM,
    SCHED_TASK_W_UPDATE,     /* updated working copies: H2D (resident, host AdamW) or D2H (streamed, device AdamW) */
    SCHED_TASK_KIND_COUNT,
} sched_task_kind_t;

typedef struct {
    sched_resource_t res;
    sched_task_kind_t kind;
    int block;   /* -1: all blocks (a fused norm / device AdamW) */
    int micro;   /* micro-batch, -1 for optimizer tasks */
    double start, end;
    double bytes;
} sched_task_t;

typedef struct {
    double t, bytes;
} sched_mem_point_t;

typedef struct {
    sched_mem_point_t *pts; /* (count), bytes in use after each change, time-ordered */
    int count;
} sched_timeline_t;

typedef struct {
    bool timelines; /* fill timeline[] */
    bool tasks;     /* fill tasks */
} sched_sim_opts_t;

typedef struct {
    double step_time;
    double busy[SCHED_RES_COUNT];
    /* idle time of the compute stream, by the resource it waited for (the
     * compute entry: nothing; the tail after the last compute goes to the
     * resource that finished last) */
    double waited[SCHED_RES_COUNT];
    double compute_idle;
    sched_resource_t bottleneck;  /* largest of compute busy time and the waits */
    double peak[SCHED_MEM_COUNT];
    double static_bytes[SCHED_MEM_COUNT]; /* held for the whole step */
    double h2d_bytes, d2h_bytes;
    double recompute_s;           /* compute time spent recomputing */
    sched_timeline_t timeline[SCHED_MEM_COUNT];
    sched_task_t *tasks;
    int num_tasks;
} sched_sim_result_t;

/* Checks a plan against a workload: block count, window >= 0, no grads
 * HOST with optimizer DEVICE. */
mt_status_t sched_plan_check(const sched_plan_t *plan, int num_blocks, mt_error_t *err);

mt_status_t sched_simulate(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                           sched_sim_result_t *out, mt_error_t *err);
void sched_sim_result_free(sched_sim_result_t *r);

const char *sched_resource_name(sched_resource_t r);
const char *sched_mem_name(sched_mem_t m);
const char *sched_task_kind_name(sched_task_kind_t k);

#endif
