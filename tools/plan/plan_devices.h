/* `moetune plan --devices N` (or `devices:` in the run config): data
 * parallel on N devices of one host sharing one host copy, each device
 * with its own link (scheduler/data_parallel.h).  Private to the command. */
#ifndef MT_TOOLS_PLAN_PLAN_DEVICES_H
#define MT_TOOLS_PLAN_PLAN_DEVICES_H

#include <jansson.h>
#include <stdio.h>

#include "scheduler/data_parallel.h"
#include "tools/plan/plan_report.h"

typedef struct {
    sched_dp_result_t dp;
    sched_plan_t plan;   /* one device's plan for its share (two devices: the layout chosen) */
    bool feasible;
    double single_step_s; /* one device running all K micro-batches (the main plan) */
    /* two devices: data or expert parallel per MoE layer (scheduler/data_parallel.h) */
    bool layouts;
    sched_parallel_t parallel; /* asked: the run config's parallel: */
    sched_parallel_result_t par;
    bool peer_via_host;
    /* why training would not run expert parallel (NULL: it would); the
     * expert layouts are then predicted for comparison only */
    const char *ep_refused;
} plan_devices_t;

/* Plans one device's share (K / n micro-batches) within one device's
 * budgets and predicts the data parallel step; on two devices with MoE
 * layers also all-expert-parallel and the planner's per-layer mix. */
mt_status_t plan_devices_make(const plan_ctx_t *c, int n, plan_devices_t *out, mt_error_t *err);
void plan_devices_text(FILE *f, const plan_ctx_t *c, const plan_devices_t *d);
json_t *plan_devices_json(const plan_ctx_t *c, const plan_devices_t *d);
void plan_devices_free(plan_devices_t *d);

#endif
