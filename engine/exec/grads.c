/* Gradient storage (see exec_internal.h and exec.c on plan invariance):
 * the targets a block's backward writes, and folding them after it.  The
 * first micro-batch of a step computes into the zeroed accumulator when it
 * is on the device; later ones, and host-bound gradients, into fresh zeroed
 * buffers (host-bound ones in one span per block) that are then added on
 * the device or sent to the host in one batch: the first micro-batch's
 * copied (MOE_STAGING_COPY), later ones added (ADD_F32, the same float adds
 * in the same order as a plain host loop), the span freed once the D2H
 * stream has passed the batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/internal.h"
#include "engine/exec/expert_parallel.h"

mt_status_t exec_prepare_grads(eng_exec_t *x, int b, mt_error_t *err) {
    eng_model_t *m = x->model;
    kern_stream_t *cs = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    int *ids = exec_id_buffer(x, b);
    int n = x->nused[b];
    memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
    if (exec_layer_per_expert(x, b - 1)) /* no token, no gradient */
        n = exec_expert_ids(x, b - 1, moe_predict_counts(&x->predict, b - 1, true), ids, n);
    int *host = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *host), nh = 0;
    void **ptr = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptr);
    MT_CHECK(host && ptr, "out of memory for gradient targets");
    int *spans = host + n;
    mt_status_t st = MT_OK;
    const int gen = ++x->grads.mark_gen;
    for (int j = 0; j < n && st == MT_OK; j++) {
        eng_param_t *p = &m->params[ids[j]];
        eng_dparam_t *d = &x->dp[ids[j]];
        /* a deferred update still reading its host gradient and flags */
        exec_host_optim_wait_block(&x->hopt, p->block);
        if (p->frozen || d->g || x->grads.mark[ids[j]] == gen) continue; /* frozen, or already the target in this
                                                                       * micro-batch (tied weights) */
        const sched_block_plan_t *bp = exec_block_plan(x, p->block);
        if (bp->grads == SCHED_GRADS_HOST) {
            x->grads.mark[ids[j]] = gen;
            host[nh++] = ids[j];
            continue;
        }
        if (!d->acc_has_data) {
            d->g = d->g_acc; /* zeroed: computing into it is exact */
            d->g_transient = false;
            continue;
        }
        char tag[200];
        snprintf(tag, sizeof tag, "gradient of %s (this micro-batch)", p->spec->name);
        d->g = kern_alloc(x->dev, exec_f32_bytes(p), tag, err);
        if (!d->g) {
            st = err->code;
            break;
        }
        kern_memset(x->dev, cs, d->g, 0, exec_f32_bytes(p));
        d->g_transient = true;
    }
    char tag[64];
    snprintf(tag, sizeof tag, "gradients of block %d (this micro-batch)", b);
    if (st == MT_OK) st = exec_span_alloc(x, host, nh, false, tag, spans, ptr, err);
    if (st == MT_OK) {
        int last = -1;
        for (int j = 0; j < nh; j++) {
            eng_dparam_t *d = &x->dp[host[j]];
            d->g = ptr[j];
            d->g_transient = true;
            x->grads.g_span[host[j]] = spans[j];
            if (spans[j] != last) { /* one memset per span, padding included */
                const exec_span_t *sp = &x->spans.v[spans[j]];
                kern_memset(x->dev, cs, sp->base, 0, kern_alloc_size(x->dev, sp->base));
                last = spans[j];
            }
        }
    }
    free(ids);
    free(host);
    free(ptr);
    return st;
}

mt_status_t exec_finish_grads(eng_exec_t *x, int b, mt_error_t *err) {
    eng_model_t *m = x->model;
    kern_stream_t *cs = kern_stream(x->dev, KERN_STREAM_COMPUTE), *d2h = kern_stream(x->dev, KERN_STREAM_D2H);
    moe_staging_xfer_t *items = NULL;
    int *which = NULL, n = 0, experts = 0;
    exec_host_optim_wait_block(&x->hopt, b);
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (p->block != b || !d->g) continue;
        d->has_grad = true;
        if (exec_block_plan(x, b)->grads == SCHED_GRADS_DEVICE) {
            if (d->g_transient) {
                x->dev->ops->add(cs, d->g_acc, d->g_acc, d->g, p->spec->numel);
                kern_free(x->dev, d->g); /* the compute stream is the only user */
            }
            d->acc_has_data = true;
            d->g = NULL;
            d->g_transient = false;
            continue;
        }
        if (!items) {
            items = malloc((size_t)m->num_params * sizeof *items);
            which = malloc((size_t)m->num_params * sizeof *which);
            MT_CHECK(items && which, "out of memory for a gradient batch");
        }
        /* first micro-batch: the copy is the accumulator; later ones add into it */
        items[n] = (moe_staging_xfer_t){d->host_g, d->g, exec_f32_bytes(p),
                                        d->acc_has_data ? MOE_STAGING_ADD_F32 : MOE_STAGING_COPY};
        x->cnt.ctr.grad_d2h_bytes += exec_f32_bytes(p);
        which[n++] = i;
        experts += p->spec->role == ENG_P_EXP_GATE;
    }
    mt_status_t st = MT_OK;
    if (n > 0) {
        kern_event_t *ready = kern_event_create(x->dev);
        kern_event_record(x->dev, ready, cs);
        kern_stream_wait_event(x->dev, d2h, ready);
        kern_event_destroy(x->dev, ready);
        char tag[64];
        snprintf(tag, sizeof tag, "gradients of block %d", b);
        const uint64_t before = exec_stage_copies(x, MOE_STAGING_D2H);
        st = exec_stage_d2h(x, items, n, tag, err);
        if (experts > 0 && exec_layer_per_expert(x, b - 1)) {
            exec_counters_moe_batch(&x->cnt, b - 1, 1, (int)(exec_stage_copies(x, MOE_STAGING_D2H) - before), experts);
        }
        for (int j = 0; j < n; j++) {
            eng_dparam_t *d = &x->dp[which[j]];
            if (x->grads.g_span[which[j]] >= 0) exec_span_put(x, x->grads.g_span[which[j]], d2h); /* freed once the D2H passed */
            x->grads.g_span[which[j]] = -1;
            d->acc_has_data = true;
            d->g = NULL;
            d->g_transient = false;
        }
        if (exec_layer_per_expert(x, b - 1)) {
            int none = 0;
            const int32_t *routed = moe_predict_counts(&x->predict, b - 1, true);
            for (int e = 0; e < m->cfg.num_experts; e++) /* another device's experts are not this one's to skip */
                none += routed[e] == 0 && !exec_ep_foreign(x, &m->params[m->layers[b - 1].exp_gate[e]]);
            exec_stage_count_skipped(x, MOE_STAGING_D2H, none);
        }
    }
    free(items);
    free(which);
    return st;
}

void exec_drop_grads(eng_exec_t *x) {
    eng_model_t *m = x->model;
    for (int i = 0; i < m->num_params; i++) {
        eng_dparam_t *d = &x->dp[i];
        if (d->g && d->g_transient) {
            if (x->grads.g_span[i] >= 0) exec_span_put(x, x->grads.g_span[i], kern_stream(x->dev, KERN_STREAM_D2H));
            else kern_free(x->dev, d->g);
        }
        x->grads.g_span[i] = -1;
        d->g = NULL;
        d->g_transient = false;
    }
}
