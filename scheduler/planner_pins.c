/* The planner's pinned host buffers: which blocks' trained working copies
 * and gradient accumulators it pins, at the start of a walk or after one
 * (see planner.c's plan_order). */
#include "scheduler/planner_internal.h"

#include <math.h>

/* The pinned bytes it takes to pin block b's trained working copies
 * (grads false: sched_block_plan_t.pinned_home) or its host gradient
 * accumulators (grads true: pinned_grads) under plan p; 0 when that does
 * not apply or saves no host work. */
static double pin_bytes(const sched_workload_t *w, const sched_plan_t *p, int b, bool grads) {
    sched_block_plan_t bp = p->blocks[b];
    const sched_block_cost_t *c = sched_block_cost(w, b, bp.expert_parallel);
    if (grads) {
        bp.pinned_grads = true;
        return sched_block_pinned_grads(&bp) && w->unpack_bw > 0 ? c->grad_bytes : 0;
    }
    bp.pinned_home = true;
    return sched_block_pinned_home(&bp) && c->w_pack_frac > 0 ? c->w_work_bytes : 0;
}

/* Sets pinned_home, then pinned_grads, on plan p's blocks in block order
 * while their pinned bytes stay within `room`; returns those bytes. */
static double pin_blocks(const sched_workload_t *w, sched_plan_t *p, double room) {
    double sum = 0;
    for (int grads = 0; grads < 2; grads++)
        for (int b = 0; b < w->num_blocks; b++) {
            const double k = pin_bytes(w, p, b, grads);
            if (!(k > 0 && sum + k <= room)) continue;
            sum += k;
            if (grads) p->blocks[b].pinned_grads = true;
            else p->blocks[b].pinned_home = true;
        }
    return sum;
}

/* Pins the trained working copies (pinned_home) of as many blocks as the
 * pinned budget leaves room for, in block order, then with what room is
 * left their host gradient accumulators (pinned_grads: half the host work
 * saved per pinned byte, a copy per step against two fetches), on the plan
 * the walk starts from; the moves keep the flags, which mean nothing where
 * a move takes the block's optimizer to the device, so every plan of the
 * walk copies those straight over the link.  Room: the budget less twice
 * the start plan's own pinned peak (its staging). */
mt_status_t sched_pin_start(const sched_workload_t *w, const sched_planner_opts_t *o, sched_plan_t *start,
                             int *nsims, mt_error_t *err) {
    double room = INFINITY;
    if (o->budget[SCHED_MEM_PINNED] > 0) {
        eval_t e;
        const mt_status_t st = evaluate(w, start, &e, nsims, err);
        if (st != MT_OK) return st;
        /* twice the start's staging: a faster plan keeps more copies in flight */
        room = o->budget[SCHED_MEM_PINNED] - 2 * e.peak[SCHED_MEM_PINNED];
    }
    pin_blocks(w, start, room);
    return MT_OK;
}

/* Pins on a plan walked without them (see pin_start): as many blocks' as
 * the pinned budget leaves room for beside the plan's own peak, kept when
 * the plan still fits and is faster; with half as many blocks when the
 * room turns out too small (the pinned peak moves with the timing). */
mt_status_t sched_pin_after(const sched_workload_t *w, const sched_planner_opts_t *o, sched_plan_t *plan,
                             int *nsims, mt_error_t *err) {
    eval_t e;
    mt_status_t st = evaluate(w, plan, &e, nsims, err);
    const double room = o->budget[SCHED_MEM_PINNED] > 0 ? o->budget[SCHED_MEM_PINNED] - e.peak[SCHED_MEM_PINNED]
                                                        : INFINITY;
    double want = room;
    for (int tries = 0; tries < 3 && st == MT_OK && want > 0; tries++, want /= 2) {
        sched_plan_t cand;
        plan_copy(&cand, plan);
        const double sum = pin_blocks(w, &cand, want);
        eval_t ce;
        st = sum > 0 ? evaluate(w, &cand, &ce, nsims, err) : MT_OK;
        const bool keep = st == MT_OK && sum > 0 && fits(&ce, o->budget) && ce.time < e.time;
        if (keep) {
            sched_plan_free(plan);
            *plan = cand;
            return MT_OK;
        }
        sched_plan_free(&cand);
        if (sum == 0 || (st == MT_OK && fits(&ce, o->budget))) break; /* nothing to pin, or fits but no faster */
    }
    return st;
}
