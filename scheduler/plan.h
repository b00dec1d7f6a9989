/* A plan: where every tensor of a training step lives and when it moves.
 *
 * The unit of decision is a block of the step program: block 0 is the
 * embedding, blocks 1..L the decoder layers, block L+1 the final norm and
 * lm_head (tied embeddings: block L+1 has no weights of its own).  Per
 * block the planner decides, jointly, where its weights, gradients,
 * optimizer state and saved activations live; the executor
 * (engine/exec) carries that out on a backend, and the simulator
 * (scheduler/simulate) predicts its time and memory.
 *
 * Invariant: a plan changes where and when, never what is computed: on the
 * CPU backend every feasible plan gives bit-identical losses and weights. */
#ifndef MT_SCHEDULER_PLAN_H
#define MT_SCHEDULER_PLAN_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    SCHED_WEIGHTS_RESIDENT = 0, /* working copy on the device for the whole run */
    SCHED_WEIGHTS_STREAM,       /* home in host memory; fetched before forward use and again
                                   before backward use (routed experts: only those with tokens) */
} sched_weight_place_t;

typedef enum {
    SCHED_GRADS_DEVICE = 0, /* accumulated on the device */
    SCHED_GRADS_HOST,       /* sent to host memory as the block's backward ends */
} sched_grad_place_t;

typedef enum {
    SCHED_OPTIM_DEVICE = 0, /* fp32 master, m, v on the device; AdamW on the device */
    SCHED_OPTIM_HOST,       /* on the host; host AdamW as the block's gradients arrive */
} sched_optim_place_t;

typedef enum {
    SCHED_ACTS_KEEP = 0, /* saved activations stay on the device until backward */
    SCHED_ACTS_OFFLOAD,  /* D2H after forward, H2D before backward */
    SCHED_ACTS_RECOMPUTE /* only the block input is kept; forward re-run before backward */
} sched_act_place_t;

/* Layer-major order only (sched_plan_t.layer_major): where a decoder
 * layer's block input (the residual stream entering it) waits between the
 * layer's forward and its backward for each of the step's micro-batches.
 * Micro-batch-major order keeps one micro-batch's inputs and ignores this. */
typedef enum {
    SCHED_INPUTS_KEEP = 0, /* every micro-batch's input stays on the device (k per layer) */
    SCHED_INPUTS_OFFLOAD,  /* D2H after the layer's forward of that micro-batch, H2D before its backward */
} sched_input_place_t;

typedef struct {
    sched_weight_place_t weights;
    sched_grad_place_t grads;
    sched_optim_place_t optim;
    sched_act_place_t acts;
    /* With several devices, a MoE layer's routed experts are split between
     * them (expert parallel: each device holds and updates only its own
     * experts, routed tokens are exchanged) instead of replicated on every
     * device (data parallel, the default).  Unused on one device.
     *
     * What the cost model assumes the executor does (scheduler/costmodel.c,
     * simulate.c, data_parallel.c), on exactly two devices: of E routed
     * experts device 0 owns 0 .. E/2 - 1 and device 1 the rest (integer
     * division: device 1 takes an odd one out; engine/exec/expert_parallel.h); both
     * devices run their micro-batches in lockstep; after routing each sends
     * the rows routed to the other's experts (hidden-size, compute dtype)
     * and gets the other's rows for its own, runs its experts on both, and
     * sends the outputs back before the combine; the backward exchanges the
     * output gradients and the input gradients the same way (a recomputed
     * forward exchanges again).  The block's other weights, grads, optimizer
     * and activations follow this plan on each device as in data parallel;
     * its experts' too, for the owned ones only (weights/grads/optim here
     * then describe the device's own experts).  Owned experts' gradients
     * are not summed between devices; each owner's experts are updated by
     * the one host optimizer (one host copy): such a block keeps gradients
     * and AdamW state on the host, and its activations are kept or
     * recomputed, not offloaded (sched_block_plan_expert_parallel). */
    bool expert_parallel;
    /* The third tier (memory.nvme, docs/nvme.md): nvme_optim with optimizer
     * HOST keeps the block's fp32 master and AdamW moments in files on
     * NVMe: read into host memory before its host AdamW, written back
     * after it.  nvme_weights with weights STREAM keeps its weights' home
     * there: each fetch reads them into pinned staging first, and a
     * trained block writes its updated working copy back after AdamW.
     * Ignored under the other placements (sched_block_nvme_optim/_weights). */
    bool nvme_optim, nvme_weights;
    /* Layer-major order: the block input of each micro-batch (decoder
     * layers only; the embedding has none, the head's forward and backward
     * are adjacent).  Offloaded inputs move with the saved activations'
     * mechanics (engine/exec/place/acts.h) on their own tables. */
    sched_input_place_t lm_inputs;
    /* With optimizer HOST (and the home in host memory), the block's
     * trained weights' bf16 working copies live in pinned host memory:
     * fetches and refreshes copy straight from them, with nothing packed
     * into staging on the way (frozen homes in the block are still packed).
     * Ignored under the other placements (sched_block_pinned_home). */
    bool pinned_home;
    /* The block's host gradient accumulators (grads HOST, or optimizer
     * HOST) live in pinned host memory: a gradient copy that fills one
     * (the first micro-batch's, or a step's sum sent once) lands there
     * directly, with nothing unpacked; later micro-batches' adds are still
     * unpacked.  Not with the optimizer state on NVMe
     * (sched_block_pinned_grads). */
    bool pinned_grads;
} sched_block_plan_t;

/* Whether bp really holds its optimizer state / weights' home on NVMe. */
bool sched_block_nvme_optim(const sched_block_plan_t *bp);
bool sched_block_nvme_weights(const sched_block_plan_t *bp);

/* How far the backward may run ahead of the host updates of blocks whose
 * state is on NVMe: once block b's gradients are on their way to the host
 * (its update queued, overlapping the backward), the backward goes on to
 * block b - 1 only when block b + SCHED_NVME_GRAD_LEAD's update is done.
 * Those updates are bound by the array; without the bound the backward
 * would outrun them and their gradients pile up in host memory.  Two: the
 * block being updated and the one read ahead. */
enum { SCHED_NVME_GRAD_LEAD = 2 };

/* Whether bp really keeps its trained working copies pinned. */
bool sched_block_pinned_home(const sched_block_plan_t *bp);
bool sched_block_pinned_grads(const sched_block_plan_t *bp);

/* Makes bp expert parallel as the executor runs it: gradients and AdamW
 * state on the host (every owner's experts are updated through the one
 * host copy), activations recomputed where they would be offloaded (an
 * owner's saved rows are other devices' tokens, which the offload path
 * does not size).  None of these adds device memory. */
void sched_block_plan_expert_parallel(sched_block_plan_t *bp);
/* Whether bp is a placement an expert-parallel block can run with. */
bool sched_block_plan_ep_runnable(const sched_block_plan_t *bp);

typedef enum {
    SCHED_POLICY_AUTO = 0, /* least predicted step time within the budgets */
    SCHED_POLICY_KEEP_ALL, /* everything on the device */
    SCHED_POLICY_OFFLOAD_ALL, /* weights streamed, grads and optimizer on host, activations offloaded */
    SCHED_POLICY_MIN_MEMORY,  /* as offload_all but activations recomputed */
} sched_policy_t;

/* How a MoE layer uses two devices (the run config's parallel:). */
typedef enum {
    SCHED_PARALLEL_AUTO = 0, /* the planner's choice per MoE layer */
    SCHED_PARALLEL_DATA,     /* every layer data parallel */
    SCHED_PARALLEL_EXPERT,   /* every MoE layer expert parallel */
} sched_parallel_t;

typedef struct {
    int num_blocks;              /* L + 2 */
    sched_block_plan_t *blocks;  /* (num_blocks), owned */
    int prefetch_window;         /* blocks fetched ahead of the one computing (>= 1: double buffering) */
    sched_policy_t policy;
    /* Step order.  false: micro-batch-major, each micro-batch through every
     * block forward and backward.  true: layer-major, each block for all of
     * the step's micro-batches in turn, so streamed weights cross the link
     * once per step each way and host-bound gradients once per step, for k
     * micro-batches' block inputs and kept activations held at once (block
     * inputs: unless offloaded, sched_block_plan_t.lm_inputs). */
    bool layer_major;
} sched_plan_t;

/* Block b + SCHED_NVME_GRAD_LEAD, whose overlapped update the backward
 * waits for after block b's gradients (a block of plan whose state is on
 * NVMe), or -1 when it waits for none. */
int sched_nvme_grad_wait_block(const sched_plan_t *plan, int b);

/* Whether block b offloads its micro-batches' block inputs when the step
 * runs in layer-major order: a decoder layer with lm_inputs OFFLOAD. */
bool sched_block_inputs_offloaded(const sched_plan_t *plan, int b);
const char *sched_input_place_name(sched_input_place_t p);

/* Uniform plans for the fixed policies (auto needs the planner). */
void sched_plan_init_uniform(sched_plan_t *plan, int num_blocks, sched_policy_t policy);
void sched_plan_free(sched_plan_t *plan);
const char *sched_policy_name(sched_policy_t p);
const char *sched_parallel_name(sched_parallel_t p);
/* "auto", "keep_all", ... ; false when unknown. */
bool sched_policy_parse(const char *name, sched_policy_t *out);

#endif
