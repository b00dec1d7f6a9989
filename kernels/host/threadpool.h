/* A fixed pool of worker threads running parallel-for jobs.
 *
 * The CPU backend owns one pool (kern_cpu_stream_threadpool) and kernels
 * that are bound by memory bandwidth rather than by BLAS (AdamW, large
 * element-wise passes) split their work over it.  The calling thread takes
 * part in the work, so a pool of n threads runs n-1 workers. */
#ifndef MT_KERNELS_HOST_THREADPOOL_H
#define MT_KERNELS_HOST_THREADPOOL_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_threadpool kern_threadpool_t;

/* fn(ctx, task) is called once for each task in [0, ntasks). */
typedef void (*kern_parallel_fn)(void *ctx, size_t task);

/* nthreads <= 0 means one per online core. */
kern_threadpool_t *kern_threadpool_create(int nthreads);
void kern_threadpool_destroy(kern_threadpool_t *pool);
int kern_threadpool_size(const kern_threadpool_t *pool);
/* Runs all tasks, returns when every one has finished. Tasks are handed out
 * dynamically (an atomic counter), so uneven tasks balance. Not reentrant:
 * one parallel_for at a time per pool (callers on other threads wait). */
void kern_threadpool_parallel_for(kern_threadpool_t *pool, size_t ntasks, kern_parallel_fn fn,
                                  void *ctx);
/* memcpy over the pool in pieces of a few MB (pool NULL: on the caller):
 * one thread copies host memory at a fraction of what the host's memory
 * can move, and the host optimizer's copies are gigabytes. */
void kern_threadpool_memcpy(kern_threadpool_t *pool, void *dst, const void *src, size_t bytes);
/* n fp32 values rounded to bf16 (mt_convert_from_f32's rule, the same
 * bits) over the pool in pieces (pool NULL: on the caller). */
void kern_threadpool_to_bf16(kern_threadpool_t *pool, uint16_t *dst, const float *src, size_t n);

#endif
