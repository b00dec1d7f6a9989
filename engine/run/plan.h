/* How `moetune train` decides its plan: the run config's scheduler:
 * section, budgets from memory:, rates from `hardware:` (a profile) or,
 * by default on the CPU backend, a short calibration of this machine; the
 * planner (scheduler/planner.h) then picks the plan and predicts its step
 * time, which the run reports beside the measured one. */
#ifndef MT_ENGINE_TRAIN_PLAN_H
#define MT_ENGINE_TRAIN_PLAN_H

#include <stdio.h>

#include "base/dtype.h"
#include "engine/config/config.h"
#include "engine/model/hf/model_config.h"
#include "kernels/device.h"
#include "scheduler/plan.h"

typedef struct {
    sched_plan_t plan;
    double predicted_step_s;   /* the simulator's step time for the plan (0 when not simulated) */
    double predicted_peak_device;
    char summary[512];         /* one line: policy, what streams/offloads/recomputes, window */
} eng_train_plan_t;

/* Plans a run of the model config mc on dev.  Infeasible budgets are an
 * MT_ERR_BUDGET naming the short budget and what would fit. */
mt_status_t eng_train_plan(const eng_run_config_t *rc, const eng_model_config_t *mc, kern_device_t *dev,
                           eng_train_plan_t *out, mt_error_t *err);
void eng_train_plan_free(eng_train_plan_t *p);

/* The run's compute dtype on dev (bf16: true, false or auto): MT_BF16 for
 * bf16 mixed precision, MT_F32 otherwise.  auto is bf16 where the device
 * forms bf16 products in hardware. */
mt_dtype_t eng_compute_dtype(const eng_run_config_t *rc, kern_device_t *dev);

#endif
