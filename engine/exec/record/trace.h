/* Chrome trace output (trace.json, opens in Perfetto / chrome://tracing):
 * one track per stream (compute, H2D, D2H, host optimizer) with a complete
 * event ("ph":"X") per block forward/backward, copy and optimizer job, and
 * counters ("ph":"C") for device, pinned and host bytes.
 *
 * Thread-safe: copy streams and the host optimizer thread record too.
 * Events are kept in memory and written by eng_trace_close. */
#ifndef MT_ENGINE_TRACE_H
#define MT_ENGINE_TRACE_H

#include <stddef.h>

#include "base/status.h"

typedef enum {
    ENG_TRACK_COMPUTE = 1,
    ENG_TRACK_H2D = 2,
    ENG_TRACK_D2H = 3,
    ENG_TRACK_HOST_OPTIM = 4,
} eng_track_t;

typedef struct eng_trace eng_trace_t;

mt_status_t eng_trace_open(const char *path, eng_trace_t **out, mt_error_t *err);
/* Seconds on the trace's clock (CLOCK_MONOTONIC, as eng_now_s). */
void eng_trace_span(eng_trace_t *t, eng_track_t track, const char *name, const char *cat, double t0_s,
                    double t1_s, size_t bytes);
void eng_trace_counter(eng_trace_t *t, const char *name, double t_s, double value);
/* Appends Chrome trace events written by another module (e.g. the staging
 * pool's counter tracks, moe/staging_report.h): `events` is a list of JSON
 * objects separated by commas, whose "ts" are microseconds of the trace's
 * clock (CLOCK_MONOTONIC seconds * 1e6); they are shifted to the trace's
 * time origin when written.  MT_ERR_INTERNAL when the text does not parse. */
mt_status_t eng_trace_add_events_json(eng_trace_t *t, const char *events, mt_error_t *err);
/* Writes the file (to a temporary name, then renamed) and frees t. */
mt_status_t eng_trace_close(eng_trace_t *t, mt_error_t *err);

#endif
