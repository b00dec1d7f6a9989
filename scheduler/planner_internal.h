/* What planner.c and planner_pins.c share (internal to scheduler/); the
 * evaluation lives in planner_eval.c so that neither calls into the other. */
#ifndef MT_SCHEDULER_PLANNER_INTERNAL_H
#define MT_SCHEDULER_PLANNER_INTERNAL_H

#include <stdbool.h>

#include "scheduler/planner.h"

/* A simulated plan as the planner compares plans. */
typedef struct {
    double time, peak[SCHED_MEM_COUNT], traffic;
    double nvme; /* bytes the plan keeps on NVMe */
} eval_t;

void plan_copy(sched_plan_t *dst, const sched_plan_t *src);
mt_status_t evaluate(const sched_workload_t *w, const sched_plan_t *p, eval_t *e, int *nsims, mt_error_t *err);
bool fits(const eval_t *e, const double *budget);

/* Pins working copies, then accumulators, on the walk's start plan
 * (planner_pins.c). */
mt_status_t sched_pin_start(const sched_workload_t *w, const sched_planner_opts_t *o, sched_plan_t *start,
                            int *nsims, mt_error_t *err);
/* Pins on a plan walked without pins, kept where it fits and is faster. */
mt_status_t sched_pin_after(const sched_workload_t *w, const sched_planner_opts_t *o, sched_plan_t *plan,
                            int *nsims, mt_error_t *err);

#endif
