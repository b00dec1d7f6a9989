/* The layer environment's one question (see env.h): whether a layer's
 * experts are split between devices.  Its own file, below every family's
 * block code that asks it. */
#include "engine/layers/env.h"

const moe_ep_t *eng_layer_ep(const eng_layer_env_t *env, int layer) {
    if (!env->ep || !env->model->cfg.layer_is_moe[layer] || !env->plan->blocks[layer + 1].expert_parallel) return NULL;
    return env->ep;
}
