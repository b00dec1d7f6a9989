/* Splitting a CPU kernel over the backend's thread pool (private to
 * kernels/cpu).
 *
 * Determinism rule for every kernel that uses this: the task count and what
 * each task computes depend only on the problem's shape, never on the
 * number of threads, and a task writes only its own outputs (or its own
 * slot of partial sums, combined afterwards in task order). Tasks may then
 * run on any thread in any order and the results stay bit-identical,
 * whatever host_threads is. */
#ifndef MT_KERNELS_CPU_PAR_H
#define MT_KERNELS_CPU_PAR_H

#include <stddef.h>

#include "kernels/host/threadpool.h"

typedef struct kern_stream kern_stream_t;

/* Runs fn(ctx, t) for t in [0, ntasks) on s's pool (inline when s has none
 * or ntasks is 1). Never call it from inside a task (the pool is not
 * reentrant). */
void kern_cpu_parallel_for(kern_stream_t *s, size_t ntasks, kern_parallel_fn fn, void *ctx);

/* Number of tasks of at most `chunk` items covering n items (0 when n is 0). */
size_t kern_cpu_tasks(size_t n, size_t chunk);

#endif
