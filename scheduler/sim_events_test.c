/* The simulator's memory-event sort (sim_sort_events) against the order it
 * promises: by time, frees before takes at equal times, nothing lost or
 * duplicated.  Inputs: spread times, many equal times of both signs, and
 * runs of times a millionth apart in reverse order (they share a radix
 * bucket, so the finishing sort does the work, and past its budget the
 * fallback does). */
#include "scheduler/simulate_internal.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) { /* [0, 1) */
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) * 0x1p-53;
}

static int by_time_then_delta(const void *a, const void *b) {
    const ev_t *x = a, *y = b;
    if (x->t != y->t) return x->t < y->t ? -1 : 1;
    if (x->d != y->d) return x->d < y->d ? -1 : 1;
    return 0;
}

static void check(const char *name, ev_t *ev, int n) {
    ev_t *want = malloc((size_t)n * sizeof *want), *got = malloc((size_t)n * sizeof *got);
    if (!want || !got) abort();
    memcpy(want, ev, (size_t)n * sizeof *ev);
    sim_sort_events(ev, n);
    int bad = 0;
    for (int i = 1; i < n && !bad; i++) {
        const ev_t *x = &ev[i - 1], *y = &ev[i];
        if (x->t > y->t || (x->t == y->t && x->d >= 0 && y->d < 0)) {
            fprintf(stderr, "%s: events %d and %d out of order: (%g, %g) before (%g, %g)\n", name, i - 1, i, x->t,
                    x->d, y->t, y->d);
            bad = 1;
        }
    }
    /* the same multiset: both sorted by (t, d) compare equal */
    memcpy(got, ev, (size_t)n * sizeof *ev);
    qsort(want, (size_t)n, sizeof *want, by_time_then_delta);
    qsort(got, (size_t)n, sizeof *got, by_time_then_delta);
    if (!bad && memcmp(want, got, (size_t)n * sizeof *got) != 0) {
        fprintf(stderr, "%s: the sorted events are not the events given\n", name);
        bad = 1;
    }
    failures += bad;
    free(want);
    free(got);
}

int main(void) {
    enum { N = 20000 };
    ev_t *ev = malloc(N * sizeof *ev);
    if (!ev) return 1;

    for (int i = 0; i < N; i++) ev[i] = (ev_t){1000 * uniform(), uniform() - 0.5};
    check("spread times", ev, N);

    for (int i = 0; i < N; i++) ev[i] = (ev_t){(double)(int)(20 * uniform()), uniform() < 0.5 ? -1.0 : 1.0};
    ev[0].t = -0.0, ev[1].t = 0.0, ev[2].t = -3.5;
    check("equal times, both signs", ev, N);

    /* 50 events per bucket in reverse: a finishing insertion sort within budget */
    for (int i = 0; i < N; i++) ev[i] = (ev_t){(double)(i / 50) + 1e-9 * (50 - i % 50), i % 3 ? 1.0 : -1.0};
    check("close times, reversed in small runs", ev, N);

    /* all in one bucket, reversed: past the insertion budget */
    for (int i = 0; i < N; i++) ev[i] = (ev_t){100.0 + 1e-12 * (N - i), i % 2 ? 1.0 : -1.0};
    check("one bucket, reversed", ev, N);

    check("one event", ev, 1);
    free(ev);
    if (failures) fprintf(stderr, "sim_events_test: %d failure(s)\n", failures);
    else printf("sim_events_test: all passed\n");
    return failures != 0;
}
