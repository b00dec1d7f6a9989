/* The layer-major step order (plan.layer_major; see simulate.h and
 * sim_layer_major below): each use of a block runs every micro-batch
 * before the next use. */
#include "scheduler/simulate_internal.h"

#include <stdlib.h>

/* Layer-major: adds a block's one weight fetch per use (the experts any
 * micro-batch of the step hits) to *bytes and *copies. */
static void lm_step_fetch(const sched_block_cost_t *c, double *bytes, double *copies) {
    *bytes += c->w_fetch_step_bytes > 0 ? c->w_fetch_step_bytes : c->w_fetch_bytes;
    *copies += c->w_fetch_step_bytes > 0 ? c->w_fetch_step_copies : c->w_fetch_copies;
}

/* Layer-major: bytes of micro-batch mb's block b sent D2H once its forward
 * ended; held in pinned memory, freed on the device when the copy ends. */
static double lm_offload(sim_t *s, sched_task_kind_t kind, int b, int mb, double end, double bytes, double copies) {
    const double oe = sim_copy(s, false, kind, b, mb, end, bytes, copies, NULL);
    sim_mem(s, SCHED_MEM_PINNED, oe, bytes);
    sim_mem(s, SCHED_MEM_DEVICE, oe, -bytes);
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
    const double t1 = sim_copy(s, true, kind, b, mb, r, bytes, copies, &c0);
    sim_mem(s, SCHED_MEM_DEVICE, r, bytes);
    sim_mem(s, SCHED_MEM_PINNED, t1, -bytes);
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
    sched_resource_t *d2h_res; /* ... and what decided that end (the link, or the unpack) */
} lm_scratch_t;

static void lm_scratch_init(lm_scratch_t *t, int N, int ga) {
    t->use_end = malloc((size_t)(2 * N - 1) * sizeof *t->use_end);
    t->offload_end = calloc((size_t)N * ga, sizeof *t->offload_end);
    t->input_end = calloc((size_t)N * ga, sizeof *t->input_end);
    t->in_ready = calloc((size_t)ga, sizeof *t->in_ready);
    t->in_res = calloc((size_t)ga, sizeof *t->in_res);
    t->d2h_end = malloc(((size_t)N * (ga + 1) + 1) * sizeof *t->d2h_end);
    t->d2h_res = malloc(((size_t)N * (ga + 1) + 1) * sizeof *t->d2h_res);
    MT_CHECK(t->use_end && t->offload_end && t->input_end && t->in_ready && t->in_res && t->d2h_end && t->d2h_res,
             "out of host memory in the simulator");
}

static void lm_scratch_free(lm_scratch_t *t) {
    free(t->use_end);
    free(t->offload_end);
    free(t->input_end);
    free(t->in_ready);
    free(t->in_res);
    free(t->d2h_end);
    free(t->d2h_res);
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
double sim_layer_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
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
            wready = sim_fetch_weights(s, p, b, -1, issue, fw, fw_copies, sched_block_pack_frac(c, p, false), &wres);
            sim_mem(s, SCHED_MEM_DEVICE, issue, fw);
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
                if (gate > ready) ready = gate, ready_res = sc.d2h_res[n_d2h - W - 1];
                dslot = n_d2h++;
                sc.d2h_res[dslot] = SCHED_RES_D2H;
            }
            double start;
            if (fwd || head) {
                end = sim_compute(s, SCHED_TASK_FWD, b, mb, ready, ready_res, c->fwd_s, &start);
                end = sim_exchange(s, b, mb, start, end, c->xchg_fwd_bytes);
                prev_start = start;
                const double saved = acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
                sim_mem(s, SCHED_MEM_DEVICE, start, saved - in + out_next + c->fwd_temp_bytes);
                sim_mem(s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
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
                end = sim_compute(s, SCHED_TASK_BWD, b, mb, end > ready ? end : ready, ready_res, dur, &start);
                end = sim_exchange(s, b, mb, start, end, c->xchg_bwd_bytes + (rc ? c->xchg_fwd_bytes : 0));
                prev_start = start;
                if (rc) out->recompute_s += c->recompute_s;
                const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
                /* the first micro-batch's gradients (grads HOST: the device sum until sent) */
                const double g0 = grads_host && mb == 0 ? c->grad_mb_bytes : 0;
                const double gk = dev_add ? c->grad_mb_bytes : 0;
                sim_mem(s, SCHED_MEM_DEVICE, start, temp + g0 + gk + (rc ? off : 0));
                sim_mem(s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes - gk);
                if (sends_grads) {
                    const double gb = c->grad_step_bytes > 0 ? c->grad_step_bytes : c->grad_mb_bytes;
                    const double gc = c->grad_step_bytes > 0 ? c->grad_step_copies : c->grad_mb_copies;
                    double t0;
                    const double landed = sim_copy(s, false, SCHED_TASK_GRAD_D2H, b, mb, end, gb, gc, &t0);
                    sim_mem(s, SCHED_MEM_DEVICE, landed, -c->grad_mb_bytes);
                    /* into the host buffer: a copy (none into a pinned one) */
                    const double t = sim_unpack(s, b, mb, t0, landed, gb, sched_block_pinned_grads(p) ? 0 : -1,
                                                &sc.d2h_res[dslot]);
                    sc.d2h_end[dslot] = t;
                    if (c->grad_step_bytes > 0) sim_norm_ahead(s, w, plan, b, t);
                    if (overlap && p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
                        sim_overlapped_adam(s, w, plan, b, t0, t);
                        adam_done[b] = true;
                    }
                }
            }
        }
        if (fw > 0) {
            if (fwd && turn) turn_w = fw;
            else sim_mem(s, SCHED_MEM_DEVICE, end, -fw);
        }
        if (held) sim_mem(s, SCHED_MEM_DEVICE, end, -turn_w);
        sc.use_end[u] = end;
        last_end = end;
    }
    lm_scratch_free(&sc);
    return last_end;
}
