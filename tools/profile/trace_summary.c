/* See trace_summary.h. */
#include "tools/profile/trace_summary.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static int by_start(const void *a, const void *b) {
    const uint64_t x = ((const ts_event_t *)a)->start_ns, y = ((const ts_event_t *)b)->start_ns;
    return (x > y) - (x < y);
}

static bool on_device(const ts_event_t *e) { return e->kind != TS_API; }

/* The phase starting at ev[i] (a device event): its end index (exclusive,
 * API events inside included) and totals. */
static size_t phase_at(const ts_event_t *ev, size_t n, size_t i, double gap_s, ts_phase_t *ph) {
    const uint64_t gap_ns = (uint64_t)(gap_s * 1e9);
    *ph = (ts_phase_t){.start_ns = ev[i].start_ns};
    uint64_t cur_s = 0, cur_e = 0, busy_ns = 0;
    size_t j = i;
    for (; j < n; j++) {
        const ts_event_t *e = &ev[j];
        if (!on_device(e)) continue;
        if (cur_e && e->start_ns > cur_e + gap_ns) break;
        if (e->kind == TS_KERNEL) ph->kernels++, ph->kernel_s += (double)(e->end_ns - e->start_ns) * 1e-9;
        if (!cur_e || e->start_ns > cur_e) { /* a new busy interval */
            busy_ns += cur_e - cur_s;
            cur_s = e->start_ns, cur_e = e->end_ns;
        } else if (e->end_ns > cur_e) {
            cur_e = e->end_ns;
        }
    }
    busy_ns += cur_e - cur_s;
    ph->end_ns = cur_e;
    ph->busy_s = (double)busy_ns * 1e-9;
    return j;
}

/* The first device event at or after i (n when none). */
static size_t next_device(const ts_event_t *ev, size_t n, size_t i) {
    while (i < n && !on_device(&ev[i])) i++;
    return i;
}

static void sort_by_start(ts_event_t *ev, size_t n) {
    if (n > 1) qsort(ev, n, sizeof *ev, by_start);
}

int ts_phases(ts_event_t *ev, size_t n, double gap_s, ts_phase_t *out, int max) {
    sort_by_start(ev, n);
    int count = 0;
    for (size_t i = next_device(ev, n, 0); i < n; i = next_device(ev, n, i)) {
        ts_phase_t ph;
        i = phase_at(ev, n, i, gap_s, &ph);
        if (count < max) out[count] = ph;
        count++;
    }
    return count;
}

typedef struct {
    const char *name;
    double s;
    long count;
} total_t;

typedef struct {
    total_t *v;
    int n, cap;
} totals_t;

static void totals_add(totals_t *t, const char *name, double s) {
    name = name ? name : "?";
    for (int i = 0; i < t->n; i++)
        if (strcmp(t->v[i].name, name) == 0) {
            t->v[i].s += s, t->v[i].count++;
            return;
        }
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 64;
        t->v = realloc(t->v, (size_t)t->cap * sizeof *t->v);
        MT_CHECK_ALLOC(t->v, "trace totals");
    }
    t->v[t->n++] = (total_t){name, s, 1};
}

static int by_time(const void *a, const void *b) {
    const double x = ((const total_t *)a)->s, y = ((const total_t *)b)->s;
    return (x < y) - (x > y);
}

static void totals_print(FILE *out, totals_t *t, int top) {
    if (t->n == 0) return;
    qsort(t->v, (size_t)t->n, sizeof *t->v, by_time);
    for (int i = 0; i < t->n && i < top; i++)
        fprintf(out, "  %9.2f ms %7ld  %.160s\n", t->v[i].s * 1e3, t->v[i].count, t->v[i].name);
}

void ts_report(FILE *out, ts_event_t *ev, size_t n, const ts_options_t *opt) {
    sort_by_start(ev, n);
    int k = 0;
    for (size_t i = next_device(ev, n, 0); i < n; k++) {
        ts_phase_t ph;
        const size_t end = phase_at(ev, n, i, opt->gap_s, &ph);
        const double span = (double)(ph.end_ns - ph.start_ns) * 1e-9;
        if (span >= opt->min_span_s) {
            fprintf(out, "== phase %d: span %.3f s, device busy %.3f s (%.0f%%), %ld kernels (sum %.3f s)\n", k, span,
                    ph.busy_s, span > 0 ? 100 * ph.busy_s / span : 0, ph.kernels, ph.kernel_s);
            totals_t dev = {0}, api = {0};
            for (size_t j = i; j < end; j++) {
                const double s = (double)(ev[j].end_ns - ev[j].start_ns) * 1e-9;
                if (on_device(&ev[j])) totals_add(&dev, ev[j].name, s);
                else if (ev[j].start_ns <= ph.end_ns) totals_add(&api, ev[j].name, s);
            }
            totals_print(out, &dev, opt->top);
            fprintf(out, "  runtime API:\n");
            totals_print(out, &api, opt->top);
            free(dev.v);
            free(api.v);
        }
        i = next_device(ev, n, end);
    }
}
