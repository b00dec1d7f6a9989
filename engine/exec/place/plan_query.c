/* The plan's answers for one device (see plan_query.h). */
#include "engine/exec/place/plan_query.h"

#include "kernels/device.h"
#include "moe/expert_parallel.h"

const sched_block_plan_t *exec_block_plan(const eng_layer_env_t *env, int b) { return &env->plan->blocks[b]; }

bool exec_param_streamed(const eng_layer_env_t *env, const eng_param_t *p) {
    return exec_block_plan(env, p->block)->weights == SCHED_WEIGHTS_STREAM;
}

bool exec_turn_held(const eng_layer_env_t *env, int b) {
    const int L = env->model->cfg.num_hidden_layers;
    return L > 0 && b == L && env->plan->prefetch_window >= 1;
}

bool exec_acts_offloaded(const eng_layer_env_t *env, int b) {
    const int L = env->model->cfg.num_hidden_layers;
    return b >= 1 && b <= L && env->plan->blocks[b].acts == SCHED_ACTS_OFFLOAD && !exec_turn_held(env, b);
}

bool exec_inputs_offloaded(const eng_layer_env_t *env, int b) {
    const int L = env->model->cfg.num_hidden_layers;
    return b >= 1 && b <= L && env->plan->blocks[b].lm_inputs == SCHED_INPUTS_OFFLOAD;
}

bool exec_layer_per_expert(const eng_layer_env_t *env, int l) {
    const eng_model_t *m = env->model;
    return l >= 0 && l < m->cfg.num_hidden_layers && m->cfg.layer_is_moe[l] && !m->cfg.experts_fused;
}

bool exec_ep_foreign(const eng_layer_env_t *env, const eng_param_t *p) {
    if (!env->ep || p->spec->expert < 0 || !env->plan->blocks[p->block].expert_parallel) return false;
    int lo, hi;
    moe_ep_range(env->model->cfg.num_experts, kern_comm_size(env->ep->comm), env->ep->rank, &lo, &hi);
    return p->spec->expert < lo || p->spec->expert >= hi;
}

bool exec_base_home_on_nvme(const eng_layer_env_t *env, const eng_param_t *p) {
    return p->frozen && sched_block_nvme_weights(exec_block_plan(env, p->block)) && !exec_ep_foreign(env, p);
}
