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
 * The step program never calls in here: eng_optim_begin_step sets the
 * executor's block-ready hook (progress.h), through which the backward
 * hands over blocks whose gradients are complete for host AdamW to start
 * on while it goes on with the blocks below. */
#include "engine/exec/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "engine/exec/copies.h"
#include "engine/exec/counters.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/exec/host_optim.h"
#include "engine/exec/residency.h"
#include "engine/exec/trace.h"
#include "engine/exec/xfer.h"
#include "kernels/elementwise.h"

/* ---- host AdamW, overlapped with backward (host_optim.c) -------------- */

/* The step program's block-ready hook: block b's gradients are complete;
 * on the step's last backward, with the optimizer state and the gradients
 * on the host, its update starts once they have landed there. */
static void block_ready(eng_exec_t *x, int b) {
    const sched_block_plan_t *bp = &x->plan.blocks[b];
    if (!x->prog.overlap || !x->prog.in_last_micro || bp->optim != SCHED_OPTIM_HOST ||
        bp->grads != SCHED_GRADS_HOST)
        return;
    exec_host_optim_enqueue(&x->hopt, b);
}

void eng_optim_begin_step(eng_exec_t *x, const eng_optim_hparams_t *hp, int micro_batches,
                          bool overlap) {
    /* staging counters and peaks are per step */
    if (x->stage.pool) moe_staging_step_begin(x->stage.pool);
    exec_counters_step_begin(&x->cnt);
    x->micro_left = micro_batches;
    x->prog.overlap = overlap && hp->max_grad_norm == 0;
    x->prog.block_ready = block_ready;
    if (x->prog.overlap) exec_host_optim_start(&x->hopt, hp);
}

/* ---- the step ----------------------------------------------------------- */

mt_status_t eng_optim_step(eng_exec_t *x, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                           mt_error_t *err) {
    eng_model_t *m = x->model;
    kern_device_t *dev = x->dev;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const double t0 = mt_now_s();
    memset(out, 0, sizeof *out);
    eng_exec_drain(x); /* every gradient has landed */
    exec_host_optim_wait(&x->hopt);

    /* Each parameter's sum of squares, where its gradient is: on the host
     * (or already taken by the overlapped AdamW), or on the device, where
     * every one goes into a slot of one small buffer that comes back in one
     * copy and one sync (a GPU step would otherwise sync once per
     * parameter).  Then one double sum in parameter order: the same norm
     * wherever the gradients were. */
    const int P = m->num_params;
    float *dev_parts = kern_alloc(dev, (size_t)(P > 0 ? P : 1) * sizeof(float), "gradient norm parts", err);
    if (!dev_parts) return err->code;
    float *parts = malloc((size_t)(P > 0 ? P : 1) * sizeof *parts);
    MT_CHECK_ALLOC(parts, "gradient norm parts");
    bool any_device = false;
    for (int i = 0; i < P; i++) {
        const eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (!d->has_grad) continue;
        if (x->hopt.done[i]) {
            parts[i] = x->hopt.gnorm_part[i];
        } else if (x->plan.blocks[p->block].grads == SCHED_GRADS_HOST) {
            kern_sumsq_cpu(NULL, &parts[i], d->host_g, p->spec->numel);
        } else {
            dev->ops->sumsq(s, dev_parts + i, d->g_acc, p->spec->numel);
            any_device = true;
        }
    }
    if (any_device) {
        float *back = malloc((size_t)P * sizeof *back);
        MT_CHECK_ALLOC(back, "gradient norm parts");
        kern_memcpy_d2h(dev, s, back, dev_parts, (size_t)P * sizeof(float));
        kern_stream_sync(dev, s);
        for (int i = 0; i < P; i++) {
            const eng_param_t *p = &m->params[i];
            eng_dparam_t *d = &x->dp[i];
            if (d->has_grad && !x->hopt.done[i] && x->plan.blocks[p->block].grads != SCHED_GRADS_HOST) parts[i] = back[i];
        }
        free(back);
    }
    kern_free(dev, dev_parts);
    double total = 0;
    for (int i = 0; i < P; i++)
        if (x->dp[i].has_grad) total += parts[i];
    out->grad_norm = sqrt(total);
    if (!isfinite(total)) {
        /* An update from a NaN or Inf gradient would poison every weight it
         * reaches (clipping too: its factor is 0 or NaN then).  Refuse the
         * step and name the first parameter, in model order, whose
         * gradient's sum of squares is not finite: where the blow-up shows
         * first. */
        int first = -1;
        for (int i = 0; i < P && first < 0; i++)
            if (x->dp[i].has_grad && !isfinite(parts[i])) first = i;
        free(parts);
        x->prog.overlap = false;
        x->micro_left = 0;
        if (first < 0)
            return mt_error_set(err, MT_ERR_DATA,
                                "the gradient norm overflows (each parameter's sum of squares is "
                                "finite, their total is not)");
        return mt_error_set(err, MT_ERR_DATA,
                            "the gradient norm is %s; the first parameter whose gradient is "
                            "non-finite is '%s'",
                            isnan(out->grad_norm) ? "NaN" : "+Inf", m->params[first].spec->name);
    }
    free(parts);
    out->clip_scale = 1.0;
    if (hp->max_grad_norm > 0) {
        /* torch.nn.utils.clip_grad_norm_: max_norm / (norm + 1e-6), applied when < 1 */
        const double coef = hp->max_grad_norm / (out->grad_norm + 1e-6);
        if (coef < 1.0) out->clip_scale = coef;
    }
    const kern_adamw_params_t base = exec_adamw_params(hp, out->clip_scale);

    /* block by block, so the host optimizer's copies move as one batch each */
    moe_staging_xfer_t *items = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *items);
    MT_CHECK_ALLOC(items, "optimizer transfers");
    mt_status_t st = MT_OK;
    bool refreshed = false;
    bool *deferred = calloc((size_t)x->nb, sizeof *deferred);
    MT_CHECK_ALLOC(deferred, "optimizer block flags");
    for (int b = 0; b < x->nb && st == MT_OK; b++) {
        const sched_block_plan_t *bp = &x->plan.blocks[b];
        char tag[64];
        int n = 0;
        /* A streamed block whose gradients and AdamW state are on the host:
         * its update runs on the host optimizer's worker while the next
         * step begins, and only that block's next fetch or gradient waits
         * for it (exec_host_optim_wait_block), not the whole step. */
        if (!x->prog.finish_updates_in_step && bp->optim == SCHED_OPTIM_HOST && bp->grads == SCHED_GRADS_HOST &&
            bp->weights == SCHED_WEIGHTS_STREAM) {
            bool any = false, overlapped = false;
            for (int i = 0; i < m->num_params; i++) {
                const eng_param_t *p = &m->params[i];
                eng_dparam_t *d = &x->dp[i];
                if (p->block != b || !d->has_grad) continue;
                any = true;
                overlapped |= x->hopt.done[i]; /* already updated during backward */
            }
            if (!overlapped) {
                for (int i = 0; i < m->num_params; i++) {
                    if (m->params[i].block != b) continue;
                    if (x->dp[i].has_grad) out->updated++;
                    else out->skipped++;
                }
                if (any) exec_host_optim_defer(&x->hopt, b, hp, &base);
                deferred[b] = any;
                if (b <= x->plan.prefetch_window) { /* waits for this block's update only */
                    x->cnt.between_steps = true;
                    st = exec_fetch_block(&x->res, b, false, err);
                    x->cnt.between_steps = false;
                }
                continue;
            }
        }
        /* host AdamW reads device-accumulated gradients from host memory */
        if (bp->optim == SCHED_OPTIM_HOST && bp->grads == SCHED_GRADS_DEVICE) {
            for (int i = 0; i < m->num_params; i++) {
                eng_param_t *p = &m->params[i];
                eng_dparam_t *d = &x->dp[i];
                if (p->block != b || !d->has_grad || x->hopt.done[i]) continue;
                items[n++] = (moe_staging_xfer_t){d->host_g, d->g_acc, exec_f32_bytes(p), MOE_STAGING_COPY};
                x->cnt.ctr.grad_d2h_bytes += exec_f32_bytes(p);
            }
            snprintf(tag, sizeof tag, "gradients of block %d for the host optimizer", b);
            st = exec_stage_d2h(x, items, n, tag, err);
            if (n > 0) kern_stream_sync(dev, kern_stream(dev, KERN_STREAM_D2H));
        }
        n = 0;
        for (int i = 0; i < m->num_params && st == MT_OK; i++) {
            eng_param_t *p = &m->params[i];
            eng_dparam_t *d = &x->dp[i];
            if (p->block != b) continue;
            if (!d->has_grad) {
                out->skipped++;
                continue;
            }
            const size_t numel = p->spec->numel, bytes = numel * sizeof(float);
            const bool refresh = bp->optim == SCHED_OPTIM_HOST && bp->weights == SCHED_WEIGHTS_RESIDENT;
            out->updated++;
            if (x->hopt.done[i]) { /* updated while backward ran */
                x->hopt.done[i] = false;
                out->updated_during_backward++;
            } else if (bp->optim == SCHED_OPTIM_DEVICE) {
                kern_adamw_params_t ap = base;
                ap.step = ++p->step;
                if (!d->m) { /* lazily, as torch creates state on the first step */
                    char t[200];
                    snprintf(t, sizeof t, "AdamW m of %s", p->spec->name);
                    d->m = kern_alloc_lasting(dev, bytes, t, err);
                    snprintf(t, sizeof t, "AdamW v of %s", p->spec->name);
                    if (d->m) d->v = kern_alloc_lasting(dev, bytes, t, err);
                    if (!d->m || !d->v) {
                        free(items);
                        return err->code;
                    }
                    kern_memset(dev, s, d->m, 0, bytes);
                    kern_memset(dev, s, d->v, 0, bytes);
                }
                /* a bf16 working copy is rewritten from the new master in the same pass */
                dev->ops->adamw(s, exec_dev_master(p, d), d->m, d->v, d->g_acc, NULL,
                                p->w_dtype == MT_BF16 ? (uint16_t *)d->w : NULL, numel, &ap);
            } else {
                exec_host_adamw(x->hopt.pool, p, d->host_g, &base);
            }
            if (refresh && d->w) { /* none: another device's expert (expert parallel) */
                items[n++] = (moe_staging_xfer_t){p->host_w, d->w, exec_w_bytes(p), exec_w_upload_op(p)};
                x->cnt.ctr.weight_h2d_bytes += exec_w_bytes(p);
            }
        }
        /* resident weights take the new master values */
        snprintf(tag, sizeof tag, "weights of block %d after the host optimizer", b);
        if (st == MT_OK) st = exec_stage_h2d(x, items, n, tag, err);
        refreshed |= n > 0;
        /* The next step's first blocks start on their way as soon as their
         * own update is done, not when the whole step's is: blocks are
         * updated in order, so block 0's weights cross the link while the
         * host AdamW of the layers above it still runs (the copy stream
         * reads only this block's final home copies). */
        if (st == MT_OK && b <= x->plan.prefetch_window) {
            x->cnt.between_steps = true;
            st = exec_fetch_block(&x->res, b, false, err);
            x->cnt.between_steps = false;
        }
    }
    free(items);
    if (refreshed) kern_stream_sync(dev, kern_stream(dev, KERN_STREAM_H2D));
    if (st != MT_OK) {
        free(deferred);
        return st;
    }
    /* ready for the next step's first micro-batch */
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (deferred[p->block]) continue; /* the worker clears them after the update */
        if (d->g_acc && d->acc_has_data) kern_memset(dev, s, d->g_acc, 0, p->spec->numel * sizeof(float));
        d->has_grad = false;
        d->acc_has_data = false;
    }
    free(deferred);
    kern_stream_sync(dev, s);
    if (x->trace) eng_trace_span(x->trace, ENG_TRACK_HOST_OPTIM, "optimizer step", "optimizer", t0, mt_now_s(), 0);
    x->prog.overlap = false;
    x->micro_left = 0;
    out->optim_wall_s = mt_now_s() - t0;
    return MT_OK;
}
