/* The executor's staging pool: its sizing for the plan's window and the
 * batches of copies through it (see stage.h, and moe/staging.h for the pool
 * itself). */
#include "engine/exec/place/stage.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/grow.h"
#include "engine/exec/place/copies.h"
#include "engine/exec/place/plan_query.h"

/* ---- settings ------------------------------------------------------------------ */

void eng_staging_settings_init(eng_staging_settings_t *s) {
    memset(s, 0, sizeof *s);
    s->mode = MOE_STAGING_COMPACT;
    s->num_slabs = MOE_STAGING_SLABS_AUTO;
}

void exec_stage_init(exec_stage_t *s, const eng_layer_env_t *env, exec_lists_t *lists, exec_counters_t *cnt,
                     const eng_staging_settings_t *set) {
    memset(s, 0, sizeof *s);
    s->env = env;
    s->lists = lists;
    s->cnt = cnt;
    if (set) s->set = *set;
    else eng_staging_settings_init(&s->set);
}

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
static size_t window_weights(exec_stage_t *s, int b0, int w, tlist_t *out) {
    const eng_model_t *m = s->env->model;
    exec_lists_t *ls = s->lists;
    const int gen = ++ls->mark_gen;
    size_t sum = 0;
    int32_t *all = NULL;
    for (int b = b0; b < b0 + w && b < ls->nb; b++) {
        const int l = b - 1;
        int n;
        int *ids = exec_block_ids(ls, b, &n);
        if (exec_layer_per_expert(s->env, l)) {
            if (!all) {
                all = malloc((size_t)m->cfg.num_experts * sizeof *all);
                MT_CHECK_ALLOC(all, "staging window");
                for (int e = 0; e < m->cfg.num_experts; e++) all[e] = 1;
            }
            n = exec_expert_ids(s->env, l, all, ids, n);
        }
        for (int k = 0; k < n; k++) {
            const int i = ids[k];
            if (ls->mark[i] == gen || !exec_param_streamed(s->env, &m->params[i])) continue;
            ls->mark[i] = gen;
            sum += exec_w_bytes(&m->params[i]);
            if (out) tl_add(out, exec_w_bytes(&m->params[i]));
        }
        free(ids);
    }
    free(all);
    return sum;
}

/* One block of gradients on their way to the host (frozen weights have
 * none): the largest, its tensors into t. */
static size_t window_grads(const exec_stage_t *s, tlist_t *t) {
    const eng_model_t *m = s->env->model;
    int gb = -1;
    size_t gbest = 0;
    for (int b = 0; b < s->lists->nb; b++) {
        if (exec_block_plan(s->env, b)->grads != SCHED_GRADS_HOST) continue;
        size_t sum = 0;
        for (int i = 0; i < m->num_params; i++)
            if (m->params[i].block == b && !m->params[i].frozen) sum += exec_f32_bytes(&m->params[i]);
        if (sum > gbest) gbest = sum, gb = b;
    }
    for (int i = 0; gb >= 0 && i < m->num_params; i++)
        if (m->params[i].block == gb && !m->params[i].frozen) tl_add(t, exec_f32_bytes(&m->params[i]));
    return gbest;
}

/* Block inputs of `tokens` tokens that a layer-major step offloads for
 * layer l (0 when it keeps them): the residual stream, fp32. */
static size_t input_bytes(const exec_stage_t *s, int l, int tokens) {
    if (!exec_inputs_offloaded(s->env, l + 1)) return 0;
    const size_t raw = (size_t)tokens * (size_t)s->env->model->cfg.hidden_size * sizeof(float);
    return (raw + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN;
}

/* The in-flight window for micro-batches of `tokens` tokens. */
static void stage_window(exec_stage_t *s, int tokens, tlist_t *t, eng_exec_staging_info_t *info) {
    const eng_model_t *m = s->env->model;
    const int W1 = s->env->plan->prefetch_window + 1;
    int best0 = -1;
    size_t best = 0;
    for (int b0 = 0; b0 < s->lists->nb; b0++) {
        const size_t sum = window_weights(s, b0, W1, NULL);
        if (sum > best) best = sum, best0 = b0;
    }
    if (best0 >= 0) window_weights(s, best0, W1, t);
    info->window_weights = best;
    info->window_grads = window_grads(s, t);
    /* every offloaded block's activations, held from its forward to its backward */
    info->window_acts = 0;
    for (int l = 0; tokens > 0 && l < m->cfg.num_hidden_layers; l++)
        if (exec_acts_offloaded(s->env, l + 1)) {
            const size_t a = exec_layer_act_bytes(m, l, tokens);
            tl_add(t, a);
            info->window_acts += a;
            if (a > info->largest_tensor) {
                info->largest_tensor = a;
                snprintf(info->largest_name, sizeof info->largest_name, "the saved activations of layer %d", l);
            }
        }
    /* and a layer-major step's offloaded block inputs, held the same way */
    for (int l = 0; tokens > 0 && l < m->cfg.num_hidden_layers; l++) {
        const size_t a = input_bytes(s, l, tokens);
        if (a == 0) continue;
        tl_add(t, a);
        info->window_acts += a;
    }
    /* held activations leave room for the largest parameter beside them
     * (check_room_for_acts): a plan that streams nothing else (resident
     * weights, device gradients) still moves one across the link once */
    if (info->window_acts > 0 && best == 0 && info->window_grads == 0) {
        size_t largest_param = 0;
        for (int i = 0; i < m->num_params; i++)
            if (exec_f32_bytes(&m->params[i]) > largest_param) largest_param = exec_f32_bytes(&m->params[i]);
        tl_add(t, largest_param);
    }
}

/* info for micro-batches of `tokens` tokens, and the pool options that hold its window. */
static void stage_plan(exec_stage_t *s, int tokens, moe_staging_opts_t *o) {
    const eng_model_t *m = s->env->model;
    const eng_staging_settings_t *set = &s->set;
    eng_exec_staging_info_t *info = &s->info;
    memset(info, 0, sizeof *info);
    info->mode = set->mode;
    info->tokens = tokens;
    info->window_blocks = s->env->plan->prefetch_window + 1;
    /* anything may cross once (placement), so the largest parameter bounds slots and slabs */
    for (int i = 0; i < m->num_params; i++)
        if (exec_f32_bytes(&m->params[i]) > info->largest_tensor) {
            info->largest_tensor = exec_f32_bytes(&m->params[i]);
            snprintf(info->largest_name, sizeof info->largest_name, "%s", m->params[i].spec->name);
        }
    tlist_t t = {0};
    stage_window(s, tokens, &t, info);
    info->window_tensors = t.n;
    for (int k = 0; k < t.n; k++) info->window_payload += t.t[k];
    const moe_staging_plan_opts_t po = {.largest_tensor = info->largest_tensor};
    info->window_need = moe_staging_plan_bytes(set->mode, t.t, t.n, &po);
    free(t.t);

    moe_staging_opts_init(o, set->mode);
    o->capacity_bytes = info->window_need;
    o->cap_bytes = set->cap_bytes;
    o->max_tensor_bytes = info->largest_tensor;
    o->max_tensor_name = info->largest_name;
    o->num_slabs = set->num_slabs;
    o->slab_bytes = set->slab_bytes;
    if (set->timeline_samples) o->max_samples = set->timeline_samples;
    snprintf(s->label, sizeof s->label, "%s", moe_staging_mode_name(set->mode));
    o->label = s->label;
}

/* Offloaded activations stay held from forward to backward: a cap that
 * leaves no room beside them for the largest tensor would stall the run. */
static mt_status_t check_room_for_acts(exec_stage_t *s, int tokens, size_t capacity, mt_error_t *err) {
    const eng_model_t *m = s->env->model;
    const eng_staging_settings_t *set = &s->set;
    const eng_exec_staging_info_t *info = &s->info;
    if (info->window_acts == 0) return MT_OK;
    size_t *must = malloc((size_t)(2 * m->cfg.num_hidden_layers + 1) * sizeof *must);
    MT_CHECK_ALLOC(must, "staging check");
    int n = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) {
        if (exec_acts_offloaded(s->env, l + 1)) must[n++] = exec_layer_act_bytes(m, l, tokens);
        if (input_bytes(s, l, tokens) > 0) must[n++] = input_bytes(s, l, tokens);
    }
    /* beside them, room for the largest parameter tensor (the largest
     * "tensor" may be one of the activation regions just counted) */
    size_t largest_param = 0;
    for (int i = 0; i < m->num_params; i++)
        if (exec_f32_bytes(&m->params[i]) > largest_param) largest_param = exec_f32_bytes(&m->params[i]);
    must[n++] = largest_param;
    const moe_staging_plan_opts_t po = {.largest_tensor = info->largest_tensor};
    const size_t need = moe_staging_plan_bytes(set->mode, must, n, &po);
    free(must);
    if (capacity >= need) return MT_OK;
    return mt_error_set(err, MT_ERR_CONFIG,
                        "staging (mode %s): the pinned cap leaves %zu bytes, but the plan holds %zu bytes of "
                        "offloaded activations (block inputs included) from forward to backward and still "
                        "needs room for the largest parameter (%zu bytes): %zu bytes at least; raise "
                        "staging.cap / memory.pinned, recompute activations instead of offloading them or "
                        "keep block inputs on the device (scheduler.block_inputs: keep)",
                        moe_staging_mode_name(set->mode), capacity, info->window_acts, largest_param, need);
}

mt_status_t exec_stage_create(exec_stage_t *s, int tokens, mt_error_t *err) {
    moe_staging_opts_t o;
    stage_plan(s, tokens, &o);
    mt_status_t st = moe_staging_create(s->env->dev, &o, &s->pool, err);
    if (st != MT_OK) return mt_error_prefix(err, "staging (mode %s): ", moe_staging_mode_name(s->set.mode));
    moe_staging_stats_t stats;
    moe_staging_get_stats(s->pool, MOE_STAGING_SCOPE_TOTAL, &stats);
    s->info.capacity = stats.capacity;
    s->tokens = tokens;
    st = check_room_for_acts(s, tokens, stats.capacity, err);
    if (st != MT_OK) exec_stage_destroy(s);
    return st;
}

bool exec_stage_fits(exec_stage_t *s, int tokens) {
    if (tokens <= s->tokens) return true; /* a smaller micro-batch (the data's tail) fits */
    bool offloads = false;
    for (int b = 0; b < s->lists->nb; b++)
        offloads |= exec_acts_offloaded(s->env, b) || exec_inputs_offloaded(s->env, b);
    if (offloads) return false; /* between micro-batches nothing is held: re-size for this shape */
    s->tokens = tokens;
    return true;
}

void exec_stage_destroy(exec_stage_t *s) {
    if (!s->pool) return;
    moe_staging_destroy(s->pool);
    s->pool = NULL;
}

/* ---- copies ------------------------------------------------------------------- */

static const moe_staging_batch_t *batch_of(moe_staging_batch_t *b, const char *tag) {
    *b = (moe_staging_batch_t){tag, MT_ARENA_ALIGN};
    return b;
}

mt_status_t exec_stage_batch_h2d(exec_stage_t *s, const moe_staging_xfer_t *items, int n, const char *tag,
                                 mt_error_t *err) {
    kern_device_t *dev = s->env->dev;
    moe_staging_batch_t b;
    return moe_staging_h2d_batch(s->pool, kern_stream(dev, KERN_STREAM_H2D), items, n, batch_of(&b, tag), err);
}

mt_status_t exec_stage_batch_d2h(exec_stage_t *s, const moe_staging_xfer_t *items, int n, const char *tag,
                                 mt_error_t *err) {
    kern_device_t *dev = s->env->dev;
    moe_staging_batch_t b;
    return moe_staging_d2h_batch(s->pool, kern_stream(dev, KERN_STREAM_D2H), items, n, batch_of(&b, tag), err);
}

uint64_t exec_stage_copies(const exec_stage_t *s, int dir) {
    moe_staging_stats_t stats;
    moe_staging_get_stats(s->pool, MOE_STAGING_SCOPE_TOTAL, &stats);
    return stats.copies[dir];
}

void exec_stage_count_skipped(exec_stage_t *s, int dir, int experts) {
    if (experts <= 0) return;
    s->cnt->ctr.experts_skipped[dir] += (uint64_t)experts;
    moe_staging_count_skipped(s->pool, experts);
}

size_t exec_stage_offload_bytes(const exec_stage_t *s, int tokens) {
    const eng_model_t *m = s->env->model;
    size_t sum = 0;
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (exec_acts_offloaded(s->env, l + 1)) sum += exec_layer_act_bytes(m, l, tokens);
    return sum;
}
