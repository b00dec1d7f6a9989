/* Weights on the device (see residency.h). */
#include "engine/exec/place/residency.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/grow.h"
#include "engine/exec/place/copies.h"
#include "engine/exec/place/plan_query.h"

void exec_residency_init(exec_residency_t *r, const eng_layer_env_t *env, exec_lists_t *lists,
                         exec_spans_t *spans, exec_stage_t *stage, exec_counters_t *cnt, exec_host_optim_t *hopt,
                         moe_predict_t *predict) {
    const int nb = lists->nb, P = env->model->num_params;
    *r = (exec_residency_t){.env = env, .lists = lists, .spans = spans, .stage = stage, .cnt = cnt, .hopt = hopt,
                            .predict = predict};
    r->w_ready = calloc((size_t)nb, sizeof *r->w_ready);
    r->holding = calloc((size_t)nb, sizeof *r->holding);
    r->dequant = calloc((size_t)nb, sizeof *r->dequant);
    r->param_refs = calloc((size_t)P, sizeof *r->param_refs);
    r->w_span = malloc((size_t)(P > 0 ? P : 1) * sizeof *r->w_span);
    MT_CHECK(r->w_ready && r->holding && r->dequant && r->param_refs && r->w_span, "out of memory for weight residency");
    for (int i = 0; i < P; i++) r->w_span[i] = -1;
    for (int b = 0; b < nb; b++) r->w_ready[b] = kern_event_create(env->dev);
}

void exec_residency_free(exec_residency_t *r) {
    for (int b = 0; b < r->lists->nb; b++) {
        kern_event_destroy(r->env->dev, r->w_ready[b]);
        free(r->holding[b].idx);
        free(r->dequant[b].idx);
    }
    free(r->dequant);
    free(r->w_ready);
    free(r->holding);
    free(r->param_refs);
    free(r->w_span);
    free(r->home_reads);
    memset(r, 0, sizeof *r);
}

/* A home read on a pack thread (moe_staging_read_t): no status to return,
 * so a failure is the tier's to keep and the step's to report. */
static void read_home(moe_staging_read_t *req, void *dst, size_t room) {
    exec_home_read_t *h = (exec_home_read_t *)req;
    (void)room; /* the home's buffer bytes (made so) */
    mt_error_t err = {0};
    const mt_status_t st = eng_optim_nvme_read_homes(h->nv, h->m, &h->param, 1, dst, &err);
    eng_optim_nvme_note(h->nv, st, &err);
}

/* Parameter i's read request, every parameter's made on the first: made
 * once and never written again, since a pack thread may still be reading
 * an earlier fetch's. */
static exec_home_read_t *home_read(exec_residency_t *r, int i) {
    const eng_model_t *m = r->env->model;
    if (!r->home_reads) {
        r->home_reads = malloc((size_t)m->num_params * sizeof *r->home_reads);
        MT_CHECK_ALLOC(r->home_reads, "NVMe home reads");
        for (int q = 0; q < m->num_params; q++)
            r->home_reads[q] = (exec_home_read_t){
                .base = {read_home, eng_optim_nvme_home_buffer_bytes(m, q)}, .nv = r->hopt->nvme, .m = m, .param = q};
    }
    return &r->home_reads[i];
}

/* The fetch's weights whose home is on the NVMe tier (engine/optim/
 * nvme_state.h; a trained parameter's bf16 working copy, a frozen base's
 * home) are read into staging where the pack would copy them.  Plain
 * copies: a home is stored as the fetch copies it, a working copy as
 * computed with, a quantised base's bytes as they land beside it (the
 * item's size says so, checked). */
static void read_nvme_homes(exec_residency_t *r, const int *need, int k, moe_staging_xfer_t *items) {
    const eng_model_t *m = r->env->model;
    eng_optim_nvme_t *nv = r->hopt->nvme;
    for (int j = 0; j < k; j++) {
        const int i = need[j];
        if (!eng_optim_nvme_holds_home(nv, i)) continue;
        MT_CHECK(items[j].bytes == eng_optim_nvme_home_bytes(m, i),
                 "the fetch of %s copies %zu bytes, its home on the NVMe tier holds %zu", m->params[i].spec->name,
                 items[j].bytes, eng_optim_nvme_home_bytes(m, i));
        items[j].host = &home_read(r, i)->base;
        items[j].op = MOE_STAGING_READ;
    }
}

/* Block b takes a reference to each streamed tensor of ids; those not on the
 * device yet are fetched in one batch on the H2D stream (*issued: how many). */
static mt_status_t hold_params(exec_residency_t *r, int b, const int *ids, int n, int *issued, mt_error_t *err) {
    const eng_model_t *m = r->env->model;
    int *need = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *need);
    void **ptr = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptr);
    MT_CHECK(need && ptr, "out of memory for a weight fetch");
    int *spans = need + n, k = 0, experts = 0;
    const int gen = ++r->lists->mark_gen;
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(r->env, &m->params[i]) || r->param_refs[i] > 0 || r->lists->mark[i] == gen) continue;
        /* its home may still be taking the last step's update (exec_host_optim_defer) */
        exec_host_optim_wait_block(r->hopt, m->params[i].block);
        r->lists->mark[i] = gen;
        need[k++] = i;
        experts += m->params[i].spec->role == ENG_P_EXP_GATE;
    }
    char tag[64];
    if (b == 0) snprintf(tag, sizeof tag, "streamed weights of the embedding");
    else if (b == r->lists->nb - 1) snprintf(tag, sizeof tag, "streamed weights of the head");
    else snprintf(tag, sizeof tag, "streamed weights of layer %d", b - 1);
    mt_status_t st = exec_span_alloc(r->spans, need, k, true, tag, spans, ptr, err);
    if (st != MT_OK) {
        free(need);
        free(ptr);
        return st;
    }
    *issued = k;
    exec_held_t *h = &r->holding[b];
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(r->env, &m->params[i])) continue;
        r->param_refs[i]++;
        MT_GROW(h->idx, h->cap, h->n + 1, "held weights");
        h->idx[h->n++] = i;
    }
    if (k > 0) {
        moe_staging_xfer_t *items = malloc((size_t)k * sizeof *items);
        MT_CHECK_ALLOC(items, "weight fetch batch");
        for (int j = 0; j < k; j++) {
            const eng_param_t *p = &m->params[need[j]];
            eng_dparam_t *d = &r->env->dp[need[j]];
            d->w = ptr[j];
            r->w_span[need[j]] = spans[j];
            items[j] = exec_w_upload_item(p, d->w, exec_w_landing(p, d->w));
            exec_counters_weight_h2d(r->cnt, exec_w_link_bytes(p));
        }
        read_nvme_homes(r, need, k, items);
        const uint64_t before = exec_stage_copies(r->stage, MOE_STAGING_H2D);
        st = exec_stage_batch_h2d(r->stage, items, k, tag, err);
        exec_held_t *dq = &r->dequant[b];
        for (int j = 0; j < k && st == MT_OK; j++)
            if (m->params[need[j]].home_q) {
                MT_GROW(dq->idx, dq->cap, dq->n + 1, "weights to dequantise");
                dq->idx[dq->n++] = need[j];
            }
        if (experts > 0 && exec_layer_per_expert(r->env, b - 1)) {
            /* a fetch for the next step, issued by the optimizer step, counts in that step's first micro-batch */
            const int copies = (int)(exec_stage_copies(r->stage, MOE_STAGING_H2D) - before);
            exec_counters_moe_batch(r->cnt, b - 1, 0, copies, experts);
        }
        free(items);
    }
    free(need);
    free(ptr);
    return st;
}

mt_status_t exec_fetch_block(exec_residency_t *r, int b, bool backward, mt_error_t *err) {
    const eng_model_t *m = r->env->model;
    if (b < 0 || b >= r->lists->nb || r->holding[b].fetched) return MT_OK;
    r->holding[b].fetched = true;
    int n;
    int *ids = exec_block_ids(r->lists, b, &n);
    const int l = b - 1;
    const bool streamed = exec_block_plan(r->env, b)->weights == SCHED_WEIGHTS_STREAM;
    const int32_t *want = exec_layer_per_expert(r->env, l) ? moe_predict_counts(r->predict, l, backward) : NULL;
    if (want) {
        /* The experts the router chose (backward) or is predicted to choose
         * (forward, moe/expert_predict.h); in forward the router's choice
         * then fetches whatever is missing (exec_fetch_experts), and a
         * prefetched expert that gets no token is dropped unused.  Dense
         * weights and experts come in one batch. */
        n = exec_expert_ids(r->env, l, want, ids, n);
        if (backward && streamed) {
            int none = 0;
            for (int e = 0; e < m->cfg.num_experts; e++)
                none += want[e] == 0 && !exec_ep_foreign(r->env, &m->params[m->layers[l].exp_gate[e]]);
            exec_stage_count_skipped(r->stage, MOE_STAGING_H2D, none);
        }
    }
    int issued;
    mt_status_t st = hold_params(r, b, ids, n, &issued, err);
    free(ids);
    kern_event_record(r->env->dev, r->w_ready[b], kern_stream(r->env->dev, KERN_STREAM_H2D));
    return st;
}

/* The quantised weights that arrived are dequantised into their working
 * copies here, on the compute stream once it has waited for the copies:
 * kernels are ordered after copies only there (the CPU backend runs a
 * kernel on the issuing thread, whatever stream it names). */
void exec_wait_block(exec_residency_t *r, int b) {
    kern_stream_t *cs = kern_stream(r->env->dev, KERN_STREAM_COMPUTE);
    kern_stream_wait_event(r->env->dev, cs, r->w_ready[b]);
    exec_held_t *dq = &r->dequant[b];
    for (int k = 0; k < dq->n; k++) {
        const int i = dq->idx[k];
        void *w = r->env->dp[i].w;
        if (w) exec_w_dequant(r->env->dev, cs, &r->env->model->params[i], w, exec_w_landing(&r->env->model->params[i], w));
    }
    dq->n = 0;
}

/* Forward: the router has run; fetch the experts that got tokens now. */
mt_status_t exec_fetch_experts(exec_residency_t *r, int l, const int32_t *counts, mt_error_t *err) {
    const eng_model_t *m = r->env->model;
    const int b = l + 1;
    if (exec_block_plan(r->env, b)->weights != SCHED_WEIGHTS_STREAM) return MT_OK;
    int skipped = 0, unused = 0;
    for (int e = 0; e < m->cfg.num_experts; e++)
        if (counts[e] == 0 && !exec_ep_foreign(r->env, &m->params[m->layers[l].exp_gate[e]])) {
            if (r->env->dp[m->layers[l].exp_gate[e]].w) unused++;
            else skipped++;
        }
    exec_stage_count_skipped(r->stage, MOE_STAGING_H2D, skipped);
    r->cnt->ctr.experts_unused += (uint64_t)unused;
    int *ids = exec_id_buffer(r->lists, b);
    const int n = exec_expert_ids(r->env, l, counts, ids, 0);
    int issued = 0;
    mt_status_t st = hold_params(r, b, ids, n, &issued, err);
    free(ids);
    if (st != MT_OK || issued == 0) return st;
    /* only a miss of the prediction waits, and then also for whatever the
     * H2D stream took on before it (the next blocks' prefetch): the stream
     * is in order.  A hit must not wait at all: w_ready[b] already covers
     * the prefetched experts, and recording it again here would make this
     * block's forward wait for the next block's weights. */
    kern_event_record(r->env->dev, r->w_ready[b], kern_stream(r->env->dev, KERN_STREAM_H2D));
    exec_wait_block(r, b);
    return MT_OK;
}

void exec_release_block(exec_residency_t *r, int b) {
    exec_held_t *h = &r->holding[b];
    for (int k = 0; k < h->n; k++) {
        const int i = h->idx[k];
        if (--r->param_refs[i] == 0) {
            /* its users are issued; kern_free is stream-ordered where
             * streams run asynchronously (CUDA: the memory is reused only
             * after every stream's work issued so far, including an H2D
             * copy still filling an expert that got no token) */
            if (r->w_span[i] >= 0) exec_span_put(r->spans, r->w_span[i], NULL);
            r->w_span[i] = -1;
            r->env->dp[i].w = NULL;
        }
    }
    h->n = 0;
    h->fetched = false;
}
