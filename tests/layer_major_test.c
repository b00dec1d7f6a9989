/* Layer-major step order (engine/exec/layer_major.c) against micro-batch-
 * major: for each reference fixture (Mixtral, Qwen2-MoE with a dense layer
 * and a shared expert, Qwen3-MoE), K = 1, 2 and 8 micro-batches per step,
 * in fp32 and in bf16 (--bf16), under resident (keep_all), streamed with
 * offloaded activations (offload_all, prefetch window 2), streamed with
 * recomputation (min_memory) and mixed per-block plans, two optimizer steps
 * in each order must give bit-identical losses, gradient norms and final
 * weights.  One pair runs with the host optimizer overlapping backward, and
 * two with copy streams lagging behind compute and stream-ordered frees.
 *
 * The point of the order is the link: for the streamed plans the test
 * checks the executor's counters (metrics.jsonl's weight_h2d_bytes and
 * grad_d2h_bytes) fall K-fold, within what MoE routing allows: layer-major
 * fetches the union of the experts the K micro-batches route to, where
 * micro-batch-major fetches each micro-batch's own.
 *
 * Layer-major with every decoder layer's block inputs offloaded (plan
 * lm_inputs OFFLOAD), K = 2 and 8 under the same four plans, and on the
 * lagging copy streams: bit-identical to the kept inputs, and the
 * counters show each micro-batch's input of each layer crossing the link
 * once each way (inputs_d2h_bytes, inputs_h2d_bytes). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "tests/harness.h"

static mt_dtype_t g_compute = MT_F32;

enum { STEPS = 2 };

typedef struct {
    th_result_t th; /* losses, gradient norms, final weights */
    uint64_t w_h2d[STEPS], g_d2h[STEPS];
    /* block inputs the step offloaded and fetched back, and what the plan and
     * the micro-batches' sizes say it should have: every offloading layer,
     * every micro-batch, its (tokens, hidden) fp32 residual in arena blocks */
    uint64_t in_d2h[STEPS], in_h2d[STEPS], in_want[STEPS];
    int overlapped;
    uint64_t deferred_frees; /* frees that went through the stream-ordered queue */
} result_t;

/* dopts: the CPU device's options (NULL: plain). */
static void run_on(const char *dir, const sched_plan_t *plan, int K, eng_step_order_t order, bool overlap,
                   const kern_device_opts_t *dopts, result_t *out) {
    memset(out, 0, sizeof *out);
    mt_error_t err = {0};
    eng_run_config_t rc;
    if (th_run_config_load(dir, &rc, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    kern_device_t *dev = NULL;
    kern_device_opts_t o = {0};
    if (dopts) o = *dopts;
    TH_CHECK(kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) == MT_OK, "%s", err.msg);
    eng_exec_t *x = NULL;
    const eng_model_opts_t mo = {.overrides_json = rc.model_config_json, .plan = plan, .compute = g_compute};
    if (eng_exec_open(&x, dev, rc.base_model, &mo, &err) != MT_OK) {
        TH_CHECK(0, "load: %s", err.msg);
        kern_device_destroy(dev);
        eng_run_config_free(&rc);
        return;
    }
    eng_dataset_t ds;
    TH_CHECK(th_dataset_load(&ds, &rc, eng_exec_model(x)->cfg.vocab_size, &err) == MT_OK, "%s", err.msg);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc.micro_batch_size, rc.shuffle, rc.seed);
    eng_micro_stats_t *ms = calloc((size_t)K, sizeof *ms);
    out->th.ok = true;
    for (int step = 0; step < STEPS && out->th.ok; step++) {
        eng_optim_hparams_t hp = th_hparams(&rc);
        if (overlap) hp.max_grad_norm = 0.0;
        eng_optim_begin_step(x, &hp, K, overlap);
        if (eng_exec_step_from_loader(x, &ld, K, order, ms, &err) != MT_OK) {
            TH_CHECK(0, "%s K=%d order %s step %d: %s", sched_policy_name(plan->policy), K, eng_step_order_name(order),
                     step + 1, err.msg);
            out->th.ok = false;
            break;
        }
        for (int j = 0; j < K; j++) out->th.loss[step] += ms[j].loss / K;
        eng_exec_staging_counters_t xc;
        eng_exec_staging_counters(x, &xc);
        out->w_h2d[step] = xc.weight_h2d_bytes;
        out->g_d2h[step] = xc.grad_d2h_bytes;
        out->in_d2h[step] = xc.inputs_d2h_bytes;
        out->in_h2d[step] = xc.inputs_h2d_bytes;
        const eng_model_config_t *mc = &eng_exec_model(x)->cfg;
        int layers = 0;
        for (int b = 1; b <= mc->num_hidden_layers; b++) layers += plan->blocks[b].lm_inputs == SCHED_INPUTS_OFFLOAD;
        for (int j = 0; order == ENG_STEP_ORDER_LAYER && K > 1 && j < K; j++) {
            const uint64_t raw = (uint64_t)ms[j].tokens * (uint64_t)mc->hidden_size * sizeof(float);
            out->in_want[step] += (uint64_t)layers * ((raw + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN);
        }
        eng_optim_stats_t os;
        if (eng_optim_step(x, &hp, &os, &err) != MT_OK) {
            TH_CHECK(0, "optimizer: %s", err.msg);
            out->th.ok = false;
        }
        out->th.norm[step] = os.grad_norm;
        out->overlapped += os.updated_during_backward;
    }
    free(ms);
    out->deferred_frees = kern_device_stats(dev).deferred_frees;
    th_result_read_weights(&out->th, x);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_exec_free(x);
    kern_device_destroy(dev);
    eng_run_config_free(&rc);
}

static void run(const char *dir, const sched_plan_t *plan, int K, eng_step_order_t order, bool overlap,
                result_t *out) {
    run_on(dir, plan, K, order, overlap, NULL, out);
}

static void compare(const char *what, const result_t *a, const result_t *b) {
    if (!a->th.ok || !b->th.ok) return;
    th_compare_steps(what, &a->th, &b->th, STEPS, true, 0);
    th_compare_weights(what, &a->th, &b->th, true, 0, NULL);
}

static void check_case(const char *dir) {
    fprintf(stderr, "== %s (%s)\n", dir, g_compute == MT_BF16 ? "bf16" : "fp32");
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

    sched_plan_t plans[4];
    const char *names[4] = {"keep_all", "offload_all", "min_memory", "mixed"};
    sched_plan_init_uniform(&plans[0], nb, SCHED_POLICY_KEEP_ALL);
    sched_plan_init_uniform(&plans[1], nb, SCHED_POLICY_OFFLOAD_ALL);
    sched_plan_init_uniform(&plans[2], nb, SCHED_POLICY_MIN_MEMORY);
    sched_plan_init_uniform(&plans[3], nb, SCHED_POLICY_KEEP_ALL);
    plans[1].prefetch_window = 2;
    const sched_block_plan_t kinds[] = {
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_DEVICE, SCHED_OPTIM_HOST, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, false},
        {SCHED_WEIGHTS_STREAM, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_KEEP, false, false, false, SCHED_INPUTS_KEEP, true, true},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_HOST, SCHED_OPTIM_HOST, SCHED_ACTS_RECOMPUTE, false, false, false, SCHED_INPUTS_KEEP, false, false},
        {SCHED_WEIGHTS_RESIDENT, SCHED_GRADS_DEVICE, SCHED_OPTIM_DEVICE, SCHED_ACTS_OFFLOAD, false, false, false, SCHED_INPUTS_KEEP, false, false},
    };
    for (int b = 0; b < nb; b++) plans[3].blocks[b] = kinds[b % 4];

    const int Ks[] = {1, 2, 8};
    for (int ki = 0; ki < 3; ki++) {
        const int K = Ks[ki];
        for (int p = 0; p < 4; p++) {
            result_t mb, lm;
            run(dir, &plans[p], K, ENG_STEP_ORDER_MICRO_BATCH, false, &mb);
            run(dir, &plans[p], K, ENG_STEP_ORDER_LAYER, false, &lm);
            char what[256];
            snprintf(what, sizeof what, "%s %s K=%d layer vs micro-batch order", dir, names[p], K);
            compare(what, &mb, &lm);
            if (mb.th.ok && lm.th.ok && (p == 1 || p == 2)) {
                /* step 2: step 1 also counts the placement's first fetches in some plans */
                const double rw = lm.w_h2d[1] ? (double)mb.w_h2d[1] / (double)lm.w_h2d[1] : 0;
                const double rg = lm.g_d2h[1] ? (double)mb.g_d2h[1] / (double)lm.g_d2h[1] : 0;
                fprintf(stderr,
                        "   %-11s K=%d weight H2D bytes/step %llu -> %llu (%.2fx), gradient D2H %llu -> %llu (%.2fx)\n",
                        names[p], K, (unsigned long long)mb.w_h2d[1], (unsigned long long)lm.w_h2d[1], rw,
                        (unsigned long long)mb.g_d2h[1], (unsigned long long)lm.g_d2h[1], rg);
                /* every dense weight falls exactly K-fold; experts fall by less only where the
                 * micro-batches route to different experts (their union moves once) */
                TH_CHECK(rw >= 0.75 * K, "%s: weight H2D bytes fell %.2fx, want about %dx", what, rw, K);
                TH_CHECK(rg >= 0.75 * K, "%s: gradient D2H bytes fell %.2fx, want about %dx", what, rg, K);
            }
            th_result_free(&mb.th);
            th_result_free(&lm.th);
        }
    }
    /* layer-major with every decoder layer's block inputs offloaded: the
     * same bits as kept (copies do not change them), and the inputs cross
     * the link both ways, every byte the plan says */
    sched_plan_t offl[4];
    for (int p = 0; p < 4; p++) {
        sched_plan_init_uniform(&offl[p], nb, SCHED_POLICY_KEEP_ALL);
        memcpy(offl[p].blocks, plans[p].blocks, (size_t)nb * sizeof *offl[p].blocks);
        offl[p].prefetch_window = plans[p].prefetch_window;
        offl[p].layer_major = true;
        for (int b = 1; b < nb - 1; b++) offl[p].blocks[b].lm_inputs = SCHED_INPUTS_OFFLOAD;
    }
    const int Kin[] = {2, 8};
    for (int ki = 0; ki < 2; ki++)
        for (int p = 0; p < 4; p++) {
            const int K = Kin[ki];
            result_t kept, off;
            run(dir, &plans[p], K, ENG_STEP_ORDER_LAYER, false, &kept);
            run(dir, &offl[p], K, ENG_STEP_ORDER_LAYER, false, &off);
            char what[256];
            snprintf(what, sizeof what, "%s %s K=%d layer order, block inputs offloaded vs kept", dir, names[p], K);
            compare(what, &kept, &off);
            for (int st = 0; kept.th.ok && off.th.ok && st < STEPS; st++) {
                TH_CHECK(kept.in_d2h[st] == 0 && kept.in_h2d[st] == 0, "%s: kept inputs moved %llu bytes", what,
                         (unsigned long long)kept.in_d2h[st]);
                TH_CHECK(off.in_want[st] > 0 && off.in_d2h[st] == off.in_want[st] && off.in_h2d[st] == off.in_want[st],
                         "%s step %d: block inputs D2H %llu, H2D %llu bytes, want %llu each", what, st + 1,
                         (unsigned long long)off.in_d2h[st], (unsigned long long)off.in_h2d[st],
                         (unsigned long long)off.in_want[st]);
            }
            if (off.th.ok && p == 0)
                fprintf(stderr, "   %-11s K=%d block inputs offloaded: %llu bytes D2H and %llu H2D per step\n",
                        names[p], K, (unsigned long long)off.in_d2h[1], (unsigned long long)off.in_h2d[1]);
            th_result_free(&kept.th);
            th_result_free(&off.th);
        }
    /* copy streams that lag behind compute (2 ms per copy, 50 MB/s) with
     * stream-ordered frees, as a GPU's: every cross-stream dependency of the
     * layer-major driver (activations fetched per micro-batch, device sums
     * of host-bound gradients freed while copies run) must be ordered */
    const kern_device_opts_t lag = {.link_h2d_bytes_per_s = 50e6, .link_d2h_bytes_per_s = 50e6,
                                    .link_latency_s = 2e-3, .stream_ordered_frees = true};
    for (int p = 1; p < 4; p += 2) {
        result_t mb, lm;
        run(dir, &plans[p], 2, ENG_STEP_ORDER_MICRO_BATCH, false, &mb);
        run_on(dir, &plans[p], 2, ENG_STEP_ORDER_LAYER, false, &lag, &lm);
        char what[256];
        snprintf(what, sizeof what, "%s %s K=2 layer order on lagging copy streams vs micro-batch order", dir, names[p]);
        compare(what, &mb, &lm);
        TH_CHECK(!lm.th.ok || lm.deferred_frees > 0, "%s: no free went through the stream-ordered queue", what);
        th_result_free(&lm.th);
        /* and with the block inputs offloaded: their D2H, H2D and frees ordered too */
        run_on(dir, &offl[p], 2, ENG_STEP_ORDER_LAYER, false, &lag, &lm);
        snprintf(what, sizeof what, "%s %s K=2 layer order, block inputs offloaded, on lagging copy streams", dir,
                 names[p]);
        compare(what, &mb, &lm);
        TH_CHECK(!lm.th.ok || lm.in_d2h[1] > 0, "%s: no block input offloaded", what);
        th_result_free(&mb.th);
        th_result_free(&lm.th);
    }
    for (int p = 0; p < 4; p++) sched_plan_free(&offl[p]);
    /* the host optimizer overlapping backward, without clipping */
    result_t a, b;
    run(dir, &plans[1], 2, ENG_STEP_ORDER_MICRO_BATCH, true, &a);
    run(dir, &plans[1], 2, ENG_STEP_ORDER_LAYER, true, &b);
    compare("offload_all K=2 with the overlapped host optimizer", &a, &b);
    TH_CHECK(!b.th.ok || b.overlapped > 0, "layer-major: no host AdamW ran during backward");
    th_result_free(&a.th);
    th_result_free(&b.th);
    for (int p = 0; p < 4; p++) sched_plan_free(&plans[p]);
}

int main(int argc, char **argv) {
    const int first = th_parse_compute(argc, argv, &g_compute);
    for (int i = first; i < argc; i++) check_case(argv[i]);
    if (th_failures()) {
        fprintf(stderr, "layer_major_test: %d failures\n", th_failures());
        return 1;
    }
    fprintf(stderr, "layer_major_test: layer-major bit-identical to micro-batch-major\n");
    return 0;
}
