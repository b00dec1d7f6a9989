/* `moetune plan` output: text, JSON (schema in plan_cmd.h), Chrome trace.
 *
 * Design note: text and JSON are built from the same summaries (runs of
 * identical layers, per-kind totals, the bound explanation) so they cannot
 * disagree. */
#include "tools/plan/plan_report.h"

#include "base/quant.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "moe/staging.h"
#include "moe/staging_report.h"

static const char *weights_name(sched_weight_place_t p) { return p == SCHED_WEIGHTS_RESIDENT ? "resident" : "stream"; }
static const char *grads_name(sched_grad_place_t p) { return p == SCHED_GRADS_DEVICE ? "device" : "host"; }
static const char *optim_name(sched_optim_place_t p) { return p == SCHED_OPTIM_DEVICE ? "device" : "host"; }
static const char *acts_name(sched_act_place_t p) {
    return p == SCHED_ACTS_KEEP ? "keep" : p == SCHED_ACTS_OFFLOAD ? "offload" : "recompute";
}
/* Human-readable numbers for the text report: 46.70 B, 13.37 M; 78.23 GiB, 12.0 MiB; 756 TFLOPS, 95 GFLOPS. */
typedef struct {
    char s[32];
} str_t;

static str_t count_s(double v) {
    str_t o;
    if (v >= 1e9) snprintf(o.s, sizeof o.s, "%.2f B", v / 1e9);
    else if (v >= 1e6) snprintf(o.s, sizeof o.s, "%.2f M", v / 1e6);
    else if (v >= 1e3) snprintf(o.s, sizeof o.s, "%.1f K", v / 1e3);
    else snprintf(o.s, sizeof o.s, "%.0f", v);
    return o;
}

static str_t bytes_s(double v) {
    str_t o;
    if (v >= 1073741824.0) snprintf(o.s, sizeof o.s, "%.2f GiB", v / 1073741824.0);
    else if (v >= 1048576.0) snprintf(o.s, sizeof o.s, "%.1f MiB", v / 1048576.0);
    else if (v >= 1024.0) snprintf(o.s, sizeof o.s, "%.1f KiB", v / 1024.0);
    else snprintf(o.s, sizeof o.s, "%.0f B", v);
    return o;
}

static str_t flops_s(double v) {
    str_t o;
    if (v >= 1e12) snprintf(o.s, sizeof o.s, "%.1f TFLOPS", v / 1e12);
    else snprintf(o.s, sizeof o.s, "%.1f GFLOPS", v / 1e9);
    return o;
}

typedef struct {
    int first, last;
    char label[48];
} run_t;

static bool same(const sched_block_plan_t *a, const sched_block_plan_t *b) {
    return a->weights == b->weights && a->grads == b->grads && a->optim == b->optim && a->acts == b->acts &&
           a->lm_inputs == b->lm_inputs &&
           sched_block_nvme_optim(a) == sched_block_nvme_optim(b) &&
           sched_block_nvme_weights(a) == sched_block_nvme_weights(b);
}

/* Where a layer-major plan keeps block b's micro-batches' block inputs ("-":
 * the embedding has none, the head's are always kept). */
static const char *inputs_name(const sched_plan_t *p, int b) {
    if (b < 1 || b >= p->num_blocks - 1) return "-";
    return sched_input_place_name(p->blocks[b].lm_inputs);
}

/* What a block keeps on NVMe, for the decisions table. */
static const char *nvme_name(const sched_block_plan_t *bp) {
    const bool o = sched_block_nvme_optim(bp), w = sched_block_nvme_weights(bp);
    return o && w ? "optimizer+weights" : o ? "optimizer" : w ? "weights" : "-";
}

/* Embedding and head alone; decoder layers in runs of identical decisions. */
static int make_runs(const plan_ctx_t *c, run_t *runs) {
    const sched_plan_t *p = &c->res.plan;
    const int N = p->num_blocks;
    int n = 0;
    for (int b = 0; b < N;) {
        int e = b;
        if (b > 0 && b < N - 1)
            while (e + 1 < N - 1 && same(&p->blocks[e + 1], &p->blocks[b])) e++;
        runs[n].first = b;
        runs[n].last = e;
        if (b == 0) snprintf(runs[n].label, sizeof runs[n].label, "embed");
        else if (b == N - 1) snprintf(runs[n].label, sizeof runs[n].label, "head");
        else if (e == b) snprintf(runs[n].label, sizeof runs[n].label, "layer %d", b - 1);
        else snprintf(runs[n].label, sizeof runs[n].label, "layers %d-%d", b - 1, e - 1);
        n++;
        b = e + 1;
    }
    return n;
}

typedef struct {
    int resident, stream, gdev, ghost, odev, ohost, keep, offload, recompute;
    double resident_bytes, fetched_bytes, odev_bytes, ohost_bytes, grads_d2h;
    int onvme, wnvme;             /* blocks whose optimizer state / weights' home is on NVMe */
    double onvme_bytes, wnvme_bytes;
    int pinned, pinned_g;         /* blocks whose trained working copies / gradient accumulators are pinned */
    double pinned_bytes, pinned_g_bytes;
} kinds_t;

/* What the optimizer keeps per trainable parameter (optimizer_state), as
 * the plan counts it: the fp32 master where it is not the working copy,
 * the fp32 gradient and the moments. */
static void moments_text(FILE *f, const plan_ctx_t *c) {
    double params = 0, bytes = 0;
    for (int b = 0; b < c->w.num_blocks; b++) {
        params += c->w.blocks[b].grad_bytes / 4.0;
        bytes += c->w.blocks[b].optim_bytes + c->w.blocks[b].grad_bytes;
    }
    if (params <= 0) return;
    static const char *const names[3] = {"fp32", "bf16", "8bit"};
    fprintf(f, "  optim. state  %.2f bytes per trainable parameter (master, gradient, %s moments; %.3g G parameters)\n",
            bytes / params, names[eng_config_moments(&c->rc)], params / 1e9);
}

static kinds_t kinds(const plan_ctx_t *c) {
    kinds_t k = {0};
    const sched_plan_t *p = &c->res.plan;
    for (int b = 0; b < p->num_blocks; b++) {
        const sched_block_plan_t *bp = &p->blocks[b];
        const sched_block_cost_t *bc = &c->w.blocks[b];
        if (bp->weights == SCHED_WEIGHTS_RESIDENT) k.resident++, k.resident_bytes += bc->w_resident_bytes;
        else k.stream++;
        if (bp->grads == SCHED_GRADS_DEVICE) k.gdev++;
        else k.ghost++;
        if (bp->optim == SCHED_OPTIM_DEVICE) k.odev++, k.odev_bytes += bc->optim_bytes;
        else k.ohost++, k.ohost_bytes += bc->optim_bytes;
        if (sched_block_nvme_optim(bp)) k.onvme++, k.onvme_bytes += bc->optim_bytes;
        if (sched_block_nvme_weights(bp)) k.wnvme++, k.wnvme_bytes += bc->w_home_bytes;
        if (sched_block_pinned_home(bp)) k.pinned++, k.pinned_bytes += bc->w_work_bytes;
        if (sched_block_pinned_grads(bp)) k.pinned_g++, k.pinned_g_bytes += bc->grad_bytes;
        k.keep += bp->acts == SCHED_ACTS_KEEP;
        k.offload += bp->acts == SCHED_ACTS_OFFLOAD;
        k.recompute += bp->acts == SCHED_ACTS_RECOMPUTE;
    }
    for (int i = 0; i < c->res.sim.num_tasks; i++) {
        const sched_task_t *t = &c->res.sim.tasks[i];
        if (t->kind == SCHED_TASK_FETCH_W) k.fetched_bytes += t->bytes;
        if (t->kind == SCHED_TASK_GRAD_D2H) k.grads_d2h += t->bytes;
    }
    return k;
}

/* The pinned staging each mode of moe/staging needs for the plan's
 * in-flight window, as the executor sizes its pool (engine/exec/place/stage.c):
 * prefetch_window + 1 consecutive blocks of streamed weights with every
 * expert, one block of host-bound gradients, and the saved activations of
 * every offloading block (one region each, held forward to backward).  A
 * plan that moves nothing through staging is shown for a window of
 * streamed layers instead, to compare the modes on the model. */
typedef struct {
    moe_staging_plan_t p;
    int window_blocks;
    bool hypothetical;
    double weights, grads, acts; /* the payload's parts */
} staging_need_t;

static void add_t(size_t **t, int *n, int *cap, size_t bytes) {
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 1024;
        *t = realloc(*t, (size_t)*cap * sizeof **t);
        MT_CHECK_ALLOC(*t, "staging window");
    }
    (*t)[(*n)++] = bytes;
}

static double block_kind_bytes(const sched_registry_t *r, int b, sched_tensor_kind_t kind, size_t **t, int *n,
                               int *cap) {
    double sum = 0;
    for (int i = 0; i < r->num_tensors; i++)
        if (r->tensors[i].block == b && r->tensors[i].kind == kind) {
            sum += (double)r->tensors[i].bytes;
            if (t) add_t(t, n, cap, r->tensors[i].bytes);
        }
    return sum;
}

static staging_need_t staging_need(const plan_ctx_t *c) {
    const sched_registry_t *r = &c->reg;
    const sched_plan_t *p = &c->res.plan;
    staging_need_t out;
    memset(&out, 0, sizeof out);
    const int N = p->num_blocks, W1 = (p->prefetch_window > 0 ? p->prefetch_window : 1) + 1;
    out.window_blocks = W1;
    bool any = false;
    for (int b = 0; b < N; b++)
        any |= p->blocks[b].weights == SCHED_WEIGHTS_STREAM || p->blocks[b].grads == SCHED_GRADS_HOST ||
                p->blocks[b].acts == SCHED_ACTS_OFFLOAD;
    out.hypothetical = !any;
    size_t largest = 0, *t = NULL;
    int n = 0, cap = 0;
    for (int i = 0; i < r->num_tensors; i++)
        if (r->tensors[i].kind == SCHED_T_WEIGHT && r->tensors[i].bytes > largest) largest = r->tensors[i].bytes;
    /* weights: the W1 consecutive streamed blocks with the most bytes */
    int best0 = -1;
    double best = 0;
    for (int b0 = 0; b0 < N; b0++) {
        double sum = 0;
        for (int b = b0; b < b0 + W1 && b < N; b++)
            if (out.hypothetical || p->blocks[b].weights == SCHED_WEIGHTS_STREAM)
                sum += block_kind_bytes(r, b, SCHED_T_WEIGHT, NULL, NULL, NULL);
        if (sum > best) best = sum, best0 = b0;
    }
    for (int b = best0; best0 >= 0 && b < best0 + W1 && b < N; b++)
        if (out.hypothetical || p->blocks[b].weights == SCHED_WEIGHTS_STREAM)
            block_kind_bytes(r, b, SCHED_T_WEIGHT, &t, &n, &cap);
    out.weights = best;
    /* one block of gradients on their way to the host */
    int gb = -1;
    for (int b = 0; b < N; b++) {
        if (!out.hypothetical && p->blocks[b].grads != SCHED_GRADS_HOST) continue;
        const double g = block_kind_bytes(r, b, SCHED_T_GRAD, NULL, NULL, NULL);
        if (g > out.grads) out.grads = g, gb = b;
    }
    if (gb >= 0) block_kind_bytes(r, gb, SCHED_T_GRAD, &t, &n, &cap);
    /* activations held in pinned memory from forward to backward */
    for (int b = 0; b < N && !out.hypothetical; b++)
        if (p->blocks[b].acts == SCHED_ACTS_OFFLOAD) {
            const double a = block_kind_bytes(r, b, SCHED_T_ACT, NULL, NULL, NULL);
            if (a <= 0) continue;
            add_t(&t, &n, &cap, (size_t)a);
            out.acts += a;
            if ((size_t)a > largest) largest = (size_t)a;
        }
    const moe_staging_plan_opts_t po = {.largest_tensor = largest};
    moe_staging_plan_all(t, n, &po, &out.p);
    free(t);
    return out;
}

static void staging_text(FILE *f, const plan_ctx_t *c) {
    const staging_need_t st = staging_need(c);
    char what[256];
    snprintf(what, sizeof what, "%s (%d blocks in flight%s)", c->mc.model_type, st.window_blocks,
             st.hypothetical ? "; this plan stages nothing, shown for streamed layers" : "");
    fprintf(f, "\nstaging         weights %s + gradients %s + offloaded activations %s in flight\n",
            bytes_s(st.weights).s, bytes_s(st.grads).s, bytes_s(st.acts).s);
    moe_staging_plan_print(f, what, &st.p);
    const double host = c->res.sim.peak[SCHED_MEM_HOST];
    fprintf(f, "host memory in total (host %s, pinned buffers included, + pinned staging): compact %s, per_tensor %s, "
               "max_slot %s\n",
            bytes_s(host).s, bytes_s(host + (double)st.p.compact).s, bytes_s(host + (double)st.p.per_tensor).s,
            bytes_s(host + (double)st.p.max_slot).s);
}

static json_t *staging_json(const plan_ctx_t *c) {
    const staging_need_t st = staging_need(c);
    const double host = c->res.sim.peak[SCHED_MEM_HOST];
    json_t *o = json_object();
    MT_CHECK_ALLOC(o, "staging JSON");
    json_object_set_new(o, "window_blocks", json_integer(st.window_blocks));
    json_object_set_new(o, "hypothetical", json_boolean(st.hypothetical));
    json_object_set_new(o, "tensors", json_integer(st.p.tensors));
    json_object_set_new(o, "payload_bytes", json_integer((json_int_t)st.p.payload));
    json_object_set_new(o, "weights_bytes", json_real(st.weights));
    json_object_set_new(o, "grads_bytes", json_real(st.grads));
    json_object_set_new(o, "acts_bytes", json_real(st.acts));
    json_object_set_new(o, "largest_tensor_bytes", json_integer((json_int_t)st.p.largest_tensor));
    json_object_set_new(o, "compact_bytes", json_integer((json_int_t)st.p.compact));
    json_object_set_new(o, "per_tensor_bytes", json_integer((json_int_t)st.p.per_tensor));
    json_object_set_new(o, "per_tensor_pow2_bytes", json_integer((json_int_t)st.p.per_tensor_pow2));
    json_object_set_new(o, "max_slot_bytes", json_integer((json_int_t)st.p.max_slot));
    json_object_set_new(o, "max_slot_slots", json_integer(st.p.max_slot_slots));
    json_object_set_new(o, "host_total_bytes",
                        json_pack("{s:f, s:f, s:f}", "compact", host + (double)st.p.compact, "per_tensor",
                                  host + (double)st.p.per_tensor, "max_slot", host + (double)st.p.max_slot));
    return o;
}

/* The attention path the run's ops take (the tensor-core one when any of
 * them does); *any false when the model has no attention op. */
static sched_attn_path_t attn_path(const sched_registry_t *r, bool *any) {
    *any = false;
    sched_attn_path_t p = SCHED_ATTN_KERNEL;
    for (int i = 0; i < r->num_ops; i++) {
        if (!r->ops[i].attention) continue;
        *any = true;
        if (r->ops[i].attention_tc) p = SCHED_ATTN_TC;
    }
    return p;
}

/* One rate for both directions, as the cost model counts their FLOPs (4
 * and 10 x pairs x head dim): 14 / (4 / fwd + 10 / bwd). */
static double attn_both(const sched_hw_t *hw, sched_attn_path_t p) {
    return 14.0 / (4.0 / hw->attn_flops[p][SCHED_DIR_FWD] + 10.0 / hw->attn_flops[p][SCHED_DIR_BWD]);
}

/* The rates lines: device rates, the host's work beside the copies, and
 * what the profile left to the stated rules. */
static void rates_text(FILE *f, const plan_ctx_t *c) {
    const sched_hw_t *hw = &c->hw;
    const sched_registry_t *r = &c->reg;
    bool any;
    const sched_attn_path_t p = attn_path(r, &any);
    fprintf(f, "rates      matmul %.1f TFLOP/s (%s), attention %.4g/%.4g TFLOP/s fwd/bwd (%s%s), device memory %.0f GB/s\n",
            sched_hw_flops(hw, sched_matmul_rate(r)) / 1e12, sched_rate_name(sched_matmul_rate(r)),
            hw->attn_flops[p][SCHED_DIR_FWD] / 1e12, hw->attn_flops[p][SCHED_DIR_BWD] / 1e12,
            p == SCHED_ATTN_TC ? "tensor-core path" : "fp32 kernel", any ? "" : "; no attention op",
            sched_hw_device_bw(hw) / 1e9);
    const int fmt = eng_config_moments(&c->rc);
    char lite[128] = "";
    if (fmt != 0) { /* a lighter format's arithmetic may bound it (optimizer-state.md) */
        const double per_core = fmt == 1 ? hw->adamw_bf16_rate : hw->adamw_8bit_rate;
        snprintf(lite, sizeof lite, " or %.3g G parameters/s with %s moments (%.2f per core x %d)",
                 per_core * hw->host_cores * sched_hw_numa_nodes(hw) / 1e9, fmt == 1 ? "bf16" : "8-bit", per_core / 1e9,
                 hw->host_cores * sched_hw_numa_nodes(hw));
    }
    char nodes[64] = "";
    if (sched_hw_numa_nodes(hw) > 1)
        snprintf(nodes, sizeof nodes, " (%d NUMA nodes x %.0f GB/s)", sched_hw_numa_nodes(hw), hw->adamw_bw / 1e9);
    fprintf(f, "host work  AdamW %.0f GB/s%s%s, pack into staging %.3g GB/s, gradient unpack %.3g GB/s\n",
            sched_hw_adamw_bw(hw) / 1e9, nodes, lite, hw->pack_bw / 1e9, hw->unpack_bw / 1e9);
    char assumed[512];
    sched_hw_assumed_line(hw, assumed, sizeof assumed);
    if (assumed[0]) fprintf(f, "assumed    (not in the profile) %s\n", assumed);
}

static void bound_text(const plan_ctx_t *c, char *buf, size_t cap) {
    const sched_sim_result_t *s = &c->res.sim;
    const double idle = s->waited[s->bottleneck];
    switch (s->bottleneck) {
    case SCHED_RES_COMPUTE:
        snprintf(buf, cap, "compute: the compute stream is busy %.0f%% of the step", 100 * s->busy[0] / s->step_time);
        break;
    case SCHED_RES_H2D:
        snprintf(buf, cap, "H2D link: the compute stream waits %.3g s for weight and activation fetches", idle);
        break;
    case SCHED_RES_D2H:
        snprintf(buf, cap, "D2H stream: the compute stream waits %.3g s for gradients and activations to drain "
                 "(gradients are unpacked into host memory on that stream, %.3g GB/s)", idle, c->w.unpack_bw / 1e9);
        break;
    case SCHED_RES_HOST:
        snprintf(buf, cap, "host optimizer: %.3g s of host AdamW %s", idle,
                 c->w.clip ? "after the backward (max_grad_norm > 0: it waits for the global gradient norm; "
                             "scheduler.speculative_optimizer: true or max_grad_norm: 0 lets it overlap the "
                             "backward)"
                           : "beyond the end of the backward");
        break;
    case SCHED_RES_NVME:
        snprintf(buf, cap, "NVMe array: the step waits %.3g s for optimizer state and weights to cross it "
                 "(%.1f GB/s read, %.1f GB/s write)", idle, c->w.nvme_read_bw / 1e9, c->w.nvme_write_bw / 1e9);
        break;
    case SCHED_RES_PACK:
        snprintf(buf, cap, "host staging: the compute stream waits %.3g s for the pack threads, which pack weights into "
                 "pinned staging before their H2D copies and unpack gradients after their D2H copies (%.3g GB/s)",
                 idle, c->w.pack_bw / 1e9);
        break;
    default: snprintf(buf, cap, "?"); break;
    }
}

/* The NVMe tier's line and the quantized base's, when the run has them. */
static void tiers_text(FILE *f, const plan_ctx_t *c) {
    const sched_sim_result_t *s = &c->res.sim;
    if (c->opts.nvme) {
        char budget[96];
        if (c->opts.nvme_budget > 0) snprintf(budget, sizeof budget, "of %s", bytes_s(c->opts.nvme_budget).s);
        else snprintf(budget, sizeof budget, "with no memory.nvme.budget (training checks the directory's free space)");
        fprintf(f, "nvme            %s read + %s written per step, busy %.3f s (%.0f%% of the step); holds %s %s "
                "(%.1f/%.1f GB/s read/write, queue depth %d)\n",
                bytes_s(s->nvme_read_bytes).s, bytes_s(s->nvme_write_bytes).s, s->busy[SCHED_RES_NVME],
                s->step_time > 0 ? 100 * s->busy[SCHED_RES_NVME] / s->step_time : 0, bytes_s(s->nvme_bytes).s, budget,
                c->w.nvme_read_bw / 1e9, c->w.nvme_write_bw / 1e9, c->hw.nvme_queue_depth);
    }
    if (c->w.base_quantized)
        fprintf(f, "base            %s kept %s%s (%s in the working dtype): host home, fetches and resident copies "
                "at that size, dequantized on the device into a working copy per block in use\n",
                bytes_s(c->w.base_quant_bytes).s, mt_quant_format_name(c->w.base_quant_format),
                c->quant.double_quant ? " with double quantization" : "", bytes_s(c->w.base_quant_work_bytes).s);
}

/* The step order chosen and why: each order's best plan side by side. */
static void order_text(FILE *f, const plan_ctx_t *c) {
    const sched_planner_result_t *r = &c->res;
    const double tps = c->reg.tokens_per_step;
    const int ga = c->reg.shape.grad_accum;
    fprintf(f, "step order      %s", r->plan.layer_major ? "layer-major" : "micro-batch-major");
    if (!(r->planned[0] && r->planned[1])) {
        fprintf(f, " (%s)\n", ga <= 1 ? "one micro-batch per step: the orders are the same"
                                      : "fixed by the run's step_order");
    } else {
        const double t0 = r->order_step_s[0], t1 = r->order_step_s[1];
        const double b0 = r->order_h2d_bytes[0] + r->order_d2h_bytes[0];
        const double b1 = r->order_h2d_bytes[1] + r->order_d2h_bytes[1];
        const int nin = r->order_inputs_offloaded[1];
        if (r->plan.layer_major) {
            fprintf(f, ": %.2fx the tokens/s of micro-batch-major; each block runs all %d micro-batches before the "
                       "next, so streamed weights and host-bound gradients cross the link once per step instead of "
                       "once per micro-batch (%s instead of %s per step)",
                    t1 > 0 ? t0 / t1 : 0, ga, bytes_s(b1).s, bytes_s(b0).s);
            if (nin > 0)
                fprintf(f, "; the block inputs of %d layers wait in host memory (%s each way per step)", nin,
                        bytes_s(r->order_input_bytes[1]).s);
            fputc('\n', f);
        } else if (!r->order_feasible[1] && nin > 0) {
            fprintf(f, ": layer-major does not fit even with the block inputs of %d layers offloaded: it holds %d "
                       "micro-batches' block outputs and kept activations at once (device peak %s)\n",
                    nin, ga, bytes_s(r->order_peak_device[1]).s);
        } else if (!r->order_feasible[1]) {
            fprintf(f, ": layer-major does not fit: it holds %d micro-batches' block inputs and kept activations "
                       "at once (device peak %s)\n",
                    ga, bytes_s(r->order_peak_device[1]).s);
        }
        else
            fprintf(f, ": layer-major is predicted no faster (the link is not what bounds this step)\n");
    }
    const char *names[2] = {"micro-batch-major", "layer-major"};
    for (int k = 0; k < 2; k++) {
        if (!r->planned[k]) continue;
        const double t = r->order_step_s[k];
        fprintf(f, "  %-17s %8.3f s/step %8.0f tokens/s  h2d %10s  d2h %10s per step  device peak %10s%s\n", names[k],
                t, t > 0 ? tps / t : 0, bytes_s(r->order_h2d_bytes[k]).s, bytes_s(r->order_d2h_bytes[k]).s,
                bytes_s(r->order_peak_device[k]).s, r->order_feasible[k] ? "" : "  (does not fit)");
    }
    fputc('\n', f);
}

static double mfu(const plan_ctx_t *c) {
    const double t = c->res.sim.step_time;
    return t > 0 && c->w.peak_flops > 0 ? c->reg.model_flops / t / c->w.peak_flops : 0;
}

void plan_report_text(FILE *f, const plan_ctx_t *c) {
    const sched_registry_t *r = &c->reg;
    const eng_model_config_t *m = &c->mc;
    const sched_run_shape_t *sh = &r->shape;
    const sched_hw_t *hw = &c->hw;
    const sched_sim_result_t *s = &c->res.sim;
    fprintf(f, "moetune plan: %s\n", c->run_path);
    fprintf(f, "model      %s (%s): %d layers, hidden %d, %d experts top-%d; %s parameters, %s active per token\n",
            c->mc.model_type, c->model_config_path, m->num_hidden_layers, m->hidden_size, m->num_experts, m->num_experts_per_tok,
            count_s(r->params).s, count_s(r->active_params).s);
    if (sh->lora)
        fprintf(f, "run        LoRA r=%d (%s trainable parameters)", sh->lora_r, count_s(r->train_params).s);
    else
        fprintf(f, "run        full fine-tuning (%s trainable parameters)", count_s(r->train_params).s);
    fprintf(f, ", %s; micro-batch %d x %d tokens, %d per step = %.0f tokens/step; max_grad_norm %g\n",
            !sh->bf16  ? "fp32 weights and activations"
            : sh->lora ? "bf16 base weights, fp32 adapters"
                       : "bf16 working copies, fp32 master weights",
            sh->micro_batch_size, sh->sequence_len, sh->grad_accum, r->tokens_per_step, sh->max_grad_norm);
    fprintf(f, "hardware   %s (%s): %s; %s %.1f/%.1f GB/s h2d/d2h; host %.0f GB/s\n", hw->name, hw->source,
            hw->device_name[0] ? hw->device_name : "device", hw->link_name[0] ? hw->link_name : "link",
            sched_hw_h2d_bw(hw) / 1e9, sched_hw_d2h_bw(hw) / 1e9, sched_hw_host_bw(hw) / 1e9);
    rates_text(f, c);
    fprintf(f, "policy     %s, prefetch window %d\n\n", sched_policy_name(c->opts.policy), c->res.plan.prefetch_window);
    order_text(f, c);

    if (c->res.feasible) {
        fprintf(f, "FEASIBLE\n");
    } else {
        fprintf(f, "INFEASIBLE: %s\n", c->res.why);
        fprintf(f, "(the numbers below are for %s)\n",
                c->opts.policy == SCHED_POLICY_AUTO ? "the plan that needs the least memory" : "the policy's plan");
    }
    char bound[512];
    bound_text(c, bound, sizeof bound);
    fprintf(f, "step time       %.3f s (compute busy %.3f s, idle %.3f s; recomputation %.3f s)\n", s->step_time,
            s->busy[SCHED_RES_COMPUTE], s->compute_idle, s->recompute_s);
    fprintf(f, "tokens/s        %.0f\n", r->tokens_per_step / s->step_time);
    fprintf(f, "model TFLOPS    %.3g   MFU %.1f%% of %s %s peak\n", r->model_flops / s->step_time / 1e12, 100 * mfu(c),
            flops_s(c->w.peak_flops).s, sh->bf16 ? "bf16" : "fp32");
    fprintf(f, "bound by        %s\n", bound);
    fprintf(f, "stream busy     compute %.3f s, h2d %.3f s (%s), d2h %.3f s (%s), host %.3f s, "
            "pack %.3f s (packing and unpacking)\n",
            s->busy[SCHED_RES_COMPUTE], s->busy[SCHED_RES_H2D], bytes_s(s->h2d_bytes).s, s->busy[SCHED_RES_D2H],
            bytes_s(s->d2h_bytes).s, s->busy[SCHED_RES_HOST], s->busy[SCHED_RES_PACK]);
    if (s->busy[SCHED_RES_HOST] > 0)
        fprintf(f, "host AdamW      %.3f s after the backward (%.1f%% of the step), %.3f s overlapping it\n",
                s->waited[SCHED_RES_HOST], 100 * s->waited[SCHED_RES_HOST] / s->step_time,
                fmax(0, s->busy[SCHED_RES_HOST] - s->waited[SCHED_RES_HOST]));
    tiers_text(f, c);
    fputc('\n', f);

    fprintf(f, "memory                peak         budget\n");
    for (int mm = 0; mm < SCHED_MEM_COUNT; mm++) {
        str_t budget = bytes_s(c->opts.budget[mm]);
        if (!(c->opts.budget[mm] > 0)) snprintf(budget.s, sizeof budget.s, "unlimited");
        fprintf(f, "  %-8s %14s %14s%s\n", sched_mem_name((sched_mem_t)mm), bytes_s(s->peak[mm]).s, budget.s,
                c->res.short_of[mm] ? "   <- short" : "");
    }

    run_t *runs = malloc((size_t)c->res.plan.num_blocks * sizeof *runs);
    MT_CHECK_ALLOC(runs, "plan runs");
    int nr = make_runs(c, runs);
    /* layer-major plans: where each layer's micro-batches' block inputs wait */
    const bool lm = c->res.plan.layer_major;
    fprintf(f, "\ndecisions       weights   grads   optimizer  activations%s%s\n", lm ? "  block inputs" : "",
            c->opts.nvme ? "  on NVMe" : "");
    for (int i = 0; i < nr; i++) {
        const int b0 = runs[i].first;
        const sched_block_plan_t *bp = &c->res.plan.blocks[b0];
        char line[160];
        int n = snprintf(line, sizeof line, "  %-13s %-9s %-7s %-10s %-11s", runs[i].label, weights_name(bp->weights),
                         grads_name(bp->grads), optim_name(bp->optim), acts_name(bp->acts));
        if (lm) n += snprintf(line + n, sizeof line - (size_t)n, "  %-12s", inputs_name(&c->res.plan, b0));
        if (c->opts.nvme) n += snprintf(line + n, sizeof line - (size_t)n, "  %s", nvme_name(bp));
        while (n > 0 && line[n - 1] == ' ') line[--n] = '\0'; /* the last column unpadded */
        fprintf(f, "%s\n", line);
    }
    free(runs);
    kinds_t k = kinds(c);
    fprintf(f, "\nper tensor kind\n");
    fprintf(f, "  weights       resident %d blocks (%s on the device), streamed %d blocks (%s fetched per step)",
            k.resident, bytes_s(k.resident_bytes).s, k.stream, bytes_s(k.fetched_bytes).s);
    if (c->w.base_quantized)
        fprintf(f, "; frozen base %s as %s", bytes_s(c->w.base_quant_bytes).s, mt_quant_format_name(c->w.base_quant_format));
    if (k.wnvme > 0) fprintf(f, "; homes of %d blocks (%s) on NVMe", k.wnvme, bytes_s(k.wnvme_bytes).s);
    if (k.pinned > 0)
        fprintf(f, "; trained working copies of %d blocks (%s) pinned, copied to the link with nothing packed",
                k.pinned, bytes_s(k.pinned_bytes).s);
    fputc('\n', f);
    fprintf(f, "  gradients     device %d blocks, host %d blocks (%s D2H per step)", k.gdev, k.ghost,
            bytes_s(k.grads_d2h).s);
    if (k.pinned_g > 0)
        fprintf(f, "; host accumulators of %d blocks (%s) pinned, copied into with nothing unpacked", k.pinned_g,
                bytes_s(k.pinned_g_bytes).s);
    fputc('\n', f);
    fprintf(f, "  optimizer     device %d blocks (%s), host %d blocks (%s)", k.odev, bytes_s(k.odev_bytes).s, k.ohost,
            bytes_s(k.ohost_bytes).s);
    if (k.onvme > 0) fprintf(f, ", of which on NVMe %d blocks (%s)", k.onvme, bytes_s(k.onvme_bytes).s);
    fputc('\n', f);
    fprintf(f, "  activations   keep %d, offload %d, recompute %d blocks\n", k.keep, k.offload, k.recompute);
    moments_text(f, c);
    staging_text(f, c);
}

/* Whole numbers (byte counts, parameters) as JSON integers, so they print exactly. */
static json_t *num(double v) {
    if (v == (double)(json_int_t)v && v > -9007199254740992.0 && v < 9007199254740992.0) return json_integer((json_int_t)v);
    return json_real(v);
}

static void tiers_json(json_t *doc, const plan_ctx_t *c, const kinds_t *k);

/* Each step order's best plan, for --json's step_orders. */
static json_t *orders_json(const plan_ctx_t *c) {
    const sched_planner_result_t *r = &c->res;
    json_t *orders = json_object();
    for (int k = 0; k < 2; k++)
        if (r->planned[k])
            json_object_set_new(orders, k ? "layer" : "micro_batch",
                                json_pack("{s:b, s:o, s:o, s:o, s:o, s:o}", "feasible", r->order_feasible[k], "step_s",
                                          num(r->order_step_s[k]), "tokens_per_s",
                                          num(r->order_step_s[k] > 0 ? c->reg.tokens_per_step / r->order_step_s[k] : 0),
                                          "h2d_bytes", num(r->order_h2d_bytes[k]), "d2h_bytes",
                                          num(r->order_d2h_bytes[k]), "peak_device_bytes",
                                          num(r->order_peak_device[k])));
    json_t *lmo = json_object_get(orders, "layer");
    if (lmo) { /* its plan's block inputs in host memory: layers, and bytes each way per step */
        json_object_set_new(lmo, "inputs_offloaded_layers", json_integer(r->order_inputs_offloaded[1]));
        json_object_set_new(lmo, "input_bytes", num(r->order_input_bytes[1]));
    }
    return orders;
}

/* The profile's rates the prediction used, and what of them a rule filled. */
static json_t *hardware_json(const plan_ctx_t *c) {
    const sched_registry_t *r = &c->reg;
    const sched_hw_t *hw = &c->hw;
    bool any;
    const sched_attn_path_t p = attn_path(r, &any);
    char assumed[512];
    sched_hw_assumed_line(hw, assumed, sizeof assumed);
    json_t *h =
        json_pack("{s:s, s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "name", hw->name, "source",
                  hw->source, "device", hw->device_name, "link", hw->link_name, "host", hw->host_name,
                  "matmul_flops_per_s", num(sched_hw_flops(hw, sched_matmul_rate(r))), "peak_flops_per_s",
                  num(c->w.peak_flops), "device_bytes_per_s", num(sched_hw_device_bw(hw)), "h2d_bytes_per_s",
                  num(sched_hw_h2d_bw(hw)), "d2h_bytes_per_s", num(sched_hw_d2h_bw(hw)), "host_bytes_per_s",
                  num(sched_hw_host_bw(hw)), "copy_latency_s", num(hw->copy_latency_s));
    MT_CHECK_ALLOC(h, "plan JSON");
    json_object_set_new(h, "attention_flops_per_s", num(attn_both(hw, p)));
    json_object_set_new(h, "attention", json_pack("{s:s, s:o, s:o}", "path", p == SCHED_ATTN_TC ? "tc" : "kernel",
                                                  "fwd_flops_per_s", num(hw->attn_flops[p][SCHED_DIR_FWD]),
                                                  "bwd_flops_per_s", num(hw->attn_flops[p][SCHED_DIR_BWD])));
    json_object_set_new(h, "adamw_bytes_per_s", num(hw->adamw_bw));
    json_object_set_new(h, "adamw_bf16_params_per_s_per_core", num(hw->adamw_bf16_rate));
    json_object_set_new(h, "adamw_8bit_params_per_s_per_core", num(hw->adamw_8bit_rate));
    json_object_set_new(h, "pack_bytes_per_s", num(hw->pack_bw));
    json_object_set_new(h, "unpack_bytes_per_s", num(hw->unpack_bw));
    json_object_set_new(h, "assumed", json_string(assumed));
    return h;
}

json_t *plan_report_json(const plan_ctx_t *c) {
    const sched_registry_t *r = &c->reg;
    const eng_model_config_t *m = &c->mc;
    const sched_run_shape_t *sh = &r->shape;
    const sched_sim_result_t *s = &c->res.sim;
    json_t *doc = json_object();
    MT_CHECK_ALLOC(doc, "plan JSON");
    json_object_set_new(doc, "schema", json_string("moetune.plan/1"));
    json_object_set_new(doc, "run_config", json_string(c->run_path));
    json_object_set_new(doc, "model",
                        json_pack("{s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o, s:o}", "model_type",
                                  c->mc.model_type, "config", c->model_config_path, "layers", m->num_hidden_layers,
                                  "hidden", m->hidden_size, "heads", m->num_attention_heads, "kv_heads",
                                  m->num_key_value_heads, "vocab", m->vocab_size, "experts", m->num_experts, "top_k",
                                  m->num_experts_per_tok, "params", num(r->params), "active_params",
                                  num(r->active_params), "trainable_params", num(r->train_params)));
    json_object_set_new(doc, "run",
                        json_pack("{s:i, s:i, s:i, s:o, s:s, s:i, s:b, s:o}", "micro_batch_size", sh->micro_batch_size,
                                  "sequence_len", sh->sequence_len, "gradient_accumulation_steps", sh->grad_accum,
                                  "tokens_per_step", num(r->tokens_per_step), "adapter", sh->lora ? "lora" : "none",
                                  "lora_r", sh->lora ? sh->lora_r : 0, "bf16_working_copies", sh->bf16,
                                  "max_grad_norm", num(sh->max_grad_norm)));
    json_object_set_new(doc, "hardware", hardware_json(c));
    json_object_set_new(doc, "policy", json_string(sched_policy_name(c->opts.policy)));
    json_object_set_new(doc, "feasible", json_boolean(c->res.feasible));
    json_object_set_new(doc, "step_order", json_string(c->res.plan.layer_major ? "layer" : "micro_batch"));
    json_object_set_new(doc, "step_orders", orders_json(c));
    if (!c->res.feasible) {
        json_object_set_new(doc, "reason", json_string(c->res.why));
        json_t *shorts = json_array(), *needed = json_object();
        for (int mm = 0; mm < SCHED_MEM_COUNT; mm++)
            if (c->res.short_of[mm]) {
                json_array_append_new(shorts, json_string(sched_mem_name((sched_mem_t)mm)));
                json_object_set_new(needed, sched_mem_name((sched_mem_t)mm), num(c->res.needed[mm]));
            }
        json_object_set_new(doc, "short", shorts);
        json_object_set_new(doc, "needed_bytes", needed);
    }
    const char *res_keys[SCHED_RES_COUNT] = {"compute", "h2d", "d2h", "host", "nvme", "pack"};
    json_t *busy = json_object(), *waited = json_object();
    for (int i = 0; i < SCHED_RES_COUNT; i++) {
        json_object_set_new(busy, res_keys[i], num(s->busy[i]));
        json_object_set_new(waited, res_keys[i], num(s->waited[i]));
    }
    json_object_set_new(
        doc, "prediction",
        json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:s, s:o, s:o, s:o, s:o}", "step_time_s", num(s->step_time),
                  "tokens_per_s", num(r->tokens_per_step / s->step_time), "model_flops", num(r->model_flops),
                  "model_tflops", num(r->model_flops / s->step_time / 1e12), "mfu", num(mfu(c)), "compute_busy_s",
                  num(s->busy[SCHED_RES_COMPUTE]), "compute_idle_s", num(s->compute_idle), "recompute_s",
                  num(s->recompute_s), "bound_by", sched_resource_name(s->bottleneck), "busy_s", busy, "waited_s",
                  waited, "h2d_bytes", num(s->h2d_bytes), "d2h_bytes", num(s->d2h_bytes)));
    json_t *memo = json_object();
    for (int mm = 0; mm < SCHED_MEM_COUNT; mm++)
        json_object_set_new(memo, sched_mem_name((sched_mem_t)mm),
                            json_pack("{s:o, s:o, s:o}", "peak_bytes", num(s->peak[mm]), "budget_bytes",
                                      num(c->opts.budget[mm]), "static_bytes", num(s->static_bytes[mm])));
    json_object_set_new(doc, "memory", memo);

    const sched_plan_t *p = &c->res.plan;
    json_t *blocks = json_array();
    for (int b = 0; b < p->num_blocks; b++) {
        char name[32];
        sched_block_label(r, b, name, sizeof name);
        const sched_block_plan_t *bp = &p->blocks[b];
        json_array_append_new(blocks, json_pack("{s:i, s:s, s:s, s:s, s:s, s:s, s:b, s:b, s:b, s:b}", "block", b, "name", name,
                                                "weights", weights_name(bp->weights), "grads", grads_name(bp->grads),
                                                "optimizer", optim_name(bp->optim), "activations", acts_name(bp->acts),
                                                "nvme_optimizer", sched_block_nvme_optim(bp), "nvme_weights",
                                                sched_block_nvme_weights(bp), "pinned_home",
                                                sched_block_pinned_home(bp), "pinned_grads",
                                                sched_block_pinned_grads(bp)));
        /* layer-major plans only: "keep" / "offload" for decoder layers, null elsewhere */
        json_t *bi = p->layer_major && b >= 1 && b < p->num_blocks - 1
                         ? json_string(sched_input_place_name(bp->lm_inputs))
                         : json_null();
        json_object_set_new(json_array_get(blocks, json_array_size(blocks) - 1), "block_inputs", bi);
    }
    run_t *runs = malloc((size_t)p->num_blocks * sizeof *runs);
    MT_CHECK_ALLOC(runs, "plan runs");
    int nr = make_runs(c, runs);
    json_t *jr = json_array();
    for (int i = 0; i < nr; i++) {
        const sched_block_plan_t *bp = &p->blocks[runs[i].first];
        json_array_append_new(jr, json_pack("{s:i, s:i, s:s, s:s, s:s, s:s, s:s, s:s}", "first", runs[i].first,
                                            "last", runs[i].last, "label", runs[i].label, "weights",
                                            weights_name(bp->weights), "grads", grads_name(bp->grads), "optimizer",
                                            optim_name(bp->optim), "activations", acts_name(bp->acts), "block_inputs",
                                            p->layer_major ? inputs_name(p, runs[i].first) : "-"));
    }
    free(runs);
    json_object_set_new(doc, "plan", json_pack("{s:i, s:o, s:o}", "prefetch_window", p->prefetch_window, "blocks",
                                               blocks, "runs", jr));
    kinds_t k = kinds(c);
    json_object_set_new(
        doc, "kinds",
        json_pack("{s:{s:i, s:i, s:o, s:o}, s:{s:i, s:i, s:o}, s:{s:i, s:i, s:o, s:o}, s:{s:i, s:i, s:i}}", "weights",
                  "resident_blocks", k.resident, "stream_blocks", k.stream, "resident_bytes", num(k.resident_bytes),
                  "fetched_bytes", num(k.fetched_bytes), "grads", "device_blocks", k.gdev, "host_blocks", k.ghost,
                  "d2h_bytes", num(k.grads_d2h), "optimizer", "device_blocks", k.odev, "host_blocks", k.ohost,
                  "device_bytes", num(k.odev_bytes), "host_bytes", num(k.ohost_bytes), "activations", "keep_blocks",
                  k.keep, "offload_blocks", k.offload, "recompute_blocks", k.recompute));
    json_object_set_new(doc, "staging", staging_json(c));
    tiers_json(doc, c, &k);
    return doc;
}

/* The NVMe tier's and the quantized base's objects, when the run has them. */
static void tiers_json(json_t *doc, const plan_ctx_t *c, const kinds_t *kp) {
    const sched_sim_result_t *s = &c->res.sim;
    const kinds_t k = *kp;
    if (c->opts.nvme)
        json_object_set_new(doc, "nvme",
                            json_pack("{s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:i, s:i, s:o, s:o}", "read_bytes",
                                      num(s->nvme_read_bytes), "write_bytes", num(s->nvme_write_bytes), "busy_s",
                                      num(s->busy[SCHED_RES_NVME]), "bytes", num(s->nvme_bytes), "budget_bytes",
                                      num(c->opts.nvme_budget), "read_bytes_per_s", num(c->w.nvme_read_bw),
                                      "write_bytes_per_s", num(c->w.nvme_write_bw), "optimizer_blocks", k.onvme,
                                      "weights_blocks", k.wnvme, "optimizer_bytes", num(k.onvme_bytes), "weights_bytes",
                                      num(k.wnvme_bytes)));
    if (c->w.base_quantized)
        json_object_set_new(doc, "base_quant",
                            json_pack("{s:s, s:I, s:b, s:b, s:o, s:o}", "format",
                                      mt_quant_format_name(c->w.base_quant_format), "block", (json_int_t)c->quant.block,
                                      "double_quant", c->quant.double_quant, "experts_only", c->quant.experts_only,
                                      "stored_bytes", num(c->w.base_quant_bytes), "working_dtype_bytes",
                                      num(c->w.base_quant_work_bytes)));
}

mt_status_t plan_write_trace(const plan_ctx_t *c, const char *path, mt_error_t *err) {
    const sched_sim_result_t *s = &c->res.sim;
    json_t *ev = json_array();
    MT_CHECK_ALLOC(ev, "trace events");
    for (int r = 0; r < SCHED_RES_COUNT; r++)
        json_array_append_new(ev, json_pack("{s:s, s:s, s:i, s:i, s:{s:s}}", "ph", "M", "name", "thread_name", "pid", 1,
                                            "tid", r, "args", "name", sched_resource_name((sched_resource_t)r)));
    for (int i = 0; i < s->num_tasks; i++) {
        const sched_task_t *t = &s->tasks[i];
        char name[64], blk[32];
        if (t->block >= 0) sched_block_label(&c->reg, t->block, blk, sizeof blk);
        else snprintf(blk, sizeof blk, "all");
        snprintf(name, sizeof name, "%s %s", sched_task_kind_name(t->kind), blk);
        json_array_append_new(ev, json_pack("{s:s, s:s, s:s, s:o, s:o, s:i, s:i, s:{s:i, s:o}}", "ph", "X", "name", name,
                                            "cat", sched_resource_name(t->res), "ts", json_real(t->start * 1e6), "dur",
                                            json_real((t->end - t->start) * 1e6), "pid", 1, "tid", (int)t->res, "args",
                                            "micro_batch", t->micro, "bytes", json_real(t->bytes)));
    }
    for (int m = 0; m < SCHED_MEM_COUNT; m++) {
        const sched_timeline_t *tl = &s->timeline[m];
        char cname[32];
        snprintf(cname, sizeof cname, "%s bytes", sched_mem_name((sched_mem_t)m));
        for (int i = 0; i < tl->count; i++)
            json_array_append_new(ev, json_pack("{s:s, s:s, s:o, s:i, s:{s:o}}", "ph", "C", "name", cname, "ts",
                                                json_real(tl->pts[i].t * 1e6), "pid", 1, "args", "bytes",
                                                json_real(tl->pts[i].bytes)));
    }
    json_t *doc = json_pack("{s:o}", "traceEvents", ev);
    int rc = json_dump_file(doc, path, JSON_COMPACT);
    json_decref(doc);
    if (rc != 0) return mt_error_set(err, MT_ERR_IO, "%s: cannot write the trace: %s", path, strerror(errno));
    return MT_OK;
}
