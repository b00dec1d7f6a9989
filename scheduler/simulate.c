/* Simulator (see simulate.h for the mechanics it models).
 *
 * Design notes: every resource runs its tasks in the order they are issued
 * and every dependency points to a task issued earlier, so one pass in
 * issue order computes all start and end times exactly (a task starts at
 * max(its resource is free, its dependencies have ended)); this is the
 * discrete-event simulation of FIFO streams without an event queue.  The
 * issue order is the executor's: per use of a block, its H2D copies, its
 * compute, then the copies and host work that follow it.  Memory is a list
 * of (time, delta) events per kind, sorted once at the end.
 *
 * Each step order walks the uses of blocks its own way (micro-batch
 * order: one function per part of a use, sharing mb_order_t; layer-major:
 * sim_layer_major); the optimizer step, the steady-state stall and the
 * result are the same for both.  Every event is issued in the order the
 * walk meets it, which fixes the memory events' order (and with it the
 * rounding of the running sums). */
#include "scheduler/simulate_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *const k_res_names[SCHED_RES_COUNT] = {"compute", "h2d", "d2h", "host optimizer", "nvme",
                                                         "host staging"};
static const char *const k_mem_names[SCHED_MEM_COUNT] = {"device", "pinned", "host"};
static const char *const k_task_names[SCHED_TASK_KIND_COUNT] = {
    "forward", "backward", "fetch weights", "fetch activations", "offload activations",
    "gradients d2h", "gradients on host", "grad norm", "adamw", "weights update h2d", "token exchange",
    "nvme read", "nvme write", "offload block input", "fetch block input", "pack staging",
};

const char *sched_resource_name(sched_resource_t r) { return (unsigned)r < SCHED_RES_COUNT ? k_res_names[r] : "?"; }
const char *sched_mem_name(sched_mem_t m) { return (unsigned)m < SCHED_MEM_COUNT ? k_mem_names[m] : "?"; }
const char *sched_task_kind_name(sched_task_kind_t k) {
    return (unsigned)k < SCHED_TASK_KIND_COUNT ? k_task_names[k] : "?";
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

static bool opts_in_step(const sched_sim_opts_t *o) { return o && o->updates_in_step; }

/* Tasks of the optimizer phase: the phase is one sequence (the executor
 * runs it on one thread), so each starts when the previous one ended; the
 * compute stream is idle meanwhile, which is charged to the task's resource. */
static double opt_run(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, double t, double dur) {
    if (dur <= 0) return t;
    double start, end = sim_run(s, res, kind, block, -1, t, dur, 0, &start);
    if (res != SCHED_RES_COMPUTE) s->waited[res] += end - start;
    return end;
}

/* ... a copy of the optimizer phase: an H2D with host_bytes packed first,
 * a gradient D2H with host_bytes unpacked behind it (0: none, as into a
 * pinned accumulator); each part's time charged to its resource. */
static double opt_copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, double t, double bytes, double copies,
                       double host_bytes) {
    if (bytes <= 0) return t;
    double p0 = t, packed = t;
    if (h2d) {
        packed = sim_pack(s, block, -1, t, host_bytes, &p0);
        s->waited[SCHED_RES_PACK] += packed - t;
    }
    double start, end = sim_copy(s, h2d, kind, block, -1, packed, bytes, copies, &start);
    if (packed > t) { /* staging held from the pack's start */
        sim_mem(s, SCHED_MEM_PINNED, p0, bytes);
        sim_mem(s, SCHED_MEM_PINNED, start, -bytes);
    }
    s->waited[h2d ? SCHED_RES_H2D : SCHED_RES_D2H] += end - start;
    if (!h2d && kind == SCHED_TASK_GRAD_D2H && host_bytes > 0) {
        const double landed = end;
        sched_resource_t res;
        end = sim_unpack(s, block, -1, start, landed, host_bytes, -1, &res);
        s->waited[res] += end - landed;
    }
    return end;
}

/* The global norm of the optimizer step: its host part, then its device
 * part; returns its end. */
static double opt_norm(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, double t) {
    double norm_host = 0, norm_dev = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
        if (c->grad_step_bytes <= 0 || s->norm_done[b]) continue;
        if (plan->blocks[b].grads == SCHED_GRADS_HOST) norm_host += c->norm_host_s;
        else norm_dev += c->norm_device_s;
    }
    t = opt_run(s, SCHED_RES_HOST, SCHED_TASK_NORM, -1, t, norm_host);
    return opt_run(s, SCHED_RES_COMPUTE, SCHED_TASK_NORM, -1, t, norm_dev);
}

/* Block b's update in the optimizer sequence, from t; returns when the
 * sequence goes on.  A streamed block's host update with its gradients on
 * the host runs on the optimizer worker into the next step (engine/
 * engine/exec/optim_step.c): only that block's next fetch waits for it (deferred_end),
 * and the step end only for the blocks the next step prefetches (b <= the
 * window). */
static double opt_block(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                        int b, double t, const bool *adam_done, double *deferred_end) {
    const sched_block_plan_t *p = &plan->blocks[b];
    const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
    if (c->grad_step_bytes <= 0) return t;
    const bool resident = p->weights == SCHED_WEIGHTS_RESIDENT;
    if (p->optim == SCHED_OPTIM_DEVICE) return opt_run(s, SCHED_RES_COMPUTE, SCHED_TASK_ADAM, b, t, c->adam_device_s);
    if (!adam_done[b] && !opts_in_step(opts) && p->grads == SCHED_GRADS_HOST && !resident) {
        s->off_step = true;
        deferred_end[b] = sim_host_adam(s, c, p, b, t, false, NULL);
        s->off_step = false;
        if (b <= plan->prefetch_window) {
            s->waited[SCHED_RES_HOST] += deferred_end[b] > t ? deferred_end[b] - t : 0;
            t = deferred_end[b] > t ? deferred_end[b] : t;
        }
        return t;
    }
    if (!adam_done[b]) {
        if (p->grads == SCHED_GRADS_DEVICE)
            t = opt_copy(s, false, SCHED_TASK_GRAD_D2H, b, t, c->grad_step_bytes, c->grad_step_copies,
                         sched_block_pinned_grads(p) ? 0 : c->grad_step_bytes);
        double start;
        const double end = sim_host_adam(s, c, p, b, t, false, &start);
        s->waited[SCHED_RES_NVME] += start - t; /* the state's read (0 without NVMe) */
        s->waited[SCHED_RES_HOST] += end - start;
        t = end;
    }
    if (resident && c->w_update_bytes > 0)
        t = opt_copy(s, true, SCHED_TASK_W_UPDATE, b, t, c->w_update_bytes, c->w_update_copies,
                     c->w_update_bytes * sched_block_pack_frac(c, p, true));
    return t;
}

/* The optimizer step: after every copy and the overlapped host AdamW
 * have finished, one sequence: the global norm, then block by block
 * (device AdamW; or gradients D2H if on the device, host AdamW, the
 * updated working copy H2D if resident).  Returns its end. */
static double sim_optimizer_step(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan,
                                 const sched_sim_opts_t *opts, double last_compute_end, const bool *adam_done,
                                 double *deferred_end) {
    double t = 0;
    for (int r = 0; r < SCHED_RES_COUNT; r++)
        if (s->free_at[r] > t) t = s->free_at[r];
    if (t > last_compute_end) s->waited[s->end_res] += t - last_compute_end;
    if (!w->has_trainable) return t;
    t = opt_norm(s, w, plan, t);
    for (int b = 0; b < w->num_blocks; b++) t = opt_block(s, w, plan, opts, b, t, adam_done, deferred_end);
    return t;
}

/* Steady state: the next step starts at step_time, and a block whose
 * update ran on into it can start its first forward only once the update
 * is done and its weights have crossed; the worst such block delays the
 * whole next step (the later blocks' host work queued behind the updates
 * is not modelled). */
static void add_deferred_stall(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan,
                               const double *deferred_end, sched_sim_result_t *out) {
    double stall = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        if (deferred_end[b] <= 0 || s->first_fwd[b] < 0) continue;
        const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
        const double fetch = sched_transfer_time(w, true, c->w_fetch_bytes, c->w_fetch_copies);
        const double late = deferred_end[b] - out->step_time + fetch - s->first_fwd[b];
        if (late > stall) stall = late;
    }
    if (stall > 0) {
        out->step_time += stall;
        s->waited[SCHED_RES_HOST] += stall;
    }
}

/* Memory held for the whole step, per kind. */
static void static_bytes(const sched_workload_t *w, const sched_plan_t *plan, double stat[SCHED_MEM_COUNT],
                         double *nvme) {
    for (int m = 0; m < SCHED_MEM_COUNT; m++) stat[m] = 0;
    *nvme = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        const sched_block_plan_t *p = &plan->blocks[b];
        const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
        double home, optim, grads;
        sched_block_host_bytes(c, p, &home, &optim, &grads);
        if (sim_grads_transient(w, plan, p)) grads = 0; /* events of overlapped_adam */
        /* pinned buffers are host memory too: in both budgets */
        stat[SCHED_MEM_HOST] += home + optim + grads;
        stat[SCHED_MEM_PINNED] += (sched_block_pinned_home(p) ? c->w_work_bytes : 0) +
                                  (sched_block_pinned_grads(p) ? grads : 0);
        *nvme += sched_block_nvme_bytes(c, p);
        if (p->weights == SCHED_WEIGHTS_RESIDENT) stat[SCHED_MEM_DEVICE] += c->w_resident_bytes;
        if (p->grads == SCHED_GRADS_DEVICE) stat[SCHED_MEM_DEVICE] += c->grad_bytes;
        if (p->optim == SCHED_OPTIM_DEVICE) stat[SCHED_MEM_DEVICE] += c->optim_bytes;
    }
}

/* The result's totals, waits, bottleneck and memory peaks (and timelines
 * and tasks when asked for); takes over the simulator's task list and
 * frees its memory events. */
static void fill_result(sim_t *s, const double stat[SCHED_MEM_COUNT], const sched_sim_opts_t *opts,
                        sched_sim_result_t *out) {
    memcpy(out->busy, s->busy, sizeof out->busy);
    memcpy(out->waited, s->waited, sizeof out->waited);
    out->compute_idle = out->step_time - s->busy[SCHED_RES_COMPUTE];
    out->bottleneck = SCHED_RES_COMPUTE;
    double best = s->busy[SCHED_RES_COMPUTE];
    for (int r = 1; r < SCHED_RES_COUNT; r++)
        if (s->waited[r] > best) best = s->waited[r], out->bottleneck = (sched_resource_t)r;
    /* compute busier than any one wait, but its idle time split between
     * streams: a stream busier than compute still bounds the step (a faster
     * compute would not shorten it) */
    if (out->bottleneck == SCHED_RES_COMPUTE)
        for (int r = 1; r < SCHED_RES_COUNT; r++)
            if (s->waited[r] > 0 && s->busy[r] > best) best = s->busy[r], out->bottleneck = (sched_resource_t)r;
    for (int m = 0; m < SCHED_MEM_COUNT; m++) {
        out->static_bytes[m] = stat[m];
        out->peak[m] = sim_finish_mem(s, (sched_mem_t)m, stat[m], opts && opts->timelines, &out->timeline[m]);
        free(s->ev[m]);
    }
    free(s->nvme_busy);
    out->h2d_bytes = s->h2d_bytes;
    out->d2h_bytes = s->d2h_bytes;
    out->peer_bytes = s->peer_bytes;
    out->nvme_read_bytes = s->nvme_read_bytes;
    out->nvme_write_bytes = s->nvme_write_bytes;
    out->tasks = s->tasks;
    out->num_tasks = s->ntasks;
}

/* The plan against the workload: sched_plan_check, and expert parallel
 * only on blocks with routed experts. */
static mt_status_t check_plan(const sched_workload_t *w, const sched_plan_t *plan, mt_error_t *err) {
    mt_status_t st = sched_plan_check(plan, w->num_blocks, err);
    if (st != MT_OK) return st;
    for (int b = 0; b < w->num_blocks; b++)
        if (plan->blocks[b].expert_parallel && !(w->moe && w->moe[b]))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "block %d: expert parallel needs a block with routed experts (a MoE layer)", b);
    for (int b = 0; b < w->num_blocks; b++)
        if ((sched_block_nvme_optim(&plan->blocks[b]) || sched_block_nvme_weights(&plan->blocks[b])) &&
            !(w->nvme_read_bw > 0 && w->nvme_write_bw > 0))
            return mt_error_set(err, MT_ERR_CONFIG,
                                "block %d: the plan keeps state on NVMe, but the hardware profile has no nvme: "
                                "section (its read and write rates)", b);
    return MT_OK;
}

static mt_status_t simulate_once(const sched_workload_t *w, const sched_plan_t *plan, const sched_sim_opts_t *opts,
                                 sched_sim_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->compute_stretch = 1.0;
    mt_status_t st = check_plan(w, plan, err);
    if (st != MT_OK) return st;
    const int N = w->num_blocks;
    sim_t s = {.w = w, .keep_tasks = opts && opts->tasks};
    s.first_fwd = malloc((size_t)N * sizeof *s.first_fwd);
    MT_CHECK_ALLOC(s.first_fwd, "simulator block starts");
    for (int b = 0; b < N; b++) s.first_fwd[b] = -1;
    s.take_back = !opts_in_step(opts) && sim_may_take_back(plan);
    /* one device: several sum their gradients after the backward (engine/exec/optim.h) */
    s.norm_ahead = !opts_in_step(opts) && w->has_trainable;
    s.overlap = malloc((size_t)2 * (size_t)N * sizeof *s.overlap);
    s.overlap_end = calloc((size_t)N, sizeof *s.overlap_end);
    s.norm_done = calloc((size_t)N, sizeof *s.norm_done);
    MT_CHECK(s.overlap && s.overlap_end && s.norm_done, "out of host memory for the simulator's overlapped updates");
    double *deferred_end = calloc((size_t)N, sizeof *deferred_end); /* 0: not deferred */
    MT_CHECK_ALLOC(deferred_end, "simulator deferred updates");
    bool *adam_done = calloc((size_t)N, sizeof *adam_done);
    MT_CHECK_ALLOC(adam_done, "simulator overlapped updates");
    double stat[SCHED_MEM_COUNT];
    static_bytes(w, plan, stat, &out->nvme_bytes);
    const bool overlap = !sched_waits_for_norm(w, plan) && w->has_trainable;
    const double last_compute_end = plan->layer_major ? sim_layer_major(&s, w, plan, overlap, adam_done, out)
                                                      : sim_micro_batch_major(&s, w, plan, overlap, adam_done, out);
    sim_settle_overlapped(&s, w, plan, adam_done);
    const double t = sim_optimizer_step(&s, w, plan, opts, last_compute_end, adam_done, deferred_end);
    out->step_time = s.end_max > t ? s.end_max : t;
    add_deferred_stall(&s, w, plan, deferred_end, out);
    fill_result(&s, stat, opts, out);
    free(adam_done);
    free(deferred_end);
    free(s.first_fwd);
    free(s.overlap);
    free(s.overlap_end);
    free(s.norm_done);
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
    SIM_EXTEND(nvme_read_bytes);
    SIM_EXTEND(nvme_write_bytes);
    SIM_EXTEND(recompute_s);
    SIM_EXTEND(input_d2h_bytes);
    SIM_EXTEND(input_h2d_bytes);
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
