/* Taking the measurements of `moetune bench step` (see step_bench.c):
 * runners, plans side by side, and the staging modes' paired comparison. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/run/calibrate.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim_state.h"
#include "engine/run/report.h"
#include "engine/exec/record/trace.h"
#include "tools/bench/step_bench_internal.h"
#include "base/clock.h"

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double step_median(double *v, int n) {
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

bool runner_init(runner_t *r, const char *ckpt, const opts_t *o, const sched_plan_t *plan, double link_bps,
                 moe_staging_mode_t mode, mt_dtype_t compute, int rows) {
    mt_error_t err = {0};
    const kern_device_opts_t dopts = {.link_h2d_bytes_per_s = link_bps, .link_d2h_bytes_per_s = link_bps,
                                      .link_latency_s = o->link_latency_us * 1e-6,
                                      .host_threads = o->compute_threads, .pin_threads = o->compute_threads > 0};
    const kern_device_opts_t real_link = {0}; /* cuda: the GPU's own link, its memory as the backend sizes it */
    eng_staging_settings_t ss;
    eng_staging_settings_init(&ss);
    ss.mode = mode;
    ss.tokens = o->batch * o->seq;
    eng_run_config_t rc; /* what the run reads of it; the run keeps its own copy */
    eng_run_config_defaults(&rc);
    snprintf(rc.base_model, sizeof rc.base_model, "%s", ckpt);
    rc.micro_batch_size = o->batch;
    rc.shuffle = false;
    rc.seed = 0;
    rc.bf16 = compute == MT_BF16 ? ENG_BF16_ON : ENG_BF16_OFF;
    rc.backend = o->cuda ? ENG_BACKEND_CUDA : ENG_BACKEND_CPU;
    for (int b = 0; o->nvme_dir && b < plan->num_blocks; b++) /* the plan's NVMe blocks: the tier in --nvme's DIR */
        if (sched_block_nvme_optim(&plan->blocks[b]))
            snprintf(rc.memory_nvme_path, sizeof rc.memory_nvme_path, "%s", o->nvme_dir);
    eng_dataset_t ds;
    make_dataset(&ds, o, rows); /* the run's from here on */
    const eng_run_opts_t ro = {
        .device = o->cuda ? &real_link : &dopts, .backend = o->cuda ? KERN_BACKEND_CUDA : KERN_BACKEND_CPU, .plan = plan, .staging = &ss, .dataset = &ds};
    const mt_status_t st = eng_run_open(r, &rc, &ro, &err);
    eng_run_config_free(&rc);
    if (st == MT_OK) return true;
    if (r->dev)
        fprintf(stderr, "bench step (%s, %s): %s\n", sched_policy_name(plan->policy), moe_staging_mode_name(mode),
                err.msg);
    else
        fprintf(stderr, "bench step: %s\n", err.msg);
    eng_run_close(r, st, &err);
    return false;
}

bool runner_step(runner_t *r, step_mode_t mode, int accum, double *dt, eng_optim_stats_t *os) {
    /* a norm far below 1e30 never clips; one far above 1e-30 always does */
    const double max_norm = mode == STEP_CLIP_SPEC_REDO ? 1e-30 : mode >= STEP_CLIP_WAIT ? 1e30 : 0.0;
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = max_norm,
                                    .speculative = mode == STEP_CLIP_SPEC_KEPT || mode == STEP_CLIP_SPEC_REDO};
    mt_error_t err = {0};
    const double t0 = mt_now_s();
    const int k = accum > 1 ? accum : 1;
    eng_optim_begin_step(r->x, &hp, k, mode != STEP_AFTER_BACKWARD);
    eng_micro_stats_t ms[k];
    if (eng_exec_step_from_loader(r->x, &r->ld, k, ENG_STEP_ORDER_AUTO, ms, &err) != MT_OK ||
        eng_optim_step(r->x, &hp, os, &err) != MT_OK) {
        fprintf(stderr, "bench step (%s): %s\n", sched_policy_name(eng_exec_plan(r->x)->policy), err.msg);
        return false;
    }
    *dt = mt_now_s() - t0;
    return true;
}

void runner_free(runner_t *r) {
    mt_error_t err = {0};
    eng_run_close(r, MT_OK, &err);
}

void measure_side_by_side(const char *ckpt, const opts_t *o, const sched_plan_t *const *plans, const step_mode_t *mode,
                          int n, double link_bps, int trace_idx, measure_t *out, double *ratio, double *probe_out) {
    measure_side_by_side_ex(ckpt, o, plans, mode, NULL, n, link_bps, trace_idx, out, ratio, probe_out);
}

void measure_side_by_side_ex(const char *ckpt, const opts_t *o, const sched_plan_t *const *plans,
                             const step_mode_t *mode, const mt_dtype_t *compute, int n, double link_bps, int trace_idx,
                             measure_t *out, double *ratio, double *probe_out) {
    const int nb = o->layers + 2;
    typedef struct {
        runner_t run;
        eng_trace_t *trace;
        double *t, *opt, *comp; /* per step: wall, optimizer, block compute */
        double *fwd, *bwd;      /* per block: summed over steps */
    } plan_run_t;
    plan_run_t *r = calloc((size_t)n, sizeof *r);
    double *rr = malloc((size_t)o->steps * sizeof *rr);
    MT_CHECK(r && rr, "out of memory");
    mt_error_t err = {0};
    bool ok = true;
    for (int i = 0; i < n && ok; i++) {
        memset(&out[i], 0, sizeof out[i]);
        ok = runner_init(&r[i].run, ckpt, o, plans[i], link_bps, MOE_STAGING_COMPACT, compute ? compute[i] : MT_F32,
                         o->batch * (o->steps + 1) * (o->accum > 1 ? o->accum : 1));
        if (!ok) break;
        r[i].t = malloc((size_t)o->steps * sizeof(double));
        r[i].opt = malloc((size_t)o->steps * sizeof(double));
        r[i].comp = malloc((size_t)o->steps * sizeof(double));
        r[i].fwd = calloc((size_t)nb, sizeof(double));
        r[i].bwd = calloc((size_t)nb, sizeof(double));
        MT_CHECK(r[i].t && r[i].opt && r[i].comp && r[i].fwd && r[i].bwd, "out of memory");
        if (i == trace_idx && o->trace && eng_trace_open(o->trace, &r[i].trace, &err) == MT_OK)
            eng_exec_set_trace(r[i].run.x, r[i].trace);
    }
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
            plan_run_t *q = &r[i];
            const kern_device_stats_t before = kern_device_stats(q->run.dev);
            const eng_nvme_io_t io0 = eng_exec_nvme_io(q->run.x);
            double dt;
            eng_optim_stats_t os;
            if (!(ok = runner_step(&q->run, mode[i], o->accum, &dt, &os))) break;
            if (step < 0) {
                eng_exec_block_times(q->run.x, NULL, NULL, true); /* drop the warm-up */
                continue;
            }
            const kern_device_stats_t after = kern_device_stats(q->run.dev);
            q->t[step] = dt;
            q->opt[step] = os.optim_wall_s;
            double f[nb], g[nb], c = 0;
            eng_exec_block_times(q->run.x, f, g, true);
            for (int b = 0; b < nb; b++) c += f[b] + g[b], q->fwd[b] += f[b], q->bwd[b] += g[b];
            q->comp[step] = c;
            out[i].h2d_bytes = after.h2d_bytes - before.h2d_bytes;
            out[i].d2h_bytes = after.d2h_bytes - before.d2h_bytes;
            out[i].overlapped = os.updated_during_backward;
            const eng_nvme_io_t io1 = eng_exec_nvme_io(q->run.x); /* summed here, per step below */
            out[i].nvme.read_bytes += io1.read_bytes - io0.read_bytes;
            out[i].nvme.write_bytes += io1.write_bytes - io0.write_bytes;
            out[i].nvme.read_s += io1.read_s - io0.read_s;
            out[i].nvme.write_s += io1.write_s - io0.write_s;
            out[i].nvme.loads += io1.loads - io0.loads;
            out[i].nvme.loads_read_ahead += io1.loads_read_ahead - io0.loads_read_ahead;
            out[i].redone += os.speculation_undone;
        }
    }
    eng_interference_probe_close(probe);
    *probe_out = nprobe > 0 ? step_median(probe_r, nprobe) : 0;
    free(probe_r);
    for (int i = 0; i < n && ok; i++) { /* before the medians: they sort */
        for (int k = 0; k < o->steps; k++) rr[k] = r[i].t[k] / r[0].t[k];
        ratio[i] = step_median(rr, o->steps);
    }
    for (int i = 0; i < n; i++) {
        if (ok) {
            out[i].ok = true;
            out[i].fwd_s = calloc((size_t)nb, sizeof *out[i].fwd_s);
            out[i].bwd_s = calloc((size_t)nb, sizeof *out[i].bwd_s);
            MT_CHECK(out[i].fwd_s && out[i].bwd_s, "out of memory");
            for (int b = 0; b < nb; b++) out[i].fwd_s[b] = r[i].fwd[b] / o->steps, out[i].bwd_s[b] = r[i].bwd[b] / o->steps;
            out[i].compute_med_s = step_median(r[i].comp, o->steps);
            out[i].peak_device = kern_device_stats(r[i].run.dev).device_peak;
            out[i].median_s = step_median(r[i].t, o->steps);
            out[i].optim_s = step_median(r[i].opt, o->steps);
            out[i].nvme.read_bytes /= (uint64_t)o->steps;
            out[i].nvme.write_bytes /= (uint64_t)o->steps;
            out[i].nvme.read_s /= o->steps;
            out[i].nvme.write_s /= o->steps;
        }
        if (r[i].trace) {
            eng_exec_set_trace(r[i].run.x, NULL);
            if (eng_trace_close(r[i].trace, &err) != MT_OK) fprintf(stderr, "bench step: %s\n", err.msg);
            else fprintf(stderr, "bench step: trace of %s written to %s\n", sched_policy_name(plans[i]->policy), o->trace);
        }
        free(r[i].t);
        free(r[i].opt);
        free(r[i].comp);
        free(r[i].fwd);
        free(r[i].bwd);
        runner_free(&r[i].run);
    }
    free(r);
    free(rr);
}

/* Seconds of block compute in one step (forward + backward, all blocks). */
double compute_s(const measure_t *m, int nb) {
    if (m->compute_med_s > 0) return m->compute_med_s;
    double t = 0;
    for (int b = 0; m->fwd_s && b < nb; b++) t += m->fwd_s[b] + m->bwd_s[b];
    return t;
}

void measure_free(measure_t *m) {
    free(m->fwd_s);
    free(m->bwd_s);
}

/* offload_all (overlapped) with the compact pool and with per_tensor
 * staging, as a paired comparison: one model per mode (each on its own
 * device), steps alternating A B B A, the ratio taken per pair of
 * neighbouring steps. */
void measure_staging(const char *ckpt, const opts_t *o, double link_bps, staging_cmp_t *out) {
    memset(out, 0, sizeof *out);
    const int n = o->staging_rounds * o->steps; /* timed steps per mode */
    double *t[2] = {malloc((size_t)n * sizeof(double)), malloc((size_t)n * sizeof(double))};
    double *ratio = malloc((size_t)n * sizeof(double));
    MT_CHECK(t[0] && t[1] && ratio, "out of memory");
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, o->layers + 2, SCHED_POLICY_OFFLOAD_ALL);
    runner_t r[2] = {0};
    out->ok = runner_init(&r[0], ckpt, o, &plan, link_bps, MOE_STAGING_COMPACT, MT_F32, o->batch * (n + 1)) &&
              runner_init(&r[1], ckpt, o, &plan, link_bps, MOE_STAGING_PER_TENSOR, MT_F32, o->batch * (n + 1));
    for (int i = -1; i < n && out->ok; i++) { /* step -1 warms both up */
        double dt[2];
        for (int k = 0; k < 2 && out->ok; k++) {
            const int mode = (i & 1) ? 1 - k : k; /* A B, B A, ... */
            moe_staging_stats_t st;
            eng_optim_stats_t os;
            out->ok = runner_step(&r[mode], STEP_OVERLAP, 1, &dt[mode], &os);
            if (out->ok) moe_staging_get_stats(eng_exec_staging(r[mode].x), MOE_STAGING_SCOPE_STEP, &st);
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
        out->step_s[0] = step_median(t[0], n);
        out->step_s[1] = step_median(t[1], n);
        out->ratio = step_median(ratio, n);
        out->pairs = n;
    }
    runner_free(&r[0]);
    runner_free(&r[1]);
    sched_plan_free(&plan);
    free(t[0]);
    free(t[1]);
    free(ratio);
}

