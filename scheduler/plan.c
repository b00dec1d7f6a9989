/* Plan helpers (see plan.h). */
#include "scheduler/plan.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void sched_plan_init_uniform(sched_plan_t *plan, int num_blocks, sched_policy_t policy) {
    memset(plan, 0, sizeof *plan);
    plan->num_blocks = num_blocks;
    plan->policy = policy;
    plan->prefetch_window = 1;
    plan->blocks = calloc((size_t)num_blocks, sizeof *plan->blocks);
    MT_CHECK_ALLOC(plan->blocks, "plan blocks");
    for (int b = 0; b < num_blocks; b++) {
        sched_block_plan_t *p = &plan->blocks[b];
        switch (policy) {
        case SCHED_POLICY_AUTO:
        case SCHED_POLICY_KEEP_ALL:
            *p = (sched_block_plan_t){.weights = SCHED_WEIGHTS_RESIDENT, .grads = SCHED_GRADS_DEVICE,
                                      .optim = SCHED_OPTIM_DEVICE, .acts = SCHED_ACTS_KEEP, .lm_inputs = SCHED_INPUTS_KEEP};
            break;
        case SCHED_POLICY_OFFLOAD_ALL:
            *p = (sched_block_plan_t){.weights = SCHED_WEIGHTS_STREAM, .grads = SCHED_GRADS_HOST, .optim = SCHED_OPTIM_HOST,
                                      .acts = SCHED_ACTS_OFFLOAD, .lm_inputs = SCHED_INPUTS_KEEP};
            break;
        case SCHED_POLICY_MIN_MEMORY:
            *p = (sched_block_plan_t){.weights = SCHED_WEIGHTS_STREAM, .grads = SCHED_GRADS_HOST, .optim = SCHED_OPTIM_HOST,
                                      .acts = SCHED_ACTS_RECOMPUTE, .lm_inputs = SCHED_INPUTS_KEEP};
            break;
        }
    }
}

void sched_plan_free(sched_plan_t *plan) {
    free(plan->blocks);
    memset(plan, 0, sizeof *plan);
}

static const char *const k_names[] = {"auto", "keep_all", "offload_all", "min_memory"};

const char *sched_parallel_name(sched_parallel_t p) {
    switch (p) {
    case SCHED_PARALLEL_AUTO: return "auto";
    case SCHED_PARALLEL_DATA: return "data";
    case SCHED_PARALLEL_EXPERT: return "expert";
    }
    return "?";
}

void sched_block_plan_expert_parallel(sched_block_plan_t *bp) {
    bp->expert_parallel = true;
    bp->grads = SCHED_GRADS_HOST;
    bp->optim = SCHED_OPTIM_HOST;
    if (bp->acts == SCHED_ACTS_OFFLOAD) bp->acts = SCHED_ACTS_RECOMPUTE;
}

bool sched_block_plan_ep_runnable(const sched_block_plan_t *bp) {
    return bp->grads == SCHED_GRADS_HOST && bp->optim == SCHED_OPTIM_HOST && bp->acts != SCHED_ACTS_OFFLOAD;
}

const char *sched_policy_name(sched_policy_t p) {
    return (unsigned)p < sizeof k_names / sizeof k_names[0] ? k_names[p] : "?";
}

bool sched_policy_parse(const char *name, sched_policy_t *out) {
    for (size_t i = 0; i < sizeof k_names / sizeof k_names[0]; i++)
        if (strcmp(name, k_names[i]) == 0) {
            *out = (sched_policy_t)i;
            return true;
        }
    return false;
}

bool sched_block_nvme_optim(const sched_block_plan_t *bp) { return bp->nvme_optim && bp->optim == SCHED_OPTIM_HOST; }
bool sched_block_nvme_weights(const sched_block_plan_t *bp) {
    return bp->nvme_weights && bp->weights == SCHED_WEIGHTS_STREAM;
}

int sched_nvme_grad_wait_block(const sched_plan_t *plan, int b) {
    const int w = b + SCHED_NVME_GRAD_LEAD;
    return w < plan->num_blocks && sched_block_nvme_optim(&plan->blocks[w]) ? w : -1;
}

bool sched_block_pinned_home(const sched_block_plan_t *bp) {
    return bp->pinned_home && bp->optim == SCHED_OPTIM_HOST && !sched_block_nvme_weights(bp);
}

bool sched_block_pinned_grads(const sched_block_plan_t *bp) {
    return bp->pinned_grads && (bp->grads == SCHED_GRADS_HOST || bp->optim == SCHED_OPTIM_HOST) &&
           !sched_block_nvme_optim(bp);
}

bool sched_block_inputs_offloaded(const sched_plan_t *plan, int b) {
    return b >= 1 && b < plan->num_blocks - 1 && plan->blocks[b].lm_inputs == SCHED_INPUTS_OFFLOAD;
}

const char *sched_input_place_name(sched_input_place_t p) {
    switch (p) {
    case SCHED_INPUTS_KEEP: return "keep";
    case SCHED_INPUTS_OFFLOAD: return "offload";
    }
    return "?";
}
