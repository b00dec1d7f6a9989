/* The staging profiler (see profile.h).
 *
 * Each mode runs on the same device, plan and data (the loader restarts
 * with the run's seed), through the same training step as `moetune train`
 * (lr schedule, micro-batches, AdamW; nothing is saved).  Counters are
 * summed over the profiled steps from the pool's per-step statistics, so
 * the one-time placement of resident weights at load is left out; peaks
 * are the largest of the steps.  Internal waste is read off the timeline at
 * the moment the payload peaked: bytes inside live regions that carry no
 * data (alignment, page rounding, slots larger than their tensor), against
 * the bytes in use.
 *
 * The device, the plan and the data come from the set-up every run uses
 * (engine/run/session.h, without a model); the executors are the modes'
 * own.  Each part below is one thing the profiler does or prints. */
#include "engine/run/profile.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/fileio.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim.h"
#include "engine/exec/record/trace.h"
#include "engine/model/io/outdir.h"
#include "engine/run/host_mem.h"
#include "engine/run/save.h"
#include "engine/run/session.h"
#include "moe/staging_report.h"

typedef struct {
    moe_staging_mode_t mode;
    bool ok;
    int steps, micro;
    double *loss, *step_s;
    uint64_t copies[2], bytes[2], skipped, waits;
    double wait_s, pack_s;
    size_t peak_reserved, peak_in_use, peak_payload, pinned_peak;
    double waste_pct; /* internal: (in use - payload) / in use when in use peaked */
    eng_exec_staging_counters_t ctr; /* summed; max_moe_copies the largest */
    eng_exec_staging_info_t info;
    eng_host_mem_t host;
    moe_staging_timeline_t *tl;
} mode_result_t;

static const char *fmt_b(double v, char *buf, size_t cap) { return moe_staging_fmt_bytes(v, buf, cap); }

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(const double *v, int n) {
    if (n <= 0) return 0;
    double *c = malloc((size_t)n * sizeof *c);
    MT_CHECK_ALLOC(c, "median");
    memcpy(c, v, (size_t)n * sizeof *c);
    qsort(c, (size_t)n, sizeof *c, cmp_double);
    const double m = n % 2 ? c[n / 2] : 0.5 * (c[n / 2 - 1] + c[n / 2]);
    free(c);
    return m;
}

/* Bytes in live regions that carry no data, when the payload peaked (profiled
 * steps only).  Not at the in-use peak: a compact batch briefly holds a whole
 * free block before it knows how much it packs, which is not waste. */
static double internal_waste(const moe_staging_timeline_t *tl) {
    size_t payload = 0, in_use = 0;
    for (size_t i = 0; i < tl->n; i++)
        if (tl->s[i].step >= 1 && tl->s[i].payload > payload) payload = tl->s[i].payload, in_use = tl->s[i].in_use;
    return in_use ? 100.0 * (double)(in_use - payload) / (double)in_use : 0;
}

static bool plan_moves_anything(const sched_plan_t *p) {
    for (int b = 0; b < p->num_blocks; b++)
        if (p->blocks[b].weights == SCHED_WEIGHTS_STREAM || p->blocks[b].acts == SCHED_ACTS_OFFLOAD ||
            p->blocks[b].grads == SCHED_GRADS_HOST)
            return true;
    return false;
}

/* One profiled step's counters, from the pool's and the executor's
 * per-step statistics, added to r's (peaks: the largest). */
static void add_step(mode_result_t *r, eng_exec_t *x) {
    moe_staging_stats_t s;
    moe_staging_get_stats(eng_exec_staging(x), MOE_STAGING_SCOPE_STEP, &s);
    for (int d = 0; d < 2; d++) {
        r->copies[d] += s.copies[d];
        r->bytes[d] += s.bytes[d];
    }
    r->skipped += s.experts_skipped;
    r->waits += s.waits;
    r->wait_s += s.wait_s;
    r->pack_s += s.pack_s;
    if (s.peak_reserved > r->peak_reserved) r->peak_reserved = s.peak_reserved;
    if (s.peak_in_use > r->peak_in_use) r->peak_in_use = s.peak_in_use;
    if (s.peak_payload > r->peak_payload) r->peak_payload = s.peak_payload;
    eng_exec_staging_counters_t c;
    eng_exec_staging_counters(x, &c);
    for (int d = 0; d < 2; d++) {
        r->ctr.moe_passes[d] += c.moe_passes[d];
        r->ctr.moe_copies[d] += c.moe_copies[d];
        r->ctr.experts_moved[d] += c.experts_moved[d];
        r->ctr.experts_skipped[d] += c.experts_skipped[d];
        if (c.max_moe_copies[d] > r->ctr.max_moe_copies[d]) r->ctr.max_moe_copies[d] = c.max_moe_copies[d];
    }
    r->ctr.experts_unused += c.experts_unused;
    r->ctr.acts_unstaged += c.acts_unstaged;
    r->ctr.acts_offloaded += c.acts_offloaded;
}

/* The mode's steps, as `moetune train` runs them (lr schedule,
 * micro-batches, AdamW). */
static mt_status_t run_steps(const eng_run_config_t *rc, eng_exec_t *x, eng_loader_t *ld, int steps,
                             mode_result_t *r, mt_error_t *err) {
    const int total = rc->max_steps > 0 ? rc->max_steps : steps;
    const eng_optim_hparams_t base = {.beta1 = rc->adam_beta1, .beta2 = rc->adam_beta2, .eps = rc->adam_epsilon,
                                      .weight_decay = rc->weight_decay, .max_grad_norm = rc->max_grad_norm,
                            .skip_idle_experts = rc->idle_experts == ENG_IDLE_EXPERTS_SKIP,
                            .speculative = rc->sched_speculative};
    mt_status_t st = MT_OK;
    for (int step = 0; step < steps && st == MT_OK; step++) {
        const double t0 = mt_now_s();
        eng_optim_hparams_t hp = base;
        hp.lr = eng_lr_at(rc, step, total);
        const int accum = rc->gradient_accumulation_steps;
        eng_optim_begin_step(x, &hp, accum, true);
        double loss = 0;
        for (int mb = 0; mb < accum && st == MT_OK; mb++) {
            eng_batch_t b;
            eng_loader_next(ld, &b);
            eng_micro_stats_t ms;
            st = eng_exec_forward_backward(x, &b, 1.0f / (float)accum, NULL, &ms, err);
            loss += ms.loss / accum;
            r->micro++;
        }
        eng_optim_stats_t os;
        if (st == MT_OK) st = eng_optim_step(x, &hp, &os, err);
        if (st != MT_OK) {
            mt_error_prefix(err, "profile (%s), step %d: ", moe_staging_mode_name(r->mode), step + 1);
            break;
        }
        r->loss[step] = loss;
        r->step_s[step] = mt_now_s() - t0;
        r->steps = step + 1;
        add_step(r, x);
    }
    return st;
}

/* The pool after the steps: its sizing, timeline and peaks, and the host's
 * memory. */
static void read_pool(mode_result_t *r, eng_exec_t *x, kern_device_t *dev) {
    eng_exec_staging_info(x, &r->info);
    r->tl = moe_staging_timeline_copy(eng_exec_staging(x));
    r->waste_pct = internal_waste(r->tl);
    r->pinned_peak = kern_device_stats(dev).pinned_peak;
    r->host = eng_host_mem_read();
}

/* Writes the mode's trace with the pool's counter tracks; its first
 * failure becomes st when st is MT_OK. */
static mt_status_t close_trace(eng_exec_t *x, eng_trace_t *trace, double t_trace, mt_status_t st, mt_error_t *err) {
    mt_error_t terr = {0};
    mt_status_t ts = eng_exec_trace_staging(x, trace, t_trace, &terr);
    eng_exec_set_trace(x, NULL);
    if (eng_trace_close(trace, ts == MT_OK ? &terr : &(mt_error_t){0}) != MT_OK && ts == MT_OK) ts = terr.code;
    if (ts != MT_OK && st == MT_OK) st = mt_error_set(err, ts, "%s", terr.msg);
    return st;
}

/* One staging mode: its own executor on dev (the run's plan, the mode's
 * pool), its steps, what the pool did, and with trace_path its trace. */
static mt_status_t run_mode(const eng_run_config_t *rc, kern_device_t *dev, const sched_plan_t *plan,
                            const eng_dataset_t *ds, moe_staging_mode_t mode, int steps, const char *trace_path,
                            mode_result_t *r, mt_error_t *err) {
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->loss = calloc((size_t)steps, sizeof *r->loss);
    r->step_s = calloc((size_t)steps, sizeof *r->step_s);
    MT_CHECK(r->loss && r->step_s, "out of memory for profile results");
    eng_staging_settings_t ss;
    eng_staging_settings_from_run(rc, &ss);
    ss.mode = mode;
    eng_exec_t *x = NULL;
    mt_status_t st = eng_exec_load(&x, dev, rc->base_model, rc->model_config_json, plan, &ss, err);
    if (st != MT_OK) return mt_error_prefix(err, "profile (%s): ", moe_staging_mode_name(mode));
    eng_trace_t *trace = NULL;
    double t_trace = 0;
    if (trace_path && (st = eng_trace_open(trace_path, &trace, err)) == MT_OK) {
        eng_exec_set_trace(x, trace);
        t_trace = mt_now_s();
    }
    if (st == MT_OK) {
        kern_device_reset_peaks(dev);
        /* a loader that starts over with the run's seed */
        eng_loader_t ld;
        eng_loader_init(&ld, ds, rc->micro_batch_size, rc->shuffle, rc->seed);
        st = run_steps(rc, x, &ld, steps, r, err);
        read_pool(r, x, dev);
        if (trace) st = close_trace(x, trace, t_trace, st, err);
        eng_loader_free(&ld);
    }
    eng_exec_free(x);
    r->ok = st == MT_OK;
    return st;
}

static void result_free(mode_result_t *r) {
    free(r->loss);
    free(r->step_s);
    moe_staging_timeline_free(r->tl);
}

static double per(uint64_t v, int n) { return n > 0 ? (double)v / n : 0; }

static void print_modes(FILE *f, const mode_result_t *r, int n) {
    char a[32], b[32], c[32];
    fprintf(f, "\n%-11s %14s %12s %12s %15s %17s %12s\n", "mode", "pinned peak", "in use", "payload",
            "internal waste", "reserved/window", "step (ms)");
    for (int k = 0; k < n; k++) {
        const mode_result_t *x = &r[k];
        fprintf(f, "%-11s %14s %12s %12s %14.1f%% %16.2fx %12.1f\n", moe_staging_mode_name(x->mode),
                fmt_b((double)x->peak_reserved, a, sizeof a), fmt_b((double)x->peak_in_use, b, sizeof b),
                fmt_b((double)x->peak_payload, c, sizeof c), x->waste_pct,
                x->info.window_payload ? (double)x->peak_reserved / (double)x->info.window_payload : 0,
                1e3 * median(x->step_s, x->steps));
    }
    fprintf(f, "\n%-11s %24s %24s %28s %9s %10s %9s\n", "per step", "H2D copies (mean size)", "D2H copies (mean size)",
            "per MoE layer & micro-batch", "experts", "waited", "host");
    fprintf(f, "%-11s %24s %24s %28s %9s %10s %9s\n", "", "", "", "H2D max/mean  D2H max/mean", "skipped", "for space",
            "packing");
    for (int k = 0; k < n; k++) {
        const mode_result_t *x = &r[k];
        char h[48], dd[48], l[48];
        snprintf(h, sizeof h, "%.1f (%s)", per(x->copies[0], x->steps),
                 fmt_b(x->copies[0] ? (double)x->bytes[0] / (double)x->copies[0] : 0, a, sizeof a));
        snprintf(dd, sizeof dd, "%.1f (%s)", per(x->copies[1], x->steps),
                 fmt_b(x->copies[1] ? (double)x->bytes[1] / (double)x->copies[1] : 0, b, sizeof b));
        snprintf(l, sizeof l, "%d / %.2f    %d / %.2f", x->ctr.max_moe_copies[0],
                 x->ctr.moe_passes[0] ? (double)x->ctr.moe_copies[0] / (double)x->ctr.moe_passes[0] : 0,
                 x->ctr.max_moe_copies[1],
                 x->ctr.moe_passes[1] ? (double)x->ctr.moe_copies[1] / (double)x->ctr.moe_passes[1] : 0);
        fprintf(f, "%-11s %24s %24s %28s %9.1f %8.1fms %7.1fms\n", moe_staging_mode_name(x->mode), h, dd, l,
                per(x->skipped, x->steps), 1e3 * x->wait_s / (x->steps ? x->steps : 1),
                1e3 * x->pack_s / (x->steps ? x->steps : 1));
    }
}

static const mode_result_t *find(const mode_result_t *r, int n, moe_staging_mode_t m) {
    for (int k = 0; k < n; k++)
        if (r[k].mode == m) return &r[k];
    return NULL;
}

/* The profile's checks, printed; returns whether the losses are identical. */
static bool print_checks(FILE *f, const mode_result_t *r, int n) {
    bool same = true;
    for (int k = 1; k < n; k++)
        for (int s = 0; s < r[0].steps && s < r[k].steps; s++) same &= r[k].loss[s] == r[0].loss[s];
    const mode_result_t *c = find(r, n, MOE_STAGING_COMPACT), *t = find(r, n, MOE_STAGING_PER_TENSOR),
                        *x = find(r, n, MOE_STAGING_MAX_SLOT);
    fprintf(f, "\nchecks\n");
    fprintf(f, "  identical losses across modes                       %s\n", same ? "yes" : "NO");
    if (c) {
        const double ratio = c->info.window_payload ? (double)c->peak_reserved / (double)c->info.window_payload : 0;
        fprintf(f, "  compact reserves <= 1.10 x the window's payload      %.3fx  %s\n", ratio,
                ratio <= 1.10 ? "yes" : "NO");
        fprintf(f, "  compact internal waste <= 10%%                        %.1f%%  %s\n", c->waste_pct,
                c->waste_pct <= 10 ? "yes" : "NO");
        fprintf(f, "  compact <= 3 copies per MoE layer per direction     H2D %d, D2H %d per micro-batch  %s",
                c->ctr.max_moe_copies[0], c->ctr.max_moe_copies[1],
                c->ctr.max_moe_copies[0] <= 3 && c->ctr.max_moe_copies[1] <= 3 ? "yes" : "NO");
        if (t)
            fprintf(f, " (per_tensor: %.1f H2D, %.1f D2H)",
                    t->ctr.moe_passes[0] ? (double)t->ctr.moe_copies[0] / (double)t->ctr.moe_passes[0] : 0,
                    t->ctr.moe_passes[1] ? (double)t->ctr.moe_copies[1] / (double)t->ctr.moe_passes[1] : 0);
        fputc('\n', f);
    }
    if (c && t && x) {
        char a[32], b[32], d[32];
        const bool order = x->peak_reserved > t->peak_reserved && t->peak_reserved >= c->peak_reserved;
        fprintf(f, "  pinned: max_slot > per_tensor >= compact            %s > %s >= %s  %s\n",
                fmt_b((double)x->peak_reserved, a, sizeof a), fmt_b((double)t->peak_reserved, b, sizeof b),
                fmt_b((double)c->peak_reserved, d, sizeof d), order ? "yes" : "NO");
    }
    if (c && t) {
        const double tc = median(c->step_s, c->steps), tt = median(t->step_s, t->steps);
        fprintf(f, "  compact throughput / per_tensor (median step)       %.3f\n", tc > 0 ? tt / tc : 0);
    }
    return same;
}

static mt_status_t profile_locked(const eng_run_config_t *rc, const eng_profile_opts_t *opts, mt_error_t *err);

/* Writes into output_dir as a training run does, so under the same rules:
 * never into an input, and one run per output_dir (engine/model/io/outdir.h). */
mt_status_t eng_profile(const eng_run_config_t *rc, const eng_profile_opts_t *opts, mt_error_t *err) {
    mt_status_t st = eng_run_check_paths(rc, err);
    if (st != MT_OK) return st;
    eng_outdir_lock_t lock;
    st = eng_outdir_lock(&lock, rc->output_dir, err);
    if (st != MT_OK) return st;
    st = profile_locked(rc, opts, err);
    eng_outdir_unlock(&lock);
    return st;
}

/* The plan to profile: the run's, or offload_all when nothing would cross
 * the link under it.  why receives the line that says which. */
static void profiled_plan(eng_run_t *run, char *why, size_t cap) {
    const eng_run_config_t *rc = run->rc;
    eng_train_plan_t *tp = &run->tp;
    snprintf(why, cap, "%s", tp->summary);
    if (plan_moves_anything(&tp->plan)) return;
    const int w = tp->plan.prefetch_window;
    sched_plan_free(&tp->plan);
    sched_plan_init_uniform(&tp->plan, run->num_blocks, SCHED_POLICY_OFFLOAD_ALL);
    if (rc->sched_prefetch_window > 0) tp->plan.prefetch_window = rc->sched_prefetch_window;
    else if (w > 0) tp->plan.prefetch_window = w;
    snprintf(why, cap,
             "the run's plan moves nothing through staging (%.500s); profiling offload_all instead, prefetch window %d",
             tp->summary, tp->plan.prefetch_window);
}

static void print_run(FILE *f, const eng_run_t *run, const char *why, int steps) {
    const eng_run_config_t *rc = run->rc;
    fprintf(f, "moetune profile: %s\n", rc->source_path);
    fprintf(f, "plan       %s\n", why);
    fprintf(f, "run        %d steps x %d micro-batches of %d x %d tokens on %s", steps, rc->gradient_accumulation_steps,
            rc->micro_batch_size, rc->sequence_len, run->dev->vt->name);
    if (rc->link_gbps > 0) fprintf(f, ", links throttled to %.2f GB/s + %.0f us per copy", rc->link_gbps, rc->link_latency_us);
    fputc('\n', f);
    fflush(f);
}

static void print_window(FILE *f, const eng_exec_staging_info_t *in) {
    char a[32], b[32], c[32], d[32], e[32];
    fprintf(f, "window     %d blocks of streamed weights (%s) + one block of gradients (%s) + offloaded "
               "activations (%s) = %s in %d tensors; largest tensor %s (%s)\n",
            in->window_blocks, fmt_b((double)in->window_weights, a, sizeof a),
            fmt_b((double)in->window_grads, b, sizeof b), fmt_b((double)in->window_acts, c, sizeof c),
            fmt_b((double)in->window_payload, d, sizeof d), in->window_tensors, in->largest_name,
            fmt_b((double)in->largest_tensor, e, sizeof e));
}

static void print_losses(FILE *f, const mode_result_t *res, int nmodes) {
    fprintf(f, "\nlosses    ");
    for (int s = 0; s < res[0].steps; s++) fprintf(f, " step %d %.9g", s + 1, res[0].loss[s]);
    fputc('\n', f);
    for (int k = 0; k < nmodes; k++)
        if (res[k].ctr.acts_unstaged)
            fprintf(f, "note: %s: %llu activation offloads did not fit the pool (capped?) and used plain pinned "
                       "buffers\n",
                    moe_staging_mode_name(res[k].mode), (unsigned long long)res[k].ctr.acts_unstaged);
}

static void print_host_memory(FILE *f, const mode_result_t *res, int nmodes) {
    char a[32], b[32], c[32];
    const eng_host_mem_t *h = &res[nmodes - 1].host;
    fprintf(f, "\nhost memory (after the last mode's steps)\n");
    if (h->jemalloc)
        fprintf(f, "  pageable (jemalloc)  allocated %s, active %s, resident %s\n", fmt_b((double)h->allocated, a, sizeof a),
                fmt_b((double)h->active, b, sizeof b), fmt_b((double)h->resident, c, sizeof c));
    else
        fprintf(f, "  pageable             (built without jemalloc: no allocator statistics)\n");
    for (int k = 0; k < nmodes; k++)
        fprintf(f, "  pinned (%-10s)  %s; pageable + pinned %s\n", moe_staging_mode_name(res[k].mode),
                fmt_b((double)res[k].pinned_peak, a, sizeof a),
                fmt_b((double)(res[k].host.allocated + res[k].pinned_peak), b, sizeof b));
    fprintf(f, "  process peak RSS     %s\n", fmt_b((double)h->peak_rss, a, sizeof a));
}

/* The timelines of every mode into dir/staging.csv and staging.svg. */
static mt_status_t write_timelines(FILE *f, const eng_run_config_t *rc, const char *dir, const mode_result_t *res,
                                   int nmodes, mt_error_t *err) {
    const moe_staging_timeline_t *tls[MOE_STAGING_MODE_COUNT];
    for (int k = 0; k < nmodes; k++) tls[k] = res[k].tl;
    char path[1300];
    snprintf(path, sizeof path, "%s/staging.csv", dir);
    mt_status_t st = moe_staging_write_csv_timelines(tls, nmodes, path, err);
    snprintf(path, sizeof path, "%s/staging.svg", dir);
    if (st == MT_OK) st = moe_staging_write_svg(tls, nmodes, path, err);
    if (st == MT_OK)
        fprintf(f, "\nwrote %s/staging.csv and staging.svg%s\n", dir, rc->trace ? " and trace-MODE.json" : "");
    return st;
}

/* What the modes measured, on f and in dir; losses that differ between
 * modes are an error. */
static mt_status_t report(FILE *f, const eng_run_config_t *rc, const char *dir, const mode_result_t *res, int nmodes,
                          mt_error_t *err) {
    print_window(f, &res[0].info);
    print_modes(f, res, nmodes);
    print_losses(f, res, nmodes);
    const bool same = nmodes > 1 ? print_checks(f, res, nmodes) : true;
    print_host_memory(f, res, nmodes);
    mt_status_t st = write_timelines(f, rc, dir, res, nmodes, err);
    if (st == MT_OK && !same)
        st = mt_error_set(err, MT_ERR_INTERNAL,
                          "the staging modes gave different losses: the staging layout changed what was computed");
    return st;
}

/* Each mode in turn on the run's device, plan and data, then the report. */
static mt_status_t profile_modes(eng_run_t *run, const eng_profile_opts_t *opts, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    FILE *f = opts && opts->out ? opts->out : stdout;
    const int steps = opts && opts->steps > 0 ? opts->steps : 3;
    char why[1200];
    profiled_plan(run, why, sizeof why);
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/staging", rc->output_dir);
    mt_status_t st = mt_mkdirs(dir, err);

    moe_staging_mode_t modes[MOE_STAGING_MODE_COUNT];
    int nmodes = 0;
    if (opts && opts->compare)
        for (int k = 0; k < MOE_STAGING_MODE_COUNT; k++) modes[nmodes++] = (moe_staging_mode_t)k;
    else
        modes[nmodes++] = (moe_staging_mode_t)rc->staging_mode;
    print_run(f, run, why, steps);

    mode_result_t res[MOE_STAGING_MODE_COUNT];
    memset(res, 0, sizeof res);
    int done = 0;
    for (int k = 0; k < nmodes && st == MT_OK; k++) {
        char tpath[1400];
        snprintf(tpath, sizeof tpath, "%s/trace-%s.json", dir, moe_staging_mode_name(modes[k]));
        st = run_mode(rc, run->dev, run->plan, &run->ds, modes[k], steps, rc->trace ? tpath : NULL, &res[k], err);
        done = k + 1;
    }
    if (st == MT_OK) st = report(f, rc, dir, res, nmodes, err);
    for (int k = 0; k < done; k++) result_free(&res[k]);
    return st;
}

/* The run's device, plan and data (engine/run/session.h); the executors
 * are the modes' own. */
static mt_status_t profile_locked(const eng_run_config_t *rc, const eng_profile_opts_t *opts, mt_error_t *err) {
    eng_run_t run;
    const eng_run_opts_t ro = {.without_model = true};
    mt_status_t st = eng_run_open(&run, rc, &ro, err);
    if (st == MT_OK) st = profile_modes(&run, opts, err);
    return eng_run_close(&run, st, err);
}
