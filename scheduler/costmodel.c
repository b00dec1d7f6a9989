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
 *   parameter) on the side that holds it. */
#include "scheduler/costmodel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

sched_rate_t sched_matmul_rate(const sched_registry_t *reg) {
    return reg->shape.bf16 ? SCHED_RATE_BF16 : SCHED_RATE_FP32;
}

double sched_op_time(const sched_op_t *op, const sched_hw_t *hw, sched_rate_t matmul_rate) {
    const double rate = op->attention && hw->attention_flops > 0 ? hw->attention_flops
                                                                  : sched_hw_flops(hw, op->matmul ? matmul_rate : SCHED_RATE_FP32);
    const double t_flops = op->flops / rate;
    const double t_bytes = op->bytes / sched_hw_device_bw(hw);
    return t_flops > t_bytes ? t_flops : t_bytes;
}

double sched_transfer_time(const sched_workload_t *w, bool h2d, double bytes, double copies) {
    if (bytes <= 0) return 0;
    return bytes / (h2d ? w->h2d_bw : w->d2h_bw) + copies * w->latency_s;
}

void sched_workload_init(sched_workload_t *w, int num_blocks) {
    memset(w, 0, sizeof *w);
    w->num_blocks = num_blocks;
    w->grad_accum = 1;
    w->has_trainable = true;
    w->blocks = calloc((size_t)num_blocks, sizeof *w->blocks);
    MT_CHECK_ALLOC(w->blocks, "workload blocks");
}

void sched_workload_free(sched_workload_t *w) {
    if (!w) return;
    free(w->blocks);
    memset(w, 0, sizeof *w);
}

static mt_status_t check_hw(const sched_hw_t *hw, mt_error_t *err) {
    const double v[] = {sched_hw_flops(hw, SCHED_RATE_FP32), sched_hw_flops(hw, SCHED_RATE_BF16),
                        sched_hw_device_bw(hw), sched_hw_h2d_bw(hw), sched_hw_d2h_bw(hw), sched_hw_host_bw(hw)};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        if (!(v[i] > 0) || !isfinite(v[i]))
            return mt_error_set(err, MT_ERR_CONFIG, "%s: hardware profile has a rate that is not positive",
                                hw->source);
    return MT_OK;
}

mt_status_t sched_workload_build(const sched_registry_t *reg, const sched_hw_t *hw, sched_workload_t *out,
                                 mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t st = check_hw(hw, err);
    if (st != MT_OK) return st;
    sched_workload_init(out, reg->num_blocks);
    out->grad_accum = reg->shape.grad_accum;
    out->clip = reg->shape.max_grad_norm > 0;
    out->tied_head = reg->tied_head;
    out->has_trainable = reg->train_params > 0;
    out->h2d_bw = sched_hw_h2d_bw(hw);
    out->d2h_bw = sched_hw_d2h_bw(hw);
    out->latency_s = hw->copy_latency_s;
    out->compute_interference = hw->compute_interference;
    out->host_copy_s_per_byte = hw->host_copy_s_per_byte;
    out->model_flops = reg->model_flops;
    out->peak_flops = hw->peak_flops[sched_matmul_rate(reg)];
    out->tokens_per_step = reg->tokens_per_step;
    const sched_rate_t mm = sched_matmul_rate(reg);
    const double dev_bw = sched_hw_device_bw(hw), host_bw = sched_hw_host_bw(hw);

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
        const double adam_bytes = bi->adam_bytes_per_param * bi->train_params_step;
        c->adam_device_s = adam_bytes / dev_bw;
        c->adam_host_s = adam_bytes / host_bw;
        c->grad_add_host_s = 12.0 * bi->train_params_mb / host_bw; /* read 2 x 4 B, write 4 B */
        c->grad_add_device_s = 12.0 * bi->train_params_mb / dev_bw;
        c->norm_device_s = 4.0 * bi->train_params_step / dev_bw;
        c->norm_host_s = 4.0 * bi->train_params_step / host_bw;
        c->act_saved_bytes = bi->act_saved_bytes;
        c->act_input_bytes = bi->act_input_bytes;
        c->act_copies = bi->act_tensors;
        c->fwd_temp_bytes = bi->fwd_temp_bytes;
        c->bwd_temp_bytes = bi->bwd_temp_bytes;
    }
    return MT_OK;
}
