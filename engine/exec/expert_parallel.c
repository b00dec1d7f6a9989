/* Expert parallelism in a multi-device run (see expert_parallel.h). */
#include "engine/exec/expert_parallel.h"

#include "engine/exec/executor.h"

mt_status_t eng_ep_check(const eng_model_t *m, const sched_plan_t *plan, int n, bool *any, mt_error_t *err) {
    *any = false;
    if (n < 2 || !plan) return MT_OK;
    const eng_model_config_t *c = &m->cfg;
    for (int l = 0; l < c->num_hidden_layers && l + 1 < plan->num_blocks; l++) {
        const sched_block_plan_t *bp = &plan->blocks[l + 1];
        if (!bp->expert_parallel || !c->layer_is_moe[l]) continue;
        if (c->experts_fused)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "layer %d: expert parallelism is not supported with fused experts (%s); run the "
                                "layer data parallel",
                                l, c->model_type);
        if (m->lora.on)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "layer %d: expert parallelism is not supported in a LoRA run; run the layer data "
                                "parallel",
                                l);
        if (bp->grads != SCHED_GRADS_HOST || bp->optim != SCHED_OPTIM_HOST)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "layer %d: expert parallelism needs the layer's gradients and optimizer on the host "
                                "(its plan has grads %s, optim %s): device 0 updates every device's experts from "
                                "host memory",
                                l, bp->grads == SCHED_GRADS_HOST ? "host" : "device",
                                bp->optim == SCHED_OPTIM_HOST ? "host" : "device");
        /* the owner's saved activations are sized by the rows it received,
         * which the model description (what offloading copies and checks)
         * does not describe */
        if (bp->acts == SCHED_ACTS_OFFLOAD)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "layer %d: expert parallelism cannot offload the layer's activations yet; keep or "
                                "recompute them (scheduler acts: keep or recompute)",
                                l);
        *any = true;
    }
    return MT_OK;
}

/* The layer environment carries the place: the block math exchanges
 * tokens with it, and every concern asks it which experts are foreign. */
void exec_ep_set(eng_exec_t *x, const moe_ep_t *ep) { x->env.ep = ep; }
