/* Plan invariance: "the plan changes where and when, never what is
 * computed".  For each reference fixture (tiny Mixtral with gradient
 * accumulation, Qwen2-MoE with a dense layer and shared expert, Qwen3-MoE),
 * three optimizer steps under keep_all, offload_all, min_memory and mixed
 * per-block plans with different prefetch windows must give bit-identical
 * losses, gradient norms and final weights.  One run also has a device
 * budget smaller than the model's weights and must stay within it.  With
 * --bf16 every run is in bf16 mixed precision, where the same must hold
 * (bf16 working copies made on the host while staged, or on the device by
 * AdamW, must round the same master the same way). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/model/io/init_random.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/exec/exec_testing.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "tests/harness.h"

/* --bf16: every run in bf16 mixed precision (bf16 working copies and products) */
static mt_dtype_t g_compute = MT_F32;

enum { STEPS = 3 };

typedef struct {
    th_result_t th; /* losses, gradient norms, final weights */
    size_t peak_device, weight_bytes;
    int overlapped; /* parameter updates that ran during backward */
    int taken_back; /* blocks whose overlapped update was taken back and deferred */
    int summed_ahead; /* parameters whose norm part the host worker took as their gradient landed */
    int work_pinned;             /* of the working copies below, those in pinned memory (pinned_home) */
    int work_copies, work_stale; /* trained weights with a host bf16 working copy, and those that are not
                                  * their master rounded to nearest even after the last step */
    bool ok;
} run_result_t;

/* Each host bf16 working copy (eng_param_t.work_bf16) against its master:
 * what the device computed with is what the master rounds to. */
static void check_work_copies(const eng_model_t *m, run_result_t *out) {
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        if (!p->work_bf16) continue;
        out->work_copies++;
        out->work_pinned += p->work_pinned;
        for (size_t j = 0; j < p->spec->numel; j++)
            if (p->work_bf16[j] != mt_f32_to_bf16(p->host_w[j])) {
                out->work_stale++;
                break;
            }
    }
}

/* overlap 0-2: run without clipping, with the host optimizer overlapping
 * backward (1: every update within the step; 2: the worker held, so the
 * optimizer step takes every update back and defers it into the next
 * step) or not (0).  3: with the run's clipping, told it may overlap, so
 * that only the host gradients' sums of squares for the norm are taken as
 * they land.  -1: with clipping, nothing overlapped. */
static void run_plan_ex(const char *dir, const char *base_model, const sched_plan_t *plan, size_t budget,
                        int overlap, run_result_t *out) {
    memset(out, 0, sizeof *out);
    mt_error_t err = {0};
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    if (base_model) snprintf(rc.base_model, sizeof rc.base_model, "%s", base_model);
    kern_device_t *dev = th_cpu_device(budget);
    eng_exec_t *x = NULL;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json, .plan = plan, .compute = g_compute};
    if (eng_exec_open(&x, dev, rc.base_model, &mo, &err) != MT_OK) {
        TH_CHECK(0, "load under plan %s: %s", sched_policy_name(plan->policy), err.msg);
        kern_device_destroy(dev);
        eng_run_config_free(&rc);
        return;
    }
    eng_dataset_t ds;
    TH_CHECK(th_dataset_load(&ds, &rc, eng_exec_model(x)->cfg.vocab_size, &err) == MT_OK, "%s", err.msg);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
    kern_device_reset_peaks(dev);
    if (overlap == 1) eng_exec_finish_updates_in_step(x);
    if (overlap == 2) eng_exec_hold_overlapped_updates(x, true);
    out->th.ok = true;
    for (int step = 0; step < STEPS && out->th.ok; step++) {
        const int accum = rc.gradient_accumulation_steps;
        eng_optim_hparams_t hp = th_hparams(&rc);
        if (overlap >= 0 && overlap <= 2) hp.max_grad_norm = 0.0;
        eng_optim_begin_step(x, &hp, accum, overlap >= 1);
        double loss = 0;
        for (int mb = 0; mb < accum; mb++) {
            eng_batch_t b;
            eng_loader_next(&ld, &b);
            eng_micro_stats_t ms;
            if (eng_exec_forward_backward(x, &b, 1.0f / accum, NULL, &ms, &err) != MT_OK) {
                TH_CHECK(0, "plan %s step %d: %s", sched_policy_name(plan->policy), step + 1, err.msg);
                out->th.ok = false;
                break;
            }
            loss += ms.loss / accum;
        }
        eng_optim_stats_t os;
        if (out->th.ok && eng_optim_step(x, &hp, &os, &err) != MT_OK) {
            TH_CHECK(0, "optimizer: %s", err.msg);
            out->th.ok = false;
        }
        out->th.loss[step] = loss;
        out->th.norm[step] = os.grad_norm;
        out->overlapped += os.updated_during_backward;
        out->taken_back += os.taken_back;
        out->summed_ahead += os.summed_ahead;
    }
    out->peak_device = kern_device_stats(dev).device_peak;
    eng_exec_drain(x); /* the last step's deferred updates may still be writing masters and copies */
    check_work_copies(eng_exec_model(x), out);
    th_result_read_weights(&out->th, x);
    out->weight_bytes = th_result_bytes(&out->th);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_exec_free(x);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
}

static void run_plan(const char *dir, const char *base_model, const sched_plan_t *plan, size_t budget,
                     run_result_t *out) {
    run_plan_ex(dir, base_model, plan, budget, -1, out);
}

static void compare(const char *what, const run_result_t *a, const run_result_t *b, const char *dir) {
    if (!a->th.ok || !b->th.ok) return;
    char full[512];
    snprintf(full, sizeof full, "%s %s", dir, what);
    /* weights are compared bit for bit */
    th_compare_steps(full, &a->th, &b->th, STEPS, true, 0);
    th_compare_weights(full, &a->th, &b->th, true, 0, NULL);
}

static void check_case(const char *dir) {
    fprintf(stderr, "== %s\n", dir);
    /* block count from a keep_all probe */
    char path[1024];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_load(path, NULL, &cfg, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    const int nb = cfg.num_hidden_layers + 2;
    eng_model_config_free(&cfg);

    sched_plan_t keep, off, minm, mixed;
    sched_plan_init_uniform(&keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&off, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&minm, nb, SCHED_POLICY_MIN_MEMORY);
    sched_plan_init_uniform(&mixed, nb, SCHED_POLICY_KEEP_ALL);
    off.prefetch_window = 2;
    /* mixed: every combination the executor supports, block by block */
    const sched_block_plan_t kinds[] = {
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_DEVICE, SCHED_OPTIM_HOST, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, true},
        {SCHED_WEIGHTS_STREAM, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_KEEP, false, false, false, SCHED_INPUTS_KEEP, true, true},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_RECOMPUTE, false, false, false, SCHED_INPUTS_KEEP, true, false},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_DEVICE, SCHED_OPTIM_DEVICE, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, false},
    };
    for (int b = 0; b < nb; b++) mixed.blocks[b] = kinds[b % 4];

    run_result_t rk, ro, rm, rx;
    run_plan(dir, NULL, &keep, 0, &rk);
    run_plan(dir, NULL, &off, 0, &ro);
    run_plan(dir, NULL, &minm, 0, &rm);
    run_plan(dir, NULL, &mixed, 0, &rx);
    compare("offload_all vs keep_all", &rk, &ro, dir);
    compare("min_memory vs keep_all", &rk, &rm, dir);
    compare("mixed vs keep_all", &rk, &rx, dir);
    /* bf16: host AdamW blocks keep a bf16 working copy, always their master rounded */
    /* mixed pins the copies of its streamed and resident host-AdamW blocks: bit-identical above */
    if (g_compute == MT_BF16)
        TH_CHECK(ro.work_copies > 0 && rx.work_copies > 0 && ro.work_pinned == 0 && rx.work_pinned > 0,
                 "host bf16 working copies: offload_all %d (%d pinned), mixed %d (%d pinned)", ro.work_copies,
                 ro.work_pinned, rx.work_copies, rx.work_pinned);
    TH_CHECK(ro.work_stale == 0 && rx.work_stale == 0 && rk.work_copies == 0,
             "bf16 working copies that are not their master rounded: offload_all %d of %d, mixed %d of %d; "
             "keep_all (device AdamW) has %d", ro.work_stale, ro.work_copies, rx.work_stale, rx.work_copies,
             rk.work_copies);
    /* host AdamW overlapping backward (no clipping) == after backward */
    run_result_t r0, r1, r2;
    run_plan_ex(dir, NULL, &off, 0, 0, &r0);
    run_plan_ex(dir, NULL, &off, 0, 1, &r1);
    run_plan_ex(dir, NULL, &off, 0, 2, &r2);
    compare("offload_all with vs without the overlapped host optimizer", &r0, &r1, dir);
    compare("offload_all with the overlapped updates taken back and deferred", &r0, &r2, dir);
    TH_CHECK(r0.overlapped == 0 && r1.overlapped > 0 && r1.taken_back == 0,
             "overlap: %d / %d updates ran during backward, %d blocks taken back", r0.overlapped, r1.overlapped,
             r1.taken_back);
    TH_CHECK(r2.overlapped == 0 && r2.taken_back >= STEPS * (off.num_blocks - 1),
             "held: %d updates ran during backward, %d blocks taken back", r2.overlapped, r2.taken_back);
    fprintf(stderr, "   overlapped host AdamW: %d parameter updates ran during backward; %d blocks' taken back and "
            "deferred when not started; results identical\n", r1.overlapped, r2.taken_back);
    /* with clipping: the norm summed as the host gradients land == summed after the backward */
    run_result_t r3, r4;
    run_plan_ex(dir, NULL, &off, 0, 3, &r3);
    run_plan_ex(dir, NULL, &mixed, 0, 3, &r4);
    compare("offload_all with the norm summed as the gradients land", &ro, &r3, dir);
    compare("mixed with the norm summed as the gradients land", &rx, &r4, dir);
    TH_CHECK(ro.summed_ahead == 0 && r3.summed_ahead > 0 && r4.summed_ahead > 0 && r3.overlapped == 0,
             "norm ahead: %d / %d / %d parameters summed as they landed, %d updates during backward",
             ro.summed_ahead, r3.summed_ahead, r4.summed_ahead, r3.overlapped);
    fprintf(stderr, "   norm summed as the host gradients land: %d (offload_all) and %d (mixed) parameters' "
            "sums of squares taken during the backward; results identical\n", r3.summed_ahead, r4.summed_ahead);
    th_result_free(&r0.th);
    th_result_free(&r1.th);
    th_result_free(&r2.th);
    th_result_free(&r3.th);
    th_result_free(&r4.th);
    fprintf(stderr, "   losses %.9g %.9g %.9g; peak device bytes keep_all %zu, offload_all %zu, min_memory %zu\n",
            rk.th.loss[0], rk.th.loss[1], rk.th.loss[2], rk.peak_device, ro.peak_device, rm.peak_device);
    TH_CHECK(rm.peak_device < rk.peak_device, "min_memory should need less device memory than keep_all");
    TH_CHECK(ro.peak_device < rk.peak_device, "offload_all should need less device memory than keep_all");

    th_result_free(&rk.th);
    th_result_free(&ro.th);
    th_result_free(&rm.th);
    th_result_free(&rx.th);
    sched_plan_free(&keep);
    sched_plan_free(&off);
    sched_plan_free(&minm);
    sched_plan_free(&mixed);
}

/* A model whose weights dominate (as real MoE models' do): min_memory must
 * train it under a device budget of 3/4 of its weights, stay within the
 * budget, and still match keep_all bit for bit; keep_all under that budget
 * is refused with an error naming a tensor. */
static void check_budget(const char *data_dir) {
    fprintf(stderr, "== device budget below the weights\n");
    const char *tmp = getenv("TEST_TMPDIR");
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/budget-ckpt", tmp ? tmp : "/tmp");
    const char *config =
        "{\"model_type\": \"mixtral\", \"vocab_size\": 96, \"hidden_size\": 64, \"intermediate_size\": 192,"
        " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"num_key_value_heads\": 2,"
        " \"num_local_experts\": 8, \"num_experts_per_tok\": 2, \"rms_norm_eps\": 1e-5,"
        " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"output_router_logits\": true,"
        " \"router_aux_loss_coef\": 0.02}";
    mt_error_t err = {0};
    if (eng_checkpoint_init_random(ckpt, config, 3, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    const int nb = 6 + 2;
    sched_plan_t keep, minm;
    sched_plan_init_uniform(&keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&minm, nb, SCHED_POLICY_MIN_MEMORY);
    run_result_t rk, rb;
    run_plan(data_dir, ckpt, &keep, 0, &rk);
    run_result_t ru;
    run_plan(data_dir, ckpt, &minm, 0, &ru);
    fprintf(stderr, "   min_memory without a budget peaks at %zu bytes\n", ru.peak_device);
    th_result_free(&ru.th);
    const size_t budget = rk.weight_bytes * 3 / 4;
    run_plan(data_dir, ckpt, &minm, budget, &rb);
    TH_CHECK(rb.th.ok, "min_memory under a %zu-byte budget (weights are %zu bytes) failed", budget, rk.weight_bytes);
    TH_CHECK(rb.peak_device <= budget, "peak device bytes %zu exceed the budget %zu", rb.peak_device, budget);
    compare("min_memory under budget vs keep_all", &rk, &rb, "budget");
    fprintf(stderr, "   weights %zu bytes; budget %zu bytes; peak device: keep_all %zu, min_memory %zu\n",
            rk.weight_bytes, budget, rk.peak_device, rb.peak_device);

    kern_device_t *dev = NULL;
    kern_device_opts_t o = {.device_budget_bytes = budget};
    kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err);
    eng_exec_t *x = NULL;
    mt_status_t st = eng_exec_load(&x, dev, ckpt, NULL, &keep, NULL, &err);
    TH_CHECK(st == MT_ERR_BUDGET && strstr(err.msg, "model.") != NULL,
             "keep_all over budget: status %d, message '%s'", (int)st, err.msg);
    if (st == MT_OK) eng_exec_free(x);
    else fprintf(stderr, "   keep_all under that budget: %s\n", err.msg);
    kern_device_destroy(dev);
    th_result_free(&rk.th);
    th_result_free(&rb.th);
    sched_plan_free(&keep);
    sched_plan_free(&minm);
}

int main(int argc, char **argv) {
    const int first = th_parse_compute(argc, argv, &g_compute);
    if (g_compute == MT_BF16) fprintf(stderr, "every run in bf16 mixed precision\n");
    for (int i = first; i < argc; i++) check_case(argv[i]);
    if (argc > first) check_budget(argv[first]);
    if (th_failures()) {
        fprintf(stderr, "plan_invariance_test: %d failures\n", th_failures());
        return 1;
    }
    fprintf(stderr, "plan_invariance_test: all plans bit-identical\n");
    return 0;
}
