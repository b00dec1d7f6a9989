/* The step program as the scheduler sees it: the generic list of blocks,
 * tensors and ops (sched_program_t, from the model's description) and the
 * run shape (scheduler/registry.h) from the HF config and the run config,
 * and the planner's options from the run config's scheduler: and memory:
 * sections.  The scheduler cannot include engine headers (layering:
 * engine -> scheduler -> kernels), so this is where the two meet. */
#ifndef MT_ENGINE_PROGRAM_H
#define MT_ENGINE_PROGRAM_H

#include <stdbool.h>

#include "engine/config/config.h"
#include "engine/model/hf/model_config.h"
#include "base/status.h"
#include "scheduler/basequant.h"
#include "scheduler/hw.h"
#include "scheduler/planner.h"
#include "scheduler/registry.h"

/* bf16_storage: the run keeps bf16 working copies and bf16 saved
 * activations of the compute class (the run config's bf16 on a GPU); false
 * on the CPU backend, which stores every tensor in fp32 (its bf16 option
 * only rounds values).  On MT_OK the caller frees *prog
 * (sched_program_free). */
mt_status_t eng_program_describe(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16_storage,
                                 sched_program_t *prog, sched_run_shape_t *shape, mt_error_t *err);

/* The scheduler's workload of a run (describe, registry, cost model on
 * hw): what the planner plans over, with a frozen base counted at its
 * quantized size where quant says so (NULL or !quant->on: the working
 * dtype).  On MT_OK the caller frees *w (sched_workload_free). */
mt_status_t eng_program_workload(const eng_model_config_t *mc, const eng_run_config_t *rc, const sched_hw_t *hw,
                                 bool bf16_storage, const sched_base_quant_t *quant, sched_workload_t *w,
                                 mt_error_t *err);

/* The share of a GPU's device budget plans leave free for stream-ordered
 * frees and fragmentation (measured: see program.c). */
#define ENG_GPU_DEVICE_HEADROOM 0.15

/* Policy, window and per-kind overrides from scheduler:, budgets from
 * memory: (a size of 0 takes the hardware profile's capacity; on a GPU,
 * less ENG_GPU_DEVICE_HEADROOM of it). */
mt_status_t eng_program_planner_opts(const eng_run_config_t *rc, const sched_hw_t *hw, sched_planner_opts_t *o,
                                     mt_error_t *err);
/* Why the executor cannot run this run's MoE layers expert parallel
 * (engine/exec/expert_parallel.h runs full fine-tuning of models whose experts are
 * tensors of their own, with host gradients and AdamW and activations not
 * offloaded), or NULL when it can. */
const char *eng_program_expert_parallel_refusal(const eng_model_config_t *mc, const eng_run_config_t *rc);
/* Where the executor cannot run expert parallel, o->parallel auto becomes
 * data, and parallel: expert is MT_ERR_UNSUPPORTED saying why. */
mt_status_t eng_program_parallel_opts(const eng_model_config_t *mc, const eng_run_config_t *rc,
                                      sched_planner_opts_t *o, mt_error_t *err);

#endif
