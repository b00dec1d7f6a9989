/* `moetune bench step --mfu` (implied by --backend cuda): per plan, the
 * median step time, tokens/s, the model FLOPs per token counted from the
 * model's description (sched_registry_model_flops_per_token: three times
 * the forward products, attention's causal score/value products included,
 * recomputation not counted), the achieved TFLOP/s, the fraction of the
 * peak (MFU) and the simulator's predicted step time for the same plan.
 *
 * Plans run one after another, each on its own fresh run (a GPU holds one
 * keep_all model of the preset geometries, not two).  On cuda the peak and
 * the predictions come from the device profile (--hw, configs/hw/NAME.yaml;
 * its datasheet bf16 peak is the denominator whatever the compute dtype,
 * as MFU is usually quoted), or with --hw calibrate from measuring the GPU
 * and its host before the runs (eng_calibrate_device at the geometry's
 * attention shape: the measured bf16 GEMM rate is then the peak); on cpu
 * from this machine's calibration (the
 * measured GEMM rate of the compute dtype, and the keep_all run's profiled
 * block times, as the full comparison predicts). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/model/desc/program.h"
#include "engine/run/calibrate.h"
#include "kernels/device.h"
#include "scheduler/planner.h"
#include "scheduler/simulate.h"
#include "tools/bench/step_bench_internal.h"
#include "tools/build_info.h"

int mfu_apply_geometry(opts_t *o, const char *name) {
    if (strcmp(name, "qwen3-30b-a3b") == 0) {
        /* Qwen3-30B-A3B's layer: head_dim 128 is not hidden / heads (64) */
        o->model_type = "qwen3_moe", o->layers = 4, o->hidden = 2048, o->experts = 128, o->topk = 8;
        o->expert_width = 768, o->heads = 32, o->kv_heads = 4, o->head_dim = 128;
    } else if (strcmp(name, "mixtral-8x7b") == 0) {
        o->model_type = "mixtral", o->layers = 2, o->hidden = 4096, o->experts = 8, o->topk = 2;
        o->expert_width = 14336, o->heads = 32, o->kv_heads = 8, o->head_dim = 0;
    } else {
        fprintf(stderr, "bench step: unknown --geometry '%s' (expected qwen3-30b-a3b or mixtral-8x7b)\n", name);
        return 2;
    }
    /* the real vocabularies (151936, 32000) would make lm_head a large part
     * of a few-layer model's FLOPs and memory: a smaller one keeps the
     * measurement about the layers */
    o->geometry = name, o->seq = 4096, o->batch = 1, o->vocab = 32768, o->mfu = true;
    return 0;
}

int mfu_parse_opt(opts_t *o, const char *a, const char *v) {
    if (strcmp(a, "--mfu") == 0) return o->mfu = true, 1;
    if (strcmp(a, "--keep-all-only") == 0) return o->keep_all_only = true, 1;
    if (!v) return 0;
    if (strcmp(a, "--backend") == 0) {
        if (strcmp(v, "cpu") && strcmp(v, "cuda")) return -1;
        o->cuda = strcmp(v, "cuda") == 0;
        return 2;
    }
    if (strcmp(a, "--geometry") == 0) return 2; /* applied before the other options */
    if (strcmp(a, "--hw") == 0) return o->hw = v, 2;
    if (strcmp(a, "--precision-dtype") == 0) {
        if (strcmp(v, "fp32") && strcmp(v, "bf16")) return -1;
        o->bf16 = strcmp(v, "bf16") == 0;
        return 2;
    }
    if (strcmp(a, "--head-dim") == 0) return (o->head_dim = atoi(v)) > 0 ? 2 : -1;
    if (strcmp(a, "--budget-gib") == 0) return (o->budget_gib = atof(v)) > 0 ? 2 : -1;
    return 0;
}

/* The registry and, on cuda, the workload on the device profile.  False
 * with a message. */
/* --hw calibrate on cuda: the GPU the runs will use (device 0, its whole
 * memory) and its host, measured at the geometry's attention shape; the
 * device is gone again before the runs make theirs. */
static mt_status_t calibrate_gpu(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16, sched_hw_t *hw,
                                 mt_error_t *err) {
    kern_device_opts_t dopts = {.device_index = 0};
    kern_device_t *dev = NULL;
    mt_status_t st = kern_device_create(KERN_BACKEND_CUDA, &dopts, &dev, err);
    if (st != MT_OK) return mt_error_prefix(err, "--hw calibrate: ");
    eng_calibrate_attn_t attn;
    eng_calibrate_attn_of(mc, rc, bf16, &attn);
    sched_calibration_t cal;
    st = eng_calibrate_device(dev, rc, &attn, &cal, err);
    kern_device_destroy(dev);
    if (st == MT_OK) sched_hw_from_calibration(&cal, hw);
    return st;
}

static bool predictor_from_profile(predictor_t *p, const char *ckpt, const opts_t *o) {
    memset(p, 0, sizeof *p);
    mt_error_t err = {0};
    char path[1024];
    eng_model_config_t mc;
    if (sched_hw_resolve(o->hw, NULL, path, sizeof path, &err) != MT_OK ||
        (strcmp(path, "calibrate") != 0 && sched_hw_load(path, &p->hw, &err) != MT_OK) ||
        eng_model_config_load(ckpt, NULL, &mc, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return false;
    }
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.sequence_len = o->seq;
    rc.micro_batch_size = o->batch;
    rc.gradient_accumulation_steps = o->accum > 1 ? o->accum : 1;
    rc.max_grad_norm = 0;
    rc.bf16 = o->bf16 ? ENG_BF16_ON : ENG_BF16_OFF;
    if (strcmp(path, "calibrate") == 0 && calibrate_gpu(&mc, &rc, o->bf16 == 1, &p->hw, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        eng_model_config_free(&mc);
        eng_run_config_free(&rc);
        return false;
    }
    sched_program_t prog = {0};
    sched_run_shape_t shape;
    mt_status_t st = eng_program_describe(&mc, &rc, o->bf16 == 1, &prog, &shape, &err);
    if (st == MT_OK) st = sched_registry_build(&prog, &shape, &p->reg, &err);
    sched_program_free(&prog);
    if (st == MT_OK && sched_workload_build(&p->reg, &p->hw, &p->w, &err) != MT_OK) {
        sched_registry_free(&p->reg);
        st = MT_ERR_CONFIG;
    }
    if (st != MT_OK) fprintf(stderr, "bench step: %s\n", err.msg);
    eng_model_config_free(&mc);
    eng_run_config_free(&rc);
    return p->ok = st == MT_OK;
}

/* The planner's own plan under --budget-gib on the predictor's workload. */
static bool budget_plan(const predictor_t *p, const opts_t *o, sched_plan_t *out) {
    sched_planner_opts_t po;
    sched_planner_opts_default(&po);
    po.policy = SCHED_POLICY_AUTO;
    po.budget[SCHED_MEM_DEVICE] = o->budget_gib * 1073741824.0;
    sched_planner_result_t res;
    mt_error_t err = {0};
    bool have = false;
    if (sched_plan_make(&p->w, &po, &res, &err) == MT_OK && res.feasible) {
        *out = res.plan;
        res.plan.blocks = NULL;
        have = true;
    } else {
        fprintf(stderr, "bench step: no plan under a %.1f GiB device budget: %s\n", o->budget_gib,
                res.feasible ? err.msg : res.why);
    }
    sched_planner_result_free(&res);
    return have;
}

enum { MFU_PLANS = 3 };

typedef struct {
    const char *name[MFU_PLANS];
    measure_t m[MFU_PLANS];
    double pred_s[MFU_PLANS];
    int n;
    double flops_per_token; /* training: 3 x forward */
    double peak;            /* FLOP/s */
    const char *peak_what;
    const char *profile;    /* the hardware profile's name ("calibrated-gpu" with --hw calibrate) */
} mfu_t;

/* One plan's run; with --trace FILE its trace goes to FILE with the plan's
 * policy before the extension (trace.json -> trace.offload_all.json), one
 * file per plan since each plan runs on its own. */
static void measure_one(const char *ckpt, const opts_t *o, const sched_plan_t *plan, step_mode_t mode,
                        measure_t *out) {
    const sched_plan_t *plans[] = {plan};
    const step_mode_t modes[] = {mode};
    const mt_dtype_t compute[] = {o->bf16 ? MT_BF16 : MT_F32};
    double ratio, probe;
    opts_t oo = *o;
    char path[1200];
    if (o->trace) {
        const char *dot = strrchr(o->trace, '.'), *slash = strrchr(o->trace, '/');
        const int stem = dot && (!slash || dot > slash) ? (int)(dot - o->trace) : (int)strlen(o->trace);
        snprintf(path, sizeof path, "%.*s.%s%s", stem, o->trace, sched_policy_name(plan->policy),
                 o->trace + stem);
        oo.trace = path;
    }
    measure_side_by_side_ex(ckpt, &oo, plans, modes, compute, 1, 0, o->trace ? 0 : -1, out, &ratio, &probe);
}

static void mfu_print(const opts_t *o, const mfu_t *r) {
    const int accum = o->accum > 1 ? o->accum : 1;
    const double tokens = (double)o->batch * o->seq * accum;
    if (o->json) {
        char build[256];
        mt_build_info_line(build, sizeof build);
        printf("{\"build\": \"%s\", \"backend\": \"%s\", \"geometry\": \"%s\", \"model_type\": \"%s\", \"layers\": %d,"
               " \"micro_batches_per_step\": %d, \"tokens_per_step\": %.0f, \"compute\": \"%s\","
               " \"model_flops_per_token\": %.9g, \"peak_flops\": %.9g, \"peak\": \"%s\", \"profile\": \"%s\","
               " \"plans\": [",
               build, o->cuda ? "cuda" : "cpu", o->geometry ? o->geometry : "custom", o->model_type, o->layers,
               accum, tokens, o->bf16 ? "bf16" : "fp32", r->flops_per_token, r->peak, r->peak_what, r->profile);
        for (int i = 0; i < r->n; i++) {
            const measure_t *m = &r->m[i];
            const double fl = r->flops_per_token * tokens / m->median_s;
            printf("%s{\"plan\": \"%s\", \"ok\": %s, \"step_s\": %.9g, \"tokens_per_s\": %.9g, \"achieved_flops\": %.9g,"
                   " \"mfu\": %.9g, \"predicted_step_s\": %.9g, \"measured_over_predicted\": %.9g,"
                   " \"peak_device_bytes\": %zu, \"h2d_bytes\": %llu, \"d2h_bytes\": %llu}",
                   i ? ", " : "", r->name[i], m->ok ? "true" : "false", m->ok ? m->median_s : 0,
                   m->ok ? tokens / m->median_s : 0, m->ok ? fl : 0, m->ok ? fl / r->peak : 0, r->pred_s[i],
                   m->ok && r->pred_s[i] > 0 ? m->median_s / r->pred_s[i] : 0, m->peak_device,
                   (unsigned long long)m->h2d_bytes, (unsigned long long)m->d2h_bytes);
        }
        printf("]}\n");
        return;
    }
    printf("%s%s: %s, %d layers, hidden %d, %d experts top-%d of width %d, %d/%d heads of dim %d, vocab %d;"
           " %d x %d tokens per micro-batch, %d per step, compute %s, backend %s\n",
           o->geometry ? "geometry " : "synthetic ", o->geometry ? o->geometry : "model", o->model_type, o->layers,
           o->hidden, o->experts, o->topk, o->expert_width, o->heads, o->kv_heads,
           o->head_dim ? o->head_dim : o->hidden / o->heads, o->vocab, o->batch, o->seq, accum, o->bf16 ? "bf16" : "fp32",
           o->cuda ? "cuda" : "cpu");
    printf("model FLOPs per token: %.4g GFLOP (3 x forward products, attention causal, recomputation not counted)\n",
           r->flops_per_token / 1e9);
    printf("peak: %.4g TFLOP/s (%s)\n", r->peak / 1e12, r->peak_what);
    printf("%-26s %10s %11s %10s %7s %13s %9s %12s %11s\n", "plan", "step (ms)", "tokens/s", "TFLOP/s", "MFU",
           "predicted ms", "meas/pred", "peak dev GB", "H2D GB/step");
    for (int i = 0; i < r->n; i++) {
        const measure_t *m = &r->m[i];
        if (!m->ok) {
            printf("%-26s failed (see above)\n", r->name[i]);
            continue;
        }
        const double fl = r->flops_per_token * tokens / m->median_s;
        printf("%-26s %10.2f %11.0f %10.4g %6.1f%% %13.2f %9.3f %12.2f %11.2f\n", r->name[i], m->median_s * 1e3,
               tokens / m->median_s, fl / 1e12, 100 * fl / r->peak, r->pred_s[i] * 1e3,
               r->pred_s[i] > 0 ? m->median_s / r->pred_s[i] : 0, m->peak_device / 1e9, m->h2d_bytes / 1e9);
    }
    printf("(step: median of %d steps after one warm-up; predicted: the simulator's step time for the plan%s)\n",
           o->steps, o->cuda ? " on the device profile" : " on the profiled keep_all step");
}

/* Which profile predicted, and the rates a streamed plan turns on. */
static void print_profile(const sched_hw_t *hw, const opts_t *o) {
    const bool cal = strcmp(hw->source, "calibrate") == 0;
    printf("device profile: %s (--hw %s%s)\n", hw->device_name, o->hw, cal ? ": measured before the runs" : "");
    const sched_attn_path_t a = o->bf16 ? SCHED_ATTN_TC : SCHED_ATTN_KERNEL;
    printf("  attention %.4g/%.4g TFLOP/s fwd/bwd (%s), link %.1f/%.1f GB/s h2d/d2h, host AdamW %.0f GB/s, "
           "pack %.3g GB/s, unpack %.3g GB/s\n",
           hw->attn_flops[a][SCHED_DIR_FWD] / 1e12, hw->attn_flops[a][SCHED_DIR_BWD] / 1e12,
           a == SCHED_ATTN_TC ? "tensor-core path where it takes the shape" : "fp32 kernel", sched_hw_h2d_bw(hw) / 1e9,
           sched_hw_d2h_bw(hw) / 1e9, hw->adamw_bw / 1e9, hw->pack_bw / 1e9, hw->unpack_bw / 1e9);
    char assumed[512];
    sched_hw_assumed_line(hw, assumed, sizeof assumed);
    if (assumed[0]) printf("  assumed (not in the profile): %s\n", assumed);
}

int mfu_report(const char *ckpt, const opts_t *o) {
    const int nb = o->layers + 2;
    mfu_t r = {.n = 2, .name = {"keep_all", "offload_all (overlapped)", "planner"}};
    sched_plan_t plans[MFU_PLANS] = {0};
    sched_plan_init_uniform(&plans[0], nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&plans[1], nb, SCHED_POLICY_OFFLOAD_ALL);
    const step_mode_t modes[MFU_PLANS] = {STEP_AFTER_BACKWARD, STEP_OVERLAP, STEP_OVERLAP};
    predictor_t p = {0};
    /* the profile before the runs: a missing one should not cost the GPU's minutes first */
    if (o->cuda && !predictor_from_profile(&p, ckpt, o)) {
        for (int i = 0; i < MFU_PLANS; i++) sched_plan_free(&plans[i]);
        return 1;
    }
    measure_one(ckpt, o, &plans[0], modes[0], &r.m[0]);
    /* cpu: the predictor on this machine's calibration and keep_all's profile */
    if (!o->cuda && r.m[0].ok) predictor_init(&p, ckpt, o, 0, &r.m[0], r.m[0].optim_s, false);
    char budget_name[64];
    if (o->keep_all_only) { /* offload_all's slot takes the budget plan, if any */
        sched_plan_free(&plans[1]);
        r.n = 1;
    }
    if (o->budget_gib > 0 && p.ok && budget_plan(&p, o, &plans[r.n])) {
        snprintf(budget_name, sizeof budget_name, "planner, %g GiB budget", o->budget_gib);
        r.name[r.n] = budget_name;
        r.n++;
    }
    for (int i = 1; i < r.n && r.m[0].ok; i++) measure_one(ckpt, o, &plans[i], modes[i], &r.m[i]);
    bool ok = p.ok && r.m[0].ok;
    if (ok) {
        r.flops_per_token = sched_registry_model_flops_per_token(&p.reg);
        const sched_rate_t rate = o->bf16 ? SCHED_RATE_BF16 : SCHED_RATE_FP32;
        r.peak = o->cuda ? p.hw.peak_flops[SCHED_RATE_BF16] : sched_hw_flops(&p.hw, rate);
        const bool gpu_cal = o->cuda && strcmp(p.hw.source, "calibrate") == 0;
        r.peak_what = gpu_cal   ? "this GPU's calibrated bf16 GEMM rate"
                      : o->cuda ? "the device profile's dense bf16 peak"
                      : o->bf16 ? "this CPU's calibrated bf16 GEMM rate"
                                : "this CPU's calibrated fp32 GEMM rate";
        r.profile = p.hw.name;
        for (int i = 0; i < r.n; i++) r.pred_s[i] = predict(&p, &plans[i]);
        ok = r.flops_per_token > 0 && r.peak > 0;
        if (!ok) fprintf(stderr, "bench step: no model FLOPs or no peak to compare with\n");
    }
    if (ok && o->cuda && !o->json) print_profile(&p.hw, o);
    if (ok) mfu_print(o, &r);
    for (int i = 0; i < r.n; i++) ok &= r.m[i].ok;
    for (int i = 0; i < r.n; i++) {
        measure_free(&r.m[i]);
        sched_plan_free(&plans[i]);
    }
    predictor_free(&p);
    return ok ? 0 : 1;
}
