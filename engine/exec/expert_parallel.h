/* Expert parallelism in a multi-device run (engine/parallel/devices.h): the
 * engine's side of moe/expert_parallel.h.
 *
 * A MoE layer whose block plan says expert_parallel has its routed experts
 * split between the devices (device d owns [d*E/N, (d+1)*E/N),
 * moe_ep_range); attention, norms, router and shared experts of the layer
 * stay data parallel.  Each executor then places, streams and computes
 * gradients for its own experts only (it keeps no device copy of the
 * others'), its MoE block exchanges tokens with the other devices, and an
 * expert's gradient comes from its owner alone, so it needs no reduction.
 *
 * Restrictions (each refused by name when the run opens): such a layer's
 * block plan must keep gradients and AdamW state on the host (grads: host,
 * optim: host): device 0 runs the one optimizer step over host-resident
 * state, which every device can reach, and its executor never holds the
 * other devices' experts; its activations kept or recomputed, not
 * offloaded (an owner's saved rows are not the model description's
 * per-token sizes, which offloading copies by); no LoRA run; no fused
 * experts (gpt-oss). */
#ifndef MT_ENGINE_MULTI_EXPERT_H
#define MT_ENGINE_MULTI_EXPERT_H

#include <stdbool.h>

#include "base/status.h"
#include "engine/exec/place/types.h"
#include "engine/model/model.h"
#include "moe/expert_parallel.h"
#include "scheduler/plan.h"

/* Whether plan asks for expert parallelism on any MoE layer of m, and
 * whether m and plan allow it on n devices (MT_ERR_UNSUPPORTED naming the
 * layer and what to change otherwise).  Unused with n == 1. */
mt_status_t eng_ep_check(const eng_model_t *m, const sched_plan_t *plan, int n, bool *any, mt_error_t *err);

/* x's place among the devices (NULL: every expert is its own); which
 * experts are then another device's: exec_ep_foreign, plan_query.h. */
void exec_ep_set(eng_exec_t *x, const moe_ep_t *ep);

#endif
