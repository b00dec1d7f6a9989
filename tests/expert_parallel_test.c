/* Expert parallelism on two CPU devices (engine/exec/expert_parallel.h) against one
 * device and against two devices data parallel, with the same global
 * batch: for Mixtral, Qwen2-MoE (a dense layer, a gated shared expert) and
 * Qwen3-MoE fixtures, every MoE layer's block plan marked expert_parallel,
 * under two plans that keep those layers' gradients and AdamW on the host
 * (what expert parallelism requires): min_memory (streamed weights,
 * activations recomputed, so the layer's forward and its exchanges run
 * twice) and resident weights with kept activations; K = 2 and 4
 * micro-batches per step, three optimizer steps with clipping on, and
 * K = 4 in layer-major order.
 *
 * Expectation, from the order of the float adds:
 *  - K = 2 (one micro-batch per device): every token's expert products are
 *    the ones one device forms (moe/expert_parallel.h); an expert's owner
 *    accumulates device 0's rows' share, then device 1's, which is the
 *    single device's micro-batch order; the data-parallel tensors reduce
 *    as g0 + g1, as one device adds.  Losses, gradient norms and final
 *    weights must be bit-identical to one device's (and so to data
 *    parallel's).
 *  - K = 4: the owner of an expert adds per step (g0 + g2) + (g1 + g3)
 *    (each of its two micro-batch turns takes both devices' rows), one
 *    device ((g0 + g1) + g2) + g3, and data parallel (g0 + g1) + (g2 + g3):
 *    three roundings of the same sum.  The first step's losses are still
 *    bit-identical; later losses and norms within 1e-6 relative, and the
 *    weights within 1e-6 relative in L2 over the model and per tensor (as
 *    in multi_device_test, the k_proj bias, whose exact gradient is zero,
 *    only in the whole-model bound).
 * With --bf16 the same in bf16 mixed precision (bf16 working copies and
 * gathered rows: the rows cross between devices in bf16, as the
 * single-device block stores them).
 * Also: with resident weights each device's arena holds none of the other
 * device's experts (its bytes in use after placement are smaller than a
 * data-parallel device's by at least their weights' bytes), and plans that
 * keep an expert-parallel layer's gradients on the device or offload its
 * activations are refused by name.  And a device that goes over its budget
 * in the middle of a step (its micro-batch has twice the rows of the
 * other's) stops the step with its own error, its peer freed from the
 * exchange it was waiting in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/model.h"
#include "engine/parallel/devices.h"
#include "engine/exec/optim.h"
#include "tests/harness.h"

static mt_dtype_t g_compute = MT_F32; /* --bf16: bf16 mixed precision */

enum { STEPS = 3 };

typedef struct {
    th_result_t th;
    size_t dev_in_use[2]; /* after placement */
    size_t foreign_bytes[2]; /* resident weight bytes of the other device's experts */
} result_t;

typedef enum { PLAN_MIN_MEMORY, PLAN_RESIDENT_HOST_OPTIM, PLAN_KEEP_ALL, PLAN_OFFLOAD_ALL } plan_kind_t;
typedef enum { MODE_ONE, MODE_DATA, MODE_EXPERT } mode_t_;

static const char *plan_name(plan_kind_t k) {
    return k == PLAN_MIN_MEMORY            ? "min_memory"
           : k == PLAN_RESIDENT_HOST_OPTIM ? "resident+host optim"
           : k == PLAN_OFFLOAD_ALL         ? "offload_all"
                                           : "keep_all";
}
static const char *mode_name(mode_t_ m) {
    return m == MODE_ONE ? "1 device" : m == MODE_DATA ? "2 devices data parallel" : "2 devices expert parallel";
}

static void make_plan(sched_plan_t *plan, const eng_model_config_t *mc, plan_kind_t k, bool ep) {
    const int nb = mc->num_hidden_layers + 2;
    sched_plan_init_uniform(plan, nb,
                            k == PLAN_MIN_MEMORY    ? SCHED_POLICY_MIN_MEMORY
                            : k == PLAN_OFFLOAD_ALL ? SCHED_POLICY_OFFLOAD_ALL
                                                    : SCHED_POLICY_KEEP_ALL);
    for (int b = 0; b < nb; b++) {
        if (k == PLAN_RESIDENT_HOST_OPTIM) {
            plan->blocks[b].grads = SCHED_GRADS_HOST;
            plan->blocks[b].optim = SCHED_OPTIM_HOST;
        }
        /* until the planner sets it: every MoE layer's experts split */
        plan->blocks[b].expert_parallel = ep && b >= 1 && b <= mc->num_hidden_layers && mc->layer_is_moe[b - 1];
    }
    plan->prefetch_window = 2;
}

static mt_status_t run(const char *dir, plan_kind_t pk, int K, mode_t_ mode, eng_step_order_t order, result_t *out,
                       mt_error_t *err) {
    memset(out, 0, sizeof *out);
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, err) != MT_OK) return err->code;
    kern_device_t *dev = th_cpu_device(0);
    eng_model_config_t mc;
    TH_CHECK(eng_model_config_load(rc.base_model, rc.model_config_json, &mc, err) == MT_OK, "%s", err->msg);
    sched_plan_t plan;
    make_plan(&plan, &mc, pk, mode == MODE_EXPERT);
    eng_model_config_free(&mc);
    eng_devices_t devs = {.count = mode == MODE_ONE ? 1 : 2, .ids = {0, 1}};
    eng_multi_t mm;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json, .plan = &plan, .compute = g_compute};
    mt_status_t st = eng_multi_open(&mm, dev, &devs, K, rc.base_model, &mo, err);
    if (st != MT_OK) goto done;
    eng_exec_t *x = mm.primary;
    const eng_model_t *m = eng_exec_model(x);
    for (int d = 0; d < mm.n; d++) {
        out->dev_in_use[d] = kern_device_stats(mm.devs[d]).device_in_use;
        for (int i = 0; i < m->num_params; i++) {
            const eng_param_t *p = &m->params[i];
            const int E = m->cfg.num_experts, e = p->spec->expert;
            const bool other = d == 0 ? e >= E / 2 : e >= 0 && e < E / 2;
            if (e >= 0 && plan.blocks[p->block].expert_parallel && other &&
                plan.blocks[p->block].weights == SCHED_WEIGHTS_RESIDENT)
                out->foreign_bytes[d] += (size_t)p->spec->numel * mt_dtype_size(p->w_dtype);
        }
    }
    eng_dataset_t ds;
    TH_CHECK(th_dataset_load(&ds, &rc, m->cfg.vocab_size, err) == MT_OK, "%s", err->msg);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
    eng_micro_stats_t *ms = calloc((size_t)K, sizeof *ms);
    for (int step = 0; step < STEPS && st == MT_OK; step++) {
        eng_optim_hparams_t hp = th_hparams(&rc);
        eng_multi_begin_step(&mm, &hp, K, true);
        st = eng_multi_step_from_loader(&mm, &ld, K, order, ms, err);
        if (st != MT_OK) break;
        for (int j = 0; j < K; j++) out->th.loss[step] += ms[j].loss / K; /* as engine/run/train.c logs it */
        eng_optim_stats_t os;
        st = eng_multi_optim_step(&mm, &hp, &os, err);
        out->th.norm[step] = os.grad_norm;
    }
    out->th.ok = st == MT_OK;
    free(ms);
    th_result_read_weights(&out->th, x);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_multi_free(&mm);
done:
    sched_plan_free(&plan);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
    return st;
}

/* K = 2 bit-identical, else within 1e-6 relative; the k_proj bias only in
 * the whole-model bound (see the top of the file). */
static void compare(const char *what, const result_t *a, const result_t *b, bool exact) {
    if (!a->th.ok || !b->th.ok) return;
    th_compare_steps(what, &a->th, &b->th, STEPS, exact, 1e-6);
    th_compare_weights(what, &a->th, &b->th, exact, 1e-6, "k_proj.bias");
}

static void check_case(const char *dir, plan_kind_t pk, int K, eng_step_order_t order) {
    result_t r[3];
    const char *base = th_base_name(dir);
    for (int mode = MODE_ONE; mode <= MODE_EXPERT; mode++) {
        mt_error_t err = {0};
        TH_CHECK(run(dir, pk, K, (mode_t_)mode, order, &r[mode], &err) == MT_OK, "%s %s K=%d %s: %s", base,
                 plan_name(pk), K, mode_name((mode_t_)mode), err.msg);
    }
    char what[256];
    const char *ord = order == ENG_STEP_ORDER_LAYER ? " layer-major" : "";
    snprintf(what, sizeof what, "%s %s K=%d%s: expert parallel vs 1 device", base, plan_name(pk), K, ord);
    compare(what, &r[MODE_ONE], &r[MODE_EXPERT], K == 2);
    snprintf(what, sizeof what, "%s %s K=%d%s: expert vs data parallel", base, plan_name(pk), K, ord);
    compare(what, &r[MODE_DATA], &r[MODE_EXPERT], K == 2);
    if (pk == PLAN_RESIDENT_HOST_OPTIM && r[MODE_EXPERT].th.ok && r[MODE_DATA].th.ok)
        for (int d = 0; d < 2; d++) {
            const size_t dp = r[MODE_DATA].dev_in_use[d], ep = r[MODE_EXPERT].dev_in_use[d];
            TH_CHECK(ep + r[MODE_EXPERT].foreign_bytes[d] <= dp,
                     "%s: device %d holds %zu bytes expert parallel, %zu data parallel: not %zu (the other device's "
                     "experts) less",
                     base, d, ep, dp, r[MODE_EXPERT].foreign_bytes[d]);
            fprintf(stderr, "   %s device %d after placement: %zu bytes data parallel, %zu expert parallel (the other "
                    "device's experts: %zu)\n",
                    base, d, dp, ep, r[MODE_EXPERT].foreign_bytes[d]);
        }
    for (int i = 0; i < 3; i++) th_result_free(&r[i].th);
}

/* One step of two micro-batches, device 0's cut to its first row (so
 * device 1 needs more memory), under a device budget; the devices' peaks
 * out. */
static mt_status_t uneven_step(const char *dir, size_t budget, size_t peak[2], mt_error_t *err) {
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, err) != MT_OK) return err->code;
    kern_device_t *dev = th_cpu_device(budget);
    eng_model_config_t mc;
    TH_CHECK(eng_model_config_load(rc.base_model, rc.model_config_json, &mc, err) == MT_OK, "%s", err->msg);
    sched_plan_t plan;
    make_plan(&plan, &mc, PLAN_RESIDENT_HOST_OPTIM, true);
    eng_model_config_free(&mc);
    eng_devices_t devs = {.count = 2, .ids = {0, 1}};
    eng_multi_t mm;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json, .plan = &plan};
    mt_status_t st = eng_multi_open(&mm, dev, &devs, 2, rc.base_model, &mo, err);
    if (st == MT_OK) {
        eng_dataset_t ds;
        TH_CHECK(th_dataset_load(&ds, &rc, eng_multi_model(&mm)->cfg.vocab_size, err) == MT_OK, "%s", err->msg);
        eng_loader_t ld;
        eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
        eng_batch_t *bs = eng_loader_take(&ld, 2);
        bs[0].B = 1; /* rows are (B, T) row-major: the first row alone */
        bs[0].counted = 0;
        for (int t = 0; t < bs[0].T; t++) bs[0].counted += bs[0].targets[t] != -100;
        eng_optim_hparams_t hp = th_hparams(&rc);
        eng_micro_stats_t ms[2];
        for (int d = 0; d < 2; d++) kern_device_reset_peaks(mm.devs[d]);
        eng_multi_begin_step(&mm, &hp, 2, true);
        st = eng_multi_step_fwd_bwd(&mm, bs, 2, ENG_STEP_ORDER_AUTO, ms, err);
        for (int d = 0; d < 2; d++) peak[d] = kern_device_stats(mm.devs[d]).device_peak;
        eng_batches_free(bs, 2);
        eng_loader_free(&ld);
        eng_dataset_free(&ds);
        eng_multi_free(&mm);
    }
    sched_plan_free(&plan);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
    return st;
}

/* A device that fails in the middle of a step (over its budget) must not
 * leave the other waiting in an exchange: the step returns, naming the
 * device that failed and why, not the abort its peer saw. */
static void check_failure(const char *dir) {
    size_t peak[2] = {0, 0}, unused[2];
    mt_error_t err = {0};
    TH_CHECK(uneven_step(dir, 0, peak, &err) == MT_OK, "uneven step: %s", err.msg);
    TH_CHECK(peak[1] > peak[0], "device 1 (two rows) peaked at %zu bytes, device 0 (one row) at %zu", peak[1], peak[0]);
    if (peak[1] <= peak[0]) return;
    const size_t budget = peak[0] + (peak[1] - peak[0]) / 2;
    const mt_status_t st = uneven_step(dir, budget, unused, &err);
    TH_CHECK(st == MT_ERR_BUDGET && strstr(err.msg, "device 1") && strstr(err.msg, "budget"),
             "device 1 over its budget of %zu bytes: status %d, '%s'", budget, (int)st, err.msg);
    fprintf(stderr, "   peaks %zu / %zu bytes; with a budget of %zu the step returned: %s\n", peak[0], peak[1],
            budget, err.msg);
}

static void check_refused(const char *dir) {
    result_t r;
    mt_error_t err = {0};
    mt_status_t st = run(dir, PLAN_KEEP_ALL, 2, MODE_EXPERT, ENG_STEP_ORDER_AUTO, &r, &err);
    TH_CHECK(st == MT_ERR_UNSUPPORTED && strstr(err.msg, "expert parallelism needs") && strstr(err.msg, "grads device"),
             "expert parallel with device gradients: status %d, '%s'", (int)st, err.msg);
    fprintf(stderr, "   keep_all plan with expert-parallel layers refused: %s\n", err.msg);
    if (st == MT_OK) th_result_free(&r.th);
    st = run(dir, PLAN_OFFLOAD_ALL, 2, MODE_EXPERT, ENG_STEP_ORDER_AUTO, &r, &err);
    TH_CHECK(st == MT_ERR_UNSUPPORTED && strstr(err.msg, "cannot offload"),
             "expert parallel with offloaded activations: status %d, '%s'", (int)st, err.msg);
    fprintf(stderr, "   offload_all plan with expert-parallel layers refused: %s\n", err.msg);
    if (st == MT_OK) th_result_free(&r.th);
}

int main(int argc, char **argv) {
    const int first = th_parse_compute(argc, argv, &g_compute);
    for (int a = first; a < argc; a++) {
        const char *dir = argv[a];
        fprintf(stderr, "== %s\n", dir);
        for (int K = 2; K <= 4; K += 2) {
            check_case(dir, PLAN_MIN_MEMORY, K, ENG_STEP_ORDER_AUTO);
            check_case(dir, PLAN_RESIDENT_HOST_OPTIM, K, ENG_STEP_ORDER_AUTO);
        }
        check_case(dir, PLAN_MIN_MEMORY, 4, ENG_STEP_ORDER_LAYER);
        check_case(dir, PLAN_RESIDENT_HOST_OPTIM, 4, ENG_STEP_ORDER_LAYER);
        if (a == first) {
            check_refused(dir);
            check_failure(dir);
        }
    }
    return th_finish();
}
