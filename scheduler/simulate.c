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
    "gradients d2h", "gradients on host", "grad norm", "adamw", "weights update h2d", "token exchange",
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
    bool off_step; /* tasks that run into the next step (deferred AdamW): not the step's end */
    double h2d_bytes, d2h_bytes;
    double peer_bytes; /* expert parallel rows sent to the other device */
    double *first_fwd; /* per block: its first forward's start (-1 before it) */
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
    if (!s->off_step && (end > s->end_max || (end == s->end_max && res != SCHED_RES_COMPUTE))) {
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
    double start;
    const double end = run(s, SCHED_RES_COMPUTE, kind, block, micro, ready, dur, 0, &start);
    if (kind == SCHED_TASK_FWD && s->first_fwd[block] < 0) s->first_fwd[block] = start;
    if (start_out) *start_out = start;
    return end;
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

/* An expert parallel block's token exchange, whose time its compute task
 * [start, end] already holds.  Through host memory the rows also cross this
 * device's own link both ways (its rows out D2H, the other's in H2D: two
 * all-to-alls per pass), queued behind the copies issued before; the
 * compute cannot end before they have.  Returns the compute's end. */
static double exchange(sim_t *s, int block, int micro, double start, double end, double bytes) {
    if (bytes <= 0) return end;
    s->peer_bytes += bytes;
    if (!s->w->peer_via_host) return end;
    const double e1 = copy(s, false, SCHED_TASK_EXCHANGE, block, micro, start, bytes, 2, NULL);
    const double e2 = copy(s, true, SCHED_TASK_EXCHANGE, block, micro, start, bytes, 2, NULL);
    const double e = e1 > e2 ? e1 : e2;
    if (e <= end) return end;
    s->waited[e1 > e2 ? SCHED_RES_D2H : SCHED_RES_H2D] += e - end;
    s->free_at[SCHED_RES_COMPUTE] = e;
    return e;
}

static bool opts_in_step(const sched_sim_opts_t *o) { return o && o->updates_in_step; }

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
    for (int b = 0; b < num_blocks; b++) {
        const sched_block_plan_t *p = &plan->blocks[b];
        if (p->optim == SCHED_OPTIM_DEVICE && (p->grads != SCHED_GRADS_DEVICE || p->weights != SCHED_WEIGHTS_RESIDENT))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "block %d: the optimizer on the device needs resident weights and device gradients "
                                "(it updates the device copies in place); this is not a valid plan",
                                b);
    }
    return MT_OK;
}

/* Tasks of the optimizer phase: the phase is one sequence (the executor
 * runs it on one thread), so each starts when the previous one ended; the
 * compute stream is idle meanwhile, which is charged to the task's resource. */
static double opt_run(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, double t, double dur) {
    if (dur <= 0) return t;
    double start, end = run(s, res, kind, block, -1, t, dur, 0, &start);
    if (res != SCHED_RES_COMPUTE) s->waited[res] += end - start;
    return end;
}

static double opt_copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, double t, double bytes, double copies) {
    if (bytes <= 0) return t;
    double start, end = copy(s, h2d, kind, block, -1, t, bytes, copies, &start);
    s->waited[h2d ? SCHED_RES_H2D : SCHED_RES_D2H] += end - start;
    return end;
}

/* Layer-major order (plan->layer_major; engine/exec/layer_major.c): the
 * uses of blocks are embedding and layers forward, the head, then layers
 * and embedding backward, 2N - 1 uses, each running all ga micro-batches;
 * the fetches for use u are issued as use u - W - 1 ends, once per use
 * (weights: the experts any micro-batch of the step hits).  Forward: each
 * micro-batch's saved set (or input) is allocated at its forward and
 * offloaded after it as in micro-batch order.  The head runs forward and
 * backward per micro-batch.  Backward: a micro-batch's offloaded
 * activations are fetched while the previous micro-batch computes;
 * micro-batches after the first add their gradients on the device (grads
 * HOST too: the sum stays on the device) and a grads HOST block sends the
 * step's sum once after its last micro-batch.  Returns the last compute end. */
static double sim_layer_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                              bool *adam_done, sched_sim_result_t *out) {
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1, W = plan->prefetch_window;
    const int U = 2 * N - 1;
    double *use_end = malloc((size_t)U * sizeof *use_end);
    double *offload_end = calloc((size_t)N * ga, sizeof *offload_end);
    double *d2h_end = malloc(((size_t)N * (ga + 1) + 1) * sizeof *d2h_end);
    MT_CHECK(use_end && offload_end && d2h_end, "out of host memory in the simulator");
    int n_d2h = 0;
    double last_end = 0, prev_start = 0, turn_w = 0, head_w = 0;
    for (int u = 0; u < U; u++) {
        const bool fwd = u < N - 1, head = u == N - 1;
        const int b = u < N ? u : 2 * N - 2 - u;
        const sched_block_plan_t *p = &plan->blocks[b];
        const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
        const bool turn = W >= 1 && N >= 3 && b == N - 2;
        const sched_act_place_t acts =
            b == 0 || b == N - 1 || (turn && p->acts == SCHED_ACTS_OFFLOAD) ? SCHED_ACTS_KEEP : p->acts;
        const double issue = u - W - 1 >= 0 ? use_end[u - W - 1] : 0;
        const bool held = !fwd && !head && turn;
        const double unit = c->w_fetch_step_bytes > 0 ? c->w_fetch_step_bytes : c->w_fetch_bytes;
        const double unit_copies = c->w_fetch_step_bytes > 0 ? c->w_fetch_step_copies : c->w_fetch_copies;
        double fw = 0, fw_copies = 0;
        if (!held && p->weights == SCHED_WEIGHTS_STREAM) fw = unit, fw_copies = unit_copies;
        if (head && w->tied_head && plan->blocks[0].weights == SCHED_WEIGHTS_STREAM) {
            const sched_block_cost_t *e = &w->blocks[0];
            fw += e->w_fetch_step_bytes > 0 ? e->w_fetch_step_bytes : e->w_fetch_bytes;
            fw_copies += e->w_fetch_step_bytes > 0 ? e->w_fetch_step_copies : e->w_fetch_copies;
        }
        double wready = 0;
        if (fw > 0) {
            wready = copy(s, true, SCHED_TASK_FETCH_W, b, -1, issue, fw, fw_copies, NULL);
            mem(s, SCHED_MEM_DEVICE, issue, fw);
        }
        const double off = c->act_saved_bytes - c->act_input_bytes;
        const bool grads_host = !fwd && w->has_trainable && p->grads == SCHED_GRADS_HOST && c->grad_mb_bytes > 0;
        double end = last_end;
        for (int mb = 0; mb < ga; mb++) {
            double ready = mb == 0 ? wready : 0;
            sched_resource_t ready_res = mb == 0 && fw > 0 ? SCHED_RES_H2D : SCHED_RES_COMPUTE;
            const bool sends_acts = fwd && acts == SCHED_ACTS_OFFLOAD && off > 0;
            const bool sends_grads = grads_host && mb == ga - 1;
            if (!fwd && !head && acts == SCHED_ACTS_OFFLOAD && off > 0) {
                /* issued while the previous micro-batch computes */
                const double oe = offload_end[(size_t)b * ga + mb];
                const double r = prev_start > oe ? prev_start : oe;
                const double t1 = copy(s, true, SCHED_TASK_FETCH_ACT, b, mb, r, off, c->act_copies, NULL);
                mem(s, SCHED_MEM_DEVICE, r, off);
                mem(s, SCHED_MEM_PINNED, t1, -off);
                if (t1 > ready) ready = t1, ready_res = SCHED_RES_H2D;
            }
            /* a gradient batch waits for the one W + 1 sends earlier, as in
             * micro-batch order; activation offloads do not: the staging
             * pool holds every micro-batch's (the executor sizes it for k
             * times the tokens), so nothing makes the forward wait for them */
            int dslot = -1;
            if (sends_acts || sends_grads) {
                const double gate = sends_grads && n_d2h > W ? d2h_end[n_d2h - W - 1] : 0;
                if (gate > ready) ready = gate, ready_res = SCHED_RES_D2H;
                dslot = n_d2h++;
            }
            double start;
            if (fwd || head) {
                end = compute(s, SCHED_TASK_FWD, b, mb, ready, ready_res, c->fwd_s, &start);
                end = exchange(s, b, mb, start, end, c->xchg_fwd_bytes);
                prev_start = start;
                const double saved = acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
                mem(s, SCHED_MEM_DEVICE, start, saved + c->fwd_temp_bytes);
                mem(s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
                if (sends_acts) {
                    const double oe = copy(s, false, SCHED_TASK_OFFLOAD_ACT, b, mb, end, off, c->act_copies, NULL);
                    offload_end[(size_t)b * ga + mb] = oe;
                    mem(s, SCHED_MEM_PINNED, oe, off);
                    mem(s, SCHED_MEM_DEVICE, oe, -off);
                    d2h_end[dslot] = oe;
                }
            }
            if (!fwd) {
                const bool rc = acts == SCHED_ACTS_RECOMPUTE;
                const bool dev_add = mb > 0 && w->has_trainable && c->grad_mb_bytes > 0;
                const double dur = c->bwd_s + (rc ? c->recompute_s : 0) + (dev_add ? c->grad_add_device_s : 0);
                end = compute(s, SCHED_TASK_BWD, b, mb, end > ready ? end : ready, ready_res, dur, &start);
                end = exchange(s, b, mb, start, end, c->xchg_bwd_bytes + (rc ? c->xchg_fwd_bytes : 0));
                prev_start = start;
                if (rc) out->recompute_s += c->recompute_s;
                const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
                /* the first micro-batch's gradients (grads HOST: the device sum until sent) */
                const double g0 = grads_host && mb == 0 ? c->grad_mb_bytes : 0;
                const double gk = dev_add ? c->grad_mb_bytes : 0;
                mem(s, SCHED_MEM_DEVICE, start, temp + g0 + gk + (rc ? off : 0));
                mem(s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes - gk);
                if (sends_grads) {
                    const double gb = c->grad_step_bytes > 0 ? c->grad_step_bytes : c->grad_mb_bytes;
                    const double gc = c->grad_step_bytes > 0 ? c->grad_step_copies : c->grad_mb_copies;
                    const double t = copy(s, false, SCHED_TASK_GRAD_D2H, b, mb, end, gb, gc, NULL);
                    mem(s, SCHED_MEM_DEVICE, t, -c->grad_mb_bytes);
                    d2h_end[dslot] = t;
                    if (overlap && p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
                        run(s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, t, c->adam_host_s, 0, NULL);
                        adam_done[b] = true;
                    }
                }
            }
        }
        if (fw > 0) {
            if (fwd && turn) turn_w = fw;
            else mem(s, SCHED_MEM_DEVICE, end, -fw);
            if (head) head_w = fw;
        }
        if (held) mem(s, SCHED_MEM_DEVICE, end, -turn_w);
        use_end[u] = end;
        last_end = end;
    }
    (void)head_w;
    free(use_end);
    free(offload_end);
    free(d2h_end);
    return last_end;
}

static mt_status_t simulate_once(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                                 sched_sim_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->compute_stretch = 1.0;
    mt_status_t st = sched_plan_check(plan, w->num_blocks, err);
    if (st != MT_OK) return st;
    for (int b = 0; b < w->num_blocks; b++)
        if (plan->blocks[b].expert_parallel && !(w->moe && w->moe[b]))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "block %d: expert parallel needs a block with routed experts (a MoE layer)", b);
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1, W = plan->prefetch_window;
    sim_t s = {.w = w, .keep_tasks = opts && opts->tasks};
    s.first_fwd = malloc((size_t)N * sizeof *s.first_fwd);
    MT_CHECK_ALLOC(s.first_fwd, "simulator block starts");
    for (int b = 0; b < N; b++) s.first_fwd[b] = -1;
    double *deferred_end = calloc((size_t)N, sizeof *deferred_end); /* 0: not deferred */
    MT_CHECK_ALLOC(deferred_end, "simulator deferred updates");
    double stat[SCHED_MEM_COUNT] = {0};
    for (int b = 0; b < N; b++) {
        const sched_block_plan_t *p = &plan->blocks[b];
        const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
        if (p->weights == SCHED_WEIGHTS_RESIDENT) stat[SCHED_MEM_DEVICE] += c->w_resident_bytes;
        else stat[SCHED_MEM_HOST] += c->w_home_bytes;
        if (p->grads == SCHED_GRADS_DEVICE) stat[SCHED_MEM_DEVICE] += c->grad_bytes;
        if (p->optim == SCHED_OPTIM_DEVICE) {
            stat[SCHED_MEM_DEVICE] += c->optim_bytes;
        } else {
            stat[SCHED_MEM_HOST] += c->optim_bytes + c->grad_bytes + c->other_host_bytes;
            if (p->weights == SCHED_WEIGHTS_RESIDENT) stat[SCHED_MEM_HOST] += c->host_weight_bytes;
        }
    }
    double *phase_end = malloc((size_t)N * sizeof *phase_end);  /* compute end per position of this phase */
    double *d2h_end = malloc(((size_t)2 * (size_t)N * (size_t)ga + 1) * sizeof *d2h_end); /* D2H end per D2H use */
    double *offload_end = calloc((size_t)N, sizeof *offload_end);
    bool *adam_done = calloc((size_t)N, sizeof *adam_done);
    MT_CHECK(phase_end && d2h_end && offload_end && adam_done, "out of host memory in the simulator");
    const bool overlap = !w->clip && w->has_trainable;
    int n_d2h = 0;
    double last_compute_end = 0, head_w = 0, turn_w = 0;

    if (plan->layer_major) last_compute_end = sim_layer_major(&s, w, plan, overlap, adam_done, out);
    for (int mb = 0; mb < (plan->layer_major ? 0 : ga); mb++) {
        const bool last_mb = mb == ga - 1;
        for (int phase = 0; phase < 2; phase++) {
            const bool fwd = phase == 0;
            const double phase_start = last_compute_end;
            for (int i = 0; i < N; i++) {
                const int b = fwd ? i : N - 1 - i;
                const sched_block_plan_t *p = &plan->blocks[b];
                const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
                /* the last layer at the turn from forward to backward (engine/exec/plan_query.h,
                 * exec_turn_held): with a window of at least 1 its streamed weights and offloaded
                 * activations stay on the device from its forward to its backward */
                const bool turn = W >= 1 && N >= 3 && b == N - 2;
                /* the embedding's and the head's forward and backward are adjacent: the executor keeps their
                 * activations whatever the plan says */
                const sched_act_place_t acts =
                    b == 0 || b == N - 1 || (turn && p->acts == SCHED_ACTS_OFFLOAD) ? SCHED_ACTS_KEEP : p->acts;
                /* the fetches for position i are issued just before position i - W computes */
                const double issue = i - W - 1 >= 0 ? phase_end[i - W - 1] : phase_start;
                /* the head's weights stay from its forward to its backward, and so do the turn's */
                const bool held = !fwd && (b == N - 1 || turn);
                double fw = 0, fw_copies = 0;
                if (!held && p->weights == SCHED_WEIGHTS_STREAM) fw = c->w_fetch_bytes, fw_copies = c->w_fetch_copies;
                if (!held && b == N - 1 && w->tied_head && plan->blocks[0].weights == SCHED_WEIGHTS_STREAM) {
                    fw += w->blocks[0].w_fetch_bytes;
                    fw_copies += w->blocks[0].w_fetch_copies;
                }
                const double off = c->act_saved_bytes - c->act_input_bytes; /* the input stays on the device */
                const double fa = !fwd && acts == SCHED_ACTS_OFFLOAD ? off : 0;
                double ready = 0;
                sched_resource_t ready_res = SCHED_RES_COMPUTE;
                if (fw > 0) {
                    double t1 = copy(&s, true, SCHED_TASK_FETCH_W, b, mb, issue, fw, fw_copies, NULL);
                    mem(&s, SCHED_MEM_DEVICE, issue, fw); /* allocated when issued */
                    ready = t1, ready_res = SCHED_RES_H2D;
                }
                if (fa > 0) {
                    const double r = issue > offload_end[b] ? issue : offload_end[b];
                    double t1 = copy(&s, true, SCHED_TASK_FETCH_ACT, b, mb, r, fa, c->act_copies, NULL);
                    mem(&s, SCHED_MEM_DEVICE, issue, fa);
                    mem(&s, SCHED_MEM_PINNED, t1, -fa); /* the offloaded copy lived in pinned memory */
                    if (t1 > ready) ready = t1, ready_res = SCHED_RES_H2D;
                }
                /* uses that send activations or gradients D2H wait for the D2H
                 * issued W + 1 such uses earlier (bounded device memory) */
                const bool grads_d2h = !fwd && w->has_trainable && p->grads == SCHED_GRADS_HOST && c->grad_mb_bytes > 0;
                const bool sends = fwd ? acts == SCHED_ACTS_OFFLOAD && off > 0 : grads_d2h;
                int dslot = -1;
                if (sends) {
                    const double gate = n_d2h > W ? d2h_end[n_d2h - W - 1] : 0;
                    if (gate > ready) ready = gate, ready_res = SCHED_RES_D2H;
                    dslot = n_d2h++;
                }
                double start, end;
                if (fwd) {
                    end = compute(&s, SCHED_TASK_FWD, b, mb, ready, ready_res, c->fwd_s, &start);
                    end = exchange(&s, b, mb, start, end, c->xchg_fwd_bytes);
                    const double saved = acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
                    mem(&s, SCHED_MEM_DEVICE, start, saved + c->fwd_temp_bytes);
                    mem(&s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
                } else {
                    const bool rc = acts == SCHED_ACTS_RECOMPUTE;
                    /* later micro-batches compute device gradients into a fresh buffer, then add */
                    const bool dev_add = mb > 0 && w->has_trainable && p->grads == SCHED_GRADS_DEVICE;
                    const double dur = c->bwd_s + (rc ? c->recompute_s : 0) + (dev_add ? c->grad_add_device_s : 0);
                    end = compute(&s, SCHED_TASK_BWD, b, mb, ready, ready_res, dur, &start);
                    end = exchange(&s, b, mb, start, end, c->xchg_bwd_bytes + (rc ? c->xchg_fwd_bytes : 0));
                    if (rc) out->recompute_s += c->recompute_s;
                    const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
                    const double grads = grads_d2h || dev_add ? c->grad_mb_bytes : 0;
                    mem(&s, SCHED_MEM_DEVICE, start, temp + grads + (rc ? c->act_saved_bytes - c->act_input_bytes : 0));
                    mem(&s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes - (dev_add ? grads : 0));
                }
                if (fw > 0 && !(fwd && (b == N - 1 || turn))) mem(&s, SCHED_MEM_DEVICE, end, -fw);
                if (fwd && b == N - 1) head_w = fw;
                if (fwd && turn) turn_w = fw;
                if (held) mem(&s, SCHED_MEM_DEVICE, end, b == N - 1 ? -head_w : -turn_w);
                phase_end[i] = end;
                last_compute_end = end;

                if (fwd && acts == SCHED_ACTS_OFFLOAD && off > 0) {
                    double t0;
                    offload_end[b] = copy(&s, false, SCHED_TASK_OFFLOAD_ACT, b, mb, end, off, c->act_copies, &t0);
                    /* the copy stays in pinned memory until fetched back */
                    mem(&s, SCHED_MEM_PINNED, offload_end[b], off);
                    mem(&s, SCHED_MEM_DEVICE, offload_end[b], -off);
                    if (dslot >= 0) d2h_end[dslot] = offload_end[b];
                }
                if (!grads_d2h) continue;
                /* first micro-batch: straight into the host buffer; later ones:
                 * staging, then added on the host in the D2H stream's order */
                double t = copy(&s, false, SCHED_TASK_GRAD_D2H, b, mb, end, c->grad_mb_bytes, c->grad_mb_copies, NULL);
                mem(&s, SCHED_MEM_DEVICE, t, -c->grad_mb_bytes);
                if (mb > 0) t = run(&s, SCHED_RES_D2H, SCHED_TASK_GRAD_HOST, b, mb, t, c->grad_add_host_s, c->grad_mb_bytes, NULL);
                d2h_end[dslot] = t;
                if (last_mb && overlap && p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
                    run(&s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, t, c->adam_host_s, 0, NULL);
                    adam_done[b] = true;
                }
            }
        }
    }

    /* the optimizer step: after every copy and the overlapped host AdamW
     * have finished, one sequence: the global norm, then block by block
     * (device AdamW; or gradients D2H if on the device, host AdamW, the
     * updated working copy H2D if resident) */
    double t = 0;
    for (int r = 0; r < SCHED_RES_COUNT; r++)
        if (s.free_at[r] > t) t = s.free_at[r];
    if (t > last_compute_end) s.waited[s.end_res] += t - last_compute_end;
    if (w->has_trainable) {
        double norm_host = 0, norm_dev = 0;
        for (int b = 0; b < N; b++) {
            const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
            if (c->grad_step_bytes <= 0) continue;
            if (plan->blocks[b].grads == SCHED_GRADS_HOST) norm_host += c->norm_host_s;
            else norm_dev += c->norm_device_s;
        }
        t = opt_run(&s, SCHED_RES_HOST, SCHED_TASK_NORM, -1, t, norm_host);
        t = opt_run(&s, SCHED_RES_COMPUTE, SCHED_TASK_NORM, -1, t, norm_dev);
        for (int b = 0; b < N; b++) {
            const sched_block_plan_t *p = &plan->blocks[b];
            const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
            if (c->grad_step_bytes <= 0) continue;
            const bool resident = p->weights == SCHED_WEIGHTS_RESIDENT;
            if (p->optim == SCHED_OPTIM_DEVICE) {
                t = opt_run(&s, SCHED_RES_COMPUTE, SCHED_TASK_ADAM, b, t, c->adam_device_s);
                continue;
            }
            /* a streamed block's host update with its gradients on the host
             * runs on the optimizer worker into the next step (engine/
             * engine/exec/optim_step.c): only that block's next fetch waits for it, and
             * the step end only for the blocks the next step prefetches
             * (b <= the window) */
            if (!adam_done[b] && !opts_in_step(opts) && p->grads == SCHED_GRADS_HOST && !resident) {
                s.off_step = true;
                double start;
                deferred_end[b] = run(&s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, t, c->adam_host_s, 0, &start);
                s.off_step = false;
                if (b <= plan->prefetch_window) {
                    s.waited[SCHED_RES_HOST] += deferred_end[b] > t ? deferred_end[b] - t : 0;
                    t = deferred_end[b] > t ? deferred_end[b] : t;
                }
                continue;
            }
            if (!adam_done[b]) {
                if (p->grads == SCHED_GRADS_DEVICE)
                    t = opt_copy(&s, false, SCHED_TASK_GRAD_D2H, b, t, c->grad_step_bytes, c->grad_step_copies);
                t = opt_run(&s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, t, c->adam_host_s);
            }
            if (resident && c->w_update_bytes > 0)
                t = opt_copy(&s, true, SCHED_TASK_W_UPDATE, b, t, c->w_update_bytes, c->w_update_copies);
        }
    }

    out->step_time = s.end_max > t ? s.end_max : t;
    /* Steady state: the next step starts at step_time, and a block whose
     * update ran on into it can start its first forward only once the
     * update is done and its weights have crossed; the worst such block
     * delays the whole next step (the later blocks' host work queued behind
     * the updates is not modelled). */
    double stall = 0;
    for (int b = 0; b < N; b++) {
        if (deferred_end[b] <= 0 || s.first_fwd[b] < 0) continue;
        const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
        const double fetch = sched_transfer_time(w, true, c->w_fetch_bytes, c->w_fetch_copies);
        const double late = deferred_end[b] - out->step_time + fetch - s.first_fwd[b];
        if (late > stall) stall = late;
    }
    if (stall > 0) {
        out->step_time += stall;
        s.waited[SCHED_RES_HOST] += stall;
    }
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
    out->peer_bytes = s.peer_bytes;
    out->tasks = s.tasks;
    out->num_tasks = s.ntasks;
    free(phase_end);
    free(d2h_end);
    free(offload_end);
    free(adam_done);
    free(deferred_end);
    free(s.first_fwd);
    return MT_OK;
}

/* Micro-batches simulated one by one; past this, the step is extrapolated.
 * Every micro-batch after the first few repeats the same pattern (same
 * costs, same prefetch state), so one more of them adds a fixed amount to
 * every time and byte total and nothing to the peaks: simulate K and K - 1
 * micro-batches and add (ga - K) times the difference.  This keeps an
 * accepted gradient_accumulation_steps (up to 10^6) from costing 10^6
 * simulated micro-batches and an array of 2 * blocks * 10^6 doubles.
 * simulate_test checks the extrapolation against a full simulation. */
#define SIM_MAX_MICRO 16
#define SIM_MAX_MICRO_LAYER 256

static mt_status_t simulate_micro(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                                  sched_sim_result_t *out, mt_error_t *err) {
    const int ga = w->grad_accum > 0 ? w->grad_accum : 1;
    /* layer-major: the link's share of a step is fixed and compute grows
     * with ga, so the step is not linear in ga until compute dominates, and
     * its peaks grow with ga (every micro-batch's block inputs are held) */
    const int kmax = plan->layer_major ? SIM_MAX_MICRO_LAYER : SIM_MAX_MICRO;
    if (ga <= kmax || (opts && opts->every_micro_batch)) return simulate_once(w, plan, opts, out, err);
    sched_workload_t k = *w;
    k.grad_accum = kmax - 1;
    sched_sim_result_t prev;
    mt_status_t st = simulate_once(&k, plan, NULL, &prev, err);
    if (st != MT_OK) return st;
    k.grad_accum = kmax;
    st = simulate_once(&k, plan, opts, out, err);
    if (st != MT_OK) {
        sched_sim_result_free(&prev);
        return st;
    }
    const double more = (double)ga - kmax;
#define SIM_EXTEND(f) out->f += more * (out->f - prev.f)
    SIM_EXTEND(step_time);
    SIM_EXTEND(compute_idle);
    SIM_EXTEND(h2d_bytes);
    SIM_EXTEND(d2h_bytes);
    SIM_EXTEND(peer_bytes);
    SIM_EXTEND(recompute_s);
    for (int r = 0; r < SCHED_RES_COUNT; r++) {
        SIM_EXTEND(busy[r]);
        SIM_EXTEND(waited[r]);
    }
    for (int m = 0; plan->layer_major && m < SCHED_MEM_COUNT; m++) SIM_EXTEND(peak[m]);
#undef SIM_EXTEND
    sched_sim_result_free(&prev);
    return MT_OK;
}

mt_status_t sched_simulate(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                           sched_sim_result_t *out, mt_error_t *err) {
    mt_status_t st = simulate_micro(w, plan, opts, out, err);
    if (st != MT_OK || !(w->compute_interference > 0) || !(out->step_time > 0)) return st;
    /* the host cores' work: every transfer's memcpys and the host optimizer */
    const double host_s = (out->h2d_bytes + out->d2h_bytes) * w->host_copy_s_per_byte + out->busy[SCHED_RES_HOST];
    const double duty = host_s < out->step_time ? host_s / out->step_time : 1.0;
    if (duty <= 0) return st;
    const double stretch = 1.0 + w->compute_interference * duty;
    sched_workload_t slow = *w;
    slow.blocks = malloc((size_t)w->num_blocks * sizeof *slow.blocks);
    MT_CHECK_ALLOC(slow.blocks, "simulator workload copy");
    memcpy(slow.blocks, w->blocks, (size_t)w->num_blocks * sizeof *slow.blocks);
    if (w->ep_blocks) {
        slow.ep_blocks = malloc((size_t)w->num_blocks * sizeof *slow.ep_blocks);
        MT_CHECK_ALLOC(slow.ep_blocks, "simulator workload copy");
        memcpy(slow.ep_blocks, w->ep_blocks, (size_t)w->num_blocks * sizeof *slow.ep_blocks);
    }
    const int n_costs = (w->ep_blocks ? 2 : 1) * w->num_blocks; /* both layouts' costs */
    for (int i = 0; i < n_costs; i++) {
        sched_block_cost_t *c = i < w->num_blocks ? &slow.blocks[i] : &slow.ep_blocks[i - w->num_blocks];
        c->fwd_s *= stretch;
        c->bwd_s *= stretch;
        c->recompute_s *= stretch;
        c->grad_add_device_s *= stretch;
    }
    sched_sim_result_free(out);
    st = simulate_micro(&slow, plan, opts, out, err);
    out->compute_stretch = stretch;
    free(slow.blocks);
    free(slow.ep_blocks);
    return st;
}

void sched_sim_result_free(sched_sim_result_t *r) {
    if (!r) return;
    for (int m = 0; m < SCHED_MEM_COUNT; m++) free(r->timeline[m].pts);
    free(r->tasks);
    memset(r, 0, sizeof *r);
}
