/* Data parallel step prediction (see data_parallel.h). */
#include "scheduler/data_parallel.h"

#include <stdlib.h>
#include <string.h>

#include "scheduler/simulate.h"

static bool optimizer_task(sched_task_kind_t k) {
    return k == SCHED_TASK_NORM || k == SCHED_TASK_ADAM || k == SCHED_TASK_W_UPDATE;
}

mt_status_t sched_dp_predict(const sched_workload_t *w, const sched_plan_t *plan, int devices, double host_bw,
                             sched_dp_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (devices < 1) return mt_error_set(err, MT_ERR_CONFIG, "devices: %d; expected at least 1", devices);
    for (int b = 0; b < plan->num_blocks; b++)
        if (plan->blocks[b].expert_parallel && devices != SCHED_EP_DEVICES)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "parallel: expert splits a layer's experts between %d devices; this plan is for %d",
                                SCHED_EP_DEVICES, devices);
    out->devices = devices;
    out->micro_per_device = w->grad_accum;
    /* several devices finish every update in the step (engine/parallel/devices.c) */
    const sched_sim_opts_t so = {.tasks = true, .updates_in_step = devices > 1};
    sched_sim_result_t sim;
    mt_status_t st = sched_simulate(w, plan, &so, &sim, err);
    if (st != MT_OK) return st;
    double opt_busy[SCHED_RES_COUNT] = {0};
    for (int i = 0; i < sim.num_tasks; i++) {
        const sched_task_t *t = &sim.tasks[i];
        if (optimizer_task(t->kind)) {
            opt_busy[t->res] += t->end - t->start;
            if (t->kind == SCHED_TASK_W_UPDATE && t->res == SCHED_RES_H2D) out->h2d_bytes[0] += t->bytes;
            if (t->kind == SCHED_TASK_W_UPDATE && t->res == SCHED_RES_D2H) out->d2h_bytes[0] += t->bytes;
            continue;
        }
        if (t->end > out->fwd_bwd_s) out->fwd_bwd_s = t->end;
        if (t->res == SCHED_RES_H2D) {
            out->h2d_bytes[0] += t->bytes;
            out->h2d_bytes[1] += t->bytes;
        } else if (t->res == SCHED_RES_D2H) {
            out->d2h_bytes[0] += t->bytes;
            out->d2h_bytes[1] += t->bytes;
        }
    }
    for (int r = 0; r < SCHED_RES_COUNT; r++)
        if (opt_busy[r] > out->optim_s) out->optim_s = opt_busy[r];
    out->host_optim_s = opt_busy[SCHED_RES_HOST];
    memcpy(out->peak, sim.peak, sizeof out->peak);
    out->peer_bytes = sim.peer_bytes;
    /* symmetric shares: every device holds what device 0's simulation does */
    out->peak_device[0] = out->peak_device[1] = sim.peak[SCHED_MEM_DEVICE];
    for (int b = 0; b < w->num_blocks; b++) out->expert_parallel_blocks += plan->blocks[b].expert_parallel;
    sched_sim_result_free(&sim);
    if (devices == 1) {
        out->step_s = out->fwd_bwd_s + out->optim_s;
        out->tokens_per_s = out->step_s > 0 ? w->tokens_per_step / out->step_s : 0;
        return MT_OK;
    }
    double refresh_h2d = 0, refresh_d2h = 0, refresh_h2d_copies = 0, refresh_d2h_copies = 0;
    double other_adam_host_s = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        const sched_block_plan_t *bp = &plan->blocks[b];
        const sched_block_cost_t *c = sched_block_cost(w, b, bp->expert_parallel);
        /* an expert parallel block's own experts have one owner: only its
         * replicated tensors' gradients are summed */
        const double replicated = c->grad_bytes - c->owned_grad_bytes;
        if (bp->grads == SCHED_GRADS_DEVICE) out->reduce_device_bytes += replicated;
        else out->reduce_host_bytes += replicated;
        /* the other device's experts are updated on the one host too */
        if (bp->optim == SCHED_OPTIM_HOST) other_adam_host_s += c->owned_adam_host_s;
        if (bp->weights != SCHED_WEIGHTS_RESIDENT || c->grad_bytes <= 0) continue;
        if (bp->optim == SCHED_OPTIM_HOST) {
            /* the other device's copy of the replicated tensors and of its
             * own experts: as many bytes as device 0's update */
            refresh_h2d += c->w_update_bytes;
            refresh_h2d_copies += c->w_update_copies;
        } else if (c->w_update_bytes - c->owned_w_update_bytes > 0) {
            /* device AdamW: device 0's updated working copies (the trainable
             * tensors the step updated, as engine/parallel/devices.c refreshes:
             * not a LoRA block's frozen base) brought to the host once and
             * sent on; an expert parallel block's owners update their own
             * experts in place at the same time */
            refresh_d2h += c->w_update_bytes - c->owned_w_update_bytes;
            refresh_h2d += c->w_update_bytes - c->owned_w_update_bytes;
            refresh_d2h_copies += 1;
            refresh_h2d_copies += 1;
        }
    }
    const double n = devices;
    const double link = w->h2d_bw < w->d2h_bw ? w->h2d_bw : w->d2h_bw;
    if (link > 0) out->reduce_s += 2.0 * (n - 1) / n * out->reduce_device_bytes / link;
    if (host_bw > 0) out->reduce_s += (n - 1) * 3.0 * out->reduce_host_bytes / host_bw;
    /* the host optimizer is one resource: the other device's experts' updates queue on it */
    if (out->host_optim_s + other_adam_host_s > out->optim_s) out->optim_s = out->host_optim_s + other_adam_host_s;
    out->refresh_s = sched_transfer_time(w, false, refresh_d2h, refresh_d2h_copies) +
                     sched_transfer_time(w, true, refresh_h2d, refresh_h2d_copies);
    out->h2d_bytes[1] += refresh_h2d;
    out->d2h_bytes[0] += refresh_d2h;
    /* the allreduce's traffic goes over each device's link both ways */
    const double ar = 2.0 * (n - 1) / n * out->reduce_device_bytes;
    for (int d = 0; d < 2; d++) {
        out->h2d_bytes[d] += ar;
        out->d2h_bytes[d] += ar;
    }
    out->step_s = out->fwd_bwd_s + out->reduce_s + out->optim_s + out->refresh_s;
    out->tokens_per_s = out->step_s > 0 ? n * w->tokens_per_step / out->step_s : 0;
    return MT_OK;
}

/* ---- data or expert parallel per MoE layer ------------------------------- */

static bool fits(const sched_dp_result_t *r, const double *budget) {
    for (int m = 0; m < SCHED_MEM_COUNT; m++)
        if (budget[m] > 0 && r->peak[m] > budget[m]) return false;
    return true;
}

/* faster, and within the budgets if the other is */
static bool better(const sched_dp_result_t *a, bool fa, const sched_dp_result_t *b, bool fb) {
    if (fa != fb) return fa;
    return a->step_s < b->step_s * (1 - 1e-9);
}

/* the planner's budgets: the device's less its headroom */
static void effective_budget(const sched_planner_opts_t *opts, double *budget) {
    memcpy(budget, opts->budget, SCHED_MEM_COUNT * sizeof *budget);
    if (opts->device_headroom > 0) budget[SCHED_MEM_DEVICE] *= 1.0 - opts->device_headroom;
}

void sched_parallel_result_free(sched_parallel_result_t *r) {
    if (!r) return;
    for (int i = 0; i < SCHED_LAYOUT_COUNT; i++)
        if (r->plan[i].blocks) sched_plan_free(&r->plan[i]);
    memset(r, 0, sizeof *r);
}

static mt_status_t plan_layout(const sched_workload_t *w, const sched_planner_opts_t *opts, sched_parallel_t layout,
                               double host_bw, sched_parallel_result_t *out, int slot, mt_error_t *err) {
    sched_planner_opts_t o = *opts;
    o.parallel = layout;
    sched_planner_result_t res;
    mt_status_t st = sched_plan_make(w, &o, &res, err);
    if (st != MT_OK) return st;
    out->simulations += res.simulations;
    out->planned[slot] = true;
    out->feasible[slot] = res.feasible;
    out->plan[slot] = res.plan;
    res.plan.blocks = NULL; /* moved */
    sched_planner_result_free(&res);
    out->simulations++;
    st = sched_dp_predict(w, &out->plan[slot], SCHED_EP_DEVICES, host_bw, &out->dp[slot], err);
    /* the step as two devices run it must fit too (every update inside the step) */
    double budget[SCHED_MEM_COUNT];
    effective_budget(opts, budget);
    out->feasible[slot] = out->feasible[slot] && fits(&out->dp[slot], budget);
    return st;
}

/* A switch of one MoE block between data and expert parallel; to expert
 * parallel it takes the placement the executor runs such a block with. */
static void toggle_parallel(sched_block_plan_t *bp) {
    if (bp->expert_parallel) bp->expert_parallel = false;
    else sched_block_plan_expert_parallel(bp);
}

mt_status_t sched_parallel_plan(const sched_workload_t *w, const sched_planner_opts_t *opts, double host_bw,
                                sched_parallel_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (opts->devices != SCHED_EP_DEVICES)
        return mt_error_set(err, MT_ERR_CONFIG, "parallel: the per-layer choice is for %d devices; the run has %d",
                            SCHED_EP_DEVICES, opts->devices);
    bool any_moe = false;
    for (int b = 0; w->moe && b < w->num_blocks; b++) any_moe |= w->moe[b];
    /* refused here with the planner's message (expert without MoE layers) */
    if (!any_moe && opts->parallel == SCHED_PARALLEL_EXPERT)
        return plan_layout(w, opts, SCHED_PARALLEL_EXPERT, host_bw, out, SCHED_LAYOUT_EXPERT, err);
    mt_status_t st = plan_layout(w, opts, SCHED_PARALLEL_DATA, host_bw, out, SCHED_LAYOUT_DATA, err);
    if (st == MT_OK && any_moe) st = plan_layout(w, opts, SCHED_PARALLEL_EXPERT, host_bw, out, SCHED_LAYOUT_EXPERT, err);
    if (st != MT_OK) {
        sched_parallel_result_free(out);
        return st;
    }
    out->chosen = opts->parallel == SCHED_PARALLEL_EXPERT ? SCHED_LAYOUT_EXPERT : SCHED_LAYOUT_DATA;
    if (!any_moe) return MT_OK;
    double budget[SCHED_MEM_COUNT];
    effective_budget(opts, budget);
    const int start = better(&out->dp[SCHED_LAYOUT_EXPERT], out->feasible[SCHED_LAYOUT_EXPERT],
                             &out->dp[SCHED_LAYOUT_DATA], out->feasible[SCHED_LAYOUT_DATA])
                          ? SCHED_LAYOUT_EXPERT
                          : SCHED_LAYOUT_DATA;
    sched_plan_t *mix = &out->plan[SCHED_LAYOUT_MIX];
    *mix = out->plan[start];
    mix->blocks = malloc((size_t)mix->num_blocks * sizeof *mix->blocks);
    MT_CHECK_ALLOC(mix->blocks, "mixed plan");
    memcpy(mix->blocks, out->plan[start].blocks, (size_t)mix->num_blocks * sizeof *mix->blocks);
    sched_dp_result_t cur = out->dp[start];
    bool cur_fits = out->feasible[start];
    /* Each pass scores every single switch from the current mix, then tries
     * them in order of time saved, re-predicting each on the mix as it now
     * is (an earlier switch can use the memory a later one needed, and
     * prefetch overlaps neighbours) and keeping those that still help
     * within the budgets; the largest gains go first, so a small gain does
     * not take the memory a large one needs.  Passes repeat until none
     * switches: each kept switch strictly lowers the step, so this ends. */
    typedef struct {
        int block;
        double saved;
    } cand_t;
    cand_t *cand = malloc((size_t)w->num_blocks * sizeof *cand);
    MT_CHECK_ALLOC(cand, "mix candidates");
    for (bool changed = true; changed && st == MT_OK;) {
        changed = false;
        int nc = 0;
        for (int b = 0; b < w->num_blocks && st == MT_OK; b++) {
            if (!w->moe[b]) continue;
            const sched_block_plan_t was = mix->blocks[b];
            toggle_parallel(&mix->blocks[b]);
            sched_dp_result_t r;
            st = sched_dp_predict(w, mix, SCHED_EP_DEVICES, host_bw, &r, err);
            out->simulations++;
            mix->blocks[b] = was;
            if (st == MT_OK && better(&r, fits(&r, budget), &cur, cur_fits))
                cand[nc++] = (cand_t){b, cur.step_s - r.step_s};
        }
        /* by time saved, then block order (insertion sort: deterministic, few) */
        for (int i = 1; i < nc; i++)
            for (int j = i; j > 0 && cand[j].saved > cand[j - 1].saved; j--) {
                const cand_t t = cand[j];
                cand[j] = cand[j - 1], cand[j - 1] = t;
            }
        for (int i = 0; i < nc && st == MT_OK; i++) {
            const int b = cand[i].block;
            const sched_block_plan_t was = mix->blocks[b];
            toggle_parallel(&mix->blocks[b]);
            sched_dp_result_t r;
            st = sched_dp_predict(w, mix, SCHED_EP_DEVICES, host_bw, &r, err);
            out->simulations++;
            const bool f = st == MT_OK && fits(&r, budget);
            if (st == MT_OK && better(&r, f, &cur, cur_fits) && (f || !cur_fits)) {
                cur = r;
                cur_fits = f;
                changed = true;
            } else {
                mix->blocks[b] = was;
            }
        }
    }
    free(cand);
    if (st != MT_OK) {
        sched_parallel_result_free(out);
        return st;
    }
    for (int b = 0; b < w->num_blocks; b++)
        out->switches += mix->blocks[b].expert_parallel != out->plan[start].blocks[b].expert_parallel;
    out->planned[SCHED_LAYOUT_MIX] = true;
    out->feasible[SCHED_LAYOUT_MIX] = cur_fits;
    out->dp[SCHED_LAYOUT_MIX] = cur;
    if (opts->parallel == SCHED_PARALLEL_AUTO) out->chosen = SCHED_LAYOUT_MIX;
    return MT_OK;
}
