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
 * prediction for each order on the profiled keep_all step.
 *
 * A third run is layer-major with every decoder layer's block inputs
 * offloaded (plan lm_inputs OFFLOAD): its steps take turns with the other
 * two (the order rotating each step), with the inputs' bytes each way, its
 * prediction, and its final weights checked bit for bit against the kept
 * layer-major run's (the same batches, copies do not change bits). */
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
    uint64_t in_d2h, in_h2d;         /* block inputs offloaded / fetched back, per step */
} order_run_t;

enum { NRUNS = 3 }; /* micro-batch-major, layer-major, layer-major with block inputs offloaded */

/* Whether two runs' parameters are bit-identical (read back to the host). */
static bool same_weights(order_run_t *a, order_run_t *b) {
    eng_model_t *m = eng_exec_model(a->run.x);
    bool same = true;
    for (int i = 0; i < m->num_params && same; i++) {
        const size_t n = (size_t)m->params[i].spec->numel;
        float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
        MT_CHECK(x && y, "out of host memory comparing weights");
        eng_exec_read_param(a->run.x, i, x, false);
        eng_exec_read_param(b->run.x, i, y, false);
        same = memcmp(x, y, n * sizeof *x) == 0;
        free(x);
        free(y);
    }
    return same;
}

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
    q->in_d2h = xc.inputs_d2h_bytes;
    q->in_h2d = xc.inputs_h2d_bytes;
    q->h2d = after.h2d_bytes - before.h2d_bytes;
    q->d2h = after.d2h_bytes - before.d2h_bytes;
    return true;
}

int step_order_report(const char *ckpt, const opts_t *o, double link_bps, const measure_t *keep) {
    const int nb = o->layers + 2, K = o->accum > 0 ? o->accum : 8;
    const eng_step_order_t orders[NRUNS] = {ENG_STEP_ORDER_MICRO_BATCH, ENG_STEP_ORDER_LAYER, ENG_STEP_ORDER_LAYER};
    const char *names[NRUNS] = {"micro-batch-major", "layer-major", "layer, inputs off"};
    sched_plan_t plan[NRUNS];
    for (int i = 0; i < NRUNS; i++) {
        sched_plan_init_uniform(&plan[i], nb, SCHED_POLICY_OFFLOAD_ALL);
        plan[i].layer_major = i > 0;
        for (int b = 1; i == 2 && b < nb - 1; b++) plan[i].blocks[b].lm_inputs = SCHED_INPUTS_OFFLOAD;
    }
    order_run_t r[NRUNS];
    memset(r, 0, sizeof r);
    bool ok = true;
    for (int i = 0; i < NRUNS && ok; i++) {
        ok = runner_init(&r[i].run, ckpt, o, &plan[i], link_bps, MOE_STAGING_COMPACT, MT_F32, o->batch * K * 2);
        r[i].t = calloc((size_t)o->steps, sizeof *r[i].t);
        MT_CHECK_ALLOC(r[i].t, "step times");
    }
    double *ratio = calloc((size_t)o->steps, sizeof *ratio);
    MT_CHECK_ALLOC(ratio, "ratios");
    for (int step = -1; step < o->steps && ok; step++) { /* step -1 warms all up */
        for (int k = 0; k < NRUNS && ok; k++) {
            /* the order of the runs rotates every step, and turns round every other one */
            const int rot = (k + (step + 3) / 2) % NRUNS, i = step % 2 ? NRUNS - 1 - rot : rot;
            double dt;
            ok = order_step(&r[i], K, orders[i], &dt);
            if (step >= 0) r[i].t[step] = dt;
        }
        if (ok && step >= 0) ratio[step] = r[0].t[step] / r[1].t[step];
    }
    const bool same = ok && same_weights(&r[1], &r[2]);
    /* the simulator's view: this run's keep_all profile, K micro-batches per step */
    predictor_t pr = {0};
    double pred[NRUNS] = {0, 0, 0};
    if (ok) {
        opts_t ok_opts = *o;
        ok_opts.accum = K;
        predictor_init(&pr, ckpt, &ok_opts, link_bps, keep, keep->optim_s, false);
        pr.w.h2d_bw = pr.w.d2h_bw = link_bps;
        for (int i = 0; i < NRUNS && pr.ok; i++) pred[i] = predict(&pr, &plan[i]);
        predictor_free(&pr);
    }
    if (ok) {
        double med[NRUNS];
        for (int i = 0; i < NRUNS; i++) med[i] = step_median(r[i].t, o->steps);
        const double paired = step_median(ratio, o->steps);
        if (o->json) {
            printf("{\"link_bytes_per_s\": %.6g, \"micro_batches\": %d, \"pairs\": %d, \"orders\": [", link_bps, K,
                   o->steps);
            for (int i = 0; i < NRUNS; i++)
                printf("%s{\"order\": \"%s\", \"block_inputs\": \"%s\", \"step_s\": %.6g, \"predicted_step_s\": %.6g,"
                       " \"weight_h2d_bytes\": %llu, \"grad_d2h_bytes\": %llu, \"h2d_bytes\": %llu, \"d2h_bytes\": %llu,"
                       " \"input_d2h_bytes\": %llu, \"input_h2d_bytes\": %llu}",
                       i ? ", " : "", eng_step_order_name(orders[i]), i == 2 ? "offload" : "keep", med[i], pred[i],
                       (unsigned long long)r[i].w_h2d, (unsigned long long)r[i].g_d2h, (unsigned long long)r[i].h2d,
                       (unsigned long long)r[i].d2h, (unsigned long long)r[i].in_d2h, (unsigned long long)r[i].in_h2d);
            printf("], \"layer_speedup_paired\": %.4f, \"layer_speedup_predicted\": %.4f,"
                   " \"inputs_offloaded_bit_identical\": %s}\n",
                   paired, pred[1] > 0 ? pred[0] / pred[1] : 0, same ? "true" : "false");
        } else {
            printf("step order, offload_all on a %.3f GB/s + %.0f us link, %d micro-batches of %d x %d tokens per "
                   "step (%d steps each, the runs' order rotating):\n",
                   link_bps / 1e9, o->link_latency_us, K, o->batch, o->seq, o->steps);
            printf("  %-18s %10s %12s %9s %16s %16s %16s\n", "order", "step ms", "predicted ms", "pred/meas",
                   "weights H2D MB", "gradients D2H MB", "inputs D2H MB");
            for (int i = 0; i < NRUNS; i++)
                printf("  %-18s %10.2f %12.2f %9.3f %16.3f %16.3f %16.3f\n", names[i], med[i] * 1e3, pred[i] * 1e3,
                       med[i] > 0 ? pred[i] / med[i] : 0, r[i].w_h2d / 1e6, r[i].g_d2h / 1e6, r[i].in_d2h / 1e6);
            printf("  layer-major speed-up: %.3f measured (median of the steps' micro-batch / layer ratios), %.3f "
                   "predicted\n",
                   paired, pred[1] > 0 ? pred[0] / pred[1] : 0);
            printf("  link bytes per step: weights %.2fx fewer, gradients %.2fx fewer\n",
                   r[1].w_h2d ? (double)r[0].w_h2d / (double)r[1].w_h2d : 0,
                   r[1].g_d2h ? (double)r[0].g_d2h / (double)r[1].g_d2h : 0);
            printf("  block inputs offloaded: %.3f MB D2H and %.3f MB H2D per step; final weights %s the kept "
                   "layer-major run's\n",
                   r[2].in_d2h / 1e6, r[2].in_h2d / 1e6, same ? "bit-identical to" : "DIFFER from");
        }
    }
    for (int i = 0; i < NRUNS; i++) {
        runner_free(&r[i].run);
        free(r[i].t);
        sched_plan_free(&plan[i]);
    }
    free(ratio);
    return ok && same ? 0 : 1;
}
