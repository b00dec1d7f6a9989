/* How the planner prices a plan: one simulation, read as the numbers the
 * walk compares (shared by planner.c and planner_pins.c). */
#include "scheduler/planner_internal.h"

#include <stdlib.h>
#include <string.h>

void plan_copy(sched_plan_t *dst, const sched_plan_t *src) {
    *dst = *src;
    dst->blocks = malloc((size_t)src->num_blocks * sizeof *dst->blocks);
    MT_CHECK_ALLOC(dst->blocks, "plan copy");
    memcpy(dst->blocks, src->blocks, (size_t)src->num_blocks * sizeof *dst->blocks);
}

mt_status_t evaluate(const sched_workload_t *w, const sched_plan_t *p, eval_t *e, int *nsims, mt_error_t *err) {
    sched_sim_result_t r;
    mt_status_t st = sched_simulate(w, p, NULL, &r, err);
    if (st != MT_OK) return st;
    (*nsims)++;
    e->time = r.step_time;
    memcpy(e->peak, r.peak, sizeof e->peak);
    /* what runs off the compute stream: link traffic and host memory */
    e->traffic = r.h2d_bytes + r.d2h_bytes + r.peak[SCHED_MEM_HOST];
    e->nvme = r.nvme_bytes;
    sched_sim_result_free(&r);
    return MT_OK;
}

bool fits(const eval_t *e, const double *budget) {
    for (int m = 0; m < SCHED_MEM_COUNT; m++)
        if (budget[m] > 0 && e->peak[m] > budget[m]) return false;
    return true;
}
