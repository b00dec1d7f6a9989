/* Executor state shared by exec.c (placement, pending frees, reading back),
 * exec_stage.c (the staging pool: weight streaming, gradient copies),
 * exec_acts.c (activations offloaded between forward and backward), exec_step.c (the forward/backward program) and
 * exec_optim.c (the optimizer step).  Private to the engine.  Concerns
 * with a module of their own hang here as one member each: the host
 * optimizer worker (exec_host_optim.h), the step counters (exec_counters.h). */
#ifndef MT_ENGINE_EXEC_INTERNAL_H
#define MT_ENGINE_EXEC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/exec/counters.h"
#include "engine/exec/types.h"
#include "engine/layers/env.h"
#include "engine/exec/host_optim.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "moe/expert_predict.h"
#include "moe/staging.h"

typedef struct {
    void *dev;      /* device buffer to free, or NULL */
    void *pinned;   /* pinned host buffer to free, or NULL */
    size_t pinned_bytes;
    kern_event_t *ev; /* fires when the copy reading them is done */
} exec_pending_t;

/* One device allocation holding several tensors fetched or produced
 * together (a block's streamed weights, its host-bound gradients), laid out
 * by moe_staging_layout so that they move in one copy per direction. */
typedef struct {
    void *base;    /* NULL: the slot is free */
    int live;      /* tensors inside still in use; the span is freed at 0 */
    int next_free;
} exec_span_t;

/* The spans of one executor (exec_spans.c): a table with a free list. */
typedef struct {
    exec_span_t *v;
    int n, cap;
    int free_head; /* first free slot, -1 = none */
} exec_spans_t;

typedef struct {
    int *idx;  /* parameters this block holds a device reference to */
    int n, cap;
    bool fetched;
} exec_held_t;

/* Which weights are on the device and why (exec_residency.c): resident
 * ones for the whole run, streamed ones while a block holds them. */
typedef struct {
    kern_event_t **w_ready; /* per block: its weight fetches are done */
    exec_held_t *holding;   /* per block: streamed weights it holds */
    int *param_refs;        /* per parameter: blocks holding its device copy */
    int *w_span;            /* per parameter: span of its streamed weight, -1 = none */
} exec_residency_t;

/* Where this micro-batch's gradients are formed (exec_grads.c). */
typedef struct {
    int *g_span;   /* per parameter: span of its host-bound gradient, -1 = none */
    int *mark;     /* per parameter: scratch stamps for de-duplicating a list */
    int mark_gen;
} exec_grads_t;

typedef struct {
    void **slot;  /* where the device pointer lives in the block's activation structs */
    size_t bytes; /* the device buffer's size (kern_alloc_size) */
    size_t off;   /* its place in the block's pinned copy */
    void *dev;    /* the buffer while it is being offloaded */
} exec_offload_entry_t;

typedef struct {
    exec_offload_entry_t *e; /* sorted by `off` */
    int n, cap;
    moe_staging_region_t region; /* the block's activations in the staging pool, held forward to backward */
    void *direct;                /* or a plain pinned buffer when the pool could not hold them */
    size_t direct_bytes;
    bool fetched;
} exec_offload_t;

/* Saved activations that go to host memory between forward and backward
 * (exec_acts.c). */
typedef struct {
    kern_event_t **a_ready; /* per block: its offloaded activations are back */
    kern_event_t **o_done;  /* per block: its activations have reached host memory */
    exec_offload_t *offl;   /* per block */
} exec_acts_t;

/* Buffers freed once the copies reading them are done (exec.c). */
typedef struct {
    exec_pending_t *v;
    int n, cap;
} exec_pending_list_t;

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
    /* Expert parallelism (engine/exec/expert_parallel.h): this device's place, NULL
     * when it runs every expert itself. */
    const struct moe_ep *ep;
    struct eng_trace *trace; /* not owned; NULL = no trace (eng_exec_set_trace) */
    /* What the block math sees of this device (engine/layers/env.h): a view
     * of dev, model, dp, the plan and ep above, filled in when the executor
     * opens, and the RoPE tables, which it owns. */
    eng_layer_env_t env;
    int nb;                 /* blocks: L + 2 */
    int **used, *nused;     /* dense parameters each block computes with */
    exec_residency_t res;   /* weights on the device (exec_residency.c) */
    exec_grads_t grads;     /* gradient targets (exec_grads.c) */
    exec_spans_t spans;     /* device allocations shared by a block's tensors (exec_spans.c) */
    exec_acts_t acts;       /* offloaded activations (exec_acts.c) */
    moe_predict_t predict;  /* which experts to fetch: the router's counts per MoE layer (moe/expert_predict.h) */
    exec_pending_list_t pend; /* deferred frees (exec.c) */
    exec_host_optim_t hopt; /* the host AdamW worker, its pool and what it updated (exec_host_optim.h) */
    bool overlap_step;   /* this step's last micro-batch updates blocks as they finish */
    /* every update done before eng_optim_step returns (eng_exec_finish_updates_in_step):
     * off by default, so a streamed host-optimizer block's update runs into the next step */
    bool finish_updates_in_step;
    int micro_left;      /* micro-batches of this step still to run */
    bool in_last_micro;  /* the running backward is the step's last */
    /* the staging pool (moe/staging.h): every transfer between pageable host
     * memory and the device goes through it; sized for the plan's window */
    moe_staging_t *stage;
    eng_staging_settings_t stage_set;  /* as given (label copied below) */
    char stage_label[64];
    int stage_tokens;                  /* tokens per micro-batch its activation share is sized for */
    eng_exec_staging_info_t stage_info;
    exec_counters_t cnt;               /* since eng_optim_begin_step (exec_counters.h) */
    /* profiling: compute seconds per block, summed over micro-batches since the last reset */
    double *fwd_s, *bwd_s;
    int timed_micro;
};

/* Samples device and pinned bytes into the trace (if any) at time t. */
void exec_trace_memory(eng_exec_t *x, double t);

/* Called after block b's gradients were folded, on the last micro-batch. */
void exec_optim_block_ready(eng_exec_t *x, int b);

bool exec_param_streamed(const eng_exec_t *x, const eng_param_t *p);
/* Bytes of p's device working copy (w_dtype) and of its fp32 tensors
 * (master, gradient, AdamW state). */
size_t exec_w_bytes(const eng_param_t *p);
size_t exec_f32_bytes(const eng_param_t *p);
/* The staging op that makes the working copy from the host home (the fp32
 * master, or a frozen weight's bf16 home), and that home. */
moe_staging_op_t exec_w_upload_op(const eng_param_t *p);
void *exec_w_home(const eng_param_t *p);
/* The device fp32 master a device optimizer updates: dev_master, or the
 * working copy itself when it is fp32. */
float *exec_dev_master(const eng_exec_t *x, int i);
/* At the turn from forward to backward, the last layer's streamed weights
 * and offloaded activations would go to the host and come straight back:
 * with a prefetch window of at least 1 the backward's first fetches put
 * them on the device during the head's backward anyway, so the executor
 * keeps them from the forward instead (no transfer, no wait, and the
 * head's peak is no higher than its backward's).  The simulator models the
 * same (scheduler/simulate.c). */
bool exec_turn_held(const eng_exec_t *x, int b);
/* Block b's saved activations go to the host between its forward and its
 * backward: the plan says offload and b is not held at the turn. */
bool exec_acts_offloaded(const eng_exec_t *x, int b);
const sched_block_plan_t *exec_block_plan(const eng_exec_t *x, int b);
void exec_defer_free(eng_exec_t *x, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after);
void exec_process_pending(eng_exec_t *x, bool force);

/* ---- exec_stage.c -------------------------------------------------------- */

/* Creates the staging pool for micro-batches of `tokens` tokens (0: without
 * the offloaded activations' share, learnt at the first micro-batch). */
mt_status_t exec_stage_create(eng_exec_t *x, int tokens, mt_error_t *err);
/* Before a micro-batch of n tokens: re-sizes the pool when the plan
 * offloads activations and it was sized for another n. */
mt_status_t exec_stage_prepare(eng_exec_t *x, int tokens, mt_error_t *err);
void exec_stage_destroy(eng_exec_t *x);
/* Copies between pageable host tensors and device memory through the pool
 * (stream-ordered on the H2D / D2H stream; `tag` names the batch in errors). */
mt_status_t exec_stage_h2d(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err);
mt_status_t exec_stage_d2h(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err);
/* Copies the pool has made so far in direction dir (MOE_STAGING_H2D / D2H). */
uint64_t exec_stage_copies(const eng_exec_t *x, int dir);
/* Counts experts that moved nothing in direction dir (no tokens). */
void exec_stage_count_skipped(eng_exec_t *x, int dir, int experts);
/* Bytes of layer l's saved activations for n tokens, as the forward allocates them (exec_step.c). */
size_t exec_layer_act_bytes(const eng_model_t *m, int l, int n);

/* ---- exec_residency.c: weights on the device --------------------------- */

/* Block b's weights on the device: streamed ones fetched on the H2D stream
 * (for a MoE layer, the experts the router is predicted to choose). */
mt_status_t exec_fetch_block(eng_exec_t *x, int b, bool backward, mt_error_t *err);
/* The compute stream waits for block b's fetches. */
void exec_wait_block(eng_exec_t *x, int b);
/* Forward: the router of layer l has run; fetch the experts that got tokens. */
mt_status_t exec_fetch_experts(eng_exec_t *x, int l, const int32_t *counts, mt_error_t *err);
/* Block b is done with its streamed weights. */
void exec_release_block(eng_exec_t *x, int b);
/* A MoE layer whose experts are tensors of their own, fetched and given
 * gradients per expert.  Experts fused over E (gpt-oss) are one tensor per
 * layer: the block moves them whole, as it moves its dense weights. */
bool exec_layer_per_expert(const eng_exec_t *x, int l);
/* Appends to ids[n..] the tensors of layer l's experts with tokens on this
 * device (counts NULL: none) with their LoRA factors; returns the new n. */
int exec_expert_ids(const eng_exec_t *x, int l, const int32_t *counts, int *ids, int n);
/* A list big enough for block b's dense tensors and every expert's (free it). */
int *exec_id_buffer(const eng_exec_t *x, int b);

/* ---- exec_acts.c: offloaded activations ---------------------------------- */

mt_status_t exec_offload_acts(eng_exec_t *x, int b, void **const *slots, int nslots, mt_error_t *err);
mt_status_t exec_fetch_acts(eng_exec_t *x, int b, mt_error_t *err);
void exec_wait_acts(eng_exec_t *x, int b);
/* Drops offloaded copies never fetched back (forward only, errors); streams idle. */
void exec_drop_offloads(eng_exec_t *x);

/* ---- exec_grads.c: gradient storage ------------------------------------- */

/* Gradient targets of everything block b's backward writes. */
mt_status_t exec_prepare_grads(eng_exec_t *x, int b, mt_error_t *err);
/* Folds the gradients whose last contribution of this micro-batch was in
 * block b (a tied embedding's last one is block 0). */
mt_status_t exec_finish_grads(eng_exec_t *x, int b, mt_error_t *err);
/* Frees this micro-batch's gradient targets after an error. */
void exec_drop_grads(eng_exec_t *x);

/* ---- exec_spans.c --------------------------------------------------------- */

/* Device memory for the tensors ids[0..k) (working copies when weights,
 * else fp32 gradients): one span laid out for one copy, else one
 * allocation each.  spans[j] receives tensor j's span, ptrs[j] its
 * address.  Nothing stays allocated on failure. */
mt_status_t exec_span_alloc(eng_exec_t *x, const int *ids, int k, bool weights, const char *tag, int *spans,
                            void **ptrs, mt_error_t *err);
/* One tensor of span s is done with; the last one frees the span (after
 * `after` passes this point, or stream-ordered now when NULL). */
void exec_span_put(eng_exec_t *x, int s, kern_stream_t *after);

/* ---- exec_step.c: one micro-batch's program, block by block -------------
 * Micro-batch-major order (eng_exec_forward_backward) runs one of these
 * through every block forward then backward; layer-major order
 * (exec_layer_major.c) runs K of them through each block in turn.  The
 * callers fetch, wait for and release weights and fold gradients. */
typedef struct exec_micro exec_micro_t;
/* Uploads the batch (ids, targets, mask weights, key lengths); *out is set
 * even on failure and goes to exec_micro_destroy. */
mt_status_t exec_micro_create(eng_exec_t *x, const eng_batch_t *batch, exec_micro_t **out, mt_error_t *err);
void exec_micro_destroy(eng_exec_t *x, exec_micro_t *st);
mt_status_t exec_micro_forward_block(eng_exec_t *x, exec_micro_t *st, int b, const eng_batch_t *batch,
                                     float *logits_out, mt_error_t *err);
mt_status_t exec_micro_loss(eng_exec_t *x, exec_micro_t *st, const eng_batch_t *batch, float loss_scale,
                            bool backward, eng_micro_stats_t *stats, mt_error_t *err);
mt_status_t exec_micro_backward_block(eng_exec_t *x, exec_micro_t *st, int b, mt_error_t *err);

#endif
