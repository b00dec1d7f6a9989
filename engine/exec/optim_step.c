/* The optimizer step under the plan (see optim.h).
 *
 * The global gradient norm is summed over the parameters that have a
 * gradient, in parameter order, in double, from wherever each accumulator
 * lives (the CPU backend's device sum-of-squares is the same function as
 * the host's, so every plan gets the same norm).  AdamW then runs where the
 * plan keeps the optimizer state: the device kernel, or the host kernel
 * over the thread pool on the fp32 master in host memory, after which
 * resident weights are refreshed from the master.  The host optimizer's
 * transfers (device gradients read back, resident weights refreshed) go a
 * block at a time through the staging pool, like every other transfer.
 *
 * Every weight an update writes is checked to be finite right after its
 * block's update, before the next block's (a NaN written into a weight
 * would otherwise be trained on and saved): on the host a scan of the
 * block's masters while they are still in cache, on the device a flag per
 * parameter that the AdamW kernel itself sets when it writes a NaN or Inf
 * (no second pass over the weights, no launch of its own), the flags read
 * back in the step's one copy and sync; only a flagged parameter is read
 * back whole to find the element.
 * Blocks left to the host worker (defer_block) are updated after the step
 * returns: the worker scans each such parameter after its update, and the
 * next step reports what it found before it updates anything (a save
 * scans every weight anyway: engine/run/save.c).
 *
 * The step program never calls in here: eng_optim_begin_step sets the
 * executor's block-ready hook (progress.h), through which the backward
 * hands over blocks whose gradients are complete for host AdamW to start
 * on while it goes on with the blocks below. */
#include "engine/exec/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "base/clock.h"
#include "base/finite.h"
#include "engine/exec/place/copies.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/residency.h"
#include "engine/exec/record/trace.h"
#include "engine/exec/optim_state.h"
#include "engine/exec/xfer.h"
#include "kernels/elementwise.h"
#include "kernels/host/adamw_host.h"

/* ---- idle routed experts (run config idle_experts) ----------------------- */

static bool is_routed_expert(const eng_param_t *p) {
    const eng_param_role_t r = p->spec->role;
    return r == ENG_P_EXP_GATE || r == ENG_P_EXP_UP || r == ENG_P_EXP_DOWN;
}

/* Parameter i (of block b) takes a zero gradient this step, if this device
 * holds its gradient (not another device's expert, expert parallel). */
static void zero_grad_of(eng_exec_t *x, int b, int i, bool *waited) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    if (p->frozen || d->has_grad || exec_ep_foreign(&x->env, p)) return;
    if (x->plan.blocks[b].grads == SCHED_GRADS_DEVICE) {
        if (!d->g_acc) return; /* zero: cleared after every step that wrote it */
    } else {
        if (!d->host_g) return;
        if (!*waited) exec_host_optim_wait_block(&x->hopt, b); /* a deferred update reads it */
        *waited = true;
        memset(d->host_g, 0, p->spec->numel * sizeof(float)); /* may hold an earlier step's */
    }
    d->has_grad = true;
}

/* A trainable routed expert of block b that received no token in this
 * optimizer step gets a zero gradient, as torch's AdamW sees transformers
 * 5's fused expert parameters: it is then stepped like any other parameter
 * (moments decay, step count advances, weight decay moves it), wherever its
 * state lives and on every path (overlapped, deferred, in the step).  So do
 * a LoRA run's factors on an idle expert: PEFT adapts fused experts with
 * one A (r·E, in) and one B (out, r·E) whose expert e slices are expert e's
 * factors, so an idle expert's slices get a zero gradient and are stepped.
 * Done when block b's gradients are complete on the step's last
 * micro-batch, so that the overlapped host AdamW and the devices' gradient
 * union see it.  The norm is unchanged: the gradient is zero. */
static void give_idle_experts_zero_grads(eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    if (!x->hopt.step_idle_experts || !x->prog.in_last_micro) return;
    bool waited = false;
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->block != b || !is_routed_expert(p)) continue;
        zero_grad_of(x, b, i, &waited);
        if (p->lora_a >= 0) zero_grad_of(x, b, p->lora_a, &waited);
        if (p->lora_b >= 0) zero_grad_of(x, b, p->lora_b, &waited);
    }
}

/* ---- the padding row of the embedding ------------------------------------ */

/* Every family moetune trains builds its embedding in transformers as
 * nn.Embedding(vocab, hidden, padding_idx=config.pad_token_id), whose
 * backward leaves that row's gradient zero (AdamW still steps the table:
 * the row's moments decay and weight decay moves it).  The row from
 * config.json as read; -1 when it has none, or when the table is tied to
 * lm_head (one gradient holds both uses there, and lm_head's share of the
 * row is not zero in transformers either). */
static int pad_row_of(const eng_model_t *m) {
    if (m->embed < 0 || m->lm_head == m->embed || !m->cfg.config_json) return -1;
    json_t *root = json_loads(m->cfg.config_json, 0, NULL);
    const json_t *v = root ? json_object_get(root, "pad_token_id") : NULL;
    const long long id = json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(root);
    return id >= 0 && id < m->params[m->embed].spec->shape[0] ? (int)id : -1;
}

/* Zeroes the padding row of the embedding's gradient once block b's are
 * complete (the step's last micro-batch), before the norm and any update,
 * the overlapped host AdamW's included.  Same point on every plan and
 * device, so the norm and the sum over devices see the same zero. */
static void zero_pad_row_grad(eng_exec_t *x, int b) {
    const eng_model_t *m = x->model;
    if (!x->prog.in_last_micro || m->embed < 0 || m->params[m->embed].block != b) return;
    if (x->hopt.pad_row == -2) x->hopt.pad_row = pad_row_of(m);
    const eng_param_t *p = &m->params[m->embed];
    eng_dparam_t *d = &x->dp[m->embed];
    if (x->hopt.pad_row < 0 || p->frozen || !d->has_grad) return;
    const size_t width = (size_t)p->spec->shape[1], off = (size_t)x->hopt.pad_row * width;
    if (x->plan.blocks[b].grads == SCHED_GRADS_DEVICE) {
        if (d->g_acc) kern_memset(x->dev, kern_stream(x->dev, KERN_STREAM_COMPUTE), d->g_acc + off, 0,
                                  width * sizeof(float));
    } else if (d->host_g) {
        kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_D2H)); /* the row's copies have landed */
        memset(d->host_g + off, 0, width * sizeof(float));
    }
}

/* ---- host AdamW, overlapped with backward (host_optim.c) -------------- */

/* The step program's block-ready hook: block b's gradients are complete;
 * on the step's last backward, with the gradients on the host, the
 * worker sums their squares for the norm once they have landed there
 * (the norm is then known as the backward ends), and with the optimizer
 * state on the host too, their update follows.  The
 * backward then goes on only once the update SCHED_NVME_GRAD_LEAD blocks
 * behind is done where that block's state is on the NVMe tier
 * (scheduler/plan.h): the array-bound updates set its pace, and the
 * gradients waiting for them stay few. */
static void block_ready(eng_exec_t *x, int b) {
    const sched_block_plan_t *bp = &x->plan.blocks[b];
    zero_pad_row_grad(x, b);
    give_idle_experts_zero_grads(x, b);
    if (!x->prog.in_last_micro || bp->grads != SCHED_GRADS_HOST) return;
    if (x->prog.norm_ahead) exec_host_optim_enqueue_norm(&x->hopt, b);
    if (!x->prog.overlap || bp->optim != SCHED_OPTIM_HOST) return;
    exec_host_optim_enqueue(&x->hopt, b);
    const int behind = sched_nvme_grad_wait_block(&x->plan, b);
    if (behind >= 0 && x->hopt.nvme) exec_host_optim_wait_overlapped(&x->hopt, behind);
}

void eng_optim_begin_step(eng_exec_t *x, const eng_optim_hparams_t *hp, int micro_batches,
                          bool overlap) {
    /* staging counters and peaks are per step */
    if (x->stage.pool) moe_staging_step_begin(x->stage.pool);
    exec_counters_step_begin(&x->cnt);
    x->micro_left = micro_batches;
    /* with clipping, the overlapped updates are speculative: out of place,
     * undone when the norm clips (not with the NVMe tier, whose moments
     * are written back right after each update) */
    x->prog.overlap = overlap && (hp->max_grad_norm == 0 || (hp->speculative && !x->hopt.nvme));
    x->hopt.speculative = x->prog.overlap && hp->max_grad_norm > 0;
    /* one device: its host gradients are final as they land (several
     * devices sum theirs after the backward) */
    x->prog.norm_ahead = overlap;
    x->prog.block_ready = block_ready;
    x->hopt.step_idle_experts = !hp->skip_idle_experts;
    if (x->prog.overlap || x->prog.norm_ahead) exec_host_optim_start(&x->hopt, hp);
}

/* ---- the gradient norm ---------------------------------------------------- */

/* Each parameter's sum of squares (P floats, to free), where its gradient
 * is: on the host (or already taken by the host worker as it landed: those
 * are counted in *summed_ahead), or on the
 * device, where every one goes into a slot of one small buffer that comes
 * back in one copy and one sync (a GPU step would otherwise sync once per
 * parameter).  NULL when the device buffer cannot be had. */
static float *norm_parts(eng_exec_t *x, int *summed_ahead, mt_error_t *err) {
    const eng_model_t *m = x->model;
    kern_device_t *dev = x->dev;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const int P = m->num_params;
    float *dev_parts = kern_alloc(dev, (size_t)(P > 0 ? P : 1) * sizeof(float), "gradient norm parts", err);
    if (!dev_parts) return NULL;
    const size_t slots = (size_t)(P > 0 ? P : 1);
    float *parts = malloc(slots * sizeof *parts);
    float **outs = malloc(slots * sizeof *outs);
    const float **grads = malloc(slots * sizeof *grads);
    size_t *numels = malloc(slots * sizeof *numels);
    MT_CHECK(parts && outs && grads && numels, "out of memory for the gradient norm parts");
    int on_device = 0;
    for (int i = 0; i < P; i++) {
        const eng_param_t *p = &m->params[i];
        const eng_dparam_t *d = &x->dp[i];
        if (!d->has_grad) continue;
        if (x->hopt.summed[i]) {
            parts[i] = x->hopt.gnorm_part[i];
            ++*summed_ahead;
        } else if (x->plan.blocks[p->block].grads == SCHED_GRADS_HOST) {
            kern_sumsq_host(x->hopt.pool, &parts[i], d->host_g, p->spec->numel);
        } else {
            outs[on_device] = dev_parts + i, grads[on_device] = d->g_acc, numels[on_device] = p->spec->numel;
            on_device++;
        }
    }
    if (on_device) dev->ops->sumsq_many(s, outs, grads, numels, on_device);
    free(outs);
    free(grads);
    free(numels);
    if (on_device) {
        float *back = malloc((size_t)P * sizeof *back);
        MT_CHECK_ALLOC(back, "gradient norm parts");
        kern_memcpy_d2h(dev, s, back, dev_parts, (size_t)P * sizeof(float));
        kern_stream_sync(dev, s);
        for (int i = 0; i < P; i++) {
            const eng_param_t *p = &m->params[i];
            const eng_dparam_t *d = &x->dp[i];
            if (d->has_grad && !x->hopt.summed[i] && x->plan.blocks[p->block].grads != SCHED_GRADS_HOST)
                parts[i] = back[i];
        }
        free(back);
    }
    kern_free(dev, dev_parts);
    memset(x->hopt.summed, 0, (size_t)P * sizeof *x->hopt.summed); /* read: the next step sums anew */
    return parts;
}

/* An update from a NaN or Inf gradient would poison every weight it
 * reaches (clipping too: its factor is 0 or NaN then).  The step is
 * refused, naming the first parameter, in model order, whose gradient's
 * sum of squares is not finite: where the blow-up shows first. */
static mt_status_t refuse_non_finite(const eng_exec_t *x, const float *parts, double norm, mt_error_t *err) {
    const eng_model_t *m = x->model;
    int first = -1;
    for (int i = 0; i < m->num_params && first < 0; i++)
        if (x->dp[i].has_grad && !isfinite(parts[i])) first = i;
    if (first < 0)
        return mt_error_set(err, MT_ERR_DATA,
                            "the gradient norm overflows (each parameter's sum of squares is "
                            "finite, their total is not)");
    return mt_error_set(err, MT_ERR_DATA,
                        "the gradient norm is %s; the first parameter whose gradient is "
                        "non-finite is '%s'",
                        isnan(norm) ? "NaN" : "+Inf", m->params[first].spec->name);
}

/* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), applied when < 1. */
static double clip_scale(const eng_optim_hparams_t *hp, double norm) {
    if (hp->max_grad_norm <= 0) return 1.0;
    const double coef = hp->max_grad_norm / (norm + 1e-6);
    return coef < 1.0 ? coef : 1.0;
}

/* This step's speculative updates (speculate.h) stand when the clipping
 * factor is 1 and the norm finite; otherwise each is undone, its parameter
 * back to what it was before the step, and it runs again below with the
 * real factor, as without speculation. */
static void settle_speculation(eng_exec_t *x, bool undo, eng_optim_stats_t *out) {
    if (!x->hopt.speculative) return;
    out->speculative = true;
    out->speculation_undone = undo;
    for (int i = 0; i < x->model->num_params; i++) {
        if (!x->hopt.done[i]) continue;
        if (!undo) {
            eng_spec_keep(&x->hopt.spec, i);
            continue;
        }
        MT_CHECK(eng_spec_undo(&x->hopt.spec, &x->model->params[i], i, x->hopt.pool),
                 "speculative update of %s without its spare", x->model->params[i].spec->name);
        x->hopt.done[i] = false;
    }
}

/* ---- the updates, block by block ------------------------------------------ */

/* The next step's first blocks start on their way as soon as their own
 * update is done, not when the whole step's is: blocks are updated in
 * order, so block 0's weights cross the link while the host AdamW of the
 * layers above it still runs (the copy stream reads only this block's
 * final home copies).  The fetch counts in the next step (counters.h). */
static mt_status_t prefetch_next_step(eng_exec_t *x, int b, mt_error_t *err) {
    x->cnt.between_steps = true;
    const mt_status_t st = exec_fetch_block(&x->res, b, false, err);
    x->cnt.between_steps = false;
    return st;
}

/* A streamed block whose gradients and AdamW state are on the host: its
 * update runs on the host optimizer's worker while the next step begins,
 * and only that block's next fetch or gradient waits for it
 * (exec_host_optim_wait_block), not the whole step.  False when the block
 * is not one, or was already updated during backward: then it is updated
 * here like any other. */
static bool defer_block(eng_exec_t *x, int b, const eng_optim_hparams_t *hp, const kern_adamw_params_t *base,
                        eng_optim_stats_t *out, bool *deferred) {
    const eng_model_t *m = x->model;
    const sched_block_plan_t *bp = &x->plan.blocks[b];
    if (x->prog.finish_updates_in_step || bp->optim != SCHED_OPTIM_HOST || bp->grads != SCHED_GRADS_HOST ||
        bp->weights != SCHED_WEIGHTS_STREAM)
        return false;
    bool any = false, overlapped = false;
    for (int i = 0; i < m->num_params; i++) {
        if (m->params[i].block != b || !x->dp[i].has_grad) continue;
        any = true;
        overlapped |= x->hopt.done[i]; /* already updated during backward */
    }
    if (overlapped) return false;
    for (int i = 0; i < m->num_params; i++) {
        if (m->params[i].block != b) continue;
        if (x->dp[i].has_grad) out->updated++;
        else out->skipped++;
    }
    if (any) exec_host_optim_defer(&x->hopt, b, hp, base);
    deferred[b] = any;
    return true;
}

/* The overlapped updates the host worker has not reached by the time the
 * backward is done, of blocks whose update can run into the next step
 * (defer_block's; none with the NVMe tier, whose reads and writes the
 * simulator orders with the walk's): taken back, to be deferred below
 * with the norm known, so they overlap the next step's forward instead of
 * holding up this step's end; a speculative one then runs in place with
 * the real clipping factor, as without speculation.  The simulator does
 * the same (sim_settle_overlapped).  Returns how many. */
static int take_back_unstarted(eng_exec_t *x) {
    if (!x->prog.overlap || x->prog.finish_updates_in_step || x->hopt.nvme) return 0;
    bool *take = calloc((size_t)x->nb, sizeof *take);
    MT_CHECK_ALLOC(take, "optimizer block flags");
    for (int b = 0; b < x->nb; b++) {
        const sched_block_plan_t *bp = &x->plan.blocks[b];
        take[b] = bp->optim == SCHED_OPTIM_HOST && bp->grads == SCHED_GRADS_HOST && bp->weights == SCHED_WEIGHTS_STREAM;
    }
    const int n = exec_host_optim_take_back(&x->hopt, take);
    free(take);
    return n;
}

/* Host AdamW reads device-accumulated gradients from host memory: block
 * b's, in one batch through items. */
static mt_status_t read_device_grads(eng_exec_t *x, int b, moe_staging_xfer_t *items, mt_error_t *err) {
    const eng_model_t *m = x->model;
    int n = 0;
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (p->block != b || !d->has_grad || x->hopt.done[i]) continue;
        items[n++] = (moe_staging_xfer_t){d->host_g, d->g_acc, exec_f32_bytes(p),
                                          d->host_g_pinned ? MOE_STAGING_PINNED : MOE_STAGING_COPY};
        x->cnt.ctr.grad_d2h_bytes += exec_f32_bytes(p);
    }
    char tag[64];
    snprintf(tag, sizeof tag, "gradients of block %d for the host optimizer", b);
    const mt_status_t st = exec_stage_d2h(x, items, n, tag, err);
    if (n > 0) kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_D2H));
    return st;
}

/* Parameter i's AdamW step on the device, as *item for a batch that
 * kern_adamw_many runs.  Its moments are made, zeroed, at its first step
 * (lazily, as torch creates state); a bf16 working copy is rewritten from
 * the new master in the same pass, and *nonfinite (device memory) set when
 * a written master value is NaN or Inf. */
static mt_status_t device_adamw(eng_exec_t *x, int i, const kern_adamw_params_t *base, int *nonfinite,
                                kern_adamw_item_t *item, mt_error_t *err) {
    kern_device_t *dev = x->dev;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t numel = p->spec->numel;
    const size_t bytes = eng_param_moments_bytes(p);
    kern_adamw_params_t ap = *base;
    ap.step = ++p->step;
    ap.nonfinite = nonfinite;
    if (!d->mom) {
        char t[200];
        snprintf(t, sizeof t, "AdamW moments (%s) of %s", kern_moments_fmt_name((kern_moments_fmt_t)p->mom_fmt),
                 p->spec->name);
        d->mom = kern_alloc_lasting(dev, bytes, t, err);
        if (!d->mom) return err->code;
        kern_memset(dev, s, d->mom, 0, bytes); /* zeros in every format (8-bit: scales 0) */
    }
    *item = (kern_adamw_item_t){.p = exec_dev_master(p, d), .mom = eng_param_moments_view(p, d->mom), .g = d->g_acc,
                                .p_bf16 = p->w_dtype == MT_BF16 ? (uint16_t *)d->w : NULL, .n = numel, .hp = ap};
    return MT_OK;
}

/* The updated weights' check (see the note at the top): per parameter,
 * whether it holds a NaN or Inf. */
typedef struct {
    int *dev_flags;  /* P device ints, zeroed: set by the AdamW kernel of a device-updated master */
    bool *on_device; /* flag i was given to an update */
    bool *bad;       /* parameter i holds a non-finite value */
    bool any_device;
} finite_check_t;

static mt_status_t finite_check_init(finite_check_t *fc, eng_exec_t *x, mt_error_t *err) {
    const size_t P = (size_t)(x->model->num_params > 0 ? x->model->num_params : 1);
    *fc = (finite_check_t){0};
    fc->on_device = calloc(P, sizeof *fc->on_device);
    fc->bad = calloc(P, sizeof *fc->bad);
    MT_CHECK(fc->on_device && fc->bad, "out of memory for the updated weights' check");
    fc->dev_flags = kern_alloc(x->dev, P * sizeof(int), "updated weights' check", err);
    if (!fc->dev_flags) return err->code;
    kern_memset(x->dev, kern_stream(x->dev, KERN_STREAM_COMPUTE), fc->dev_flags, 0, P * sizeof(int));
    return MT_OK;
}

static void finite_check_free(finite_check_t *fc, eng_exec_t *x) {
    if (fc->dev_flags) kern_free(x->dev, fc->dev_flags);
    free(fc->on_device);
    free(fc->bad);
}

/* Parameter i was just updated: a host master's answer is the host
 * kernel's fused check (exec_host_adamw; only a flagged parameter is
 * scanned, for the element to name), a device master's is its flag, which
 * device_adamw gave the kernel. */
static void finite_check_param(finite_check_t *fc, eng_exec_t *x, int i, bool on_device) {
    if (!on_device) {
        fc->bad[i] = x->hopt.wrote_nonfinite[i];
        return;
    }
    fc->on_device[i] = true;
    fc->any_device = true;
}

/* The first parameter, in model order, that an update left with a NaN or
 * Inf: an error naming it and the element, with out->weights_nonfinite set. */
/* The error for parameter i holding w[at], non-finite, after an update. */
static mt_status_t nonfinite_weight(const eng_param_spec_t *ps, const float *w, size_t at, const char *when,
                                    const eng_optim_hparams_t *hp, eng_optim_stats_t *out, mt_error_t *err) {
    char where[160], with[96] = "";
    mt_index_to_str(where, sizeof where, at, ps->ndim, ps->shape);
    if (hp) snprintf(with, sizeof with, " (learning_rate %g, adam_epsilon %g)", hp->lr, hp->eps);
    out->weights_nonfinite = true;
    return mt_error_set(err, MT_ERR_DATA, "the AdamW update%s left parameter '%s' %s at %s%s; its weights are no "
                        "longer usable",
                        when, ps->name, mt_nonfinite_name(w[at]), where, with);
}

/* What the host worker found after the previous step's deferred updates. */
static mt_status_t deferred_check(eng_exec_t *x, eng_optim_stats_t *out, mt_error_t *err) {
    if (eng_optim_nvme_error(x->hopt.nvme, err) != MT_OK) return err->code; /* the NVMe tier failed */
    const int i = x->hopt.nonfinite_param;
    if (i < 0) return MT_OK;
    const eng_param_spec_t *ps = x->model->params[i].spec;
    float *w = malloc(ps->numel * sizeof *w);
    MT_CHECK_ALLOC(w, ps->name);
    eng_exec_read_param(x, i, w, false); /* its master, wherever it lives */
    const size_t at = mt_first_nonfinite_f32(w, ps->numel);
    /* no learning rate named: the update ran with the previous step's */
    const mt_status_t st = nonfinite_weight(ps, w, at, " of the previous step", NULL, out, err);
    free(w);
    return st;
}

static mt_status_t finite_check_finish(finite_check_t *fc, eng_exec_t *x, const eng_optim_hparams_t *hp,
                                       eng_optim_stats_t *out, mt_error_t *err) {
    const eng_model_t *m = x->model;
    const int P = m->num_params;
    if (fc->any_device) {
        int *back = malloc((size_t)(P > 0 ? P : 1) * sizeof *back);
        MT_CHECK_ALLOC(back, "updated weights' check");
        kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
        kern_memcpy_d2h(x->dev, s, back, fc->dev_flags, (size_t)P * sizeof(int));
        kern_stream_sync(x->dev, s);
        for (int i = 0; i < P; i++)
            if (fc->on_device[i]) fc->bad[i] = back[i] != 0;
        free(back);
    }
    for (int i = 0; i < P; i++) {
        if (!fc->bad[i]) continue;
        const eng_param_spec_t *ps = m->params[i].spec;
        float *w = malloc(ps->numel * sizeof *w);
        MT_CHECK_ALLOC(w, ps->name);
        eng_exec_read_param(x, i, w, false);
        const size_t at = mt_first_nonfinite_f32(w, ps->numel);
        if (at == MT_ALL_FINITE) { /* finite after all: nothing to refuse */
            free(w);
            continue;
        }
        const mt_status_t st = nonfinite_weight(ps, w, at, "", hp, out, err);
        free(w);
        return st;
    }
    return MT_OK;
}

/* AdamW on block b's parameters that have a gradient, where the plan keeps
 * their state (unless the overlapped AdamW did it during backward): the
 * device's as one batch (adam[], room for every parameter); the resident
 * working copies a host optimizer updated go to items[*n..], to be
 * refreshed from the new master. */
static mt_status_t update_block(eng_exec_t *x, int b, const kern_adamw_params_t *base, moe_staging_xfer_t *items,
                                int *n, kern_adamw_item_t *adam, eng_optim_stats_t *out, finite_check_t *fc,
                                mt_error_t *err) {
    const eng_model_t *m = x->model;
    const sched_block_plan_t *bp = &x->plan.blocks[b];
    const bool refresh = bp->optim == SCHED_OPTIM_HOST && bp->weights == SCHED_WEIGHTS_RESIDENT;
    int on_device = 0;
    mt_status_t st = MT_OK;
    /* the host updates first, all at once: on a host with several NUMA
     * nodes each runs on its home node's cores, every node together */
    int host_n = 0, host_done = 0;
    if (bp->optim == SCHED_OPTIM_HOST) {
        int *idx = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *idx);
        MT_CHECK_ALLOC(idx, "host optimizer parameter list");
        for (int i = 0; i < m->num_params; i++)
            if (m->params[i].block == b && x->dp[i].has_grad && !x->hopt.done[i]) idx[host_n++] = i;
        st = exec_host_adamw_params(&x->hopt, idx, host_n, base, &host_done, err);
        free(idx);
    }
    int host_seen = 0; /* of those, the ones the loop below has reached */
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (p->block != b) continue;
        if (!d->has_grad) {
            out->skipped++;
            continue;
        }
        if (x->hopt.done[i]) { /* updated while backward ran */
            out->updated++;
            x->hopt.done[i] = false;
            out->updated_during_backward++;
        } else if (bp->optim == SCHED_OPTIM_DEVICE) {
            if (st != MT_OK) break;
            out->updated++;
            st = device_adamw(x, i, base, fc->dev_flags + i, &adam[on_device], err);
            if (st != MT_OK) break;
            on_device++;
        } else {
            if (host_seen++ >= host_done) break; /* the NVMe tier failed here: err says how */
            out->updated++;
        }
        finite_check_param(fc, x, i, bp->optim == SCHED_OPTIM_DEVICE);
        if (refresh && d->w) { /* none: another device's expert (expert parallel) */
            items[(*n)++] = exec_w_refresh_item(p, d->w);
            x->cnt.ctr.weight_h2d_bytes += exec_w_bytes(p);
        }
    }
    /* the ones made ready run even when a later one failed: their steps are counted */
    if (on_device) x->dev->ops->adamw_many(kern_stream(x->dev, KERN_STREAM_COMPUTE), adam, on_device);
    return st;
}

/* Every block's update, in block order, so the host optimizer's copies
 * move as one batch each; deferred[b] is set for blocks left to the
 * worker (defer_block). */
static mt_status_t update_blocks(eng_exec_t *x, const eng_optim_hparams_t *hp, const kern_adamw_params_t *base,
                                 eng_optim_stats_t *out, bool *deferred, mt_error_t *err) {
    const eng_model_t *m = x->model;
    moe_staging_xfer_t *items = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *items);
    kern_adamw_item_t *adam = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *adam);
    MT_CHECK(items && adam, "out of memory for the optimizer's transfers and updates");
    finite_check_t fc;
    mt_status_t st = finite_check_init(&fc, x, err);
    bool refreshed = false;
    for (int b = 0; b < x->nb && st == MT_OK; b++) {
        const sched_block_plan_t *bp = &x->plan.blocks[b];
        if (defer_block(x, b, hp, base, out, deferred)) {
            /* waits for this block's update only */
            if (b <= x->plan.prefetch_window) st = prefetch_next_step(x, b, err);
            continue;
        }
        if (bp->optim == SCHED_OPTIM_HOST && bp->grads == SCHED_GRADS_DEVICE) st = read_device_grads(x, b, items, err);
        int n = 0;
        if (st == MT_OK) st = update_block(x, b, base, items, &n, adam, out, &fc, err);
        /* resident weights take the new master values */
        char tag[64];
        snprintf(tag, sizeof tag, "weights of block %d after the host optimizer", b);
        if (st == MT_OK) st = exec_stage_h2d(x, items, n, tag, err);
        refreshed |= n > 0;
        if (st == MT_OK && b <= x->plan.prefetch_window) st = prefetch_next_step(x, b, err);
    }
    free(items);
    free(adam);
    if (refreshed) kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_H2D));
    if (st == MT_OK) st = finite_check_finish(&fc, x, hp, out, err);
    finite_check_free(&fc, x);
    return st;
}

/* Ready for the next step's first micro-batch: accumulators zeroed and
 * flags cleared, except in deferred blocks, whose worker clears them after
 * the update. */
static void clear_grads(eng_exec_t *x, const bool *deferred) {
    const eng_model_t *m = x->model;
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const size_t slots = (size_t)(m->num_params > 0 ? m->num_params : 1);
    float **acc = malloc(slots * sizeof *acc);
    size_t *numel = malloc(slots * sizeof *numel);
    MT_CHECK(acc && numel, "out of memory for the gradient accumulators' list");
    int n = 0;
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (deferred[p->block]) continue;
        if (d->g_acc && d->acc_has_data) acc[n] = d->g_acc, numel[n++] = p->spec->numel;
        d->has_grad = false;
        d->acc_has_data = false;
    }
    if (n) x->dev->ops->zero_many(s, acc, numel, n); /* one launch per 64 of them */
    free(acc);
    free(numel);
    kern_stream_sync(x->dev, s);
}

/* ---- the step ----------------------------------------------------------- */

mt_status_t eng_optim_step(eng_exec_t *x, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                           mt_error_t *err) {
    const double t0 = mt_now_s();
    memset(out, 0, sizeof *out);
    /* every gradient has landed, and with it every overlapped update is
     * queued (from the D2H stream); those not started are taken back before
     * the drain waits for the rest */
    kern_device_sync(x->dev);
    out->taken_back = take_back_unstarted(x);
    eng_exec_drain(x);
    if (deferred_check(x, out, err) != MT_OK) {
        x->prog.overlap = false;
        x->micro_left = 0;
        return err->code;
    }

    /* one double sum in parameter order: the same norm wherever the gradients were */
    float *parts = norm_parts(x, &out->summed_ahead, err);
    if (!parts) return err->code;
    double total = 0;
    for (int i = 0; i < x->model->num_params; i++)
        if (x->dp[i].has_grad) total += parts[i];
    out->grad_norm = sqrt(total);
    out->clip_scale = isfinite(total) ? clip_scale(hp, out->grad_norm) : 0;
    settle_speculation(x, !isfinite(total) || out->clip_scale < 1.0, out);
    if (!isfinite(total)) {
        const mt_status_t st = refuse_non_finite(x, parts, out->grad_norm, err);
        free(parts);
        x->prog.overlap = false;
        x->micro_left = 0;
        return st;
    }
    free(parts);
    const kern_adamw_params_t base = exec_adamw_params(hp, out->clip_scale);

    bool *deferred = calloc((size_t)x->nb, sizeof *deferred);
    MT_CHECK_ALLOC(deferred, "optimizer block flags");
    const mt_status_t st = update_blocks(x, hp, &base, out, deferred, err);
    if (st == MT_OK) clear_grads(x, deferred);
    free(deferred);
    if (st != MT_OK) return st;
    if (x->trace) eng_trace_span(x->trace, ENG_TRACK_HOST_OPTIM, "optimizer step", "optimizer", t0, mt_now_s(), 0);
    x->prog.overlap = false;
    x->micro_left = 0;
    out->optim_wall_s = mt_now_s() - t0;
    return MT_OK;
}
