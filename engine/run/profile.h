/* `moetune profile RUN.yaml [--compare] [--steps N]`: the staging
 * profiler.  Runs a few optimizer steps of the run (the run's plan, or
 * offload_all when that plan moves nothing through staging, which it then
 * says) and reports how the staging pool (moe/staging.h, engine/exec/exec.h)
 * behaved:
 *
 *   stdout                     per mode: pinned bytes reserved and in use at
 *                              the peak, internal waste, reserved against the
 *                              window's payload, copies and mean copy size per
 *                              direction, copies per MoE layer per direction per
 *                              micro-batch, experts skipped, time waiting for
 *                              space, step time; jemalloc's statistics for
 *                              pageable host memory; with --compare the checks
 *                              of the staging pool (identical losses, compact <= 1.10x
 *                              payload with <= 10% waste, <= 3 copies per MoE
 *                              layer, max_slot > per_tensor >= compact pinned)
 *   output_dir/staging/staging.csv   the timeline (moe/staging_report.h)
 *   output_dir/staging/staging.svg   pinned bytes in use / reserved over time,
 *                              one line per mode
 *   output_dir/staging/trace-MODE.json  with `trace: true`: the run's Chrome
 *                              trace with the pool's counter tracks
 *
 * --compare runs compact, per_tensor and max_slot on the same data and plan;
 * without it only the run config's staging.mode runs.  Losses that differ
 * between modes are an error (MT_ERR_INTERNAL): the staging layout must not
 * change what is computed. */
#ifndef MT_ENGINE_PROFILE_H
#define MT_ENGINE_PROFILE_H

#include <stdbool.h>
#include <stdio.h>

#include "engine/config/config.h"

typedef struct {
    int steps;    /* optimizer steps per mode (default 3) */
    bool compare; /* all three staging modes */
    FILE *out;    /* the summary (stdout when NULL) */
} eng_profile_opts_t;

mt_status_t eng_profile(const eng_run_config_t *rc, const eng_profile_opts_t *opts, mt_error_t *err);

#endif
