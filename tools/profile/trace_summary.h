/* A summary of a GPU activity trace (tools/profile/cupti_trace.c records
 * one): the trace cut into phases, runs of device activity separated by
 * idle gaps (a benchmark's plans, or a run's load and its steps), and per
 * phase its span, the time the device was busy (the union of kernels and
 * copies), the kernels by total time and the runtime API calls made
 * during it by total time.  Apart from the recorder so that the
 * arithmetic is tested without a GPU. */
#ifndef MT_TOOLS_PROFILE_TRACE_SUMMARY_H
#define MT_TOOLS_PROFILE_TRACE_SUMMARY_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    TS_KERNEL = 0, /* device activity: a kernel */
    TS_COPY,       /* device activity: a copy or a memset */
    TS_API,        /* a host call into the CUDA runtime */
} ts_kind_t;

typedef struct {
    uint64_t start_ns, end_ns;
    ts_kind_t kind;
    const char *name; /* kernel or call name; not owned */
} ts_event_t;

typedef struct {
    double gap_s;      /* idle time that ends a phase */
    double min_span_s; /* phases shorter than this are not printed */
    int top;           /* kernels and calls listed per phase */
} ts_options_t;

/* One phase's totals, for a caller (and the test) that wants numbers. */
typedef struct {
    uint64_t start_ns, end_ns;
    double busy_s;   /* union of the device intervals */
    long kernels;    /* kernel count */
    double kernel_s; /* their summed durations */
} ts_phase_t;

/* Sorts ev by start and cuts it into phases: fills up to max phases into
 * out and returns how many there are. */
int ts_phases(ts_event_t *ev, size_t n, double gap_s, ts_phase_t *out, int max);

/* Prints every phase of at least min_span_s: a header line
 * "== phase K: span S s, device busy B s (P%), N kernels (sum T s)", the top
 * kernels and copies by total time ("  <ms> ms <count>  <name>"), then
 * "  runtime API:" and the top calls inside the phase's span. */
void ts_report(FILE *out, ts_event_t *ev, size_t n, const ts_options_t *opt);

#endif
