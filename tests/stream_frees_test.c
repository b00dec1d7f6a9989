/* The executor under the CUDA backend's free policy, on the CPU backend.
 *
 * On a GPU the executor's frees are stream-ordered (kernels/arena_defer.h):
 * a freed buffer is reused only once every stream has passed the free, and
 * an allocation that only pending frees can satisfy waits for them.  No GPU
 * here, so this runs the executor on CPU devices created with
 * stream_ordered_frees and throttled copy streams (a per-copy latency, so
 * prefetches and offloads lag behind compute and frees really are pending
 * when the next allocations come), under the plans that stream weights,
 * offload activations and send gradients to the host.  Each must give
 * bit-identical losses, gradient norms and weights to keep_all on a plain
 * CPU device (the CPU backend's plan invariance), release every pending
 * free by the end, and, under a device budget below the weights, stay
 * within the budget by waiting for pending frees rather than failing.
 *
 * What this does not cover: the CPU compute stream runs inline, so frees
 * whose last user is a kernel are never pending here; that case is
 * tests/gpu/backend_test (ordered_frees) and train_cpu_vs_cuda_test. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/io/init_random.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "tests/harness.h"

enum { STEPS = 3 };

typedef struct {
    th_result_t th; /* losses, gradient norms, final weights */
    size_t weight_bytes;
    kern_device_stats_t stats; /* at the end, after the model's last drain */
    bool ok;
} result_t;

/* Three optimizer steps of the fixture in dir (checkpoint base_model when
 * given) under plan on a CPU device with options o. */
static void run(const char *dir, const char *base_model, const sched_plan_t *plan, const kern_device_opts_t *o,
                int overlap, result_t *out) {
    memset(out, 0, sizeof *out);
    mt_error_t err = {0};
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    if (base_model) snprintf(rc.base_model, sizeof rc.base_model, "%s", base_model);
    kern_device_t *dev = NULL;
    if (kern_device_create(KERN_BACKEND_CPU, o, &dev, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        eng_run_config_free(&rc);
        return;
    }
    eng_exec_t *x = NULL;
    if (eng_exec_load(&x, dev, rc.base_model, rc.model_config_json, plan, NULL, &err) != MT_OK) {
        TH_CHECK(0, "load under %s: %s", sched_policy_name(plan->policy), err.msg);
        kern_device_destroy(dev);
        eng_run_config_free(&rc);
        return;
    }
    eng_dataset_t ds;
    TH_CHECK(th_dataset_load(&ds, &rc, eng_exec_model(x)->cfg.vocab_size, &err) == MT_OK, "%s", err.msg);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
    kern_device_reset_peaks(dev);
    out->th.ok = true;
    for (int step = 0; step < STEPS && out->th.ok; step++) {
        const int accum = rc.gradient_accumulation_steps;
        eng_optim_hparams_t hp = th_hparams(&rc);
        if (overlap) hp.max_grad_norm = 0.0;
        eng_optim_begin_step(x, &hp, accum, overlap != 0);
        for (int mb = 0; mb < accum && out->th.ok; mb++) {
            eng_batch_t b;
            eng_loader_next(&ld, &b);
            eng_micro_stats_t ms;
            if (eng_exec_forward_backward(x, &b, 1.0f / accum, NULL, &ms, &err) != MT_OK) {
                TH_CHECK(0, "%s step %d: %s", sched_policy_name(plan->policy), step + 1, err.msg);
                out->th.ok = false;
            }
            out->th.loss[step] += ms.loss / accum;
        }
        eng_optim_stats_t os = {0};
        if (out->th.ok && eng_optim_step(x, &hp, &os, &err) != MT_OK) {
            TH_CHECK(0, "optimizer: %s", err.msg);
            out->th.ok = false;
        }
        out->th.norm[step] = os.grad_norm;
    }
    th_result_read_weights(&out->th, x); /* drains: nothing may stay pending */
    out->weight_bytes = th_result_bytes(&out->th);
    out->stats = kern_device_stats(dev);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_exec_free(x);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
}

static void compare(const char *what, const result_t *a, const result_t *b) {
    if (!a->th.ok || !b->th.ok) return;
    th_compare_steps(what, &a->th, &b->th, STEPS, true, 0);
    th_compare_weights(what, &a->th, &b->th, true, 0, NULL);
}

static void check_ordered(const char *what, const result_t *r) {
    if (!r->th.ok) return;
    const kern_device_stats_t *s = &r->stats;
    TH_CHECK(s->deferred_frees > 0, "%s: no free went through the stream-ordered queue", what);
    TH_CHECK(s->device_pending == 0, "%s: %zu bytes still pending after the final drain", what, s->device_pending);
    fprintf(stderr, "   %s: %llu stream-ordered frees, pending peak %zu bytes, %llu allocations waited, peak %zu\n",
            what, (unsigned long long)s->deferred_frees, s->device_pending_peak, (unsigned long long)s->free_waits,
            s->device_peak);
}

/* Copy streams that lag behind compute: 2 ms per copy, 50 MB/s. */
static kern_device_opts_t ordered_opts(size_t budget) {
    return (kern_device_opts_t){.device_budget_bytes = budget,
                                .link_h2d_bytes_per_s = 50e6,
                                .link_d2h_bytes_per_s = 50e6,
                                .link_latency_s = 2e-3,
                                .stream_ordered_frees = true};
}

static int num_blocks(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/ckpt", dir);
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_load(path, NULL, &cfg, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return -1;
    }
    const int nb = cfg.num_hidden_layers + 2;
    eng_model_config_free(&cfg);
    return nb;
}

static void check_case(const char *dir) {
    fprintf(stderr, "== %s\n", dir);
    const int nb = num_blocks(dir);
    if (nb < 0) return;
    sched_plan_t keep, off, minm, mixed;
    sched_plan_init_uniform(&keep, nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&off, nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&minm, nb, SCHED_POLICY_MIN_MEMORY);
    sched_plan_init_uniform(&mixed, nb, SCHED_POLICY_KEEP_ALL);
    off.prefetch_window = 2;
    const sched_block_plan_t kinds[] = {
        {SCHED_WEIGHTS_STREAM, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, false},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_DEVICE, SCHED_OPTIM_DEVICE, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, false},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_RECOMPUTE, false, false, false, SCHED_INPUTS_KEEP, false, false},
        {SCHED_WEIGHTS_STREAM, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_KEEP, false, false, false, SCHED_INPUTS_KEEP, false, false},
    };
    for (int b = 0; b < nb; b++) mixed.blocks[b] = kinds[b % 4];

    const kern_device_opts_t plain = {0}, ordered = ordered_opts(0);
    result_t rk, ro, rm, rx, rov;
    run(dir, NULL, &keep, &plain, 0, &rk);
    run(dir, NULL, &off, &ordered, 0, &ro);
    run(dir, NULL, &minm, &ordered, 0, &rm);
    run(dir, NULL, &mixed, &ordered, 0, &rx);
    compare("offload_all (stream-ordered frees) vs keep_all", &rk, &ro);
    compare("min_memory (stream-ordered frees) vs keep_all", &rk, &rm);
    compare("mixed (stream-ordered frees) vs keep_all", &rk, &rx);
    check_ordered("offload_all", &ro);
    check_ordered("min_memory", &rm);
    check_ordered("mixed", &rx);
    /* host AdamW overlapping backward, started from the D2H stream */
    result_t rk0;
    run(dir, NULL, &keep, &plain, 1, &rk0);
    run(dir, NULL, &off, &ordered, 1, &rov);
    compare("offload_all overlapped (stream-ordered frees) vs keep_all", &rk0, &rov);
    check_ordered("offload_all overlapped", &rov);
    th_result_free(&rk.th);
    th_result_free(&ro.th);
    th_result_free(&rm.th);
    th_result_free(&rx.th);
    th_result_free(&rk0.th);
    th_result_free(&rov.th);
    sched_plan_free(&keep);
    sched_plan_free(&off);
    sched_plan_free(&minm);
    sched_plan_free(&mixed);
}

/* A model whose weights dominate, under a budget of 3/4 of them: min_memory
 * fits only by reusing what it frees, so allocations meet pending frees. */
static void check_budget(const char *data_dir) {
    fprintf(stderr, "== device budget below the weights\n");
    const char *tmp = getenv("TEST_TMPDIR");
    char ckpt[1024];
    snprintf(ckpt, sizeof ckpt, "%s/stream-frees-ckpt", tmp ? tmp : "/tmp");
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
    const kern_device_opts_t plain = {0};
    result_t rk, rb;
    run(data_dir, ckpt, &keep, &plain, 0, &rk);
    const size_t budget = rk.weight_bytes * 3 / 4;
    const kern_device_opts_t ordered = ordered_opts(budget);
    run(data_dir, ckpt, &minm, &ordered, 0, &rb);
    TH_CHECK(rb.th.ok, "min_memory with stream-ordered frees under a %zu-byte budget (weights %zu bytes) failed", budget,
             rk.weight_bytes);
    TH_CHECK(rb.stats.device_peak <= budget, "peak device bytes %zu exceed the budget %zu", rb.stats.device_peak,
             budget);
    compare("min_memory under budget (stream-ordered frees) vs keep_all", &rk, &rb);
    check_ordered("min_memory under budget", &rb);
    th_result_free(&rk.th);
    th_result_free(&rb.th);
    sched_plan_free(&keep);
    sched_plan_free(&minm);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) check_case(argv[i]);
    if (argc > 1) check_budget(argv[1]);
    if (th_failures()) {
        fprintf(stderr, "stream_frees_test: %d failures\n", th_failures());
        return 1;
    }
    fprintf(stderr, "stream_frees_test: streamed plans with stream-ordered frees are bit-identical to keep_all\n");
    return 0;
}
