/* Engine -> scheduler descriptions (see program.h).
 *
 * Per-family details follow engine/model_spec.c (the tensors the engine
 * allocates): Qwen3's o_proj has a bias when attention_bias is set, Qwen2-
 * MoE's never; OLMoE's o_proj follows attention_bias like q/k/v. */
#include "engine/program.h"

#include <stdio.h>
#include <string.h>

mt_status_t eng_program_describe(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16_storage,
                                 sched_model_desc_t *md, sched_run_shape_t *shape, mt_error_t *err) {
    memset(md, 0, sizeof *md);
    memset(shape, 0, sizeof *shape);
    if (mc->num_hidden_layers > SCHED_MAX_LAYERS)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds the scheduler's limit %d",
                            mc->num_hidden_layers, SCHED_MAX_LAYERS);
    switch (mc->arch) {
    case ENG_ARCH_MIXTRAL: md->family = SCHED_FAMILY_MIXTRAL; break;
    case ENG_ARCH_QWEN2_MOE: md->family = SCHED_FAMILY_QWEN2_MOE; break;
    case ENG_ARCH_QWEN3_MOE: md->family = SCHED_FAMILY_QWEN3_MOE; break;
    case ENG_ARCH_OLMOE: md->family = SCHED_FAMILY_OLMOE; break;
    }
    md->num_layers = mc->num_hidden_layers;
    md->hidden = mc->hidden_size;
    md->heads = mc->num_attention_heads;
    md->kv_heads = mc->num_key_value_heads;
    md->head_dim = mc->head_dim;
    md->vocab = mc->vocab_size;
    md->num_experts = mc->num_experts;
    md->top_k = mc->num_experts_per_tok;
    md->expert_inter = mc->moe_intermediate_size;
    md->shared_inter = mc->shared_expert_intermediate_size;
    md->shared_expert_gate = mc->arch == ENG_ARCH_QWEN2_MOE && mc->shared_expert_intermediate_size > 0;
    md->dense_inter = mc->intermediate_size;
    for (int l = 0; l < mc->num_hidden_layers; l++) md->layer_is_moe[l] = mc->layer_is_moe[l];
    md->tied_embeddings = mc->tie_word_embeddings;
    md->qkv_bias = mc->qkv_bias;
    md->o_bias = mc->qkv_bias && (mc->arch == ENG_ARCH_QWEN3_MOE || mc->arch == ENG_ARCH_OLMOE);
    md->qk_norm = !mc->qk_norm ? SCHED_QK_NORM_NONE : mc->qk_norm_whole ? SCHED_QK_NORM_FULL : SCHED_QK_NORM_PER_HEAD;
    md->sliding_window = mc->sliding_window;

    shape->micro_batch_size = rc->micro_batch_size;
    shape->sequence_len = rc->sequence_len;
    shape->grad_accum = rc->gradient_accumulation_steps;
    shape->bf16 = bf16_storage;
    shape->max_grad_norm = rc->max_grad_norm;
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
    }
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
    o->budget[SCHED_MEM_DEVICE] = rc->memory_device ? (double)rc->memory_device : hw->device_memory;
    o->budget[SCHED_MEM_PINNED] = rc->memory_pinned ? (double)rc->memory_pinned : hw->pinned_memory;
    o->budget[SCHED_MEM_HOST] = rc->memory_host ? (double)rc->memory_host : hw->host_memory;
    return MT_OK;
}
