/* The executor: runs the step program of a model under a plan (see
 * scheduler/plan.h) on a backend.  The model's face is model.h
 * (forward/backward of a micro-batch) and optim.h (the step); this header
 * adds the executor's lifetime and its staging pool's reports.
 *
 * Streams: compute (kernels), H2D (weight and activation fetches, prefetched
 * `prefetch_window` blocks ahead), D2H (activation offload, gradients),
 * with an event for every cross-stream dependency.  Buffers that a copy
 * still reads are freed only after the copy's event has fired.
 *
 * Staging (issue 4): every transfer between pageable host memory and the
 * device goes through one staging pool per model (moe/staging.h): streamed
 * weights and host-bound gradients a block at a time, batched so that a
 * block's tensors (a layer's experts among them) move in one copy per
 * contiguous device span; offloaded activations in one region per block,
 * held from forward to backward; the optimizer's gradient reads and weight
 * refreshes.  Its capacity is the plan's in-flight window (see
 * eng_exec_staging_info_t), bounded by staging.cap / memory.pinned. */
#ifndef MT_ENGINE_EXEC_H
#define MT_ENGINE_EXEC_H

#include <stdint.h>

#include "engine/config.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "engine/trace.h"
#include "moe/staging.h"

/* Sets up the executor for plan and creates the staging pool; weights are
 * not placed yet (the model's host copies may still be loading).  Bad
 * staging settings fail here with the pool's MT_ERR_CONFIG message. */
mt_status_t eng_exec_create(eng_model_t *m, const sched_plan_t *plan, const eng_staging_settings_t *staging,
                            mt_error_t *err);
/* Places the host-resident model on the device as the plan says. */
mt_status_t eng_exec_place(eng_model_t *m, mt_error_t *err);
void eng_exec_destroy(eng_model_t *m);
/* Waits for every stream and frees what pending copies held. */
void eng_exec_drain(eng_model_t *m);

/* The run config's staging: section (and memory.pinned as the default cap)
 * as load settings for micro-batches of micro_batch_size x sequence_len. */
void eng_staging_settings_from_run(const eng_run_config_t *rc, eng_staging_settings_t *out);

/* How the pool was sized. */
typedef struct {
    moe_staging_mode_t mode;
    int tokens;               /* tokens per micro-batch the activation share is for (0: none yet) */
    int window_blocks;        /* blocks of streamed weights in flight: prefetch_window + 1 */
    int window_tensors;       /* tensors (activation regions count as one) */
    size_t window_payload;    /* their bytes: the floor no pool can beat */
    size_t window_weights, window_grads, window_acts; /* the payload's parts */
    size_t window_need;       /* what the mode needs for the window (moe_staging_plan_bytes) */
    size_t capacity;          /* the pool's pinned capacity (after the cap) */
    size_t largest_tensor;    /* the largest single staged tensor or activation region */
    char largest_name[160];
} eng_exec_staging_info_t;

/* The executor's own counts, since the last eng_optim_begin_step.  Index
 * [0] is H2D (weight fetches), [1] D2H (gradients). */
typedef struct {
    uint64_t moe_passes[2];     /* (MoE layer, micro-batch) pairs whose experts moved that way */
    uint64_t moe_copies[2];     /* copies the batches holding those experts issued */
    int max_moe_copies[2];      /* most copies one MoE layer took in one micro-batch */
    uint64_t experts_moved[2];  /* expert fetches / expert gradient copies */
    uint64_t experts_skipped[2];/* ... not made because the expert got no token */
    uint64_t experts_unused;    /* prefetched for a forward, then got no token */
    uint64_t acts_unstaged;     /* offloads that fell back to a plain pinned buffer (pool too small) */
    uint64_t acts_offloaded;    /* bytes of saved activations offloaded */
    /* Bytes that crossed the link: weight working copies host -> device
     * (streamed fetches and resident weights refreshed by a host optimizer;
     * bf16 copies count their bf16 bytes) and gradients device -> host. */
    uint64_t weight_h2d_bytes;
    uint64_t grad_d2h_bytes;
} eng_exec_staging_counters_t;

moe_staging_t *eng_exec_staging(eng_model_t *m);
/* Bytes of saved activations the plan offloads in a micro-batch of `tokens` tokens (the pool's share). */
size_t eng_exec_offload_bytes(const eng_model_t *m, int tokens);
void eng_exec_staging_info(const eng_model_t *m, eng_exec_staging_info_t *out);
void eng_exec_staging_counters(const eng_model_t *m, eng_exec_staging_counters_t *out);
/* Adds the pool's counter tracks (reserved / in use / waiting, samples taken
 * at or after since_s on CLOCK_MONOTONIC) to trace t. */
mt_status_t eng_exec_trace_staging(eng_model_t *m, eng_trace_t *t, double since_s, mt_error_t *err);

#endif
