/* The simulator's resources and memory (see simulate_internal.h): a task
 * on a resource runs in issue order once its dependencies have ended
 * (sim_run); copies hold pinned staging while they run, packs before an
 * H2D and unpacks behind a gradient D2H are host work on the copy path, the
 * NVMe array serves requests in the order they arrive in time; memory is a list of (time,
 * delta) events per kind, sorted once at the end (sim_finish_mem). */
#include "scheduler/simulate_internal.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void sim_mem(sim_t *s, sched_mem_t m, double t, double d) {
    if (d == 0) return;
    if (s->nev[m] == s->capev[m]) {
        s->capev[m] = s->capev[m] ? 2 * s->capev[m] : 256;
        s->ev[m] = realloc(s->ev[m], (size_t)s->capev[m] * sizeof *s->ev[m]);
        MT_CHECK_ALLOC(s->ev[m], "simulator memory events");
    }
    s->ev[m][s->nev[m]++] = (ev_t){t, d};
}

/* A task on `res` over [start, start + dur]: the resource's totals, the
 * step's end and the task list; returns its end. */
static double sim_place(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, int micro, double start,
                        double dur, double bytes) {
    const double end = start + dur;
    if (end > s->free_at[res]) s->free_at[res] = end;
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
    return end;
}

/* Runs a task on `res` once `ready`; returns its end. */
double sim_run(sim_t *s, sched_resource_t res, sched_task_kind_t kind, int block, int micro, double ready,
               double dur, double bytes, double *start_out) {
    const double start = ready > s->free_at[res] ? ready : s->free_at[res];
    if (start_out) *start_out = start;
    return sim_place(s, res, kind, block, micro, start, dur > 0 ? dur : 0, bytes);
}

/* A compute task: the gap before it is charged to the resource it waited for. */
double sim_compute(sim_t *s, sched_task_kind_t kind, int block, int micro, double ready, sched_resource_t ready_res,
                   double dur, double *start_out) {
    if (ready > s->free_at[SCHED_RES_COMPUTE]) s->waited[ready_res] += ready - s->free_at[SCHED_RES_COMPUTE];
    double start;
    const double end = sim_run(s, SCHED_RES_COMPUTE, kind, block, micro, ready, dur, 0, &start);
    if (kind == SCHED_TASK_FWD && s->first_fwd[block] < 0) s->first_fwd[block] = start;
    if (start_out) *start_out = start;
    return end;
}

/* A copy: pinned staging held while it runs. */
double sim_copy(sim_t *s, bool h2d, sched_task_kind_t kind, int block, int micro, double ready, double bytes,
                double copies, double *start_out) {
    double start;
    double end = sim_run(s, h2d ? SCHED_RES_H2D : SCHED_RES_D2H, kind, block, micro, ready,
                     sched_transfer_time(s->w, h2d, bytes, copies), bytes, &start);
    sim_mem(s, SCHED_MEM_PINNED, start, bytes);
    sim_mem(s, SCHED_MEM_PINNED, end, -bytes);
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
double sim_exchange(sim_t *s, int block, int micro, double start, double end, double bytes) {
    if (bytes <= 0) return end;
    s->peer_bytes += bytes;
    if (!s->w->peer_via_host) return end;
    const double e1 = sim_copy(s, false, SCHED_TASK_EXCHANGE, block, micro, start, bytes, 2, NULL);
    const double e2 = sim_copy(s, true, SCHED_TASK_EXCHANGE, block, micro, start, bytes, 2, NULL);
    const double e = e1 > e2 ? e1 : e2;
    if (e <= end) return end;
    s->waited[e1 > e2 ? SCHED_RES_D2H : SCHED_RES_H2D] += e - end;
    s->free_at[SCHED_RES_COMPUTE] = e;
    return e;
}

/* One request stream on the NVMe array. */
double sim_nvme_io(sim_t *s, bool read, bool first_idle, int block, int micro, double ready, double bytes,
                   double *start_out) {
    if (read) s->nvme_read_bytes += bytes;
    else s->nvme_write_bytes += bytes;
    double dur = read ? sched_nvme_read_time(s->w, bytes) : sched_nvme_write_time(s->w, bytes);
    if (dur < 0) dur = 0;
    /* the first idle span: past every request overlapping [t, t + dur];
     * else behind every request issued so far, at the list's end */
    double t = ready;
    int at = 0;
    if (!first_idle) {
        if (s->free_at[SCHED_RES_NVME] > t) t = s->free_at[SCHED_RES_NVME];
        at = s->nnvme;
    }
    for (; at < s->nnvme; at++) {
        if (s->nvme_busy[at].end <= t) continue;
        if (s->nvme_busy[at].start >= t + dur) break;
        t = s->nvme_busy[at].end;
    }
    if (s->nnvme == s->capnvme) {
        s->capnvme = s->capnvme ? 2 * s->capnvme : 64;
        s->nvme_busy = realloc(s->nvme_busy, (size_t)s->capnvme * sizeof *s->nvme_busy);
        MT_CHECK_ALLOC(s->nvme_busy, "simulator NVMe requests");
    }
    memmove(s->nvme_busy + at + 1, s->nvme_busy + at, (size_t)(s->nnvme - at) * sizeof *s->nvme_busy);
    s->nvme_busy[at] = (sim_span_t){t, t + dur};
    s->nnvme++;
    if (start_out) *start_out = t;
    return sim_place(s, SCHED_RES_NVME, read ? SCHED_TASK_NVME_READ : SCHED_TASK_NVME_WRITE, block, micro, t, dur,
                     bytes);
}

/* Packing `bytes` into staging on the pack threads once `ready` (nothing
 * when the workload does not model it, or for bytes that are plain copies:
 * the caller passes the converted share); returns when the copy may start. */
double sim_pack(sim_t *s, int block, int micro, double ready, double bytes, double *start_out) {
    const double dur = sched_pack_time(s->w, bytes);
    *start_out = ready;
    if (dur <= 0) return ready;
    return sim_run(s, SCHED_RES_PACK, SCHED_TASK_PACK, block, micro, ready, dur, bytes, start_out);
}

/* Gradients of `bytes` landing by a D2H copy [start, end]: unpacked into
 * host memory on the pack threads piece by piece behind the copy (the
 * executor's unpack stream), so the unpack may start with the copy but not
 * end before it; the D2H stream then waits for it (the executor's batch
 * ends by waiting for its last unpack).  A copy, or an add when `dur` is
 * the add's time (dur < 0: the copy's at the unpack rate).  Returns when
 * the gradients are in host memory; *res is the resource that decided it. */
double sim_unpack(sim_t *s, int block, int micro, double start, double end, double bytes, double dur,
                  sched_resource_t *res) {
    *res = SCHED_RES_D2H;
    if (dur < 0) dur = sched_unpack_time(s->w, bytes);
    if (dur <= 0) return end;
    const double u = sim_run(s, SCHED_RES_PACK, SCHED_TASK_GRAD_HOST, block, micro, start, dur, bytes, NULL);
    if (u <= end) return end;
    *res = SCHED_RES_PACK;
    if (u > s->free_at[SCHED_RES_D2H]) s->free_at[SCHED_RES_D2H] = u;
    return u;
}

/* A weight fetch of `bytes` for block b issued at `issue`: with its home on
 * NVMe, read into pinned staging first; its converted share (pack_frac)
 * packed on the pack threads before the copy.  Returns when the H2D copy ends;
 * *ready_res is the resource a compute waiting for it waited on. */
double sim_fetch_weights(sim_t *s, const sched_block_plan_t *p, int b, int micro, double issue, double bytes,
                         double copies, double pack_frac, sched_resource_t *ready_res) {
    double ready = issue;
    *ready_res = SCHED_RES_H2D;
    const bool from_nvme = sched_block_nvme_weights(p);
    if (from_nvme) {
        double r0;
        ready = sim_nvme_io(s, true, true, b, micro, issue, bytes, &r0);
        sim_mem(s, SCHED_MEM_PINNED, r0, bytes);
    }
    const double read_end = ready;
    double p0;
    const double packed = sim_pack(s, b, micro, ready, bytes * pack_frac, &p0);
    if (!from_nvme && packed > ready) sim_mem(s, SCHED_MEM_PINNED, p0, bytes); /* staging taken as packing starts */
    double c0;
    const double end = sim_copy(s, true, SCHED_TASK_FETCH_W, b, micro, packed, bytes, copies, &c0);
    if (from_nvme || packed > ready) sim_mem(s, SCHED_MEM_PINNED, c0, -bytes); /* the copy holds it from here (sim_copy()) */
    /* a copy that did not queue behind other copies waited for what came
     * before it: the read and the pack, charged to the longer of the two */
    if (c0 <= packed) {
        const double read_s = from_nvme ? read_end - issue : 0, pack_s = packed - read_end;
        if (pack_s > 0 && pack_s >= read_s) *ready_res = SCHED_RES_PACK;
        else if (from_nvme) *ready_res = SCHED_RES_NVME;
    }
    return end;
}

/* Whether block p's host gradient buffer lives only from its D2H to its
 * update (see simulate.h), not the whole step. */
bool sim_grads_transient(const sched_workload_t *w, const sched_plan_t *plan, const sched_block_plan_t *p) {
    return sched_block_nvme_optim(p) && p->grads == SCHED_GRADS_HOST && !sched_waits_for_norm(w, plan) &&
           w->has_trainable &&
           (plan->layer_major || w->grad_accum <= 1);
}

/* Block b's host AdamW once `ready`: with its state on NVMe, read in first
 * (held in host memory until written back after the update); with its
 * weights' home there, the updated working copy written too.  Returns the
 * AdamW's end, its start in *start_out. */
double sim_host_adam(sim_t *s, const sched_block_cost_t *c, const sched_block_plan_t *p, int b, double ready,
                     bool speculative, double *start_out) {
    const bool state = sched_block_nvme_optim(p) && c->optim_bytes > 0;
    const double wb = sched_block_nvme_weights(p) ? c->w_update_bytes : 0;
    double t = ready;
    if (state) {
        double r0;
        const double r = sim_nvme_io(s, true, false, b, -1, ready, c->optim_bytes, &r0);
        sim_mem(s, SCHED_MEM_HOST, r0, c->optim_bytes);
        if (r > t) t = r;
    }
    double start;
    const double dur = c->adam_host_s + (speculative ? c->adam_spec_host_s : 0);
    const double end = sim_run(s, SCHED_RES_HOST, SCHED_TASK_ADAM, b, -1, t, dur, 0, &start);
    if (state || wb > 0) {
        const double out = (state ? c->optim_bytes : 0) + wb;
        const double we = sim_nvme_io(s, false, false, b, -1, end, out, NULL);
        sim_mem(s, SCHED_MEM_HOST, start, wb);
        sim_mem(s, SCHED_MEM_HOST, we, -out);
    }
    if (start_out) *start_out = start;
    return end;
}

/* Block b's overlapped update from `ready`, on the host worker; a
 * transient gradient buffer goes with it where the block has one. */
static void run_overlapped(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double d2h_start,
                           double ready) {
    const sched_block_plan_t *p = &plan->blocks[b];
    const sched_block_cost_t *c = sched_block_cost(w, b, p->expert_parallel);
    const double end = sim_host_adam(s, c, p, b, ready, w->speculative, NULL);
    s->overlap_end[b] = end;
    if (sim_grads_transient(w, plan, p)) {
        sim_mem(s, SCHED_MEM_HOST, d2h_start, c->grad_bytes);
        sim_mem(s, SCHED_MEM_HOST, end, -c->grad_bytes);
    }
}

void sim_overlapped_adam(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double d2h_start,
                         double ready) {
    if (s->take_back) {
        s->overlap[s->noverlap++] = (sim_overlap_t){.b = b, .d2h_start = d2h_start, .ready = ready};
        return;
    }
    run_overlapped(s, w, plan, b, d2h_start, ready);
    /* the backward's lead over the array-bound updates (scheduler/plan.h):
     * the compute stream goes on once the update that many blocks behind is
     * done, as the executor's issuing thread waits for it */
    const int behind = sched_nvme_grad_wait_block(plan, b);
    const double until = behind >= 0 ? s->overlap_end[behind] : 0;
    if (until > s->free_at[SCHED_RES_COMPUTE]) {
        s->waited[SCHED_RES_NVME] += until - s->free_at[SCHED_RES_COMPUTE];
        s->free_at[SCHED_RES_COMPUTE] = until;
    }
}

/* Block b's norm share on the host worker from `ready`. */
static void run_norm_ahead(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double ready) {
    const sched_block_cost_t *c = sched_block_cost(w, b, plan->blocks[b].expert_parallel);
    sim_run(s, SCHED_RES_HOST, SCHED_TASK_NORM, b, -1, ready, c->norm_host_s, 0, NULL);
    s->norm_done[b] = true;
}

void sim_norm_ahead(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, int b, double ready) {
    if (!s->norm_ahead || plan->blocks[b].grads != SCHED_GRADS_HOST) return;
    if (s->take_back) {
        s->overlap[s->noverlap++] = (sim_overlap_t){.b = b, .norm = true, .ready = ready};
        return;
    }
    run_norm_ahead(s, w, plan, b, ready);
}

bool sim_may_take_back(const sched_plan_t *plan) {
    for (int b = 0; b < plan->num_blocks; b++)
        if (sched_block_nvme_optim(&plan->blocks[b]) || sched_block_nvme_weights(&plan->blocks[b])) return false;
    return true;
}

/* The next noted job of its kind (norm or not) from k on; noverlap: none. */
static int next_of_kind(const sim_t *s, int k, bool norm) {
    while (k < s->noverlap && s->overlap[k].norm != norm) k++;
    return k;
}

void sim_settle_overlapped(sim_t *s, const sched_workload_t *w, const sched_plan_t *plan, bool *adam_done) {
    double drained = 0; /* every copy and compute of the walk done */
    for (int r = 0; r < SCHED_RES_COUNT; r++)
        if (r != SCHED_RES_HOST && s->free_at[r] > drained) drained = s->free_at[r];
    /* the worker takes each kind in the order asked, a landed norm share
     * ahead of the updates (as the executor's worker does: host_optim.c) */
    int nk = next_of_kind(s, 0, true), uk = next_of_kind(s, 0, false);
    while (nk < s->noverlap || uk < s->noverlap) {
        const double norm_ready = nk < s->noverlap ? s->overlap[nk].ready : INFINITY;
        const double update_ready = uk < s->noverlap ? s->overlap[uk].ready : INFINITY;
        const double t = fmax(s->free_at[SCHED_RES_HOST], fmin(norm_ready, update_ready));
        if (norm_ready <= t) {
            run_norm_ahead(s, w, plan, s->overlap[nk].b, norm_ready);
            nk = next_of_kind(s, nk + 1, true);
            continue;
        }
        const sim_overlap_t *o = &s->overlap[uk];
        uk = next_of_kind(s, uk + 1, false);
        const sched_block_plan_t *p = &plan->blocks[o->b];
        const bool deferrable = p->optim == SCHED_OPTIM_HOST && p->grads == SCHED_GRADS_HOST &&
                                p->weights == SCHED_WEIGHTS_STREAM; /* optim_step.c's defer_block */
        if (deferrable && t >= drained) adam_done[o->b] = false; /* taken back: not started */
        else run_overlapped(s, w, plan, o->b, o->d2h_start, o->ready);
    }
    s->noverlap = 0;
}


/* A key whose unsigned order is the order of the doubles (t is never NaN;
 * -0 is taken as +0, as == takes it). */
static uint64_t time_key(double t) {
    t += 0.0;
    uint64_t u;
    memcpy(&u, &t, sizeof u);
    return (u >> 63) ? ~u : u | (1ull << 63);
}

/* Time order; frees first at equal times. */
static int cmp_ev(const void *a, const void *b) {
    const ev_t *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if ((x->d < 0) != (y->d < 0)) return x->d < 0 ? -1 : 1;
    return 0;
}

/* A planner simulates tens of thousands of steps of thousands of events
 * each, and a comparison sort was most of a plan's time.  So: a radix sort
 * on the top 32 bits of the time's key (sign, exponent and 20 bits of
 * mantissa: times within a millionth of each other share a bucket), in
 * three passes of 11, 11 and 10 bits, then an insertion sort by cmp_ev,
 * which only moves events within a bucket.  Should buckets hold many
 * events out of order, qsort finishes the job. */
enum { EV_DIGITS = 3 };
static const int ev_shift[EV_DIGITS] = {32, 43, 54};
static const uint32_t ev_mask[EV_DIGITS] = {0x7ff, 0x7ff, 0x3ff};

void sim_sort_events(ev_t *ev, int n) {
    if (n < 2) return;
    ev_t *tmp = malloc((size_t)n * sizeof *tmp);
    MT_CHECK_ALLOC(tmp, "simulator memory events");
    uint32_t count[EV_DIGITS][2048] = {{0}};
    for (int i = 0; i < n; i++) {
        const uint64_t k = time_key(ev[i].t);
        for (int d = 0; d < EV_DIGITS; d++) count[d][(k >> ev_shift[d]) & ev_mask[d]]++;
    }
    ev_t *src = ev, *dst = tmp;
    for (int d = 0; d < EV_DIGITS; d++) {
        if (count[d][(time_key(src[0].t) >> ev_shift[d]) & ev_mask[d]] == (uint32_t)n) continue; /* one value */
        uint32_t sum = 0;
        for (uint32_t v = 0; v <= ev_mask[d]; v++) {
            const uint32_t c = count[d][v];
            count[d][v] = sum, sum += c;
        }
        for (int i = 0; i < n; i++) dst[count[d][(time_key(src[i].t) >> ev_shift[d]) & ev_mask[d]]++] = src[i];
        ev_t *x = src;
        src = dst, dst = x;
    }
    if (src != ev) memcpy(ev, src, (size_t)n * sizeof *ev);
    free(tmp);
    long moves = 0;
    for (int i = 1; i < n; i++) {
        const ev_t e = ev[i];
        int j = i;
        for (; j > 0 && cmp_ev(&ev[j - 1], &e) > 0; j--) ev[j] = ev[j - 1];
        ev[j] = e;
        moves += i - j;
        if (moves > 16l * n) {
            qsort(ev, (size_t)n, sizeof *ev, cmp_ev);
            return;
        }
    }
}

double sim_finish_mem(sim_t *s, sched_mem_t m, double base, bool keep, sched_timeline_t *tl) {
    sim_sort_events(s->ev[m], s->nev[m]);
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
