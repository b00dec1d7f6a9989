/* Planner: a plan (scheduler/plan.h) for a workload within memory budgets.
 *
 * Policies: keep_all, offload_all and min_memory are the uniform plans of
 * plan.h with the run config's per-kind overrides applied; auto searches.
 *
 * auto: start from the plan that needs the least device memory (weights
 * streamed, gradients and optimizer on the host, activations recomputed;
 * the embedding's and the head's activations kept, as their forward and
 * backward are adjacent and recomputing or offloading them saves nothing),
 * then repeatedly take the single change with the most predicted time
 * saved per byte of device peak added (keep instead of recompute or
 * offload, offload instead of recompute, resident weights, device
 * gradients, device optimizer, a wider prefetch window; layer-major
 * plans also start with every decoder layer's block inputs offloaded and
 * may keep a layer's on the device), simulating each candidate.  Once nothing saves time, changes that cost no time but move
 * traffic or host memory off the link and the host are taken the same way.
 * The search ignores the device budget, so the sequence of plans it walks
 * is the same for every device budget; the answer is the fastest plan of
 * that sequence within all budgets.  More device budget therefore never
 * predicts a slower step.  It refuses a change that would break the
 * pinned or host budget the plan so far keeps: few changes give those
 * back, so the plans after it would not fit.
 *
 * Infeasible: which budget is short and the smallest that would work: for
 * the device, the peak of the least-memory plan; for pinned memory, the
 * least pinned peak of any plan considered within the device budget; for
 * the host, the least host peak reachable within the device budget (a
 * greedy that moves host state to the device by host bytes saved per
 * device byte added).
 *
 * NVMe (opts.nvme): only when no plan fits host memory.  For each plan of
 * the walk (fastest first) that fits the device budget, optimizer state and
 * then streamed weights' homes go to NVMe block by block, in block order,
 * as many as the host's excess needs, re-simulated until the plan fits or
 * nothing is left to move; the fastest plan that fits every budget and the
 * NVMe budget wins. */
#ifndef MT_SCHEDULER_PLANNER_H
#define MT_SCHEDULER_PLANNER_H

#include <stdbool.h>

#include "base/status.h"
#include "scheduler/costmodel.h"
#include "scheduler/plan.h"
#include "scheduler/simulate.h"

#define SCHED_AUTO_CHOICE (-1)

typedef struct {
    sched_policy_t policy;
    int prefetch_window;     /* 0 = the planner chooses (1..max_window) */
    int max_window;          /* 0 = 4 */
    /* per-kind overrides: SCHED_AUTO_CHOICE or a sched_*_place_t value
     * (lm_inputs: sched_input_place_t, layer-major plans' block inputs) */
    int weights, grads, optim, acts, lm_inputs;
    /* step order: SCHED_AUTO_CHOICE (plan both, the faster feasible one
     * wins), 0 micro-batch-major, 1 layer-major (sched_plan_t.layer_major) */
    int step_order;
    double budget[SCHED_MEM_COUNT]; /* bytes; 0 = unlimited */
    /* Share of the device budget plans leave free (0..1): a GPU frees in
     * stream order and its arena fragments (engine/model/desc/program.c sets it). */
    double device_headroom;
    /* Devices of the run (0 or 1: one) and parallel: for MoE layers.
     * sched_plan_make plans one layout: expert sets expert_parallel on
     * every MoE block (devices must be 2 and the model have MoE layers),
     * auto and data plan data parallel; the per-layer choice of auto is
     * sched_parallel_plan's (data_parallel.h). */
    int devices;
    sched_parallel_t parallel;
    /* The NVMe tier (memory.nvme with a profile's nvme: section; the
     * workload's rates): when no plan fits host memory, the planner moves
     * optimizer state, then decoder layers' streamed weights' homes, to
     * NVMe block by block until one does (see planner.c); nvme_budget:
     * the most bytes it may keep there, 0 = no limit. */
    bool nvme;
    double nvme_budget;
    /* The NVMe pass moves optimizer state only, never weights' homes (a
     * training run in fp32, whose weights' homes are its masters). */
    bool nvme_optim_only;
} sched_planner_opts_t;

void sched_planner_opts_default(sched_planner_opts_t *o);

typedef struct {
    bool feasible;
    sched_plan_t plan;         /* the plan chosen; when infeasible, the one the diagnosis refers to */
    sched_sim_result_t sim;    /* its simulation, with timelines and tasks */
    bool short_of[SCHED_MEM_COUNT];
    double needed[SCHED_MEM_COUNT]; /* smallest budget that would work (for the short ones) */
    char why[1536];            /* infeasible: what is short and by how much */
    int largest_block;         /* block with the largest working set */
    double block_working_set;  /* its weights + saved activations + temporaries */
    int plans_walked;          /* plans on the search path (auto) */
    int simulations;
    /* each step order's best plan ([0] micro-batch-major, [1] layer-major),
     * for the report; planned[o] false when that order was not planned */
    bool planned[2], order_feasible[2];
    double order_step_s[2], order_h2d_bytes[2], order_d2h_bytes[2], order_peak_device[2];
    /* layer-major ([1]): decoder layers whose block inputs the plan offloads,
     * and the bytes they send D2H per step (as many come back H2D) */
    int order_inputs_offloaded[2];
    double order_input_bytes[2];
} sched_planner_result_t;

/* MT_ERR_CONFIG for contradictory overrides (grads host with optimizer
 * device); an infeasible budget is not an error: feasible = false. */
mt_status_t sched_plan_make(const sched_workload_t *w, const sched_planner_opts_t *opts, sched_planner_result_t *out,
                            mt_error_t *err);
void sched_planner_result_free(sched_planner_result_t *r);

#endif
