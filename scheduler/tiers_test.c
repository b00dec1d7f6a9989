/* The third tier and quantized bases in the cost model, simulator and
 * planner: NVMe traffic and time of a hand-made workload equal a hand
 * computation; a host budget below the optimizer state is infeasible
 * without the NVMe tier and feasible with it (within every budget and the
 * NVMe one); a quantized base's bytes follow the format's size for exactly
 * the tensors it covers. */
#include "scheduler/basequant.h"
#include "scheduler/planner.h"
#include "scheduler/testutil.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"

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
/* sums of a few exact binary fractions; 1e-9 absorbs rounding */
#define NEAR(a, b) (fabs((double)(a) - (double)(b)) < 1e-9 * (1 + fabs((double)(b))))

static const double GiB = 1073741824.0;

/* n blocks, every one trained with host gradients and host AdamW:
 * optimizer state 8 bytes, gradients 2, weights 1 (1 byte/s links), NVMe
 * reading 2 bytes/s and writing 1. */
static void blocks_n(sched_workload_t *w, int n) {
    sched_workload_init(w, n);
    w->h2d_bw = w->d2h_bw = 1.0;
    w->nvme_read_bw = 2.0, w->nvme_write_bw = 1.0;
    for (int b = 0; b < n; b++) {
        sched_block_cost_t *c = &w->blocks[b];
        c->fwd_s = c->bwd_s = c->recompute_s = 1;
        c->w_fetch_bytes = c->w_resident_bytes = c->w_home_bytes = 1;
        c->grad_bytes = c->grad_mb_bytes = c->grad_step_bytes = 2;
        c->grad_mb_copies = c->grad_step_copies = 1;
        c->optim_bytes = 8;
        c->w_update_bytes = 1;
        c->adam_host_s = 1;
    }
}

static void test_nvme_by_hand(void) {
    sched_workload_t w;
    blocks_n(&w, 3);
    sched_plan_t p;
    sched_plan_init_uniform(&p, 3, SCHED_POLICY_OFFLOAD_ALL);
    for (int b = 0; b < 3; b++) p.blocks[b].acts = SCHED_ACTS_KEEP;
    p.prefetch_window = 1;
    sched_sim_result_t r0, r;
    mt_error_t err = {0};
    EXPECT(sched_simulate(&w, &p, NULL, &r0, &err) == MT_OK, "%s", err.msg);
    /* optimizer state of every block on NVMe, block 1's weights' home too */
    for (int b = 0; b < 3; b++) p.blocks[b].nvme_optim = true;
    p.blocks[1].nvme_weights = true;
    sched_sim_opts_t o = {.tasks = true};
    EXPECT(sched_simulate(&w, &p, &o, &r, &err) == MT_OK, "%s", err.msg);
    /* reads: 3 x 8 state + block 1's fetches (forward; the turn keeps them for the backward): 1 */
    EXPECT(NEAR(r.nvme_read_bytes, 24 + 1), "NVMe read %g", r.nvme_read_bytes);
    /* writes: 3 x 8 state + block 1's updated working copy (1) */
    EXPECT(NEAR(r.nvme_write_bytes, 24 + 1), "NVMe written %g", r.nvme_write_bytes);
    EXPECT(NEAR(r.busy[SCHED_RES_NVME], 25 / 2.0 + 25 / 1.0), "NVMe busy %g", r.busy[SCHED_RES_NVME]);
    EXPECT(NEAR(r.nvme_bytes, 3 * 8 + 1), "capacity %g", r.nvme_bytes);
    /* host: the static state and block 1's home leave host memory (the
     * gradient buffer of one micro-batch lives only until each update) */
    EXPECT(NEAR(r0.static_bytes[SCHED_MEM_HOST], 3 * (1 + 8 + 2)), "host static before %g",
           r0.static_bytes[SCHED_MEM_HOST]);
    EXPECT(NEAR(r.static_bytes[SCHED_MEM_HOST], 2 * 1), "host static with NVMe %g", r.static_bytes[SCHED_MEM_HOST]);
    EXPECT(r.peak[SCHED_MEM_HOST] < r0.peak[SCHED_MEM_HOST] && r.peak[SCHED_MEM_HOST] >= 8 + 2,
           "host peak %g (one block's state and gradients at least) vs %g", r.peak[SCHED_MEM_HOST],
           r0.peak[SCHED_MEM_HOST]);
    /* 37.5 s of NVMe against 6 s of compute: the array bounds the step */
    EXPECT(r.step_time >= 37.5 && r.bottleneck == SCHED_RES_NVME, "step %g bound by %s", r.step_time,
           sched_resource_name(r.bottleneck));
    int reads = 0;
    for (int i = 0; i < r.num_tasks; i++) reads += r.tasks[i].kind == SCHED_TASK_NVME_READ;
    EXPECT(reads == 4, "NVMe read tasks %d", reads);
    sched_sim_result_free(&r);
    /* with fetches packed on the pack threads: a home in host memory is
     * packed before its copy, one on the tier is read straight into
     * staging and packed not at all */
    w.pack_bw = 1.0;
    for (int b = 0; b < 3; b++) w.blocks[b].w_pack_frac = 1.0;
    EXPECT(sched_simulate(&w, &p, &o, &r, &err) == MT_OK, "%s", err.msg);
    int packs[3] = {0, 0, 0};
    for (int i = 0; i < r.num_tasks; i++)
        if (r.tasks[i].kind == SCHED_TASK_PACK && r.tasks[i].block >= 0 && r.tasks[i].block < 3) packs[r.tasks[i].block]++;
    EXPECT(packs[0] > 0 && packs[2] > 0 && packs[1] == 0, "pack tasks per block: %d %d %d (block 1's home on NVMe)",
           packs[0], packs[1], packs[2]);
    sched_sim_result_free(&r);
    w.pack_bw = 0;
    for (int b = 0; b < 3; b++) w.blocks[b].w_pack_frac = 0;
    sched_sim_result_free(&r0);
    /* a plan with NVMe state on a workload without a tier is refused */
    w.nvme_read_bw = w.nvme_write_bw = 0;
    EXPECT(sched_simulate(&w, &p, NULL, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "nvme:"), "%s", err.msg);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* The backward's lead over updates bound by the array (scheduler/plan.h):
 * ten blocks whose host AdamW each needs 12 s of NVMe (8 bytes of state
 * read at 2 bytes/s and written at 1) against 1 s of backward.  The
 * backward of block b - 1 starts only once block b + SCHED_NVME_GRAD_LEAD's
 * update is done, so at most that many blocks' gradients (2 bytes each)
 * wait in host memory for theirs, not all ten. */
static void test_nvme_lead(void) {
    enum { N = 10 };
    sched_workload_t w;
    blocks_n(&w, N);
    for (int b = 0; b < N; b++) { /* weights and AdamW's own time next to nothing: the array decides */
        sched_block_cost_t *c = &w.blocks[b];
        c->w_fetch_bytes = c->w_resident_bytes = c->w_home_bytes = 1e-3;
        c->w_update_bytes = 0;
        c->adam_host_s = 1e-3;
    }
    sched_plan_t p;
    sched_plan_init_uniform(&p, N, SCHED_POLICY_OFFLOAD_ALL);
    for (int b = 0; b < N; b++) p.blocks[b].acts = SCHED_ACTS_KEEP, p.blocks[b].nvme_optim = true;
    p.prefetch_window = 1;
    sched_sim_opts_t o = {.tasks = true, .timelines = true};
    sched_sim_result_t r;
    mt_error_t err = {0};
    EXPECT(sched_simulate(&w, &p, &o, &r, &err) == MT_OK, "%s", err.msg);
    double adam_end[N] = {0}, bwd_start[N] = {0};
    for (int i = 0; i < r.num_tasks; i++) {
        const sched_task_t *t = &r.tasks[i];
        if (t->kind == SCHED_TASK_ADAM && t->block >= 0) adam_end[t->block] = t->end;
        if (t->kind == SCHED_TASK_BWD && t->block >= 0) bwd_start[t->block] = t->start;
    }
    int checked = 0;
    for (int b = 1; b + SCHED_NVME_GRAD_LEAD < N; b++) {
        EXPECT(bwd_start[b - 1] >= adam_end[b + SCHED_NVME_GRAD_LEAD] - 1e-9,
               "block %d's backward starts at %g, before block %d's update ends (%g)", b - 1, bwd_start[b - 1],
               b + SCHED_NVME_GRAD_LEAD, adam_end[b + SCHED_NVME_GRAD_LEAD]);
        checked++;
    }
    EXPECT(checked == N - 1 - SCHED_NVME_GRAD_LEAD, "%d blocks checked", checked);
    /* gradients waiting: the lead's, the block landing and the one updating,
     * beside at most two blocks' state in flight (read, being written) */
    const double bound = (SCHED_NVME_GRAD_LEAD + 2) * 2 + 2 * 8 + N * 1e-3 + 1e-6;
    EXPECT(r.peak[SCHED_MEM_HOST] <= bound, "host peak %g above %g (gradients piling up behind the array)",
           r.peak[SCHED_MEM_HOST], bound);
    EXPECT(r.waited[SCHED_RES_NVME] > 0 && r.bottleneck == SCHED_RES_NVME, "waited on the array %g, bound by %s",
           r.waited[SCHED_RES_NVME], sched_resource_name(r.bottleneck));
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

/* The array serves requests as they arrive in time: block 1's weights,
 * whose home is on the tier, are read for its backward as block 2's
 * backward starts, on an idle array, although the walk simulates block 2's
 * update (its state read once its gradients land) first. */
static void test_nvme_arrival_order(void) {
    enum { N = 4 };
    sched_workload_t w;
    blocks_n(&w, N);
    sched_plan_t p;
    sched_plan_init_uniform(&p, N, SCHED_POLICY_OFFLOAD_ALL);
    for (int b = 0; b < N; b++) p.blocks[b].acts = SCHED_ACTS_KEEP, p.blocks[b].nvme_optim = true;
    p.blocks[1].nvme_weights = true;
    p.prefetch_window = 1;
    sched_sim_opts_t o = {.tasks = true};
    sched_sim_result_t r;
    mt_error_t err = {0};
    EXPECT(sched_simulate(&w, &p, &o, &r, &err) == MT_OK, "%s", err.msg);
    double fetch_read = -1, bwd2 = -1, state2 = -1;
    for (int i = 0; i < r.num_tasks; i++) {
        const sched_task_t *t = &r.tasks[i];
        if (t->kind == SCHED_TASK_NVME_READ && t->block == 1 && t->micro >= 0) fetch_read = t->start; /* the last: backward */
        if (t->kind == SCHED_TASK_BWD && t->block == 2) bwd2 = t->start;
        if (t->kind == SCHED_TASK_NVME_READ && t->block == 2 && t->micro < 0) state2 = t->start;
    }
    EXPECT(bwd2 >= 0 && state2 > bwd2, "block 2: backward at %g, state read at %g", bwd2, state2);
    EXPECT(fetch_read >= 0 && fetch_read < state2, "block 1's backward read at %g, not before block 2's state read (%g)",
           fetch_read, state2);
    sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_workload_free(&w);
}

static bool within(const sched_planner_result_t *r, const sched_planner_opts_t *o) {
    for (int m = 0; m < SCHED_MEM_COUNT; m++)
        if (o->budget[m] > 0 && r->sim.peak[m] > o->budget[m]) return false;
    return o->nvme_budget <= 0 || r->sim.nvme_bytes <= o->nvme_budget;
}

/* Full fine-tuning of a Mixtral-shaped model (8 layers) whose optimizer
 * state is twice the host budget. */
static void test_nvme_planner(void) {
    sched_test_model_t m = {0};
    m.num_layers = 8, m.hidden = 2048, m.heads = 16, m.kv_heads = 4, m.head_dim = 128, m.vocab = 32000;
    m.num_experts = 8, m.top_k = 2, m.expert_inter = 4096;
    sched_run_shape_t sh = {0};
    sh.micro_batch_size = 1, sh.sequence_len = 1024, sh.grad_accum = 1, sh.bf16 = true;
    sched_hw_t hw;
    sched_test_setup_t s;
    mt_error_t err = {0};
    if (sched_hw_load("configs/hw/h100-sxm-nvme.yaml", &hw, &err) != MT_OK ||
        sched_test_setup(&s, &m, &sh, &hw, &err) != MT_OK) {
        EXPECT(false, "setup: %s", err.msg);
        return;
    }
    sched_workload_set_nvme(&s.w, &hw);
    double optim = 0;
    for (int b = 0; b < s.w.num_blocks; b++) optim += s.w.blocks[b].optim_bytes;
    sched_planner_opts_t o;
    sched_planner_opts_default(&o);
    o.budget[SCHED_MEM_DEVICE] = 3 * GiB; /* a block at a time: too little to move the optimizer there */
    o.budget[SCHED_MEM_PINNED] = 8 * GiB;
    o.budget[SCHED_MEM_HOST] = optim / 2;
    sched_planner_result_t r;
    EXPECT(sched_plan_make(&s.w, &o, &r, &err) == MT_OK, "%s", err.msg);
    EXPECT(!r.feasible && r.short_of[SCHED_MEM_HOST] && strstr(r.why, "NVMe tier"), "without NVMe: %s", r.why);
    sched_planner_result_free(&r);

    o.nvme = true;
    EXPECT(sched_plan_make(&s.w, &o, &r, &err) == MT_OK, "%s", err.msg);
    EXPECT(r.feasible && within(&r, &o), "with NVMe: %s", r.why);
    EXPECT(r.sim.nvme_bytes > 0 && r.sim.peak[SCHED_MEM_HOST] <= o.budget[SCHED_MEM_HOST], "NVMe holds %g, host %g",
           r.sim.nvme_bytes, r.sim.peak[SCHED_MEM_HOST]);
    /* NVMe bytes per step by hand from the plan: each NVMe-held state read
     * and written once (one micro-batch), each NVMe-homed block's fetches
     * read, its updated copy written */
    double rd = 0, wr = 0, cap = 0;
    for (int b = 0; b < s.w.num_blocks; b++) {
        const sched_block_plan_t *bp = &r.plan.blocks[b];
        const sched_block_cost_t *c = &s.w.blocks[b];
        if (sched_block_nvme_optim(bp)) rd += c->optim_bytes, wr += c->optim_bytes, cap += c->optim_bytes;
        if (sched_block_nvme_weights(bp)) wr += c->w_update_bytes, cap += c->w_home_bytes;
    }
    double fetched = 0;
    for (int i = 0; i < r.sim.num_tasks; i++)
        if (r.sim.tasks[i].kind == SCHED_TASK_NVME_READ && r.sim.tasks[i].micro >= 0) fetched += r.sim.tasks[i].bytes;
    EXPECT(rd > 0 && NEAR(r.sim.nvme_read_bytes, rd + fetched) && NEAR(r.sim.nvme_write_bytes, wr) &&
               NEAR(r.sim.nvme_bytes, cap),
           "read %g (by hand %g + fetches %g), written %g (%g), held %g (%g)", r.sim.nvme_read_bytes, rd, fetched,
           r.sim.nvme_write_bytes, wr, r.sim.nvme_bytes, cap);
    EXPECT(r.sim.busy[SCHED_RES_NVME] >= r.sim.nvme_read_bytes / hw.nvme_read_bw, "NVMe busy %g",
           r.sim.busy[SCHED_RES_NVME]);
    const double held = r.sim.nvme_bytes;
    sched_planner_result_free(&r);

    /* an NVMe budget below what it must hold: infeasible */
    o.nvme_budget = held / 4;
    EXPECT(sched_plan_make(&s.w, &o, &r, &err) == MT_OK, "%s", err.msg);
    EXPECT(!r.feasible, "NVMe budget %g of %g must not fit", o.nvme_budget, held);
    sched_planner_result_free(&r);
    sched_test_teardown(&s);
}

/* NF4 with double quantization over a LoRA run: the covered tensors are
 * q/k/v/o and the experts of each layer, nothing else. */
static void test_quant_bytes(void) {
    sched_test_model_t m = {0};
    m.num_layers = 2, m.hidden = 256, m.heads = 4, m.kv_heads = 2, m.head_dim = 64, m.vocab = 1000;
    m.num_experts = 4, m.top_k = 2, m.expert_inter = 512;
    sched_run_shape_t sh = {0};
    sh.micro_batch_size = 1, sh.sequence_len = 64, sh.grad_accum = 1, sh.bf16 = true;
    sh.lora = true, sh.lora_r = 4, sh.num_lora_targets = 1;
    snprintf(sh.lora_targets[0], sizeof sh.lora_targets[0], "q_proj");
    sched_hw_t hw;
    sched_test_setup_t s;
    mt_error_t err = {0};
    if (sched_hw_load("configs/hw/rtx4090.yaml", &hw, &err) != MT_OK || sched_test_setup(&s, &m, &sh, &hw, &err) != MT_OK) {
        EXPECT(false, "setup: %s", err.msg);
        return;
    }
    sched_workload_t before = s.w;
    before.blocks = malloc((size_t)s.w.num_blocks * sizeof *before.blocks);
    memcpy(before.blocks, s.w.blocks, (size_t)s.w.num_blocks * sizeof *before.blocks);
    sched_base_quant_t q = {.on = true, .format = MT_QUANT_NF4, .block = 64, .double_quant = true};
    sched_workload_quantize_base(&s.reg, &q, &hw, &s.w);
    const double bpp = 0.5 + (1.0 + 4.0 / 256.0) / 64.0;
    const double H = m.hidden, qd = m.heads * m.head_dim, kd = m.kv_heads * m.head_dim, I = m.expert_inter;
    const double dense = 2 * H * qd + 2 * H * kd, expert = 3 * H * I;
    const double saved = (dense + m.num_experts * expert) * (2.0 - bpp);
    for (int b = 0; b < s.w.num_blocks; b++) {
        const sched_block_cost_t *c = &s.w.blocks[b], *c0 = &before.blocks[b];
        const bool layer = b > 0 && b < s.w.num_blocks - 1;
        EXPECT(NEAR(c0->w_home_bytes - c->w_home_bytes, layer ? saved : 0), "block %d home %g -> %g (saves %g)", b,
               c0->w_home_bytes, c->w_home_bytes, saved);
        EXPECT(NEAR(c0->w_resident_bytes - c->w_resident_bytes, layer ? saved : 0), "block %d resident", b);
        EXPECT(layer ? c->fwd_temp_bytes > c0->fwd_temp_bytes && c->fwd_s > c0->fwd_s
                     : c->fwd_temp_bytes == c0->fwd_temp_bytes && c->fwd_s == c0->fwd_s,
               "block %d: a working copy and its dequantization only in decoder layers", b);
    }
    EXPECT(NEAR(s.w.base_quant_bytes, m.num_layers * (dense + m.num_experts * expert) * bpp) && s.w.base_quantized,
           "stored bytes %g", s.w.base_quant_bytes);
    /* what stays wide: norms, the router, trainable adapters, the embedding */
    int kept = 0;
    for (int i = 0; i < s.reg.num_tensors; i++) {
        const sched_tensor_t *t = &s.reg.tensors[i];
        if (t->kind != SCHED_T_WEIGHT) continue;
        const bool covered = sched_base_quant_covers(t, s.reg.num_blocks, &q);
        if (strstr(t->name, "norm") || strstr(t->name, ".gate.weight") || t->trainable || t->block == 0) {
            EXPECT(!covered, "%s must stay in the working dtype", t->name);
            kept++;
        }
    }
    EXPECT(kept > 0, "no kept tensors found");
    /* a transformers 5 bitsandbytes checkpoint: its routed experts stored unquantised */
    sched_base_quant_t qw = q;
    qw.experts_wide = true;
    int experts = 0, attn = 0;
    for (int i = 0; i < s.reg.num_tensors; i++) {
        const sched_tensor_t *t = &s.reg.tensors[i];
        if (t->kind != SCHED_T_WEIGHT) continue;
        const bool covered = sched_base_quant_covers(t, s.reg.num_blocks, &qw);
        if (t->expert >= 0) {
            EXPECT(!covered, "%s: an expert of a transformers 5 bitsandbytes checkpoint is not quantized", t->name);
            experts++;
        }
        if (strstr(t->name, "k_proj") && !t->trainable) {
            EXPECT(covered, "%s: attention stays quantized", t->name);
            attn++;
        }
    }
    EXPECT(experts > 0 && attn > 0, "experts %d, attention %d", experts, attn);
    free(before.blocks);
    sched_test_teardown(&s);
}

int main(void) {
    test_nvme_by_hand();
    test_nvme_lead();
    test_nvme_arrival_order();
    test_nvme_planner();
    test_quant_bytes();
    if (failures) fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
