/* Gradient targets and their folding (see grads.h). */
#include "engine/exec/place/grads.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/place/copies.h"
#include "engine/exec/place/plan_query.h"

void exec_grads_init(exec_grads_t *gr, const eng_layer_env_t *env, exec_lists_t *lists, exec_spans_t *spans,
                     exec_stage_t *stage, exec_counters_t *cnt, exec_host_optim_t *hopt, moe_predict_t *predict) {
    const int P = env->model->num_params;
    *gr = (exec_grads_t){.env = env, .lists = lists, .spans = spans, .stage = stage, .cnt = cnt, .hopt = hopt,
                        .predict = predict};
    gr->g_span = malloc((size_t)(P > 0 ? P : 1) * sizeof *gr->g_span);
    MT_CHECK_ALLOC(gr->g_span, "gradient spans");
    for (int i = 0; i < P; i++) gr->g_span[i] = -1;
}

void exec_grads_free(exec_grads_t *gr) {
    free(gr->g_span);
    memset(gr, 0, sizeof *gr);
}

mt_status_t exec_prepare_grads(exec_grads_t *gr, int b, mt_error_t *err) {
    const eng_model_t *m = gr->env->model;
    kern_device_t *dev = gr->env->dev;
    kern_stream_t *cs = kern_stream(dev, KERN_STREAM_COMPUTE);
    int n;
    int *ids = exec_block_ids(gr->lists, b, &n);
    if (exec_layer_per_expert(gr->env, b - 1)) /* no token, no gradient */
        n = exec_expert_ids(gr->env, b - 1, moe_predict_counts(gr->predict, b - 1, true), ids, n);
    int *host = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *host), nh = 0;
    void **ptr = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptr);
    MT_CHECK(host && ptr, "out of memory for gradient targets");
    int *spans = host + n;
    mt_status_t st = MT_OK;
    const int gen = ++gr->lists->mark_gen;
    for (int j = 0; j < n && st == MT_OK; j++) {
        const eng_param_t *p = &m->params[ids[j]];
        eng_dparam_t *d = &gr->env->dp[ids[j]];
        /* a deferred update still reading its host gradient and flags */
        exec_host_optim_wait_block(gr->hopt, p->block);
        if (p->frozen || d->g || gr->lists->mark[ids[j]] == gen) continue; /* frozen, or already the target in this
                                                                       * micro-batch (tied weights) */
        const sched_block_plan_t *bp = exec_block_plan(gr->env, p->block);
        if (bp->grads == SCHED_GRADS_HOST) {
            gr->lists->mark[ids[j]] = gen;
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
        d->g = kern_alloc(dev, exec_f32_bytes(p), tag, err);
        if (!d->g) {
            st = err->code;
            break;
        }
        kern_memset(dev, cs, d->g, 0, exec_f32_bytes(p));
        d->g_transient = true;
    }
    char tag[64];
    snprintf(tag, sizeof tag, "gradients of block %d (this micro-batch)", b);
    if (st == MT_OK) st = exec_span_alloc(gr->spans, host, nh, false, tag, spans, ptr, err);
    if (st == MT_OK) {
        int last = -1;
        for (int j = 0; j < nh; j++) {
            eng_dparam_t *d = &gr->env->dp[host[j]];
            d->g = ptr[j];
            d->g_transient = true;
            gr->g_span[host[j]] = spans[j];
            if (spans[j] != last) { /* one memset per span, padding included */
                const exec_span_t *sp = &gr->spans->v[spans[j]];
                kern_memset(dev, cs, sp->base, 0, kern_alloc_size(dev, sp->base));
                last = spans[j];
            }
        }
    }
    free(ids);
    free(host);
    free(ptr);
    return st;
}

mt_status_t exec_finish_grads(exec_grads_t *gr, int b, mt_error_t *err) {
    const eng_model_t *m = gr->env->model;
    kern_device_t *dev = gr->env->dev;
    kern_stream_t *cs = kern_stream(dev, KERN_STREAM_COMPUTE), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    moe_staging_xfer_t *items = NULL;
    int *which = NULL, n = 0, experts = 0;
    exec_host_optim_wait_block(gr->hopt, b);
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &gr->env->dp[i];
        if (p->block != b || !d->g) continue;
        d->has_grad = true;
        if (exec_block_plan(gr->env, b)->grads == SCHED_GRADS_DEVICE) {
            if (d->g_transient) {
                dev->ops->add(cs, d->g_acc, d->g_acc, d->g, p->spec->numel);
                kern_free(dev, d->g); /* the compute stream is the only user */
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
        items[n] = (moe_staging_xfer_t){d->host_g, d->g, exec_f32_bytes(p), exec_grad_to_host_op(d)};
        gr->cnt->ctr.grad_d2h_bytes += exec_f32_bytes(p);
        which[n++] = i;
        experts += p->spec->role == ENG_P_EXP_GATE;
    }
    mt_status_t st = MT_OK;
    if (n > 0) {
        kern_event_t *ready = kern_event_create(dev);
        kern_event_record(dev, ready, cs);
        kern_stream_wait_event(dev, d2h, ready);
        kern_event_destroy(dev, ready);
        char tag[64];
        snprintf(tag, sizeof tag, "gradients of block %d", b);
        const uint64_t before = exec_stage_copies(gr->stage, MOE_STAGING_D2H);
        st = exec_stage_batch_d2h(gr->stage, items, n, tag, err);
        if (experts > 0 && exec_layer_per_expert(gr->env, b - 1)) {
            const int copies = (int)(exec_stage_copies(gr->stage, MOE_STAGING_D2H) - before);
            exec_counters_moe_batch(gr->cnt, b - 1, 1, copies, experts);
        }
        for (int j = 0; j < n; j++) {
            eng_dparam_t *d = &gr->env->dp[which[j]];
            /* freed once the D2H passed */
            if (gr->g_span[which[j]] >= 0) exec_span_put(gr->spans, gr->g_span[which[j]], d2h);
            gr->g_span[which[j]] = -1;
            d->acc_has_data = true;
            d->g = NULL;
            d->g_transient = false;
        }
        if (exec_layer_per_expert(gr->env, b - 1)) {
            int none = 0;
            const int32_t *routed = moe_predict_counts(gr->predict, b - 1, true);
            for (int e = 0; e < m->cfg.num_experts; e++) /* another device's experts are not this one's to skip */
                none += routed[e] == 0 && !exec_ep_foreign(gr->env, &m->params[m->layers[b - 1].exp_gate[e]]);
            exec_stage_count_skipped(gr->stage, MOE_STAGING_D2H, none);
        }
    }
    free(items);
    free(which);
    return st;
}

void exec_drop_grads(exec_grads_t *gr) {
    const eng_model_t *m = gr->env->model;
    kern_device_t *dev = gr->env->dev;
    for (int i = 0; i < m->num_params; i++) {
        eng_dparam_t *d = &gr->env->dp[i];
        if (d->g && d->g_transient) {
            if (gr->g_span[i] >= 0) exec_span_put(gr->spans, gr->g_span[i], kern_stream(dev, KERN_STREAM_D2H));
            else kern_free(dev, d->g);
        }
        gr->g_span[i] = -1;
        d->g = NULL;
        d->g_transient = false;
    }
}
