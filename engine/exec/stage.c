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
 * What moves through it: weights (exec_residency.c), gradients
 * (exec_grads.c), activations (exec_acts.c), each a batch per block laid
 * out in spans (exec_spans.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/exec.h"
#include "engine/exec/internal.h"
#include "engine/exec/expert_parallel.h"
#include "moe/staging_report.h"
#include "base/grow.h"

/* ---- sizing and the pool ------------------------------------------------------ */

typedef struct {
    size_t *t;
    int n, cap;
} tlist_t;

static void tl_add(tlist_t *l, size_t bytes) {
    MT_GROW(l->t, l->cap, l->n + 1, "staging window");
    l->t[l->n++] = bytes;
}

/* Streamed weight bytes of blocks [b0, b0 + w), every expert (and its
 * LoRA factors) included; the tensors go to out when given. */
static size_t window_weights(eng_exec_t *x, int b0, int w, tlist_t *out) {
    eng_model_t *m = x->model;
    const int gen = ++x->grads.mark_gen;
    size_t sum = 0;
    int32_t *all = NULL;
    for (int b = b0; b < b0 + w && b < x->nb; b++) {
        const int l = b - 1;
        int *ids = exec_id_buffer(x, b);
        int n = x->nused[b];
        memcpy(ids, x->used[b], (size_t)n * sizeof *ids);
        if (exec_layer_per_expert(x, l)) {
            if (!all) {
                all = malloc((size_t)m->cfg.num_experts * sizeof *all);
                MT_CHECK_ALLOC(all, "staging window");
                for (int e = 0; e < m->cfg.num_experts; e++) all[e] = 1;
            }
            n = exec_expert_ids(x, l, all, ids, n);
        }
        for (int k = 0; k < n; k++) {
            const int i = ids[k];
            if (x->grads.mark[i] == gen || !exec_param_streamed(x, &m->params[i])) continue;
            x->grads.mark[i] = gen;
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

uint64_t exec_stage_copies(const eng_exec_t *x, int dir) {
    moe_staging_stats_t s;
    moe_staging_get_stats(x->stage, MOE_STAGING_SCOPE_TOTAL, &s);
    return s.copies[dir];
}

void exec_stage_count_skipped(eng_exec_t *x, int dir, int experts) {
    if (experts <= 0) return;
    x->cnt.ctr.experts_skipped[dir] += (uint64_t)experts;
    moe_staging_count_skipped(x->stage, experts);
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
