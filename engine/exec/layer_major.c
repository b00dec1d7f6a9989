/* Layer-major execution of an optimizer step (see exec.h).
 *
 * Forward: block b runs for micro-batches 0..k-1 before block b + 1, so a
 * streamed block's weights are fetched once for all k.  Each micro-batch
 * has its own activation set (exec_micro_t): saved activations are kept,
 * offloaded or dropped for recomputation as the plan says, and so are the
 * block inputs, k of them per block boundary: kept on the device, or (plan
 * lm_inputs OFFLOAD) sent to the host on the D2H stream once the layer's
 * forward of that micro-batch has read them and fetched back before its
 * backward of the layer (all k as the layer's backward begins, ahead of
 * the next layers' weights), through tables of their own per micro-batch (the
 * saved activations' mechanics, acts.h: pinned regions of the staging pool,
 * an event for landed and one for back).  Copies do not change bits, so
 * either choice trains identically.  What stays on the device at a
 * boundary is then the k outputs of the block (the next one's inputs).  The head runs
 * forward, loss and backward per micro-batch (keeping k micro-batches'
 * logits would cost k x (tokens, vocab) floats for nothing).  Backward
 * then goes from the top, each block for all k micro-batches.
 *
 * Bit-identity with micro-batch-major order.  Each micro-batch computes
 * into the same kind of gradient target as there (exec_prepare_grads), so
 * each micro-batch's gradient is the same tensor; what changes is where
 * they are summed:
 * - device-held gradients are folded into the accumulator after each
 *   micro-batch, in micro-batch order, exactly as micro-batch-major does;
 * - host-bound gradients: micro-batch-major copies the first micro-batch's
 *   to the host and adds the others there (MOE_STAGING_ADD_F32, one float
 *   add per element in micro-batch order).  Here the first micro-batch's
 *   device target becomes the accumulator and the others are added on the
 *   device (kern add: the same float adds, same order); the sum is copied
 *   to the host once, after the block's last micro-batch.
 * - a parameter written by a block other than its own (a tied embedding,
 *   written by the head and folded at the embedding) keeps one target per
 *   micro-batch from the first block to its own: the targets are parked
 *   per micro-batch and put back while that micro-batch runs.
 * MoE routing stays per micro-batch: gradient targets exist only for the
 * experts that micro-batch routed to; weight fetches bring the union over
 * the k micro-batches.  The per-block offload tables and events of the
 * executor hold one micro-batch: micro-batch j > 0 gets its own, swapped
 * in while it runs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/place/acts.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/exec/place/grads.h"
#include "engine/exec/place/pending.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/place/residency.h"
#include "engine/exec/place/spans.h"
#include "engine/exec/step.h"

typedef struct {
    int param;      /* index into m->params */
    float *g;       /* its gradient target for this micro-batch */
    bool transient; /* p->g_transient */
    int span;       /* x->grads.g_span */
} parked_t;

typedef struct {
    int k, nb, L, E;
    exec_micro_t **mb;
    /* per micro-batch: the executor's offload table and events while it runs (index 0: the executor's own) */
    exec_offload_t **offl;
    kern_event_t ***o_done, ***a_ready;
    int32_t *counts; /* (k, L, E): tokens per expert each micro-batch routed, MoE layers only */
    int32_t *uni;    /* (L, E): their sum, what weight fetches bring */
    parked_t **park; /* per micro-batch: gradient targets waiting for a later block */
    int *npark;
    float **hacc;    /* per parameter: host-bound gradient summed on the device so far, or NULL */
    int *hspan;      /* its span */
    exec_acts_t *inp; /* per micro-batch: its offloaded block inputs (exec_acts_t.inputs) */
} lm_t;

bool eng_step_order_layer(const eng_exec_t *x, eng_step_order_t order, int k) {
    if (order == ENG_STEP_ORDER_LAYER) return true;
    /* auto: the planner's choice (sched_plan_t.layer_major), made from the
     * link traffic it saves against the activation memory it costs */
    return order == ENG_STEP_ORDER_AUTO && k > 1 && x->plan.layer_major;
}

const char *eng_step_order_name(eng_step_order_t order) {
    switch (order) {
    case ENG_STEP_ORDER_AUTO: return "auto";
    case ENG_STEP_ORDER_MICRO_BATCH: return "micro_batch";
    case ENG_STEP_ORDER_LAYER: return "layer";
    }
    return "?";
}

static bool is_moe(const eng_exec_t *x, int l) {
    const eng_model_t *m = x->model;
    return l >= 0 && l < m->cfg.num_hidden_layers && m->cfg.layer_is_moe[l];
}

static void use_micro(eng_exec_t *x, lm_t *lm, int j) {
    x->acts.offl = lm->offl[j];
    x->acts.o_done = lm->o_done[j];
    x->acts.a_ready = lm->a_ready[j];
}

static void lm_init(eng_exec_t *x, lm_t *lm, int k) {
    eng_model_t *m = x->model;
    memset(lm, 0, sizeof *lm);
    lm->k = k;
    lm->nb = x->nb;
    lm->L = m->cfg.num_hidden_layers;
    lm->E = m->cfg.num_experts > 0 ? m->cfg.num_experts : 1;
    lm->mb = calloc((size_t)k, sizeof *lm->mb);
    lm->offl = calloc((size_t)k, sizeof *lm->offl);
    lm->o_done = calloc((size_t)k, sizeof *lm->o_done);
    lm->a_ready = calloc((size_t)k, sizeof *lm->a_ready);
    lm->counts = calloc((size_t)k * (lm->L > 0 ? lm->L : 1) * lm->E, sizeof *lm->counts);
    lm->uni = calloc((size_t)(lm->L > 0 ? lm->L : 1) * lm->E, sizeof *lm->uni);
    lm->park = calloc((size_t)k, sizeof *lm->park);
    lm->npark = calloc((size_t)k, sizeof *lm->npark);
    lm->hacc = calloc((size_t)m->num_params + 1, sizeof *lm->hacc);
    lm->hspan = calloc((size_t)m->num_params + 1, sizeof *lm->hspan);
    MT_CHECK(lm->mb && lm->offl && lm->o_done && lm->a_ready && lm->counts && lm->uni && lm->park && lm->npark &&
                 lm->hacc && lm->hspan,
             "out of host memory for a layer-major step");
    lm->offl[0] = x->acts.offl;
    lm->o_done[0] = x->acts.o_done;
    lm->a_ready[0] = x->acts.a_ready;
    for (int j = 1; j < k; j++) {
        lm->offl[j] = calloc((size_t)x->nb, sizeof **lm->offl);
        lm->o_done[j] = calloc((size_t)x->nb, sizeof **lm->o_done);
        lm->a_ready[j] = calloc((size_t)x->nb, sizeof **lm->a_ready);
        MT_CHECK(lm->offl[j] && lm->o_done[j] && lm->a_ready[j], "out of host memory for a layer-major step");
        for (int b = 0; b < x->nb; b++) {
            lm->offl[j][b].region.id = -1;
            lm->o_done[j][b] = kern_event_create(x->dev);
            lm->a_ready[j][b] = kern_event_create(x->dev);
        }
    }
    for (int j = 0; j < k; j++) {
        lm->park[j] = calloc((size_t)m->num_params + 1, sizeof **lm->park);
        MT_CHECK_ALLOC(lm->park[j], "parked gradient targets");
    }
    lm->inp = calloc((size_t)k, sizeof *lm->inp);
    MT_CHECK_ALLOC(lm->inp, "offloaded block inputs");
    for (int j = 0; j < k; j++) {
        exec_acts_init(&lm->inp[j], x->dev, x->nb, &x->stage, &x->pend, &x->cnt);
        lm->inp[j].inputs = true;
    }
}

/* Everything the step held, after success or an error: the streams are
 * idle first (exec_micro_destroy syncs). */
static void lm_free(eng_exec_t *x, lm_t *lm) {
    eng_model_t *m = x->model;
    for (int j = 0; j < lm->k; j++) exec_micro_destroy(x, lm->mb[j]);
    kern_device_sync(x->dev);
    /* gradient targets left by an error: each micro-batch's parked ones back in place, then dropped */
    for (int j = 0; j < lm->k; j++) {
        for (int q = 0; q < lm->npark[j]; q++) {
            const parked_t *pk = &lm->park[j][q];
            eng_dparam_t *d = &x->dp[pk->param];
            d->g = pk->g;
            d->g_transient = pk->transient;
            x->grads.g_span[pk->param] = pk->span;
        }
        exec_drop_grads(&x->grads);
        free(lm->park[j]);
    }
    for (int i = 0; i < m->num_params; i++)
        if (lm->hacc[i]) {
            if (lm->hspan[i] >= 0) exec_span_put(&x->spans, lm->hspan[i], NULL);
            else kern_free(x->dev, lm->hacc[i]);
        }
    for (int j = 0; j < lm->k; j++) {
        use_micro(x, lm, j);
        exec_drop_offloads(&x->acts);
        exec_drop_offloads(&lm->inp[j]);
        exec_acts_free(&lm->inp[j]);
    }
    free(lm->inp);
    use_micro(x, lm, 0);
    for (int j = 1; j < lm->k; j++) {
        for (int b = 0; b < lm->nb; b++) {
            free(lm->offl[j][b].e);
            kern_event_destroy(x->dev, lm->o_done[j][b]);
            kern_event_destroy(x->dev, lm->a_ready[j][b]);
        }
        free(lm->offl[j]);
        free(lm->o_done[j]);
        free(lm->a_ready[j]);
    }
    for (int b = 0; b < lm->nb; b++) exec_release_block(&x->res, b);
    exec_process_pending(&x->pend, true);
    free(lm->mb);
    free(lm->offl);
    free(lm->o_done);
    free(lm->a_ready);
    free(lm->counts);
    free(lm->uni);
    free(lm->park);
    free(lm->npark);
    free(lm->hacc);
    free(lm->hspan);
}

static int32_t *counts_of(lm_t *lm, int j, int l) { return lm->counts + ((size_t)j * lm->L + l) * lm->E; }

/* Backward fetch of block b's weights: the experts any micro-batch routed to. */
static mt_status_t fetch_bwd(eng_exec_t *x, lm_t *lm, int b, mt_error_t *err) {
    if (b < 0 || b >= lm->nb) return MT_OK;
    if (is_moe(x, b - 1)) moe_predict_observe(&x->predict, b - 1, lm->uni + (size_t)(b - 1) * lm->E);
    return exec_fetch_block(&x->res, b, true, err);
}

/* Micro-batch j's offloaded activations of block b, fetched back (no-op when
 * not offloaded, or already on their way). */
static mt_status_t fetch_acts(eng_exec_t *x, lm_t *lm, int b, int j, mt_error_t *err) {
    if (b < 1 || j >= lm->k || !exec_acts_offloaded(&x->env, b)) return MT_OK;
    use_micro(x, lm, j);
    return exec_fetch_acts(&x->acts, b, err);
}

/* Micro-batch j's input of block b, offloaded after the block's forward:
 * fetched back (no-op when kept, or already on its way). */
static mt_status_t fetch_input(eng_exec_t *x, lm_t *lm, int b, int j, mt_error_t *err) {
    if (j >= lm->k || !exec_inputs_offloaded(&x->env, b)) return MT_OK;
    return exec_fetch_acts(&lm->inp[j], b, err);
}

/* After block b's forward of micro-batch j: its input goes to the host
 * when the plan says so (the D2H stream waits for the forward that read it). */
static mt_status_t offload_input(eng_exec_t *x, lm_t *lm, int b, int j, mt_error_t *err) {
    if (!exec_inputs_offloaded(&x->env, b)) return MT_OK;
    void **slot = exec_micro_input_slot(lm->mb[j], b);
    return exec_offload_acts(&lm->inp[j], b, &slot, 1, err);
}

static void unpark(eng_exec_t *x, lm_t *lm, int j) {
    for (int q = 0; q < lm->npark[j]; q++) {
        const parked_t *pk = &lm->park[j][q];
        eng_dparam_t *d = &x->dp[pk->param];
        d->g = pk->g;
        d->g_transient = pk->transient;
        x->grads.g_span[pk->param] = pk->span;
    }
    lm->npark[j] = 0;
}

/* After block b's backward of micro-batch j: folds what belongs to block b
 * (host-bound gradients into their device sums; on the last micro-batch
 * the sums go to the host) and parks targets that belong to a later block. */
static mt_status_t fold(eng_exec_t *x, lm_t *lm, int b, int j, mt_error_t *err) {
    eng_model_t *m = x->model;
    kern_stream_t *cs = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const bool last = j == lm->k - 1;
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (p->block != b) {
            if (!d->g) continue;
            /* a device accumulator computed into directly holds this
             * micro-batch's gradient now: later micro-batches must get a
             * target of their own, as they would after its fold */
            if (!d->g_transient) d->acc_has_data = true;
            lm->park[j][lm->npark[j]++] = (parked_t){i, d->g, d->g_transient, x->grads.g_span[i]};
            d->g = NULL;
            d->g_transient = false;
            x->grads.g_span[i] = -1;
            continue;
        }
        if (exec_block_plan(&x->env, b)->grads != SCHED_GRADS_HOST) continue; /* exec_finish_grads folds it */
        if (d->g) {
            MT_CHECK(!d->acc_has_data, "layer-major: %s has a host gradient from before the step", p->spec->name);
            d->has_grad = true;
            if (!lm->hacc[i]) { /* the first micro-batch's gradient is the sum so far (the host copy's COPY) */
                lm->hacc[i] = d->g;
                lm->hspan[i] = x->grads.g_span[i];
            } else { /* the host's ADD_F32, on the device */
                x->dev->ops->add(cs, lm->hacc[i], lm->hacc[i], d->g, p->spec->numel);
                /* the compute stream is its only user */
                if (x->grads.g_span[i] >= 0) exec_span_put(&x->spans, x->grads.g_span[i], NULL);
                else kern_free(x->dev, d->g);
            }
            x->grads.g_span[i] = -1;
            d->g = NULL;
            d->g_transient = false;
        }
        if (last && lm->hacc[i]) { /* the sum goes to the host in exec_finish_grads' one batch */
            d->g = lm->hacc[i];
            d->g_transient = true;
            x->grads.g_span[i] = lm->hspan[i];
            lm->hacc[i] = NULL;
        }
    }
    return exec_finish_grads(&x->grads, b, err);
}

static mt_status_t run_layer_major(eng_exec_t *x, lm_t *lm, const eng_batch_t *batches, float loss_scale,
                                   eng_micro_stats_t *stats, mt_error_t *err) {
    const int k = lm->k, L = lm->L, nb = lm->nb, W = x->plan.prefetch_window, E = lm->E;
    mt_status_t r;
    for (int j = 0; j < k; j++)
        if ((r = exec_micro_create(x, &batches[j], &lm->mb[j], err)) != MT_OK) return r;

    /* forward: embedding and layers, each for every micro-batch */
    for (int b = 0; b <= L; b++) {
        for (int w = 0; w <= W; w++)
            if (b + w < nb && (r = exec_fetch_block(&x->res, b + w, false, err)) != MT_OK) return r;
        exec_wait_block(&x->res, b);
        for (int j = 0; j < k; j++) {
            use_micro(x, lm, j);
            if ((r = exec_micro_forward_block(x, lm->mb[j], b, &batches[j], NULL, err)) != MT_OK) return r;
            if ((r = offload_input(x, lm, b, j, err)) != MT_OK) return r;
            if (is_moe(x, b - 1))
                memcpy(counts_of(lm, j, b - 1), moe_predict_counts(&x->predict, b - 1, true), (size_t)E * sizeof(int32_t));
        }
        if (!exec_turn_held(&x->env, b)) exec_release_block(&x->res, b);
        exec_process_pending(&x->pend, false);
    }
    for (int l = 0; l < L; l++)
        for (int j = 0; is_moe(x, l) && j < k; j++)
            for (int e = 0; e < E; e++) lm->uni[(size_t)l * E + e] += counts_of(lm, j, l)[e];
    moe_predict_forward_done(&x->predict);

    /* the head: forward, loss and backward per micro-batch */
    const int head = nb - 1;
    if ((r = exec_fetch_block(&x->res, head, false, err)) != MT_OK) return r;
    for (int w = 1; w <= W; w++)
        if ((r = fetch_bwd(x, lm, head - w, err)) != MT_OK) return r;
    exec_wait_block(&x->res, head);
    for (int j = 0; j < k; j++) {
        use_micro(x, lm, j);
        x->prog.in_last_micro = j == k - 1;
        /* the last layer's first input on its way during the head's last micro-batch */
        if (j == k - 1 && (r = fetch_input(x, lm, head - 1, 0, err)) != MT_OK) return r;
        memset(&stats[j], 0, sizeof stats[j]);
        if ((r = exec_micro_forward_block(x, lm->mb[j], head, &batches[j], NULL, err)) != MT_OK) return r;
        if ((r = exec_micro_loss(x, lm->mb[j], &batches[j], loss_scale, true, &stats[j], err)) != MT_OK) return r;
        if ((r = exec_micro_backward_block(x, lm->mb[j], head, err)) != MT_OK) return r;
        if ((r = fold(x, lm, head, j, err)) != MT_OK) return r;
    }
    exec_micro_block_ready(x, head);
    exec_release_block(&x->res, head);
    exec_process_pending(&x->pend, false);

    /* backward: layers and embedding from the top, each for every micro-batch */
    for (int b = head - 1; b >= 0; b--) {
        /* every micro-batch's input of this block first: queued behind the
         * next blocks' weights, each would wait for them */
        for (int j = 0; j < k; j++)
            if ((r = fetch_input(x, lm, b, j, err)) != MT_OK) return r;
        for (int w = 0; w <= W; w++)
            if ((r = fetch_bwd(x, lm, b - w, err)) != MT_OK) return r;
        exec_wait_block(&x->res, b);
        for (int j = 0; j < k; j++) {
            /* this micro-batch's activations, and the next ones' on their way during its compute */
            if ((r = fetch_acts(x, lm, b, j, err)) != MT_OK) return r;
            if ((r = j + 1 < k ? fetch_acts(x, lm, b, j + 1, err) : fetch_acts(x, lm, b - 1, 0, err)) != MT_OK)
                return r;
            use_micro(x, lm, j);
            if (exec_acts_offloaded(&x->env, b)) exec_wait_acts(&x->acts, b);
            if (exec_inputs_offloaded(&x->env, b)) exec_wait_acts(&lm->inp[j], b);
            if (is_moe(x, b - 1)) moe_predict_observe(&x->predict, b - 1, counts_of(lm, j, b - 1));
            x->prog.in_last_micro = j == k - 1;
            unpark(x, lm, j);
            if ((r = exec_micro_backward_block(x, lm->mb[j], b, err)) != MT_OK) return r;
            if ((r = fold(x, lm, b, j, err)) != MT_OK) return r;
        }
        use_micro(x, lm, 0);
        exec_micro_block_ready(x, b);
        /* the next step's forward prefetch predicts the union of this step's routing */
        if (is_moe(x, b - 1)) moe_predict_observe(&x->predict, b - 1, lm->uni + (size_t)(b - 1) * E);
        exec_release_block(&x->res, b);
        exec_process_pending(&x->pend, false);
    }
    for (int j = 0; j < k; j++)
        MT_CHECK(lm->npark[j] == 0, "layer-major: micro-batch %d left gradient targets unfolded", j);
    return MT_OK;
}

mt_status_t eng_exec_step_fwd_bwd(eng_exec_t *x, const eng_batch_t *batches, int k, float loss_scale,
                                   eng_step_order_t order, eng_micro_stats_t *stats, mt_error_t *err) {
    if (!eng_step_order_layer(x, order, k)) {
        for (int j = 0; j < k; j++) {
            const mt_status_t r = eng_exec_forward_backward(x, &batches[j], loss_scale, NULL, &stats[j], err);
            if (r != MT_OK) return mt_error_prefix(err, "micro-batch %d: ", j + 1);
        }
        return MT_OK;
    }
    int tokens = 0;
    for (int j = 0; j < k; j++)
        if (batches[j].B * batches[j].T > tokens) tokens = batches[j].B * batches[j].T;
    /* offloaded activations of all k micro-batches are held at once: the
     * pool's activation share for k times the tokens */
    mt_status_t r = exec_micro_prepare(x, tokens * k, err);
    if (r != MT_OK) return r;
    exec_counters_micro_begin(&x->cnt);
    lm_t lm;
    lm_init(x, &lm, k);
    r = run_layer_major(x, &lm, batches, loss_scale, stats, err);
    if (r == MT_OK) {
        x->timed_micro += k;
        x->micro_left = x->micro_left > k ? x->micro_left - k : 0;
        exec_counters_micro_end(&x->cnt);
    } else {
        exec_drop_grads(&x->grads);
        mt_error_prefix(err, "layer-major step: ");
    }
    lm_free(x, &lm);
    return r;
}

mt_status_t eng_exec_step_from_loader(eng_exec_t *x, eng_loader_t *ld, int k, eng_step_order_t order,
                                       eng_micro_stats_t *stats, mt_error_t *err) {
    eng_batch_t *bs = eng_loader_take(ld, k);
    const mt_status_t r = eng_exec_step_fwd_bwd(x, bs, k, 1.0f / (float)k, order, stats, err);
    eng_batches_free(bs, k);
    return r;
}
