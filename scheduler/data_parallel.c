/* Data parallel step prediction (see data_parallel.h). */
#include "scheduler/data_parallel.h"

#include <string.h>

#include "scheduler/simulate.h"

static bool optimizer_task(sched_task_kind_t k) {
    return k == SCHED_TASK_NORM || k == SCHED_TASK_ADAM || k == SCHED_TASK_W_UPDATE;
}

mt_status_t sched_dp_predict(const sched_workload_t *w, const sched_plan_t *plan, int devices, double host_bw,
                             sched_dp_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (devices < 1) return mt_error_set(err, MT_ERR_CONFIG, "devices: %d; expected at least 1", devices);
    out->devices = devices;
    out->micro_per_device = w->grad_accum;
    /* several devices finish every update in the step (engine/multi_device.c) */
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
    sched_sim_result_free(&sim);
    if (devices == 1) {
        out->step_s = out->fwd_bwd_s + out->optim_s;
        out->tokens_per_s = out->step_s > 0 ? w->tokens_per_step / out->step_s : 0;
        return MT_OK;
    }
    double refresh_h2d = 0, refresh_d2h = 0, refresh_h2d_copies = 0, refresh_d2h_copies = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        const sched_block_cost_t *c = &w->blocks[b];
        const sched_block_plan_t *bp = &plan->blocks[b];
        if (bp->grads == SCHED_GRADS_DEVICE) out->reduce_device_bytes += c->grad_bytes;
        else out->reduce_host_bytes += c->grad_bytes;
        if (bp->weights != SCHED_WEIGHTS_RESIDENT || c->grad_bytes <= 0) continue;
        if (bp->optim == SCHED_OPTIM_HOST) {
            refresh_h2d += c->w_update_bytes;
            refresh_h2d_copies += c->w_update_copies;
        } else {
            refresh_d2h += c->w_resident_bytes;
            refresh_h2d += c->w_resident_bytes;
            refresh_d2h_copies += 1;
            refresh_h2d_copies += 1;
        }
    }
    const double n = devices;
    const double link = w->h2d_bw < w->d2h_bw ? w->h2d_bw : w->d2h_bw;
    if (link > 0) out->reduce_s += 2.0 * (n - 1) / n * out->reduce_device_bytes / link;
    if (host_bw > 0) out->reduce_s += (n - 1) * 3.0 * out->reduce_host_bytes / host_bw;
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
