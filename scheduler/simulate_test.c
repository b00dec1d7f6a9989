/* Simulator on workloads small enough to check by hand: three blocks with
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

/* Three blocks (embedding, one layer, head), 1 byte/s links, no latency,
 * nothing trainable unless asked. */
static void blocks3(sched_workload_t *w, double fwd, double bwd, double fetch_bytes) {
    sched_workload_init(w, 3);
    w->h2d_bw = w->d2h_bw = 1.0;
    w->has_trainable = false;
    for (int b = 0; b < 3; b++) {
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
    sched_plan_init_uniform(p, 3, SCHED_POLICY_OFFLOAD_ALL); /* grads and optimizer on the host */
    for (int b = 0; b < 3; b++) p->blocks[b].weights = wp, p->blocks[b].acts = a;
    p->prefetch_window = window;
}

static double step(const sched_workload_t *w, const sched_plan_t *p, sched_sim_result_t *r) {
    mt_error_t err = {0};
    sched_sim_opts_t o = {.timelines = true, .tasks = true};
    mt_status_t st = sched_simulate(w, p, &o, r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    return st == MT_OK ? r->step_time : -1;
}

/* Uses: F0 F1 F2(head) B2(head, weights kept from F2) B1 B0: six computes; five fetches without a
 * window, four with one (the last layer keeps its weights across the turn, exec_turn_held). */
static void test_overlap(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    /* fetch 1 s, compute 3 s */
    blocks3(&w, 3, 3, 1);
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 0);
    EXPECT(NEAR(step(&w, &p, &r), 5 * 1 + 6 * 3), "no window: fetches and computes add up: %g", r.step_time);
    EXPECT(NEAR(r.busy[SCHED_RES_H2D], 5) && NEAR(r.busy[SCHED_RES_COMPUTE], 18), "busy");
    EXPECT(NEAR(r.waited[SCHED_RES_H2D], 5) && NEAR(r.compute_idle, 5), "idle charged to h2d: %g", r.waited[1]);
    sched_sim_result_free(&r);
    p.prefetch_window = 1;
    /* window 1: only the first fetch is exposed: 1 + 6 * 3 */
    EXPECT(NEAR(step(&w, &p, &r), 19), "window 1: max, not sum: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_COMPUTE, "compute bound: %s", sched_resource_name(r.bottleneck));
    EXPECT(NEAR(r.h2d_bytes, 4), "four fetches (the head and, at the turn, the layer keep theirs): %g", r.h2d_bytes);
    sched_sim_result_free(&r);
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_KEEP, 1);
    EXPECT(NEAR(step(&w, &p, &r), 18) && NEAR(r.h2d_bytes, 0), "resident: %g", r.step_time);
    sched_sim_result_free(&r);
    sched_workload_free(&w);

    /* fetch 3 s, compute 1 s, window 1: the link bounds the step
     * (F: f0 [0,3] c0 [3,4], f1 [3,6] c1 [6,7], f2 [6,9] c2 [9,10];
     *  B: head [10,11], the layer (held) [11,12], f0 [11,14] c [14,15]);
     * compute waits 3 + 2 + 2 + 2 s for the link */
    blocks3(&w, 1, 1, 3);
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    EXPECT(NEAR(step(&w, &p, &r), 15), "link bound: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_H2D && NEAR(r.waited[SCHED_RES_H2D], 9), "h2d bound: %s, waited %g",
           sched_resource_name(r.bottleneck), r.waited[SCHED_RES_H2D]);
    sched_sim_result_free(&r);
    sched_workload_free(&w);

    /* fetch 2 s, compute 1 s: compute (6 s busy) waits less than that on
     * the link, but the link is busy longer than compute: the link bounds
     * the step, not compute */
    blocks3(&w, 1, 1, 2);
    step(&w, &p, &r);
    EXPECT(r.waited[SCHED_RES_H2D] < r.busy[SCHED_RES_COMPUTE] && r.busy[SCHED_RES_COMPUTE] < r.busy[SCHED_RES_H2D],
           "the case: waited %g, compute busy %g, link busy %g", r.waited[SCHED_RES_H2D], r.busy[SCHED_RES_COMPUTE],
           r.busy[SCHED_RES_H2D]);
    EXPECT(r.bottleneck == SCHED_RES_H2D, "busier link bound: %s", sched_resource_name(r.bottleneck));
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Host interference (the CPU backend): compute slows by the host cores' busy share. */
static void test_interference(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 3, 3, 1);
    w.compute_interference = 1.0;
    w.host_copy_s_per_byte = 0.5;
    /* first pass as in test_overlap: 19 s with 4 B fetched; the host copies
     * for 4 x 0.5 = 2 s of them, so compute runs 1 + 2/19 times as long and
     * the fetches stay hidden: 1 + 18 x 21/19 */
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    EXPECT(fabs(step(&w, &p, &r) - (1 + 18.0 * 21 / 19)) < 1e-9, "interference step %g", r.step_time);
    EXPECT(fabs(r.compute_stretch - 21.0 / 19) < 1e-12, "stretch %g", r.compute_stretch);
    sched_sim_result_free(&r);
    /* resident: nothing crosses, nothing slows */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_KEEP, 1);
    EXPECT(NEAR(step(&w, &p, &r), 18) && r.compute_stretch == 1.0, "resident %g x%g", r.step_time, r.compute_stretch);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_memory(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 3, 3, 100);
    for (int b = 0; b < 3; b++) w.blocks[b].act_saved_bytes = 10, w.blocks[b].act_input_bytes = 4;
    /* window 1: at t=10 the head's weights (kept for its backward), layer 1's
     * backward fetch (issued at the phase start) and all three saved sets */
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    step(&w, &p, &r);
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 230), "window 1 peak %g", r.peak[SCHED_MEM_DEVICE]);
    EXPECT(NEAR(r.peak[SCHED_MEM_HOST], 300) && NEAR(r.static_bytes[SCHED_MEM_HOST], 300), "home copies on the host");
    EXPECT(NEAR(r.peak[SCHED_MEM_PINNED], 100), "one copy in flight at a time: %g", r.peak[SCHED_MEM_PINNED]);
    const sched_timeline_t *tl = &r.timeline[SCHED_MEM_DEVICE];
    EXPECT(tl->count > 2 && NEAR(tl->pts[tl->count - 1].bytes, 0), "timeline ends at zero");
    sched_sim_result_free(&r);
    p.prefetch_window = 0;
    step(&w, &p, &r);
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 130), "window 0 peak %g", r.peak[SCHED_MEM_DEVICE]);
    sched_sim_result_free(&r);
    /* recompute: the layer's backward re-runs its forward (3 s) and only its
     * input is kept; the embedding and the head keep theirs (as the executor does) */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_RECOMPUTE, 1);
    EXPECT(NEAR(step(&w, &p, &r), 18 + 3), "recompute adds the forward: %g", r.step_time);
    EXPECT(NEAR(r.recompute_s, 3), "recompute %g", r.recompute_s);
    EXPECT(NEAR(r.peak[SCHED_MEM_DEVICE], 300 + 10 + 4 + 10), "recompute peak %g", r.peak[SCHED_MEM_DEVICE]);
    sched_sim_result_free(&r);
    /* offload with a window of 1: the only layer is the last, held across
     * the turn: nothing moves */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_OFFLOAD, 1);
    EXPECT(NEAR(step(&w, &p, &r), 18) && NEAR(r.d2h_bytes, 0) && NEAR(r.h2d_bytes, 0),
           "the turn keeps the last layer's activations: %g s, %g / %g B", r.step_time, r.d2h_bytes, r.h2d_bytes);
    EXPECT(NEAR(r.peak[SCHED_MEM_PINNED], 0), "nothing pinned: %g", r.peak[SCHED_MEM_PINNED]);
    sched_sim_result_free(&r);
    /* offload without a window (the layer only): 6 B (10 saved - 4 input) at
     * 1 B/s each way.  F: c0 [0,3], c1 [3,6] d2h [6,12], c2 [6,9]; B: head
     * [9,12], the layer's fetch waits for its d2h: [12,18], c [18,21]; c0 [21,24] */
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_OFFLOAD, 0);
    EXPECT(NEAR(step(&w, &p, &r), 24), "offload step %g", r.step_time);
    EXPECT(NEAR(r.waited[SCHED_RES_H2D], 6), "the layer's backward waits 6 s for its activations: %g",
           r.waited[SCHED_RES_H2D]);
    EXPECT(NEAR(r.d2h_bytes, 6) && NEAR(r.h2d_bytes, 6), "offload traffic %g / %g", r.d2h_bytes, r.h2d_bytes);
    /* the offloaded set held in pinned memory plus its fetch in flight */
    EXPECT(NEAR(r.peak[SCHED_MEM_PINNED], 12), "pinned peak %g", r.peak[SCHED_MEM_PINNED]);
    /* resident weights keep their home copies on the host (the host model
     * a save writes); the offloaded activations are pinned, not pageable */
    EXPECT(NEAR(r.peak[SCHED_MEM_HOST], 300), "only the home copies pageable: %g", r.peak[SCHED_MEM_HOST]);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_host_optimizer(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 1, 1, 0);
    w.has_trainable = true;
    for (int b = 0; b < 3; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->grad_mb_bytes = c->grad_step_bytes = 1; /* 1 s D2H */
        c->grad_bytes = 1;
        c->optim_bytes = 3;
        c->adam_host_s = 3;
        c->norm_host_s = 0.25;
    }
    sched_plan_init_uniform(&p, 3, SCHED_POLICY_KEEP_ALL);
    for (int b = 0; b < 3; b++) p.blocks[b].grads = SCHED_GRADS_HOST, p.blocks[b].optim = SCHED_OPTIM_HOST;
    /* no clipping: each block's norm share on the host worker as its gradients land,
     * then its update: B2 [3,4] d2h [4,5] norm [5,5.25] adam [5.25,8.25]; B1 [4,5] d2h
     * [5,6] norm [8.25,8.5] adam [8.5,11.5]; B0 [5,6] d2h [6,7] norm [11.5,11.75] adam [11.75,14.75] */
    w.clip = false;
    EXPECT(NEAR(step(&w, &p, &r), 14.75), "host AdamW overlapping the backward: %g", r.step_time);
    EXPECT(r.bottleneck == SCHED_RES_HOST, "host bound: %s", sched_resource_name(r.bottleneck));
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_HOST], 3 * (3 + 1)), "optimizer state + gradient buffers on the host");
    sched_sim_result_free(&r);
    /* clipping: the norm shares as the gradients land [5,5.25] [6,6.25] [7,7.25], then
     * three AdamW in a row */
    w.clip = true;
    EXPECT(NEAR(step(&w, &p, &r), 16.25), "host AdamW after the global norm: %g", r.step_time);
    sched_sim_result_free(&r);
    /* several devices sum their gradients after the backward: the whole norm [7,7.75] then */
    const sched_sim_opts_t in_step = {.updates_in_step = true};
    mt_error_t serr = {0};
    EXPECT(sched_simulate(&w, &p, &in_step, &r, &serr) == MT_OK && NEAR(r.step_time, 16.75),
           "the norm after the backward: %g", r.step_time);
    sched_sim_result_free(&r);
    /* clipping, speculative: the overlapped timeline again, with the spare state's
     * bytes on the host (its write-allocate reads are in adam_host_s, set by the cost model) */
    w.clip = false, w.speculative = true;
    for (int b = 0; b < 3; b++) w.blocks[b].spec_copy_bytes = 2;
    EXPECT(NEAR(step(&w, &p, &r), 14.75), "speculative host AdamW overlapping the backward: %g", r.step_time);
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_HOST], 3 * (3 + 2 + 1)), "optimizer state, spare state, gradient buffers");
    /* a landed norm share goes ahead of the updates piled up on the worker:
     * B0's (landed at 7) runs [8.5,8.75], after B1's, before B1's update */
    double norm0_end = -1;
    for (int i = 0; i < r.num_tasks; i++)
        if (r.tasks[i].kind == SCHED_TASK_NORM && r.tasks[i].block == 0) norm0_end = r.tasks[i].end;
    EXPECT(NEAR(norm0_end, 8.75), "block 0's norm share ahead of block 1's update: ends at %g", norm0_end);
    sched_sim_result_free(&r);
    /* ... but not with the optimizer state on the NVMe tier, which the executor runs without speculation */
    p.blocks[1].nvme_optim = true;
    EXPECT(sched_waits_for_norm(&w, &p), "speculation with the NVMe tier waits for the norm");
    p.blocks[1].nvme_optim = false;
    for (int b = 0; b < 3; b++) w.blocks[b].spec_copy_bytes = 0;
    w.clip = true, w.speculative = false;
    /* device optimizer: norm and AdamW on the compute stream after the backward */
    for (int b = 0; b < 3; b++) {
        p.blocks[b].grads = SCHED_GRADS_DEVICE, p.blocks[b].optim = SCHED_OPTIM_DEVICE;
        w.blocks[b].adam_device_s = 0.5;
        w.blocks[b].norm_device_s = 0.125;
    }
    EXPECT(NEAR(step(&w, &p, &r), 6 + 3 * 0.125 + 3 * 0.5), "device norm + AdamW: %g", r.step_time);
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_DEVICE], 3 * (3 + 1)) && NEAR(r.d2h_bytes, 0), "state on the device");
    sched_sim_result_free(&r);
    /* resident weights with a host optimizer: gradients D2H, AdamW, weights H2D, block by block */
    for (int b = 0; b < 3; b++) {
        p.blocks[b].optim = SCHED_OPTIM_HOST;
        w.blocks[b].grad_step_copies = 0;
        w.blocks[b].w_update_bytes = 0.5;
    }
    EXPECT(NEAR(step(&w, &p, &r), 6 + 3 * 0.125 + 3 * (1 + 3 + 0.5)), "device grads, host AdamW: %g", r.step_time);
    EXPECT(NEAR(r.d2h_bytes, 3) && NEAR(r.h2d_bytes, 1.5), "gradients down, weights up");
    sched_sim_result_free(&r);
    /* plans the executor cannot run */
    mt_error_t err = {0};
    p.blocks[1].optim = SCHED_OPTIM_DEVICE;
    p.blocks[1].grads = SCHED_GRADS_HOST;
    EXPECT(sched_simulate(&w, &p, NULL, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "not a valid plan"), "%s",
           err.msg);
    p.blocks[1].grads = SCHED_GRADS_DEVICE;
    p.blocks[1].weights = SCHED_WEIGHTS_STREAM;
    EXPECT(sched_simulate(&w, &p, NULL, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "resident weights"), "%s",
           err.msg);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Clipping with streamed blocks whose gradients and AdamW state are on the
 * host: each block's update runs on into the next step, and the next step
 * waits only where a block's first forward would come before its update
 * (plus its fetch).  Three blocks, 1 s compute uses, 0.5 s fetches, window
 * 1, AdamW 3 s each after the norm. */
static void test_step_boundary(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 1, 1, 0.5);
    w.has_trainable = true;
    w.clip = true;
    for (int b = 0; b < 3; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->grad_mb_bytes = c->grad_step_bytes = 1; /* 1 s D2H */
        c->grad_bytes = 1;
        c->optim_bytes = 3;
        c->adam_host_s = 3;
        c->norm_host_s = 0.25;
    }
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    mt_error_t err = {0};
    sched_sim_opts_t in_step = {.updates_in_step = true};
    EXPECT(sched_simulate(&w, &p, &in_step, &r, &err) == MT_OK, "%s", err.msg);
    const double all_in_step = r.step_time;
    sched_sim_result_free(&r);
    /* blocks 0 and 1 (<= the window) are waited for at the step's end, the
     * head's update runs on: the step ends 3 s sooner, unless the head's
     * first forward comes earlier than its update and fetch allow (and the
     * norm shares of the blocks whose gradients land first were taken
     * during the backward, which one device does) */
    const double t = step(&w, &p, &r);
    double head_fwd = -1, norm_end = 0;
    for (int i = 0; i < r.num_tasks; i++) {
        if (r.tasks[i].kind == SCHED_TASK_FWD && r.tasks[i].block == 2 && head_fwd < 0) head_fwd = r.tasks[i].start;
        if (r.tasks[i].kind == SCHED_TASK_NORM && r.tasks[i].end > norm_end) norm_end = r.tasks[i].end;
    }
    const double in_step_end = norm_end + 6, head_update = norm_end + 9;
    const double want = fmax(in_step_end, head_update + 0.5 - head_fwd);
    EXPECT(NEAR(t, want) && t < all_in_step, "updates into the next step: %g (want %g, all in the step %g)", t,
           want, all_in_step);
    printf("step boundary: %g s with updates into the next step, %g s all in the step (head's first forward at %g)\n",
           t, all_in_step, head_fwd);
    sched_sim_result_free(&r);
    /* a window of 2 prefetches every block at the step end: nothing runs on;
     * the one device's step is shorter only by the norm shares of the two
     * blocks whose gradients land first */
    p.prefetch_window = 2;
    EXPECT(sched_simulate(&w, &p, &in_step, &r, &err) == MT_OK, "%s", err.msg);
    const double w2_in_step = r.step_time;
    sched_sim_result_free(&r);
    EXPECT(NEAR(step(&w, &p, &r), w2_in_step - 2 * 0.25), "window 2: %g vs %g", r.step_time, w2_in_step);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static void test_grad_accumulation(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 1, 1, 1);
    w.grad_accum = 3;
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    step(&w, &p, &r);
    /* each micro-batch: 4 fetches, 6 computes, 7 s (the first fetch of each forward exposed) */
    EXPECT(NEAR(r.h2d_bytes, 12) && NEAR(r.busy[SCHED_RES_COMPUTE], 18), "micro-batches repeat fwd/bwd");
    EXPECT(NEAR(r.step_time, 21), "ga=3 step %g", r.step_time);
    int fwd_tasks = 0;
    for (int i = 0; i < r.num_tasks; i++) fwd_tasks += r.tasks[i].kind == SCHED_TASK_FWD;
    EXPECT(fwd_tasks == 9, "forward tasks %d", fwd_tasks);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Past 16 micro-batches the simulator extrapolates the repeating ones: the
 * result must equal a simulation of every micro-batch, for streamed,
 * offloaded and host-optimizer plans, with and without clipping and
 * interference; and the largest accepted gradient_accumulation_steps
 * (10^6) must simulate at once, without overflow. */
static void test_many_micro_batches(void) {
    const sched_act_place_t acts[3] = {SCHED_ACTS_KEEP, SCHED_ACTS_OFFLOAD, SCHED_ACTS_RECOMPUTE};
    for (int a = 0; a < 3; a++)
        for (int clip = 0; clip < 2; clip++) {
            sched_workload_t w;
            sched_plan_t p = {0};
            blocks3(&w, 1, 2, 1.5);
            w.has_trainable = true;
            w.clip = clip;
            w.compute_interference = clip ? 0.25 : 0;
            w.host_copy_s_per_byte = 0.1;
            for (int b = 0; b < 3; b++) {
                w.blocks[b].grad_bytes = 0.5;
                w.blocks[b].grad_mb_bytes = 0.5;
                w.blocks[b].grad_mb_copies = 1;
                w.blocks[b].grad_add_host_s = 0.125;
                w.blocks[b].optim_bytes = 2;
                w.blocks[b].adam_host_s = 0.5;
                w.blocks[b].act_saved_bytes = 0.75;
                w.blocks[b].act_input_bytes = 0.25;
                w.blocks[b].act_copies = 1;
            }
            plan_all(&p, SCHED_WEIGHTS_STREAM, acts[a], 1);
            w.grad_accum = 41;
            mt_error_t err = {0};
            sched_sim_result_t ex, full;
            sched_sim_opts_t o_full = {.every_micro_batch = true};
            EXPECT(sched_simulate(&w, &p, NULL, &ex, &err) == MT_OK, "%s", err.msg);
            EXPECT(sched_simulate(&w, &p, &o_full, &full, &err) == MT_OK, "%s", err.msg);
            const double tol = 1e-9 * full.step_time;
            EXPECT(fabs(ex.step_time - full.step_time) <= tol && fabs(ex.h2d_bytes - full.h2d_bytes) <= 1e-9 * full.h2d_bytes &&
                       fabs(ex.busy[SCHED_RES_COMPUTE] - full.busy[SCHED_RES_COMPUTE]) <= tol,
                   "acts %d clip %d: extrapolated step %.17g s, h2d %.17g vs simulated %.17g s, %.17g", a, clip,
                   ex.step_time, ex.h2d_bytes, full.step_time, full.h2d_bytes);
            for (int m = 0; m < SCHED_MEM_COUNT; m++)
                EXPECT(ex.peak[m] == full.peak[m], "acts %d clip %d: peak %d %g vs %g", a, clip, m, ex.peak[m],
                       full.peak[m]);
            sched_sim_result_free(&ex);
            sched_sim_result_free(&full);
            w.grad_accum = 1000000;
            EXPECT(sched_simulate(&w, &p, NULL, &ex, &err) == MT_OK && isfinite(ex.step_time) && ex.step_time > 1e6,
                   "ga=10^6: step %g", ex.step_time);
            sched_sim_result_free(&ex);
            sched_plan_free(&p);
            sched_workload_free(&w);
        }
}

/* Layer-major order: with weights streamed and activations kept, the same
 * fetches as one micro-batch of micro-batch order, so ga times fewer H2D
 * bytes per step (trainable: ga times fewer gradient D2H bytes too); the
 * same compute; more device memory, as every micro-batch's activations are
 * held at once; and a link-bound step gets faster. */
static void test_layer_major(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    blocks3(&w, 1.0, 2.0, 4.0);
    w.has_trainable = true;
    for (int b = 0; b < 3; b++) {
        w.blocks[b].grad_mb_bytes = w.blocks[b].grad_step_bytes = 1.0;
        w.blocks[b].grad_mb_copies = w.blocks[b].grad_step_copies = 1.0;
        w.blocks[b].act_saved_bytes = 8.0;
        w.blocks[b].act_input_bytes = 2.0;
    }
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    for (int ga = 1; ga <= 8; ga *= 2) {
        w.grad_accum = ga;
        sched_sim_result_t mb, lm;
        p.layer_major = false;
        step(&w, &p, &mb);
        p.layer_major = true;
        step(&w, &p, &lm);
        EXPECT(NEAR(lm.h2d_bytes * ga, mb.h2d_bytes), "ga %d: h2d %g x %d vs %g", ga, lm.h2d_bytes, ga, mb.h2d_bytes);
        EXPECT(NEAR(lm.d2h_bytes * ga, mb.d2h_bytes), "ga %d: d2h %g x %d vs %g", ga, lm.d2h_bytes, ga, mb.d2h_bytes);
        EXPECT(NEAR(lm.busy[SCHED_RES_COMPUTE], mb.busy[SCHED_RES_COMPUTE]),
               "ga %d: compute %g vs %g", ga, lm.busy[SCHED_RES_COMPUTE], mb.busy[SCHED_RES_COMPUTE]);
        if (ga > 1) {
            EXPECT(lm.peak[SCHED_MEM_DEVICE] > mb.peak[SCHED_MEM_DEVICE], "ga %d: device peak %g vs %g", ga,
                   lm.peak[SCHED_MEM_DEVICE], mb.peak[SCHED_MEM_DEVICE]);
            EXPECT(lm.step_time < mb.step_time, "ga %d: link-bound step %g s vs %g s", ga, lm.step_time, mb.step_time);
        }
        sched_sim_result_free(&mb);
        sched_sim_result_free(&lm);
    }
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Layer-major with the layer's block inputs offloaded, by hand: embedding,
 * one layer, head; 1 s forward, 2 s backward; saved sets of 10 bytes with
 * inputs of 4; resident weights of 0 bytes, nothing trainable; links of
 * 4 bytes/s (a 1 s copy); two micro-batches.
 *   F0: [0,1] [1,2], each +10 saved +4 output (the layer's input)
 *   F1: [2,3] [3,4], each +10 - 4 + 4 (its input was counted; the head's);
 *       its inputs go D2H [3,4] and [4,5], freed on the device at the ends
 *   head: forward [4,5] (+6: 10 less its input) backward [5,7] (-10),
 *       forward [7,8] backward [8,10]
 *   B1: both inputs back H2D from when the previous use's last compute
 *       started: [8,9] and [9,10] (+8 at 8), compute [10,12] [12,14]
 *   B0: [14,16] [16,18]
 * Device: 14, 28, 38, 48, then at t=4 -4 (mb 0's input landed) +6: peak
 * 50 (and 50 again at t=8); kept inputs peak at 54 at t=4.  Pinned: the
 * copy in flight plus the inputs held until their fetch ends: 12 at t=8
 * (two held, one copying). */
static void test_layer_major_inputs(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    blocks3(&w, 1.0, 2.0, 0.0);
    w.h2d_bw = w.d2h_bw = 4.0;
    w.grad_accum = 2;
    for (int b = 0; b < 3; b++) w.blocks[b].act_saved_bytes = 10, w.blocks[b].act_input_bytes = 4;
    plan_all(&p, SCHED_WEIGHTS_RESIDENT, SCHED_ACTS_KEEP, 1);
    p.layer_major = true;
    sched_sim_result_t kept, off;
    step(&w, &p, &kept);
    EXPECT(NEAR(kept.step_time, 18) && NEAR(kept.peak[SCHED_MEM_DEVICE], 54), "kept: %g s, device peak %g",
           kept.step_time, kept.peak[SCHED_MEM_DEVICE]);
    EXPECT(NEAR(kept.input_d2h_bytes, 0) && NEAR(kept.h2d_bytes + kept.d2h_bytes, 0), "kept inputs move nothing");
    p.blocks[1].lm_inputs = SCHED_INPUTS_OFFLOAD;
    p.blocks[0].lm_inputs = p.blocks[2].lm_inputs = SCHED_INPUTS_OFFLOAD; /* no input / always kept: ignored */
    step(&w, &p, &off);
    EXPECT(NEAR(off.step_time, 18), "offloaded inputs, fetched in the shadow of compute: %g s", off.step_time);
    EXPECT(NEAR(off.peak[SCHED_MEM_DEVICE], 50), "offloaded: device peak %g", off.peak[SCHED_MEM_DEVICE]);
    EXPECT(NEAR(off.peak[SCHED_MEM_PINNED], 12), "offloaded: pinned peak %g", off.peak[SCHED_MEM_PINNED]);
    EXPECT(NEAR(off.input_d2h_bytes, 8) && NEAR(off.input_h2d_bytes, 8) && NEAR(off.d2h_bytes, 8) &&
               NEAR(off.h2d_bytes, 8),
           "inputs %g D2H %g H2D, link %g / %g", off.input_d2h_bytes, off.input_h2d_bytes, off.d2h_bytes, off.h2d_bytes);
    int n_off = 0, n_fetch = 0;
    for (int i = 0; i < off.num_tasks; i++) {
        const sched_task_t *t = &off.tasks[i];
        if (t->kind == SCHED_TASK_OFFLOAD_INPUT) {
            n_off++;
            EXPECT(t->block == 1 && NEAR(t->start, 3 + t->micro) && NEAR(t->end, 4 + t->micro), "offload mb %d [%g, %g]",
                   t->micro, t->start, t->end);
        }
        if (t->kind == SCHED_TASK_FETCH_INPUT) {
            n_fetch++;
            EXPECT(t->block == 1 && NEAR(t->start, 8 + t->micro) && NEAR(t->end, 9 + t->micro),
                   "fetch mb %d [%g, %g]", t->micro, t->start, t->end);
        }
    }
    EXPECT(n_off == 2 && n_fetch == 2, "%d offloads, %d fetches of block inputs", n_off, n_fetch);
    sched_sim_result_free(&off);
    /* a slow link (1 byte/s): each fetch waits; 4 s copies: D2H [3,7] [7,11],
     * H2D [8,12] and, once landed and the stream free, [12,16]; backward of
     * the layer [12,14] [16,18], step 22 */
    w.h2d_bw = w.d2h_bw = 1.0;
    step(&w, &p, &off);
    EXPECT(NEAR(off.step_time, 22) && off.waited[SCHED_RES_H2D] > 0, "slow link: %g s, waited %g on H2D",
           off.step_time, off.waited[SCHED_RES_H2D]);
    sched_sim_result_free(&off);
    sched_sim_result_free(&kept);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Host work on the copy path: every streamed fetch's bytes are packed on
 * the pack threads before its H2D copy (but a pinned home's), every
 * gradient D2H is unpacked behind its copy on the same threads; a pack
 * share of 0 costs nothing there; a slower rate makes a slower step. */
static void test_pack_unpack(void) {
    sched_workload_t w;
    sched_plan_t p = {0};
    sched_sim_result_t r;
    blocks3(&w, 1, 1, 1); /* 1 s per fetch */
    plan_all(&p, SCHED_WEIGHTS_STREAM, SCHED_ACTS_KEEP, 1);
    const double base = step(&w, &p, &r);
    sched_sim_result_free(&r);
    w.pack_bw = 0.25; /* 4 s to pack a fetch */
    EXPECT(NEAR(step(&w, &p, &r), base), "nothing converted (pack share 0): %g vs %g", r.step_time, base);
    EXPECT(r.busy[SCHED_RES_PACK] == 0, "no packing: %g", r.busy[SCHED_RES_PACK]);
    sched_sim_result_free(&r);
    for (int b = 0; b < 3; b++) w.blocks[b].w_pack_frac = 1;
    const double slow = step(&w, &p, &r);
    int fetches = 0, packs = 0;
    for (int i = 0; i < r.num_tasks; i++) {
        const sched_task_t *t = &r.tasks[i];
        if (t->kind == SCHED_TASK_PACK) {
            packs++;
            EXPECT(t->res == SCHED_RES_PACK && NEAR(t->end - t->start, 4), "a pack on the pack threads, 4 s");
        }
        if (t->kind != SCHED_TASK_FETCH_W) continue;
        fetches++;
        bool packed_before = false; /* its own pack ended before the copy started */
        for (int k = 0; k < i; k++)
            if (r.tasks[k].kind == SCHED_TASK_PACK && r.tasks[k].block == t->block && r.tasks[k].micro == t->micro &&
                r.tasks[k].end <= t->start + 1e-12)
                packed_before = true;
        EXPECT(packed_before, "fetch of block %d waits for its pack", t->block);
    }
    EXPECT(fetches == 4 && packs == fetches, "%d fetches, %d packs", fetches, packs);
    EXPECT(slow > base + 4 && r.bottleneck == SCHED_RES_PACK && NEAR(r.busy[SCHED_RES_PACK], 16),
           "pack bound: %g vs %g, bound by %s, busy %g", slow, base, sched_resource_name(r.bottleneck),
           r.busy[SCHED_RES_PACK]);
    sched_sim_result_free(&r);
    w.pack_bw = 0.5; /* twice the rate: a faster step */
    EXPECT(step(&w, &p, &r) < slow, "faster packing: %g vs %g", r.step_time, slow);
    sched_sim_result_free(&r);
    /* pinned trained working copies (the whole home here): copied from
     * where they are, nothing packed, their bytes pinned (and still host) */
    for (int b = 0; b < 3; b++) w.blocks[b].w_work_bytes = w.blocks[b].w_home_bytes = 1;
    const double unpinned = step(&w, &p, &r);
    const double host_unpinned = r.static_bytes[SCHED_MEM_HOST], pinned_unpinned = r.static_bytes[SCHED_MEM_PINNED];
    sched_sim_result_free(&r);
    for (int b = 0; b < 3; b++) p.blocks[b].pinned_home = true;
    EXPECT(step(&w, &p, &r) < unpinned && r.busy[SCHED_RES_PACK] == 0, "pinned homes: %g s vs %g, pack busy %g",
           r.step_time, unpinned, r.busy[SCHED_RES_PACK]);
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_HOST], host_unpinned) &&
               NEAR(r.static_bytes[SCHED_MEM_PINNED], pinned_unpinned + 3),
           "3 bytes of homes pinned (%g), host unchanged (%g)", r.static_bytes[SCHED_MEM_PINNED],
           r.static_bytes[SCHED_MEM_HOST]);
    sched_sim_result_free(&r);
    for (int b = 0; b < 3; b++) p.blocks[b].pinned_home = false, w.blocks[b].w_work_bytes = 0;

    /* unpack: 1 byte of gradients per block at 0.5 B/s: 2 s on the pack
     * threads behind each 1 s D2H, starting with it; the next copy waits */
    w.pack_bw = 0;
    w.has_trainable = true;
    for (int b = 0; b < 3; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->grad_mb_bytes = c->grad_step_bytes = c->grad_bytes = 1;
        c->adam_host_s = 1;
    }
    const double no_unpack = step(&w, &p, &r);
    sched_sim_result_free(&r);
    w.unpack_bw = 0.5;
    const double with_unpack = step(&w, &p, &r);
    int unpacks = 0;
    for (int i = 0; i < r.num_tasks; i++) {
        const sched_task_t *t = &r.tasks[i];
        if (t->kind != SCHED_TASK_GRAD_HOST) continue;
        unpacks++;
        EXPECT(t->res == SCHED_RES_PACK && NEAR(t->end - t->start, 2), "unpack on the pack threads, 2 s");
        const sched_task_t *copy = i > 0 ? &r.tasks[i - 1] : NULL;
        EXPECT(copy && copy->kind == SCHED_TASK_GRAD_D2H && NEAR(copy->start, t->start) && copy->end < t->end,
               "unpack behind its copy, from its start");
        for (int k = i + 1; k < r.num_tasks; k++) /* the D2H stream's next copy waits for this unpack */
            if (r.tasks[k].res == SCHED_RES_D2H) {
                EXPECT(r.tasks[k].start >= t->end - 1e-12, "copy after the unpack of block %d", t->block);
                break;
            }
        for (int k = i + 1; k < r.num_tasks; k++) /* the block's update waits for its gradients in host memory */
            if (r.tasks[k].kind == SCHED_TASK_ADAM && r.tasks[k].block == t->block)
                EXPECT(r.tasks[k].start >= t->end, "AdamW of block %d after its unpack", t->block);
    }
    EXPECT(unpacks == 3 && with_unpack > no_unpack, "%d unpacks; step %g vs %g", unpacks, with_unpack, no_unpack);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* Overlapped host updates the worker has not started when the backward's
 * copies are done are taken back and deferred into the next step
 * (sim_settle_overlapped): six streamed blocks, no clipping, AdamW (3 s)
 * slower than a block's backward (1 s).  The step ends sooner than with
 * every update inside it; the updates that ran before the norm are those
 * that had started before the last gradient copy ended, the rest run
 * after it, in block order. */
static void test_take_back(void) {
    enum { N = 6 };
    sched_workload_t w;
    sched_workload_init(&w, N);
    w.h2d_bw = w.d2h_bw = 1.0;
    w.has_trainable = true;
    for (int b = 0; b < N; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->fwd_s = c->bwd_s = c->recompute_s = 1;
        c->grad_mb_bytes = c->grad_step_bytes = 1; /* 1 s D2H */
        c->grad_bytes = 1;
        c->optim_bytes = 3;
        c->adam_host_s = 3;
        c->norm_host_s = 0.25;
    }
    sched_plan_t p;
    sched_plan_init_uniform(&p, N, SCHED_POLICY_OFFLOAD_ALL); /* streamed, grads and optimizer on the host */
    p.prefetch_window = 1;
    sched_sim_result_t r;
    mt_error_t err = {0};
    sched_sim_opts_t in_step = {.updates_in_step = true, .tasks = true};
    EXPECT(sched_simulate(&w, &p, &in_step, &r, &err) == MT_OK, "%s", err.msg);
    const double all_in_step = r.step_time;
    sched_sim_result_free(&r);
    const double t = step(&w, &p, &r);
    double norm_start = -1, last_copy = 0;
    for (int i = 0; i < r.num_tasks; i++) {
        if (r.tasks[i].kind == SCHED_TASK_NORM) norm_start = r.tasks[i].start;
        if (r.tasks[i].kind == SCHED_TASK_GRAD_D2H && r.tasks[i].end > last_copy) last_copy = r.tasks[i].end;
    }
    int before = 0, after = 0, prev_after = -1;
    bool order = true;
    for (int i = 0; i < r.num_tasks; i++) {
        const sched_task_t *k = &r.tasks[i];
        if (k->kind != SCHED_TASK_ADAM) continue;
        if (k->start < norm_start) {
            before++;
            EXPECT(k->start < last_copy, "block %d's overlapped update started at %g, after the copies (%g)",
                   k->block, k->start, last_copy);
        } else {
            after++;
            order &= k->block > prev_after;
            prev_after = k->block;
        }
    }
    EXPECT(before >= 1 && after >= 1 && before + after == N && order,
           "%d updates overlapped, %d taken back (in block order: %d)", before, after, order);
    EXPECT(t < all_in_step - 1, "taken back: %g s, every update in the step: %g s", t, all_in_step);
    printf("take back: %d of %d updates deferred into the next step: %g s, %g s with every update in the step\n",
           after, N, t, all_in_step);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

int main(void) {
    test_overlap();
    test_pack_unpack();
    test_memory();
    test_interference();
    test_host_optimizer();
    test_take_back();
    test_step_boundary();
    test_grad_accumulation();
    test_many_micro_batches();
    test_layer_major();
    test_layer_major_inputs();
    if (failures) fprintf(stderr, "simulate_test: %d failure(s)\n", failures);
    else printf("simulate_test: all passed\n");
    return failures != 0;
}
