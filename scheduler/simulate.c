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
#include "scheduler/simulate.h"

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
    double nvme_read_bytes, nvme_write_bytes;
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

/* One request stream on the NVMe array. */
static double nvme_io(sim_t *s, bool read, int block, int micro, double ready, double bytes, double *start_out) {
    if (read) s->nvme_read_bytes += bytes;
    else s->nvme_write_bytes += bytes;
    const double dur = read ? sched_nvme_read_time(s->w, bytes) : sched_nvme_write_time(s->w, bytes);
    return run(s, SCHED_RES_NVME, read ? SCHED_TASK_NVME_READ : SCHED_TASK_NVME_WRITE, block, micro, ready, dur,
               bytes, start_out);
}

/* Packing `bytes` into staging on the pack threads once `ready` (nothing
 * when the workload does not model it, or for bytes that are plain copies:
 * the caller passes the converted share); returns when the copy may start. */
static double pack(sim_t *s, int block, int micro, double ready, double bytes, double *start_out) {
    const double dur = sched_pack_time(s->w, bytes);
    *start_out = ready;
    if (dur <= 0) return ready;
    return run(s, SCHED_RES_PACK, SCHED_TASK_PACK, block, micro, ready, dur, bytes, start_out);
}

/* Gradients of `bytes` landed by a D2H copy ending at `end`: unpacked into
 * host memory on the D2H stream (copied, or added when `dur` is the add's
 * time; dur < 0: the copy's at the unpack rate).  Returns the unpack's end. */
static double unpack(sim_t *s, int block, int micro, double end, double bytes, double dur) {
    if (dur < 0) dur = sched_unpack_time(s->w, bytes);
    if (dur <= 0) return end;
    return run(s, SCHED_RES_D2H, SCHED_TASK_GRAD_HOST, block, micro, end, dur, bytes, NULL);
}

/* A weight fetch of `bytes` for block b issued at `issue`: with its home on
 * NVMe, read into pinned staging first.  Returns when the H2D copy ends;
 * *ready_res is the resource a compute waiting for it waited on. */
static double fetch_weights(sim_t *s, const sched_block_plan_t *p, int b, int micro, double issue, double bytes,
                            double copies, double pack_frac, sched_resource_t *ready_res) {
    double ready = issue;
    *ready_res = SCHED_RES_H2D;
    const bool from_nvme = sched_block_nvme_weights(p);
    if (from_nvme) {
        double r0;
        ready = nvme_io(s, true, b, micro, issue, bytes, &r0);
        mem(s, SCHED_MEM_PINNED, r0, bytes);
    }
    const double read_end = ready;
    double p0;
    const double packed = pack(s, b, micro, ready, bytes * pack_frac, &p0);
    if (!from_nvme && packed > ready) mem(s, SCHED_MEM_PINNED, p0, bytes); /* staging taken as packing starts */
    double c0;
    const double end = copy(s, true, SCHED_TASK_FETCH_W, b, micro, packed, bytes, copies, &c0);
    if (from_nvme || packed > ready) mem(s, SCHED_MEM_PINNED, c0, -bytes); /* the copy holds it from here (copy()) */
    if (c0 <= packed && packed > read_end) *ready_res = SCHED_RES_PACK;
    else if (from_nvme && c0 <= read_end) *ready_res = SCHED_RES_NVME;
    return end;
}

/* Whether block p's host gradient buffer lives only from its D2H to its
 * update (see simulate.h), not the whole step. */
static bool grads_transient(const sched_workload_t *w, const sched_plan_t *plan, const sched_block_plan_t *p) {
    return sched_block_nvme_optim(p) && p->grads == SCHED_GRADS_HOST && !sched_waits_for_norm(w, plan) &&
           w->has_trainable &&
           (plan->layer_major || w->grad_accum <= 1);
}

/* Block b's host AdamW once `ready`: with its state on NVMe, read in first
 * (held in host memory until written back after the update); with its
 * weights' home there, the updated working copy written too.  Returns the
 * AdamW's end, its start in *start_out. */
static double host_adam(sim_t *s, const sched_block_cost_t *c, const sched_block_plan_t *p, int b, double ready,
                        double *start_out) {
    const bool state = sched_block_nvme_optim(p) && c->optim_bytes > 0;
    const double wb = sched_block_nvme_weights(p) ? c->w_update_bytes : 0;
    double t = ready;
    if (state) {
        double r0;
        const double r = nvme_io(s, true, b, -1, ready, c->optim_bytes, &r0);
        mem(s, SCHED_MEM_HOST, r0, c->optim_bytes);
        if (r > t) t = r;
    }
    double start;
    const double end = run(s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, t, c->adam_host_s, 0, &start);
    if (state || wb > 0) {
        const double out = (state ? c->optim_bytes : 0) + wb;
        const double we = nvme_io(s, false, b, -1, end, out, NULL);
        mem(s, SCHED_MEM_HOST, start, wb);
        mem(s, SCHED_MEM_HOST, we, -out);
    }
    if (start_out) *start_out = start;
    return end;
}

/* host_adam after a block's gradients reached the host during the
 * backward; a transient gradient buffer goes with the update. */
static void overlapped_adam(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double d2h_start,
                            double ready) {
    const sched_block_plan_t *p = &plan->blocks[b];
    const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
    const double end = host_adam(s, c, p, b, ready, NULL);
    if (grads_transient(w, plan, p)) {
        mem(s, SCHED_MEM_HOST, d2h_start, c->grad_bytes);
        mem(s, SCHED_MEM_HOST, end, -c->grad_bytes);
    }
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

/* ... a copy of the optimizer phase: an H2D packed first, a gradient D2H
 * unpacked after; each part's time charged to its resource. */
static double opt_copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, double t, double bytes, double copies,
                       double pack_bytes) {
    if (bytes <= 0) return t;
    double p0 = t, packed = t;
    if (h2d) {
        packed = pack(s, block, -1, t, pack_bytes, &p0);
        s->waited[SCHED_RES_PACK] += packed - t;
    }
    double start, end = copy(s, h2d, kind, block, -1, packed, bytes, copies, &start);
    if (packed > t) { /* staging held from the pack's start */
        mem(s, SCHED_MEM_PINNED, p0, bytes);
        mem(s, SCHED_MEM_PINNED, start, -bytes);
    }
    s->waited[h2d ? SCHED_RES_H2D : SCHED_RES_D2H] += end - start;
    if (!h2d && kind == SCHED_TASK_GRAD_D2H) {
        const double landed = end;
        end = unpack(s, block, -1, landed, bytes, -1);
        s->waited[SCHED_RES_D2H] += end - landed;
    }
    return end;
}

/* Layer-major: adds a block's one weight fetch per use (the experts any
 * micro-batch of the step hits) to *bytes and *copies. */
static void lm_step_fetch(const sched_block_cost_t *c, double *bytes, double *copies) {
    *bytes += c->w_fetch_step_bytes > 0 ? c->w_fetch_step_bytes : c->w_fetch_bytes;
    *copies += c->w_fetch_step_bytes > 0 ? c->w_fetch_step_copies : c->w_fetch_copies;
}

/* Layer-major: bytes of micro-batch mb's block b sent D2H once its forward
 * ended; held in pinned memory, freed on the device when the copy ends. */
static double lm_offload(sim_t *s, sched_task_kind_t kind, int b, int mb, double end, double bytes, double copies) {
    const double oe = copy(s, false, kind, b, mb, end, bytes, copies, NULL);
    mem(s, SCHED_MEM_PINNED, oe, bytes);
    mem(s, SCHED_MEM_DEVICE, oe, -bytes);
    return oe;
}

/* Layer-major: lm_offload's bytes back H2D before the backward, issued when
 * the previous micro-batch's compute started and the offload has landed;
 * device memory from the issue.  Moves *ready to the copy's end.  A copy
 * queued behind the one that made *ready (the block's weights, say, late
 * from NVMe) leaves the wait charged to what held that one up. */
static void lm_fetch_back(sim_t *s, sched_task_kind_t kind, int b, int mb, double prev_start, double landed,
                          double bytes, double copies, double *ready, sched_resource_t *ready_res) {
    const double r = prev_start > landed ? prev_start : landed;
    double c0;
    const double t1 = copy(s, true, kind, b, mb, r, bytes, copies, &c0);
    mem(s, SCHED_MEM_DEVICE, r, bytes);
    mem(s, SCHED_MEM_PINNED, t1, -bytes);
    if (t1 > *ready) {
        if (c0 < *ready || *ready_res == SCHED_RES_COMPUTE) *ready_res = SCHED_RES_H2D;
        *ready = t1;
    }
}

/* Layer-major: a backward use's offloaded block inputs, every micro-batch's
 * (landed[mb]: its offload's end) at once, as the executor issues them
 * ahead of the next uses' fetches; ready[mb] and res[mb] get when each is
 * back and what it waited for (micro-batch 0's start from the use's weight
 * fetch, wready and wres).  Returns the bytes fetched. */
static double lm_fetch_inputs(sim_t *s, int b, int ga, double prev_start, const double *landed, double bytes,
                              double wready, sched_resource_t wres, double *ready, sched_resource_t *res) {
    for (int mb = 0; mb < ga; mb++) {
        ready[mb] = mb == 0 ? wready : 0;
        res[mb] = mb == 0 ? wres : SCHED_RES_COMPUTE;
        lm_fetch_back(s, SCHED_TASK_FETCH_INPUT, b, mb, prev_start, landed[mb], bytes, 1, &ready[mb], &res[mb]);
    }
    return ga * bytes;
}

/* Layer-major's per-step scratch (sim_layer_major). */
typedef struct {
    double *use_end;          /* (2N - 1) each use's last compute end */
    double *offload_end;      /* (N, ga) offloaded activations reached pinned memory */
    double *input_end;        /* (N, ga) an offloaded block input reached pinned memory */
    double *in_ready;         /* (ga) this use's block inputs back on the device */
    sched_resource_t *in_res; /* (ga) ... and what they waited for */
    double *d2h_end;          /* per use that sends D2H, in issue order */
} lm_scratch_t;

static void lm_scratch_init(lm_scratch_t *t, int N, int ga) {
    t->use_end = malloc((size_t)(2 * N - 1) * sizeof *t->use_end);
    t->offload_end = calloc((size_t)N * ga, sizeof *t->offload_end);
    t->input_end = calloc((size_t)N * ga, sizeof *t->input_end);
    t->in_ready = calloc((size_t)ga, sizeof *t->in_ready);
    t->in_res = calloc((size_t)ga, sizeof *t->in_res);
    t->d2h_end = malloc(((size_t)N * (ga + 1) + 1) * sizeof *t->d2h_end);
    MT_CHECK(t->use_end && t->offload_end && t->input_end && t->in_ready && t->in_res && t->d2h_end,
             "out of host memory in the simulator");
}

static void lm_scratch_free(lm_scratch_t *t) {
    free(t->use_end);
    free(t->offload_end);
    free(t->input_end);
    free(t->in_ready);
    free(t->in_res);
    free(t->d2h_end);
}

/* Layer-major order (plan->layer_major; engine/exec/layer_major.c): the
 * uses of blocks are embedding and layers forward, the head, then layers
 * and embedding backward, 2N - 1 uses, each running all ga micro-batches;
 * the fetches for use u are issued as use u - W - 1 ends, once per use
 * (weights: the experts any micro-batch of the step hits).  Forward: each
 * micro-batch's saved set (or input) less its block input, and its output
 * (the next block's input), are allocated at its forward; activations are
 * offloaded after it as in micro-batch order, and so is the block input
 * where lm_inputs says so.  The head runs forward and backward per
 * micro-batch.  Backward: a micro-batch's offloaded activations are
 * fetched while the previous micro-batch computes, the use's offloaded
 * block inputs, all of them, while the previous use's last one computes;
 * micro-batches after the first add their gradients on the device (grads
 * HOST too: the sum stays on the device) and a grads HOST block sends the
 * step's sum once after its last micro-batch.  Returns the last compute end. */
static double sim_layer_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                              bool *adam_done, sched_sim_result_t *out) {
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1, W = plan->prefetch_window;
    const int U = 2 * N - 1;
    lm_scratch_t sc;
    lm_scratch_init(&sc, N, ga);
    int n_d2h = 0;
    double last_end = 0, prev_start = 0, turn_w = 0;
    for (int u = 0; u < U; u++) {
        const bool fwd = u < N - 1, head = u == N - 1;
        const int b = u < N ? u : 2 * N - 2 - u;
        const sched_block_plan_t *p = &plan->blocks[b];
        const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
        const bool turn = W >= 1 && N >= 3 && b == N - 2;
        const sched_act_place_t acts =
            b == 0 || b == N - 1 || (turn && p->acts == SCHED_ACTS_OFFLOAD) ? SCHED_ACTS_KEEP : p->acts;
        const double issue = u - W - 1 >= 0 ? sc.use_end[u - W - 1] : 0;
        const bool held = !fwd && !head && turn;
        double fw = 0, fw_copies = 0;
        if (!held && p->weights == SCHED_WEIGHTS_STREAM) lm_step_fetch(c, &fw, &fw_copies);
        if (head && w->tied_head && plan->blocks[0].weights == SCHED_WEIGHTS_STREAM)
            lm_step_fetch(&w->blocks[0], &fw, &fw_copies);
        double wready = 0;
        sched_resource_t wres = SCHED_RES_H2D; /* what a compute waiting for the fetch waited on */
        if (fw > 0) {
            wready = fetch_weights(s, p, b, -1, issue, fw, fw_copies, c->w_pack_frac, &wres);
            mem(s, SCHED_MEM_DEVICE, issue, fw);
        }
        const double off = c->act_saved_bytes - c->act_input_bytes;
        const bool grads_host = !fwd && w->has_trainable && p->grads == SCHED_GRADS_HOST && c->grad_mb_bytes > 0;
        const double in = b >= 1 ? c->act_input_bytes : 0; /* allocated by the block before, its output */
        const double out_next =
            fwd ? sched_block_cost(w, b + 1, plan->blocks[b + 1].expert_parallel)->act_input_bytes : 0;
        const bool sends_input = sched_block_inputs_offloaded(plan, b) && in > 0;
        if (!fwd && !head && sends_input)
            out->input_h2d_bytes +=
                lm_fetch_inputs(s, b, ga, prev_start, sc.input_end + (size_t)b * ga, in, fw > 0 ? wready : 0,
                                fw > 0 ? wres : SCHED_RES_COMPUTE, sc.in_ready, sc.in_res);
        double end = last_end;
        for (int mb = 0; mb < ga; mb++) {
            double ready = mb == 0 ? wready : 0;
            sched_resource_t ready_res = mb == 0 && fw > 0 ? wres : SCHED_RES_COMPUTE;
            const bool sends_acts = fwd && acts == SCHED_ACTS_OFFLOAD && off > 0;
            const bool sends_grads = grads_host && mb == ga - 1;
            if (!fwd && !head && sends_input && sc.in_ready[mb] > ready)
                ready = sc.in_ready[mb], ready_res = sc.in_res[mb];
            /* issued while the previous micro-batch computes */
            if (!fwd && !head && acts == SCHED_ACTS_OFFLOAD && off > 0)
                lm_fetch_back(s, SCHED_TASK_FETCH_ACT, b, mb, prev_start, sc.offload_end[(size_t)b * ga + mb], off,
                              c->act_copies, &ready, &ready_res);
            /* a gradient batch waits for the one W + 1 sends earlier, as in
             * micro-batch order; activation offloads do not: the staging
             * pool holds every micro-batch's (the executor sizes it for k
             * times the tokens), so nothing makes the forward wait for them */
            int dslot = -1;
            if (sends_acts || sends_grads) {
                const double gate = sends_grads && n_d2h > W ? sc.d2h_end[n_d2h - W - 1] : 0;
                if (gate > ready) ready = gate, ready_res = SCHED_RES_D2H;
                dslot = n_d2h++;
            }
            double start;
            if (fwd || head) {
                end = compute(s, SCHED_TASK_FWD, b, mb, ready, ready_res, c->fwd_s, &start);
                end = exchange(s, b, mb, start, end, c->xchg_fwd_bytes);
                prev_start = start;
                const double saved = acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
                mem(s, SCHED_MEM_DEVICE, start, saved - in + out_next + c->fwd_temp_bytes);
                mem(s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
                if (sends_acts)
                    sc.d2h_end[dslot] = sc.offload_end[(size_t)b * ga + mb] =
                        lm_offload(s, SCHED_TASK_OFFLOAD_ACT, b, mb, end, off, c->act_copies);
                if (fwd && sends_input) { /* not gated, as activation offloads (see above) */
                    sc.input_end[(size_t)b * ga + mb] = lm_offload(s, SCHED_TASK_OFFLOAD_INPUT, b, mb, end, in, 1);
                    out->input_d2h_bytes += in;
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
                    double t0;
                    const double landed = copy(s, false, SCHED_TASK_GRAD_D2H, b, mb, end, gb, gc, &t0);
                    mem(s, SCHED_MEM_DEVICE, landed, -c->grad_mb_bytes);
                    const double t = unpack(s, b, mb, landed, gb, -1); /* into the host buffer: a copy */
                    sc.d2h_end[dslot] = t;
                    if (overlap && p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
                        overlapped_adam(s, w, plan, b, t0, t);
                        adam_done[b] = true;
                    }
                }
            }
        }
        if (fw > 0) {
            if (fwd && turn) turn_w = fw;
            else mem(s, SCHED_MEM_DEVICE, end, -fw);
        }
        if (held) mem(s, SCHED_MEM_DEVICE, end, -turn_w);
        sc.use_end[u] = end;
        last_end = end;
    }
    lm_scratch_free(&sc);
    return last_end;
}

/* Micro-batch order's state across its uses of blocks (per micro-batch, a
 * forward phase over blocks 0..N-1, then a backward phase N-1..0), shared
 * by the steps of one use below. */
typedef struct {
    sim_t *s;
    const sched_workload_t *w;
    const sched_plan_t *plan;
    sched_sim_result_t *out;
    bool overlap;          /* host AdamW may start during the backward (no clipping) */
    bool *adam_done;       /* per block: its host AdamW ran during the backward */
    double *phase_end;     /* compute end per position of the current phase */
    double *d2h_end;       /* per use that sends D2H, in issue order: when its sending ended */
    double *offload_end;   /* per block: when its offloaded activations reached pinned memory */
    int n_d2h;             /* uses that sent D2H so far */
    double head_w, turn_w; /* weight bytes the head and the turn hold from forward to backward */
    double last_end;       /* the last compute task's end */
} mb_order_t;

/* One use of a block in micro-batch order: which, and what it moves. */
typedef struct {
    int b, mb, i;          /* block, micro-batch, position in the phase */
    bool fwd, last_mb;
    bool turn;             /* the last decoder layer at the turn from forward to backward */
    bool held;             /* a backward whose weights stayed from the forward */
    bool grads_d2h;        /* a backward that sends its gradients to the host */
    const sched_block_plan_t *p;
    const sched_block_cost_t *c;
    sched_act_place_t acts;
    double issue;          /* when its fetches are issued */
    double fw, fw_copies;  /* weight bytes fetched for it, and their copies */
    double off;            /* activation bytes an offload moves (the input stays on the device) */
} mb_use_t;

static mb_use_t mb_use_describe(const mb_order_t *m, int mb, bool fwd, int i, double phase_start) {
    const sched_workload_t *w = m->w;
    const sched_plan_t *plan = m->plan;
    const int N = w->num_blocks, W = plan->prefetch_window;
    const int ga = w->grad_accum > 0 ? w->grad_accum : 1;
    mb_use_t u = {.b = fwd ? i : N - 1 - i, .mb = mb, .i = i, .fwd = fwd, .last_mb = mb == ga - 1};
    const int b = u.b;
    u.p = &plan->blocks[b];
    u.c = sched_block_cost(w, b, u.p->expert_parallel);
    /* the last layer at the turn from forward to backward (engine/exec/place/plan_query.h,
     * exec_turn_held): with a window of at least 1 its streamed weights and offloaded
     * activations stay on the device from its forward to its backward */
    u.turn = W >= 1 && N >= 3 && b == N - 2;
    /* the embedding's and the head's forward and backward are adjacent: the executor keeps their
     * activations whatever the plan says */
    u.acts = b == 0 || b == N - 1 || (u.turn && u.p->acts == SCHED_ACTS_OFFLOAD) ? SCHED_ACTS_KEEP : u.p->acts;
    /* the fetches for position i are issued just before position i - W computes */
    u.issue = i - W - 1 >= 0 ? m->phase_end[i - W - 1] : phase_start;
    /* the head's weights stay from its forward to its backward, and so do the turn's */
    u.held = !fwd && (b == N - 1 || u.turn);
    if (!u.held && u.p->weights == SCHED_WEIGHTS_STREAM) u.fw = u.c->w_fetch_bytes, u.fw_copies = u.c->w_fetch_copies;
    if (!u.held && b == N - 1 && w->tied_head && plan->blocks[0].weights == SCHED_WEIGHTS_STREAM) {
        u.fw += w->blocks[0].w_fetch_bytes;
        u.fw_copies += w->blocks[0].w_fetch_copies;
    }
    u.off = u.c->act_saved_bytes - u.c->act_input_bytes;
    u.grads_d2h = !fwd && w->has_trainable && u.p->grads == SCHED_GRADS_HOST && u.c->grad_mb_bytes > 0;
    return u;
}

/* The use's H2D fetches (weights, then offloaded activations before a
 * backward); returns when they are in, and the resource waited for. */
static double mb_fetch(mb_order_t *m, const mb_use_t *u, sched_resource_t *ready_res) {
    sim_t *s = m->s;
    const double fa = !u->fwd && u->acts == SCHED_ACTS_OFFLOAD ? u->off : 0;
    double ready = 0;
    *ready_res = SCHED_RES_COMPUTE;
    if (u->fw > 0) {
        ready = fetch_weights(s, u->p, u->b, u->mb, u->issue, u->fw, u->fw_copies, u->c->w_pack_frac, ready_res);
        mem(s, SCHED_MEM_DEVICE, u->issue, u->fw); /* allocated when issued */
    }
    if (fa > 0) {
        const double r = u->issue > m->offload_end[u->b] ? u->issue : m->offload_end[u->b];
        double t1 = copy(s, true, SCHED_TASK_FETCH_ACT, u->b, u->mb, r, fa, u->c->act_copies, NULL);
        mem(s, SCHED_MEM_DEVICE, u->issue, fa);
        mem(s, SCHED_MEM_PINNED, t1, -fa); /* the offloaded copy lived in pinned memory */
        if (t1 > ready) ready = t1, *ready_res = SCHED_RES_H2D;
    }
    return ready;
}

/* Uses that send activations or gradients D2H wait for the D2H issued
 * W + 1 such uses earlier (bounded device memory).  Returns the use's slot
 * in d2h_end, -1 when it sends nothing. */
static int mb_d2h_gate(mb_order_t *m, const mb_use_t *u, double *ready, sched_resource_t *ready_res) {
    const int W = m->plan->prefetch_window;
    const bool sends = u->fwd ? u->acts == SCHED_ACTS_OFFLOAD && u->off > 0 : u->grads_d2h;
    if (!sends) return -1;
    const double gate = m->n_d2h > W ? m->d2h_end[m->n_d2h - W - 1] : 0;
    if (gate > *ready) *ready = gate, *ready_res = SCHED_RES_D2H;
    return m->n_d2h++;
}

/* The forward's compute and the memory it takes; returns its end. */
static double mb_forward(mb_order_t *m, const mb_use_t *u, double ready, sched_resource_t ready_res) {
    sim_t *s = m->s;
    const sched_block_cost_t *c = u->c;
    double start;
    double end = compute(s, SCHED_TASK_FWD, u->b, u->mb, ready, ready_res, c->fwd_s, &start);
    end = exchange(s, u->b, u->mb, start, end, c->xchg_fwd_bytes);
    const double saved = u->acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
    mem(s, SCHED_MEM_DEVICE, start, saved + c->fwd_temp_bytes);
    mem(s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
    return end;
}

/* The backward's compute (with recomputation and the device gradient add)
 * and the memory it takes and frees; returns its end. */
static double mb_backward(mb_order_t *m, const mb_use_t *u, double ready, sched_resource_t ready_res) {
    sim_t *s = m->s;
    const sched_block_cost_t *c = u->c;
    const bool rc = u->acts == SCHED_ACTS_RECOMPUTE;
    /* later micro-batches compute device gradients into a fresh buffer, then add */
    const bool dev_add = u->mb > 0 && m->w->has_trainable && u->p->grads == SCHED_GRADS_DEVICE;
    const double dur = c->bwd_s + (rc ? c->recompute_s : 0) + (dev_add ? c->grad_add_device_s : 0);
    double start;
    double end = compute(s, SCHED_TASK_BWD, u->b, u->mb, ready, ready_res, dur, &start);
    end = exchange(s, u->b, u->mb, start, end, c->xchg_bwd_bytes + (rc ? c->xchg_fwd_bytes : 0));
    if (rc) m->out->recompute_s += c->recompute_s;
    const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
    const double grads = u->grads_d2h || dev_add ? c->grad_mb_bytes : 0;
    mem(s, SCHED_MEM_DEVICE, start, temp + grads + (rc ? c->act_saved_bytes - c->act_input_bytes : 0));
    mem(s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes - (dev_add ? grads : 0));
    return end;
}

/* The fetched weights go when the compute ends, except those the head and
 * the turn hold from their forward to their backward, which go then. */
static void mb_release_weights(mb_order_t *m, const mb_use_t *u, double end) {
    const int N = m->w->num_blocks;
    if (u->fw > 0 && !(u->fwd && (u->b == N - 1 || u->turn))) mem(m->s, SCHED_MEM_DEVICE, end, -u->fw);
    if (u->fwd && u->b == N - 1) m->head_w = u->fw;
    if (u->fwd && u->turn) m->turn_w = u->fw;
    if (u->held) mem(m->s, SCHED_MEM_DEVICE, end, u->b == N - 1 ? -m->head_w : -m->turn_w);
}

/* After a forward with OFFLOAD activations: their D2H into pinned memory. */
static void mb_offload_acts(mb_order_t *m, const mb_use_t *u, double end, int dslot) {
    if (!(u->fwd && u->acts == SCHED_ACTS_OFFLOAD && u->off > 0)) return;
    sim_t *s = m->s;
    double t0;
    m->offload_end[u->b] = copy(s, false, SCHED_TASK_OFFLOAD_ACT, u->b, u->mb, end, u->off, u->c->act_copies, &t0);
    /* the copy stays in pinned memory until fetched back */
    mem(s, SCHED_MEM_PINNED, m->offload_end[u->b], u->off);
    mem(s, SCHED_MEM_DEVICE, m->offload_end[u->b], -u->off);
    if (dslot >= 0) m->d2h_end[dslot] = m->offload_end[u->b];
}

/* After a backward with grads HOST: the gradients' D2H (the first
 * micro-batch straight into the host buffer; later ones through staging,
 * then added on the host in the D2H stream's order), and on the last
 * micro-batch the overlapped host AdamW. */
static void mb_send_grads(mb_order_t *m, const mb_use_t *u, double end, int dslot) {
    if (!u->grads_d2h) return;
    sim_t *s = m->s;
    const sched_block_cost_t *c = u->c;
    double t0;
    double t = copy(s, false, SCHED_TASK_GRAD_D2H, u->b, u->mb, end, c->grad_mb_bytes, c->grad_mb_copies, &t0);
    mem(s, SCHED_MEM_DEVICE, t, -c->grad_mb_bytes);
    t = unpack(s, u->b, u->mb, t, c->grad_mb_bytes, u->mb > 0 ? c->grad_add_host_s : -1);
    m->d2h_end[dslot] = t;
    if (u->last_mb && m->overlap && u->p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
        overlapped_adam(s, m->w, m->plan, u->b, t0, t);
        m->adam_done[u->b] = true;
    }
}

/* One use of a block, in the executor's issue order: fetches, the D2H
 * gate, the compute, then the copies that follow it. */
static void mb_use(mb_order_t *m, int mb, bool fwd, int i, double phase_start) {
    const mb_use_t u = mb_use_describe(m, mb, fwd, i, phase_start);
    sched_resource_t ready_res;
    double ready = mb_fetch(m, &u, &ready_res);
    const int dslot = mb_d2h_gate(m, &u, &ready, &ready_res);
    const double end = fwd ? mb_forward(m, &u, ready, ready_res) : mb_backward(m, &u, ready, ready_res);
    mb_release_weights(m, &u, end);
    m->phase_end[i] = end;
    m->last_end = end;
    mb_offload_acts(m, &u, end, dslot);
    mb_send_grads(m, &u, end, dslot);
}

/* Micro-batch order (see simulate.h).  Returns the last compute end. */
static double sim_micro_batch_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                                    bool *adam_done, sched_sim_result_t *out) {
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1;
    mb_order_t m = {.s = s, .w = w, .plan = plan, .out = out, .overlap = overlap, .adam_done = adam_done};
    m.phase_end = malloc((size_t)N * sizeof *m.phase_end);
    m.d2h_end = malloc(((size_t)2 * (size_t)N * (size_t)ga + 1) * sizeof *m.d2h_end);
    m.offload_end = calloc((size_t)N, sizeof *m.offload_end);
    MT_CHECK(m.phase_end && m.d2h_end && m.offload_end, "out of host memory in the simulator");
    for (int mb = 0; mb < ga; mb++) {
        for (int phase = 0; phase < 2; phase++) {
            const double phase_start = m.last_end;
            for (int i = 0; i < N; i++) mb_use(&m, mb, phase == 0, i, phase_start);
        }
    }
    free(m.phase_end);
    free(m.d2h_end);
    free(m.offload_end);
    return m.last_end;
}

/* The global norm of the optimizer step: its host part, then its device
 * part; returns its end. */
static double opt_norm(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, double t) {
    double norm_host = 0, norm_dev = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
        if (c->grad_step_bytes <= 0) continue;
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
        deferred_end[b] = host_adam(s, c, p, b, t, NULL);
        s->off_step = false;
        if (b <= plan->prefetch_window) {
            s->waited[SCHED_RES_HOST] += deferred_end[b] > t ? deferred_end[b] - t : 0;
            t = deferred_end[b] > t ? deferred_end[b] : t;
        }
        return t;
    }
    if (!adam_done[b]) {
        if (p->grads == SCHED_GRADS_DEVICE)
            t = opt_copy(s, false, SCHED_TASK_GRAD_D2H, b, t, c->grad_step_bytes, c->grad_step_copies, 0);
        double start;
        const double end = host_adam(s, c, p, b, t, &start);
        s->waited[SCHED_RES_NVME] += start - t; /* the state's read (0 without NVMe) */
        s->waited[SCHED_RES_HOST] += end - start;
        t = end;
    }
    if (resident && c->w_update_bytes > 0)
        t = opt_copy(s, true, SCHED_TASK_W_UPDATE, b, t, c->w_update_bytes, c->w_update_copies,
                     c->w_update_bytes * c->w_update_pack_frac);
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
        if (grads_transient(w, plan, p)) grads = 0; /* events of overlapped_adam */
        stat[SCHED_MEM_HOST] += home + optim + grads;
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
    for (int m = 0; m < SCHED_MEM_COUNT; m++) {
        out->static_bytes[m] = stat[m];
        out->peak[m] = finish_mem(s, (sched_mem_t)m, stat[m], opts && opts->timelines, &out->timeline[m]);
        free(s->ev[m]);
    }
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
    double *deferred_end = calloc((size_t)N, sizeof *deferred_end); /* 0: not deferred */
    MT_CHECK_ALLOC(deferred_end, "simulator deferred updates");
    bool *adam_done = calloc((size_t)N, sizeof *adam_done);
    MT_CHECK_ALLOC(adam_done, "simulator overlapped updates");
    double stat[SCHED_MEM_COUNT];
    static_bytes(w, plan, stat, &out->nvme_bytes);
    const bool overlap = !sched_waits_for_norm(w, plan) && w->has_trainable;
    const double last_compute_end = plan->layer_major ? sim_layer_major(&s, w, plan, overlap, adam_done, out)
                                                      : sim_micro_batch_major(&s, w, plan, overlap, adam_done, out);
    const double t = sim_optimizer_step(&s, w, plan, opts, last_compute_end, adam_done, deferred_end);
    out->step_time = s.end_max > t ? s.end_max : t;
    add_deferred_stall(&s, w, plan, deferred_end, out);
    fill_result(&s, stat, opts, out);
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
