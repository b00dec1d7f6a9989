/* The micro-batch step order (see simulate.h): per micro-batch, a forward
 * phase over blocks 0..N-1, then a backward phase N-1..0; one function per
 * part of a use of a block, sharing mb_order_t. */
#include "scheduler/simulate_internal.h"

#include <stdlib.h>

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
    sched_resource_t *d2h_res; /* ... and what decided that end (the link, or the unpack) */
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
        ready = sim_fetch_weights(s, u->p, u->b, u->mb, u->issue, u->fw, u->fw_copies, sched_block_pack_frac(u->c, u->p, false),
                                  ready_res);
        sim_mem(s, SCHED_MEM_DEVICE, u->issue, u->fw); /* allocated when issued */
    }
    if (fa > 0) {
        const double r = u->issue > m->offload_end[u->b] ? u->issue : m->offload_end[u->b];
        double t1 = sim_copy(s, true, SCHED_TASK_FETCH_ACT, u->b, u->mb, r, fa, u->c->act_copies, NULL);
        sim_mem(s, SCHED_MEM_DEVICE, u->issue, fa);
        sim_mem(s, SCHED_MEM_PINNED, t1, -fa); /* the offloaded copy lived in pinned memory */
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
    if (gate > *ready) *ready = gate, *ready_res = m->d2h_res[m->n_d2h - W - 1];
    m->d2h_res[m->n_d2h] = SCHED_RES_D2H;
    return m->n_d2h++;
}

/* The forward's compute and the memory it takes; returns its end. */
static double mb_forward(mb_order_t *m, const mb_use_t *u, double ready, sched_resource_t ready_res) {
    sim_t *s = m->s;
    const sched_block_cost_t *c = u->c;
    double start;
    double end = sim_compute(s, SCHED_TASK_FWD, u->b, u->mb, ready, ready_res, c->fwd_s, &start);
    end = sim_exchange(s, u->b, u->mb, start, end, c->xchg_fwd_bytes);
    const double saved = u->acts == SCHED_ACTS_RECOMPUTE ? c->act_input_bytes : c->act_saved_bytes;
    sim_mem(s, SCHED_MEM_DEVICE, start, saved + c->fwd_temp_bytes);
    sim_mem(s, SCHED_MEM_DEVICE, end, -c->fwd_temp_bytes);
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
    double end = sim_compute(s, SCHED_TASK_BWD, u->b, u->mb, ready, ready_res, dur, &start);
    end = sim_exchange(s, u->b, u->mb, start, end, c->xchg_bwd_bytes + (rc ? c->xchg_fwd_bytes : 0));
    if (rc) m->out->recompute_s += c->recompute_s;
    const double temp = rc && c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
    const double grads = u->grads_d2h || dev_add ? c->grad_mb_bytes : 0;
    sim_mem(s, SCHED_MEM_DEVICE, start, temp + grads + (rc ? c->act_saved_bytes - c->act_input_bytes : 0));
    sim_mem(s, SCHED_MEM_DEVICE, end, -temp - c->act_saved_bytes - (dev_add ? grads : 0));
    return end;
}

/* The fetched weights go when the compute ends, except those the head and
 * the turn hold from their forward to their backward, which go then. */
static void mb_release_weights(mb_order_t *m, const mb_use_t *u, double end) {
    const int N = m->w->num_blocks;
    if (u->fw > 0 && !(u->fwd && (u->b == N - 1 || u->turn))) sim_mem(m->s, SCHED_MEM_DEVICE, end, -u->fw);
    if (u->fwd && u->b == N - 1) m->head_w = u->fw;
    if (u->fwd && u->turn) m->turn_w = u->fw;
    if (u->held) sim_mem(m->s, SCHED_MEM_DEVICE, end, u->b == N - 1 ? -m->head_w : -m->turn_w);
}

/* After a forward with OFFLOAD activations: their D2H into pinned memory. */
static void mb_offload_acts(mb_order_t *m, const mb_use_t *u, double end, int dslot) {
    if (!(u->fwd && u->acts == SCHED_ACTS_OFFLOAD && u->off > 0)) return;
    sim_t *s = m->s;
    double t0;
    m->offload_end[u->b] = sim_copy(s, false, SCHED_TASK_OFFLOAD_ACT, u->b, u->mb, end, u->off, u->c->act_copies, &t0);
    /* the copy stays in pinned memory until fetched back */
    sim_mem(s, SCHED_MEM_PINNED, m->offload_end[u->b], u->off);
    sim_mem(s, SCHED_MEM_DEVICE, m->offload_end[u->b], -u->off);
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
    double t = sim_copy(s, false, SCHED_TASK_GRAD_D2H, u->b, u->mb, end, c->grad_mb_bytes, c->grad_mb_copies, &t0);
    sim_mem(s, SCHED_MEM_DEVICE, t, -c->grad_mb_bytes);
    /* the first micro-batch's copy lands in a pinned accumulator as it is */
    const double unpack = u->mb > 0 ? c->grad_add_host_s : sched_block_pinned_grads(u->p) ? 0 : -1;
    t = sim_unpack(s, u->b, u->mb, t0, t, c->grad_mb_bytes, unpack, &m->d2h_res[dslot]);
    m->d2h_end[dslot] = t;
    if (u->last_mb && c->grad_step_bytes > 0) sim_norm_ahead(s, m->w, m->plan, u->b, t);
    if (u->last_mb && m->overlap && u->p->optim == SCHED_OPTIM_HOST && c->grad_step_bytes > 0) {
        sim_overlapped_adam(s, m->w, m->plan, u->b, t0, t);
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
double sim_micro_batch_major(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool overlap,
                             bool *adam_done, sched_sim_result_t *out) {
    const int N = w->num_blocks, ga = w->grad_accum > 0 ? w->grad_accum : 1;
    mb_order_t m = {.s = s, .w = w, .plan = plan, .out = out, .overlap = overlap, .adam_done = adam_done};
    m.phase_end = malloc((size_t)N * sizeof *m.phase_end);
    m.d2h_end = malloc(((size_t)2 * (size_t)N * (size_t)ga + 1) * sizeof *m.d2h_end);
    m.d2h_res = malloc(((size_t)2 * (size_t)N * (size_t)ga + 1) * sizeof *m.d2h_res);
    m.offload_end = calloc((size_t)N, sizeof *m.offload_end);
    MT_CHECK(m.phase_end && m.d2h_end && m.d2h_res && m.offload_end, "out of host memory in the simulator");
    for (int mb = 0; mb < ga; mb++) {
        for (int phase = 0; phase < 2; phase++) {
            const double phase_start = m.last_end;
            for (int i = 0; i < N; i++) mb_use(&m, mb, phase == 0, i, phase_start);
        }
    }
    free(m.phase_end);
    free(m.d2h_end);
    free(m.d2h_res);
    free(m.offload_end);
    return m.last_end;
}
