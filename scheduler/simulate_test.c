/* Simulator on workloads small enough to check by hand: two blocks with
 * known times.  Overlap makes the step the max of compute and copies, no
 * prefetch window makes it the sum; memory peaks follow the ring of
 * window + 1 buffers; host AdamW overlaps the backward without clipping
 * and follows it with clipping; recompute and offload cost what they say. */
#include "scheduler/simulate.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define EXPECT(c, ...)                                                                  \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            failures++;                                                                 \
        }                                                                               \
    } while (0)
/* times are sums of a few exact binary fractions; 1e-9 absorbs rounding */
#define NEAR(a, b) (fabs((a) - (b)) < 1e-9)

/* Two blocks, 1 byte/s links, no latency, nothing trainable unless asked. */
static void two_blocks(sched_workload_t *w, double fwd, double bwd, double fetch_bytes) {
    sched_workload_init(w, 2);
    w->h2d_bw = w->d2h_bw = 1.0;
    w->has_trainable = false;
    for (int b = 0; b < 2; b++) {
        w->blocks[b].fwd_s = fwd;
        w->blocks[b].bwd_s = bwd;
        w->blocks[b].recompute_s = fwd;
        w->blocks[b].w_fetch_bytes = fetch_bytes;
        w->blocks[b].w_resident_bytes = fetch_bytes;
        w->blocks[b].w_home_bytes = fetch_bytes;
    }
}

static void plan_all(sched_plan_t *p, sched_weight_place_t wp, sched_act_place_t a, int window) {
    if (p->blocks) sched_plan_free(p);
    sched_plan_init_uniform(p, 2, SCHED_POLICY_KEEP_ALL);
    for (int b = 0; b < 2; b++) p->blocks[b].weights = wp, p->blocks[b].acts = a;
    p->prefetch_window = window;
}

static double step(const sched_workload_t *w, const sched_plan_t *p, sched_sim_result_t *r) {
    mt_error_t err = {0};
    sched_sim_opts_t o = {.timelines = true, .tasks = true};
    mt_status_t st = sched_simulate(w, p, &o, r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    return st == MT_OK ? r->step_time : -1;
}

static void test_overlap(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    /* fetch 1 s, compute 3 s per use; uses F0 F1 B1 B0 all fetch */
    two_blocks(&w, 3, 3, 1);
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 0);
    EXPECT(NEAR(step(&w, &p, &r), 4 * (1 + 3)), "no window: fetch and compute add up: %g", r.step_time);
    EXPECT(NEAR(r.busy[SCHED_RES_H2D], 4) && NEAR(r.busy[SCHED_RES_COMPUTE], 12), "busy");
    EXPECT(NEAR(r.waited[SCHED_RES_H2D], 4) && NEAR(r.compute_idle, 4), "idle charged to h2d: %g", r.waited[1]);
    sched_sim_result_free(&r);
    p.prefetch_window = 1;
    /* window 1: only the first fetch is exposed: 1 + 4 * 3 */
    EXPECT(NEAR(step(&w, &p, &r), 13), "window 1: max, not sum: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_COMPUTE, "compute bound: %s", sched_resource_name(r.bottleneck));
    EXPECT(NEAR(r.h2d_bytes, 4), "four fetches: %g", r.h2d_bytes);
    sched_sim_result_free(&r);
    /* resident weights: no copies at all */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_KEEP, 1);
    EXPECT(NEAR(step(&w, &p, &r), 12) && NEAR(r.h2d_bytes, 0), "resident: %g", r.step_time);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);

    /* fetch 2 s, compute 1 s, window 1: the link bounds the step: 4 fetches + the last compute */
    two_blocks(&w, 1, 1, 2);
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    EXPECT(NEAR(step(&w, &p, &r), 9), "link bound: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_H2D, "h2d bound: %s", sched_resource_name(r.bottleneck));
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_memory(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    two_blocks(&w, 3, 3, 100);
    for (int b = 0; b < 2; b++) w.blocks[b].act_saved_bytes = 10, w.blocks[b].act_input_bytes = 4;
    /* window 1: at t=4 block 0's weights are freed, block 1's acts and the
     * backward fetch of block 1 allocated: two weight buffers + two acts */
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    step(&w, &p, &r);
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 220), "window 1 peak %g", r.peak[SCHED_MEM_DEVICE]);
    EXPECT(NEAR(r.peak[SCHED_MEM_HOST], 200) && NEAR(r.static_bytes[SCHED_MEM_HOST], 200), "home copies on the host");
    EXPECT(NEAR(r.peak[SCHED_MEM_PINNED], 100), "one copy in flight at a time: %g", r.peak[SCHED_MEM_PINNED]);
    EXPECT(r.timeline[SCHED_MEM_DEVICE].count > 2 &&
               NEAR(r.timeline[SCHED_MEM_DEVICE].pts[r.timeline[SCHED_MEM_DEVICE].count - 1].bytes, 0),
           "timeline ends at zero");
    sched_sim_result_free(&r);
    p.prefetch_window = 0;
    step(&w, &p, &r);
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 120), "window 0 peak %g", r.peak[SCHED_MEM_DEVICE]);
    sched_sim_result_free(&r);
    /* recompute: the backward re-runs the forward (3 s more per block); only inputs kept */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_RECOMPUTE, 1);
    EXPECT(NEAR(step(&w, &p, &r), 12 + 6), "recompute adds the forward: %g", r.step_time);
    EXPECT(NEAR(r.recompute_s, 6), "recompute %g", r.recompute_s);
    /* resident 200 + inputs 4 + 4, then the full set (10) of one block during its backward */
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 200 + 4 + 10), "recompute peak %g", r.peak[SCHED_MEM_DEVICE]);
    sched_sim_result_free(&r);
    /* offload: 10 B at 1 B/s each way; D2H after each forward, H2D before each backward */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_OFFLOAD, 1);
    step(&w, &p, &r);
    /* F0 [0,3] D2H0 [3,13]; F1 [3,6] D2H1 [13,23]; B1 fetch waits D2H1: [23,33], B1 [33,36];
     * B0 fetch [33,43] (slot gate: B1's fetch slot ... window 1), B0 [43,46] */
    EXPECT(NEAR(r.step_time, 46), "offload step %g", r.step_time);
    EXPECT(NEAR(r.d2h_bytes, 20) && NEAR(r.h2d_bytes, 20), "offload traffic %g / %g", r.d2h_bytes, r.h2d_bytes);
    EXPECT(NEAR(r.peak[SCHED_MEM_HOST] - r.static_bytes[SCHED_MEM_HOST], 20), "both blocks' acts on the host: %g",
           r.peak[SCHED_MEM_HOST]);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_host_optimizer(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    two_blocks(&w, 1, 1, 0);
    w.has_trainable = true;
    for (int b = 0; b < 2; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->grad_mb_bytes = c->grad_step_bytes = 1; /* 1 s D2H */
        c->grad_bytes = 1;
        c->optim_bytes = 3;
        c->grad_copy_host_s = 0.5;
        c->adam_host_s = 2;
        c->norm_host_s = 0.25;
    }
    sched_plan_init_uniform(&p, 2, SCHED_POLICY_KEEP_ALL);
    for (int b = 0; b < 2; b++) p.blocks[b].grads = SCHED_GRADS_HOST, p.blocks[b].optim = SCHED_OPTIM_HOST;
    /* no clipping: B1 [2,3] D2H [3,4] copy [4,4.5] adam [4.5,6.5]; B0 [3,4] D2H [4,5]
     * copy waits for the host: [6.5,7] adam [7,9] */
    w.clip = false;
    EXPECT(NEAR(step(&w, &p, &r), 9), "host AdamW overlapping the backward: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_HOST, "host bound: %s", sched_resource_name(r.bottleneck));
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_HOST], 2 * (3 + 1)), "optimizer state + gradient buffers on the host");
    sched_sim_result_free(&r);
    /* clipping: every gradient first ([5,5.5] the last copy), the norm [5.5,6], then adam [6,8] [8,10] */
    w.clip = true;
    EXPECT(NEAR(step(&w, &p, &r), 10), "host AdamW after the global norm: %g", r.step_time);
    sched_sim_result_free(&r);
    /* device optimizer: AdamW on the compute stream after the backward */
    for (int b = 0; b < 2; b++) {
        p.blocks[b].grads = SCHED_GRADS_DEVICE, p.blocks[b].optim = SCHED_OPTIM_DEVICE;
        w.blocks[b].adam_device_s = 0.5;
        w.blocks[b].norm_device_s = 0.125;
    }
    EXPECT(NEAR(step(&w, &p, &r), 4 + 0.25 + 1), "device norm + AdamW: %g", r.step_time);
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_DEVICE], 2 * (3 + 1)) && NEAR(r.d2h_bytes, 0), "state on the device");
    sched_sim_result_free(&r);
    /* the one invalid combination */
    p.blocks[1].grads = SCHED_GRADS_HOST;
    mt_error_t err = {0};
    EXPECT(sched_simulate(&w, &p, NULL, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "not a valid plan"), "%s",
           err.msg);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_grad_accumulation(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    two_blocks(&w, 1, 1, 1);
    w.grad_accum = 3;
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    step(&w, &p, &r);
    /* three micro-batches repeat the four uses: 12 fetches of 1 B, compute 12 s, one exposed fetch */
    EXPECT(NEAR(r.h2d_bytes, 12) && NEAR(r.busy[SCHED_RES_COMPUTE], 12), "micro-batches repeat fwd/bwd");
    EXPECT(NEAR(r.step_time, 13), "ga=3 step %g", r.step_time);
    int fwd_tasks = 0;
    for (int i = 0; i < r.num_tasks; i++) fwd_tasks += r.tasks[i].kind == SCHED_TASK_FWD;
    EXPECT(fwd_tasks == 6, "forward tasks %d", fwd_tasks);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

int main(void) {
    test_overlap();
    test_memory();
    test_host_optimizer();
    test_grad_accumulation();
    if (failures) fprintf(stderr, "simulate_test: %d failure(s)\n", failures);
    else printf("simulate_test: all passed\n");
    return failures != 0;
}
