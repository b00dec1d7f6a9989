/* The executor (see exec.h): its lifetime, placement of a model under a
 * plan, deferred frees and reading back.  Weight streaming, activation
 * offload and the gradient flow through the staging pool are in
 * exec_stage.c; the forward/backward program in exec_step.c; the optimizer
 * step in exec_optim.c.
 *
 * Gradients and plan invariance.  Every plan must give bit-identical
 * results, so gradients are accumulated the same way whatever their home:
 * the first micro-batch of an optimizer step computes into a zeroed buffer
 * (the accumulator itself when it lives on the device), later micro-batches
 * compute into a fresh zeroed buffer that is then added element-wise into
 * the accumulator (on the device or, for host gradients, on the host, by
 * the staging pool's ADD_F32 unpack: the same float adds in the same
 * order).  Adding in the GEMM (beta = 1 on a non-zero C) would round
 * differently from that add, so it is used only on zeroed buffers. */
#include "engine/exec/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/internal.h"
#include "engine/model/lora_model.h"
#include "engine/exec/expert_parallel.h"
#include "engine/exec/trace.h"
#include "base/grow.h"

/* ---- tracing ------------------------------------------------------------ */

static void copy_observer(void *ctx, kern_stream_role_t role, size_t bytes, double t0, double t1) {
    const eng_exec_t *x = ctx;
    if (!x->trace) return;
    eng_trace_span(x->trace, role == KERN_STREAM_H2D ? ENG_TRACK_H2D : ENG_TRACK_D2H,
                   role == KERN_STREAM_H2D ? "H2D" : "D2H", "copy", t0, t1, bytes);
}

void eng_exec_set_trace(eng_exec_t *x, struct eng_trace *trace) {
    x->trace = trace;
    x->dev->copy_observer = trace ? copy_observer : NULL;
    x->dev->copy_observer_ctx = trace ? x : NULL;
}

void eng_exec_block_times(eng_exec_t *x, double *fwd_s, double *bwd_s, bool reset) {
    const double k = x->timed_micro > 0 ? 1.0 / x->timed_micro : 0.0;
    for (int b = 0; b < x->nb; b++) {
        if (fwd_s) fwd_s[b] = x->fwd_s[b] * k;
        if (bwd_s) bwd_s[b] = x->bwd_s[b] * k;
        if (reset) x->fwd_s[b] = x->bwd_s[b] = 0;
    }
    if (reset) x->timed_micro = 0;
}

void exec_trace_memory(eng_exec_t *x, double t) {
    if (!x->trace) return;
    const kern_device_stats_t st = kern_device_stats(x->dev);
    eng_trace_counter(x->trace, "device bytes", t, (double)st.device_in_use);
    eng_trace_counter(x->trace, "pinned bytes", t, (double)st.pinned_in_use);
}

/* ---- deferred frees ----------------------------------------------------- */

void exec_defer_free(eng_exec_t *x, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after) {
    MT_GROW(x->pend.v, x->pend.cap, x->pend.n + 1, "pending frees");
    kern_event_t *ev = kern_event_create(x->dev);
    kern_event_record(x->dev, ev, after);
    x->pend.v[x->pend.n++] = (exec_pending_t){dev_ptr, pinned, pinned_bytes, ev};
}

void exec_process_pending(eng_exec_t *x, bool force) {
    int keep = 0;
    for (int i = 0; i < x->pend.n; i++) {
        exec_pending_t *p = &x->pend.v[i];
        if (force) kern_event_sync(x->dev, p->ev);
        if (force || kern_event_query(x->dev, p->ev)) {
            if (p->dev) kern_free(x->dev, p->dev);
            if (p->pinned) kern_pinned_free(x->dev, p->pinned, p->pinned_bytes);
            kern_event_destroy(x->dev, p->ev);
        } else {
            x->pend.v[keep++] = *p;
        }
    }
    x->pend.n = keep;
    if (x->stage) moe_staging_poll(x->stage);
}

/* Reclaim hook: an allocation did not fit; buffers still read by copies in
 * flight are freed once those copies finish. */
static bool reclaim_pending(void *ctx) {
    eng_exec_t *x = ctx;
    if (x->pend.n == 0) return false;
    exec_process_pending(x, true);
    return true;
}

void eng_exec_drain(eng_exec_t *x) {
    exec_host_optim_wait(&x->hopt); /* updates still running from the last optimizer step */
    kern_device_sync(x->dev);
    exec_process_pending(x, true);
    if (x->stage) moe_staging_drain(x->stage);
}

void eng_exec_finish_updates_in_step(eng_exec_t *x) { x->finish_updates_in_step = true; }

/* ---- placement ---------------------------------------------------------- */

const sched_block_plan_t *exec_block_plan(const eng_exec_t *x, int b) { return &x->plan.blocks[b]; }

bool exec_param_streamed(const eng_exec_t *x, const eng_param_t *p) {
    return exec_block_plan(x, p->block)->weights == SCHED_WEIGHTS_STREAM;
}

bool exec_turn_held(const eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    const int L = m->cfg.num_hidden_layers;
    return L > 0 && b == L && x->plan.prefetch_window >= 1;
}

bool exec_acts_offloaded(const eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    const int L = m->cfg.num_hidden_layers;
    return b >= 1 && b <= L && x->plan.blocks[b].acts == SCHED_ACTS_OFFLOAD && !exec_turn_held(x, b);
}

size_t exec_w_bytes(const eng_param_t *p) { return p->spec->numel * mt_dtype_size(p->w_dtype); }
size_t exec_f32_bytes(const eng_param_t *p) { return p->spec->numel * sizeof(float); }
moe_staging_op_t exec_w_upload_op(const eng_param_t *p) {
    return p->w_dtype == MT_BF16 && !p->home_bf16 ? MOE_STAGING_F32_TO_BF16 : MOE_STAGING_COPY;
}
void *exec_w_home(const eng_param_t *p) { return p->home_bf16 ? (void *)p->home_bf16 : (void *)p->host_w; }
float *exec_dev_master(const eng_exec_t *x, int i) {
    const eng_dparam_t *d = &x->dp[i];
    if (d->dev_master) return d->dev_master;
    return x->model->params[i].w_dtype == MT_F32 ? (float *)d->w : NULL;
}

static void add_used(eng_exec_t *x, int b, int i) {
    if (i < 0) return;
    x->used[b][x->nused[b]++] = i;
}

static void build_block_lists(eng_exec_t *x) {
    eng_model_t *m = x->model;
    const int L = m->cfg.num_hidden_layers;
    x->used = calloc((size_t)x->nb, sizeof *x->used);
    x->nused = calloc((size_t)x->nb, sizeof *x->nused);
    MT_CHECK(x->used && x->nused, "out of memory for block lists");
    for (int b = 0; b < x->nb; b++) {
        x->used[b] = malloc((size_t)m->num_params * sizeof(int));
        MT_CHECK_ALLOC(x->used[b], "block list");
    }
    /* dense (non-routed) parameters each block computes with */
    for (int i = 0; i < m->num_params; i++)
        if (m->params[i].spec->expert < 0 && m->params[i].block != L + 1 && i != m->embed)
            add_used(x, m->params[i].block, i);
    add_used(x, 0, m->embed);
    add_used(x, L + 1, m->final_norm);
    add_used(x, L + 1, m->lm_head);
}

static mt_status_t place_param(eng_exec_t *x, int i, mt_error_t *err) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    const sched_block_plan_t *bp = exec_block_plan(x, p->block);
    const size_t bytes = exec_f32_bytes(p);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    char tag[200];
    /* another device's expert (expert parallel): only the primary's host
     * gradient, which the owner's gradient lands in for the one optimizer */
    const bool foreign = exec_ep_foreign(x, p);
    if (foreign && (p->frozen || x->replica || bp->optim != SCHED_OPTIM_HOST)) return MT_OK;
    if (foreign) {
        d->host_g = calloc(p->spec->numel, sizeof(float));
        MT_CHECK_ALLOC(d->host_g, p->spec->name);
        return MT_OK;
    }
    if (bp->weights == SCHED_WEIGHTS_RESIDENT) {
        snprintf(tag, sizeof tag, "weight %s", p->spec->name);
        d->w = kern_alloc_lasting(x->dev, exec_w_bytes(p), tag, err);
        if (!d->w) return err->code;
    }
    if (p->frozen) return MT_OK; /* no master beside the home, no gradient, no optimizer state */
    if (bp->optim == SCHED_OPTIM_DEVICE && p->w_dtype != MT_F32 && !x->replica) {
        snprintf(tag, sizeof tag, "fp32 master of %s", p->spec->name);
        d->dev_master = kern_alloc_lasting(x->dev, bytes, tag, err);
        if (!d->dev_master) return err->code;
    }
    if (bp->grads == SCHED_GRADS_DEVICE) {
        snprintf(tag, sizeof tag, "gradient of %s", p->spec->name);
        d->g_acc = kern_alloc_lasting(x->dev, bytes, tag, err);
        if (!d->g_acc) return err->code;
        kern_memset(x->dev, s, d->g_acc, 0, bytes);
    }
    /* a replica's gradients go to the primary's optimizer, not its own */
    if (bp->grads == SCHED_GRADS_HOST || (bp->optim == SCHED_OPTIM_HOST && !x->replica)) {
        d->host_g = calloc(p->spec->numel, sizeof(float));
        MT_CHECK_ALLOC(d->host_g, p->spec->name);
    }
    return MT_OK;
}

void eng_staging_settings_init(eng_staging_settings_t *s) {
    memset(s, 0, sizeof *s);
    s->mode = MOE_STAGING_COMPACT;
    s->num_slabs = MOE_STAGING_SLABS_AUTO;
}

void eng_staging_settings_from_run(const eng_run_config_t *rc, eng_staging_settings_t *out) {
    eng_staging_settings_init(out);
    switch (rc->staging_mode) {
    case ENG_STAGING_PER_TENSOR: out->mode = MOE_STAGING_PER_TENSOR; break;
    case ENG_STAGING_MAX_SLOT: out->mode = MOE_STAGING_MAX_SLOT; break;
    case ENG_STAGING_COMPACT:
    default: out->mode = MOE_STAGING_COMPACT; break;
    }
    out->cap_bytes = rc->staging_cap ? rc->staging_cap : rc->memory_pinned;
    /* -1 is the config's "automatic"; anything else (0 included) goes to the pool to judge */
    out->num_slabs = rc->staging_num_slabs == -1 ? MOE_STAGING_SLABS_AUTO : rc->staging_num_slabs;
    out->slab_bytes = rc->staging_slab_size;
    const long long tok = (long long)rc->micro_batch_size * rc->sequence_len;
    out->tokens = tok > 0 && tok < (1 << 30) ? (int)tok : 0;
}

static void exec_destroy(eng_exec_t *x);

mt_status_t eng_exec_create(eng_exec_t **out, eng_model_t *m, kern_device_t *dev, const sched_plan_t *plan,
                            const eng_staging_settings_t *staging, bool replica, mt_error_t *err) {
    *out = NULL;
    const int nb = eng_model_num_blocks(m);
    if (plan->num_blocks != nb)
        return mt_error_set(err, MT_ERR_INTERNAL, "plan has %d blocks, model has %d", plan->num_blocks, nb);
    for (int b = 0; b < nb; b++) {
        const sched_block_plan_t *bp = &plan->blocks[b];
        if (bp->optim == SCHED_OPTIM_DEVICE &&
            (bp->weights != SCHED_WEIGHTS_RESIDENT || bp->grads != SCHED_GRADS_DEVICE))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "invalid plan for block %d: a device optimizer needs resident weights "
                                "and device gradients",
                                b);
        /* Streamed weights, offloaded activations and host gradients free
         * device buffers as soon as work using them has been issued; the
         * CUDA backend frees in stream order (kernels/arena_defer.h). */
    }
    eng_exec_t *x = calloc(1, sizeof *x);
    MT_CHECK_ALLOC(x, "executor");
    x->model = m;
    x->dev = dev;
    x->replica = replica;
    x->plan = *plan;
    x->plan.blocks = malloc((size_t)nb * sizeof *x->plan.blocks);
    MT_CHECK_ALLOC(x->plan.blocks, "plan copy");
    memcpy(x->plan.blocks, plan->blocks, (size_t)nb * sizeof *plan->blocks);
    if (x->plan.prefetch_window < 1) x->plan.prefetch_window = 1;
    x->dp = calloc((size_t)m->num_params, sizeof *x->dp);
    MT_CHECK_ALLOC(x->dp, "device parameter table");
    x->env = (eng_layer_env_t){.dev = dev, .model = m, .dp = x->dp, .plan = &x->plan};
    x->nb = nb;
    build_block_lists(x);
    const int P = m->num_params, L = m->cfg.num_hidden_layers;
    x->res.w_ready = calloc((size_t)nb, sizeof *x->res.w_ready);
    x->acts.a_ready = calloc((size_t)nb, sizeof *x->acts.a_ready);
    x->acts.o_done = calloc((size_t)nb, sizeof *x->acts.o_done);
    x->res.holding = calloc((size_t)nb, sizeof *x->res.holding);
    x->res.param_refs = calloc((size_t)P, sizeof *x->res.param_refs);
    x->res.w_span = malloc((size_t)P * sizeof *x->res.w_span);
    x->grads.g_span = malloc((size_t)P * sizeof *x->grads.g_span);
    x->grads.mark = calloc((size_t)P, sizeof *x->grads.mark);
    x->acts.offl = calloc((size_t)nb, sizeof *x->acts.offl);
    x->fwd_s = calloc((size_t)nb, sizeof *x->fwd_s);
    x->bwd_s = calloc((size_t)nb, sizeof *x->bwd_s);
    MT_CHECK(x->res.w_ready && x->acts.a_ready && x->acts.o_done && x->res.holding && x->res.param_refs && x->res.w_span && x->grads.g_span &&
                 x->grads.mark && x->acts.offl && x->fwd_s &&
                 x->bwd_s,
             "out of memory for executor state");
    x->spans.free_head = -1;
    for (int i = 0; i < P; i++) x->res.w_span[i] = x->grads.g_span[i] = -1;
    for (int b = 0; b < nb; b++) {
        x->res.w_ready[b] = kern_event_create(x->dev);
        x->acts.a_ready[b] = kern_event_create(x->dev);
        x->acts.o_done[b] = kern_event_create(x->dev);
        x->acts.offl[b].region.id = -1;
    }
    moe_predict_init(&x->predict, L, m->cfg.layer_is_moe, m->cfg.num_experts);
    kern_set_reclaim_hook(x->dev, reclaim_pending, x);
    exec_host_optim_init(&x->hopt, m, x->dp, x->dev, &x->trace);
    exec_counters_init(&x->cnt, L);
    if (staging) x->stage_set = *staging;
    else eng_staging_settings_init(&x->stage_set);
    mt_status_t st = exec_stage_create(x, x->stage_set.tokens, err);
    if (st != MT_OK) {
        exec_destroy(x);
        return st;
    }
    *out = x;
    return MT_OK;
}

mt_status_t eng_exec_place(eng_exec_t *x, mt_error_t *err) {
    eng_model_t *m = x->model;
    for (int i = 0; i < m->num_params; i++) {
        mt_status_t st = place_param(x, i, err);
        if (st != MT_OK) return st;
    }
    /* resident weights cross once, a block at a time through the pool */
    moe_staging_xfer_t *items = malloc((size_t)(m->num_params > 0 ? 2 * m->num_params : 1) * sizeof *items);
    MT_CHECK_ALLOC(items, "placement batch");
    mt_status_t st = MT_OK;
    for (int b = 0; b < x->nb && st == MT_OK; b++) {
        int n = 0;
        for (int i = 0; i < m->num_params; i++) {
            eng_param_t *p = &m->params[i];
            eng_dparam_t *d = &x->dp[i];
            if (p->block != b) continue;
            if (d->w) items[n++] = (moe_staging_xfer_t){exec_w_home(p), d->w, exec_w_bytes(p), exec_w_upload_op(p)};
            if (d->dev_master)
                items[n++] = (moe_staging_xfer_t){p->host_w, d->dev_master, exec_f32_bytes(p), MOE_STAGING_COPY};
        }
        char tag[64];
        snprintf(tag, sizeof tag, "resident weights of block %d", b);
        st = exec_stage_h2d(x, items, n, tag, err);
    }
    free(items);
    eng_exec_drain(x);
    if (st != MT_OK) return st;
    /* A device optimizer owns the master: the host copy would only go stale.
     * A frozen weight keeps its home, which is what a merge reads.  A
     * replica (placed before the primary) leaves the model's homes alone. */
    for (int i = 0; i < m->num_params && !x->replica; i++) {
        eng_param_t *p = &m->params[i];
        if (exec_block_plan(x, p->block)->optim == SCHED_OPTIM_DEVICE && !p->frozen) {
            free(p->host_w);
            p->host_w = NULL;
        }
    }
    return MT_OK;
}

static void exec_destroy(eng_exec_t *x) {
    eng_model_t *m = x->model;
    exec_host_optim_free(&x->hopt);
    kern_device_sync(x->dev);
    exec_drop_offloads(x);
    eng_exec_drain(x);
    if (x->trace) eng_exec_set_trace(x, NULL);
    kern_set_reclaim_hook(x->dev, NULL, NULL);
    for (int i = 0; i < m->num_params; i++) {
        eng_dparam_t *d = &x->dp[i];
        /* streamed weights and host-bound gradients live in spans, freed below */
        void *bufs[] = {x->res.w_span[i] < 0 ? d->w : NULL, d->g_transient && x->grads.g_span[i] < 0 ? d->g : NULL,
                        d->g_acc, d->m, d->v, d->dev_master};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            if (bufs[k]) kern_free(x->dev, bufs[k]);
        free(d->host_g);
        d->w = NULL;
        d->g = d->g_acc = d->m = d->v = d->dev_master = d->host_g = NULL;
    }
    for (int s = 0; s < x->spans.n; s++)
        if (x->spans.v[s].base) kern_free(x->dev, x->spans.v[s].base);
    exec_stage_destroy(x);
    for (int b = 0; b < x->nb; b++) {
        kern_event_destroy(x->dev, x->res.w_ready[b]);
        kern_event_destroy(x->dev, x->acts.a_ready[b]);
        kern_event_destroy(x->dev, x->acts.o_done[b]);
        free(x->used[b]);
        free(x->acts.offl[b].e);
        free(x->res.holding[b].idx);
    }
    if (x->env.rope_cos) kern_free(x->dev, x->env.rope_cos);
    if (x->env.rope_sin) kern_free(x->dev, x->env.rope_sin);
    x->env.rope_cos = x->env.rope_sin = NULL;
    moe_predict_free(&x->predict);
    exec_counters_free(&x->cnt);
    free(x->used);
    free(x->nused);
    free(x->res.w_ready);
    free(x->acts.a_ready);
    free(x->acts.o_done);
    free(x->res.holding);
    free(x->res.param_refs);
    free(x->res.w_span);
    free(x->grads.g_span);
    free(x->grads.mark);
    free(x->spans.v);
    free(x->acts.offl);
    free(x->pend.v);
    free(x->fwd_s);
    free(x->bwd_s);
    free(x->dp);
    sched_plan_free(&x->plan);
    free(x);
}

/* ---- reading back ------------------------------------------------------- */

bool eng_exec_param_has_grad(const eng_exec_t *x, int i) { return x->dp[i].has_grad; }

void eng_exec_read_param(eng_exec_t *x, int i, float *host, bool gradient) {
    eng_model_t *m = x->model;
    eng_exec_drain(x);
    const eng_param_t *p = &m->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t bytes = exec_f32_bytes(p);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const void *src_host = gradient ? d->host_g : p->host_w;
    const void *src_dev = gradient ? d->g_acc : exec_dev_master(x, i);
    if (gradient && exec_block_plan(x, p->block)->grads == SCHED_GRADS_DEVICE) src_host = NULL;
    if (!gradient && p->home_bf16) {
        mt_convert_to_f32(host, p->home_bf16, MT_BF16, p->spec->numel);
    } else if (src_host) {
        memcpy(host, src_host, bytes);
    } else if (src_dev) {
        kern_memcpy_d2h(x->dev, s, host, src_dev, bytes);
        kern_stream_sync(x->dev, s);
    } else {
        memset(host, 0, bytes);
    }
}

/* ---- an executor and the model it holds -------------------------------- */

eng_model_t *eng_exec_model(const eng_exec_t *x) { return x->model; }
kern_device_t *eng_exec_device(const eng_exec_t *x) { return x->dev; }
const sched_plan_t *eng_exec_plan(const eng_exec_t *x) { return &x->plan; }

mt_status_t eng_exec_load(eng_exec_t **out, kern_device_t *dev, const char *dir, const char *overrides_json,
                          const sched_plan_t *plan, const eng_staging_settings_t *staging, mt_error_t *err) {
    const eng_model_opts_t o = {.overrides_json = overrides_json, .plan = plan, .staging = staging};
    return eng_exec_open(out, dev, dir, &o, err);
}

mt_status_t eng_exec_open(eng_exec_t **out, kern_device_t *dev, const char *dir, const eng_model_opts_t *opts,
                          mt_error_t *err) {
    *out = NULL;
    eng_model_t *m = calloc(1, sizeof *m);
    MT_CHECK_ALLOC(m, "model");
    mt_status_t st = eng_model_init(m, dir, opts, err);
    if (st == MT_OK && opts->lora && (st = eng_lora_attach(m, opts->lora, err)) != MT_OK) eng_model_release(m);
    if (st != MT_OK) {
        free(m);
        return st;
    }
    /* The executor and its staging pool first: settings it refuses fail
     * before a large checkpoint is read. */
    const sched_plan_t *plan = opts->plan;
    sched_plan_t keep_all;
    if (!plan) {
        sched_plan_init_uniform(&keep_all, eng_model_num_blocks(m), SCHED_POLICY_KEEP_ALL);
        plan = &keep_all;
    }
    eng_exec_t *x = NULL;
    st = eng_exec_create(&x, m, dev, plan, opts->staging, false, err);
    if (plan == &keep_all) sched_plan_free(&keep_all);
    if (st != MT_OK) {
        eng_model_release(m);
        free(m);
        return st;
    }
    x->owns_model = true;
    st = eng_model_read_weights(m, dir, err);
    if (st == MT_OK && opts->lora) st = eng_lora_init_weights(m, opts->lora, err);
    if (st == MT_OK) st = eng_exec_place(x, err);
    if (st != MT_OK) {
        eng_exec_free(x);
        return st;
    }
    *out = x;
    return MT_OK;
}

void eng_exec_free(eng_exec_t *x) {
    if (!x) return;
    eng_model_t *m = x->owns_model ? x->model : NULL;
    exec_destroy(x);
    if (m) {
        eng_model_release(m);
        free(m);
    }
}
