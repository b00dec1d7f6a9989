/* Private to `moetune plan`: what the command computed, and its three
 * outputs (text, the --json document of plan_cmd.h, the --trace file). */
#ifndef MT_TOOLS_PLAN_PLAN_REPORT_H
#define MT_TOOLS_PLAN_PLAN_REPORT_H

#include <jansson.h>
#include <stdio.h>

#include "engine/config/config.h"
#include "engine/model/hf/model_config.h"
#include "scheduler/basequant.h"
#include "scheduler/costmodel.h"
#include "scheduler/hw.h"
#include "scheduler/planner.h"
#include "scheduler/registry.h"

typedef struct {
    const char *run_path;
    char model_config_path[1200];
    eng_run_config_t rc;
    eng_model_config_t mc;
    sched_hw_t hw;
    sched_registry_t reg;
    sched_workload_t w;
    sched_base_quant_t quant; /* the frozen base's stored format (quant.on false: the working dtype) */
    sched_planner_opts_t opts;
    sched_planner_result_t res;
} plan_ctx_t;

void plan_report_text(FILE *f, const plan_ctx_t *c);
json_t *plan_report_json(const plan_ctx_t *c);
/* Chrome trace of the predicted step: one track per resource, memory counters. */
mt_status_t plan_write_trace(const plan_ctx_t *c, const char *path, mt_error_t *err);

#endif
