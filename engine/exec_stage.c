/* The executor's transfers through the staging pool (see exec.h, and
 * moe/staging.h for the pool itself).
 *
 * Sizing.  The pool holds the plan's in-flight window: the prefetch_window
 * + 1 consecutive blocks of streamed weights with the most bytes (every
 * expert, as with many tokens per micro-batch every expert is hit), one
 * block of host-bound gradients, and the saved activations of every block
 * that offloads them (held from forward to backward, one region per block).
 * moe_staging_plan_bytes turns that list into each mode's capacity; the
 * largest tensor of the model (or activation region) bounds slots and
 * slabs.  Activation sizes depend on the micro-batch, so a model loaded
 * without a token count re-sizes its pool at its first micro-batch.
 *
 * Spans.  The tensors a block fetches together (its dense weights and the
 * experts the router chose) get one device allocation laid out by
 * moe_staging_layout, so the pool moves them in one copy; so do the
 * gradients a block sends to the host.  A span is freed when the last
 * tensor in it is released (tensors can outlive their block: a tied
 * embedding is held by the embedding and the head).  If the arena has no
 * contiguous room, each tensor gets its own allocation (more copies, same
 * results).
 *
 * Gradients go D2H a block at a time in one batch: the first micro-batch
 * of a step copies (MOE_STAGING_COPY), later ones add (ADD_F32, the same
 * float adds in the same order as a plain host loop), then the spans are
 * freed once the D2H stream has passed the batch. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec.h"
#include "engine/exec_internal.h"
#include "engine/multi_expert.h"
#include "moe/staging_report.h"


/* A MoE layer whose experts are tensors of their own, fetched and given
 * gradients per expert.  Experts fused over E (gpt-oss) are one tensor per
 * layer: the block moves them whole, as it moves its dense weights. */
static bool layer_is_moe(const eng_exec_t *x, int l) {
    const eng_model_t *m = x->model;
    return l >= 0 && l < m->cfg.num_hidden_layers && m->cfg.layer_is_moe[l] && !m->cfg.experts_fused;
}

/* ---- spans ------------------------------------------------------------------ */

static int span_new(eng_exec_t *x, void *base, int live) {
    int s = x->free_span;
    if (s >= 0) {
        x->free_span = x->spans[s].next_free;
    } else {
        if (x->nspans == x->cap_spans) {
            x->cap_spans = x->cap_spans ? 2 * x->cap_spans : 64;
            x->spans = realloc(x->spans, (size_t)x->cap_spans * sizeof *x->spans);
            MT_CHECK_ALLOC(x->spans, "device spans");
        }
        s = x->nspans++;
    }
    x->spans[s] = (exec_span_t){base, live, -1};
    return s;
}

/* One tensor of span s is done; the last frees it (after `after` passes the
 * current point, or now when after is NULL). */
static void span_put(eng_exec_t *x, int s, kern_stream_t *after) {
    exec_span_t *sp = &x->spans[s];
    MT_CHECK(sp->base && sp->live > 0, "executor: span %d released twice", s);
    if (--sp->live > 0) return;
    if (after) exec_defer_free(x, sp->base, NULL, 0, after);
    else kern_free(x->dev, sp->base);
    sp->base = NULL;
    sp->next_free = x->free_span;
    x->free_span = s;
}

/* Device memory for the tensors ids[0..k): one span laid out for one copy,
 * else one allocation each.  spans[j] receives tensor j's span, ptrs[j] its
 * address.  Nothing stays allocated on failure. */
static mt_status_t alloc_spans(eng_exec_t *x, const int *ids, int k, bool weights, const char *tag, int *spans,
                               void **ptrs, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (k <= 0) return MT_OK;
    size_t *sz = calloc((size_t)k * 2, sizeof *sz);
    MT_CHECK_ALLOC(sz, "span layout");
    size_t *off = sz + k;
    for (int j = 0; j < k; j++) {
        const eng_param_t *p = &m->params[ids[j]];
        sz[j] = weights ? exec_w_bytes(p) : exec_f32_bytes(p);
    }
    const size_t total = moe_staging_layout(sz, k, MT_ARENA_ALIGN, off);
    mt_error_t quiet = {0};
    char *base = k > 1 ? kern_alloc(x->dev, total, tag, &quiet) : NULL;
    if (base) {
        const int s = span_new(x, base, k);
        for (int j = 0; j < k; j++) {
            spans[j] = s;
            ptrs[j] = base + off[j];
        }
        free(sz);
        return MT_OK;
    }
    for (int j = 0; j < k; j++) { /* no contiguous room: one allocation per tensor */
        char t[240];
        snprintf(t, sizeof t, "%s: %s", tag, m->params[ids[j]].spec->name);
        ptrs[j] = kern_alloc(x->dev, sz[j], t, err);
        if (!ptrs[j]) {
            for (int q = 0; q < j; q++) span_put(x, spans[q], NULL);
            free(sz);
            return err->code;
        }
        spans[j] = span_new(x, ptrs[j], 1);
    }
    free(sz);
    return MT_OK;
}

void exec_span_put(eng_exec_t *x, int s, kern_stream_t *after) { span_put(x, s, after); }

/* ---- sizing and the pool ------------------------------------------------------ */

typedef struct {
    size_t *t;
    int n, cap;
} tlist_t;

static void tl_add(tlist_t *l, size_t bytes) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 256;
        l->t = realloc(l->t, (size_t)l->cap * sizeof *l->t);
        MT_CHECK_ALLOC(l->t, "staging window");
    }
    l->t[l->n++] = bytes;
}

static int expert_ids(const eng_exec_t *x, int l, const int32_t *counts, int *ids, int n);
static int *id_buffer(const eng_exec_t *x, int b);

/* Streamed weight bytes of blocks [b0, b0 + w), every expert (and its
 * LoRA factors) included; the tensors go to out when given. */
static size_t window_weights(eng_exec_t *x, int b0, int w, tlist_t *out) {
    eng_model_t *m = x->model;
    const int gen = ++x->mark_gen;
    size_t sum = 0;
    int32_t *all = NULL;
    for (int b = b0; b < b0 + w && b < x->nb; b++) {
        const int l = b - 1;
        int *ids = id_buffer(x, b);
        int n = x->nused[b];
        memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
        if (layer_is_moe(x, l)) {
            if (!all) {
                all = malloc((size_t)m->cfg.num_experts * sizeof *all);
                MT_CHECK_ALLOC(all, "staging window");
                for (int e = 0; e < m->cfg.num_experts; e++) all[e] = 1;
            }
            n = expert_ids(x, l, all, ids, n);
        }
        for (int k = 0; k < n; k++) {
            const int i = ids[k];
            if (x->mark[i] == gen || !exec_param_streamed(x, &m->params[i])) continue;
            x->mark[i] = gen;
            sum += exec_w_bytes(&m->params[i]);
            if (out) tl_add(out, exec_w_bytes(&m->params[i]));
        }
        free(ids);
    }
    free(all);
    return sum;
}

/* The in-flight window for micro-batches of `tokens` tokens. */
static void stage_window(eng_exec_t *x, int tokens, tlist_t *t, eng_exec_staging_info_t *info) {
    eng_model_t *m = x->model;
    const int W1 = x->plan.prefetch_window + 1;
    int best0 = -1;
    size_t best = 0;
    for (int b0 = 0; b0 < x->nb; b0++) {
        const size_t s = window_weights(x, b0, W1, NULL);
        if (s > best) best = s, best0 = b0;
    }
    if (best0 >= 0) window_weights(x, best0, W1, t);
    info->window_weights = best;
    /* one block of gradients on their way to the host (frozen weights have none) */
    int gb = -1;
    size_t gbest = 0;
    for (int b = 0; b < x->nb; b++) {
        if (exec_block_plan(x, b)->grads != SCHED_GRADS_HOST) continue;
        size_t s = 0;
        for (int i = 0; i < m->num_params; i++)
            if (m->params[i].block == b && !m->params[i].frozen) s += exec_f32_bytes(&m->params[i]);
        if (s > gbest) gbest = s, gb = b;
    }
    for (int i = 0; gb >= 0 && i < m->num_params; i++)
        if (m->params[i].block == gb && !m->params[i].frozen) tl_add(t, exec_f32_bytes(&m->params[i]));
    info->window_grads = gbest;
    /* every offloaded block's activations, held from its forward to its backward */
    info->window_acts = 0;
    for (int l = 0; tokens > 0 && l < m->cfg.num_hidden_layers; l++)
        if (exec_acts_offloaded(x, l + 1)) {
            const size_t a = exec_layer_act_bytes(m, l, tokens);
            tl_add(t, a);
            info->window_acts += a;
            if (a > info->largest_tensor) {
                info->largest_tensor = a;
                snprintf(info->largest_name, sizeof info->largest_name, "the saved activations of layer %d", l);
            }
        }
}

mt_status_t exec_stage_create(eng_exec_t *x, int tokens, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_staging_settings_t *set = &x->stage_set;
    eng_exec_staging_info_t *info = &x->stage_info;
    memset(info, 0, sizeof *info);
    info->mode = set->mode;
    info->tokens = tokens;
    info->window_blocks = x->plan.prefetch_window + 1;
    /* anything may cross once (placement), so the largest parameter bounds slots and slabs */
    for (int i = 0; i < m->num_params; i++)
        if (exec_f32_bytes(&m->params[i]) > info->largest_tensor) {
            info->largest_tensor = exec_f32_bytes(&m->params[i]);
            snprintf(info->largest_name, sizeof info->largest_name, "%s", m->params[i].spec->name);
        }
    tlist_t t = {0};
    stage_window(x, tokens, &t, info);
    info->window_tensors = t.n;
    for (int k = 0; k < t.n; k++) info->window_payload += t.t[k];
    const moe_staging_plan_opts_t po = {.largest_tensor = info->largest_tensor};
    info->window_need = moe_staging_plan_bytes(set->mode, t.t, t.n, &po);
    free(t.t);

    moe_staging_opts_t o;
    moe_staging_opts_init(&o, set->mode);
    o.capacity_bytes = info->window_need;
    o.cap_bytes = set->cap_bytes;
    o.max_tensor_bytes = info->largest_tensor;
    o.max_tensor_name = info->largest_name;
    o.num_slabs = set->num_slabs;
    o.slab_bytes = set->slab_bytes;
    if (set->timeline_samples) o.max_samples = set->timeline_samples;
    snprintf(x->stage_label, sizeof x->stage_label, "%s", moe_staging_mode_name(set->mode));
    o.label = x->stage_label;
    mt_status_t st = moe_staging_create(x->dev, &o, &x->stage, err);
    if (st != MT_OK) return mt_error_prefix(err, "staging (mode %s): ", moe_staging_mode_name(set->mode));
    moe_staging_stats_t s;
    moe_staging_get_stats(x->stage, MOE_STAGING_SCOPE_TOTAL, &s);
    info->capacity = s.capacity;
    x->stage_tokens = tokens;
    /* offloaded activations stay held from forward to backward: a cap that
     * leaves no room beside them for the largest tensor would stall the run */
    size_t largest_param = 0;
    if (info->window_acts > 0) {
        size_t *must = malloc((size_t)(m->cfg.num_hidden_layers + 1) * sizeof *must);
        MT_CHECK_ALLOC(must, "staging check");
        int n = 0;
        for (int l = 0; l < m->cfg.num_hidden_layers; l++)
            if (exec_acts_offloaded(x, l + 1)) must[n++] = exec_layer_act_bytes(m, l, tokens);
        /* beside them, room for the largest parameter tensor (the largest
         * "tensor" may be one of the activation regions just counted) */
        largest_param = 0;
        for (int i = 0; i < m->num_params; i++)
            if (exec_f32_bytes(&m->params[i]) > largest_param) largest_param = exec_f32_bytes(&m->params[i]);
        must[n++] = largest_param;
        const size_t need = moe_staging_plan_bytes(set->mode, must, n, &po);
        free(must);
        if (s.capacity < need) {
            exec_stage_destroy(x);
            return mt_error_set(err, MT_ERR_CONFIG,
                                "staging (mode %s): the pinned cap leaves %zu bytes, but the plan holds %zu bytes of "
                                "offloaded activations from forward to backward and still needs room for the "
                                "largest parameter (%zu bytes): %zu bytes at least; raise staging.cap / "
                                "memory.pinned or recompute activations instead of offloading them",
                                moe_staging_mode_name(set->mode), s.capacity, info->window_acts, largest_param, need);
        }
    }
    return MT_OK;
}

mt_status_t exec_stage_prepare(eng_exec_t *x, int tokens, mt_error_t *err) {
    if (tokens <= x->stage_tokens) return MT_OK; /* a smaller micro-batch (the data's tail) fits */
    bool offloads = false;
    for (int b = 0; b < x->nb; b++) offloads |= exec_acts_offloaded(x, b);
    if (!offloads) {
        x->stage_tokens = tokens;
        return MT_OK;
    }
    /* between micro-batches nothing is held: re-size for this shape */
    eng_exec_drain(x);
    exec_stage_destroy(x);
    return exec_stage_create(x, tokens, err);
}

void exec_stage_destroy(eng_exec_t *x) {
    if (!x->stage) return;
    moe_staging_destroy(x->stage);
    x->stage = NULL;
}

static const moe_staging_batch_t *batch_of(moe_staging_batch_t *b, const char *tag) {
    *b = (moe_staging_batch_t){tag, MT_ARENA_ALIGN};
    return b;
}

mt_status_t exec_stage_h2d(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err) {
    moe_staging_batch_t b;
    return moe_staging_h2d_batch(x->stage, kern_stream(x->dev, KERN_STREAM_H2D), items, n, batch_of(&b, tag),
                                 err);
}

mt_status_t exec_stage_d2h(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err) {
    moe_staging_batch_t b;
    return moe_staging_d2h_batch(x->stage, kern_stream(x->dev, KERN_STREAM_D2H), items, n, batch_of(&b, tag),
                                 err);
}

static uint64_t copies_so_far(eng_exec_t *x, int dir) {
    moe_staging_stats_t s;
    moe_staging_get_stats(x->stage, MOE_STAGING_SCOPE_TOTAL, &s);
    return s.copies[dir];
}

static void count_skipped(eng_exec_t *x, int dir, int experts) {
    if (experts <= 0) return;
    x->cnt.ctr.experts_skipped[dir] += (uint64_t)experts;
    moe_staging_count_skipped(x->stage, experts);
}

/* ---- weight streaming ------------------------------------------------------------ */

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
    const int gen = ++x->mark_gen;
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(x, &m->params[i]) || x->param_refs[i] > 0 || x->mark[i] == gen) continue;
        /* its home may still be taking the last step's update (exec_host_optim_defer) */
        exec_host_optim_wait_block(&x->hopt, m->params[i].block);
        x->mark[i] = gen;
        need[k++] = i;
        experts += m->params[i].spec->role == ENG_P_EXP_GATE;
    }
    char tag[64];
    if (b == 0) snprintf(tag, sizeof tag, "streamed weights of the embedding");
    else if (b == x->nb - 1) snprintf(tag, sizeof tag, "streamed weights of the head");
    else snprintf(tag, sizeof tag, "streamed weights of layer %d", b - 1);
    mt_status_t st = alloc_spans(x, need, k, true, tag, spans, ptr, err);
    if (st != MT_OK) {
        free(need);
        free(ptr);
        return st;
    }
    *issued = k;
    exec_held_t *h = &x->holding[b];
    for (int j = 0; j < n; j++) {
        const int i = ids[j];
        if (!exec_param_streamed(x, &m->params[i])) continue;
        x->param_refs[i]++;
        if (h->n == h->cap) {
            h->cap = h->cap ? 2 * h->cap : 32;
            h->idx = realloc(h->idx, (size_t)h->cap * sizeof *h->idx);
            MT_CHECK_ALLOC(h->idx, "held weights");
        }
        h->idx[h->n++] = i;
    }
    if (k > 0) {
        moe_staging_xfer_t *items = malloc((size_t)k * sizeof *items);
        MT_CHECK_ALLOC(items, "weight fetch batch");
        for (int j = 0; j < k; j++) {
            eng_param_t *p = &m->params[need[j]];
            eng_dparam_t *d = &x->dp[need[j]];
            d->w = ptr[j];
            x->w_span[need[j]] = spans[j];
            items[j] = (moe_staging_xfer_t){exec_w_home(p), d->w, exec_w_bytes(p), exec_w_upload_op(p)};
            exec_counters_weight_h2d(&x->cnt, exec_w_bytes(p));
        }
        const uint64_t before = copies_so_far(x, MOE_STAGING_H2D);
        st = exec_stage_h2d(x, items, k, tag, err);
        if (experts > 0 && layer_is_moe(x, b - 1)) {
            /* a fetch for the next step, issued by the optimizer step, counts in that step's first micro-batch */
            exec_counters_moe_batch(&x->cnt, b - 1, 0, (int)(copies_so_far(x, MOE_STAGING_H2D) - before), experts);
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
static int expert_ids(const eng_exec_t *x, int l, const int32_t *counts, int *ids, int n) {
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

static int *id_buffer(const eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    const int n = x->nused[b] + 9 * m->cfg.num_experts + 1;
    int *ids = malloc((size_t)n * sizeof *ids);
    MT_CHECK_ALLOC(ids, "parameter list");
    return ids;
}

mt_status_t exec_fetch_block(eng_exec_t *x, int b, bool backward, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (b < 0 || b >= x->nb || x->holding[b].fetched) return MT_OK;
    x->holding[b].fetched = true;
    int *ids = id_buffer(x, b);
    int n = x->nused[b];
    memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
    const int l = b - 1;
    const bool streamed = exec_block_plan(x, b)->weights == SCHED_WEIGHTS_STREAM;
    const int32_t *want = layer_is_moe(x, l) ? moe_predict_counts(&x->predict, l, backward) : NULL;
    if (want) {
        /* The experts the router chose (backward) or is predicted to choose
         * (forward, moe/expert_predict.h); in forward the router's choice
         * then fetches whatever is missing (exec_fetch_experts), and a
         * prefetched expert that gets no token is dropped unused.  Dense
         * weights and experts come in one batch. */
        n = expert_ids(x, l, want, ids, n);
        if (backward && streamed) {
            int none = 0;
            for (int e = 0; e < m->cfg.num_experts; e++) none += want[e] == 0;
            count_skipped(x, MOE_STAGING_H2D, none);
        }
    }
    int issued;
    mt_status_t st = hold_params(x, b, ids, n, &issued, err);
    free(ids);
    kern_event_record(x->dev, x->w_ready[b], kern_stream(x->dev, KERN_STREAM_H2D));
    return st;
}

void exec_wait_block(eng_exec_t *x, int b) {
    kern_stream_wait_event(x->dev, kern_stream(x->dev, KERN_STREAM_COMPUTE), x->w_ready[b]);
}

/* Forward: the router has run; fetch the experts that got tokens now. */
mt_status_t exec_fetch_experts(eng_exec_t *x, int l, const int32_t *counts, mt_error_t *err) {
    eng_model_t *m = x->model;
    const int b = l + 1;
    if (exec_block_plan(x, b)->weights != SCHED_WEIGHTS_STREAM) return MT_OK;
    int skipped = 0, unused = 0;
    for (int e = 0; e < m->cfg.num_experts; e++)
        if (counts[e] == 0) {
            if (x->dp[m->layers[l].exp_gate[e]].w) unused++;
            else skipped++;
        }
    count_skipped(x, MOE_STAGING_H2D, skipped);
    x->cnt.ctr.experts_unused += (uint64_t)unused;
    int *ids = id_buffer(x, b);
    const int n = expert_ids(x, l, counts, ids, 0);
    int issued = 0;
    mt_status_t st = hold_params(x, b, ids, n, &issued, err);
    free(ids);
    if (st != MT_OK || issued == 0) return st;
    /* only a miss of the prediction waits, and then also for whatever the
     * H2D stream took on before it (the next blocks' prefetch): the stream
     * is in order.  A hit must not wait at all: w_ready[b] already covers
     * the prefetched experts, and recording it again here would make this
     * block's forward wait for the next block's weights. */
    kern_event_record(x->dev, x->w_ready[b], kern_stream(x->dev, KERN_STREAM_H2D));
    exec_wait_block(x, b);
    return MT_OK;
}

void exec_release_block(eng_exec_t *x, int b) {
    exec_held_t *h = &x->holding[b];
    for (int k = 0; k < h->n; k++) {
        const int i = h->idx[k];
        if (--x->param_refs[i] == 0) {
            /* its users are issued; kern_free is stream-ordered where
             * streams run asynchronously (CUDA: the memory is reused only
             * after every stream's work issued so far, including an H2D
             * copy still filling an expert that got no token) */
            if (x->w_span[i] >= 0) span_put(x, x->w_span[i], NULL);
            x->w_span[i] = -1;
            x->dp[i].w = NULL;
        }
    }
    h->n = 0;
    h->fetched = false;
}

/* ---- gradients ------------------------------------------------------------------------ */

mt_status_t exec_prepare_grads(eng_exec_t *x, int b, mt_error_t *err) {
    eng_model_t *m = x->model;
    kern_stream_t *cs = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    int *ids = id_buffer(x, b);
    int n = x->nused[b];
    memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
    if (layer_is_moe(x, b - 1)) /* no token, no gradient */
        n = expert_ids(x, b - 1, moe_predict_counts(&x->predict, b - 1, true), ids, n);
    int *host = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *host), nh = 0;
    void **ptr = malloc((size_t)(n > 0 ? n : 1) * sizeof *ptr);
    MT_CHECK(host && ptr, "out of memory for gradient targets");
    int *spans = host + n;
    mt_status_t st = MT_OK;
    const int gen = ++x->mark_gen;
    for (int j = 0; j < n && st == MT_OK; j++) {
        eng_param_t *p = &m->params[ids[j]];
        eng_dparam_t *d = &x->dp[ids[j]];
        /* a deferred update still reading its host gradient and flags */
        exec_host_optim_wait_block(&x->hopt, p->block);
        if (p->frozen || d->g || x->mark[ids[j]] == gen) continue; /* frozen, or already the target in this
                                                                       * micro-batch (tied weights) */
        const sched_block_plan_t *bp = exec_block_plan(x, p->block);
        if (bp->grads == SCHED_GRADS_HOST) {
            x->mark[ids[j]] = gen;
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
    if (st == MT_OK) st = alloc_spans(x, host, nh, false, tag, spans, ptr, err);
    if (st == MT_OK) {
        int last = -1;
        for (int j = 0; j < nh; j++) {
            eng_dparam_t *d = &x->dp[host[j]];
            d->g = ptr[j];
            d->g_transient = true;
            x->g_span[host[j]] = spans[j];
            if (spans[j] != last) { /* one memset per span, padding included */
                const exec_span_t *sp = &x->spans[spans[j]];
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
        const uint64_t before = copies_so_far(x, MOE_STAGING_D2H);
        st = exec_stage_d2h(x, items, n, tag, err);
        if (experts > 0 && layer_is_moe(x, b - 1)) {
            exec_counters_moe_batch(&x->cnt, b - 1, 1, (int)(copies_so_far(x, MOE_STAGING_D2H) - before), experts);
        }
        for (int j = 0; j < n; j++) {
            eng_dparam_t *d = &x->dp[which[j]];
            if (x->g_span[which[j]] >= 0) span_put(x, x->g_span[which[j]], d2h); /* freed once the D2H passed */
            x->g_span[which[j]] = -1;
            d->acc_has_data = true;
            d->g = NULL;
            d->g_transient = false;
        }
        if (layer_is_moe(x, b - 1)) {
            int none = 0;
            const int32_t *routed = moe_predict_counts(&x->predict, b - 1, true);
            for (int e = 0; e < m->cfg.num_experts; e++) none += routed[e] == 0;
            count_skipped(x, MOE_STAGING_D2H, none);
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
            if (x->g_span[i] >= 0) span_put(x, x->g_span[i], kern_stream(x->dev, KERN_STREAM_D2H));
            else kern_free(x->dev, d->g);
        }
        x->g_span[i] = -1;
        d->g = NULL;
        d->g_transient = false;
    }
}

/* ---- counters and reports ------------------------------------------------------------- */

size_t eng_exec_offload_bytes(const eng_exec_t *x, int tokens) {
    const eng_model_t *m = x->model;
    size_t sum = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (exec_acts_offloaded(x, l + 1)) sum += exec_layer_act_bytes(m, l, tokens);
    return sum;
}

moe_staging_t *eng_exec_staging(eng_exec_t *x) { return x->stage; }

void eng_exec_staging_info(const eng_exec_t *x, eng_exec_staging_info_t *out) { *out = x->stage_info; }

void eng_exec_staging_counters(const eng_exec_t *x, eng_exec_staging_counters_t *out) { *out = x->cnt.ctr; }

mt_status_t eng_exec_trace_staging(eng_exec_t *x, eng_trace_t *t, double since_s, mt_error_t *err) {
    if (!t || !x->stage) return MT_OK;
    const moe_staging_timeline_t *tl = moe_staging_timeline(x->stage);
    moe_staging_timeline_t view = *tl; /* the samples of the traced run only */
    size_t first = 0;
    while (first < tl->n && tl->epoch_s + tl->s[first].t_s < since_s) first++;
    view.s = tl->s + first;
    view.n = tl->n - first;
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    MT_CHECK(f != NULL, "open_memstream failed");
    /* timestamps in microseconds of CLOCK_MONOTONIC: the trace shifts them to its origin */
    moe_staging_trace_counters(f, &view, 1, tl->epoch_s * 1e6, false);
    fclose(f);
    mt_status_t st = eng_trace_add_events_json(t, text, err);
    free(text);
    return st;
}
