/* The executor: holds a model (model.h, the host side, which knows no
 * executor) and runs its step program under a plan (see scheduler/plan.h)
 * on one device, with its own copies of the parameters there
 * (eng_dparam_t).  This header opens an executor (with the model, or over
 * a model another executor also runs), runs the forward/backward of a
 * micro-batch, reads parameters back, and holds the executor's lifetime
 * and its staging pool's reports (the step itself is optim.h).
 *
 * Streams: compute (kernels), H2D (weight and activation fetches, prefetched
 * `prefetch_window` blocks ahead), D2H (activation offload, gradients),
 * with an event for every cross-stream dependency.  Buffers that a copy
 * still reads are freed only after the copy's event has fired.
 *
 * Staging: every transfer between pageable host memory and the
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

#include "engine/config/config.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/place/types.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "engine/exec/record/trace.h"
#include "moe/staging.h"

/* ---- an executor and the model it holds ----------------------------------
 * The model (model.h) is the host side: config, description, parameters
 * with their host homes.  An executor holds a model and runs it on one
 * device: its own copies of the parameters, the plan, streams' work, the
 * staging pool.  Several executors (one per device) may hold one model. */

/* Opens the model in dir (eng_model_init, LoRA adapters when asked) and an
 * executor for it on dev that owns it: the executor and its staging pool
 * first (bad staging settings fail here, before a large checkpoint is
 * read), then eng_model_read_weights, then eng_exec_place as opts->plan
 * says (NULL: keep everything on the device, the keep_all plan). */
mt_status_t eng_exec_open(eng_exec_t **out, kern_device_t *dev, const char *dir, const eng_model_opts_t *opts,
                          mt_error_t *err);
/* eng_exec_open with a plan and staging settings (either may be NULL). */
mt_status_t eng_exec_load(eng_exec_t **out, kern_device_t *dev, const char *dir, const char *overrides_json,
                          const sched_plan_t *plan, const eng_staging_settings_t *staging, mt_error_t *err);
/* Destroys the executor, and its model when it opened it (NULL: nothing). */
void eng_exec_free(eng_exec_t *x);
/* The model x runs. */
eng_model_t *eng_exec_model(const eng_exec_t *x);
kern_device_t *eng_exec_device(const eng_exec_t *x);
/* The plan x runs (its own copy). */
const sched_plan_t *eng_exec_plan(const eng_exec_t *x);

/* Forward and backward of one micro-batch; gradients are accumulated (+=)
 * with the loss multiplied by loss_scale (1 / gradient_accumulation_steps).
 * When logits_out (host, (B*T, V)) is non-NULL the logits are copied there
 * before the loss consumes them. */
mt_status_t eng_exec_forward_backward(eng_exec_t *x, const eng_batch_t *batch,
                                       float loss_scale, float *logits_out,
                                       eng_micro_stats_t *stats, mt_error_t *err);

/* ---- a whole optimizer step's forward/backward ---------------------------
 * Micro-batch-major order runs each micro-batch through every block forward
 * and backward in turn: a streamed block's weights cross the link twice per
 * micro-batch and host-bound gradients once per micro-batch.  Layer-major
 * order (engine/exec/layer_major.c) runs block b's forward for all k
 * micro-batches before block b + 1, then the backward from the top, each
 * block for all k, so weights cross twice per step and gradients are summed
 * on the device and sent once.  The gradient of each parameter is summed in
 * the same order (micro-batch 0 first) with the same float adds, so both
 * orders give bit-identical results; layer-major holds k micro-batches'
 * kept activations at once, and their block inputs, on the device or (plan
 * lm_inputs OFFLOAD) in host memory between a layer's forward and backward. */

/* Which order a step of k micro-batches runs in (auto: the plan's,
 * sched_plan_t.layer_major, with k > 1). */
bool eng_step_order_layer(const eng_exec_t *x, eng_step_order_t order, int k);
const char *eng_step_order_name(eng_step_order_t order);
/* Forward and backward of batches[0..k) with loss_scale, as k calls of
 * eng_exec_forward_backward would do them, in the order `order` picks;
 * stats[j] is micro-batch j's. */
mt_status_t eng_exec_step_fwd_bwd(eng_exec_t *x, const eng_batch_t *batches, int k, float loss_scale,
                                   eng_step_order_t order, eng_micro_stats_t *stats, mt_error_t *err);
/* Draws k micro-batches from ld (copies: the loader reuses its buffers) and
 * runs eng_exec_step_fwd_bwd on them with loss_scale 1 / k. */
mt_status_t eng_exec_step_from_loader(eng_exec_t *x, eng_loader_t *ld, int k, eng_step_order_t order,
                                       eng_micro_stats_t *stats, mt_error_t *err);

/* Forward only (evaluation): loss statistics (and logits) under the same
 * plan, streamed weights streaming, without touching gradients, the
 * optimizer or anything a later training step reads; nothing is saved for
 * a backward (each layer's activations are freed once its output exists),
 * LoRA's dropout is off and no aux loss is added (stats->loss == ce_loss). */
mt_status_t eng_exec_forward(eng_exec_t *x, const eng_batch_t *batch, float *logits_out,
                              eng_micro_stats_t *stats, mt_error_t *err);

/* Copies parameter i's weight (its master) or its accumulated gradient to
 * host memory (numel floats); waits for pending work first.  A failing
 * read of the NVMe tier stops the process: callers that can report it
 * read weights through eng_exec_read_weights. */
void eng_exec_read_param(eng_exec_t *x, int i, float *host, bool gradient);
/* Parameter i's weights as fp32 wherever they live: its master (host,
 * device or NVMe tier), or a frozen weight's home (host memory, quantised
 * or bf16, or the NVMe tier); a failing read of the tier is returned,
 * naming the file and offset. */
mt_status_t eng_exec_read_weights(eng_exec_t *x, int i, float *host, mt_error_t *err);
/* Whether parameter i got a gradient on this device in the running
 * optimizer step. */
bool eng_exec_param_has_grad(const eng_exec_t *x, int i);
/* Records this model's steps into trace (NULL stops): block spans on the
 * compute track, copies on the H2D/D2H tracks, host AdamW jobs, memory
 * counters.  See engine/exec/record/trace.h. */
void eng_exec_set_trace(eng_exec_t *x, struct eng_trace *trace);

/* Mean compute seconds per block (forward including any wait for its
 * fetches, backward including recomputation) per micro-batch since the
 * last reset: a profiled step, for the planner (Ratel profiles one step the
 * same way).  Arrays of eng_model_num_blocks entries; either may be NULL. */
void eng_exec_block_times(eng_exec_t *x, double *fwd_s, double *bwd_s, bool reset);

/* An executor for model m (not owned) on dev under plan, with its staging
 * pool; weights are not placed yet (the model's host copies may still be
 * loading).  Bad staging settings fail here with the pool's MT_ERR_CONFIG
 * message.  replica: a data-parallel replica (engine/parallel/devices.h),
 * which keeps no master and no optimizer state of its own. */
mt_status_t eng_exec_create(eng_exec_t **out, eng_model_t *m, kern_device_t *dev, const sched_plan_t *plan,
                            const eng_staging_settings_t *staging, bool replica, mt_error_t *err);
/* Places the model's host homes on the device as the plan says. */
mt_status_t eng_exec_place(eng_exec_t *x, mt_error_t *err);
/* Waits for every stream and for the optimizer updates still running, and
 * frees what pending copies held. */
void eng_exec_drain(eng_exec_t *x);
/* eng_optim_step finishes every update before it returns, instead of
 * letting the host updates of streamed blocks run on while the next step
 * starts: for a model whose host homes others read without the executor
 * (the other devices of a data-parallel run). */
void eng_exec_finish_updates_in_step(eng_exec_t *x);

/* The run config's staging: section (and memory.pinned as the default cap)
 * as load settings for micro-batches of micro_batch_size x sequence_len. */
void eng_staging_settings_from_run(const eng_run_config_t *rc, eng_staging_settings_t *out);


/* eng_exec_staging_counters_t: engine/exec/record/counters.h */

moe_staging_t *eng_exec_staging(eng_exec_t *x);
/* Bytes of saved activations the plan offloads in a micro-batch of `tokens` tokens (the pool's share). */
size_t eng_exec_offload_bytes(const eng_exec_t *x, int tokens);
void eng_exec_staging_info(const eng_exec_t *x, eng_exec_staging_info_t *out);
void eng_exec_staging_counters(const eng_exec_t *x, eng_exec_staging_counters_t *out);
/* Adds the pool's counter tracks (reserved / in use / waiting, samples taken
 * at or after since_s on CLOCK_MONOTONIC) to trace t. */
mt_status_t eng_exec_trace_staging(eng_exec_t *x, eng_trace_t *t, double since_s, mt_error_t *err);

#endif
