/* The executor's state: struct eng_exec, whose members are its concerns'
 * own structs (each with its header and its module), wired to each other
 * when the executor is created (exec.c).  Private to the executor and to
 * the packages built on it (engine/parallel reads a replica's copies).
 *
 * Only the struct lives here.  A concern's functions take that concern's
 * struct, never the executor, so the concerns sit below this header and
 * include it nowhere; the files that do include it are those that work on
 * the whole executor: its lifetime and placement (exec.c), the step program
 * (step.c, layer_major.c), the optimizer step and its state, the staging
 * doors (xfer.c), expert ownership (expert_parallel.c). */
#ifndef MT_ENGINE_EXEC_EXECUTOR_H
#define MT_ENGINE_EXEC_EXECUTOR_H

#include <stdbool.h>

#include "engine/exec/place/acts.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/place/grads.h"
#include "engine/exec/place/host_buffers.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/lists.h"
#include "engine/exec/place/pending.h"
#include "engine/exec/progress.h"
#include "engine/exec/place/residency.h"
#include "engine/exec/place/spans.h"
#include "engine/exec/place/stage.h"
#include "engine/exec/place/types.h"
#include "engine/layers/env.h"
#include "engine/model/model.h"
#include "moe/expert_predict.h"
#include "scheduler/plan.h"

struct eng_exec {
    eng_model_t *model;     /* the host model it runs (not owned unless owns_model) */
    bool owns_model;        /* opened by eng_exec_open: freed with the executor */
    kern_device_t *dev;     /* not owned */
    eng_dparam_t *dp;       /* (model->num_params) each parameter's copies on this device */
    sched_plan_t plan;      /* a copy of the plan it runs */
    /* A data-parallel replica (engine/parallel/devices.h): another executor of
     * the same model runs the one optimizer step over the reduced
     * gradients, so this one keeps no device master and no optimizer state. */
    bool replica;
    struct eng_trace *trace; /* not owned; NULL = no trace (eng_exec_set_trace) */
    /* What the block math, and every concern below, sees of this device
     * (engine/layers/env.h): a view of dev, model, dp and the plan above,
     * and this device's expert-parallel place (exec_ep_set), filled in when
     * the executor opens, and the RoPE tables, which it owns. */
    eng_layer_env_t env;
    int nb;                   /* blocks: L + 2 */
    exec_lists_t lists;       /* the parameters each block works with (lists.h) */
    exec_residency_t res;     /* weights on the device (residency.h) */
    exec_grads_t grads;       /* gradient targets (grads.h) */
    exec_spans_t spans;       /* device allocations shared by a block's tensors (spans.h) */
    exec_acts_t acts;         /* offloaded activations (acts.h) */
    moe_predict_t predict;    /* which experts to fetch: the router's counts per MoE layer (moe/expert_predict.h) */
    exec_pending_list_t pend; /* deferred frees (pending.h) */
    exec_host_optim_t hopt;   /* the host AdamW worker, its pool and what it updated (host_optim.h) */
    exec_host_buffers_t hbuf; /* working copies and gradient accumulators in pinned memory (host_buffers.h) */
    exec_progress_t prog;     /* the optimizer step in progress (progress.h) */
    int micro_left;           /* its micro-batches still to run (engine/parallel resets a replica's) */
    exec_stage_t stage;       /* the staging pool, sized for the plan's window (stage.h) */
    exec_counters_t cnt;      /* since eng_optim_begin_step (counters.h) */
    /* profiling: compute seconds per block, summed over micro-batches since the last reset */
    double *fwd_s, *bwd_s;
    int timed_micro;
};

#endif
