/* Weight residency: which parameters' working copies are on the device
 * and why.  Resident weights are placed once, when the executor opens; a
 * streamed block's weights are fetched before it computes (its dense
 * tensors, and for a MoE layer the experts the router chose or is
 * predicted to choose, moe/expert_predict.h), from their homes in host
 * memory or, where the plan keeps a block's homes on the NVMe tier (a
 * trained bf16 working copy, a LoRA run's frozen base), read from there
 * straight into the staging pool's pinned buffers by its pack threads
 * (moe/staging.h, MOE_STAGING_READ); held by reference while any block
 * uses them, and released into their span afterwards.
 *
 * A read from the tier runs beside the issuing thread, so it cannot
 * return a failure to the fetch: the tier keeps it (eng_optim_nvme_note)
 * and the step reports it once the loss is known (exec_micro_loss) or at
 * the optimizer step, before any update is kept; what crossed the link in
 * between is never a result.
 *
 * Above the spans it fills, the staging pool its fetches go through, the
 * counters of what crossed and the host optimizer worker (a streamed
 * block's home may still be taking the last step's update); called by the
 * step program, layer-major order and the optimizer step (which fetches
 * the next step's first blocks). */
#ifndef MT_ENGINE_EXEC_RESIDENCY_H
#define MT_ENGINE_EXEC_RESIDENCY_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/exec/record/counters.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/lists.h"
#include "engine/exec/place/spans.h"
#include "engine/exec/place/stage.h"
#include "engine/layers/env.h"
#include "moe/expert_predict.h"

typedef struct {
    int *idx;  /* parameters this block holds a device reference to */
    int n, cap;
    bool fetched;
} exec_held_t;

/* A parameter's home on the NVMe tier as the staging pool reads it. */
typedef struct {
    moe_staging_read_t base;
    eng_optim_nvme_t *nv;
    const eng_model_t *m;
    int param;
} exec_home_read_t;

typedef struct {
    const eng_layer_env_t *env; /* not owned: device, model, copies (dp), plan */
    exec_lists_t *lists;        /* not owned: what each block fetches */
    exec_spans_t *spans;        /* not owned: where a block's fetched weights live */
    exec_stage_t *stage;        /* not owned: what they cross through */
    exec_counters_t *cnt;       /* not owned: what crossed */
    exec_host_optim_t *hopt;    /* not owned: deferred updates of the homes fetched from */
    moe_predict_t *predict;     /* not owned: which experts to fetch */
    kern_event_t **w_ready; /* per block: its weight fetches are done */
    exec_held_t *holding;   /* per block: streamed weights it holds */
    exec_held_t *dequant;   /* per block: fetched quantised weights exec_wait_block dequantises */
    int *param_refs;        /* per parameter: blocks holding its device copy */
    int *w_span;            /* per parameter: span of its streamed weight, -1 = none */
    exec_home_read_t *home_reads; /* per parameter: its home's read from the NVMe tier (made on the
                                   * first; a batch's requests live until its copies are done) */
} exec_residency_t;

void exec_residency_init(exec_residency_t *r, const eng_layer_env_t *env, exec_lists_t *lists,
                         exec_spans_t *spans, exec_stage_t *stage, exec_counters_t *cnt, exec_host_optim_t *hopt,
                         moe_predict_t *predict);
void exec_residency_free(exec_residency_t *r);

/* Block b's weights on the device: streamed ones fetched on the H2D stream
 * (for a MoE layer, the experts the router is predicted to choose). */
mt_status_t exec_fetch_block(exec_residency_t *r, int b, bool backward, mt_error_t *err);
/* The compute stream waits for block b's fetches. */
void exec_wait_block(exec_residency_t *r, int b);
/* Forward: the router of layer l has run; fetch the experts that got tokens. */
mt_status_t exec_fetch_experts(exec_residency_t *r, int l, const int32_t *counts, mt_error_t *err);
/* Block b is done with its streamed weights. */
void exec_release_block(exec_residency_t *r, int b);

#endif
