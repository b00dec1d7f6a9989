/* `moetune bench step`: training steps of a synthetic MoE under different
 * plans on the CPU backend, with the copy streams throttled to a link.
 *
 * It measures, in one run and on one machine:
 *   - the median step time of keep_all, offload_all and min_memory, and
 *     offload_all / keep_all (weights, gradients, optimizer state and
 *     activations all cross the link, so this is how well copies hide
 *     behind compute: MegaTrain reports near-zero overhead);
 *   - the host optimizer's share of the step with and without overlapping
 *     backward (offload_all, no clipping), i.e. issue 6's overlap;
 *   - peak device bytes of each plan;
 *   - the staging pool (issue 4): offload_all's step time with the compact
 *     pool against per_tensor (one pinned block and one copy per tensor), two
 *     models side by side with their steps alternating, the median of the
 *     per-pair ratios over --staging-rounds x --steps pairs (load from other
 *     processes hits both members of a pair); copies per step and pinned
 *     bytes beside it.
 * The link is either given (--link-gbps) or chosen as issue 3 asks: so
 * that each layer's transfers under offload_all take no longer than its
 * compute, i.e. for every layer, phase (forward, backward) and direction,
 * the bytes it moves (the cost model's, for the synthetic model) over the
 * link take at most `--link-fraction` (default 0.9) of the layer's compute
 * time in that phase, as profiled in the keep_all run. */
#include "tools/bench/step_bench.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/data.h"
#include "engine/exec.h"
#include "engine/init_random.h"
#include "engine/model.h"
#include "engine/optim.h"
#include "engine/report.h"
#include "engine/trace.h"
#include "engine/calibrate.h"
#include "engine/config.h"
#include "engine/program.h"
#include "scheduler/costmodel.h"
#include "scheduler/hw.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"
#include "scheduler/registry.h"
#include "scheduler/simulate.h"

typedef struct {
    int layers, hidden, experts, topk, expert_width, vocab, heads, kv_heads;
    int seq, batch, steps, staging_rounds;
    double link_gbps, link_latency_us, link_fraction;
    /* threads of the CPU backend's compute pool (0 = all cores).  On a GPU,
     * copies run on DMA engines beside compute and the host optimizer on
     * the host's cores; on this backend they are threads of their own, so
     * with N given, compute is pinned to N cores and copies, staging and
     * the host optimizer to the others (kern_device_opts_t.pin_threads). */
    int compute_threads;
    bool json, staging_only, blocks;
    const char *trace; /* write the overlapped offload_all run's trace.json here */
} opts_t;

typedef struct {
    double median_s, optim_s; /* median step time; median optimizer wall time */
    double *fwd_s, *bwd_s;    /* per-block compute seconds, mean per step (profiled) */
    double compute_med_s;     /* median over steps of the step's block compute (0: not measured) */
    size_t peak_device;
    uint64_t h2d_bytes, d2h_bytes; /* per step */
    int overlapped;
    bool ok;
} measure_t;

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Synthetic data: uniformly random tokens, every target counted. */
static void make_dataset(eng_dataset_t *ds, const opts_t *o, int rows) {
    memset(ds, 0, sizeof *ds);
    ds->T = o->seq;
    ds->num_rows = rows;
    const size_t n = (size_t)rows * o->seq;
    ds->inputs = malloc(n * sizeof *ds->inputs);
    ds->targets = malloc(n * sizeof *ds->targets);
    ds->mask = malloc(n);
    MT_CHECK(ds->inputs && ds->targets && ds->mask, "out of memory for the synthetic dataset");
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (size_t i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        ds->inputs[i] = (int32_t)(x % (uint64_t)o->vocab);
        ds->mask[i] = 1;
    }
    for (size_t i = 0; i < n; i++) ds->targets[i] = (i + 1) % (size_t)o->seq ? ds->inputs[i + 1] : -100;
}

static void measure_plan_staged(const char *ckpt, const opts_t *o, const sched_plan_t *given, double link_bps,
                                bool overlap, const char *trace_path, moe_staging_mode_t mode, measure_t *out) {
    const sched_policy_t policy = given->policy;
    memset(out, 0, sizeof *out);
    mt_error_t err = {0};
    kern_device_opts_t dopts = {.link_h2d_bytes_per_s = link_bps, .link_d2h_bytes_per_s = link_bps,
                                .link_latency_s = o->link_latency_us * 1e-6, .host_threads = o->compute_threads,
                                .pin_threads = o->compute_threads > 0};
    kern_device_t *dev = NULL;
    if (kern_device_create(KERN_BACKEND_CPU, &dopts, &dev, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return;
    }
    eng_model_t m;
    eng_staging_settings_t ss;
    eng_staging_settings_init(&ss);
    ss.mode = mode;
    ss.tokens = o->batch * o->seq;
    if (eng_model_load_ex(&m, dev, ckpt, NULL, given, &ss, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        kern_device_destroy(dev);
        return;
    }
    eng_trace_t *trace = NULL;
    if (trace_path && eng_trace_open(trace_path, &trace, &err) == MT_OK) eng_model_set_trace(&m, trace);
    eng_dataset_t ds;
    make_dataset(&ds, o, o->batch * (o->steps + 1));
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, o->batch, false, 0);
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8,
                                    .weight_decay = 0.0, .max_grad_norm = 0.0};
    double *times = malloc((size_t)o->steps * sizeof *times), *optim = malloc((size_t)o->steps * sizeof *optim);
    MT_CHECK(times && optim, "out of memory");
    out->ok = true;
    for (int step = -1; step < o->steps && out->ok; step++) { /* step -1 warms up */
        const kern_device_stats_t before = kern_device_stats(dev);
        const double t0 = eng_now_s();
        eng_optim_begin_step(&m, &hp, 1, overlap);
        eng_batch_t b;
        eng_loader_next(&ld, &b);
        eng_micro_stats_t ms;
        eng_optim_stats_t os;
        if (eng_model_forward_backward(&m, &b, 1.0f, NULL, &ms, &err) != MT_OK ||
            eng_optim_step(&m, &hp, &os, &err) != MT_OK) {
            fprintf(stderr, "bench step (%s): %s\n", sched_policy_name(policy), err.msg);
            out->ok = false;
            break;
        }
        const double dt = eng_now_s() - t0;
        if (step < 0) eng_model_block_times(&m, NULL, NULL, true); /* drop the warm-up */
        if (step >= 0) {
            const kern_device_stats_t after = kern_device_stats(dev);
            times[step] = dt;
            optim[step] = os.optim_wall_s;
            out->h2d_bytes = after.h2d_bytes - before.h2d_bytes;
            out->d2h_bytes = after.d2h_bytes - before.d2h_bytes;
            out->overlapped = os.updated_during_backward;
        }
    }
    if (out->ok) {
        out->median_s = median(times, o->steps);
        out->optim_s = median(optim, o->steps);
        out->peak_device = kern_device_stats(dev).device_peak;
        const int nb = eng_model_num_blocks(&m);
        out->fwd_s = calloc((size_t)nb, sizeof *out->fwd_s);
        out->bwd_s = calloc((size_t)nb, sizeof *out->bwd_s);
        MT_CHECK(out->fwd_s && out->bwd_s, "out of memory");
        eng_model_block_times(&m, out->fwd_s, out->bwd_s, true);
    }
    free(times);
    free(optim);
    if (trace) {
        eng_model_set_trace(&m, NULL);
        if (eng_trace_close(trace, &err) != MT_OK) fprintf(stderr, "bench step: %s\n", err.msg);
        else fprintf(stderr, "bench step: trace of offload_all (overlapped) written to %s\n", trace_path);
    }
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_model_free(&m);
    kern_device_destroy(dev);
}

static void measure_plan(const char *ckpt, const opts_t *o, const sched_plan_t *given, double link_bps,
                         bool overlap, const char *trace_path, measure_t *out) {
    measure_plan_staged(ckpt, o, given, link_bps, overlap, trace_path, MOE_STAGING_COMPACT, out);
}

static void measure(const char *ckpt, const opts_t *o, sched_policy_t policy, double link_bps, bool overlap,
                    const char *trace_path, measure_t *out) {
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, o->layers + 2, policy);
    measure_plan(ckpt, o, &plan, link_bps, overlap, trace_path, out);
    sched_plan_free(&plan);
}

/* Plans side by side: one model per plan, each on its own device, one step
 * of each in turn (the order rotating every round), so that load from other
 * processes and a shared host's steal time, which come and go, weigh on
 * every plan alike; medians over the rounds.  ratio[i] is the median over
 * rounds of plan i's step over plan 0's in the same round. */
static void measure_side_by_side(const char *ckpt, const opts_t *o, const sched_plan_t *const *plans,
                                 const bool *overlap, int n, double link_bps, int trace_idx, measure_t *out,
                                 double *ratio, double *probe_out) {
    typedef struct {
        kern_device_t *dev;
        eng_model_t m;
        eng_dataset_t ds;
        eng_loader_t ld;
        eng_trace_t *trace;
        bool loaded;
        double *t, *opt, *comp; /* per step: wall, optimizer, block compute */
        double *fwd, *bwd;      /* per block: summed over steps */
    } run_t;
    run_t *r = calloc((size_t)n, sizeof *r);
    double *rr = malloc((size_t)o->steps * sizeof *rr);
    MT_CHECK(r && rr, "out of memory");
    mt_error_t err = {0};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        memset(&out[i], 0, sizeof out[i]);
        kern_device_opts_t dopts = {.link_h2d_bytes_per_s = link_bps, .link_d2h_bytes_per_s = link_bps,
                                    .link_latency_s = o->link_latency_us * 1e-6, .host_threads = o->compute_threads,
                                    .pin_threads = o->compute_threads > 0};
        eng_staging_settings_t ss;
        eng_staging_settings_init(&ss);
        ss.tokens = o->batch * o->seq;
        ok = kern_device_create(KERN_BACKEND_CPU, &dopts, &r[i].dev, &err) == MT_OK &&
             eng_model_load_ex(&r[i].m, r[i].dev, ckpt, NULL, plans[i], &ss, &err) == MT_OK;
        if (!ok) {
            fprintf(stderr, "bench step (%s): %s\n", sched_policy_name(plans[i]->policy), err.msg);
            break;
        }
        r[i].loaded = true;
        make_dataset(&r[i].ds, o, o->batch * (o->steps + 1));
        eng_loader_init(&r[i].ld, &r[i].ds, o->batch, false, 0);
        r[i].t = malloc((size_t)o->steps * sizeof(double));
        r[i].opt = malloc((size_t)o->steps * sizeof(double));
        r[i].comp = malloc((size_t)o->steps * sizeof(double));
        r[i].fwd = calloc((size_t)(o->layers + 2), sizeof(double));
        r[i].bwd = calloc((size_t)(o->layers + 2), sizeof(double));
        MT_CHECK(r[i].t && r[i].opt && r[i].comp && r[i].fwd && r[i].bwd, "out of memory");
        if (i == trace_idx && o->trace && eng_trace_open(o->trace, &r[i].trace, &err) == MT_OK)
            eng_model_set_trace(&r[i].m, r[i].trace);
    }
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = 0.0};
    /* the interference probe, a few pairs every round, so that it sees the
     * machine as the plans do (on this shared host it changes over minutes) */
    enum { PROBE_PAIRS = 3 };
    eng_interference_probe_t *probe = eng_interference_probe_open(o->compute_threads);
    double *probe_r = malloc((size_t)o->steps * PROBE_PAIRS * sizeof *probe_r);
    MT_CHECK_ALLOC(probe_r, "probe ratios");
    int nprobe = 0;
    for (int step = -1; step < o->steps && ok; step++) { /* step -1 warms every plan up */
        if (probe && step >= 0)
            for (int k = 0; k < PROBE_PAIRS; k++) probe_r[nprobe++] = eng_interference_probe_pair(probe);
        for (int k = 0; k < n && ok; k++) {
            const int i = (k + (step > 0 ? step : 0)) % n;
            run_t *q = &r[i];
            const kern_device_stats_t before = kern_device_stats(q->dev);
            const double t0 = eng_now_s();
            eng_optim_begin_step(&q->m, &hp, 1, overlap[i]);
            eng_batch_t b;
            eng_loader_next(&q->ld, &b);
            eng_micro_stats_t ms;
            eng_optim_stats_t os;
            if (eng_model_forward_backward(&q->m, &b, 1.0f, NULL, &ms, &err) != MT_OK ||
                eng_optim_step(&q->m, &hp, &os, &err) != MT_OK) {
                fprintf(stderr, "bench step (%s): %s\n", sched_policy_name(plans[i]->policy), err.msg);
                ok = false;
                break;
            }
            const double dt = eng_now_s() - t0;
            if (step < 0) {
                eng_model_block_times(&q->m, NULL, NULL, true); /* drop the warm-up */
                continue;
            }
            const kern_device_stats_t after = kern_device_stats(q->dev);
            q->t[step] = dt;
            q->opt[step] = os.optim_wall_s;
            {
                const int nbk = o->layers + 2;
                double f[nbk], g[nbk], c = 0;
                eng_model_block_times(&q->m, f, g, true);
                for (int b = 0; b < nbk; b++) c += f[b] + g[b], q->fwd[b] += f[b], q->bwd[b] += g[b];
                q->comp[step] = c;
            }
            out[i].h2d_bytes = after.h2d_bytes - before.h2d_bytes;
            out[i].d2h_bytes = after.d2h_bytes - before.d2h_bytes;
            out[i].overlapped = os.updated_during_backward;
        }
    }
    eng_interference_probe_close(probe);
    *probe_out = nprobe > 0 ? median(probe_r, nprobe) : 0;
    free(probe_r);
    const int nb = o->layers + 2;
    for (int i = 0; i < n && ok; i++) { /* before the medians: they sort */
        for (int k = 0; k < o->steps; k++) rr[k] = r[i].t[k] / r[0].t[k];
        ratio[i] = median(rr, o->steps);
    }
    for (int i = 0; i < n; i++) {
        if (ok) {
            out[i].ok = true;
            out[i].fwd_s = calloc((size_t)nb, sizeof *out[i].fwd_s);
            out[i].bwd_s = calloc((size_t)nb, sizeof *out[i].bwd_s);
            MT_CHECK(out[i].fwd_s && out[i].bwd_s, "out of memory");
            for (int b = 0; b < nb; b++) out[i].fwd_s[b] = r[i].fwd[b] / o->steps, out[i].bwd_s[b] = r[i].bwd[b] / o->steps;
            out[i].compute_med_s = median(r[i].comp, o->steps);
            out[i].peak_device = kern_device_stats(r[i].dev).device_peak;
            out[i].median_s = median(r[i].t, o->steps);
            out[i].optim_s = median(r[i].opt, o->steps);
        }
        if (r[i].trace) {
            eng_model_set_trace(&r[i].m, NULL);
            if (eng_trace_close(r[i].trace, &err) != MT_OK) fprintf(stderr, "bench step: %s\n", err.msg);
            else fprintf(stderr, "bench step: trace of offload_all (overlapped) written to %s\n", o->trace);
        }
    }
    for (int i = n - 1; i >= 0; i--) { /* last created first: pinned devices give the cores back in order */
        free(r[i].t);
        free(r[i].opt);
        free(r[i].comp);
        free(r[i].fwd);
        free(r[i].bwd);
        if (!r[i].dev) continue;
        if (r[i].loaded) {
            eng_loader_free(&r[i].ld);
            eng_dataset_free(&r[i].ds);
            eng_model_free(&r[i].m);
        }
        kern_device_destroy(r[i].dev);
    }
    free(r);
    free(rr);
}

/* Seconds of block compute in one step (forward + backward, all blocks). */
static double compute_s(const measure_t *m, int nb) {
    if (m->compute_med_s > 0) return m->compute_med_s;
    double t = 0;
    for (int b = 0; m->fwd_s && b < nb; b++) t += m->fwd_s[b] + m->bwd_s[b];
    return t;
}

static void measure_free(measure_t *m) {
    free(m->fwd_s);
    free(m->bwd_s);
}

/* offload_all (overlapped) with the compact pool and with per_tensor staging.
 * The machine is shared, so the two run side by side as a paired
 * comparison: one model per mode (each on its own device), steps
 * alternating A B B A, and the ratio taken per pair of neighbouring steps;
 * load from other processes then slows both members of a pair alike. */
typedef struct {
    double step_s[2];          /* [0] compact, [1] per_tensor: medians */
    double ratio;              /* median of per-pair per_tensor / compact step times */
    uint64_t copies[2][2];     /* mode, direction: per step */
    size_t pinned[2];
    int pairs;
    bool ok;
} staging_cmp_t;

typedef struct {
    kern_device_t *dev;
    eng_model_t m;
    eng_dataset_t ds;
    eng_loader_t ld;
    bool loaded;
} runner_t;

static bool runner_init(runner_t *r, const char *ckpt, const opts_t *o, const sched_plan_t *plan, double link_bps,
                        moe_staging_mode_t mode, int rows) {
    memset(r, 0, sizeof *r);
    mt_error_t err = {0};
    kern_device_opts_t dopts = {.link_h2d_bytes_per_s = link_bps, .link_d2h_bytes_per_s = link_bps,
                                .link_latency_s = o->link_latency_us * 1e-6, .host_threads = o->compute_threads,
                                .pin_threads = o->compute_threads > 0};
    if (kern_device_create(KERN_BACKEND_CPU, &dopts, &r->dev, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return false;
    }
    eng_staging_settings_t ss;
    eng_staging_settings_init(&ss);
    ss.mode = mode;
    ss.tokens = o->batch * o->seq;
    if (eng_model_load_ex(&r->m, r->dev, ckpt, NULL, plan, &ss, &err) != MT_OK) {
        fprintf(stderr, "bench step (%s): %s\n", moe_staging_mode_name(mode), err.msg);
        kern_device_destroy(r->dev);
        r->dev = NULL;
        return false;
    }
    r->loaded = true;
    make_dataset(&r->ds, o, rows);
    eng_loader_init(&r->ld, &r->ds, o->batch, false, 0);
    return true;
}

static bool runner_step(runner_t *r, double *dt, moe_staging_stats_t *st) {
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = 0.0};
    mt_error_t err = {0};
    const double t0 = eng_now_s();
    eng_optim_begin_step(&r->m, &hp, 1, true);
    eng_batch_t b;
    eng_loader_next(&r->ld, &b);
    eng_micro_stats_t ms;
    eng_optim_stats_t os;
    if (eng_model_forward_backward(&r->m, &b, 1.0f, NULL, &ms, &err) != MT_OK ||
        eng_optim_step(&r->m, &hp, &os, &err) != MT_OK) {
        fprintf(stderr, "bench step (staging): %s\n", err.msg);
        return false;
    }
    *dt = eng_now_s() - t0;
    moe_staging_get_stats(eng_exec_staging(&r->m), MOE_STAGING_SCOPE_STEP, st);
    return true;
}

static void runner_free(runner_t *r) {
    if (!r->dev) return;
    eng_loader_free(&r->ld);
    eng_dataset_free(&r->ds);
    if (r->loaded) eng_model_free(&r->m);
    kern_device_destroy(r->dev);
}

static void measure_staging(const char *ckpt, const opts_t *o, double link_bps, staging_cmp_t *out) {
    memset(out, 0, sizeof *out);
    const int n = o->staging_rounds * o->steps; /* timed steps per mode */
    double *t[2] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double))};
    double *ratio = malloc((size_t)n * sizeof(double));
    MT_CHECK(t[0] && t[1] && ratio, "out of memory");
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, o->layers + 2, SCHED_POLICY_OFFLOAD_ALL);
    runner_t r[2];
    out->ok = runner_init(&r[0], ckpt, o, &plan, link_bps, MOE_STAGING_COMPACT, o->batch * (n + 1)) &&
              runner_init(&r[1], ckpt, o, &plan, link_bps, MOE_STAGING_PER_TENSOR, o->batch * (n + 1));
    for (int i = -1; i < n && out->ok; i++) { /* step -1 warms both up */
        double dt[2];
        for (int k = 0; k < 2 && out->ok; k++) {
            const int mode = (i & 1) ? 1 - k : k; /* A B, B A, ... */
            moe_staging_stats_t st;
            out->ok = runner_step(&r[mode], &dt[mode], &st);
            if (out->ok && i >= 0) {
                out->copies[mode][0] = st.copies[0];
                out->copies[mode][1] = st.copies[1];
                if (st.peak_reserved > out->pinned[mode]) out->pinned[mode] = st.peak_reserved;
            }
        }
        if (out->ok && i >= 0) {
            t[0][i] = dt[0];
            t[1][i] = dt[1];
            ratio[i] = dt[1] / dt[0];
        }
    }
    if (out->ok) {
        out->step_s[0] = median(t[0], n);
        out->step_s[1] = median(t[1], n);
        out->ratio = median(ratio, n);
        out->pairs = n;
    }
    runner_free(&r[0]);
    runner_free(&r[1]);
    sched_plan_free(&plan);
    free(t[0]);
    free(t[1]);
    free(ratio);
}

/* The planner's view of this run: the workload from the cost model with the
 * compute times of a profiled keep_all step (forward, backward, recompute =
 * forward; AdamW scaled to the measured optimizer time), links as throttled. */
typedef struct {
    sched_workload_t w;
    sched_registry_t reg;
    sched_hw_t hw;
    sched_calibration_t cal;
    bool ok;
} predictor_t;

/* `prof`: the run whose block compute times to use; `optim_s`: the measured
 * time of one whole (not overlapped) AdamW pass, to scale the model's. */
static void predictor_init(predictor_t *p, const char *ckpt, const opts_t *o, double link_bps,
                           const measure_t *prof, double optim_s) {
    memset(p, 0, sizeof *p);
    mt_error_t err = {0};
    eng_model_config_t mc;
    if (eng_model_config_load(ckpt, NULL, &mc, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return;
    }
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.sequence_len = o->seq;
    rc.micro_batch_size = o->batch;
    rc.gradient_accumulation_steps = 1;
    rc.max_grad_norm = 0;
    rc.link_gbps = link_bps / 1e9;
    rc.link_latency_us = o->link_latency_us;
    rc.compute_threads = o->compute_threads;
    sched_calibration_t *cal = &p->cal;
    sched_model_desc_t md;
    sched_run_shape_t shape;
    if (eng_calibrate(&rc, NULL, cal, &err) != MT_OK || eng_program_describe(&mc, &rc, false, &md, &shape, &err) != MT_OK ||
        sched_registry_build(&md, &shape, &p->reg, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        eng_model_config_free(&mc);
        eng_run_config_free(&rc);
        return;
    }
    sched_hw_from_calibration(cal, &p->hw);
    if (sched_workload_build(&p->reg, &p->hw, &p->w, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
    } else {
        double adam_model = 0;
        for (int b = 0; b < p->w.num_blocks; b++) adam_model += p->w.blocks[b].adam_device_s;
        const double adam_scale = adam_model > 0 ? optim_s / adam_model : 1.0;
        /* per-block means, scaled to the median step's compute (a step that
         * a neighbour's load slowed should not pull the profile up) */
        double mean = 0;
        for (int b = 0; b < p->w.num_blocks; b++) mean += prof->fwd_s[b] + prof->bwd_s[b];
        const double k = prof->compute_med_s > 0 && mean > 0 ? prof->compute_med_s / mean : 1.0;
        for (int b = 0; b < p->w.num_blocks; b++) {
            sched_block_cost_t *c = &p->w.blocks[b];
            c->fwd_s = prof->fwd_s[b] * k;
            c->bwd_s = prof->bwd_s[b] * k;
            c->recompute_s = prof->fwd_s[b] * k;
            c->adam_device_s *= adam_scale;
            c->adam_host_s = c->adam_device_s; /* the same kernel on this backend */
        }
        p->ok = true;
    }
    eng_model_config_free(&mc);
    eng_run_config_free(&rc);
}

/* The slowest link under which every layer's offload_all transfers fit in
 * `fraction` of its compute (see the top of the file). */
static double layer_bound_link(const sched_workload_t *w, const measure_t *keep, double fraction, double latency_s) {
    double need = 0;
    for (int b = 1; b + 1 < w->num_blocks; b++) {
        const sched_block_cost_t *c = &w->blocks[b];
        const double off = c->act_saved_bytes - c->act_input_bytes;
        const struct {
            double bytes, copies, compute_s;
        } moves[4] = {
            {c->w_fetch_bytes, c->w_fetch_copies, keep->fwd_s[b]},                       /* forward H2D */
            {off, c->act_copies, keep->fwd_s[b]},                                        /* forward D2H */
            {c->w_fetch_bytes + off, c->w_fetch_copies + c->act_copies, keep->bwd_s[b]}, /* backward H2D */
            {c->grad_mb_bytes, c->grad_mb_copies, keep->bwd_s[b]},                       /* backward D2H */
        };
        for (int k = 0; k < 4; k++) {
            const double room = fraction * moves[k].compute_s - moves[k].copies * latency_s;
            if (moves[k].bytes <= 0) continue;
            const double bw = room > 0 ? moves[k].bytes / room : INFINITY;
            if (bw > need) need = bw;
        }
    }
    return need;
}

static double predict(const predictor_t *p, const sched_plan_t *plan) {
    if (!p->ok) return 0;
    sched_sim_result_t r;
    mt_error_t err = {0};
    const sched_sim_opts_t so = {0};
    if (sched_simulate(&p->w, plan, &so, &r, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return 0;
    }
    const double t = r.step_time;
    sched_sim_result_free(&r);
    return t;
}

static double predict_uniform(const predictor_t *p, int nb, sched_policy_t policy) {
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, nb, policy);
    const double t = predict(p, &plan);
    sched_plan_free(&plan);
    return t;
}

static int parse(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.layers = 8, .hidden = 256, .experts = 8, .topk = 2, .expert_width = 512, .vocab = 512,
                  .heads = 8, .kv_heads = 4, .seq = 128, .batch = 4, .steps = 5, .link_gbps = 0,
                  .link_latency_us = 10, .link_fraction = 0.9, .staging_rounds = 3, .compute_threads = 0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT_OPT(name, field)                          \
    if (strcmp(a, name) == 0 && v) {                  \
        o->field = atoi(v);                           \
        i++;                                          \
        if (o->field <= 0) goto bad;                  \
        continue;                                     \
    }
#define DBL_OPT(name, field)                          \
    if (strcmp(a, name) == 0 && v) {                  \
        o->field = atof(v);                           \
        i++;                                          \
        if (o->field < 0) goto bad;                   \
        continue;                                     \
    }
        INT_OPT("--layers", layers)
        INT_OPT("--hidden", hidden)
        INT_OPT("--experts", experts)
        INT_OPT("--topk", topk)
        INT_OPT("--expert-width", expert_width)
        INT_OPT("--vocab", vocab)
        INT_OPT("--seq", seq)
        INT_OPT("--batch", batch)
        INT_OPT("--steps", steps)
        INT_OPT("--compute-threads", compute_threads)
        INT_OPT("--staging-rounds", staging_rounds)
        DBL_OPT("--link-gbps", link_gbps)
        DBL_OPT("--link-latency-us", link_latency_us)
        DBL_OPT("--link-fraction", link_fraction)
        if (strcmp(a, "--trace") == 0 && v) {
            o->trace = v;
            i++;
            continue;
        }
        if (strcmp(a, "--json") == 0) {
            o->json = true;
            continue;
        }
        if (strcmp(a, "--blocks") == 0) {
            o->blocks = true;
            continue;
        }
        if (strcmp(a, "--staging-only") == 0) {
            o->staging_only = true;
            continue;
        }
    bad:
        fprintf(stderr,
                "usage: moetune bench step [--layers N] [--hidden H] [--experts E] [--topk K]\n"
                "       [--expert-width I] [--vocab V] [--seq T] [--batch B] [--steps S]\n"
                "       [--link-gbps G | --link-fraction F] [--link-latency-us U] [--staging-rounds R]\n"
                "       [--staging-only] [--blocks] [--trace FILE] [--json]\n"
                "bad or unknown option: %s\n",
                a);
        return 2;
    }
    if (o->topk > o->experts || o->hidden % o->heads) {
        fprintf(stderr, "bench step: need topk <= experts and hidden divisible by heads\n");
        return 2;
    }
    return 0;
}

int mt_bench_step_main(int argc, char **argv) {
    opts_t o;
    int rc = parse(argc, argv, &o);
    if (rc) return rc;
    char ckpt[256];
    snprintf(ckpt, sizeof ckpt, "/tmp/moetune-bench-step-%d", (int)getpid());
    char config[1024];
    snprintf(config, sizeof config,
             "{\"model_type\": \"mixtral\", \"vocab_size\": %d, \"hidden_size\": %d, \"intermediate_size\": %d,"
             " \"num_hidden_layers\": %d, \"num_attention_heads\": %d, \"num_key_value_heads\": %d,"
             " \"num_local_experts\": %d, \"num_experts_per_tok\": %d, \"rms_norm_eps\": 1e-5,"
             " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"output_router_logits\": true}",
             o.vocab, o.hidden, o.expert_width, o.layers, o.heads, o.kv_heads, o.experts, o.topk);
    mt_error_t err = {0};
    if (eng_checkpoint_init_random(ckpt, config, 1, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return 1;
    }

    measure_t keep;
    measure(ckpt, &o, SCHED_POLICY_KEEP_ALL, 0, false, NULL, &keep);
    /* the planner's view of this run, on the profiled keep_all step */
    predictor_t pr = {0};
    double link_bps = o.link_gbps * 1e9;
    if (keep.ok) {
        predictor_init(&pr, ckpt, &o, link_bps > 0 ? link_bps : 1e9, &keep, keep.optim_s);
        if (link_bps == 0 && pr.ok)
            link_bps = layer_bound_link(&pr.w, &keep, o.link_fraction, o.link_latency_us * 1e-6);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
    }
    if (!keep.ok || !(link_bps > 0) || !isfinite(link_bps)) {
        if (keep.ok)
            fprintf(stderr,
                    "bench step: no link speed fits every layer's transfers in %.0f%% of its compute: the copies' "
                    "latency (%g us each) alone takes longer; give --link-gbps, a lower --link-latency-us or a "
                    "bigger model\n",
                    100 * o.link_fraction, o.link_latency_us);
        else
            fprintf(stderr, "bench step: keep_all failed, nothing to size the link on\n");
        measure_free(&keep);
        return 1;
    }
    if (o.staging_only) { /* just the staging comparison, on the link chosen as above */
        staging_cmp_t sc;
        if (keep.ok) measure_staging(ckpt, &o, link_bps, &sc);
        char cmd[300];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
        if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
        const bool ok = keep.ok && sc.ok;
        measure_free(&keep);
        if (pr.ok) sched_workload_free(&pr.w), sched_registry_free(&pr.reg);
        if (!ok) return 1;
        printf("staging, offload_all on a %.3f GB/s + %.0f us link (%d paired steps, modes alternating A B B A):\n",
               link_bps / 1e9, o.link_latency_us, sc.pairs);
        for (int k = 0; k < 2; k++)
            printf("  %-10s  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
                   k ? "per_tensor" : "compact", sc.step_s[k] * 1e3, (unsigned long long)sc.copies[k][0],
                   (unsigned long long)sc.copies[k][1], sc.pinned[k] / 1e6);
        printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n", sc.ratio);
        return 0;
    }
    /* auto: the planner's choice under a device budget of half keep_all's
     * peak, planned on the profiled workload */
    const int nb = o.layers + 2;
    size_t auto_budget = keep.peak_device / 2;
    sched_plan_t auto_plan = {0};
    bool have_auto = false;
    if (pr.ok) {
        sched_planner_opts_t po;
        sched_planner_opts_default(&po);
        po.policy = SCHED_POLICY_AUTO;
        po.budget[SCHED_MEM_DEVICE] = (double)auto_budget;
        sched_planner_result_t res;
        mt_error_t perr = {0};
        if (sched_plan_make(&pr.w, &po, &res, &perr) == MT_OK && res.feasible) {
            if (o.blocks && !o.json) { /* what the planner chose, block by block */
                printf("auto plan (window %d): block weights/grads/optimizer/activations:", res.plan.prefetch_window);
                for (int b = 0; b < res.plan.num_blocks; b++) {
                    const sched_block_plan_t *bp = &res.plan.blocks[b];
                    printf(" %d:%c%c%c%c", b, bp->weights == SCHED_WEIGHTS_STREAM ? 'S' : 'R',
                           bp->grads == SCHED_GRADS_HOST ? 'H' : 'D', bp->optim == SCHED_OPTIM_HOST ? 'H' : 'D',
                           "KOR"[bp->acts]);
                }
                printf("  (S stream, R resident; H host, D device; K keep, O offload, R recompute)\n");
            }
            auto_plan = res.plan; /* taken over */
            res.plan.blocks = NULL;
            have_auto = true;
        } else {
            fprintf(stderr, "bench step: auto plan under %zu bytes: %s\n", auto_budget, res.feasible ? perr.msg : res.why);
        }
        sched_planner_result_free(&res);
    }

    /* every plan side by side (see measure_side_by_side) */
    sched_plan_t p_keep, p_off, p_min;
    sched_plan_init_uniform(&p_keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&p_off, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&p_min, nb, SCHED_POLICY_MIN_MEMORY);
    const sched_plan_t *plans[] = {&p_keep, &p_off, &p_off, &p_min, &auto_plan};
    const bool overlaps[] = {false, false, true, true, true};
    measure_t ms[5];
    double pair_ratio[5] = {0};
    measure_free(&keep);
    double run_probe = 0; /* the interference probe's median during the run (busy / idle) */
    measure_side_by_side(ckpt, &o, plans, overlaps, have_auto ? 5 : 4, link_bps, 2, ms, pair_ratio, &run_probe);
    measure_t keep2 = ms[0], off = ms[1], off_overlap = ms[2], minm = ms[3], autom = have_auto ? ms[4] : (measure_t){0};
    keep = keep2;
    sched_plan_free(&p_keep);
    sched_plan_free(&p_off);
    sched_plan_free(&p_min);

    /* the predictions, on this run's keep_all profile (the planner's view) */
    if (pr.ok) {
        sched_workload_free(&pr.w);
        sched_registry_free(&pr.reg);
        pr.ok = false;
    }
    if (keep.ok) {
        predictor_init(&pr, ckpt, &o, link_bps, &keep, keep.optim_s);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
        if (pr.ok && run_probe > 0) /* the probe taken beside the run, rather than the calibration's own */
            pr.cal.compute_interference = pr.w.compute_interference = run_probe > 1 ? run_probe - 1 : 0;
    }
    /* A second view: block compute as profiled in the offload_all run, i.e.
     * under copy and host-optimizer traffic, so that the simulator's own job,
     * the overlap and the waits, is judged apart from what the traffic does
     * to compute on this backend. */
    predictor_t pr_traffic = {0};
    if (off_overlap.ok) {
        predictor_init(&pr_traffic, ckpt, &o, link_bps, &off_overlap, keep.optim_s);
        pr_traffic.w.h2d_bw = pr_traffic.w.d2h_bw = link_bps;
        pr_traffic.w.compute_interference = 0; /* already in these compute times */
    }
    const double pred_auto = have_auto ? predict(&pr, &auto_plan) : 0;
    const double pred_auto_traffic = have_auto ? predict(&pr_traffic, &auto_plan) : 0;
    if (have_auto) sched_plan_free(&auto_plan);
    staging_cmp_t sc;
    measure_staging(ckpt, &o, link_bps, &sc);
    const double staging_ratio = sc.ok ? sc.ratio : 0;
    const double pred_keep = predict_uniform(&pr, nb, SCHED_POLICY_KEEP_ALL);
    const double pred_off = predict_uniform(&pr, nb, SCHED_POLICY_OFFLOAD_ALL);
    const double pred_min = predict_uniform(&pr, nb, SCHED_POLICY_MIN_MEMORY);
    const double pred_off_traffic = predict_uniform(&pr_traffic, nb, SCHED_POLICY_OFFLOAD_ALL);
    const double pred_min_traffic = predict_uniform(&pr_traffic, nb, SCHED_POLICY_MIN_MEMORY);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", ckpt);
    if (system(cmd) != 0) fprintf(stderr, "bench step: could not remove %s\n", ckpt);
    if (!keep.ok || !off.ok || !off_overlap.ok || !minm.ok || !sc.ok) return 1;
    if (pr.ok) {
        sched_workload_free(&pr.w);
        sched_registry_free(&pr.reg);
    }
    if (pr_traffic.ok) {
        sched_workload_free(&pr_traffic.w);
        sched_registry_free(&pr_traffic.reg);
    }

    const double ratio = pair_ratio[2]; /* offload_all (overlapped) over keep_all, paired */
    const double share_off = off.optim_s / off.median_s, share_on = off_overlap.optim_s / off_overlap.median_s;
    if (o.json) {
        printf("{\"link_bytes_per_s\": %.6g, \"link_latency_us\": %g, \"h2d_bytes_per_step\": %llu,"
               " \"d2h_bytes_per_step\": %llu,"
               " \"keep_all_step_s\": %.6g, \"offload_all_step_s\": %.6g, \"offload_all_no_overlap_step_s\": %.6g,"
               " \"min_memory_step_s\": %.6g, \"offload_over_keep\": %.4f,"
               " \"optimizer_share_no_overlap\": %.4f, \"optimizer_share_overlap\": %.4f,"
               " \"peak_device_keep_all\": %zu, \"peak_device_offload_all\": %zu, \"peak_device_min_memory\": %zu,"
               " \"predicted_keep_all_s\": %.6g, \"predicted_offload_all_s\": %.6g, \"predicted_min_memory_s\": %.6g,"
               " \"predicted_under_traffic\": {\"offload_all_s\": %.6g, \"min_memory_s\": %.6g, \"auto_s\": %.6g},"
               " \"compute_s\": {\"keep_all\": %.6g, \"offload_all\": %.6g, \"min_memory\": %.6g, \"auto\": %.6g},"
               " \"offload_over_keep_at_keep_compute\": %.4f, \"compute_interference_probe\": %.4f,"
               " \"auto_budget_bytes\": %zu, \"auto_step_s\": %.6g, \"predicted_auto_s\": %.6g, \"peak_device_auto\": %zu,"
               " \"staging_compact_step_s\": %.6g, \"staging_per_tensor_step_s\": %.6g,"
               " \"staging_compact_vs_per_tensor_throughput\": %.4f, \"staging_pairs\": %d,"
               " \"staging_copies_per_step\": {\"compact\": [%llu, %llu], \"per_tensor\": [%llu, %llu]},"
               " \"staging_pinned_peak\": {\"compact\": %zu, \"per_tensor\": %zu}}\n",
               link_bps, o.link_latency_us, (unsigned long long)off.h2d_bytes, (unsigned long long)off.d2h_bytes,
               keep.median_s, off_overlap.median_s, off.median_s, minm.median_s, ratio, share_off, share_on,
               keep.peak_device, off_overlap.peak_device, minm.peak_device, pred_keep, pred_off, pred_min,
               pred_off_traffic, pred_min_traffic, pred_auto_traffic, compute_s(&keep, nb), compute_s(&off_overlap, nb),
               compute_s(&minm, nb), compute_s(&autom, nb),
               (compute_s(&keep, nb) + off_overlap.median_s - compute_s(&off_overlap, nb)) / keep.median_s,
               pr.ok ? 1 + pr.cal.compute_interference : 0, auto_budget,
               autom.median_s, pred_auto, autom.peak_device, sc.step_s[0], sc.step_s[1], staging_ratio, sc.pairs,
               (unsigned long long)sc.copies[0][0], (unsigned long long)sc.copies[0][1],
               (unsigned long long)sc.copies[1][0], (unsigned long long)sc.copies[1][1], sc.pinned[0], sc.pinned[1]);
        measure_free(&keep), measure_free(&off), measure_free(&off_overlap), measure_free(&minm), measure_free(&autom);
        return 0;
    }
    printf("synthetic mixtral: %d layers, hidden %d, %d experts (top-%d) of width %d, vocab %d; batch %d x %d tokens\n",
           o.layers, o.hidden, o.experts, o.topk, o.expert_width, o.vocab, o.batch, o.seq);
    printf("link: %.3f GB/s each way, %.0f us per copy (%s); offload_all moves %.1f MB H2D and %.1f MB D2H per step\n",
           link_bps / 1e9, o.link_latency_us, o.link_gbps > 0 ? "given" : "sized so each layer's transfers take <= --link-fraction of its compute",
           off.h2d_bytes / 1e6, off.d2h_bytes / 1e6);
    /* compute: the blocks' own forward and backward time, mean per step; its
     * growth over keep_all is what the copies cost the compute stream */
    printf("%-34s %12s %14s %14s %16s\n", "plan", "step (ms)", "compute (ms)", "optimizer (ms)", "peak device (MB)");
    const struct {
        const char *name;
        const measure_t *m;
    } rows[] = {{"keep_all", &keep},
                {"offload_all, optimizer after bwd", &off},
                {"offload_all, optimizer overlapped", &off_overlap},
                {"min_memory, optimizer overlapped", &minm},
                {"auto (device budget keep_all/2)", &autom}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        if (rows[i].m->ok)
            printf("%-34s %12.2f %14.2f %14.2f %16.2f\n", rows[i].name, rows[i].m->median_s * 1e3,
                   compute_s(rows[i].m, nb) * 1e3, rows[i].m->optim_s * 1e3, rows[i].m->peak_device / 1e6);
    if (o.blocks) { /* where the compute time goes, block by block */
        printf("\nblock compute (ms, mean per step), forward / backward:\n%-8s", "block");
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
            if (rows[i].m->ok) printf(" %20.20s", rows[i].name);
        printf("\n");
        for (int b = 0; b < nb; b++) {
            printf("%-8d", b);
            for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
                if (rows[i].m->ok) printf("      %6.2f / %6.2f", rows[i].m->fwd_s[b] * 1e3, rows[i].m->bwd_s[b] * 1e3);
            printf("\n");
        }
        printf("\n");
    }
    printf("offload_all / keep_all step time: %.3f\n", ratio);
    /* The step splits into block compute and the rest (waits for copies,
     * the optimizer's share, bookkeeping).  On this backend the copies and
     * host AdamW run on cores that may share a physical core or the memory
     * system with compute, which stretches compute itself; the second ratio
     * is the step offload_all would take if its compute ran at keep_all's
     * speed, i.e. what the schedule alone adds. */
    const double keep_c = compute_s(&keep, nb), off_c = compute_s(&off_overlap, nb);
    printf("  block compute: keep_all %.2f ms, offload_all %.2f ms (x%.3f under copy and host-optimizer traffic)\n",
           keep_c * 1e3, off_c * 1e3, off_c / keep_c);
    printf("  the rest of the step: keep_all %.2f ms, offload_all %.2f ms\n", (keep.median_s - keep_c) * 1e3,
           (off_overlap.median_s - off_c) * 1e3);
    printf("  offload_all / keep_all with offload_all's compute at keep_all's speed: %.3f\n",
           (keep_c + off_overlap.median_s - off_c) / keep.median_s);
    const double probe = pr.ok && pr.cal.compute_interference > 0 ? 1 + pr.cal.compute_interference : 0;
    if (probe > 0)
        printf("  probe: a 512^3 product on the compute core takes x%.3f as long while one memcpy loop runs on the\n"
               "  host core (median of pairs taken between the rounds; this machine's cores share more than a GPU\n"
               "  and its copy engines do)\n",
               probe);
    printf("\npredicted (simulator on the profiled keep_all step and the calibrated interference) vs measured median"
           " step time:\n");
    printf("  keep_all     %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_keep * 1e3, keep.median_s * 1e3, pred_keep / keep.median_s);
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_off * 1e3, off_overlap.median_s * 1e3,
           pred_off / off_overlap.median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_min * 1e3, minm.median_s * 1e3, pred_min / minm.median_s);
    if (autom.ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f  (budget %.1f MB, peak %.1f MB)\n", pred_auto * 1e3,
               autom.median_s * 1e3, pred_auto / autom.median_s, auto_budget / 1e6, autom.peak_device / 1e6);
    printf("\npredicted with block compute profiled under copy traffic (the offload_all run) vs measured:\n");
    printf("  offload_all  %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_off_traffic * 1e3, off_overlap.median_s * 1e3,
           pred_off_traffic / off_overlap.median_s);
    printf("  min_memory   %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_min_traffic * 1e3, minm.median_s * 1e3,
           pred_min_traffic / minm.median_s);
    if (autom.ok)
        printf("  auto         %8.2f ms vs %8.2f ms  ratio %.3f\n", pred_auto_traffic * 1e3, autom.median_s * 1e3,
               pred_auto_traffic / autom.median_s);
    printf("host optimizer share of the step (offload_all): %.1f%% after backward -> %.1f%% overlapped\n",
           100 * share_off, 100 * share_on);
    printf("\nstaging (offload_all, overlapped; %d paired steps, modes alternating A B B A; medians):\n", sc.pairs);
    printf("  compact     %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc.step_s[0] * 1e3, (unsigned long long)sc.copies[0][0], (unsigned long long)sc.copies[0][1],
           sc.pinned[0] / 1e6);
    printf("  per_tensor  %8.2f ms per step, %llu H2D + %llu D2H copies per step, pinned peak %.2f MB\n",
           sc.step_s[1] * 1e3, (unsigned long long)sc.copies[1][0], (unsigned long long)sc.copies[1][1],
           sc.pinned[1] / 1e6);
    printf("  compact throughput / per_tensor: %.3f (median of the pairs' ratios; goal >= 0.95)\n", staging_ratio);
    measure_free(&keep), measure_free(&off), measure_free(&off_overlap), measure_free(&minm), measure_free(&autom);
    return 0;
}
