/* The executor (see exec.h): its lifetime, which wires its concerns'
 * structs to each other (executor.h), placement of a model under a plan,
 * draining, reading back and the staging pool's reports.  Weights on the
 * device are residency.c's, gradient targets grads.c's, offloaded
 * activations acts.c's, the staging pool stage.c's; the forward/backward
 * program is step.c (and layer_major.c); the optimizer step optim_step.c.
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

#include "engine/exec/place/acts.h"
#include "engine/exec/place/copies.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/executor.h"
#include "engine/exec/place/grads.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/lists.h"
#include "engine/exec/place/pending.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/place/residency.h"
#include "engine/exec/place/spans.h"
#include "engine/exec/place/stage.h"
#include "engine/exec/record/trace.h"
#include "engine/model/lora_model.h"
#include "moe/staging_report.h"

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

/* ---- deferred frees and draining ---------------------------------------- */

/* Reclaim hook: an allocation did not fit; buffers still read by copies in
 * flight are freed once those copies finish. */
static bool reclaim_pending(void *ctx) {
    exec_pending_list_t *pend = ctx;
    if (pend->n == 0) return false;
    exec_process_pending(pend, true);
    return true;
}

void eng_exec_drain(eng_exec_t *x) {
    exec_host_optim_wait(&x->hopt); /* updates still running from the last optimizer step */
    kern_device_sync(x->dev);
    exec_process_pending(&x->pend, true);
    if (x->stage.pool) moe_staging_drain(x->stage.pool);
}

void eng_exec_finish_updates_in_step(eng_exec_t *x) { x->prog.finish_updates_in_step = true; }

/* ---- placement ---------------------------------------------------------- */

static mt_status_t place_param(eng_exec_t *x, int i, mt_error_t *err) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    const sched_block_plan_t *bp = exec_block_plan(&x->env, p->block);
    const size_t bytes = exec_f32_bytes(p);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    char tag[200];
    /* another device's expert (expert parallel): only the primary's host
     * gradient, which the owner's gradient lands in for the one optimizer */
    const bool foreign = exec_ep_foreign(&x->env, p);
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

/* What the executor refuses of a plan before it holds anything. */
static mt_status_t check_plan(const eng_model_t *m, const sched_plan_t *plan, mt_error_t *err) {
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
    return MT_OK;
}

/* Each concern's struct, given the others it works with: the wiring of
 * the executor (executor.h), lowest concerns first. */
static void wire_concerns(eng_exec_t *x, const eng_staging_settings_t *staging) {
    eng_model_t *m = x->model;
    const int L = m->cfg.num_hidden_layers;
    exec_lists_init(&x->lists, &x->env);
    exec_counters_init(&x->cnt, L);
    moe_predict_init(&x->predict, L, m->cfg.layer_is_moe, m->cfg.num_experts);
    exec_host_optim_init(&x->hopt, m, x->dp, x->dev, &x->trace);
    x->hbuf = (exec_host_buffers_t){.dev = x->dev};
    exec_stage_init(&x->stage, &x->env, &x->lists, &x->cnt, staging);
    exec_pending_init(&x->pend, x->dev, &x->stage);
    exec_spans_init(&x->spans, &x->env, &x->pend);
    exec_acts_init(&x->acts, x->dev, x->nb, &x->stage, &x->pend, &x->cnt);
    exec_residency_init(&x->res, &x->env, &x->lists, &x->spans, &x->stage, &x->cnt, &x->hopt, &x->predict);
    exec_grads_init(&x->grads, &x->env, &x->lists, &x->spans, &x->stage, &x->cnt, &x->hopt, &x->predict);
    kern_set_reclaim_hook(x->dev, reclaim_pending, &x->pend);
}

mt_status_t eng_exec_create(eng_exec_t **out, eng_model_t *m, kern_device_t *dev, const sched_plan_t *plan,
                            const eng_staging_settings_t *staging, bool replica, mt_error_t *err) {
    *out = NULL;
    mt_status_t st = check_plan(m, plan, err);
    if (st != MT_OK) return st;
    const int nb = eng_model_num_blocks(m);
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
    x->fwd_s = calloc((size_t)nb, sizeof *x->fwd_s);
    x->bwd_s = calloc((size_t)nb, sizeof *x->bwd_s);
    MT_CHECK(x->fwd_s && x->bwd_s, "out of memory for executor state");
    wire_concerns(x, staging);
    st = exec_stage_create(&x->stage, x->stage.set.tokens, err);
    if (st != MT_OK) {
        exec_destroy(x);
        return st;
    }
    *out = x;
    return MT_OK;
}

/* The host gradient accumulators of the blocks whose plan pins them, in
 * one pinned allocation per block (host_buffers.h). */
static void pin_grads(eng_exec_t *x) {
    const eng_model_t *m = x->model;
    int *idx = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *idx);
    MT_CHECK_ALLOC(idx, "gradient accumulator list");
    for (int b = 0; b < x->nb; b++) {
        if (!sched_block_pinned_grads(exec_block_plan(&x->env, b))) continue;
        int n = 0;
        for (int i = 0; i < m->num_params; i++)
            if (m->params[i].block == b && x->dp[i].host_g) idx[n++] = i;
        exec_pin_grads(&x->hbuf, m, x->dp, idx, n);
    }
    free(idx);
}

/* A trained weight whose block runs AdamW on the host, in a bf16 run,
 * gets its bf16 working copy in host memory beside the master
 * (eng_param_t.work_bf16): every fetch then copies half the master's bytes
 * as they are, instead of rounding the master again on the staging
 * threads twice a step, and host AdamW writes it as it updates the master
 * (the kernel's fused bf16 output, the same rounding).  Pinned where the
 * plan says so (host_buffers.h). */
static mt_status_t place_host_working_copies(eng_exec_t *x, mt_error_t *err) {
    eng_model_t *m = x->model;
    int *idx = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *idx);
    MT_CHECK_ALLOC(idx, "working copy list");
    mt_status_t st = MT_OK;
    for (int b = 0; b < x->nb && st == MT_OK; b++) {
        const sched_block_plan_t *bp = exec_block_plan(&x->env, b);
        if (bp->optim != SCHED_OPTIM_HOST) continue;
        int n = 0;
        for (int i = 0; i < m->num_params; i++) {
            const eng_param_t *p = &m->params[i];
            if (p->block == b && !p->frozen && p->host_w && !p->work_bf16 && p->w_dtype == MT_BF16) idx[n++] = i;
        }
        st = exec_make_work_copies(&x->hbuf, m, idx, n, sched_block_pinned_home(bp), x->hopt.pool, err);
    }
    free(idx);
    return st;
}

/* The quantised homes the checkpoint load left pending in its mapping
 * (eng_model_read_weights) packed into host memory, except those the NVMe
 * tier is to hold: it writes them straight from the mapping when placed
 * (eng_exec_place_optim_nvme), so they never take host memory. */
static void pack_pending_homes(eng_exec_t *x) {
    eng_model_t *m = x->model;
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        if (p->home_q && p->home_q->pending && !exec_base_home_on_nvme(&x->env, p))
            eng_quant_home_materialize(p->home_q);
    }
}

mt_status_t eng_exec_place(eng_exec_t *x, mt_error_t *err) {
    eng_model_t *m = x->model;
    pack_pending_homes(x);
    for (int i = 0; i < m->num_params; i++) {
        mt_status_t st = place_param(x, i, err);
        if (st != MT_OK) return st;
    }
    pin_grads(x);
    /* resident weights cross once, a block at a time through the pool; a
     * quantised home lands in a buffer of its own, is dequantised into the
     * working copy, which stays (the dequantised copy is what is resident),
     * and the landing buffer goes once the placement has drained */
    moe_staging_xfer_t *items = malloc((size_t)(m->num_params > 0 ? 2 * m->num_params : 1) * sizeof *items);
    void **landing = calloc((size_t)(m->num_params > 0 ? m->num_params : 1), sizeof *landing);
    MT_CHECK(items && landing, "out of memory for the placement batch");
    mt_status_t st = MT_OK;
    for (int b = 0; b < x->nb && st == MT_OK; b++) {
        int n = 0;
        for (int i = 0; i < m->num_params && st == MT_OK; i++) {
            eng_param_t *p = &m->params[i];
            eng_dparam_t *d = &x->dp[i];
            if (p->block != b) continue;
            if (d->w && p->home_q) {
                char tag[200];
                snprintf(tag, sizeof tag, "quantised weight %s", p->spec->name);
                landing[i] = kern_alloc(x->dev, p->home_q->nbytes, tag, err);
                if (!landing[i]) st = err->code;
            }
            if (d->w) items[n++] = exec_w_upload_item(p, d->w, landing[i]);
            if (d->dev_master)
                items[n++] = (moe_staging_xfer_t){p->host_w, d->dev_master, exec_f32_bytes(p), MOE_STAGING_COPY};
        }
        char tag[64];
        snprintf(tag, sizeof tag, "resident weights of block %d", b);
        if (st == MT_OK) st = exec_stage_batch_h2d(&x->stage, items, n, tag, err);
    }
    free(items);
    eng_exec_drain(x);
    /* after the copies (kernels are ordered after copies only by a wait) */
    kern_stream_t *cs = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    for (int i = 0; i < m->num_params && st == MT_OK; i++)
        if (landing[i]) exec_w_dequant(x->dev, cs, &m->params[i], x->dp[i].w, landing[i]);
    eng_exec_drain(x);
    for (int i = 0; i < m->num_params; i++)
        if (landing[i]) kern_free(x->dev, landing[i]);
    free(landing);
    if (st != MT_OK) return st;
    /* A device optimizer owns the master: the host copy would only go stale.
     * A frozen weight keeps its home, which is what a merge reads.  A
     * replica (placed before the primary) leaves the model's homes alone. */
    for (int i = 0; i < m->num_params && !x->replica; i++) {
        eng_param_t *p = &m->params[i];
        if (exec_block_plan(&x->env, p->block)->optim == SCHED_OPTIM_DEVICE && !p->frozen) {
            free(p->host_w);
            p->host_w = NULL;
        }
    }
    return x->replica ? MT_OK : place_host_working_copies(x, err);
}

/* Every device buffer a parameter's copies still hold; streamed weights
 * and host-bound gradients live in spans, freed with them. */
static void free_param_copies(eng_exec_t *x) {
    const eng_model_t *m = x->model;
    for (int i = 0; i < m->num_params; i++) {
        eng_dparam_t *d = &x->dp[i];
        void *bufs[] = {x->res.w_span[i] < 0 ? d->w : NULL, d->g_transient && x->grads.g_span[i] < 0 ? d->g : NULL,
                        d->g_acc, d->mom, d->dev_master};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            if (bufs[k]) kern_free(x->dev, bufs[k]);
        if (!d->host_g_pinned) free(d->host_g); /* a pinned one went with the executor's allocations */
        d->w = NULL;
        d->g = d->g_acc = d->dev_master = d->host_g = NULL;
        d->mom = NULL;
    }
}

static void exec_destroy(eng_exec_t *x) {
    exec_host_optim_free(&x->hopt);
    kern_device_sync(x->dev);
    exec_host_buffers_release(&x->hbuf, x->model, x->dp);
    exec_drop_offloads(&x->acts);
    eng_exec_drain(x);
    if (x->trace) eng_exec_set_trace(x, NULL);
    kern_set_reclaim_hook(x->dev, NULL, NULL);
    free_param_copies(x);
    exec_spans_free(&x->spans);
    exec_stage_destroy(&x->stage);
    if (x->env.rope_cos) kern_free(x->dev, x->env.rope_cos);
    if (x->env.rope_sin) kern_free(x->dev, x->env.rope_sin);
    x->env.rope_cos = x->env.rope_sin = NULL;
    exec_grads_free(&x->grads);
    exec_residency_free(&x->res);
    exec_acts_free(&x->acts);
    exec_pending_free(&x->pend);
    moe_predict_free(&x->predict);
    exec_counters_free(&x->cnt);
    exec_lists_free(&x->lists);
    free(x->fwd_s);
    free(x->bwd_s);
    free(x->dp);
    sched_plan_free(&x->plan);
    free(x);
}

/* ---- reading back ------------------------------------------------------- */

bool eng_exec_param_has_grad(const eng_exec_t *x, int i) { return x->dp[i].has_grad; }

/* Parameter i's accumulated gradient, wherever the plan keeps it. */
static void read_gradient(eng_exec_t *x, int i, float *host) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    const bool on_device = exec_block_plan(&x->env, p->block)->grads == SCHED_GRADS_DEVICE;
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    if (d->host_g && !on_device) {
        memcpy(host, d->host_g, exec_f32_bytes(p));
    } else if (d->g_acc) {
        kern_memcpy_d2h(x->dev, s, host, d->g_acc, exec_f32_bytes(p));
        kern_stream_sync(x->dev, s);
    } else {
        memset(host, 0, exec_f32_bytes(p));
    }
}

/* A frozen weight's home, as a fetch copies it (a quantised base's packed
 * bytes, a bf16 home, fp32 weights), widened to fp32 as compute sees it. */
static void frozen_home_to_f32(const eng_param_t *p, const void *home, float *host) {
    if (p->home_q) {
        const mt_quant_view_t v = eng_quant_home_view_at(p->home_q, home);
        mt_dequant(&v, host, MT_F32);
    } else if (p->w_dtype == MT_BF16) {
        mt_convert_to_f32(host, home, MT_BF16, p->spec->numel);
    } else {
        memcpy(host, home, exec_f32_bytes(p));
    }
}

/* Parameter i's frozen home read from the NVMe tier (a LoRA run's base
 * whose block streams its weights from there) into host as fp32. */
static mt_status_t read_nvme_base_home(eng_exec_t *x, int i, float *host, mt_error_t *err) {
    const eng_model_t *m = x->model;
    char *buf = eng_optim_nvme_buffer_alloc(eng_optim_nvme_home_buffer_bytes(m, i));
    MT_CHECK_ALLOC(buf, m->params[i].spec->name);
    const mt_status_t st = eng_optim_nvme_read_homes(x->hopt.nvme, m, &i, 1, buf, err);
    if (st == MT_OK) frozen_home_to_f32(&m->params[i], buf, host);
    eng_optim_nvme_buffer_free(buf);
    return st;
}

/* Parameter i's fp32 master from the NVMe tier. */
static mt_status_t read_nvme_master(eng_exec_t *x, int i, float *host, mt_error_t *err) {
    eng_model_t *m = x->model;
    const mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, m, i, err);
    if (st != MT_OK) return st;
    memcpy(host, m->params[i].host_w, exec_f32_bytes(&m->params[i]));
    return eng_optim_nvme_unload(x->hopt.nvme, m, i, false, err);
}

mt_status_t eng_exec_read_weights(eng_exec_t *x, int i, float *host, mt_error_t *err) {
    eng_exec_drain(x);
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    if (eng_optim_nvme_holds_master(x->hopt.nvme, i)) return read_nvme_master(x, i, host, err);
    if (eng_optim_nvme_holds_base_home(x->hopt.nvme, i)) return read_nvme_base_home(x, i, host, err);
    const float *dev = exec_dev_master(p, d);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    if (p->home_q) {
        mt_dequant(&p->home_q->view, host, MT_F32); /* its bytes or, pending, its sources in the mapping */
    } else if (p->home_bf16) {
        frozen_home_to_f32(p, p->home_bf16, host);
    } else if (p->host_w) {
        memcpy(host, p->host_w, exec_f32_bytes(p));
    } else if (dev) {
        kern_memcpy_d2h(x->dev, s, host, dev, exec_f32_bytes(p));
        kern_stream_sync(x->dev, s);
    } else {
        memset(host, 0, exec_f32_bytes(p));
    }
    return MT_OK;
}

void eng_exec_read_param(eng_exec_t *x, int i, float *host, bool gradient) {
    if (gradient) {
        eng_exec_drain(x);
        read_gradient(x, i, host);
        return;
    }
    /* a save reads through eng_exec_read_weights, or checks every extent
     * it reads first (eng_exec_check_optim_state): failing here is a broken disk */
    mt_error_t err = {0};
    MT_CHECK(eng_exec_read_weights(x, i, host, &err) == MT_OK, "%s", err.msg);
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

/* ---- the staging pool's reports ------------------------------------------ */

moe_staging_t *eng_exec_staging(eng_exec_t *x) { return x->stage.pool; }

size_t eng_exec_offload_bytes(const eng_exec_t *x, int tokens) { return exec_stage_offload_bytes(&x->stage, tokens); }

void eng_exec_staging_info(const eng_exec_t *x, eng_exec_staging_info_t *out) { *out = x->stage.info; }

void eng_exec_staging_counters(const eng_exec_t *x, eng_exec_staging_counters_t *out) { *out = x->cnt.ctr; }

mt_status_t eng_exec_trace_staging(eng_exec_t *x, eng_trace_t *t, double since_s, mt_error_t *err) {
    if (!t || !x->stage.pool) return MT_OK;
    const moe_staging_timeline_t *tl = moe_staging_timeline(x->stage.pool);
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
