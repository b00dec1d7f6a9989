/* Cost model (see costmodel.h).
 *
 * Design notes:
 * - The roofline max(FLOPs / rate, bytes / bandwidth) per op, summed over a
 *   block's ops: ops of one stream run one after another, so their times
 *   add; overlap happens between streams, which is the simulator's job.
 * - Gradient accumulation: the first micro-batch's gradients land in the
 *   accumulator directly; later ones are added into it (read 8 + write 4
 *   bytes per parameter) at the bandwidth of the side that holds it.
 * - The global gradient norm reads every gradient once (4 bytes per
 *   parameter) on the side that holds it.
 * - Expert parallel (ep_costs): each of two devices owns ceil(E/2) or
 *   floor(E/2) of a layer's E routed experts; the devices run their
 *   micro-batches in lockstep, so a device's experts see both devices'
 *   tokens: per micro-batch the expected experts hit among its own are
 *   owned/E of those 2n tokens hit among all E (uniform routing, as the
 *   registry assumes; no routing trace reaches the planner).  Its routed
 *   rows are then owned/E of 2nk: as many as data parallel's when E is
 *   even, and the busier device's (owned = ceil(E/2)) sets the pace when
 *   it is odd.  A token's k rows go to the other device's experts with
 *   probability other/E each; the other's rows to this device's with
 *   owned/E; one all-to-all moves both at once (full duplex), so it takes
 *   the busier direction's time. */
#include "scheduler/costmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sched_rate_t sched_matmul_rate(const sched_registry_t *reg) {
    return reg->shape.bf16 ? SCHED_RATE_BF16 : SCHED_RATE_FP32;
}

double sched_op_time(const sched_op_t *op, const sched_hw_t *hw, sched_rate_t matmul_rate) {
    const sched_dir_t dir = op->phase == SCHED_PHASE_BWD ? SCHED_DIR_BWD : SCHED_DIR_FWD;
    const double rate = op->attention ? hw->attn_flops[op->attention_tc ? SCHED_ATTN_TC : SCHED_ATTN_KERNEL][dir]
                                      : sched_hw_flops(hw, op->matmul ? matmul_rate : SCHED_RATE_FP32);
    const double t_flops = op->flops / rate;
    const double t_bytes = op->bytes / sched_hw_device_bw(hw);
    return t_flops > t_bytes ? t_flops : t_bytes;
}

double sched_transfer_time(const sched_workload_t *w, bool h2d, double bytes, double copies) {
    if (bytes <= 0) return 0;
    return bytes / (h2d ? w->h2d_bw : w->d2h_bw) + copies * w->latency_s;
}

double sched_pack_time(const sched_workload_t *w, double bytes) {
    return bytes > 0 && w->pack_bw > 0 ? bytes / w->pack_bw : 0;
}

double sched_unpack_time(const sched_workload_t *w, double bytes) {
    return bytes > 0 && w->unpack_bw > 0 ? bytes / w->unpack_bw : 0;
}

void sched_workload_init(sched_workload_t *w, int num_blocks) {
    memset(w, 0, sizeof *w);
    w->num_blocks = num_blocks;
    w->grad_accum = 1;
    w->has_trainable = true;
    w->blocks = calloc((size_t)num_blocks, sizeof *w->blocks);
    MT_CHECK_ALLOC(w->blocks, "workload blocks");
}

const sched_block_cost_t *sched_block_cost(const sched_workload_t *w, int b, bool expert_parallel) {
    return expert_parallel && w->ep_blocks ? &w->ep_blocks[b] : &w->blocks[b];
}

void sched_workload_alloc_ep(sched_workload_t *w) {
    free(w->ep_blocks);
    free(w->moe);
    w->ep_blocks = malloc((size_t)w->num_blocks * sizeof *w->ep_blocks);
    w->moe = calloc((size_t)w->num_blocks, sizeof *w->moe);
    MT_CHECK(w->ep_blocks && w->moe, "out of host memory for expert parallel costs");
    memcpy(w->ep_blocks, w->blocks, (size_t)w->num_blocks * sizeof *w->ep_blocks);
}

void sched_workload_free(sched_workload_t *w) {
    if (!w) return;
    free(w->ep_blocks);
    free(w->moe);
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

static mt_status_t check_hw(const sched_hw_t *hw, mt_error_t *err) {
    const double v[] = {sched_hw_flops(hw, SCHED_RATE_FP32), sched_hw_flops(hw, SCHED_RATE_BF16),
                        sched_hw_device_bw(hw), sched_hw_h2d_bw(hw), sched_hw_d2h_bw(hw), sched_hw_host_bw(hw),
                        hw->attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_FWD], hw->attn_flops[SCHED_ATTN_KERNEL][SCHED_DIR_BWD],
                        hw->attn_flops[SCHED_ATTN_TC][SCHED_DIR_FWD], hw->attn_flops[SCHED_ATTN_TC][SCHED_DIR_BWD],
                        hw->adamw_bw, hw->pack_bw, hw->unpack_bw};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!(v[i] > 0) || !isfinite(v[i]))
            return mt_error_set(err, MT_ERR_CONFIG, "%s: hardware profile has a rate that is not positive",
                                hw->source);
    return MT_OK;
}

/* A MoE block's costs on one of SCHED_EP_DEVICES devices that owns part of
 * its experts (see the design note), from its data parallel costs c (all
 * experts) and the block's facts; expert_fwd_s / expert_bwd_s: the time of
 * its ops that read routed experts' weights. */
static void ep_costs(const sched_block_info_t *bi, int grad_accum, double expert_fwd_s, double expert_bwd_s,
                     const sched_workload_t *w, double dev_bw, double host_bw, double adam_bw, sched_block_cost_t *c) {
    const double E = bi->num_experts, D = SCHED_EP_DEVICES;
    const double owned = ceil(E / D), other = E - owned;
    const double n = bi->tokens_mb, k = bi->top_k;
    const double hit = sched_expected_experts_hit(bi->num_experts, bi->top_k, D * n) * owned / E;
    const double hit_step = sched_expected_experts_hit(bi->num_experts, bi->top_k, D * n * grad_accum) * owned / E;
    const double te = bi->train_expert_params, train_dense = bi->train_params - E * te;
    const double own_share = bi->train_params > 0 ? (bi->train_params - other * te) / bi->train_params : 1.0;
    const double train_mb = train_dense + te * hit, train_step = train_dense + te * hit_step;
    const double all_host = c->optim_bytes + c->grad_bytes; /* every expert's */
    c->w_resident_bytes = bi->w_bytes - other * bi->w_expert_bytes;
    /* w_home_bytes stays every expert's: the one host copy holds them all */
    c->w_fetch_bytes = bi->w_dense_bytes + bi->w_expert_bytes * hit;
    c->w_fetch_copies = bi->w_dense_tensors + hit * bi->w_expert_tensors;
    c->w_fetch_step_bytes = bi->w_dense_bytes + bi->w_expert_bytes * hit_step;
    c->w_fetch_step_copies = bi->w_dense_tensors + hit_step * bi->w_expert_tensors;
    c->grad_bytes = bi->grad_bytes - 4.0 * other * te;
    c->grad_mb_bytes = 4.0 * train_mb;
    /* backward scratch: an owner forms the second device's gradients of the
     * experts the first device's tokens hit too apart, then adds them (the
     * order one device adds a later micro-batch's; moe/expert_parallel.c):
     * the expected experts hit by both devices' tokens, routed independently */
    const double p_hit = E > 0 ? sched_expected_experts_hit(bi->num_experts, bi->top_k, n) / E : 0;
    c->bwd_temp_bytes += 4.0 * te * owned * p_hit * p_hit;
    c->grad_mb_copies = bi->train_dense_tensors + hit * bi->train_expert_tensors;
    c->grad_step_bytes = 4.0 * train_step;
    c->grad_step_copies = bi->train_dense_tensors + hit_step * bi->train_expert_tensors;
    c->optim_bytes = bi->optim_bytes * own_share;
    /* host_weight_bytes (a host-only fp32 copy) stays every expert's, as w_home_bytes */
    c->other_host_bytes = all_host - (c->optim_bytes + c->grad_bytes);
    c->w_update_bytes = bi->train_w_bytes_step - bi->train_expert_w_bytes * (bi->experts_hit_step - hit_step);
    c->w_update_copies = c->grad_step_copies;
    const double adam_bytes = bi->adam_bytes_per_param * train_step;
    c->adam_device_s = adam_bytes / dev_bw;
    c->adam_host_s = adam_bytes / adam_bw;
    c->grad_add_host_s = SCHED_UNPACK_ADD_COST * sched_unpack_time(w, 4.0 * train_mb);
    c->grad_add_device_s = 12.0 * train_mb / dev_bw;
    c->norm_device_s = 4.0 * train_step / dev_bw;
    c->norm_host_s = 4.0 * train_step / host_bw;
    c->owned_w_update_bytes = bi->train_expert_w_bytes * hit_step;
    c->owned_grad_bytes = 4.0 * owned * te;
    c->owned_adam_host_s = bi->adam_bytes_per_param * te * hit_step / adam_bw;
    /* the busier device's experts set the pace: 2n k owned/E rows against
     * data parallel's n k */
    const double load = D * owned / E;
    /* hidden-size rows in the compute dtype: the block input's bytes per token */
    const double row_bytes = n > 0 ? bi->act_input_bytes / n : 0;
    const double sent = n * k * row_bytes;                  /* per pass: other/E out, then owned/E back */
    const double busier = n * k * owned / E * row_bytes;    /* one all-to-all's larger direction */
    const double a2a_s = w->peer_bw > 0 ? busier / w->peer_bw + w->peer_latency_s : 0;
    c->xchg_fwd_bytes = c->xchg_bwd_bytes = sent;
    c->fwd_s += expert_fwd_s * (load - 1.0) + 2.0 * a2a_s;
    c->bwd_s += expert_bwd_s * (load - 1.0) + 2.0 * a2a_s;
    c->recompute_s = c->fwd_s; /* the recomputed forward exchanges again */
}

/* The link's, the host's and the peer link's rates from the profile. */
static void copy_rates(const sched_hw_t *hw, sched_workload_t *out) {
    out->h2d_bw = sched_hw_h2d_bw(hw);
    out->d2h_bw = sched_hw_d2h_bw(hw);
    out->latency_s = hw->copy_latency_s;
    out->compute_interference = hw->compute_interference;
    out->host_copy_s_per_byte = hw->host_copy_s_per_byte;
    out->pack_bw = hw->pack_bw;
    out->unpack_bw = hw->unpack_bw;
    /* host AdamW runs every NUMA node's cores on the state homed there
     * (engine/optim/host_optim.c): the nodes' rates add up */
    out->adamw_bw = sched_hw_adamw_bw(hw);
    out->adamw_bf16_rate = hw->adamw_bf16_rate * hw->host_cores * sched_hw_numa_nodes(hw);
    out->adamw_8bit_rate = hw->adamw_8bit_rate * hw->host_cores * sched_hw_numa_nodes(hw);
    out->peer_bw = sched_hw_peer_bw(hw);
    out->peer_latency_s = sched_hw_peer_latency(hw);
    out->peer_via_host = sched_hw_peer_via_host(hw);
}

mt_status_t sched_workload_build(const sched_registry_t *reg, const sched_hw_t *hw, sched_workload_t *out,
                                 mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t st = check_hw(hw, err);
    if (st != MT_OK) return st;
    sched_workload_init(out, reg->num_blocks);
    out->grad_accum = reg->shape.grad_accum;
    out->speculative = reg->shape.max_grad_norm > 0 && reg->shape.speculative_optimizer;
    out->clip = reg->shape.max_grad_norm > 0 && !out->speculative;
    out->tied_head = reg->tied_head;
    out->has_trainable = reg->train_params > 0;
    copy_rates(hw, out);
    out->model_flops = reg->model_flops;
    out->peak_flops = hw->peak_flops[sched_matmul_rate(reg)];
    out->tokens_per_step = reg->tokens_per_step;
    const sched_rate_t mm = sched_matmul_rate(reg);
    /* host_bw: the gradient norm's sums, which run on every node like AdamW */
    const double dev_bw = sched_hw_device_bw(hw), host_bw = sched_hw_host_bw(hw) * sched_hw_numa_nodes(hw),
                 adam_bw = sched_hw_adamw_bw(hw);
    /* ops that read routed experts' weights: the part of a MoE block whose
     * rows move to the experts' owner under expert parallel */
    bool *routed_op = calloc((size_t)(reg->num_ops > 0 ? reg->num_ops : 1), sizeof *routed_op);
    MT_CHECK_ALLOC(routed_op, "routed ops");
    bool any_moe = false;
    for (int i = 0; i < reg->num_tensors; i++) {
        const sched_tensor_t *t = &reg->tensors[i];
        if (t->kind != SCHED_T_WEIGHT || t->expert < 0) continue;
        for (int j = 0; j < t->num_consumers; j++) routed_op[t->consumers[j]] = true;
    }
    for (int b = 0; b < reg->num_blocks; b++) any_moe |= reg->blocks[b].is_moe && reg->blocks[b].num_experts >= 2;
    if (any_moe) sched_workload_alloc_ep(out);

    for (int b = 0; b < reg->num_blocks; b++) {
        const sched_block_info_t *bi = &reg->blocks[b];
        sched_block_cost_t *c = &out->blocks[b];
        for (int i = bi->first_op; i < bi->first_op + bi->num_ops; i++) {
            const sched_op_t *op = &reg->ops[i];
            if (op->phase == SCHED_PHASE_FWD) c->fwd_s += sched_op_time(op, hw, mm);
            else if (op->phase == SCHED_PHASE_BWD) c->bwd_s += sched_op_time(op, hw, mm);
        }
        c->recompute_s = c->fwd_s;
        c->w_resident_bytes = bi->w_bytes;
        c->w_fetch_bytes = bi->w_fetch_bytes;
        c->w_fetch_copies = bi->w_dense_tensors + bi->experts_hit * bi->w_expert_tensors;
        c->w_home_bytes = bi->w_bytes;
        c->w_fetch_step_bytes = bi->w_dense_bytes + bi->w_expert_bytes * bi->experts_hit_step;
        c->w_fetch_step_copies = bi->w_dense_tensors + bi->experts_hit_step * bi->w_expert_tensors;
        c->grad_bytes = bi->grad_bytes;
        c->grad_mb_bytes = 4.0 * bi->train_params_mb;
        const double expert_train_tensors = bi->train_expert_tensors;
        c->grad_mb_copies = bi->train_dense_tensors + bi->experts_hit * expert_train_tensors;
        c->grad_step_bytes = 4.0 * bi->train_params_step;
        c->grad_step_copies = bi->train_dense_tensors + bi->experts_hit_step * expert_train_tensors;
        c->optim_bytes = bi->optim_bytes;
        c->host_weight_bytes = 4.0 * bi->train_fp32_params;
        c->w_update_bytes = bi->train_w_bytes_step;
        c->w_update_copies = c->grad_step_copies;
        /* every fetch is copied into pinned staging first: a trained
         * weight's bf16 working copy is kept in host memory beside its
         * master (host AdamW writes it as it updates), frozen bases are
         * stored in their working dtype or quantized, fp32 copies are
         * themselves; nothing is converted on the way to the link */
        c->w_pack_frac = out->pack_bw > 0 && bi->w_bytes > 0 ? 1.0 : 0;
        c->w_update_pack_frac = c->w_pack_frac;
        c->w_work_bytes = bi->train_work_bytes < bi->w_bytes ? bi->train_work_bytes : bi->w_bytes;
        const double adam_bytes = bi->adam_bytes_per_param * bi->train_params_step;
        c->adam_device_s = adam_bytes / dev_bw;
        c->adam_host_s = adam_bytes / adam_bw;
        c->grad_add_host_s = SCHED_UNPACK_ADD_COST * sched_unpack_time(out, 4.0 * bi->train_params_mb);
        c->grad_add_device_s = 12.0 * bi->train_params_mb / dev_bw;
        c->norm_device_s = 4.0 * bi->train_params_step / dev_bw;
        c->norm_host_s = 4.0 * bi->train_params_step / host_bw;
        if (out->speculative) {
            /* each host update writes the new master, m and v into a spare
             * set kept beside the state (12 B per parameter in fp32; the
             * update reads the old set, which undo swaps back) and copies
             * nothing.  The spare's lines are only written: the kernel
             * streams them past the cache (kernels/host/adamw.c), so no
             * line is read in before it is written and the traffic is the
             * in-place update's.  Measured with `moetune bench adam` (2
             * cores, AVX-512): out of place 1.04-1.10x the in-place time
             * (1.5-1.7x with plain stores' write-allocate reads).  Lighter
             * moments' stores stay plain (lighter_adam). */
            c->spec_copy_bytes = 12.0 * bi->train_params;
            c->adam_spec_host_s = 0;
        }
        c->act_saved_bytes = bi->act_saved_bytes;
        c->act_input_bytes = bi->act_input_bytes;
        c->act_copies = bi->act_tensors;
        c->fwd_temp_bytes = bi->fwd_temp_bytes;
        c->bwd_temp_bytes = bi->bwd_temp_bytes;
        if (!any_moe) continue;
        out->ep_blocks[b] = *c;
        if (!bi->is_moe || bi->num_experts < 2) continue;
        out->moe[b] = true;
        double efwd = 0, ebwd = 0;
        for (int i = bi->first_op; i < bi->first_op + bi->num_ops; i++) {
            const sched_op_t *op = &reg->ops[i];
            if (!routed_op[i]) continue;
            if (op->phase == SCHED_PHASE_FWD) efwd += sched_op_time(op, hw, mm);
            else if (op->phase == SCHED_PHASE_BWD) ebwd += sched_op_time(op, hw, mm);
        }
        ep_costs(bi, reg->shape.grad_accum, efwd, ebwd, out, dev_bw, host_bw, adam_bw, &out->ep_blocks[b]);
    }
    free(routed_op);
    return MT_OK;
}

bool sched_waits_for_norm(const sched_workload_t *w, const sched_plan_t *plan) {
    if (w->clip) return true;
    if (!w->speculative) return false;
    for (int b = 0; b < plan->num_blocks; b++) /* no speculation with the NVMe tier (its moments go back */
        if (sched_block_nvme_optim(&plan->blocks[b])) return true; /* to disk right after each update) */
    return false;
}

void sched_block_host_bytes(const sched_block_cost_t *c, const sched_block_plan_t *p, double *home, double *optim,
                            double *grads) {
    *home = sched_block_nvme_weights(p) ? 0 : c->w_home_bytes;
    *optim = *grads = 0;
    if (p->optim == SCHED_OPTIM_DEVICE) return;
    *optim = (sched_block_nvme_optim(p) ? 0 : c->optim_bytes + c->spec_copy_bytes) + c->other_host_bytes;
    if (p->weights == SCHED_WEIGHTS_RESIDENT && c->host_weight_bytes > c->w_home_bytes)
        *optim += c->host_weight_bytes - c->w_home_bytes;
    *grads = c->grad_bytes;
}

/* ---- the NVMe tier ---------------------------------------------------------- */

void sched_workload_set_nvme(sched_workload_t *w, const sched_hw_t *hw) {
    w->nvme_read_bw = sched_hw_nvme_read_bw(hw);
    w->nvme_write_bw = sched_hw_nvme_write_bw(hw);
}

double sched_nvme_read_time(const sched_workload_t *w, double bytes) {
    return bytes > 0 && w->nvme_read_bw > 0 ? bytes / w->nvme_read_bw : 0;
}

double sched_nvme_write_time(const sched_workload_t *w, double bytes) {
    return bytes > 0 && w->nvme_write_bw > 0 ? bytes / w->nvme_write_bw : 0;
}

double sched_block_pack_frac(const sched_block_cost_t *c, const sched_block_plan_t *p, bool update) {
    if (update) return sched_block_pinned_home(p) ? 0 : c->w_update_pack_frac;
    if (sched_block_nvme_weights(p)) return 0; /* read from the tier straight into staging: nothing packed */
    if (!sched_block_pinned_home(p) || !(c->w_home_bytes > 0)) return c->w_pack_frac;
    return c->w_pack_frac * (1.0 - c->w_work_bytes / c->w_home_bytes);
}

double sched_block_nvme_bytes(const sched_block_cost_t *c, const sched_block_plan_t *p) {
    return (sched_block_nvme_weights(p) ? c->w_home_bytes : 0) + (sched_block_nvme_optim(p) ? c->optim_bytes : 0);
}

/* Cost c's AdamW with moments of `per` bytes per parameter (both together)
 * where the registry counted fp32's 8; rate: the host's parameters/s with
 * them (sched_workload_set_moments). */
static void lighter_adam(sched_block_cost_t *c, double per, double rate, double adamw_bw) {
    const double params = c->grad_step_bytes / 4.0; /* a step's updated parameters */
    const double bytes = c->adam_host_s * adamw_bw;  /* their traffic as counted */
    if (params <= 0 || bytes <= 0) return;
    const double ratio = (bytes - 2.0 * (8.0 - per) * params) / bytes;
    const double params_per_byte = params / bytes;
    c->adam_device_s *= ratio;
    c->adam_host_s = fmax(c->adam_host_s * ratio, rate > 0 ? params / rate : 0);
    const double owned = c->owned_adam_host_s * adamw_bw; /* its own experts' traffic (expert parallel) */
    c->owned_adam_host_s = fmax(c->owned_adam_host_s * ratio, rate > 0 ? owned * params_per_byte / rate : 0);
    /* a speculative update's spare: the master is streamed past the cache,
     * the moments' stores are plain and read each line in first */
    if (c->spec_copy_bytes > 0) c->adam_spec_host_s = per * params / adamw_bw;
}

double sched_workload_set_moments(sched_workload_t *w, int fmt) {
    const double per = fmt == 1 ? 4.0 : fmt == 2 ? 2.0 + 2.0 * 4.0 / 256.0 : 8.0;
    const double rate = fmt == 1 ? w->adamw_bf16_rate : fmt == 2 ? w->adamw_8bit_rate : 0;
    const bool lighter = fmt != 0 && w->adamw_bw > 0;
    for (int b = 0; b < w->num_blocks; b++) {
        /* a block's trainable parameters: its fp32 gradient's bytes / 4 */
        const double own = w->blocks[b].grad_bytes / 4.0;
        w->blocks[b].optim_bytes -= (8.0 - per) * own;
        if (w->blocks[b].spec_copy_bytes > 0) w->blocks[b].spec_copy_bytes -= (8.0 - per) * own;
        if (lighter) lighter_adam(&w->blocks[b], per, rate, w->adamw_bw);
        if (!w->ep_blocks) continue;
        sched_block_cost_t *e = &w->ep_blocks[b];
        const double ep_own = e->grad_bytes / 4.0;
        e->optim_bytes -= (8.0 - per) * ep_own;
        /* the other device's experts' state, held on this one's host */
        e->other_host_bytes -= (8.0 - per) * (own - ep_own);
        if (lighter) lighter_adam(e, per, rate, w->adamw_bw);
    }
    return per;
}
