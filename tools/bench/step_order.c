/* `moetune bench step --step-order [--accum K]`: layer-major against
 * micro-batch-major step order (engine/exec/layer_major.c) under
 * offload_all (weights streamed, gradients and optimizer on the host,
 * activations offloaded) on a throttled link, K micro-batches per step.
 *
 * The two orders run side by side as a paired comparison: one model per
 * order, each on its own CPU device with the same link, steps alternating
 * A B B A, and the ratio taken per pair of neighbouring steps, so that load
 * from other processes slows both members of a pair alike.  Beside the
 * measurements: each order's link bytes per step (the executor's counters,
 * metrics.jsonl's weight_h2d_bytes and grad_d2h_bytes) and the simulator's
 * prediction for each order on the profiled keep_all step. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/exec.h"
#include "tools/bench/step_bench_internal.h"
#include "base/clock.h"

typedef struct {
    runner_t run;
    double *t;
    uint64_t w_h2d, g_d2h, h2d, d2h; /* per step (the last measured) */
} order_run_t;

static bool order_step(order_run_t *q, int k, eng_step_order_t order, double *dt) {
    const eng_optim_hparams_t hp = {.lr = 1e-4, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .max_grad_norm = 0.0};
    mt_error_t err = {0};
    eng_micro_stats_t *ms = calloc((size_t)k, sizeof *ms);
    MT_CHECK_ALLOC(ms, "micro-batch statistics");
    const kern_device_stats_t before = kern_device_stats(q->run.dev);
    const double t0 = mt_now_s();
    eng_optim_begin_step(q->run.x, &hp, k, true);
    bool ok = eng_exec_step_from_loader(q->run.x, &q->run.ld, k, order, ms, &err) == MT_OK;
    eng_exec_staging_counters_t xc;
    eng_exec_staging_counters(q->run.x, &xc);
    eng_optim_stats_t os;
    ok = ok && eng_optim_step(q->run.x, &hp, &os, &err) == MT_OK;
    *dt = mt_now_s() - t0;
    free(ms);
    if (!ok) {
        fprintf(stderr, "bench step (%s order): %s\n", eng_step_order_name(order), err.msg);
        return false;
    }
    const kern_device_stats_t after = kern_device_stats(q->run.dev);
    q->w_h2d = xc.weight_h2d_bytes;
    q->g_d2h = xc.grad_d2h_bytes;
    q->h2d = after.h2d_bytes - before.h2d_bytes;
    q->d2h = after.d2h_bytes - before.d2h_bytes;
    return true;
}

int step_order_report(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep) {
    const int nb = o->layers + 2, K = o->accum > 0 ? o->accum : 8;
    const eng_step_order_t orders[2] = {ENG_STEP_ORDER_MICRO_BATCH, ENG_STEP_ORDER_LAYER};
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, nb, SCHED_POLICY_OFFLOAD_ALL);
    order_run_t r[2];
    memset(r, 0, sizeof r);
    bool ok = true;
    for (int i = 0; i < 2 && ok; i++) {
        ok = runner_init(&r[i].run, ckpt, o, &plan, link_bps, MOE_STAGING_COMPACT, MT_F32, o->batch * K * 2);
        r[i].t = calloc((size_t)o->steps, sizeof *r[i].t);
        MT_CHECK_ALLOC(r[i].t, "step times");
    }
    double *ratio = calloc((size_t)o->steps, sizeof *ratio);
    MT_CHECK_ALLOC(ratio, "ratios");
    for (int step = -1; step < o->steps && ok; step++) { /* step -1 warms both up */
        for (int k = 0; k < 2 && ok; k++) {
            const int i = step % 2 ? 1 - k : k; /* A B, B A, ... */
            double dt;
            ok = order_step(&r[i], K, orders[i], &dt);
            if (step >= 0) r[i].t[step] = dt;
        }
        if (ok && step >= 0) ratio[step] = r[0].t[step] / r[1].t[step];
    }
    /* the simulator's view: this run's keep_all profile, K micro-batches per step */
    predictor_t pr = {0};
    double pred[2] = {0, 0};
    if (ok) {
        opts_t ok_opts = *o;
        ok_opts.accum = K;
        predictor_init(&pr, ckpt, &ok_opts, link_bps, keep, keep->optim_s);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
        for (int i = 0; i < 2 && pr.ok; i++) {
            plan.layer_major = i == 1;
            pred[i] = predict(&pr, &plan);
        }
        predictor_free(&pr);
    }
    if (ok) {
        const double med[2] = {step_median(r[0].t, o->steps), step_median(r[1].t, o->steps)};
        const double paired = step_median(ratio, o->steps);
        if (o->json) {
            printf("{\"link_bytes_per_s\": %.6g, \"micro_batches\": %d, \"pairs\": %d, \"orders\": [", link_bps, K,
                   o->steps);
            for (int i = 0; i < 2; i++)
                printf("%s{\"order\": \"%s\", \"step_s\": %.6g, \"predicted_step_s\": %.6g, \"weight_h2d_bytes\": %llu,"
                       " \"grad_d2h_bytes\": %llu, \"h2d_bytes\": %llu, \"d2h_bytes\": %llu}",
                       i ? ", " : "", eng_step_order_name(orders[i]), med[i], pred[i],
                       (unsigned long long)r[i].w_h2d, (unsigned long long)r[i].g_d2h, (unsigned long long)r[i].h2d,
                       (unsigned long long)r[i].d2h);
            printf("], \"layer_speedup_paired\": %.4f, \"layer_speedup_predicted\": %.4f}\n", paired,
                   pred[1] > 0 ? pred[0] / pred[1] : 0);
        } else {
            printf("step order, offload_all on a %.3f GB/s + %.0f us link, %d micro-batches of %d x %d tokens per "
                   "step (%d paired steps, orders alternating A B B A):\n",
                   link_bps / 1e9, o->link_latency_us, K, o->batch, o->seq, o->steps);
            printf("  %-18s %10s %12s %9s %16s %16s\n", "order", "step ms", "predicted ms", "pred/meas",
                   "weights H2D MB", "gradients D2H MB");
            for (int i = 0; i < 2; i++)
                printf("  %-18s %10.2f %12.2f %9.3f %16.3f %16.3f\n", i ? "layer-major" : "micro-batch-major",
                       med[i] * 1e3, pred[i] * 1e3, med[i] > 0 ? pred[i] / med[i] : 0, r[i].w_h2d / 1e6,
                       r[i].g_d2h / 1e6);
            printf("  layer-major speed-up: %.3f measured (median of the pairs' micro-batch / layer ratios), %.3f "
                   "predicted\n",
                   paired, pred[1] > 0 ? pred[0] / pred[1] : 0);
            printf("  link bytes per step: weights %.2fx fewer, gradients %.2fx fewer\n",
                   r[1].w_h2d ? (double)r[0].w_h2d / (double)r[1].w_h2d : 0,
                   r[1].g_d2h ? (double)r[0].g_d2h / (double)r[1].g_d2h : 0);
        }
    }
    for (int i = 0; i < 2; i++) {
        runner_free(&r[i].run);
        free(r[i].t);
    }
    free(ratio);
    sched_plan_free(&plan);
    return ok ? 0 : 1;
}
