/* The CPU backend's parallel-for pool (kernels/host/threadpool.h): every task
 * runs exactly once per call, for pool sizes 1..4 and "all cores" and task
 * counts 0..1000, over many consecutive calls (the generation counter must
 * never let a worker skip or repeat a job), with two threads calling one
 * pool at once (callers are serialised, not mixed). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/host/threadpool.h"

typedef struct {
    atomic_int *hits;
    size_t ntasks;
} job_t;

static void count_fn(void *ctx, size_t task) {
    job_t *j = ctx;
    if (task < j->ntasks) atomic_fetch_add(&j->hits[task], 1);
}

/* Runs `reps` parallel_for calls over ntasks, returns the number of tasks
 * not run exactly once in some call. */
static int run_jobs(kern_threadpool_t *pool, size_t ntasks, int reps) {
    atomic_int *hits = calloc(ntasks ? ntasks : 1, sizeof *hits);
    MT_CHECK_ALLOC(hits, "hits");
    int bad = 0;
    for (int r = 0; r < reps; r++) {
        for (size_t t = 0; t < ntasks; t++) atomic_store(&hits[t], 0);
        job_t j = {hits, ntasks};
        kern_threadpool_parallel_for(pool, ntasks, count_fn, &j);
        for (size_t t = 0; t < ntasks; t++) bad += atomic_load(&hits[t]) != 1;
    }
    free(hits);
    return bad;
}

typedef struct {
    kern_threadpool_t *pool;
    int bad;
} caller_t;

static void *caller_main(void *arg) {
    caller_t *c = arg;
    c->bad = run_jobs(c->pool, 97, 300);
    return NULL;
}

int main(void) {
    static const int sizes[] = {1, 2, 3, 4, 0};
    static const size_t counts[] = {0, 1, 2, 3, 7, 64, 1000};
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        kern_threadpool_t *pool = kern_threadpool_create(sizes[si]);
        const int n = kern_threadpool_size(pool);
        tu_expect(sizes[si] == 0 ? n >= 1 : n == sizes[si], "pool of %d reports size %d", sizes[si],
                  n);
        for (size_t ci = 0; ci < sizeof counts / sizeof counts[0]; ci++) {
            const int bad = run_jobs(pool, counts[ci], 200);
            tu_expect(bad == 0, "pool %d threads, %zu tasks x 200 calls: %d task runs not exactly once",
                      n, counts[ci], bad);
        }
        /* two callers at once */
        caller_t a = {pool, 0}, b = {pool, 0};
        pthread_t ta, tb;
        MT_CHECK(pthread_create(&ta, NULL, caller_main, &a) == 0, "pthread_create");
        MT_CHECK(pthread_create(&tb, NULL, caller_main, &b) == 0, "pthread_create");
        pthread_join(ta, NULL);
        pthread_join(tb, NULL);
        tu_expect(a.bad == 0 && b.bad == 0, "pool %d threads, two concurrent callers: %d + %d bad",
                  n, a.bad, b.bad);
        kern_threadpool_destroy(pool);
    }
    /* NULL pool runs inline */
    atomic_int hits[5] = {0};
    job_t j = {hits, 5};
    kern_threadpool_parallel_for(NULL, 5, count_fn, &j);
    int bad = 0;
    for (int t = 0; t < 5; t++) bad += atomic_load(&hits[t]) != 1;
    tu_expect(bad == 0, "NULL pool: %d tasks not run exactly once", bad);
    tu_expect(kern_threadpool_size(NULL) == 1, "NULL pool size must be 1");
    return tu_finish("threadpool_test");
}
