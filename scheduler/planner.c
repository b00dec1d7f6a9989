/* Planner (see planner.h for the policy and the search).
 *
 * Design notes:
 * - Moves only ever go one way (recompute -> offload -> keep, stream ->
 *   resident, host -> device, window up), so the walk ends; its length is
 *   at most a few moves per block.
 * - Candidates are simulated on the current plan with one block changed
 *   (change, simulate, restore).  Scoring all of them at every step costs
 *   O(blocks^2) per step; the walk scores lazily instead (see walk()),
 *   which takes a few simulations per step on uniform models.
 * - Ties in the ratio go to the smaller device cost, then to the earlier
 *   block, so the walk is deterministic. */
#include "scheduler/planner.h"
#include "scheduler/planner_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sched_plan_t *plans;
    eval_t *evals;
    int count, cap;
} path_t;

typedef enum {
    M_OFFLOAD = 0,
    M_KEEP,
    M_RESIDENT,
    M_GRADS_DEVICE,
    M_OPTIM_DEVICE,
    M_INPUTS_KEEP, /* layer-major: a layer's block inputs stay on the device */
    M_WINDOW,
    M_COUNT
} move_t;

void sched_planner_opts_default(sched_planner_opts_t *o) {
    memset(o, 0, sizeof *o);
    o->policy = SCHED_POLICY_AUTO;
    o->weights = o->grads = o->optim = o->acts = o->lm_inputs = SCHED_AUTO_CHOICE;
    o->step_order = SCHED_AUTO_CHOICE;
}

/* The NVMe pass's move i of a model of n blocks on plan p: i < n puts block
 * i's optimizer state on NVMe, n <= i < 2n the home of decoder layer
 * i - n's streamed weights.  Returns the host bytes it frees, 0 when it
 * does not apply. */
static double nvme_move(const sched_workload_t *w, sched_plan_t *p, int i) {
    const int n = w->num_blocks, b = i < n ? i : i - n;
    sched_block_plan_t *bp = &p->blocks[b];
    const sched_block_cost_t *c = sched_block_cost(w, b, bp->expert_parallel);
    if (i < n) {
        if (bp->optim != SCHED_OPTIM_HOST || bp->nvme_optim || !(c->optim_bytes > 0)) return 0;
        bp->nvme_optim = true;
        /* the gradient buffer then lives only until the update (simulate.h) */
        /* speculation is off with the tier: clipping waits for the norm */
        const bool transient = bp->grads == SCHED_GRADS_HOST && w->has_trainable && !w->clip && !w->speculative &&
                               (p->layer_major || w->grad_accum <= 1);
        return c->optim_bytes + (transient ? c->grad_bytes : 0);
    }
    if (b == 0 || b == n - 1 || bp->weights != SCHED_WEIGHTS_STREAM || bp->nvme_weights || !(c->w_home_bytes > 0))
        return 0;
    bp->nvme_weights = true;
    return c->w_home_bytes;
}

/* Plan `base` (evaluated as *be) with as little moved to NVMe as makes it
 * fit (see planner.h); *ok false when it cannot.  On *ok, *out is the plan
 * (the caller frees it) and *oe its evaluation. */
static mt_status_t nvme_fit(const sched_workload_t *w, const sched_planner_opts_t *o, const sched_plan_t *base,
                            const eval_t *be, sched_plan_t *out, eval_t *oe, bool *ok, int *nsims, mt_error_t *err) {
    *ok = false;
    const double hb = o->budget[SCHED_MEM_HOST];
    if (!o->nvme || !(w->nvme_read_bw > 0) || !(hb > 0)) return MT_OK;
    if (o->budget[SCHED_MEM_DEVICE] > 0 && be->peak[SCHED_MEM_DEVICE] > o->budget[SCHED_MEM_DEVICE]) return MT_OK;
    plan_copy(out, base);
    eval_t e = *be;
    int next = 0;
    for (int round = 0; round < 16; round++) {
        const double excess = e.peak[SCHED_MEM_HOST] - hb;
        if (excess <= 0) {
            *ok = fits(&e, o->budget) && (o->nvme_budget <= 0 || e.nvme <= o->nvme_budget);
            break; /* fits, or another budget (pinned, NVMe) is short and more moves would not help */
        }
        double freed = 0;
        bool moved = false;
        const int moves = (o->nvme_optim_only ? 1 : 2) * w->num_blocks; /* nvme_move's numbering */
        while (next < moves && freed < excess) {
            const double f = nvme_move(w, out, next++);
            freed += f;
            moved |= f > 0;
        }
        if (!moved) break;
        mt_status_t st = evaluate(w, out, &e, nsims, err);
        if (st != MT_OK) {
            sched_plan_free(out);
            return st;
        }
    }
    if (*ok) *oe = e;
    else sched_plan_free(out);
    return MT_OK;
}

/* The NVMe pass over the plans of a walk: the fastest one that fits with
 * NVMe, into *best (the caller frees it when *found). */
static mt_status_t nvme_pass(const sched_workload_t *w, const sched_planner_opts_t *o, const path_t *path,
                             sched_plan_t *best, bool *found, int *nsims, mt_error_t *err) {
    double best_t = 0;
    for (int i = 0; i < path->count; i++) {
        if (*found && path->evals[i].time >= best_t) continue; /* moving to NVMe never makes a plan faster */
        sched_plan_t cand;
        eval_t ce;
        bool ok;
        mt_status_t st = nvme_fit(w, o, &path->plans[i], &path->evals[i], &cand, &ce, &ok, nsims, err);
        if (st != MT_OK) return st;
        if (!ok) continue;
        if (*found && ce.time >= best_t) {
            sched_plan_free(&cand);
            continue;
        }
        if (*found) sched_plan_free(best);
        *best = cand;
        best_t = ce.time;
        *found = true;
    }
    return MT_OK;
}

/* Per-kind overrides, then what the executor cannot run: the optimizer on
 * the device needs resident weights and device gradients (it updates the
 * device copies in place).  A forced choice wins over an automatic one. */
static mt_status_t apply_overrides(sched_plan_t *p, const sched_planner_opts_t *o, mt_error_t *err) {
    if (o->optim == SCHED_OPTIM_DEVICE && o->grads == SCHED_GRADS_HOST)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "scheduler: grads: host with optimizer: device is not a valid combination (the device "
                            "optimizer reads device gradients); use grads: device or optimizer: host");
    if (o->optim == SCHED_OPTIM_DEVICE && o->weights == SCHED_WEIGHTS_STREAM)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "scheduler: weights: stream with optimizer: device is not a valid combination (the device "
                            "optimizer updates resident weights in place); use weights: resident or optimizer: host");
    for (int b = 0; b < p->num_blocks; b++) {
        sched_block_plan_t *bp = &p->blocks[b];
        if (o->weights != SCHED_AUTO_CHOICE) bp->weights = (sched_weight_place_t)o->weights;
        if (o->grads != SCHED_AUTO_CHOICE) bp->grads = (sched_grad_place_t)o->grads;
        if (o->optim != SCHED_AUTO_CHOICE) bp->optim = (sched_optim_place_t)o->optim;
        if (o->acts != SCHED_AUTO_CHOICE) bp->acts = (sched_act_place_t)o->acts;
        if (o->lm_inputs != SCHED_AUTO_CHOICE) bp->lm_inputs = (sched_input_place_t)o->lm_inputs;
        if (bp->optim == SCHED_OPTIM_DEVICE && (bp->grads == SCHED_GRADS_HOST || bp->weights == SCHED_WEIGHTS_STREAM)) {
            if (o->optim == SCHED_AUTO_CHOICE) {
                bp->optim = SCHED_OPTIM_HOST;
            } else {
                bp->grads = SCHED_GRADS_DEVICE; /* both automatic here: the forced pairs were refused above */
                bp->weights = SCHED_WEIGHTS_RESIDENT;
            }
        }
    }
    if (o->prefetch_window > 0) p->prefetch_window = o->prefetch_window;
    return MT_OK;
}

/* Applies move m to block b of p; false when it does not apply. */
static bool apply_move(sched_plan_t *p, int b, move_t m, const sched_planner_opts_t *o, int max_window) {
    sched_block_plan_t *bp = b >= 0 ? &p->blocks[b] : NULL;
    /* an expert-parallel block's gradients and optimizer stay on the host,
     * its activations are not offloaded (sched_block_plan_expert_parallel) */
    if (bp && bp->expert_parallel && (m == M_OFFLOAD || m == M_GRADS_DEVICE || m == M_OPTIM_DEVICE)) return false;
    switch (m) {
    case M_OFFLOAD:
        if (o->acts != SCHED_AUTO_CHOICE || bp->acts != SCHED_ACTS_RECOMPUTE) return false;
        bp->acts = SCHED_ACTS_OFFLOAD;
        return true;
    case M_KEEP:
        if (o->acts != SCHED_AUTO_CHOICE || bp->acts == SCHED_ACTS_KEEP) return false;
        bp->acts = SCHED_ACTS_KEEP;
        return true;
    case M_RESIDENT:
        if (o->weights != SCHED_AUTO_CHOICE || bp->weights == SCHED_WEIGHTS_RESIDENT) return false;
        bp->weights = SCHED_WEIGHTS_RESIDENT;
        return true;
    case M_GRADS_DEVICE:
        if (o->grads != SCHED_AUTO_CHOICE || bp->grads == SCHED_GRADS_DEVICE) return false;
        bp->grads = SCHED_GRADS_DEVICE;
        return true;
    case M_OPTIM_DEVICE: /* brings resident weights and device gradients along when they are automatic */
        if (o->optim != SCHED_AUTO_CHOICE || bp->optim == SCHED_OPTIM_DEVICE) return false;
        if ((bp->grads == SCHED_GRADS_HOST && o->grads != SCHED_AUTO_CHOICE) ||
            (bp->weights == SCHED_WEIGHTS_STREAM && o->weights != SCHED_AUTO_CHOICE))
            return false;
        bp->grads = SCHED_GRADS_DEVICE;
        bp->weights = SCHED_WEIGHTS_RESIDENT;
        bp->optim = SCHED_OPTIM_DEVICE;
        return true;
    case M_INPUTS_KEEP:
        if (o->lm_inputs != SCHED_AUTO_CHOICE || !p->layer_major || bp->lm_inputs == SCHED_INPUTS_KEEP) return false;
        bp->lm_inputs = SCHED_INPUTS_KEEP;
        return true;
    case M_WINDOW:
        if (o->prefetch_window > 0 || p->prefetch_window >= max_window) return false;
        p->prefetch_window++;
        return true;
    case M_COUNT: break;
    }
    return false;
}

static void path_push(path_t *path, const sched_plan_t *p, const eval_t *e) {
    if (path->count == path->cap) {
        path->cap = path->cap ? 2 * path->cap : 64;
        path->plans = realloc(path->plans, (size_t)path->cap * sizeof *path->plans);
        path->evals = realloc(path->evals, (size_t)path->cap * sizeof *path->evals);
        MT_CHECK(path->plans && path->evals, "out of host memory for the planner path");
    }
    plan_copy(&path->plans[path->count], p);
    path->evals[path->count++] = *e;
}

static void path_free(path_t *path) {
    for (int i = 0; i < path->count; i++) sched_plan_free(&path->plans[i]);
    free(path->plans);
    free(path->evals);
    memset(path, 0, sizeof *path);
}

typedef struct {
    int b;          /* block, -1 for the window */
    move_t m;
    double ratio;   /* gain per device byte added; <= 0: not worth taking (or not applicable) */
    double dm;      /* device peak added */
    eval_t e;       /* the plan with the move */
    bool fresh;     /* scored against the current plan */
} cand_t;

typedef struct {
    const sched_workload_t *w;
    const sched_planner_opts_t *o;
    int mode;       /* 0: time walk, 1: least host memory within the device budget */
    bool secondary; /* time walk, second phase: no time lost, less traffic */
    int max_window;
    int *nsims;
} walk_t;

/* Whether plan e breaks the pinned or host budget that the current plan
 * ce keeps.  The time walk refuses such a move: the plan is chosen from
 * its path afterwards by whether it fits, and few moves give pinned or
 * host memory back, so the plans after it would mostly be lost (offloading
 * activations into the room pinned working copies left, say, instead of
 * taking a block's optimizer to the device).  The device budget is the
 * walk's price instead: gain per device byte. */
static bool over_host_side(const eval_t *e, const eval_t *ce, const double *budget) {
    for (int m = SCHED_MEM_PINNED; m <= SCHED_MEM_HOST; m++)
        if (budget[m] > 0 && e->peak[m] > budget[m] && ce->peak[m] <= budget[m]) return true;
    return false;
}

/* Scores move c against the current plan cur (evaluation ce). */
static mt_status_t score(const walk_t *k, sched_plan_t *cur, const eval_t *ce, cand_t *c, mt_error_t *err) {
    c->fresh = true;
    c->ratio = -1;
    if (k->mode == 1 && !(c->m == M_RESIDENT || c->m == M_OPTIM_DEVICE)) return MT_OK;
    sched_block_plan_t saved = c->b >= 0 ? cur->blocks[c->b] : (sched_block_plan_t){0};
    const int saved_w = cur->prefetch_window;
    if (!apply_move(cur, c->b, c->m, k->o, k->max_window)) return MT_OK;
    mt_status_t st = evaluate(k->w, cur, &c->e, k->nsims, err);
    if (c->b >= 0) cur->blocks[c->b] = saved;
    cur->prefetch_window = saved_w;
    if (st != MT_OK) return st;
    const eval_t *e = &c->e;
    c->dm = e->peak[SCHED_MEM_DEVICE] - ce->peak[SCHED_MEM_DEVICE];
    double gain;
    if (k->mode == 1) {
        const double B = k->o->budget[SCHED_MEM_DEVICE];
        if (B > 0 && e->peak[SCHED_MEM_DEVICE] > B) return MT_OK;
        gain = ce->peak[SCHED_MEM_HOST] - e->peak[SCHED_MEM_HOST];
    } else if (over_host_side(e, ce, k->o->budget)) {
        return MT_OK;
    } else if (!k->secondary) {
        gain = ce->time - e->time;
        if (gain <= 1e-9 * ce->time + 1e-15) return MT_OK;
    } else {
        if (e->time > ce->time * (1 + 1e-9) + 1e-15) return MT_OK;
        gain = ce->traffic - e->traffic;
    }
    if (gain > 0) c->ratio = gain / (c->dm > 1.0 ? c->dm : 1.0);
    return MT_OK;
}

/* Best candidate by ratio, ties to the smaller device cost, then the earlier one. */
static int best_cand(const cand_t *c, int n, int skip) {
    int best = -1;
    for (int i = 0; i < n; i++) {
        if (i == skip || c[i].ratio <= 0) continue;
        if (best < 0 || c[i].ratio > c[best].ratio * (1 + 1e-12) ||
            (fabs(c[i].ratio - c[best].ratio) <= c[best].ratio * 1e-12 && c[i].dm < c[best].dm))
            best = i;
    }
    return best;
}

/* One greedy walk from `start` (see planner.h).  Lazy evaluation: scores
 * go stale when a move is taken; the best stale candidate is re-scored and
 * taken if it still beats every other score, else the next is tried.  The
 * block a move changed and the window are re-scored at once, everything
 * every 16 moves and whenever no candidate is left. */
static mt_status_t walk(const sched_workload_t *w, const sched_plan_t *start, const sched_planner_opts_t *o, int mode,
                        path_t *path, int *nsims, mt_error_t *err) {
    walk_t k = {.w = w, .o = o, .mode = mode, .max_window = o->max_window > 0 ? o->max_window : 4, .nsims = nsims};
    const int n = (w->num_blocks + 1) * M_COUNT;
    cand_t *c = calloc((size_t)n, sizeof *c);
    MT_CHECK_ALLOC(c, "planner candidates");
    int nc = 0;
    for (int b = -1; b < w->num_blocks; b++)
        for (int m = 0; m < M_COUNT; m++)
            if ((b < 0) == (m == M_WINDOW)) c[nc++] = (cand_t){.b = b, .m = (move_t)m};
    sched_plan_t cur;
    plan_copy(&cur, start);
    eval_t ce;
    mt_status_t st = evaluate(w, &cur, &ce, nsims, err);
    if (st != MT_OK) goto out;
    path_push(path, &cur, &ce);
    bool need_full = true;
    int since_full = 0;
    for (;;) {
        if (need_full || since_full >= 16) {
            for (int i = 0; i < nc && st == MT_OK; i++) st = score(&k, &cur, &ce, &c[i], err);
            if (st != MT_OK) goto out;
            need_full = false;
            since_full = 0;
        }
        int i = best_cand(c, nc, -1);
        if (i < 0) {
            bool all_fresh = true;
            for (int j = 0; j < nc; j++) all_fresh &= c[j].fresh;
            if (!all_fresh) {
                need_full = true;
                continue;
            }
            if (mode == 0 && !k.secondary) {
                k.secondary = true;
                need_full = true;
                continue;
            }
            break;
        }
        if (!c[i].fresh) {
            st = score(&k, &cur, &ce, &c[i], err);
            if (st != MT_OK) goto out;
            const int j = best_cand(c, nc, i);
            if (c[i].ratio <= 0 || (j >= 0 && c[j].ratio > c[i].ratio * (1 + 1e-12))) continue;
        }
        const cand_t taken = c[i];
        apply_move(&cur, taken.b, taken.m, o, k.max_window);
        ce = taken.e;
        path_push(path, &cur, &ce);
        since_full++;
        for (int j = 0; j < nc; j++) {
            c[j].fresh = false;
            if (c[j].b == taken.b || c[j].b < 0) {
                st = score(&k, &cur, &ce, &c[j], err);
                if (st != MT_OK) goto out;
            }
        }
    }
out:
    free(c);
    sched_plan_free(&cur);
    return st;
}

static double gib(double b) { return b / 1073741824.0; }

/* Bytes in the unit that shows them: a tiny model's budget problem is not
 * "0.0 GiB needs 0.0 GiB". */
static const char *bytes_str(double b, char *buf, size_t cap) {
    if (b >= 1073741824.0) snprintf(buf, cap, "%.1f GiB", b / 1073741824.0);
    else if (b >= 1048576.0) snprintf(buf, cap, "%.1f MiB", b / 1048576.0);
    else if (b >= 1024.0) snprintf(buf, cap, "%.1f KiB", b / 1024.0);
    else snprintf(buf, cap, "%.0f B", b);
    return buf;
}

/* Where a plan's host bytes go (sched_block_host_bytes), the rest being
 * offloaded activations. */
static void describe_host(const sched_workload_t *w, const sched_plan_t *p, double peak, char *buf, size_t cap) {
    double home = 0, optim = 0, grads = 0;
    for (int b = 0; b < w->num_blocks; b++) {
        double h, o, g;
        sched_block_host_bytes(&w->blocks[b], &p->blocks[b], &h, &o, &g);
        home += h, optim += o, grads += g;
    }
    const double acts = peak - home - optim - grads;
    char a[32], o[32], g[32], x[32];
    snprintf(buf, cap, "weights %s, optimizer state %s, gradients %s, offloaded activations %s",
             bytes_str(home, a, sizeof a), bytes_str(optim, o, sizeof o), bytes_str(grads, g, sizeof g),
             bytes_str(acts > 0 ? acts : 0, x, sizeof x));
}

static double working_set(const sched_workload_t *w, int b) {
    const sched_block_cost_t *c = &w->blocks[b];
    const double temp = c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
    return c->w_fetch_bytes + c->act_saved_bytes + temp;
}

static void block_working_set(const sched_workload_t *w, sched_planner_result_t *out) {
    out->largest_block = 0;
    out->block_working_set = 0;
    for (int b = 0; b < w->num_blocks; b++)
        if (working_set(w, b) > out->block_working_set) out->block_working_set = working_set(w, b), out->largest_block = b;
}

static void block_name(const sched_workload_t *w, int b, char *buf, size_t cap) {
    if (b == 0) snprintf(buf, cap, "the embedding");
    else if (b == w->num_blocks - 1) snprintf(buf, cap, "the head (final norm, lm_head, logits)");
    else snprintf(buf, cap, "layer %d", b - 1);
}

/* Fills out->why / needed / short_of for an infeasible result. */
static void diagnose(const sched_workload_t *w, const sched_planner_opts_t *o, const path_t *path, const path_t *hostpath,
                     bool fixed, sched_planner_result_t *out) {
    const eval_t *e0 = &path->evals[0];
    const double *B = o->budget;
    size_t used = 0;
    char *buf = out->why;
    const size_t cap = sizeof out->why;
#define SAY(...)                                                                  \
    do {                                                                          \
        int w_ = snprintf(buf + used, cap - used, __VA_ARGS__);                   \
        if (w_ > 0) used = used + (size_t)w_ < cap ? used + (size_t)w_ : cap - 1; \
    } while (0)
    if (B[SCHED_MEM_DEVICE] > 0 && e0->peak[SCHED_MEM_DEVICE] > B[SCHED_MEM_DEVICE]) {
        out->short_of[SCHED_MEM_DEVICE] = true;
        char bn[64];
        block_name(w, out->largest_block, bn, sizeof bn);
        const sched_block_cost_t *c = &w->blocks[out->largest_block];
        const double temp = c->fwd_temp_bytes > c->bwd_temp_bytes ? c->fwd_temp_bytes : c->bwd_temp_bytes;
        const double keep = 1.0 - o->device_headroom; /* B is the user's budget times this */
        out->needed[SCHED_MEM_DEVICE] = e0->peak[SCHED_MEM_DEVICE] / keep;
        SAY("device memory is short: %s peaks at %.2f GiB on the device, the budget is %.2f GiB (needs at least %.2f GiB%s). ",
            fixed ? "this plan" : "the plan needing the least device memory (weights streamed, gradients and optimizer "
                                  "on the host, activations recomputed, prefetch window 1)",
            gib(e0->peak[SCHED_MEM_DEVICE]), gib(B[SCHED_MEM_DEVICE] / keep), gib(out->needed[SCHED_MEM_DEVICE]),
            o->device_headroom > 0 ? ": a GPU's plan keeps part of its budget free for stream-ordered frees" : "");
        int layer = 1;
        for (int b = 2; b < w->num_blocks - 1; b++)
            if (working_set(w, b) > working_set(w, layer)) layer = b;
        if (out->block_working_set > B[SCHED_MEM_DEVICE]) {
            SAY("The budget is smaller than one block's working set: %s alone needs %.2f GiB while it computes "
                "(weights %.2f GiB, saved activations %.2f GiB, temporaries %.2f GiB)",
                bn, gib(out->block_working_set), gib(c->w_fetch_bytes), gib(c->act_saved_bytes), gib(temp));
            if (layer != out->largest_block && layer < w->num_blocks - 1)
                SAY("; the largest decoder layer (layer %d) needs %.2f GiB", layer - 1, gib(working_set(w, layer)));
            SAY("; lower micro_batch_size or sequence_len. ");
        }
        else
            SAY("The largest block (%s) needs %.2f GiB while it computes. ", bn, gib(out->block_working_set));
    }
    /* among plans within the device budget: least pinned, least host */
    double min_pin = INFINITY, min_host = INFINITY;
    int host_i = -1;
    const path_t *paths[2] = {path, hostpath};
    const sched_plan_t *host_plan = NULL;
    for (int k = 0; k < 2; k++) {
        if (!paths[k]) continue;
        for (int i = 0; i < paths[k]->count; i++) {
            const eval_t *e = &paths[k]->evals[i];
            if (B[SCHED_MEM_DEVICE] > 0 && e->peak[SCHED_MEM_DEVICE] > B[SCHED_MEM_DEVICE]) continue;
            if (e->peak[SCHED_MEM_PINNED] < min_pin) min_pin = e->peak[SCHED_MEM_PINNED];
            if (e->peak[SCHED_MEM_HOST] < min_host) min_host = e->peak[SCHED_MEM_HOST], host_i = i, host_plan = &paths[k]->plans[i];
        }
    }
    if (!isfinite(min_pin)) min_pin = e0->peak[SCHED_MEM_PINNED];
    if (!isfinite(min_host)) min_host = e0->peak[SCHED_MEM_HOST], host_plan = &path->plans[0];
    (void)host_i;
    if (B[SCHED_MEM_PINNED] > 0 && min_pin > B[SCHED_MEM_PINNED]) {
        out->short_of[SCHED_MEM_PINNED] = true;
        out->needed[SCHED_MEM_PINNED] = min_pin;
        SAY("pinned memory is short: the copies in flight need %.2f GiB of pinned staging, the budget is %.2f GiB. ",
            gib(min_pin), gib(B[SCHED_MEM_PINNED]));
    }
    if (B[SCHED_MEM_HOST] > 0 && min_host > B[SCHED_MEM_HOST]) {
        out->short_of[SCHED_MEM_HOST] = true;
        out->needed[SCHED_MEM_HOST] = min_host;
        char parts[256];
        describe_host(w, host_plan, min_host, parts, sizeof parts);
        double opt_all = 0;
        for (int b = 0; b < w->num_blocks; b++) opt_all += w->blocks[b].optim_bytes + w->blocks[b].host_weight_bytes;
        char need[32], budget[32], opt[32];
        SAY("host memory is short: %s needs %s of host memory (%s), the budget is %s. "
            "The optimizer state (fp32 master weights, Adam m and v) alone is %s. ",
            fixed ? "this plan" : "the plan needing the least host memory within the device budget",
            bytes_str(min_host, need, sizeof need), parts, bytes_str(B[SCHED_MEM_HOST], budget, sizeof budget),
            bytes_str(opt_all, opt, sizeof opt));
    }
    if (used == 0) SAY("no plan fits the budgets");
    while (used > 0 && buf[used - 1] == ' ') buf[--used] = '\0';
#undef SAY
}

/* Appends to an infeasible plan's reason what the NVMe tier would need. */
static void nvme_hint(const sched_workload_t *w, const sched_planner_opts_t *o, char *why, size_t cap) {
    size_t n = strlen(why);
    if (n > 0 && why[n - 1] == '.') why[--n] = '\0';
    if (o->nvme && w->nvme_read_bw > 0)
        snprintf(why + n, cap - n, "; with optimizer state%s on NVMe it does not fit either (the NVMe budget, or "
                 "the host memory left for staging, gradients and the state being updated, is short)",
                 o->nvme_optim_only ? "" : " and streamed weights");
    else
        snprintf(why + n, cap - n, "%s", "; or give the run an NVMe tier for optimizer state and weights "
                                         "(memory.nvme.path, and a hardware profile with an nvme: section)");
}

static mt_status_t plan_make_order(const sched_workload_t *w, const sched_planner_opts_t *o, bool layer_major,
                                   bool pins, sched_planner_result_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    block_working_set(w, out);
    const int N = w->num_blocks;
    const bool fixed = o->policy != SCHED_POLICY_AUTO;
    sched_plan_t start;
    sched_plan_init_uniform(&start, N, fixed ? o->policy : SCHED_POLICY_MIN_MEMORY);
    start.policy = o->policy;
    start.layer_major = layer_major;
    if (!fixed) { /* adjacent forward and backward: recomputing or offloading saves nothing */
        start.blocks[0].acts = SCHED_ACTS_KEEP;
        start.blocks[N - 1].acts = SCHED_ACTS_KEEP;
        /* layer-major starts with every layer's block inputs on the host (the
         * least device memory); the walk keeps them where that pays */
        for (int b = 1; layer_major && b < N - 1; b++) start.blocks[b].lm_inputs = SCHED_INPUTS_OFFLOAD;
    }
    mt_status_t st = apply_overrides(&start, o, err);
    /* the moves never touch expert_parallel: the walk plans placement for
     * the layout it starts from */
    if (o->parallel == SCHED_PARALLEL_EXPERT)
        for (int b = 0; b < N; b++)
            if (w->moe && w->moe[b]) sched_block_plan_expert_parallel(&start.blocks[b]);
    path_t path = {0}, hostpath = {0};
    sched_plan_t nvme_plan = {0};
    bool nvme_found = false;
    int chosen = -1;
    if (st == MT_OK && pins) st = sched_pin_start(w, o, &start, &out->simulations, err);
    if (st != MT_OK) goto out;

    if (fixed) {
        /* the plan is given; choose the window when it is not */
        const int max_window = o->max_window > 0 ? o->max_window : 4;
        const int lo = o->prefetch_window > 0 ? o->prefetch_window : 1;
        const int hi = o->prefetch_window > 0 ? o->prefetch_window : max_window;
        for (int W = lo; W <= hi; W++) {
            start.prefetch_window = W;
            eval_t e;
            st = evaluate(w, &start, &e, &out->simulations, err);
            if (st != MT_OK) goto out;
            path_push(&path, &start, &e);
        }
        for (int i = 0; i < path.count; i++)
            if (fits(&path.evals[i], o->budget) &&
                (chosen < 0 || path.evals[i].time < path.evals[chosen].time * (1 - 1e-9)))
                chosen = i;
    } else {
        st = walk(w, &start, o, 0, &path, &out->simulations, err);
        if (st != MT_OK) goto out;
        for (int i = 0; i < path.count; i++)
            if (fits(&path.evals[i], o->budget) &&
                (chosen < 0 || path.evals[i].time <= path.evals[chosen].time * (1 + 1e-12)))
                chosen = i;
    }
    out->plans_walked = path.count;
    const sched_plan_t *pick = NULL;
    if (chosen >= 0) {
        out->feasible = true;
        pick = &path.plans[chosen];
    } else {
        if (!fixed) {
            /* the time walk found nothing: look for the least host memory within the device budget */
            st = walk(w, &path.plans[0], o, 1, &hostpath, &out->simulations, err);
            if (st != MT_OK) goto out;
            for (int i = hostpath.count - 1; i >= 0 && !pick; i--)
                if (fits(&hostpath.evals[i], o->budget)) pick = &hostpath.plans[i], out->feasible = true;
        }
        if (!out->feasible && o->nvme) {
            st = nvme_pass(w, o, &path, &nvme_plan, &nvme_found, &out->simulations, err);
            if (st == MT_OK && !fixed) st = nvme_pass(w, o, &hostpath, &nvme_plan, &nvme_found, &out->simulations, err);
            if (st != MT_OK) goto out;
            if (nvme_found) pick = &nvme_plan, out->feasible = true;
        }
        if (!out->feasible) {
            diagnose(w, o, &path, fixed ? NULL : &hostpath, fixed, out);
            if (out->short_of[SCHED_MEM_HOST]) nvme_hint(w, o, out->why, sizeof out->why);
            pick = &path.plans[0];
        }
    }
    plan_copy(&out->plan, pick);
    out->plan.policy = o->policy;
    if (!pins && !fixed && out->feasible) st = sched_pin_after(w, o, &out->plan, &out->simulations, err);
    if (st != MT_OK) goto out;
    sched_sim_opts_t so = {.timelines = true, .tasks = true};
    st = sched_simulate(w, &out->plan, &so, &out->sim, err);
    out->simulations++;
out:
    sched_plan_free(&start);
    if (nvme_found) sched_plan_free(&nvme_plan);
    path_free(&path);
    path_free(&hostpath);
    if (st != MT_OK) sched_planner_result_free(out);
    return st;
}

/* One step order, planned twice under the auto policy: with pinned
 * working copies and gradient accumulators from the start of the walk
 * (sched_pin_start), and walked without them, pinned after (sched_pin_after).  Pins
 * make streaming cheaper, so the first may walk to a plan the second
 * would not; but they take pinned memory the second may spend on staging
 * (a wider window, offloaded activations).  The faster feasible result
 * wins, the first on a tie.  A fixed policy's plan is what it names,
 * everything through the staging pool. */
static mt_status_t plan_order(const sched_workload_t *w, const sched_planner_opts_t *o, bool layer_major,
                              sched_planner_result_t *out, mt_error_t *err) {
    if (o->policy != SCHED_POLICY_AUTO) return plan_make_order(w, o, layer_major, false, out, err);
    sched_planner_result_t r[2];
    mt_status_t st = plan_make_order(w, o, layer_major, true, &r[0], err);
    if (st != MT_OK) return st;
    st = plan_make_order(w, o, layer_major, false, &r[1], err);
    if (st != MT_OK) {
        sched_planner_result_free(&r[0]);
        return st;
    }
    const int pick = r[1].feasible && (!r[0].feasible || r[1].sim.step_time < r[0].sim.step_time * (1 - 1e-9));
    *out = r[pick];
    out->simulations = r[0].simulations + r[1].simulations;
    sched_planner_result_free(&r[1 - pick]);
    return MT_OK;
}

/* Both step orders when the run leaves it open (and has micro-batches to
 * reorder): each gets the whole search, and the faster feasible plan wins
 * (micro-batch-major on a tie: it holds one micro-batch at a time). */
mt_status_t sched_plan_make(const sched_workload_t *w, const sched_planner_opts_t *user, sched_planner_result_t *out,
                            mt_error_t *err) {
    /* plans fit the device budget less its headroom (diagnose reports the
     * user's budget) */
    if (user->parallel == SCHED_PARALLEL_EXPERT) {
        bool any = false;
        for (int b = 0; w->moe && b < w->num_blocks; b++) any |= w->moe[b];
        if (user->devices != SCHED_EP_DEVICES)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "parallel: expert splits each MoE layer's experts between %d devices; the run has %d "
                                "(set devices: %d, or parallel: auto|data)",
                                SCHED_EP_DEVICES, user->devices > 0 ? user->devices : 1, SCHED_EP_DEVICES);
        if (!any)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "parallel: expert needs MoE layers (routed experts to split between the devices); this "
                                "model has none (use parallel: auto or data)");
    }
    sched_planner_opts_t eff = *user;
    if (eff.device_headroom > 0) eff.budget[SCHED_MEM_DEVICE] *= 1.0 - eff.device_headroom;
    const sched_planner_opts_t *o = &eff;
    const bool want[2] = {o->step_order != 1,
                          o->step_order == 1 || (o->step_order == SCHED_AUTO_CHOICE && w->grad_accum > 1)};
    sched_planner_result_t r[2];
    bool made[2] = {false, false};
    for (int k = 0; k < 2; k++) {
        if (!want[k]) continue;
        const mt_status_t st = plan_order(w, o, k == 1, &r[k], err);
        if (st != MT_OK) {
            if (made[0]) sched_planner_result_free(&r[0]);
            return st;
        }
        made[k] = true;
    }
    int pick = made[0] ? 0 : 1;
    if (made[0] && made[1] && r[1].feasible &&
        (!r[0].feasible || r[1].sim.step_time < r[0].sim.step_time * (1 - 1e-9)))
        pick = 1;
    *out = r[pick];
    out->simulations = 0;
    for (int k = 0; k < 2; k++) {
        if (!made[k]) continue;
        out->simulations += r[k].simulations;
        out->planned[k] = true;
        out->order_feasible[k] = r[k].feasible;
        out->order_step_s[k] = r[k].sim.step_time;
        out->order_h2d_bytes[k] = r[k].sim.h2d_bytes;
        out->order_d2h_bytes[k] = r[k].sim.d2h_bytes;
        out->order_peak_device[k] = r[k].sim.peak[SCHED_MEM_DEVICE];
        out->order_input_bytes[k] = r[k].sim.input_d2h_bytes;
        out->order_inputs_offloaded[k] = 0;
        for (int b = 0; k == 1 && b < r[k].plan.num_blocks; b++)
            out->order_inputs_offloaded[k] += sched_block_inputs_offloaded(&r[k].plan, b);
        if (k != pick) sched_planner_result_free(&r[k]);
    }
    return MT_OK;
}

void sched_planner_result_free(sched_planner_result_t *r) {
    if (!r) return;
    if (r->plan.blocks) sched_plan_free(&r->plan);
    sched_sim_result_free(&r->sim);
}
