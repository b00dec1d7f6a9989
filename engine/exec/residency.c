/* Weight residency (see exec_internal.h): which parameters' working copies
 * are on the device.  Resident weights are placed once (exec.c); a
 * streamed block's weights are fetched before it computes (its dense
 * tensors, and for a MoE layer the experts the router chose or is
 * predicted to choose, moe/expert_predict.h), held by reference while any
 * block uses them, and released into their span afterwards. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/internal.h"
#include "engine/exec/expert_parallel.h"
#include "base/grow.h"

/* A MoE layer whose experts are tensors of their own, fetched and given
 * gradients per expert.  Experts fused over E (gpt-oss) are one tensor per
 * layer: the block moves them whole, as it moves its dense weights. */
bool exec_layer_per_expert(const eng_exec_t *x, int l) {
    const eng_model_t *m = x->model;
    return l >= 0 && l < m->cfg.num_hidden_layers && m->cfg.layer_is_moe[l] && !m->cfg.experts_fused;
}

/* Block b takes a reference to the streamed parameters among ids; those not
 * on the device yet are fetched in one batch (one span). */
/* Block b takes a reference to each streamed tensor of ids; those not on the
 * device yet are fetched in one batch on the H2D stream (*issued: how many). */
static mt_status_t hold_params(eng_exec_t *x, int b, const int *ids, int n, int *issued, mt_error_t *err) {
    eng_model_t *m = x->model;
    int *need = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *need);
    void **ptr = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptr);
    MT_CHECK(need && ptr, "out of memory for a weight fetch");
    int *spans = need + n, k = 0, experts = 0;
    const int gen = ++x->grads.mark_gen;
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(x, &m->params[i]) || x->res.param_refs[i] > 0 || x->grads.mark[i] == gen) continue;
        /* its home may still be taking the last step's update (exec_host_optim_defer) */
        exec_host_optim_wait_block(&x->hopt, m->params[i].block);
        x->grads.mark[i] = gen;
        need[k++] = i;
        experts += m->params[i].spec->role == ENG_P_EXP_GATE;
    }
    char tag[64];
    if (b == 0) snprintf(tag, sizeof tag, "streamed weights of the embedding");
    else if (b == x->nb - 1) snprintf(tag, sizeof tag, "streamed weights of the head");
    else snprintf(tag, sizeof tag, "streamed weights of layer %d", b - 1);
    mt_status_t st = exec_span_alloc(x, need, k, true, tag, spans, ptr, err);
    if (st != MT_OK) {
        free(need);
        free(ptr);
        return st;
    }
    *issued = k;
    exec_held_t *h = &x->res.holding[b];
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(x, &m->params[i])) continue;
        x->res.param_refs[i]++;
        MT_GROW(h->idx, h->cap, h->n + 1, "held weights");
        h->idx[h->n++] = i;
    }
    if (k > 0) {
        moe_staging_xfer_t *items = malloc((size_t)k * sizeof *items);
        MT_CHECK_ALLOC(items, "weight fetch batch");
        for (int j = 0; j < k; j++) {
            eng_param_t *p = &m->params[need[j]];
            eng_dparam_t *d = &x->dp[need[j]];
            d->w = ptr[j];
            x->res.w_span[need[j]] = spans[j];
            items[j] = (moe_staging_xfer_t){exec_w_home(p), d->w, exec_w_bytes(p), exec_w_upload_op(p)};
            exec_counters_weight_h2d(&x->cnt, exec_w_bytes(p));
        }
        const uint64_t before = exec_stage_copies(x, MOE_STAGING_H2D);
        st = exec_stage_h2d(x, items, k, tag, err);
        if (experts > 0 && exec_layer_per_expert(x, b - 1)) {
            /* a fetch for the next step, issued by the optimizer step, counts in that step's first micro-batch */
            exec_counters_moe_batch(&x->cnt, b - 1, 0, (int)(exec_stage_copies(x, MOE_STAGING_H2D) - before), experts);
        }
        free(items);
    }
    free(need);
    free(ptr);
    return st;
}

/* ids of the tensors of layer l's experts with tokens (counts NULL: none),
 * with their LoRA factors, appended to ids[n..]: an expert's adapter moves
 * and trains with it, and like it only when the expert got tokens. */
int exec_expert_ids(const eng_exec_t *x, int l, const int32_t *counts, int *ids, int n) {
    const eng_model_t *m = x->model;
    const eng_layer_index_t *Lx = &m->layers[l];
    for (int e = 0; counts && e < m->cfg.num_experts; e++)
        if (counts[e] > 0 && !exec_ep_foreign(x, &m->params[Lx->exp_gate[e]])) {
            const int mods[3] = {Lx->exp_gate[e], Lx->exp_up[e], Lx->exp_down[e]};
            for (int k = 0; k < 3; k++) {
                ids[n++] = mods[k];
                if (m->params[mods[k]].lora_a >= 0) {
                    ids[n++] = m->params[mods[k]].lora_a;
                    ids[n++] = m->params[mods[k]].lora_b;
                }
            }
        }
    return n;
}

int *exec_id_buffer(const eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    const int n = x->nused[b] + 9 * m->cfg.num_experts + 1;
    int *ids = malloc((size_t)n * sizeof *ids);
    MT_CHECK_ALLOC(ids, "parameter list");
    return ids;
}

mt_status_t exec_fetch_block(eng_exec_t *x, int b, bool backward, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (b < 0 || b >= x->nb || x->res.holding[b].fetched) return MT_OK;
    x->res.holding[b].fetched = true;
    int *ids = exec_id_buffer(x, b);
    int n = x->nused[b];
    memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
    const int l = b - 1;
    const bool streamed = exec_block_plan(x, b)->weights == SCHED_WEIGHTS_STREAM;
    const int32_t *want = exec_layer_per_expert(x, l) ? moe_predict_counts(&x->predict, l, backward) : NULL;
    if (want) {
        /* The experts the router chose (backward) or is predicted to choose
         * (forward, moe/expert_predict.h); in forward the router's choice
         * then fetches whatever is missing (exec_fetch_experts), and a
         * prefetched expert that gets no token is dropped unused.  Dense
         * weights and experts come in one batch. */
        n = exec_expert_ids(x, l, want, ids, n);
        if (backward && streamed) {
            int none = 0;
            for (int e = 0; e < m->cfg.num_experts; e++)
                none += want[e] == 0 && !exec_ep_foreign(x, &m->params[m->layers[l].exp_gate[e]]);
            exec_stage_count_skipped(x, MOE_STAGING_H2D, none);
        }
    }
    int issued;
    mt_status_t st = hold_params(x, b, ids, n, &issued, err);
    free(ids);
    kern_event_record(x->dev, x->res.w_ready[b], kern_stream(x->dev, KERN_STREAM_H2D));
    return st;
}

void exec_wait_block(eng_exec_t *x, int b) {
    kern_stream_wait_event(x->dev, kern_stream(x->dev, KERN_STREAM_COMPUTE), x->res.w_ready[b]);
}

/* Forward: the router has run; fetch the experts that got tokens now. */
mt_status_t exec_fetch_experts(eng_exec_t *x, int l, const int32_t *counts, mt_error_t *err) {
    eng_model_t *m = x->model;
    const int b = l + 1;
    if (exec_block_plan(x, b)->weights != SCHED_WEIGHTS_STREAM) return MT_OK;
    int skipped = 0, unused = 0;
    for (int e = 0; e < m->cfg.num_experts; e++)
        if (counts[e] == 0 && !exec_ep_foreign(x, &m->params[m->layers[l].exp_gate[e]])) {
            if (x->dp[m->layers[l].exp_gate[e]].w) unused++;
            else skipped++;
        }
    exec_stage_count_skipped(x, MOE_STAGING_H2D, skipped);
    x->cnt.ctr.experts_unused += (uint64_t)unused;
    int *ids = exec_id_buffer(x, b);
    const int n = exec_expert_ids(x, l, counts, ids, 0);
    int issued = 0;
    mt_status_t st = hold_params(x, b, ids, n, &issued, err);
    free(ids);
    if (st != MT_OK || issued == 0) return st;
    /* only a miss of the prediction waits, and then also for whatever the
     * H2D stream took on before it (the next blocks' prefetch): the stream
     * is in order.  A hit must not wait at all: w_ready[b] already covers
     * the prefetched experts, and recording it again here would make this
     * block's forward wait for the next block's weights. */
    kern_event_record(x->dev, x->res.w_ready[b], kern_stream(x->dev, KERN_STREAM_H2D));
    exec_wait_block(x, b);
    return MT_OK;
}

void exec_release_block(eng_exec_t *x, int b) {
    exec_held_t *h = &x->res.holding[b];
    for (int k = 0; k < h->n; k++) {
        const int i = h->idx[k];
        if (--x->res.param_refs[i] == 0) {
            /* its users are issued; kern_free is stream-ordered where
             * streams run asynchronously (CUDA: the memory is reused only
             * after every stream's work issued so far, including an H2D
             * copy still filling an expert that got no token) */
            if (x->res.w_span[i] >= 0) exec_span_put(x, x->res.w_span[i], NULL);
            x->res.w_span[i] = -1;
            x->dp[i].w = NULL;
        }
    }
    h->n = 0;
    h->fetched = false;
}
