/* The simulator's parts (internal to scheduler/): the state one simulated
 * step carries (sim_t), the resources' tasks and the memory events that
 * every step order issues (simulate_core.c), and the two step orders'
 * walks over the uses of blocks (simulate_micro_batch.c,
 * simulate_layer_major.c).  simulate.c runs a step: an order's walk, then
 * the optimizer step, the steady-state stall and the result.  Calls go one
 * way: simulate.c -> the orders -> simulate_core.c. */
#ifndef MT_SCHEDULER_SIMULATE_INTERNAL_H
#define MT_SCHEDULER_SIMULATE_INTERNAL_H

#include <stdbool.h>

#include "scheduler/simulate.h"
/* A memory event: at time t, d bytes taken (> 0) or given back (< 0). */
typedef struct {
    double t, d;
} ev_t;

/* A host job the walk asked for as a block's gradients landed: its
 * update, overlapping the backward (sim_overlapped_adam), or its norm
 * share (sim_norm_ahead); run by sim_settle_overlapped. */
typedef struct {
    int b;
    bool norm; /* the sums of squares only */
    double d2h_start, ready;
} sim_overlap_t;

/* A span [start, end] a resource is busy. */
typedef struct {
    double start, end;
} sim_span_t;

/* One simulated step: each resource's free time and totals, the memory
 * events per kind, and (when asked for) the tasks in issue order. */
typedef struct {
    const sched_workload_t *w;
    ev_t *ev[SCHED_MEM_COUNT];
    int nev[SCHED_MEM_COUNT], capev[SCHED_MEM_COUNT];
    sched_task_t *tasks;
    int ntasks, captasks;
    bool keep_tasks;
    double free_at[SCHED_RES_COUNT];
    double busy[SCHED_RES_COUNT];
    double waited[SCHED_RES_COUNT];
    double end_max;
    sched_resource_t end_res;
    bool off_step; /* tasks that run into the next step (deferred AdamW): not the step's end */
    double h2d_bytes, d2h_bytes;
    double peer_bytes; /* expert parallel rows sent to the other device */
    double nvme_read_bytes, nvme_write_bytes;
    sim_span_t *nvme_busy; /* the NVMe array's requests, by start, never overlapping (sim_nvme_io) */
    double *overlap_end;   /* per block: its overlapped update's end this step (0: none yet) */
    int nnvme, capnvme;
    double *first_fwd; /* per block: its first forward's start (-1 before it) */
    bool take_back;         /* overlapped updates are noted, for sim_settle_overlapped */
    sim_overlap_t *overlap; /* the walk's host jobs, in order (a norm share and an update per block at most) */
    int noverlap;
    bool norm_ahead; /* the host worker sums host gradients' squares as they land (one device) */
    bool *norm_done; /* per block: its norm share taken that way (sim_norm_ahead) */
} sim_t;

/* A memory event of kind m (d == 0: none). */
void sim_mem(sim_t *s, sched_mem_t m, double t, double d);

/* Runs a task on `res` once `ready`; returns its end. */
double sim_run(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, int micro, double ready,
               double dur, double bytes, double *start_out);

/* A compute task: the gap before it is charged to the resource it waited for. */
double sim_compute(sim_t *s, sched_task_kind_t kind, int block, int micro, double ready, sched_resource_t ready_res,
                   double dur, double *start_out);

/* A copy: pinned staging held while it runs. */
double sim_copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, int micro, double ready, double bytes,
                double copies, double *start_out);

/* An expert parallel block's token exchange, whose time its compute task
 * [start, end] already holds.  Through host memory the rows also cross this
 * device's own link both ways (its rows out D2H, the other's in H2D: two
 * all-to-alls per pass), queued behind the copies issued before; the
 * compute cannot end before they have.  Returns the compute's end. */
double sim_exchange(sim_t *s, int block, int micro, double start, double end, double bytes);

/* One request stream on the NVMe array once `ready`, behind every request
 * issued before it; or, first_idle, in the first idle span at or after
 * `ready` long enough for it, ahead of requests the walk issued before it
 * that arrive later: a fetch's read, issued as the block before starts,
 * goes ahead of that block's optimizer reading its state once its
 * gradients land, as the executor's reads do (the optimizer's state
 * traffic keeps its order: its reads and writes bound the host memory it
 * holds). */
double sim_nvme_io(sim_t *s, bool read, bool first_idle, int block, int micro, double ready, double bytes,
                   double *start_out);

/* Packing `bytes` into staging on the pack threads once `ready` (nothing
 * when the workload does not model it, or for bytes that are plain copies:
 * the caller passes the converted share); returns when the copy may start. */
double sim_pack(sim_t *s, int block, int micro, double ready, double bytes, double *start_out);

/* Gradients of `bytes` landing by a D2H copy [start, end]: unpacked into
 * host memory on the pack threads behind the copy (copied, or added when
 * `dur` is the add's time; dur < 0: the copy's at the unpack rate), the D2H
 * stream held until they are.  Returns when they are in host memory;
 * *res: SCHED_RES_PACK when the unpack ended after the copy, else D2H. */
double sim_unpack(sim_t *s, int block, int micro, double start, double end, double bytes, double dur,
                  sched_resource_t *res);

/* A weight fetch of `bytes` for block b issued at `issue`: with its home on
 * NVMe, read into pinned staging first.  Returns when the H2D copy ends;
 * *ready_res is the resource a compute waiting for it waited on. */
double sim_fetch_weights(sim_t *s, const sched_block_plan_t *p, int b, int micro, double issue, double bytes,
                         double copies, double pack_frac, sched_resource_t *ready_res);

/* Whether block p's host gradient buffer lives only from its D2H to its
 * update (see simulate.h), not the whole step. */
bool sim_grads_transient(const sched_workload_t *w, const sched_plan_t *plan, const sched_block_plan_t *p);

/* Block b's host AdamW once `ready`: with its state on NVMe, read in first
 * (held in host memory until written back after the update); with its
 * weights' home there, the updated working copy written too; speculative:
 * out of place (adam_spec_host_s more).  Returns the AdamW's end, its
 * start in *start_out. */
double sim_host_adam(sim_t *s, const sched_block_cost_t *c, const sched_block_plan_t *p, int b, double ready,
                     bool speculative, double *start_out);

/* Block b's host update once its gradients reached the host during the
 * backward (ready), their copy having started at d2h_start: run on the
 * host worker, a transient gradient buffer with it where the block has
 * one (sim_grads_transient); with take_back, noted for
 * sim_settle_overlapped instead. */
void sim_overlapped_adam(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double d2h_start,
                         double ready);

/* Block b's share of the gradient norm once its host gradients have
 * landed on the step's last backward (ready), on the host worker ahead of
 * its update, as the executor does on one device (engine/exec/
 * optim_step.c's block_ready); with take_back, noted for
 * sim_settle_overlapped instead.  The optimizer step's norm then counts
 * only the blocks not summed this way. */
void sim_norm_ahead(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double ready);

/* Whether the executor takes back overlapped updates under this plan:
 * not with anything on the NVMe tier (engine/exec/optim_step.c). */
bool sim_may_take_back(const sched_plan_t *plan);

/* Once the walk's copies and compute are done, the executor's optimizer
 * step takes back the overlapped updates that have not started (the host
 * worker has not reached them) of blocks that can update into the next
 * step (optim_step.c's defer_block): their adam_done goes back to false and
 * sim_optimizer_step defers them.  The others run on the host in the order
 * asked, a landed norm share (sim_norm_ahead) ahead of the updates, as the
 * executor's worker takes them.  The host worker's work is only AdamW and
 * those sums (no NVMe traffic without the tier), so running the noted jobs
 * here, after the walk, gives the times running them as they were asked
 * would.  (With the tier nothing is noted: the jobs run as asked, in
 * order, where the executor's worker would still put a norm share ahead
 * of a queued update: a small difference, the tier's updates being
 * disk-bound.) */
void sim_settle_overlapped(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool *adam_done);

/* Sorts n events by time, frees before takes at equal times (a stream
 * frees before it allocates again). */
void sim_sort_events(ev_t *ev, int n);
double sim_finish_mem(sim_t *s, sched_mem_t m, double base, bool keep, sched_timeline_t *tl);

/* Layer-major order (plan->layer_major; engine/exec/layer_major.c): the
 * uses of blocks are embedding and layers forward, the head, then layers
 * and embedding backward, 2N - 1 uses, each running all ga micro-batches;
 * the fetches for use u are issued as use u - W - 1 ends, once per use
 * (weights: the experts any micro-batch of the step hits).  Forward: each
 * micro-batch's saved set (or input) less its block input, and its output
 * (the next block's input), are allocated at its forward; activations are
 * offloaded after it as in micro-batch order, and so is the block input
 * where lm_inputs says so.  The head runs forward and backward per
 * micro-batch.  Backward: a micro-batch's offloaded activations are
 * fetched while the previous micro-batch computes, the use's offloaded
 * block inputs, all of them, while the previous use's last one computes;
 * micro-batches after the first add their gradients on the device (grads
 * HOST too: the sum stays on the device) and a grads HOST block sends the
 * step's sum once after its last micro-batch.  Returns the last compute end. */
double sim_layer_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                       bool *adam_done, sched_sim_result_t *out);

/* Micro-batch order (see simulate.h).  Returns the last compute end. */
double sim_micro_batch_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                             bool *adam_done, sched_sim_result_t *out);

#endif
