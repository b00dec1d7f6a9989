/* Expert parallel on two devices: a MoE layer's experts split between the
 * devices, routed rows exchanged.  What the cost model, the simulator and
 * the per-layer choice (sched_parallel_plan) must get right: each link
 * streams half the expert bytes; only replicated tensors' gradients are
 * summed; the exchange crosses each device's own link when it goes through
 * host memory; the one host still holds every expert; expert parallel is
 * chosen when the links bound the step and the peer link is fast, and not
 * when the peer link is slow; a forced
 * parallel: is honoured and refused where it cannot apply.  Mixtral-8x7B's
 * sizes (scheduler/testutil.h) on the shipped H100 PCIe profile, each
 * device running half of a step of 8 micro-batches. */
#include "scheduler/data_parallel.h"
#include "scheduler/testutil.h"

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

static const double GiB = 1073741824.0;
static const char *const k_hw = "configs/hw/h100-80gb-pcie.yaml";

/* Mixtral-8x7B's sizes, full fine-tuning in bf16, 4 micro-batches of 4096
 * tokens per device.  peer_gbps > 0: a direct peer link of that many GB/s
 * (else the profile's: through host memory). */
static bool setup(sched_test_setup_t *s, double peer_gbps) {
    sched_test_model_t m = {0};
    m.num_layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.head_dim = 128, m.vocab = 32000;
    m.num_experts = 8, m.top_k = 2, m.expert_inter = 14336;
    sched_run_shape_t sh = {0};
    sh.micro_batch_size = 1, sh.sequence_len = 4096, sh.grad_accum = 4, sh.bf16 = true, sh.max_grad_norm = 1.0;
    mt_error_t err = {0};
    sched_hw_t hw;
    bool ok = sched_hw_load(k_hw, &hw, &err) == MT_OK;
    if (ok && peer_gbps > 0) {
        hw.peer_bw_peak = peer_gbps * 1e9;
        hw.peer_frac = 1.0;
        hw.peer_latency_s = 10e-6;
    }
    ok = ok && sched_test_setup(s, &m, &sh, &hw, &err) == MT_OK;
    EXPECT(ok, "setup: %s", err.msg);
    return ok;
}

static void opts_for(sched_planner_opts_t *o, sched_parallel_t parallel) {
    sched_planner_opts_default(o);
    o->devices = 2;
    o->parallel = parallel;
    o->budget[SCHED_MEM_DEVICE] = 80 * GiB;
    o->budget[SCHED_MEM_HOST] = 1024 * GiB;
    o->budget[SCHED_MEM_PINNED] = 256 * GiB;
    o->device_headroom = 0.15;
}

/* The costs: each device holds, streams and updates half the experts; the
 * dense part is unchanged; the rows exchanged are n k hidden-size rows
 * each way per pass. */
static void test_costs(void) {
    sched_test_setup_t s;
    if (!setup(&s, 0)) return;
    EXPECT(s.w.ep_blocks && s.w.moe && !s.w.moe[0] && s.w.moe[1] && !s.w.moe[s.w.num_blocks - 1], "MoE blocks");
    const sched_block_info_t *bi = &s.reg.blocks[1];
    const sched_block_cost_t *dp = &s.w.blocks[1], *ep = &s.w.ep_blocks[1];
    const double dense = bi->w_dense_bytes, expert = bi->w_expert_bytes;
    EXPECT(fabs((ep->w_resident_bytes - dense) - 0.5 * (dp->w_resident_bytes - dense)) < 1, "resident experts halved");
    /* 4 micro-batches of 4096 tokens hit all 8 experts: the step's fetch is 4 of them, not 8 */
    EXPECT(fabs(ep->w_fetch_step_bytes - (dense + 4 * expert)) < 1e-6 * ep->w_fetch_step_bytes &&
               fabs(dp->w_fetch_step_bytes - (dense + 8 * expert)) < 1e-6 * dp->w_fetch_step_bytes,
           "step fetch: ep %g dp %g (dense %g, expert %g)", ep->w_fetch_step_bytes, dp->w_fetch_step_bytes, dense,
           expert);
    EXPECT(fabs(ep->owned_grad_bytes - 4 * 4.0 * bi->train_expert_params) < 1, "own experts' gradients");
    EXPECT(fabs((ep->grad_bytes - ep->owned_grad_bytes) - (dp->grad_bytes - 8 * 4.0 * bi->train_expert_params)) < 1,
           "replicated gradients = the dense ones");
    EXPECT(ep->optim_bytes < 0.6 * dp->optim_bytes && ep->adam_host_s < 0.6 * dp->adam_host_s, "half the updates");
    const double row = 4096 * 2.0; /* hidden x bf16 */
    EXPECT(fabs(ep->xchg_fwd_bytes - 4096 * 2 * row) < 1 && fabs(ep->xchg_bwd_bytes - ep->xchg_fwd_bytes) < 1,
           "exchange %g bytes per pass", ep->xchg_fwd_bytes);
    /* even E: the same routed rows per device, so compute differs by the exchange only */
    const double a2a = 4096 * 2 * 0.5 * row / s.w.peer_bw + s.w.peer_latency_s;
    EXPECT(fabs(ep->fwd_s - dp->fwd_s - 2 * a2a) < 1e-9 && fabs(ep->bwd_s - dp->bwd_s - 2 * a2a) < 1e-9,
           "fwd %g vs %g + 2 x %g", ep->fwd_s, dp->fwd_s, a2a);
    EXPECT(s.w.peer_via_host && fabs(s.w.peer_bw - sched_hw_h2d_bw(&s.hw)) < 1, "PCIe profile: through the host");
    sched_test_teardown(&s);
}

/* The simulator: under one streamed plan, each device's link carries half
 * the expert bytes of data parallel (the dense part is the same); through
 * host memory the exchange is on the links as well; the reduction sums the
 * replicated gradients only. */
static void test_streaming_halved(void) {
    sched_test_setup_t s;
    if (!setup(&s, 0)) return;
    const int N = s.w.num_blocks;
    sched_plan_t p[2];
    double fetched[2] = {0}, exchanged[2] = {0}, peer[2] = {0}, host_static[2] = {0};
    sched_dp_result_t dp[2];
    for (int k = 0; k < 2; k++) {
        sched_plan_init_uniform(&p[k], N, SCHED_POLICY_OFFLOAD_ALL);
        p[k].prefetch_window = 1;
        p[k].layer_major = true;
        for (int b = 0; b < N; b++) p[k].blocks[b].expert_parallel = k == 1 && s.w.moe[b];
        sched_sim_opts_t so = {.tasks = true, .updates_in_step = true};
        sched_sim_result_t r;
        mt_error_t err = {0};
        EXPECT(sched_simulate(&s.w, &p[k], &so, &r, &err) == MT_OK, "%s", err.msg);
        for (int i = 0; i < r.num_tasks; i++) {
            const sched_task_t *t = &r.tasks[i];
            if (t->kind == SCHED_TASK_FETCH_W && t->block >= 1 && t->block <= N - 2)
                fetched[k] += t->bytes - s.reg.blocks[t->block].w_dense_bytes;
            if (t->kind == SCHED_TASK_EXCHANGE) exchanged[k] += t->bytes;
        }
        peer[k] = r.peer_bytes;
        host_static[k] = r.static_bytes[SCHED_MEM_HOST];
        sched_sim_result_free(&r);
        EXPECT(sched_dp_predict(&s.w, &p[k], 2, sched_hw_host_bw(&s.hw), &dp[k], &err) == MT_OK, "%s", err.msg);
    }
    EXPECT(fetched[0] > 0 && fabs(fetched[1] - 0.5 * fetched[0]) < 1e-9 * fetched[0],
           "expert bytes fetched per link: expert parallel %g, data parallel %g", fetched[1], fetched[0]);
    /* one host copy: the other device's experts' homes, optimizer state and
     * gradients are in the same host memory as this device's */
    EXPECT(host_static[0] > 0 && fabs(host_static[1] - host_static[0]) < 1e-9 * host_static[0],
           "host memory: expert parallel %g, data parallel %g", host_static[1], host_static[0]);
    EXPECT(peer[0] == 0 && peer[1] > 0 && fabs(exchanged[1] - 2 * peer[1]) < 1e-6 * peer[1],
           "the rows sent (%g) cross the link out and the other's in (%g)", peer[1], exchanged[1]);
    double dense_grads = 0, all_grads = 0;
    for (int b = 0; b < N; b++) {
        all_grads += s.w.blocks[b].grad_bytes;
        dense_grads += s.w.ep_blocks[b].grad_bytes - s.w.ep_blocks[b].owned_grad_bytes;
    }
    EXPECT(fabs(dp[0].reduce_host_bytes - all_grads) < 1 && fabs(dp[1].reduce_host_bytes - dense_grads) < 1 &&
               dense_grads < 0.1 * all_grads,
           "reduced: data %g of %g, expert %g of %g", dp[0].reduce_host_bytes, all_grads, dp[1].reduce_host_bytes,
           dense_grads);
    EXPECT(dp[1].peer_bytes == peer[1] && dp[1].expert_parallel_blocks == N - 2, "dp result carries the exchange");
    for (int k = 0; k < 2; k++) sched_plan_free(&p[k]);
    sched_test_teardown(&s);
}

/* The choice: with a fast direct peer link (NVLink-class) and the step
 * bound by the links, every MoE layer goes expert parallel; with a very
 * slow peer link none does, and all-expert is slower than all-data. */
static void test_choice(void) {
    const double gbps[2] = {400, 0.05};
    for (int k = 0; k < 2; k++) {
        sched_test_setup_t s;
        if (!setup(&s, gbps[k])) return;
        sched_planner_opts_t o;
        opts_for(&o, SCHED_PARALLEL_AUTO);
        sched_parallel_result_t r;
        mt_error_t err = {0};
        EXPECT(sched_parallel_plan(&s.w, &o, sched_hw_host_bw(&s.hw), &r, &err) == MT_OK, "%s", err.msg);
        const sched_dp_result_t *d = &r.dp[SCHED_LAYOUT_DATA], *m = &r.dp[SCHED_LAYOUT_MIX],
                                *e = &r.dp[SCHED_LAYOUT_EXPERT];
        EXPECT(r.chosen == SCHED_LAYOUT_MIX && r.feasible[SCHED_LAYOUT_MIX], "auto uses the mix");
        EXPECT(m->step_s <= d->step_s && m->step_s <= e->step_s, "mix %g, data %g, expert %g", m->step_s, d->step_s,
               e->step_s);
        if (k == 0) {
            /* the data parallel plan streams the experts: the links bound it */
            EXPECT(d->fwd_bwd_s > 0 && d->h2d_bytes[0] > 100e9, "data parallel streams %g bytes", d->h2d_bytes[0]);
            EXPECT(m->expert_parallel_blocks == s.w.num_blocks - 2 && m->step_s < 0.97 * d->step_s,
                   "fast peer link: %d MoE layers expert parallel, step %g vs data %g", m->expert_parallel_blocks,
                   m->step_s, d->step_s);
        } else {
            EXPECT(m->expert_parallel_blocks == 0 && e->step_s > 1.5 * d->step_s,
                   "slow peer link: %d MoE layers expert parallel; expert %g vs data %g", m->expert_parallel_blocks,
                   e->step_s, d->step_s);
        }
        sched_parallel_result_free(&r);
        sched_test_teardown(&s);
    }
}

/* parallel: data and expert are honoured whatever the planner would
 * choose; expert is refused on one device and on a model without MoE
 * layers, naming the key. */
static void test_forced(void) {
    sched_test_setup_t s;
    if (!setup(&s, 0.05)) return; /* expert parallel is a bad idea here: forcing must still give it */
    const sched_parallel_t asks[2] = {SCHED_PARALLEL_DATA, SCHED_PARALLEL_EXPERT};
    for (int k = 0; k < 2; k++) {
        sched_planner_opts_t o;
        opts_for(&o, asks[k]);
        sched_parallel_result_t r;
        mt_error_t err = {0};
        EXPECT(sched_parallel_plan(&s.w, &o, sched_hw_host_bw(&s.hw), &r, &err) == MT_OK, "%s", err.msg);
        const int want = k == 0 ? SCHED_LAYOUT_DATA : SCHED_LAYOUT_EXPERT;
        int ep = 0;
        for (int b = 0; b < s.w.num_blocks; b++) ep += r.plan[want].blocks[b].expert_parallel;
        EXPECT(r.chosen == want && ep == (k == 0 ? 0 : s.w.num_blocks - 2), "parallel: %s gives %d expert layers",
               sched_parallel_name(asks[k]), ep);
        sched_parallel_result_free(&r);
        /* the planner alone honours it too */
        sched_planner_result_t pr;
        EXPECT(sched_plan_make(&s.w, &o, &pr, &err) == MT_OK, "%s", err.msg);
        ep = 0;
        for (int b = 0; b < s.w.num_blocks; b++) ep += pr.plan.blocks[b].expert_parallel;
        EXPECT(ep == (k == 0 ? 0 : s.w.num_blocks - 2), "sched_plan_make: %d", ep);
        sched_planner_result_free(&pr);
    }
    sched_planner_opts_t o;
    opts_for(&o, SCHED_PARALLEL_EXPERT);
    o.devices = 1;
    sched_planner_result_t pr;
    mt_error_t err = {0};
    EXPECT(sched_plan_make(&s.w, &o, &pr, &err) == MT_ERR_CONFIG && strstr(err.msg, "parallel: expert") &&
               strstr(err.msg, "2 devices"),
           "one device: %s", err.msg);
    sched_test_teardown(&s);

    sched_workload_t w; /* three dense blocks */
    sched_workload_init(&w, 3);
    for (int b = 0; b < 3; b++) w.blocks[b].fwd_s = w.blocks[b].bwd_s = 1e-3;
    w.h2d_bw = w.d2h_bw = 1e10;
    opts_for(&o, SCHED_PARALLEL_EXPERT);
    sched_parallel_result_t r;
    EXPECT(sched_parallel_plan(&w, &o, 1e11, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "parallel: expert") &&
               strstr(err.msg, "MoE"),
           "no MoE layers: %s", err.msg);
    /* auto on such a model: data parallel, nothing else planned */
    opts_for(&o, SCHED_PARALLEL_AUTO);
    EXPECT(sched_parallel_plan(&w, &o, 1e11, &r, &err) == MT_OK && r.chosen == SCHED_LAYOUT_DATA &&
               !r.planned[SCHED_LAYOUT_EXPERT] && !r.planned[SCHED_LAYOUT_MIX],
           "auto without MoE: %s", err.msg);
    sched_parallel_result_free(&r);
    /* a plan asking for expert parallel on a dense block is refused by the simulator */
    sched_plan_t p;
    sched_plan_init_uniform(&p, 3, SCHED_POLICY_KEEP_ALL);
    p.blocks[1].expert_parallel = true;
    sched_sim_result_t sr;
    EXPECT(sched_simulate(&w, &p, NULL, &sr, &err) == MT_ERR_CONFIG && strstr(err.msg, "MoE"), "%s", err.msg);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* The mix is per layer: of two link-bound MoE layers, one with a cheap
 * exchange (expert parallel halves its fetch) and one whose exchange costs
 * far more than its fetch, the planner splits the first only.  The device
 * budget holds one replicated layer in flight beside a split one, not two
 * replicated: all-data does not fit, the mix fits and beats all-expert. */
static void test_mixed_layers(void) {
    sched_workload_t w;
    sched_workload_init(&w, 4);
    w.has_trainable = false;
    w.h2d_bw = w.d2h_bw = 50e9;
    w.peer_bw = 200e9;
    for (int b = 0; b < 4; b++) {
        sched_block_cost_t *c = &w.blocks[b];
        c->fwd_s = c->bwd_s = c->recompute_s = 0.01;
        c->act_saved_bytes = c->act_input_bytes = 1e6;
        const bool moe = b == 1 || b == 2;
        c->w_resident_bytes = c->w_fetch_bytes = c->w_home_bytes = moe ? 4e9 : 1e6;
        c->w_fetch_copies = 1;
    }
    sched_workload_alloc_ep(&w);
    for (int b = 1; b <= 2; b++) {
        sched_block_cost_t *e = &w.ep_blocks[b];
        w.moe[b] = true;
        e->w_resident_bytes = e->w_fetch_bytes = 2e9;
        e->xchg_fwd_bytes = e->xchg_bwd_bytes = b == 1 ? 1e8 : 4e10;
        const double x = 2 * e->xchg_fwd_bytes / 2 / w.peer_bw; /* two all-to-alls, half each way */
        e->fwd_s += x, e->bwd_s += x, e->recompute_s = e->fwd_s;
    }
    sched_planner_opts_t o;
    opts_for(&o, SCHED_PARALLEL_AUTO);
    o.budget[SCHED_MEM_DEVICE] = 7e9; /* 4 + 2 GB fetched at once fit, 4 + 4 do not */
    o.device_headroom = 0;
    sched_parallel_result_t r;
    mt_error_t err = {0};
    EXPECT(sched_parallel_plan(&w, &o, 100e9, &r, &err) == MT_OK, "%s", err.msg);
    const sched_plan_t *m = &r.plan[SCHED_LAYOUT_MIX];
    EXPECT(r.chosen == SCHED_LAYOUT_MIX && m->blocks && m->blocks[1].expert_parallel && !m->blocks[2].expert_parallel,
           "layer 0 split, layer 1 replicated");
    const double sm = r.dp[SCHED_LAYOUT_MIX].step_s;
    EXPECT(!r.feasible[SCHED_LAYOUT_DATA] && r.feasible[SCHED_LAYOUT_EXPERT] && r.feasible[SCHED_LAYOUT_MIX] &&
               sm < r.dp[SCHED_LAYOUT_EXPERT].step_s * 0.9,
           "mix %g (fits %d), data %g (fits %d), expert %g", sm, r.feasible[SCHED_LAYOUT_MIX],
           r.dp[SCHED_LAYOUT_DATA].step_s, r.feasible[SCHED_LAYOUT_DATA], r.dp[SCHED_LAYOUT_EXPERT].step_s);
    sched_parallel_result_free(&r);
    sched_workload_free(&w);
}

int main(void) {
    test_mixed_layers();
    test_costs();
    test_streaming_halved();
    test_choice();
    test_forced();
    if (failures) fprintf(stderr, "expert_parallel_test: %d failure(s)\n", failures);
    else printf("expert_parallel_test: all passed\n");
    return failures != 0;
}
