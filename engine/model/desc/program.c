/* Engine -> scheduler (see program.h): the generic list comes from the
 * model's description (engine/model/desc/model_desc.h), through its family's ops
 * function; nothing here knows a family. */
#include "engine/model/desc/program.h"

#include "engine/model/desc/family.h"

#include <stdio.h>
#include <string.h>

mt_status_t eng_program_describe(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16_storage,
                                 sched_program_t *prog, sched_run_shape_t *shape, mt_error_t *err) {
    memset(prog, 0, sizeof *prog);
    memset(shape, 0, sizeof *shape);
    if (mc->num_hidden_layers > SCHED_MAX_LAYERS)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds the scheduler's limit %d",
                            mc->num_hidden_layers, SCHED_MAX_LAYERS);
    shape->micro_batch_size = rc->micro_batch_size;
    shape->sequence_len = rc->sequence_len;
    shape->grad_accum = rc->gradient_accumulation_steps;
    shape->bf16 = bf16_storage;
    shape->max_grad_norm = rc->max_grad_norm;
    shape->speculative_optimizer = rc->sched_speculative;
    shape->packed_segments = rc->sample_packing;
    if (rc->adapter == ENG_ADAPTER_LORA) {
        shape->lora = true;
        shape->lora_r = rc->lora_r;
        if (rc->num_lora_target_modules > SCHED_MAX_LORA_TARGETS)
            return mt_error_set(err, MT_ERR_CONFIG, "lora_target_modules: more than %d entries", SCHED_MAX_LORA_TARGETS);
        for (int i = 0; i < rc->num_lora_target_modules; i++) {
            if (strlen(rc->lora_target_modules[i]) >= sizeof shape->lora_targets[i])
                return mt_error_set(err, MT_ERR_CONFIG, "lora_target_modules: '%.100s' is longer than %zu characters",
                                    rc->lora_target_modules[i], sizeof shape->lora_targets[i] - 1);
            snprintf(shape->lora_targets[i], sizeof shape->lora_targets[i], "%s", rc->lora_target_modules[i]);
        }
        shape->num_lora_targets = rc->num_lora_target_modules;
        /* lora_target_linear, and a regular expression the planner cannot
         * evaluate, are planned as every linear layer: an upper bound on
         * the adapters' bytes */
        if ((rc->lora_target_linear || rc->lora_target_regex[0]) && shape->num_lora_targets < SCHED_MAX_LORA_TARGETS)
            snprintf(shape->lora_targets[shape->num_lora_targets++], sizeof shape->lora_targets[0], "all-linear");
    }
    /* the run's shape must be sound before the description's ops are sized by it */
    if (shape->micro_batch_size < 1 || shape->sequence_len < 1 || shape->grad_accum < 1)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "run: micro_batch_size (%d), sequence_len (%d) and gradient_accumulation_steps (%d) must "
                            "be >= 1",
                            shape->micro_batch_size, shape->sequence_len, shape->grad_accum);
    if (shape->lora && (shape->lora_r < 1 || shape->num_lora_targets < 1))
        return mt_error_set(err, MT_ERR_CONFIG, "run: LoRA needs lora_r >= 1 and target modules");
    eng_model_desc_t d;
    mt_status_t st = eng_model_desc_build(mc, &d, err);
    if (st != MT_OK) return st;
    st = d.family->ops(d.family, &d, mc, shape, prog, err);
    eng_model_desc_free(&d);
    return st;
}

const char *eng_program_expert_parallel_refusal(const eng_model_config_t *mc, const eng_run_config_t *rc) {
    if (rc->adapter == ENG_ADAPTER_LORA) return "a LoRA run's adapters are not split between devices";
    if (mc->experts_fused) return "the model stores its experts fused in one tensor per layer";
    /* an expert-parallel layer's experts are updated from host memory and
     * its saved rows are not offloaded (sched_block_plan_expert_parallel):
     * a forced placement that says otherwise wins over splitting experts */
    if (rc->sched_optimizer == ENG_PLACE_DEVICE)
        return "scheduler.optimizer: device keeps AdamW on the device, and an expert-parallel layer's experts are "
               "updated from host memory";
    if (rc->sched_grads == ENG_PLACE_DEVICE)
        return "scheduler.grads: device keeps gradients on the device, and an expert-parallel layer's go to host "
               "memory";
    if (rc->sched_activations == ENG_ACTS_OFFLOAD)
        return "scheduler.activations: offload, and an expert-parallel layer keeps or recomputes its activations";
    return NULL;
}

mt_status_t eng_program_parallel_opts(const eng_model_config_t *mc, const eng_run_config_t *rc,
                                      sched_planner_opts_t *o, mt_error_t *err) {
    const char *why = eng_program_expert_parallel_refusal(mc, rc);
    if (!why || o->parallel == SCHED_PARALLEL_DATA) return MT_OK;
    if (o->parallel == SCHED_PARALLEL_EXPERT)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: parallel: expert cannot run: %s; use parallel: auto or data",
                            rc->source_path, why);
    o->parallel = SCHED_PARALLEL_DATA;
    return MT_OK;
}

mt_status_t eng_program_planner_opts(const eng_run_config_t *rc, const sched_hw_t *hw, sched_planner_opts_t *o,
                                     mt_error_t *err) {
    sched_planner_opts_default(o);
    switch (rc->sched_policy) {
    case ENG_SCHED_AUTO: o->policy = SCHED_POLICY_AUTO; break;
    case ENG_SCHED_KEEP_ALL: o->policy = SCHED_POLICY_KEEP_ALL; break;
    case ENG_SCHED_OFFLOAD_ALL: o->policy = SCHED_POLICY_OFFLOAD_ALL; break;
    case ENG_SCHED_MIN_MEMORY: o->policy = SCHED_POLICY_MIN_MEMORY; break;
    }
    if (rc->sched_prefetch_window < 0)
        return mt_error_set(err, MT_ERR_CONFIG, "scheduler.prefetch_window must be >= 0, got %d",
                            rc->sched_prefetch_window);
    o->prefetch_window = rc->sched_prefetch_window;
    o->weights = rc->sched_weights == ENG_WEIGHTS_RESIDENT ? SCHED_WEIGHTS_RESIDENT
                 : rc->sched_weights == ENG_WEIGHTS_STREAM ? SCHED_WEIGHTS_STREAM
                                                           : SCHED_AUTO_CHOICE;
    o->grads = rc->sched_grads == ENG_PLACE_DEVICE ? SCHED_GRADS_DEVICE
               : rc->sched_grads == ENG_PLACE_HOST ? SCHED_GRADS_HOST
                                                   : SCHED_AUTO_CHOICE;
    o->optim = rc->sched_optimizer == ENG_PLACE_DEVICE ? SCHED_OPTIM_DEVICE
               : rc->sched_optimizer == ENG_PLACE_HOST ? SCHED_OPTIM_HOST
                                                       : SCHED_AUTO_CHOICE;
    o->acts = rc->sched_activations == ENG_ACTS_KEEP        ? SCHED_ACTS_KEEP
              : rc->sched_activations == ENG_ACTS_OFFLOAD   ? SCHED_ACTS_OFFLOAD
              : rc->sched_activations == ENG_ACTS_RECOMPUTE ? SCHED_ACTS_RECOMPUTE
              : rc->gradient_checkpointing                  ? SCHED_ACTS_RECOMPUTE
                                                            : SCHED_AUTO_CHOICE;
    o->lm_inputs = rc->sched_block_inputs == ENG_ACTS_KEEP      ? SCHED_INPUTS_KEEP
                   : rc->sched_block_inputs == ENG_ACTS_OFFLOAD ? SCHED_INPUTS_OFFLOAD
                                                                : SCHED_AUTO_CHOICE;
    o->step_order = rc->step_order == ENG_STEP_ORDER_LAYER         ? 1
                    : rc->step_order == ENG_STEP_ORDER_MICRO_BATCH ? 0
                                                                   : SCHED_AUTO_CHOICE;
    o->devices = rc->devices.count;
    o->parallel = rc->parallel == ENG_PARALLEL_EXPERT ? SCHED_PARALLEL_EXPERT
                  : rc->parallel == ENG_PARALLEL_DATA ? SCHED_PARALLEL_DATA
                                                      : SCHED_PARALLEL_AUTO;
    o->budget[SCHED_MEM_DEVICE] = rc->memory_device ? (double)rc->memory_device : hw->device_memory;
    /* A GPU frees device memory in stream order (kernels/device.h): a block
     * is reused only after every stream has passed its free, and the arena
     * fragments.  On an H100, streamed plans predicted at 1761 MiB of a
     * 2 GiB budget had over 1900 MiB in use and no free block of 92 MB;
     * with this headroom such a plan ran its first step, and one at 4 GiB
     * ran through.  Budgets close to the largest tensor (a 500 MB logits
     * buffer in 2 GiB) can still fragment: the error names the tensor. */
    o->device_headroom = hw->measured ? 0.0 : ENG_GPU_DEVICE_HEADROOM;
    o->budget[SCHED_MEM_PINNED] = rc->memory_pinned ? (double)rc->memory_pinned : hw->pinned_memory;
    o->budget[SCHED_MEM_HOST] = rc->memory_host ? (double)rc->memory_host : hw->host_memory;
    return MT_OK;
}

mt_status_t eng_program_workload(const eng_model_config_t *mc, const eng_run_config_t *rc, const sched_hw_t *hw,
                                 bool bf16_storage, const sched_base_quant_t *quant, sched_workload_t *w,
                                 mt_error_t *err) {
    sched_program_t prog;
    sched_run_shape_t shape;
    sched_registry_t reg;
    memset(&reg, 0, sizeof reg);
    memset(w, 0, sizeof *w);
    mt_status_t st = eng_program_describe(mc, rc, bf16_storage, &prog, &shape, err);
    if (st != MT_OK) return st;
    st = sched_registry_build(&prog, &shape, &reg, err);
    sched_program_free(&prog);
    if (st == MT_OK) st = sched_workload_build(&reg, hw, w, err);
    if (st == MT_OK && quant && quant->on) sched_workload_quantize_base(&reg, quant, hw, w);
    if (st == MT_OK) sched_workload_set_moments(w, eng_config_moments(rc));
    sched_registry_free(&reg);
    return st;
}
