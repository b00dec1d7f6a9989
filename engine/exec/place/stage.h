/* The executor's staging pool (moe/staging.h): every transfer between
 * pageable host memory and the device goes through it, a batch per block.
 *
 * Sizing.  The pool holds the plan's in-flight window: the prefetch_window
 * + 1 consecutive blocks of streamed weights with the most bytes (every
 * expert, as with many tokens per micro-batch every expert is hit), one
 * block of host-bound gradients, and the saved activations of every block
 * that offloads them (held from forward to backward, one region per block).
 * moe_staging_plan_bytes turns that list into each mode's capacity; the
 * largest tensor of the model (or activation region) bounds slots and
 * slabs.  Activation sizes depend on the micro-batch, so a model loaded
 * without a token count re-sizes its pool at its first micro-batch (the
 * step program decides when: engine/exec/step.h).
 *
 * What moves through it: weights (residency.h), gradients (grads.h),
 * activations (acts.h), each a batch per block laid out in spans
 * (spans.h).  Those concerns sit above this one and hold a pointer to it;
 * callers holding the executor itself copy through xfer.h. */
#ifndef MT_ENGINE_EXEC_STAGE_H
#define MT_ENGINE_EXEC_STAGE_H

#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/place/lists.h"
#include "engine/exec/place/types.h"
#include "engine/layers/env.h"
#include "engine/model/model.h"
#include "moe/staging.h"

typedef struct {
    const eng_layer_env_t *env;        /* not owned: device, model, plan */
    exec_lists_t *lists;               /* not owned: the blocks' tensors, for the window */
    exec_counters_t *cnt;              /* not owned: experts that moved nothing */
    moe_staging_t *pool;               /* NULL when not created (or destroyed) */
    eng_staging_settings_t set;        /* as given (label copied below) */
    char label[64];
    int tokens;                        /* tokens per micro-batch its activation share is sized for */
    eng_exec_staging_info_t info;
} exec_stage_t;

/* Settings for a pool not created yet (set NULL: the defaults). */
void exec_stage_init(exec_stage_t *s, const eng_layer_env_t *env, exec_lists_t *lists, exec_counters_t *cnt,
                     const eng_staging_settings_t *set);
/* Creates the pool for micro-batches of `tokens` tokens (0: without the
 * offloaded activations' share, learnt at the first micro-batch). */
mt_status_t exec_stage_create(exec_stage_t *s, int tokens, mt_error_t *err);
void exec_stage_destroy(exec_stage_t *s);
/* Whether micro-batches of `tokens` tokens fit the pool as sized; false
 * when the plan offloads activations and the pool was sized for fewer
 * tokens, and it must be drained and made again (exec_stage_create). */
bool exec_stage_fits(exec_stage_t *s, int tokens);

/* Copies between pageable host tensors and device memory through the pool
 * (stream-ordered on the H2D / D2H stream; `tag` names the batch in errors). */
mt_status_t exec_stage_batch_h2d(exec_stage_t *s, const moe_staging_xfer_t *items, int n, const char *tag,
                                 mt_error_t *err);
mt_status_t exec_stage_batch_d2h(exec_stage_t *s, const moe_staging_xfer_t *items, int n, const char *tag,
                                 mt_error_t *err);
/* Copies the pool has made so far in direction dir (MOE_STAGING_H2D / D2H). */
uint64_t exec_stage_copies(const exec_stage_t *s, int dir);
/* Counts experts that moved nothing in direction dir (no tokens). */
void exec_stage_count_skipped(exec_stage_t *s, int dir, int experts);
/* Bytes of saved activations the plan offloads in a micro-batch of `tokens` tokens (the pool's share). */
size_t exec_stage_offload_bytes(const exec_stage_t *s, int tokens);

#endif
