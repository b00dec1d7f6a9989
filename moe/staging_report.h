/* The staging profiler's outputs: a CSV timeline, an SVG picture
 * comparing modes, Chrome-trace counter events for trace.json, and text
 * summaries of the counters and of the planner's sizing.
 *
 * Everything is written by hand (no libraries) from the timelines that
 * moe/staging.h records. */
#ifndef MT_MOE_STAGING_REPORT_H
#define MT_MOE_STAGING_REPORT_H

#include <stdbool.h>
#include <stdio.h>

#include "moe/staging.h"

/* CSV, one row per sample: mode,t_ms,reserved_bytes,in_use_bytes,payload_bytes,waiting,step. */
mt_status_t moe_staging_write_csv(const moe_staging_t *pool, const char *path, mt_error_t *err);
/* The same for several timelines in one file (rows of each mode in turn). */
mt_status_t moe_staging_write_csv_timelines(const moe_staging_timeline_t *const *tl, int n, const char *path,
                                            mt_error_t *err);
void moe_staging_timeline_csv(FILE *f, const moe_staging_timeline_t *tl, bool header);

/* SVG: pinned bytes in use (solid) and reserved (dashed) over time, one
 * colour per timeline, time spent waiting for space as marks under the
 * axis, axes with units, a legend with each mode's peaks. */
mt_status_t moe_staging_write_svg(const moe_staging_timeline_t *const *modes, int nmodes, const char *path,
                                  mt_error_t *err);

/* Chrome-trace counter events ("ph":"C") for one timeline: a counter track
 * "staging <label>" with series reserved and in_use (bytes), and a track
 * "staging <label> waiting" (0/1) where waits happen.  Timestamps are
 * microseconds: t_s * 1e6 + ts_offset_us; to put them on a trace whose
 * time zero is CLOCK_MONOTONIC second T, pass (tl->epoch_s - T) * 1e6.
 * Events are separated by commas; with leading_comma a comma also comes
 * before the first (appending to an existing traceEvents array).  Returns
 * the number of events written. */
size_t moe_staging_trace_counters(FILE *f, const moe_staging_timeline_t *tl, int pid, double ts_offset_us,
                                  bool leading_comma);
/* One sample's main counter event into buf (snprintf semantics: returns
 * the length it needs, writes at most cap bytes including the NUL). */
size_t moe_staging_trace_counter_event(char *buf, size_t cap, const moe_staging_timeline_t *tl, size_t i, int pid,
                                       double ts_offset_us);

/* Text summary of one mode's counters (the `moetune profile` summary). */
void moe_staging_print_stats(FILE *f, const char *label, const moe_staging_stats_t *s);
/* The JSON object of the same counters (no trailing newline). */
void moe_staging_print_stats_json(FILE *f, const char *label, const moe_staging_stats_t *s);
/* `moetune plan`'s staging lines for one model and window. */
void moe_staging_plan_print(FILE *f, const char *what, const moe_staging_plan_t *p);

/* "1.50 GiB" style, into buf (returns buf). */
const char *moe_staging_fmt_bytes(double bytes, char *buf, size_t cap);

#endif
