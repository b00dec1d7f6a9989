/* What the plan says of a block or a parameter on this device: where a
 * block's weights and activations live, whether a layer moves its experts
 * one by one, and whether an expert is another device's.
 *
 * Questions asked by nearly every concern of the executor (residency,
 * gradients, activations, the staging pool's sizing, placement, the
 * optimizer), answered from the layer environment (engine/layers/env.h:
 * the model, the plan being run and this device's expert-parallel place)
 * rather than from the executor, so that the concerns asking them stay
 * below it. */
#ifndef MT_ENGINE_EXEC_PLAN_QUERY_H
#define MT_ENGINE_EXEC_PLAN_QUERY_H

#include <stdbool.h>

#include "engine/layers/env.h"
#include "engine/model/model.h"
#include "scheduler/plan.h"

const sched_block_plan_t *exec_block_plan(const eng_layer_env_t *env, int b);

/* p's block streams its weights. */
bool exec_param_streamed(const eng_layer_env_t *env, const eng_param_t *p);

/* At the turn from forward to backward, the last layer's streamed weights
 * and offloaded activations would go to the host and come straight back:
 * with a prefetch window of at least 1 the backward's first fetches put
 * them on the device during the head's backward anyway, so the executor
 * keeps them from the forward instead (no transfer, no wait, and the
 * head's peak is no higher than its backward's).  The simulator models the
 * same (scheduler/simulate.c). */
bool exec_turn_held(const eng_layer_env_t *env, int b);

/* Block b's saved activations go to the host between its forward and its
 * backward: the plan says offload and b is not held at the turn. */
bool exec_acts_offloaded(const eng_layer_env_t *env, int b);
/* Whether a layer-major step sends each micro-batch's input of block b to
 * the host between the block's forward and its backward (decoder layers
 * whose plan says lm_inputs OFFLOAD; micro-batch order keeps its one). */
bool exec_inputs_offloaded(const eng_layer_env_t *env, int b);

/* A MoE layer whose experts are tensors of their own, fetched and given
 * gradients per expert.  Experts fused over E (gpt-oss) are one tensor per
 * layer: the block moves them whole, as it moves its dense weights. */
bool exec_layer_per_expert(const eng_layer_env_t *env, int l);

/* p is a routed expert of an expert-parallel layer that another device
 * owns (engine/exec/expert_parallel.h): this device places, fetches and
 * trains nothing of it. */
bool exec_ep_foreign(const eng_layer_env_t *env, const eng_param_t *p);

/* Frozen parameter p's home goes to the NVMe tier: its block's weights
 * stream from there, and this device fetches it. */
bool exec_base_home_on_nvme(const eng_layer_env_t *env, const eng_param_t *p);

#endif
