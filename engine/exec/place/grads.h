/* Gradient targets: where a block's backward writes its gradients, and
 * folding them after it.  The first micro-batch of a step computes into
 * the zeroed accumulator when it is on the device; later ones, and
 * host-bound gradients, into fresh zeroed buffers (host-bound ones in one
 * span per block) that are then added on the device or sent to the host in
 * one batch: the first micro-batch's copied (MOE_STAGING_COPY), later ones
 * added (ADD_F32, the same float adds in the same order as a plain host
 * loop), the span freed once the D2H stream has passed the batch.  Why the
 * adds are done this way, whatever the plan: exec.c's note on plan
 * invariance.
 *
 * Above the spans, the staging pool, the counters and the host optimizer
 * worker (a deferred update still reads its block's host gradients);
 * called by the step program and layer-major order. */
#ifndef MT_ENGINE_EXEC_GRADS_H
#define MT_ENGINE_EXEC_GRADS_H

#include "base/status.h"
#include "engine/exec/record/counters.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/lists.h"
#include "engine/exec/place/spans.h"
#include "engine/exec/place/stage.h"
#include "engine/layers/env.h"
#include "moe/expert_predict.h"

typedef struct {
    const eng_layer_env_t *env; /* not owned: device, model, copies (dp), plan */
    exec_lists_t *lists;        /* not owned: what each block writes */
    exec_spans_t *spans;        /* not owned: where host-bound gradients are formed */
    exec_stage_t *stage;        /* not owned: what they cross through */
    exec_counters_t *cnt;       /* not owned: what crossed */
    exec_host_optim_t *hopt;    /* not owned: deferred updates still reading host gradients */
    moe_predict_t *predict;     /* not owned: which experts got tokens */
    int *g_span;                /* per parameter: span of its host-bound gradient, -1 = none */
} exec_grads_t;

void exec_grads_init(exec_grads_t *g, const eng_layer_env_t *env, exec_lists_t *lists, exec_spans_t *spans,
                     exec_stage_t *stage, exec_counters_t *cnt, exec_host_optim_t *hopt, moe_predict_t *predict);
void exec_grads_free(exec_grads_t *g);

/* Gradient targets of everything block b's backward writes. */
mt_status_t exec_prepare_grads(exec_grads_t *g, int b, mt_error_t *err);
/* Folds the gradients whose last contribution of this micro-batch was in
 * block b (a tied embedding's last one is block 0). */
mt_status_t exec_finish_grads(exec_grads_t *g, int b, mt_error_t *err);
/* Frees this micro-batch's gradient targets after an error. */
void exec_drop_grads(exec_grads_t *g);

#endif
