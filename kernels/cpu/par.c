/* Thread-pool dispatch for the CPU kernels (see par.h). */
#include "kernels/cpu/par.h"

#include "kernels/cpu/backend_cpu.h"

/* The backend defines this; a weak reference lets the kernels (and their
 * tests) link without the backend. A non-NULL stream exists only when the
 * backend made it, so then the symbol is always there (as in adamw.c). */
#pragma weak kern_cpu_stream_threadpool

void kern_cpu_parallel_for(kern_stream_t *s, size_t ntasks, kern_parallel_fn fn, void *ctx) {
    kern_threadpool_t *pool = (s && kern_cpu_stream_threadpool) ? kern_cpu_stream_threadpool(s) : NULL;
    kern_threadpool_parallel_for(pool, ntasks, fn, ctx);
}

size_t kern_cpu_tasks(size_t n, size_t chunk) { return (n + chunk - 1) / chunk; }
