/* Parallel-for thread pool (see threadpool.h).
 *
 * Workers sleep on a condition variable between jobs; a job is published
 * with a generation counter so a worker never runs the same job twice, and
 * tasks are claimed with an atomic counter. A mutex serialises callers. */
#include "kernels/host/threadpool.h"

#include <string.h>

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/dtype.h"
#include "base/status.h"

struct kern_threadpool {
    int nthreads;
    pthread_t *workers; /* nthreads - 1 */
    pthread_mutex_t call_lock; /* one job at a time */
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned long generation;
    int stopping;
    /* current job */
    kern_parallel_fn fn;
    void *ctx;
    size_t ntasks;
    atomic_size_t next;
    int active; /* workers still inside the current job */
};

static void run_tasks(kern_threadpool_t *p) {
    for (;;) {
        size_t t = atomic_fetch_add(&p->next, 1);
        if (t >= p->ntasks) break;
        p->fn(p->ctx, t);
    }
}

static void *worker_main(void *arg) {
    kern_threadpool_t *p = arg;
    unsigned long seen = 0;
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->stopping && p->generation == seen) pthread_cond_wait(&p->wake, &p->lock);
        if (p->stopping) break;
        seen = p->generation;
        pthread_mutex_unlock(&p->lock);
        run_tasks(p);
        pthread_mutex_lock(&p->lock);
        if (--p->active == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

kern_threadpool_t *kern_threadpool_create(int nthreads) {
    if (nthreads <= 0) {
        long n = sysconf(_SC_NPROCESSORS_ONLN);
        nthreads = n > 0 ? (int)n : 1;
    }
    kern_threadpool_t *p = calloc(1, sizeof *p);
    MT_CHECK_ALLOC(p, "thread pool");
    p->nthreads = nthreads;
    pthread_mutex_init(&p->call_lock, NULL);
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (nthreads > 1) {
        p->workers = calloc((size_t)nthreads - 1, sizeof *p->workers);
        MT_CHECK_ALLOC(p->workers, "thread pool workers");
        for (int i = 0; i < nthreads - 1; i++)
            MT_CHECK(pthread_create(&p->workers[i], NULL, worker_main, p) == 0,
                     "pthread_create failed for thread pool worker %d", i);
    }
    return p;
}

void kern_threadpool_destroy(kern_threadpool_t *p) {
    if (!p) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads - 1; i++) pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->lock);
    pthread_mutex_destroy(&p->call_lock);
    free(p);
}

int kern_threadpool_size(const kern_threadpool_t *p) { return p ? p->nthreads : 1; }

void kern_threadpool_parallel_for(kern_threadpool_t *p, size_t ntasks, kern_parallel_fn fn,
                                  void *ctx) {
    if (ntasks == 0) return;
    if (!p || p->nthreads == 1 || ntasks == 1) {
        for (size_t t = 0; t < ntasks; t++) fn(ctx, t);
        return;
    }
    pthread_mutex_lock(&p->call_lock);
    pthread_mutex_lock(&p->lock);
    p->fn = fn;
    p->ctx = ctx;
    p->ntasks = ntasks;
    atomic_store(&p->next, 0);
    p->active = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    run_tasks(p);
    pthread_mutex_lock(&p->lock);
    while (p->active > 0) pthread_cond_wait(&p->done, &p->lock);
    pthread_mutex_unlock(&p->lock);
    pthread_mutex_unlock(&p->call_lock);
}

typedef struct {
    char *dst;
    const char *src;
    size_t bytes, piece;
} memcpy_job_t;

static void memcpy_task(void *ctx, size_t t) {
    const memcpy_job_t *j = ctx;
    const size_t off = t * j->piece, n = j->bytes - off < j->piece ? j->bytes - off : j->piece;
    memcpy(j->dst + off, j->src + off, n);
}

void kern_threadpool_memcpy(kern_threadpool_t *pool, void *dst, const void *src, size_t bytes) {
    const memcpy_job_t j = {dst, src, bytes, (size_t)4 << 20};
    kern_threadpool_parallel_for(pool, (bytes + j.piece - 1) / j.piece, memcpy_task, (void *)&j);
}

typedef struct {
    uint16_t *dst;
    const float *src;
    size_t n, piece;
} to_bf16_job_t;

static void to_bf16_task(void *ctx, size_t t) {
    const to_bf16_job_t *j = ctx;
    const size_t off = t * j->piece, n = j->n - off < j->piece ? j->n - off : j->piece;
    mt_convert_from_f32(j->dst + off, MT_BF16, j->src + off, n);
}

void kern_threadpool_to_bf16(kern_threadpool_t *pool, uint16_t *dst, const float *src, size_t n) {
    const to_bf16_job_t j = {dst, src, n, (size_t)1 << 20};
    kern_threadpool_parallel_for(pool, (n + j.piece - 1) / j.piece, to_bf16_task, (void *)&j);
}
