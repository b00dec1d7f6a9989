/* Simulator: one optimizer step (all micro-batches) of a workload under a
 * plan, on four resources that each run their tasks in issue order: the
 * compute stream, the H2D and D2H copy streams, and the host (host AdamW
 * on a thread pool bound by host memory bandwidth).
 *
 * The mechanics are the executor's (engine/exec*.c), and must stay so:
 *
 * per micro-batch, forward over blocks 0..N-1, then backward N-1..0:
 *  - prefetch window W: in each phase, the copies for the block at
 *    position i are issued just before position i - W computes (the first
 *    W + 1 positions at the start of the phase); device memory for them is
 *    taken when issued.
 *  - weights STREAM: an H2D fetch of w_fetch_bytes (routed experts: those
 *    with tokens) before each forward and each backward, freed when the
 *    block's compute ends; the head keeps its weights from its forward to
 *    its backward (no second fetch).  A tied head also fetches block 0's
 *    weights when block 0 is streamed.
 *  - activations: KEEP holds the saved set (block input included) from the
 *    forward to the end of the backward.  OFFLOAD sends the saved set minus
 *    the block input (which stays on the device) D2H after the forward
 *    (compute goes on), into pinned memory that holds it until the H2D
 *    fetch before the backward (issued with the weights, after that D2H).
 *    RECOMPUTE keeps only the input; the backward first re-runs the
 *    forward (recompute_s).  The embedding's and the head's activations
 *    are always kept (their forward and backward are adjacent; the
 *    executor offloads and recomputes decoder layers only).
 *  - the turn: with W >= 1 the last decoder layer keeps its streamed
 *    weights and OFFLOAD activations on the device from its forward to its
 *    backward (no transfer; the backward's first fetches would have them
 *    there during the head's backward anyway).
 *  - blocks that send activations (forward, OFFLOAD) or gradients
 *    (backward, grads HOST) D2H wait before computing until the D2H issued
 *    W + 1 such blocks earlier has drained, so device memory and staging
 *    for D2H stay bounded.
 *  - host work on the copy path (the workload's pack_bw and unpack_bw; 0:
 *    not modelled): every weight fetch and updated working copy H2D is
 *    first packed into pinned staging on the pack threads (one more
 *    resource, in issue order; the copy starts when its pack has ended, so
 *    packing the next fetch overlaps this one's copy), staging held from
 *    the pack's start; every gradient D2H is unpacked into host memory
 *    on the same pack threads, piece by piece behind its copy (it may
 *    start with the copy, ends no earlier), and the D2H stream waits for
 *    that unpack before its next copy (the executor's batch ends so).
 *  - grads HOST: after each backward, D2H of the block's gradients
 *    (experts with tokens); the first micro-batch is unpacked into the host
 *    buffer, later ones added there, in the D2H stream's order.
 *    grads DEVICE: later micro-batches compute into a fresh buffer and add
 *    it on the compute stream.
 *  - max_grad_norm = 0: host AdamW of a block with grads HOST and optimizer
 *    HOST starts when its last gradients are on the host (last micro-batch),
 *    overlapping the rest of the backward.
 *  - then the optimizer step, once every copy and overlapped AdamW is done,
 *    as one sequence: the global norm (host part, device part), then block
 *    by block: optimizer DEVICE: AdamW on the compute stream; optimizer
 *    HOST: gradients D2H if they are on the device, host AdamW (unless done
 *    during the backward), the updated working copy H2D if weights are
 *    RESIDENT.  With clipping every host AdamW is in this sequence.
 *  - the optimizer on the device needs resident weights and device
 *    gradients; other plans with it are invalid.
 *  - layer-major (plan.layer_major): each block's use runs every
 *    micro-batch in turn, one weight fetch per use (the experts any
 *    micro-batch hits), a grads HOST block sums on the device and sends
 *    once; see sim_layer_major in simulate.c.  A micro-batch's block
 *    output is allocated at its forward (the next block's input: k of them
 *    wait at each block boundary).  A decoder layer with lm_inputs OFFLOAD
 *    sends each micro-batch's input D2H as that micro-batch's forward of
 *    the layer ends (freed on the device when the copy ends, held in pinned
 *    memory) and fetches it H2D before that micro-batch's backward of the
 *    layer, issued while the previous micro-batch computes.
 *  - expert parallel (block plan expert_parallel, the workload's
 *    ep_blocks): the block runs at its expert parallel costs (its own
 *    experts' weights, gradients and optimizer state; the token exchange
 *    inside its compute time); through host memory the exchanged rows also
 *    take this device's D2H and H2D streams, behind the copies issued
 *    before, and the block's compute ends no earlier than they do.
 *  - host interference (workload.compute_interference > 0, the CPU
 *    backend): the step is simulated once, the host cores' busy fraction
 *    d = (bytes copied x host_copy_s_per_byte + host optimizer time) /
 *    step time is taken from it, and the step is simulated again with
 *    every compute task 1 + interference x d times as long.
 *
 * Memory (events at task starts and ends; frees before allocations at
 * equal times):
 *  device: resident weights, DEVICE grads, DEVICE optimizer state (whole
 *    step); streamed weights and fetched activations from issue to the end
 *    of their use; saved activations from the forward's start; temporaries
 *    while the block computes; gradients of a micro-batch from the backward
 *    start to the end of their D2H (grads HOST) or of the backward (the
 *    fresh buffer of a later micro-batch, grads DEVICE).
 *  pinned: every copy while it runs; offloaded activations until fetched.
 *  host: home copies of streamed weights, HOST optimizer state and the host
 *    gradient buffer (whole step), less what the plan keeps on NVMe.
 *
 * The NVMe tier (block plan nvme_optim / nvme_weights; the workload's
 * nvme_read_bw / nvme_write_bw): one more resource, the array, at its own
 * read and write rates.  The optimizer's state traffic runs in issue
 * order; a fetch's read takes the first idle span from its issue, as the
 * store serves it ahead of requests that arrive after it.
 *  - nvme_optim: the block's host AdamW first reads its optimizer state
 *    (fp32 master, m, v) into host memory, which holds it until it is
 *    written back after the update; other blocks' compute, copies and
 *    updates go on meanwhile.  Where the AdamW overlaps the backward (no
 *    clipping) and the step has one use of each block's gradients
 *    (layer-major, or one micro-batch), the host gradient buffer of such a
 *    block lives only from its D2H to its update; otherwise all step.
 *    Where it overlaps, the backward goes on past block b only once block
 *    b + SCHED_NVME_GRAD_LEAD's update is done (scheduler/plan.h), as the
 *    executor does: the compute stream's wait is the array's.
 *  - nvme_weights: each fetch of the block's weights first reads them
 *    into pinned staging; a compute that waits for such a fetch is charged
 *    to the NVMe array when the copy had waited for the read.  A trained
 *    block writes its updated working copy back after its AdamW.
 *  - capacity: the sum of those homes and states (sched_block_nvme_bytes). */
#ifndef MT_SCHEDULER_SIMULATE_H
#define MT_SCHEDULER_SIMULATE_H

#include <stdbool.h>

#include "base/status.h"
#include "scheduler/costmodel.h"
#include "scheduler/plan.h"

typedef enum {
    SCHED_RES_COMPUTE = 0,
    SCHED_RES_H2D,
    SCHED_RES_D2H,
    SCHED_RES_HOST,
    SCHED_RES_NVME, /* the NVMe array: reads and writes share it, in issue order */
    SCHED_RES_PACK, /* the staging pool's pack threads: sources packed into pinned staging before an H2D copy */
    SCHED_RES_COUNT
} sched_resource_t;
typedef enum { SCHED_MEM_DEVICE = 0, SCHED_MEM_PINNED, SCHED_MEM_HOST, SCHED_MEM_COUNT } sched_mem_t;

typedef enum {
    SCHED_TASK_FWD = 0,
    SCHED_TASK_BWD,          /* recomputation included */
    SCHED_TASK_FETCH_W,
    SCHED_TASK_FETCH_ACT,
    SCHED_TASK_OFFLOAD_ACT,
    SCHED_TASK_GRAD_D2H,
    SCHED_TASK_GRAD_HOST,    /* unpack: copy / accumulate from staging into the host gradient buffer */
    SCHED_TASK_NORM,
    SCHED_TASK_ADAM,
    SCHED_TASK_W_UPDATE,     /* updated working copies: H2D (resident, host AdamW) or D2H (streamed, device AdamW) */
    SCHED_TASK_EXCHANGE,     /* expert parallel through host memory: routed rows over this device's link */
    SCHED_TASK_NVME_READ,    /* optimizer state or weights from NVMe into host memory */
    SCHED_TASK_NVME_WRITE,   /* optimizer state (and updated weights) back to NVMe */
    SCHED_TASK_OFFLOAD_INPUT,/* layer-major: a micro-batch's block input D2H after the block's forward */
    SCHED_TASK_FETCH_INPUT,  /* ... and back H2D before its backward */
    SCHED_TASK_PACK,         /* weights packed into staging (fp32 masters to bf16 on a bf16 run) */
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
    /* simulate every micro-batch even past the first few (the default
     * extrapolates the repeating ones; see simulate.c); for tests */
    bool every_micro_batch;
    /* every optimizer update finishes inside its step (data parallel over
     * several devices, engine/parallel/devices.c); false: a streamed block's
     * host update runs on into the next step (see simulate.c) */
    bool updates_in_step;
} sched_sim_opts_t;

typedef struct {
    double step_time;
    double busy[SCHED_RES_COUNT];
    /* idle time of the compute stream, by the resource it waited for (the
     * compute entry: nothing; the tail after the last compute goes to the
     * resource that finished last) */
    double waited[SCHED_RES_COUNT];
    double compute_idle;
    sched_resource_t bottleneck;  /* largest of compute busy time and the waits; where that is compute, a
                                   * stream busier than compute that compute waited on (the step is no
                                   * shorter than that stream's busy time, whatever compute's speed) */
    double peak[SCHED_MEM_COUNT];
    double static_bytes[SCHED_MEM_COUNT]; /* held for the whole step */
    double h2d_bytes, d2h_bytes;
    double peer_bytes;            /* expert parallel: rows this device sent the other (through host
                                     memory these are in h2d_bytes and d2h_bytes as well) */
    double recompute_s;           /* compute time spent recomputing */
    double nvme_read_bytes, nvme_write_bytes; /* the NVMe tier's traffic this step */
    double nvme_bytes;            /* what the plan keeps on NVMe (capacity used) */
    double input_d2h_bytes, input_h2d_bytes; /* layer-major block inputs offloaded and fetched back
                                                (also in d2h_bytes and h2d_bytes) */
    double compute_stretch;       /* factor compute ran slower by for host interference (1: none) */
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
