/* Shared by the parts of `moetune bench step` (see step_bench.c): the
 * options, one plan's measurements, and the functions that take them
 * (step_measure.c), predict them (step_predict.c) and write the full
 * comparison (step_report.c). */
#ifndef MT_TOOLS_BENCH_STEP_BENCH_INTERNAL_H
#define MT_TOOLS_BENCH_STEP_BENCH_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/data/data.h"
#include "engine/run/session.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "engine/optim/nvme_state.h"
#include "moe/staging.h"
#include "scheduler/costmodel.h"
#include "scheduler/hw.h"
#include "scheduler/plan.h"
#include "scheduler/registry.h"

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
    bool precision; /* fp32 against bf16 mixed precision, keep_all and offload_all side by side */
    bool speculative; /* the speculative host optimizer against waiting for the norm (speculative.c) */
    const char *nvme_dir; /* --nvme DIR: host AdamW state on an NVMe tier there against host memory (step_nvme.c) */
    bool step_order; /* layer-major against micro-batch-major order, `accum` micro-batches per step (step_order.c) */
    int accum;       /* micro-batches per step for the step-order comparison and its prediction (0: 1) */
    const char *trace; /* write the overlapped offload_all run's trace.json here (MFU report: each plan's) */
    /* the MFU report (step_mfu.c): on --backend cuda, with --mfu or a --geometry */
    bool mfu;
    bool cuda;            /* --backend cuda: the real GPU and its link, no throttling */
    const char *geometry; /* a preset's name (NULL: the options' own dims) */
    const char *model_type; /* "mixtral" or "qwen3_moe" */
    int head_dim;         /* 0: hidden / heads */
    const char *hw;       /* --hw: the device profile for the peak and the predictions on cuda */
    int bf16;             /* compute in bf16: 1, fp32: 0, -1: the default (bf16 on cuda, fp32 on cpu) */
    double budget_gib;    /* > 0: also the planner's own plan under this device budget */
    bool keep_all_only;   /* --keep-all-only: measure keep_all alone (and the --budget-gib plan) */
} opts_t;

typedef struct {
    double median_s, optim_s; /* median step time; median optimizer wall time */
    double *fwd_s, *bwd_s;    /* per-block compute seconds, mean per step (profiled) */
    double compute_med_s;     /* median over steps of the step's block compute (0: not measured) */
    size_t peak_device;
    uint64_t h2d_bytes, d2h_bytes; /* per step */
    int overlapped;
    int redone; /* steps whose speculative host AdamW was undone and redone */
    eng_nvme_io_t nvme; /* the NVMe tier's traffic over the measured steps, per step (zeros without one) */
    bool ok;
} measure_t;

/* Median of v[0..n) (sorts v). */
double step_median(double *v, int n);

/* One model on its own CPU device (link throttled, compute pinned as the
 * options say), with synthetic data of `rows` rows: a run set up from
 * these parts (engine/run/session.h); its dev, x, ds and ld as before. */
typedef eng_run_t runner_t;

bool runner_init(runner_t *r, const char *ckpt, const opts_t *o, const sched_plan_t *plan, double link_bps,
                 moe_staging_mode_t mode, mt_dtype_t compute, int rows);
/* How a measured run takes its optimizer step. */
typedef enum {
    STEP_AFTER_BACKWARD, /* no clipping; host AdamW after the backward */
    STEP_OVERLAP,        /* no clipping; host AdamW overlapped with the backward */
    STEP_CLIP_WAIT,      /* clipping on (it never fires): host AdamW waits for the norm */
    STEP_CLIP_SPEC_KEPT, /* the same, speculative: every speculative update stands */
    STEP_CLIP_SPEC_REDO, /* clipping that always fires, speculative: every update is undone and redone */
} step_mode_t;

/* One optimizer step of `accum` micro-batches (1 or less: one), as `mode`
 * says, in the plan's step order; its wall time and the optimizer's stats. */
bool runner_step(runner_t *r, step_mode_t mode, int accum, double *dt, eng_optim_stats_t *os);
void runner_free(runner_t *r);

/* Plans side by side: one runner per plan, one step of each in turn (the
 * order rotating every round), so that load from other processes and a
 * shared host's steal time, which come and go, weigh on every plan alike;
 * medians over the rounds.  ratio[i]: the median over rounds of plan i's
 * step over plan 0's in the same round.  trace_idx: the plan whose run
 * writes o->trace (-1: none).  *probe_out: the median of the interference
 * probe's pairs taken between the rounds (0: not measured). */
void measure_side_by_side(const char *ckpt, const opts_t *o, const sched_plan_t *const *plans, const step_mode_t *mode,
                          int n, double link_bps, int trace_idx, measure_t *out, double *ratio, double *probe_out);
/* The same with each plan's compute dtype (compute[i]: MT_F32 or MT_BF16). */
void measure_side_by_side_ex(const char *ckpt, const opts_t *o, const sched_plan_t *const *plans,
                             const step_mode_t *mode, const mt_dtype_t *compute, int n, double link_bps, int trace_idx,
                             measure_t *out, double *ratio, double *probe_out);
double compute_s(const measure_t *m, int nb);
/* --speculative: the speculative host optimizer against waiting for the norm (step_speculative.c). */
int speculative_report(const char *ckpt, const opts_t *o, double link_bps);
/* --nvme DIR: offload_all with every block's host AdamW state on an NVMe
 * tier in DIR against host memory, and in bf16 with the decoder layers'
 * weights' homes there too (step_nvme.c). */
int nvme_report(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep);
void measure_free(measure_t *m);

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

void measure_staging(const char *ckpt, const opts_t *o, double link_bps, staging_cmp_t *out);

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
 * time of one whole (not overlapped) AdamW pass, to scale the model's;
 * bf16: the run computes in bf16 (its working copies, what crosses the
 * link), as prof must have. */
void predictor_init(predictor_t *p, const char *ckpt, const opts_t *o, double link_bps, const measure_t *prof,
                    double optim_s, bool bf16);
void predictor_free(predictor_t *p);
/* The slowest link under which every layer's offload_all transfers fit in
 * `fraction` of its compute (see step_bench.c). */
double layer_bound_link(const sched_workload_t *w, const measure_t *keep, double fraction, double latency_s);
/* Simulated step time of a plan (0 on error or without a workload). */
double predict(const predictor_t *p, const sched_plan_t *plan);
double predict_uniform(const predictor_t *p, int nb, sched_policy_t policy);

/* The full comparison's numbers (every plan side by side, the
 * predictions, the staging pool), as step_bench.c gathers them and
 * step_report.c writes them. */
typedef struct {
    int nb;                /* blocks: layers, the embedding and the head */
    double link_bps;
    /* keep_all; offload_all with the optimizer after the backward and
     * overlapped; min_memory; auto (ok false: no auto plan) */
    measure_t keep, off, off_overlap, minm, autom;
    double pair_ratio[5];  /* each plan's step over keep_all's, paired (see measure_side_by_side) */
    double run_probe;      /* the interference probe's median during the run (busy / idle; 0: none) */
    size_t auto_budget;    /* auto's device budget: half keep_all's peak */
    /* simulated step times on keep_all's profile, and on offload_all's (under copy traffic) */
    double pred_keep, pred_off, pred_min, pred_auto;
    double pred_off_traffic, pred_min_traffic, pred_auto_traffic;
    double probe;          /* 1 + the compute interference the predictions used (0: none) */
    staging_cmp_t sc;
} step_report_t;

void step_report_json(const opts_t *o, const step_report_t *r);
void step_report_text(const opts_t *o, const step_report_t *r);

/* Layer-major against micro-batch-major order under offload_all, o->accum
 * micro-batches per step, paired, with each order's link bytes and the
 * simulator's predictions on keep's profile (step_order.c). */
int step_order_report(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep);

/* The MFU report (step_mfu.c): the preset geometries, and per plan the
 * step time, tokens/s, model FLOPs, achieved TFLOP/s, the fraction of the
 * device's peak and the simulator's prediction. */
int mfu_apply_geometry(opts_t *o, const char *name);
/* One MFU option at argv's a (v: the next argument or NULL): the arguments
 * it used (0: not one of them), -1 when its value is bad. */
int mfu_parse_opt(opts_t *o, const char *a, const char *v);
int mfu_report(const char *ckpt, const opts_t *o);

#endif
