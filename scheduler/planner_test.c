/* Planner: the planning cases users ask about (Mixtral-8x7B full fine-tuning on an H100
 * PCIe with 1 TiB / 512 GiB of host memory; Qwen3-30B-A3B LoRA on an RTX
 * 4090 with 128 GiB, and with a device budget below one block's working
 * set), monotonicity in the device budget, fixed policies and overrides.
 * The models are decoder-shaped generic lists built from their sizes
 * (scheduler/testutil.h: the scheduler sees no engine description); the
 * hardware profiles are the shipped files. */
#include "scheduler/planner.h"
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

static bool setup(sched_test_setup_t *s, const sched_test_model_t *m, const sched_run_shape_t *sh,
                  const char *hw_path) {
    mt_error_t err = {0};
    sched_hw_t hw;
    const bool ok = sched_hw_load(hw_path, &hw, &err) == MT_OK && sched_test_setup(s, m, sh, &hw, &err) == MT_OK;
    EXPECT(ok, "setup: %s", err.msg);
    return ok;
}

/* Mixtral-8x7B's sizes (46.70 B parameters) */
static sched_test_model_t mixtral(void) {
    sched_test_model_t m = {0};
    m.num_layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.head_dim = 128, m.vocab = 32000;
    m.num_experts = 8, m.top_k = 2, m.expert_inter = 14336;
    return m;
}

/* Qwen3-30B-A3B's sizes (without its q/k norms) */
static sched_test_model_t qwen3(void) {
    sched_test_model_t m = {0};
    m.num_layers = 48, m.hidden = 2048, m.heads = 32, m.kv_heads = 4, m.head_dim = 128, m.vocab = 151936;
    m.num_experts = 128, m.top_k = 8, m.expert_inter = 768;
    return m;
}

static sched_run_shape_t full_ft(int T) {
    sched_run_shape_t s = {0};
    s.micro_batch_size = 1, s.sequence_len = T, s.grad_accum = 1, s.bf16 = true, s.max_grad_norm = 1.0;
    return s;
}

static sched_run_shape_t lora(int T) {
    sched_run_shape_t s = full_ft(T);
    s.lora = true, s.lora_r = 16, s.num_lora_targets = 4;
    const char *t[] = {"q_proj", "k_proj", "v_proj", "o_proj"};
    for (int i = 0; i < 4; i++) snprintf(s.lora_targets[i], sizeof s.lora_targets[i], "%s", t[i]);
    return s;
}

static bool plan(const sched_test_setup_t *s, sched_planner_opts_t *o, sched_planner_result_t *r) {
    mt_error_t err = {0};
    mt_status_t st = sched_plan_make(&s->w, o, r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    return st == MT_OK;
}

static bool within(const sched_planner_result_t *r, const sched_planner_opts_t *o) {
    for (int m = 0; m < SCHED_MEM_COUNT; m++)
        if (o->budget[m] > 0 && r->sim.peak[m] > o->budget[m]) return false;
    return true;
}

static void test_mixtral_full(void) {
    sched_test_model_t m = mixtral();
    sched_run_shape_t sh = full_ft(4096);
    sched_test_setup_t s;
    if (!setup(&s, &m, &sh, "configs/hw/h100-80gb-pcie.yaml")) return;
    sched_planner_opts_t o;
    sched_planner_opts_default(&o);
    o.budget[SCHED_MEM_DEVICE] = 80 * GiB;
    o.budget[SCHED_MEM_PINNED] = 256 * GiB;
    o.budget[SCHED_MEM_HOST] = 1024 * GiB;
    sched_planner_result_t r;
    if (plan(&s, &o, &r)) {
        EXPECT(r.feasible, "1 TiB host: %s", r.why);
        EXPECT(within(&r, &o), "peaks within budgets: device %.1f GiB host %.1f GiB", r.sim.peak[0] / GiB,
               r.sim.peak[2] / GiB);
        EXPECT(r.sim.step_time > 0.5 && r.sim.step_time < 600, "step time %g s", r.sim.step_time);
        /* fp32 master + m + v of 46.7 B parameters cannot sit in 80 GB: the host holds most of it */
        EXPECT(r.sim.peak[SCHED_MEM_HOST] > 500 * GiB, "host peak %.1f GiB", r.sim.peak[SCHED_MEM_HOST] / GiB);
        sched_planner_result_free(&r);
    }
    o.budget[SCHED_MEM_HOST] = 512 * GiB;
    if (plan(&s, &o, &r)) {
        EXPECT(!r.feasible, "512 GiB host must not fit");
        EXPECT(r.short_of[SCHED_MEM_HOST] && !r.short_of[SCHED_MEM_DEVICE], "host is the short budget");
        EXPECT(r.needed[SCHED_MEM_HOST] > 512 * GiB && r.needed[SCHED_MEM_HOST] < 1024 * GiB, "needed %.1f GiB",
               r.needed[SCHED_MEM_HOST] / GiB);
        EXPECT(strstr(r.why, "host memory is short") && strstr(r.why, "alone is 521.9 GiB"), "why: %s", r.why);
        sched_planner_result_free(&r);
    }
    /* fixed policies: keep_all needs ~18 B/param on the device */
    o.budget[SCHED_MEM_HOST] = 1024 * GiB;
    o.policy = SCHED_POLICY_KEEP_ALL;
    if (plan(&s, &o, &r)) {
        EXPECT(!r.feasible && r.short_of[SCHED_MEM_DEVICE] && r.needed[SCHED_MEM_DEVICE] > 46.7e9 * 18,
               "keep_all: %s", r.why);
        sched_planner_result_free(&r);
    }
    o.policy = SCHED_POLICY_MIN_MEMORY;
    double t_min = 0;
    if (plan(&s, &o, &r)) {
        EXPECT(r.feasible, "min_memory: %s", r.why);
        for (int b = 1; b < r.plan.num_blocks - 1; b++)
            EXPECT(r.plan.blocks[b].acts == SCHED_ACTS_RECOMPUTE && r.plan.blocks[b].weights == SCHED_WEIGHTS_STREAM,
                   "uniform min_memory");
        t_min = r.sim.step_time;
        sched_planner_result_free(&r);
    }
    o.policy = SCHED_POLICY_AUTO;
    if (plan(&s, &o, &r)) {
        EXPECT(r.sim.step_time <= t_min * (1 + 1e-9), "auto (%g s) is no slower than min_memory (%g s)",
               r.sim.step_time, t_min);
        sched_planner_result_free(&r);
    }
    sched_test_teardown(&s);
}

static void test_qwen3_lora(void) {
    sched_test_model_t m = qwen3();
    sched_run_shape_t sh = lora(2048);
    sched_test_setup_t s;
    if (!setup(&s, &m, &sh, "configs/hw/rtx4090.yaml")) return;
    sched_planner_opts_t o;
    sched_planner_opts_default(&o);
    o.budget[SCHED_MEM_DEVICE] = 24 * GiB;
    o.budget[SCHED_MEM_PINNED] = 64 * GiB;
    o.budget[SCHED_MEM_HOST] = 128 * GiB;
    sched_planner_result_t r;
    if (plan(&s, &o, &r)) {
        EXPECT(r.feasible && within(&r, &o), "Qwen3 LoRA on a 4090 with 128 GiB: %s", r.why);
        sched_planner_result_free(&r);
    }
    o.budget[SCHED_MEM_DEVICE] = 1 * GiB;
    if (plan(&s, &o, &r)) {
        EXPECT(!r.feasible && r.short_of[SCHED_MEM_DEVICE], "1 GiB device must not fit");
        EXPECT(strstr(r.why, "device memory is short") && strstr(r.why, "smaller than one block's working set"),
               "why: %s", r.why);
        EXPECT(r.block_working_set > 1 * GiB, "working set %.2f GiB", r.block_working_set / GiB);
        sched_planner_result_free(&r);
    }
    sched_test_teardown(&s);
}

/* More device budget never predicts a slower step, and a budget that fits
 * keeps fitting. */
static void test_monotone(const sched_test_model_t *m, const sched_run_shape_t *sh, const char *hw,
                          const double *budgets_gib, int n) {
    sched_test_setup_t s;
    if (!setup(&s, m, sh, hw)) return;
    sched_planner_opts_t o;
    sched_planner_opts_default(&o);
    o.budget[SCHED_MEM_HOST] = 8192 * GiB;
    double prev = INFINITY;
    bool was_feasible = false;
    for (int i = 0; i < n; i++) {
        o.budget[SCHED_MEM_DEVICE] = budgets_gib[i] * GiB;
        sched_planner_result_t r;
        if (!plan(&s, &o, &r)) break;
        if (r.feasible) {
            EXPECT(within(&r, &o), "%s at %g GiB: over budget", hw, budgets_gib[i]);
            EXPECT(r.sim.step_time <= prev * (1 + 1e-12), "%s: %g GiB predicts %g s, less budget gave %g s", hw,
                   budgets_gib[i], r.sim.step_time, prev);
            prev = r.sim.step_time;
        }
        EXPECT(r.feasible || !was_feasible, "%s: %g GiB infeasible after a smaller budget fit", hw, budgets_gib[i]);
        was_feasible |= r.feasible;
        sched_planner_result_free(&r);
    }
    EXPECT(was_feasible, "%s: some budget fits", hw);
    sched_test_teardown(&s);
}

static void test_overrides(void) {
    sched_test_model_t m = mixtral();
    m.num_layers = 4; /* smaller: the point is the decisions, not the numbers */
    sched_run_shape_t sh = full_ft(1024);
    sched_test_setup_t s;
    if (!setup(&s, &m, &sh, "configs/hw/h100-sxm.yaml")) return;
    sched_planner_opts_t o;
    sched_planner_opts_default(&o);
    o.budget[SCHED_MEM_DEVICE] = 80 * GiB;
    o.acts = SCHED_ACTS_OFFLOAD;
    o.prefetch_window = 2;
    sched_planner_result_t r;
    if (plan(&s, &o, &r)) {
        for (int b = 0; b < r.plan.num_blocks; b++)
            EXPECT(r.plan.blocks[b].acts == SCHED_ACTS_OFFLOAD, "block %d acts %d", b, r.plan.blocks[b].acts);
        EXPECT(r.plan.prefetch_window == 2, "window %d", r.plan.prefetch_window);
        sched_planner_result_free(&r);
    }
    sched_planner_opts_default(&o);
    o.policy = SCHED_POLICY_OFFLOAD_ALL;
    o.optim = SCHED_OPTIM_DEVICE; /* a device optimizer brings resident weights and device grads along */
    if (plan(&s, &o, &r)) {
        for (int b = 0; b < r.plan.num_blocks; b++)
            EXPECT(r.plan.blocks[b].grads == SCHED_GRADS_DEVICE && r.plan.blocks[b].optim == SCHED_OPTIM_DEVICE &&
                       r.plan.blocks[b].weights == SCHED_WEIGHTS_RESIDENT && r.plan.blocks[b].acts == SCHED_ACTS_OFFLOAD,
                   "offload_all with optimizer device, block %d", b);
        sched_planner_result_free(&r);
    }
    o.grads = SCHED_GRADS_HOST;
    mt_error_t err = {0};
    EXPECT(sched_plan_make(&s.w, &o, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "grads: host"), "%s", err.msg);
    o.grads = SCHED_AUTO_CHOICE;
    o.weights = SCHED_WEIGHTS_STREAM;
    EXPECT(sched_plan_make(&s.w, &o, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "weights: stream"), "%s", err.msg);
    sched_test_teardown(&s);
}

/* A step's prediction follows the profile's rates: the attention rate of
 * the path a bf16 run takes, host AdamW's, and the pack and unpack rates
 * of a streamed plan; the fp32 kernel's rate does not touch a bf16 run
 * whose shape the tensor-core path takes. */
static double predict(const sched_test_model_t *m, const sched_run_shape_t *sh, const sched_hw_t *hw,
                      sched_policy_t policy) {
    sched_test_setup_t s;
    mt_error_t err = {0};
    if (sched_test_setup(&s, m, sh, hw, &err) != MT_OK) {
        EXPECT(false, "setup: %s", err.msg);
        return -1;
    }
    sched_plan_t p = {0};
    sched_plan_init_uniform(&p, s.w.num_blocks, policy);
    sched_sim_result_t r;
    const bool ok = sched_simulate(&s.w, &p, NULL, &r, &err) == MT_OK;
    EXPECT(ok, "%s", err.msg);
    const double t = ok ? r.step_time : -1;
    if (ok) sched_sim_result_free(&r);
    sched_plan_free(&p);
    sched_test_teardown(&s);
    return t;
}

/* The rate tests' model (a 2-layer Mixtral, full fine-tuning at 4096
 * tokens) and profile (h100-sxm); false when the profile does not load. */
static bool rates_setup(sched_test_model_t *m, sched_run_shape_t *sh, sched_hw_t *hw) {
    *m = mixtral();
    m->num_layers = 2;
    *sh = full_ft(4096);
    mt_error_t err = {0};
    if (sched_hw_load("configs/hw/h100-sxm.yaml", hw, &err) == MT_OK) return true;
    EXPECT(false, "%s", err.msg);
    return false;
}

static void test_rates(void) {
    sched_test_model_t m;
    sched_run_shape_t sh;
    sched_hw_t hw;
    if (!rates_setup(&m, &sh, &hw)) return;
    EXPECT(hw.assumed == 0, "h100-sxm gives every rate: %#x", hw.assumed);
    const double keep = predict(&m, &sh, &hw, SCHED_POLICY_KEEP_ALL);
    const double off = predict(&m, &sh, &hw, SCHED_POLICY_OFFLOAD_ALL);
    sched_hw_t h = hw;
    for (int d = 0; d < SCHED_DIR_COUNT; d++) h.attn_flops[SCHED_ATTN_KERNEL][d] /= 10;
    EXPECT(predict(&m, &sh, &h, SCHED_POLICY_KEEP_ALL) == keep, "the fp32 kernel's rate leaves a tc run alone");
    h = hw;
    for (int d = 0; d < SCHED_DIR_COUNT; d++) h.attn_flops[SCHED_ATTN_TC][d] /= 10;
    EXPECT(predict(&m, &sh, &h, SCHED_POLICY_KEEP_ALL) > keep, "slower tensor-core attention, slower step");
    sched_run_shape_t packed = sh;
    packed.packed_segments = true; /* the fp32 kernel runs packed rows */
    EXPECT(predict(&m, &packed, &hw, SCHED_POLICY_KEEP_ALL) > keep, "packed rows at the fp32 kernel's rate");
    h = hw;
    h.pack_bw /= 4;
    EXPECT(predict(&m, &sh, &h, SCHED_POLICY_OFFLOAD_ALL) > off, "slower packing, slower streamed step");
    h = hw;
    h.unpack_bw /= 4;
    EXPECT(predict(&m, &sh, &h, SCHED_POLICY_OFFLOAD_ALL) > off, "slower unpacking, slower streamed step");
    h = hw;
    h.adamw_bw /= 100;
    EXPECT(predict(&m, &sh, &h, SCHED_POLICY_OFFLOAD_ALL) > off, "slower host AdamW, slower step");
}

/* Host AdamW with lighter moments: bf16 and 8-bit moments move fewer bytes
 * per parameter (m and v each read and written) but their arithmetic has a
 * rate of its own; the step takes the slower of the two. */
static void test_moment_rates(void) {
    sched_test_model_t m;
    sched_run_shape_t sh;
    sched_hw_t hw;
    if (!rates_setup(&m, &sh, &hw)) return;
    mt_error_t err = {0};
    sched_test_setup_t f32, fast, slow;
    sched_hw_t h = hw;
    h.adamw_8bit_rate = 1e15; /* never bound by arithmetic */
    EXPECT(sched_test_setup(&f32, &m, &sh, &hw, &err) == MT_OK && sched_test_setup(&fast, &m, &sh, &h, &err) == MT_OK,
           "%s", err.msg);
    h.adamw_8bit_rate = 1e6; /* always */
    EXPECT(sched_test_setup(&slow, &m, &sh, &h, &err) == MT_OK, "%s", err.msg);
    sched_workload_set_moments(&fast.w, 2);
    sched_workload_set_moments(&slow.w, 2);
    const double per = 2.0 + 2.0 * 4.0 / 256.0; /* 8-bit m and v with their absmax, bytes per parameter */
    int checked = 0;
    for (int b = 0; b < f32.w.num_blocks; b++) {
        const sched_block_cost_t *c = &f32.w.blocks[b];
        const double params = c->grad_step_bytes / 4.0;
        if (params <= 0) continue;
        const double bpp = c->adam_host_s * hw.adamw_bw / params; /* 28 or 30 with fp32 moments */
        EXPECT(fabs(bpp - 30.0) < 1e-6 || fabs(bpp - 28.0) < 1e-6, "block %d: %g B per parameter", b, bpp);
        const double want = (bpp - 2.0 * (8.0 - per)) * params / hw.adamw_bw;
        EXPECT(fabs(fast.w.blocks[b].adam_host_s - want) <= 1e-9 * want, "block %d: 8-bit by its bytes %g, want %g", b,
               fast.w.blocks[b].adam_host_s, want);
        const double bound = params / (1e6 * hw.host_cores);
        EXPECT(fabs(slow.w.blocks[b].adam_host_s - bound) <= 1e-9 * bound, "block %d: 8-bit by its arithmetic %g, want %g",
               b, slow.w.blocks[b].adam_host_s, bound);
        checked++;
    }
    EXPECT(checked == f32.w.num_blocks, "every block trains: %d of %d", checked, f32.w.num_blocks);
    /* two NUMA nodes: each runs its cores on its own state, the AdamW and norm times halve */
    sched_test_setup_t two;
    h = hw;
    h.numa_nodes = 2;
    EXPECT(sched_test_setup(&two, &m, &sh, &h, &err) == MT_OK, "%s", err.msg);
    for (int b = 0; b < f32.w.num_blocks; b++) {
        const sched_block_cost_t *c = &f32.w.blocks[b], *c2 = &two.w.blocks[b];
        EXPECT(fabs(2 * c2->adam_host_s - c->adam_host_s) <= 1e-9 * c->adam_host_s &&
                   fabs(2 * c2->norm_host_s - c->norm_host_s) <= 1e-9 * c->norm_host_s,
               "block %d on two nodes: AdamW %g s (one node %g), norm %g s (%g)", b, c2->adam_host_s, c->adam_host_s,
               c2->norm_host_s, c->norm_host_s);
    }
    sched_test_teardown(&two);
    sched_test_teardown(&f32);
    sched_test_teardown(&fast);
    sched_test_teardown(&slow);
}

int main(void) {
    test_rates();
    test_moment_rates();
    test_mixtral_full();
    test_qwen3_lora();
    sched_test_model_t m = mixtral();
    sched_run_shape_t sh = full_ft(4096);
    const double mix[] = {4, 8, 12, 16, 24, 32, 48, 64, 80, 120, 200, 400, 1000};
    test_monotone(&m, &sh, "configs/hw/h100-80gb-pcie.yaml", mix, (int)(sizeof mix / sizeof mix[0]));
    m = qwen3();
    sh = lora(2048);
    sh.grad_accum = 2;
    const double q3[] = {2, 4, 6, 8, 12, 16, 24, 48, 96};
    test_monotone(&m, &sh, "configs/hw/rtx4090.yaml", q3, (int)(sizeof q3 / sizeof q3[0]));
    test_overrides();
    if (failures) fprintf(stderr, "planner_test: %d failure(s)\n", failures);
    else printf("planner_test: all passed\n");
    return failures != 0;
}
