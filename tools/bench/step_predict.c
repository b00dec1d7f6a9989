/* The planner's predictions for `moetune bench step` (see step_bench.c):
 * the cost model's workload with the profiled block times, the link sized
 * to the layers, and the simulator's step time for a plan. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/run/calibrate.h"
#include "engine/config/config.h"
#include "engine/model/desc/program.h"
#include "scheduler/simulate.h"
#include "tools/bench/step_bench_internal.h"

void predictor_init(predictor_t *p, const char *ckpt, const opts_t *o, double link_bps, const measure_t *prof,
                    double optim_s, bool bf16) {
    memset(p, 0, sizeof *p);
    mt_error_t err = {0};
    eng_model_config_t mc;
    if (eng_model_config_load(ckpt, NULL, &mc, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return;
    }
    eng_run_config_t rc;
    eng_run_config_defaults(&rc);
    rc.sequence_len = o->seq;
    rc.micro_batch_size = o->batch;
    rc.gradient_accumulation_steps = o->accum > 0 ? o->accum : 1;
    rc.max_grad_norm = 0;
    rc.link_gbps = link_bps / 1e9;
    rc.link_latency_us = o->link_latency_us;
    rc.compute_threads = o->compute_threads;
    sched_calibration_t *cal = &p->cal;
    sched_program_t prog = {0};
    sched_run_shape_t shape;
    eng_calibrate_attn_t attn;
    eng_calibrate_attn_of(&mc, &rc, bf16, &attn);
    if (eng_calibrate(&rc, &attn, NULL, cal, &err) != MT_OK || eng_program_describe(&mc, &rc, bf16, &prog, &shape, &err) != MT_OK ||
        sched_registry_build(&prog, &shape, &p->reg, &err) != MT_OK) {
        sched_program_free(&prog);
        fprintf(stderr, "bench step: %s\n", err.msg);
        eng_model_config_free(&mc);
        eng_run_config_free(&rc);
        return;
    }
    sched_program_free(&prog);
    sched_hw_from_calibration(cal, &p->hw);
    if (sched_workload_build(&p->reg, &p->hw, &p->w, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
    } else {
        double adam_model = 0;
        for (int b = 0; b < p->w.num_blocks; b++) adam_model += p->w.blocks[b].adam_device_s;
        const double adam_scale = adam_model > 0 ? optim_s / adam_model : 1.0;
        /* per-block means, scaled to the median step's compute (a step that
         * a neighbour's load slowed should not pull the profile up) */
        double mean = 0;
        for (int b = 0; b < p->w.num_blocks; b++) mean += prof->fwd_s[b] + prof->bwd_s[b];
        const double k = prof->compute_med_s > 0 && mean > 0 ? prof->compute_med_s / mean : 1.0;
        for (int b = 0; b < p->w.num_blocks; b++) {
            sched_block_cost_t *c = &p->w.blocks[b];
            c->fwd_s = prof->fwd_s[b] * k;
            c->bwd_s = prof->bwd_s[b] * k;
            c->recompute_s = prof->fwd_s[b] * k;
            c->adam_device_s *= adam_scale;
            c->adam_host_s = c->adam_device_s; /* the same kernel on this backend */
        }
        p->ok = true;
    }
    eng_model_config_free(&mc);
    eng_run_config_free(&rc);
}

void predictor_free(predictor_t *p) {
    if (!p->ok) return;
    sched_workload_free(&p->w);
    sched_registry_free(&p->reg);
    p->ok = false;
}

/* The slowest link under which every layer's offload_all transfers fit in
 * `fraction` of its compute (see step_bench.c). */
double layer_bound_link(const sched_workload_t *w, const measure_t *keep, double fraction, double latency_s) {
    double need = 0;
    for (int b = 1; b + 1 < w->num_blocks; b++) {
        const sched_block_cost_t *c = &w->blocks[b];
        const double off = c->act_saved_bytes - c->act_input_bytes;
        const struct {
            double bytes, copies, compute_s;
        } moves[4] = {
            {c->w_fetch_bytes, c->w_fetch_copies, keep->fwd_s[b]},                       /* forward H2D */
            {off, c->act_copies, keep->fwd_s[b]},                                        /* forward D2H */
            {c->w_fetch_bytes + off, c->w_fetch_copies + c->act_copies, keep->bwd_s[b]}, /* backward H2D */
            {c->grad_mb_bytes, c->grad_mb_copies, keep->bwd_s[b]},                       /* backward D2H */
        };
        for (int k = 0; k < 4; k++) {
            const double room = fraction * moves[k].compute_s - moves[k].copies * latency_s;
            if (moves[k].bytes <= 0) continue;
            const double bw = room > 0 ? moves[k].bytes / room : INFINITY;
            if (bw > need) need = bw;
        }
    }
    return need;
}

double predict(const predictor_t *p, const sched_plan_t *plan) {
    if (!p->ok) return 0;
    sched_sim_result_t r;
    mt_error_t err = {0};
    const sched_sim_opts_t so = {0};
    if (sched_simulate(&p->w, plan, &so, &r, &err) != MT_OK) {
        fprintf(stderr, "bench step: %s\n", err.msg);
        return 0;
    }
    const double t = r.step_time;
    sched_sim_result_free(&r);
    return t;
}

double predict_uniform(const predictor_t *p, int nb, sched_policy_t policy) {
    sched_plan_t plan;
    sched_plan_init_uniform(&plan, nb, policy);
    const double t = predict(p, &plan);
    sched_plan_free(&plan);
    return t;
}

