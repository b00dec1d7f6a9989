/* Simulator (see simulate.h for the mechanics it models).
 *
 * Design notes: every resource runs its tasks in the order they are issued
 * and every dependency points to a task issued earlier, so one pass in
 * issue order computes all start and end times exactly (a task starts at
 * max(its resource is free, its dependencies have ended)); this is the
 * discrete-event simulation of FIFO streams without an event queue.  The
 * issue order is the executor's: per use of a block, its H2D copies, its
 * compute, then the copies and host work that follow it.  Memory is a list
 * of (time, delta) events per kind, sorted once at the end. */
#include "scheduler/simulate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_res_names[SCHED_RES_COUNT] = {"compute", "h2d", "d2h", "host optimizer"};
static const char *const k_mem_names[SCHED_MEM_COUNT] = {"device", "pinned", "host"};
static const char *const k_task_names[SCHED_TASK_KIND_COUNT] = {
    "forward", "backward", "fetch weights", "fetch activations", "offload activations",
    "gradients d2h", "gradients on host", "grad norm", "adamw", "weights update h2d",
};

const char *sched_resource_name(sched_resource_t r) { return (unsigned)r < SCHED_RES_COUNT ? k_res_names[r] : "?"; }
const char *sched_mem_name(sched_mem_t m) { return (unsigned)m < SCHED_MEM_COUNT ? k_mem_names[m] : "?"; }
const char *sched_task_kind_name(sched_task_kind_t k) {
    return (unsigned)k < SCHED_TASK_KIND_COUNT ? k_task_names[k] : "?";
}

typedef struct {
    double t, d;
} ev_t;

typedef struct {
    const sched_workload_t *w;
    ev_t *ev[SCHED_MEM_COUNT];
    int nev[SCHED_MEM_COUNT], capev[SCHED_MEM_COUNT];
    sched_task_t *tasks;
    int ntasks, captasks;
    bool keep_tasks;
    double free_at[SCHED_RES_COUNT];
    double busy[SCHED_RES_COUNT];
    double waited[SCHED_RES_COUNT];
    double end_max;
    sched_resource_t end_res;
    double h2d_bytes, d2h_bytes;
} sim_t;

static void mem(sim_t *s, sched_mem_t m, double t, double d) {
    if (d == 0) return;
    if (s->nev[m] == s->capev[m]) {
        s->capev[m] = s->capev[m] ? 2 * s->capev[m] : 256;
        s->ev[m] = realloc(s->ev[m], (size_t)s->capev[m] * sizeof *s->ev[m]);
        MT_CHECK_ALLOC(s->ev[m], "simulator memory events");
    }
    s->ev[m][s->nev[m]++] = (ev_t){t, d};
}

/* Runs a task on `res` once `ready`; returns its end. */
static double run(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, int micro, double ready,
                  double dur, double bytes, double *start_out) {
    double start = ready > s->free_at[res] ? ready : s->free_at[res];
    if (dur < 0) dur = 0;
    double end = start + dur;
    s->free_at[res] = end;
    s->busy[res] += dur;
    if (end > s->end_max || (end == s->end_max && res != SCHED_RES_COMPUTE)) {
        s->end_max = end;
        s->end_res = res;
    }
    if (s->keep_tasks) {
        if (s->ntasks == s->captasks) {
            s->captasks = s->captasks ? 2 * s->captasks : 256;
            s->tasks = realloc(s->tasks, (size_t)s->captasks * sizeof *s->tasks);
            MT_CHECK_ALLOC(s->tasks, "simulator tasks");
        }
        s->tasks[s->ntasks++] = (sched_task_t){res, kind, block, micro, start, end, bytes};
    }
    if (start_out) *start_out = start;
    return end;
}

/* A compute task: the gap before it is charged to the resource it waited for. */
static double compute(sim_t *s, sched_task_kind_t kind, int block, int micro, double ready, sched_resource_t ready_res,
                      double dur, double *start_out) {
    if (ready > s->free_at[SCHED_RES_COMPUTE]) s->waited[ready_res] += ready - s->free_at[SCHED_RES_COMPUTE];
    return run(s, SCHED_RES_COMPUTE, kind, block, micro, ready, dur, 0, start_out);
}

/* A copy: pinned staging held while it runs. */
static double copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, int micro, double ready, double bytes,
                   double copies, double *start_out) {
    double start;
    double end = run(s, h2d ? SCHED_RES_H2D : SCHED_RES_D2H, kind, block, micro, ready,
                     sched_transfer_time(s->w, h2d, bytes, copies), bytes, &start);
    mem(s, SCHED_MEM_PINNED, start, bytes);
    mem(s, SCHED_MEM_PINNED, end, -bytes);
    if (h2d) s->h2d_bytes += bytes;
    else s->d2h_bytes += bytes;
    if (start_out) *start_out = start;
    return end;
}

static int cmp_ev(const void *a, const void *b) {
    const ev_t *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    /* frees first at equal times: a stream frees before it allocates again */
    if ((x->d < 0) != (y->d < 0)) return x->d < 0 ? -1 : 1;
    return 0;
}

static double finish_mem(sim_t *s, sched_mem_t m, double base, bool keep, sched_timeline_t *tl) {
    if (s->nev[m] > 0) qsort(s->ev[m], (size_t)s->nev[m], sizeof *s->ev[m], cmp_ev);
    double cur = base, peak = base;
    if (keep) {
        tl->pts = malloc((size_t)(s->nev[m] + 1) * sizeof *tl->pts);
        MT_CHECK_ALLOC(tl->pts, "memory timeline");
        tl->pts[0] = (sched_mem_point_t){0, base};
        tl->count = 1;
    }
    for (int i = 0; i < s->nev[m]; i++) {
        cur += s->ev[m][i].d;
        if (cur > peak) peak = cur;
        if (keep) {
            /* one point per instant: the last value at that time */
            if (tl->pts[tl->count - 1].t == s->ev[m][i].t) tl->pts[tl->count - 1].bytes = cur;
            else tl->pts[tl->count++] = (sched_mem_point_t){s->ev[m][i].t, cur};
        }
    }
    return peak;
}

mt_status_t sched_plan_check(const sched_plan_t *plan, int num_blocks, mt_error_t *err) {
    if (plan->num_blocks != num_blocks)
        return mt_error_set(err, MT_ERR_INTERNAL, "plan has %d blocks, the model %d", plan->num_blocks, num_blocks);
    if (plan->prefetch_window < 0)
        return mt_error_set(err, MT_ERR_CONFIG, "prefetch_window must be >= 0, got %d", plan->prefetch_window);
    for (int b = 0; b < num_blocks; b++)
        if (plan->blocks[b].grads == SCHED_GRADS_HOST && plan->blocks[b].optim == SCHED_OPTIM_DEVICE)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "block %d: gradients on the host with the optimizer on the device is not a valid "
                                "plan (the device optimizer reads device gradients)",
                                b);
    return MT_OK;
}

mt_status_t sched_simulate(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                           sched_sim_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t st = sched_plan_check(plan, w->num_blocks, err);
    if (st != MT_OK) return st;
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1, W = plan->prefetch_window;
    sim_t s = {.w = w, .keep_tasks = opts && opts->tasks};
    double stat[SCHED_MEM_COUNT] = {0};
    for (int b = 0; b < N; b++) {
        const sched_block_plan_t *p = &plan->blocks[b];
        const sched_block_cost_t *c = &w->blocks[b];
        if (p->weights == SCHED_WEIGHTS_RESIDENT) stat[SCHED_MEM_DEVICE] += c->w_resident_bytes;
        else stat[SCHED_MEM_HOST] += c->w_home_bytes;
        if (p->grads == SCHED_GRADS_DEVICE) stat[SCHED_MEM_DEVICE] += c->grad_bytes;
        if (p->optim == SCHED_OPTIM_DEVICE) {
            stat[SCHED_MEM_DEVICE] += c->optim_bytes;
        } else {
            stat[SCHED_MEM_HOST] += c->optim_bytes + c->grad_bytes;
            if (p->weights == SCHED_WEIGHTS_RESIDENT) stat[SCHED_MEM_HOST] += c->host_weight_bytes;
        }
    }
    double *slot_end = malloc((size_t)(2 * N * ga + 1) * sizeof *slot_end); /* compute end per H2D use */
    double *d2h_end = malloc((size_t)(2 * N * ga + 1) * sizeof *d2h_end);   /* D2H end per D2H use */
    double *offload_end = calloc((size_t)N, sizeof *offload_end);
    double *grads_on_host = calloc((size_t)N, sizeof *grads_on_host);
    double *adam_end = calloc((size_t)N, sizeof *adam_end);
    MT_CHECK(slot_end && d2h_end && offload_end && grads_on_host && adam_end, "out of host memory in the simulator");
    int n_slots = 0, n_d2h = 0;
    double last_compute_end = 0;

    for (int mb = 0; mb < ga; mb++) {
        const bool last_mb = mb == ga - 1;
        for (int phase = 0; phase < 2; phase++) {
            const bool fwd = phase == 0;
            for (int i = 0; i < N; i++) {
                const int b = fwd ? i : N - 1 - i;
                const sched_block_plan_t *p = &plan->blocks[b];
                const sched_block_cost_t *c = &w->blocks[b];
                double fw = p->weights == SCHED_WEIGHTS_STREAM ? c->w_fetch_bytes : 0;
                double fw_copies = p->weights == SCHED_WEIGHTS_STREAM ? c->w_fetch_copies : 0;
                if (b == N - 1 && w->tied_head && plan->blocks[0].weights == SCHED_WEIGHTS_STREAM) {
                    fw += w->blocks[0].w_fetch_bytes;
                    fw_copies += w->blocks[0].w_fetch_copies;
                }
                const double fa = !fwd && p->acts == SCHED_ACTS_OFFLOAD ? c->act_saved_bytes : 0;
                double ready = 0;
                sched_resource_t ready_res = SCHED_RES_COMPUTE;
                int slot = -1;
                if (fw > 0 || fa > 0) {
                    const double gate = n_slots > W ? slot_end[n_slots - W - 1] : 0;
                    slot = n_slots++;
                    if (fw > 0) {
                        double t0, t1 = copy(&s, true, SCHED_TASK_FETCH_W, b, mb, gate, fw, fw_copies, &t0);
                        mem(&s, SCHED_MEM_DEVICE, t0, fw);
                        ready = t1, ready_res = SCHED_RES_H2D;
                    }
                    if (fa > 0) {
                        const double r = gate > offload_end[b] ? gate : offload_end[b];
                        double t0, t1 = copy(&s, true, SCHED_TASK_FETCH_ACT, b, mb, r, fa, c->act_copies, &t0);
                        mem(&s, SCHED_MEM_DEVICE, t0, fa);
                        mem(&s, SCHED_MEM_HOST, t1, -fa);
                        if (t1 > ready) ready = t1, ready_res = SCHED_RES_H2D;
                    }
                }
                /* uses that send their activations or gradients D2H take slots of a
                 * ring of W + 1 as well: the compute waits until the D2H issued
                 * W + 1 such uses earlier has drained (bounded device memory and
                 * staging, the backpressure the executor applies) */
                const bool sends = fwd ? p->acts == SCHED_ACTS_OFFLOAD && c->act_saved_bytes > 0
                                       : w->has_trainable && p->grads == SCHED_GRADS_HOST && c->grad_mb_bytes > 0;
                int dslot = -1;
                if (sends) {
                    const double gate = n_d2h > W ? d2h_end[n_d2h - W - 1] : 0;
                    if (gate > ready) ready = gate, ready_res = SCHED_RES_D2H;
                    dslot = n_d2h++;
                }
                double start, end;
                if (fwd) {
                    end = compute(&s, SCHED_TASK_FWD, b, mb, ready, ready_res, c->fwd_s, &start);
                    const double saved = p->acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
                    mem(&s, SCHED_MEM_DEVICE, start, saved + c->fwd_temp_bytes);
                    mem(&s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
                } else {
                    const bool rc = p->acts == SCHED_ACTS_RECOMPUTE;
                    const double dur = c->bwd_s + (rc ? c->recompute_s : 0);
                    end = compute(&s, SCHED_TASK_BWD, b, mb, ready, ready_res, dur, &start);
                    if (rc) out->recompute_s += c->recompute_s;
                    const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
                    const double grads = p->grads == SCHED_GRADS_HOST ? c->grad_mb_bytes : 0;
                    mem(&s, SCHED_MEM_DEVICE, start, temp + grads + (rc ? c->act_saved_bytes - c->act_input_bytes : 0));
                    /* KEEP and RECOMPUTE free the whole saved set here; OFFLOAD frees the fetched copy */
                    mem(&s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes);
                }
                if (fw > 0) mem(&s, SCHED_MEM_DEVICE, end, -fw);
                if (slot >= 0) slot_end[slot] = end;
                last_compute_end = end;

                if (fwd && p->acts == SCHED_ACTS_OFFLOAD && c->act_saved_bytes > 0) {
                    double t0;
                    offload_end[b] = copy(&s, false, SCHED_TASK_OFFLOAD_ACT, b, mb, end, c->act_saved_bytes,
                                          c->act_copies, &t0);
                    if (dslot >= 0) d2h_end[dslot] = offload_end[b];
                    mem(&s, SCHED_MEM_HOST, t0, c->act_saved_bytes);
                    mem(&s, SCHED_MEM_DEVICE, offload_end[b], -c->act_saved_bytes);
                }
                if (fwd || !w->has_trainable) continue;
                if (p->grads == SCHED_GRADS_HOST && c->grad_mb_bytes > 0) {
                    double d2h = copy(&s, false, SCHED_TASK_GRAD_D2H, b, mb, end, c->grad_mb_bytes, c->grad_mb_copies, NULL);
                    mem(&s, SCHED_MEM_DEVICE, d2h, -c->grad_mb_bytes);
                    if (dslot >= 0) d2h_end[dslot] = d2h;
                    grads_on_host[b] = run(&s, SCHED_RES_HOST, SCHED_TASK_GRAD_HOST, b, mb, d2h,
                                           mb == 0 ? c->grad_copy_host_s : c->grad_add_host_s, c->grad_mb_bytes, NULL);
                } else if (p->grads == SCHED_GRADS_DEVICE && p->optim == SCHED_OPTIM_HOST && last_mb &&
                           c->grad_step_bytes > 0) {
                    double d2h = copy(&s, false, SCHED_TASK_GRAD_D2H, b, mb, end, c->grad_step_bytes,
                                      c->grad_step_copies, NULL);
                    const double scale = c->grad_mb_bytes > 0 ? c->grad_step_bytes / c->grad_mb_bytes : 1;
                    grads_on_host[b] = run(&s, SCHED_RES_HOST, SCHED_TASK_GRAD_HOST, b, mb, d2h,
                                           c->grad_copy_host_s * scale, c->grad_step_bytes, NULL);
                }
                if (last_mb && !w->clip && p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0)
                    adam_end[b] = run(&s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, grads_on_host[b], c->adam_host_s,
                                      0, NULL);
            }
        }
    }

    /* optimizer after the backward */
    double dev_adam = 0, dev_norm = 0, host_norm = 0, host_grads_ready = 0;
    bool any_host = false;
    for (int b = 0; b < N && w->has_trainable; b++) {
        const sched_block_cost_t *c = &w->blocks[b];
        if (plan->blocks[b].optim == SCHED_OPTIM_DEVICE) {
            dev_adam += c->adam_device_s;
            dev_norm += c->norm_device_s;
        } else if (c->grad_step_bytes > 0) {
            any_host = true;
            host_norm += c->norm_host_s;
            if (grads_on_host[b] > host_grads_ready) host_grads_ready = grads_on_host[b];
        }
    }
    double norm_done = last_compute_end;
    sched_resource_t norm_res = SCHED_RES_COMPUTE;
    if (w->clip && w->has_trainable) {
        if (dev_norm > 0) norm_done = compute(&s, SCHED_TASK_NORM, -1, -1, last_compute_end, SCHED_RES_COMPUTE, dev_norm, NULL);
        if (any_host) {
            double h = run(&s, SCHED_RES_HOST, SCHED_TASK_NORM, -1, -1, host_grads_ready, host_norm, 0, NULL);
            if (h > norm_done) norm_done = h, norm_res = SCHED_RES_HOST;
        }
        for (int i = 0; i < N; i++) {
            const int b = N - 1 - i; /* gradients arrived in backward order */
            const sched_block_cost_t *c = &w->blocks[b];
            if (plan->blocks[b].optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0)
                adam_end[b] = run(&s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, norm_done, c->adam_host_s, 0, NULL);
        }
    }
    if (dev_adam > 0) {
        const double adam_done = compute(&s, SCHED_TASK_ADAM, -1, -1, norm_done, norm_res, dev_adam, NULL);
        /* streamed weights updated on the device go back to their home copy on the host */
        for (int b = 0; b < N; b++) {
            const sched_block_plan_t *p = &plan->blocks[b];
            if (p->optim == SCHED_OPTIM_DEVICE && p->weights == SCHED_WEIGHTS_STREAM && w->blocks[b].w_update_bytes > 0)
                copy(&s, false, SCHED_TASK_W_UPDATE, b, -1, adam_done, w->blocks[b].w_update_bytes,
                     w->blocks[b].w_update_copies, NULL);
        }
    }
    /* updated working copies of resident weights back to the device, as host AdamW finishes */
    for (int pass = 0; pass < N; pass++) {
        int best = -1;
        for (int b = 0; b < N; b++) {
            const sched_block_plan_t *p = &plan->blocks[b];
            if (p->optim != SCHED_OPTIM_HOST || p->weights != SCHED_WEIGHTS_RESIDENT || adam_end[b] <= 0) continue;
            if (w->blocks[b].w_update_bytes <= 0) continue;
            if (best < 0 || adam_end[b] < adam_end[best]) best = b;
        }
        if (best < 0) break;
        copy(&s, true, SCHED_TASK_W_UPDATE, best, -1, adam_end[best], w->blocks[best].w_update_bytes,
             w->blocks[best].w_update_copies, NULL);
        adam_end[best] = -1;
    }

    out->step_time = s.end_max;
    const double compute_end = s.free_at[SCHED_RES_COMPUTE];
    if (out->step_time > compute_end) s.waited[s.end_res] += out->step_time - compute_end;
    memcpy(out->busy, s.busy, sizeof out->busy);
    memcpy(out->waited, s.waited, sizeof out->waited);
    out->compute_idle = out->step_time - s.busy[SCHED_RES_COMPUTE];
    out->bottleneck = SCHED_RES_COMPUTE;
    double best = s.busy[SCHED_RES_COMPUTE];
    for (int r = 1; r < SCHED_RES_COUNT; r++)
        if (s.waited[r] > best) best = s.waited[r], out->bottleneck = (sched_resource_t)r;
    for (int m = 0; m < SCHED_MEM_COUNT; m++) {
        out->static_bytes[m] = stat[m];
        out->peak[m] = finish_mem(&s, (sched_mem_t)m, stat[m], opts && opts->timelines, &out->timeline[m]);
        free(s.ev[m]);
    }
    out->h2d_bytes = s.h2d_bytes;
    out->d2h_bytes = s.d2h_bytes;
    out->tasks = s.tasks;
    out->num_tasks = s.ntasks;
    free(slot_end);
    free(d2h_end);
    free(offload_end);
    free(grads_on_host);
    free(adam_end);
    return MT_OK;
}

void sched_sim_result_free(sched_sim_result_t *r) {
    if (!r) return;
    for (int m = 0; m < SCHED_MEM_COUNT; m++) free(r->timeline[m].pts);
    free(r->tasks);
    memset(r, 0, sizeof *r);
}
