/* Data parallel on two CPU devices sharing one host copy
 * (engine/parallel/devices.h) against one device with the same global batch:
 * for each reference fixture (Mixtral, Qwen2-MoE with a dense layer and a
 * shared expert, Qwen3-MoE), K = 2 and 4 micro-batches per optimizer step,
 * under keep_all (device gradients and device AdamW: the replica's resident
 * weights are refreshed from device 0's), offload_all (streamed weights,
 * host gradients and host AdamW) and a streamed plan with device gradients
 * and host AdamW, three optimizer steps with clipping on (K = 4 also in
 * layer-major order on both sides); and a LoRA run
 * (tests/fixtures/lora_qwen2_all) with K = 2.  In fp32, and with --bf16 in
 * bf16 mixed precision (bf16 working copies: the replica's resident ones
 * are refreshed from device 0's bf16 copy, or rounded again from the
 * shared fp32 master).
 *
 * Expectation, from the order of the float adds:
 *  - K = 2: device 0 runs micro-batch 0, device 1 micro-batch 1, and the
 *    reduction computes g0 + g1, the same single add one device does when
 *    it accumulates micro-batch 1 into micro-batch 0's gradient.  Losses,
 *    gradient norms and final weights must be bit-identical.
 *  - K = 4: one device sums ((g0 + g1) + g2) + g3; two devices sum
 *    (g0 + g1) + (g2 + g3), a different rounding of the same sum, so the
 *    gradients differ in the last bits and AdamW carries that into the
 *    weights.  The first step's losses are still bit-identical (same
 *    weights, same forward); later losses and gradient norms must agree
 *    within 1e-6 relative, and the weights within 1e-6 relative in L2, over
 *    the whole model and tensor by tensor.  Not element by element: AdamW
 *    divides by sqrt(v), so an element whose gradient sum nearly cancels
 *    moves by about lr * sign(g) either way and its relative difference is
 *    large (the test prints the worst element; about 5e-5 with Qwen2's
 *    k_proj bias).  The k_proj bias is left out of the per-tensor bound
 *    too: softmax is invariant to a shift that is the same for every key,
 *    so its exact gradient is zero and what it gets is rounding noise,
 *    which AdamW scales up to full-size updates; it stays in the
 *    whole-model bound.
 * Also: K not a multiple of the device count is refused naming both keys. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/lora_model.h"
#include "engine/model/model.h"
#include "engine/parallel/devices.h"
#include "engine/exec/optim.h"
#include "engine/run/train.h"
#include "tests/harness.h"

static mt_dtype_t g_compute = MT_F32; /* --bf16: bf16 mixed precision */

enum { STEPS = 3 };

typedef enum { PLAN_KEEP_ALL, PLAN_OFFLOAD_ALL, PLAN_STREAM_DEVICE_GRADS } plan_kind_t;

static const char *plan_name(plan_kind_t k) {
    return k == PLAN_KEEP_ALL ? "keep_all" : k == PLAN_OFFLOAD_ALL ? "offload_all" : "stream+device grads";
}

static void make_plan(sched_plan_t *plan, int nb, plan_kind_t k) {
    sched_plan_init_uniform(plan, nb, k == PLAN_KEEP_ALL ? SCHED_POLICY_KEEP_ALL : SCHED_POLICY_OFFLOAD_ALL);
    if (k == PLAN_STREAM_DEVICE_GRADS)
        for (int b = 0; b < nb; b++) {
            plan->blocks[b].grads = SCHED_GRADS_DEVICE;
            plan->blocks[b].acts = SCHED_ACTS_KEEP;
        }
    plan->prefetch_window = 2;
}

static void run(const char *dir, plan_kind_t pk, int K, int ndev, eng_step_order_t order, th_result_t *out) {
    memset(out, 0, sizeof *out);
    mt_error_t err = {0};
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    eng_lora_run_opts_t lora;
    const bool use_lora = rc.adapter == ENG_ADAPTER_LORA;
    if (use_lora) TH_CHECK(eng_lora_run_opts(&rc, &lora, &err) == MT_OK, "%s", err.msg);
    kern_device_t *dev = th_cpu_device(0);
    eng_model_config_t mc;
    TH_CHECK(eng_model_config_load(rc.base_model, rc.model_config_json, &mc, &err) == MT_OK, "%s", err.msg);
    sched_plan_t plan;
    make_plan(&plan, mc.num_hidden_layers + 2, pk);
    eng_model_config_free(&mc);
    eng_devices_t devs = {.count = ndev, .ids = {0, 1, 2, 3}};
    eng_exec_t *x = NULL;
    eng_multi_t mm;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json, .plan = &plan, .compute = g_compute,
                                 .lora = use_lora ? &lora.opts : NULL};
    if (eng_multi_open(&mm, dev, &devs, K, rc.base_model, &mo, &err) != MT_OK) {
        TH_CHECK(0, "%s %s K=%d devices=%d: load: %s", dir, plan_name(pk), K, ndev, err.msg);
        goto done;
    }
    x = mm.primary;
    eng_dataset_t ds;
    TH_CHECK(th_dataset_load(&ds, &rc, eng_exec_model(x)->cfg.vocab_size, &err) == MT_OK, "%s", err.msg);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
    eng_micro_stats_t *ms = calloc((size_t)K, sizeof *ms);
    out->ok = true;
    for (int step = 0; step < STEPS && out->ok; step++) {
        eng_optim_hparams_t hp = th_hparams(&rc);
        eng_multi_begin_step(&mm, &hp, K, true);
        if (eng_multi_step_from_loader(&mm, &ld, K, order, ms, &err) != MT_OK) {
            TH_CHECK(0, "%s %s K=%d devices=%d step %d: %s", dir, plan_name(pk), K, ndev, step + 1, err.msg);
            out->ok = false;
            break;
        }
        /* as engine/run/train.c logs it: the mean over all K micro-batches, in order */
        for (int j = 0; j < K; j++) out->loss[step] += ms[j].loss / K;
        eng_optim_stats_t os;
        if (eng_multi_optim_step(&mm, &hp, &os, &err) != MT_OK) {
            TH_CHECK(0, "optimizer: %s", err.msg);
            out->ok = false;
        }
        out->norm[step] = os.grad_norm;
    }
    free(ms);
    th_result_read_weights(out, x);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_multi_free(&mm);
done:
    sched_plan_free(&plan);
    kern_device_destroy(dev);
    if (use_lora) eng_lora_run_opts_free(&lora);
    eng_run_config_free(&rc);
}

/* K = 2 bit-identical, else within 1e-6 relative; the k_proj bias only in
 * the whole-model bound (see the top of the file: its gradient is rounding
 * noise). */
static void compare(const char *what, const th_result_t *a, const th_result_t *b, bool exact) {
    if (!a->ok || !b->ok) return;
    th_compare_steps(what, a, b, STEPS, exact, 1e-6);
    th_compare_weights(what, a, b, exact, 1e-6, "k_proj.bias");
}

static void check_case(const char *dir, plan_kind_t pk, int K, eng_step_order_t order) {
    th_result_t one, two;
    run(dir, pk, K, 1, order, &one);
    run(dir, pk, K, 2, order, &two);
    char what[256];
    snprintf(what, sizeof what, "%s %s K=%d%s", th_base_name(dir), plan_name(pk), K,
             order == ENG_STEP_ORDER_LAYER ? " layer-major" : "");
    compare(what, &one, &two, K == 2);
    th_result_free(&one);
    th_result_free(&two);
}

static void check_refused(const char *dir) {
    mt_error_t err = {0};
    eng_run_config_t rc;
    TH_CHECK(th_run_config_load(dir, &rc, &err) == MT_OK, "%s", err.msg);
    kern_device_t *dev = th_cpu_device(0);
    eng_devices_t devs = {.count = 2, .ids = {0, 1}};
    eng_multi_t mm;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json};
    const mt_status_t st = eng_multi_open(&mm, dev, &devs, 3, rc.base_model, &mo, &err);
    TH_CHECK(st == MT_ERR_CONFIG && strstr(err.msg, "gradient_accumulation_steps (3)") && strstr(err.msg, "devices (2)"),
             "K=3 on 2 devices: status %d, '%s'", (int)st, err.msg);
    if (st == MT_OK) eng_multi_free(&mm);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
}

/* The tensors' bytes of a saved model.safetensors (after its header,
 * whose metadata carries a per-save id). */
static unsigned char *tensor_bytes(const char *dir, size_t *n) {
    char path[1200];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint64_t hl = 0;
    unsigned char *buf = NULL;
    if (fread(&hl, 8, 1, f) == 1 && fseek(f, 0, SEEK_END) == 0) {
        const long end = ftell(f);
        *n = (size_t)end - 8 - hl;
        buf = malloc(*n ? *n : 1);
        if (fseek(f, (long)(8 + hl), SEEK_SET) != 0 || fread(buf, 1, *n, f) != *n) {
            free(buf);
            buf = NULL;
        }
    }
    fclose(f);
    return buf;
}

/* moetune train end to end (engine/run/train.c) with devices: 1 and 2, K = 2:
 * the same losses and the same saved model, bit for bit. */
static void check_train(const char *dir) {
    const char *tmp = getenv("TEST_TMPDIR");
    char out[2][1024];
    double last[2] = {0, 0};
    for (int n = 1; n <= 2; n++) {
        mt_error_t err = {0};
        eng_run_config_t rc;
        TH_CHECK(th_run_config_load(dir, &rc, &err) == MT_OK, "%s", err.msg);
        snprintf(out[n - 1], sizeof out[n - 1], "%s/train-devices-%d", tmp ? tmp : "/tmp", n);
        snprintf(rc.output_dir, sizeof rc.output_dir, "%s", out[n - 1]);
        rc.gradient_accumulation_steps = 2;
        rc.max_steps = 4;
        rc.progress = false;
        rc.devices.count = n;
        eng_train_result_t res;
        const mt_status_t st = eng_train(&rc, &res, &err);
        TH_CHECK(st == MT_OK && res.steps_done == 4, "train on %d device(s): %s", n, err.msg);
        last[n - 1] = res.last_loss;
        eng_run_config_free(&rc);
    }
    TH_CHECK(last[0] == last[1], "moetune train: last loss %.17g on 1 device, %.17g on 2", last[0], last[1]);
    size_t n1 = 0, n2 = 0;
    unsigned char *a = tensor_bytes(out[0], &n1), *b = tensor_bytes(out[1], &n2);
    TH_CHECK(a && b && n1 == n2 && memcmp(a, b, n1) == 0, "moetune train: the saved models differ (%zu vs %zu bytes)", n1,
             n2);
    fprintf(stderr, "   moetune train, devices 1 vs 2, K=2: last loss %.9g, saved tensors %s\n", last[1],
            a && b && n1 == n2 && memcmp(a, b, n1) == 0 ? "identical" : "DIFFER");
    free(a);
    free(b);
}

int main(int argc, char **argv) {
    const int first = th_parse_compute(argc, argv, &g_compute);
    for (int a = first; a < argc; a++) {
        const char *dir = argv[a];
        fprintf(stderr, "== %s\n", dir);
        if (strstr(dir, "lora_")) {
            check_case(dir, PLAN_KEEP_ALL, 2, ENG_STEP_ORDER_AUTO);
            check_case(dir, PLAN_OFFLOAD_ALL, 2, ENG_STEP_ORDER_AUTO);
            continue;
        }
        for (int K = 2; K <= 4; K += 2) {
            check_case(dir, PLAN_KEEP_ALL, K, ENG_STEP_ORDER_AUTO);
            check_case(dir, PLAN_OFFLOAD_ALL, K, ENG_STEP_ORDER_AUTO);
            check_case(dir, PLAN_STREAM_DEVICE_GRADS, K, ENG_STEP_ORDER_AUTO);
        }
        /* each device runs its 2 micro-batches layer-major (engine/exec/layer_major.c), as does the one device its 4 */
        check_case(dir, PLAN_OFFLOAD_ALL, 4, ENG_STEP_ORDER_LAYER);
        check_case(dir, PLAN_STREAM_DEVICE_GRADS, 4, ENG_STEP_ORDER_LAYER);
        if (a == first) {
            check_refused(dir);
            if (g_compute == MT_F32) check_train(dir);
        }
    }
    return th_finish();
}
