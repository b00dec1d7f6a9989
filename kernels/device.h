/* The device layer: one small vtable per backend, in the spirit of ggml's
 * backend interface.
 *
 * A device owns: an arena of "device memory" with a hard budget (going over
 * it is an error naming the tensor), pinned host memory, three streams
 * (compute, host-to-device copies, device-to-host copies), events for every
 * cross-stream dependency, and a kernel table (ops.h).
 *
 * CPU backend: device memory is a budget-limited arena separate from host
 * tensors; copy streams are worker threads executing their queues in order,
 * optionally throttled to a link bandwidth and per-copy latency so that
 * overlap and the cost model can be measured without a GPU.  The compute
 * stream executes on the thread that issues to it (the host *is* the
 * compute engine), so a compute-stream wait on an event blocks the caller
 * until the event has fired; kernel calls return when their result is ready.
 *
 * CUDA backend: a cudaMalloc'd arena sub-allocated by the same allocator
 * (arena.h), cudaHostAlloc'd pinned memory, real streams and events.
 *
 * Frees.  kern_free may be called as soon as the work that uses a buffer
 * has been issued, on any stream.  Where kernels run asynchronously to the
 * host (CUDA) the freed block is handed out again only after every stream
 * has finished the work issued before the free (stream-ordered frees,
 * arena_defer.h); an allocation that only pending frees can satisfy waits
 * for them instead of failing.  The CPU backend frees at once by default:
 * its kernels have finished when they return and its copy streams' users
 * defer their frees themselves; opts.stream_ordered_frees gives it the
 * CUDA policy (for tests of that policy on its threaded copy streams).
 *
 * All pointers returned by kern_alloc are device pointers: only kernels and
 * kern_memcpy_* may touch them.  On the CPU backend they happen to be host
 * addressable, which the engine must not rely on. */
#ifndef MT_KERNELS_DEVICE_H
#define MT_KERNELS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"
#include "base/dtype.h"
#include "kernels/arena_defer.h"
#include "base/status.h"

typedef struct kern_device kern_device_t;
typedef struct kern_stream kern_stream_t;
typedef struct kern_event kern_event_t;
typedef struct kern_ops kern_ops_t;
typedef struct kern_threadpool kern_threadpool_t; /* kernels/host/threadpool.h */
typedef struct kern_comm kern_comm_t;

/* The kinds of device a program may open.  Which of them it can open is
 * decided by what it links: each backend registers itself with the device
 * layer (backend_registry.h), and kern_device_create finds it there. */
typedef enum {
    KERN_BACKEND_CPU = 0,
    KERN_BACKEND_CUDA,
    KERN_BACKEND_COUNT, /* how many kinds there are, not a kind */
} kern_backend_kind_t;

typedef enum {
    KERN_STREAM_COMPUTE = 0,
    KERN_STREAM_H2D,
    KERN_STREAM_D2H,
    /* Host work that follows copies without holding their stream: the
     * staging pool unpacks landed gradients here (runs host functions and
     * waits for events only), so the D2H stream copies the next piece
     * while the last one is added into host memory. */
    KERN_STREAM_UNPACK,
    KERN_STREAM_COUNT,
} kern_stream_role_t;

typedef struct {
    size_t device_budget_bytes; /* arena capacity; 0 = backend default */
    int device_index;           /* CUDA ordinal */
    int host_threads;           /* CPU backend worker threads for kernels; 0 = all cores */
    /* CPU backend only: with 0 < host_threads < the cores this process may
     * use, pin the creating thread and the kernel pool to the first
     * host_threads of them and every other thread (copy streams, the
     * staging pack thread, the host optimizer: kern_device_pin_host_thread) to
     * the rest.  A GPU computes apart from its copy engines and from the
     * host's cores; without pinning, the OS puts a copy or AdamW thread on
     * the compute core now and then and the compute stream stalls. */
    bool pin_threads;
    /* CPU backend only: copy-stream throttling (0 = as fast as memcpy). */
    double link_h2d_bytes_per_s;
    double link_d2h_bytes_per_s;
    double link_latency_s;
    /* Free device memory in stream order (see "Frees" above).  The CUDA
     * backend always does; the CPU backend does when this is set. */
    bool stream_ordered_frees;
} kern_device_opts_t;

/* Counters every backend keeps; read with kern_device_stats. */
typedef struct {
    size_t device_in_use, device_peak, device_capacity;
    size_t pinned_in_use, pinned_peak;
    uint64_t h2d_copies, d2h_copies;
    uint64_t h2d_bytes, d2h_bytes;
    /* Stream-ordered frees: bytes freed but not reusable yet (counted in
     * device_in_use, as they still occupy the arena), and their peak; blocks
     * that went through the queue; allocations that had to wait for them. */
    size_t device_pending, device_pending_peak;
    uint64_t deferred_frees, free_waits;
} kern_device_stats_t;

typedef void (*kern_host_fn)(void *arg);

/* What a device can do.  Callers ask for the capability they rely on, not
 * which backend they run on, so a new backend (or a CPU with other
 * features) needs no change above the device layer. */
typedef struct {
    /* kern_mm's MT_BF16 compute runs on bf16 hardware (tensor cores, AVX512
     * vdpbf16ps) and is faster than fp32; false: it is emulated through
     * fp32 products (still correct, no faster than fp32). */
    bool bf16_compute;
    /* Kernels and copies may still be running when the call that issued
     * them returns (CUDA): host code must sync (event or stream) before it
     * reads what they write.  False: a compute-stream op has finished when
     * it returns (the CPU backend; its copy streams still run behind). */
    bool kernels_async;
    /* Host code may read and write device memory through device pointers
     * (the CPU backend, where device memory is host memory). */
    bool device_memory_host_addressable;
    /* Copies that can run at the same time as compute (and each other):
     * CUDA's copy engines; the CPU backend's copy-stream threads. */
    int copy_engines;
    /* Host cores a pinned device leaves to host work (the host optimizer);
     * 0 when the device does not pin and host work shares every core. */
    int host_cores;
} kern_device_caps_t;

typedef struct kern_device_i {
    const char *name;
    void (*destroy)(kern_device_t *dev);
    /* Device memory: `base` is the start of the arena's address range. */
    mt_status_t (*arena_reserve)(kern_device_t *dev, size_t capacity, void **base, mt_error_t *err);
    void (*arena_release)(kern_device_t *dev, void *base);
    void *(*pinned_alloc)(kern_device_t *dev, size_t bytes);
    void (*pinned_free)(kern_device_t *dev, void *p, size_t bytes);
    kern_event_t *(*event_create)(kern_device_t *dev);
    void (*event_destroy)(kern_event_t *ev);
    void (*event_record)(kern_event_t *ev, kern_stream_t *s);
    void (*stream_wait_event)(kern_stream_t *s, kern_event_t *ev);
    void (*event_sync)(kern_event_t *ev);
    bool (*event_query)(kern_event_t *ev); /* true when fired */
    void (*stream_sync)(kern_stream_t *s);
    void (*memcpy_h2d)(kern_stream_t *s, void *dst, const void *src, size_t bytes);
    void (*memcpy_d2h)(kern_stream_t *s, void *dst, const void *src, size_t bytes);
    void (*memcpy_d2d)(kern_stream_t *s, void *dst, const void *src, size_t bytes);
    void (*memset)(kern_stream_t *s, void *dst, int value, size_t bytes);
    /* Runs fn(arg) on the host in stream order (after earlier work on s). */
    void (*launch_host_fn)(kern_stream_t *s, kern_host_fn fn, void *arg);
    /* Optional (NULL: nothing to do): see kern_device_pin_host_thread. */
    void (*pin_host_thread)(kern_device_t *dev);
    kern_device_caps_t (*caps)(kern_device_t *dev);
    /* Optional (NULL: none): see kern_device_host_pool. */
    kern_threadpool_t *(*host_pool)(kern_device_t *dev);
    /* Optional (NULL: MT_ERR_UNSUPPORTED): see kern_comm_create; every
     * device in devs has this vtable. */
    mt_status_t (*comm_create)(kern_device_t *const *devs, int n, kern_comm_t **out,
                               mt_error_t *err);
} kern_device_i;

/* A communicator's operations; backends embed struct kern_comm first. */
typedef struct {
    void (*destroy)(kern_comm_t *c);
    void (*allreduce_sum)(kern_comm_t *c, int rank, void *buf, size_t count, mt_dtype_t dt);
    /* Optional (NULL: MT_ERR_UNSUPPORTED): see kern_comm_alltoallv.  Counts
     * and offsets are in bytes here (device.c converts). */
    mt_status_t (*alltoallv)(kern_comm_t *c, int rank, const void *send, const size_t *send_bytes,
                             const size_t *send_offs, void *recv, const size_t *recv_bytes,
                             const size_t *recv_offs, mt_error_t *err);
    /* Optional (NULL: only the flag is set): wakes ranks blocked in a
     * collective; see kern_comm_abort. */
    void (*abort)(kern_comm_t *c);
} kern_comm_i;

struct kern_comm {
    const kern_comm_i *vt;
    int size;
    /* set once by kern_comm_abort, never cleared; read and written with
     * __atomic builtins (not _Atomic: this header is also C++ for nvcc) */
    int aborted;
};

/* Backends embed this struct first in their own. */
struct kern_device {
    const kern_device_i *vt;
    const kern_ops_t *ops;
    kern_backend_kind_t kind;
    kern_device_opts_t opts;
    kern_stream_t *streams[KERN_STREAM_COUNT];
    mt_arena_t arena; /* sub-allocates [arena_base, arena_base + capacity) */
    void *arena_base;
    kern_arena_defer_t defer; /* pending frees, when opts.stream_ordered_frees */
    kern_device_stats_t stats; /* copies counted by the backend; memory by device.c */
    /* Called by kern_alloc when a request does not fit, before it fails: a
     * user with memory waiting on pending copies frees it and returns true
     * to have the request retried (see kern_set_reclaim_hook). */
    bool (*reclaim)(void *ctx);
    void *reclaim_ctx;
    /* Optional, for traces: told of every host<->device copy when it has
     * completed, on the copy stream's thread (times in CLOCK_MONOTONIC s). */
    void (*copy_observer)(void *ctx, kern_stream_role_t role, size_t bytes, double t0_s, double t1_s);
    void *copy_observer_ctx;
};

/* Creates a device of the backend registered for `kind`.  MT_ERR_DEVICE
 * when no backend of that kind is linked into the program (the message
 * names the kind and the backends that are linked), and the backend's own
 * errors: KERN_BACKEND_CUDA on a machine without a usable GPU returns
 * MT_ERR_DEVICE with the CUDA error text (e.g. error 35). */
mt_status_t kern_device_create(kern_backend_kind_t kind, const kern_device_opts_t *opts,
                               kern_device_t **out, mt_error_t *err);
void kern_device_destroy(kern_device_t *dev);
/* True if a CUDA device can be opened (never aborts); else false with the
 * reason: no CUDA backend linked into this program, or the backend's own
 * (no GPU, CUDA error 35, a GPU too old for this build). */
bool kern_cuda_available(char *why, size_t why_len);

/* Device memory from the budget-limited arena.  `tag` names the tensor in
 * the over-budget error. Returns NULL and sets err when it does not fit
 * (after waiting for pending stream-ordered frees, and the reclaim hook). */
void *kern_alloc(kern_device_t *dev, size_t bytes, const char *tag, mt_error_t *err);
/* kern_alloc for memory that lives for the run (resident weights, gradient
 * accumulators, optimizer state): taken from the top of the arena, so that
 * a step's short-lived buffers come and go below it without holes between
 * them (base/arena.h, "Two ends").  Freed with kern_free. */
void *kern_alloc_lasting(kern_device_t *dev, size_t bytes, const char *tag, mt_error_t *err);
/* Frees p; with stream-ordered frees the memory is reused only after every
 * stream has passed this point (see "Frees" above).  p must not be used by
 * work issued after the call. */
void kern_free(kern_device_t *dev, void *p);
/* Installs (or, with fn NULL, removes) the reclaim hook described above. */
void kern_set_reclaim_hook(kern_device_t *dev, bool (*fn)(void *ctx), void *ctx);
/* The size of the arena block behind p (its request rounded up to the arena's alignment). */
size_t kern_alloc_size(const kern_device_t *dev, const void *p);

/* Called at the start of a thread that stands for the host or a copy
 * engine (staging pack thread, host optimizer): keeps it off the compute
 * cores of a CPU device created with pin_threads; otherwise nothing. */
void kern_device_pin_host_thread(kern_device_t *dev);

void *kern_pinned_alloc(kern_device_t *dev, size_t bytes);
void kern_pinned_free(kern_device_t *dev, void *p, size_t bytes);

kern_stream_t *kern_stream(kern_device_t *dev, kern_stream_role_t role);
kern_event_t *kern_event_create(kern_device_t *dev);
/* Allowed while a record is still pending (as cudaEventDestroy): waits
 * already issued still complete. */
void kern_event_destroy(kern_device_t *dev, kern_event_t *ev);
void kern_event_record(kern_device_t *dev, kern_event_t *ev, kern_stream_t *s);
void kern_stream_wait_event(kern_device_t *dev, kern_stream_t *s, kern_event_t *ev);
void kern_event_sync(kern_device_t *dev, kern_event_t *ev);
/* True when the latest record has completed (or the event was never recorded). */
bool kern_event_query(kern_device_t *dev, kern_event_t *ev);
void kern_stream_sync(kern_device_t *dev, kern_stream_t *s);
/* All streams; pending stream-ordered frees become reusable. */
void kern_device_sync(kern_device_t *dev);

void kern_memcpy_h2d(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes);
void kern_memcpy_d2h(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes);
void kern_memcpy_d2d(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes);
void kern_memset(kern_device_t *dev, kern_stream_t *s, void *dst, int value, size_t bytes);
void kern_launch_host_fn(kern_device_t *dev, kern_stream_t *s, kern_host_fn fn, void *arg);

kern_device_caps_t kern_device_caps(kern_device_t *dev);

/* ---- Collectives over several devices of this process ----------------------
 *
 * A communicator over devs[0..n-1] (one backend; rank r is devs[r]), as
 * NCCL's: each rank calls every collective from its own thread, all ranks
 * the same collectives in the same order.  kern_comm_allreduce_sum replaces
 * buf (count elements of dt, F32 or BF16, on devs[rank]) with the sum over
 * the ranks' buffers, issued on rank's compute stream (it runs after the
 * work before it there, later work there sees the sum).
 *
 * Deterministic: every element is summed in rank order 0..n-1 (in fp32,
 * rounded once for BF16), so the result is bit-identical on every rank
 * and run to run, and equals a sequential sum in rank order.
 *
 * CPU backend: in-process, ranks meet at barriers.  CUDA: NCCL, for two
 * devices (ncclAllReduce of two buffers is a + b on both ranks, the rank
 * order; NCCL's rings order three or more differently, so more devices are
 * MT_ERR_UNSUPPORTED), F32 only.  Errors: n < 1, mixed backends, a backend
 * without collectives (MT_ERR_UNSUPPORTED), NCCL failing (MT_ERR_DEVICE). */
mt_status_t kern_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out, mt_error_t *err);
void kern_comm_destroy(kern_comm_t *c);
int kern_comm_size(const kern_comm_t *c);
void kern_comm_allreduce_sum(kern_comm_t *c, int rank, void *buf, size_t count, mt_dtype_t dt);

/* All-to-all of variable-sized buffers (MPI's alltoallv, NCCL's grouped
 * send/recv): rank sends, to every rank q (itself included),
 * send_counts[q] elements of dt starting send_offs[q] elements into `send`,
 * and receives from every rank q recv_counts[q] elements into `recv` at
 * recv_offs[q] elements.  Both buffers are on devs[rank] and must not
 * overlap; the arrays have kern_comm_size entries and are read during the
 * call only.  Issued on rank's compute stream like the all-reduce: it
 * reads `send` after the work issued there before it, and work issued
 * there after it sees `recv`.  A pure copy, so any dtype, bit for bit.
 *
 * Every rank must call it (the same number of times, in the same order as
 * the other collectives), and rank r's send_counts[q] must equal rank q's
 * recv_counts[r]: the receiver has to know its sizes in advance (exchange
 * counts first with a small alltoallv of fixed size when they are data
 * dependent, as an MoE layer's tokens per expert are).  The CPU backend
 * checks that agreement and every rank returns MT_ERR_CONFIG naming the
 * first pair that disagrees; NCCL cannot check it (a mismatch there is
 * undefined, as in NCCL itself).
 *
 * Errors: MT_ERR_UNSUPPORTED where the backend has no all-to-all,
 * MT_ERR_DEVICE when the communicator was aborted (before or during the
 * call: the receive buffer's contents are then unspecified) or NCCL fails. */
mt_status_t kern_comm_alltoallv(kern_comm_t *c, int rank, const void *send, const size_t *send_counts,
                                const size_t *send_offs, void *recv, const size_t *recv_counts,
                                const size_t *recv_offs, mt_dtype_t dt, mt_error_t *err);

/* Aborts the communicator, from any thread: a rank that fails between two
 * collectives calls it so that its peers, blocked in (or later entering) a
 * collective waiting for it, return instead of waiting forever.  After it,
 * kern_comm_alltoallv returns MT_ERR_DEVICE and kern_comm_allreduce_sum
 * returns at once leaving its buffer unspecified: callers that continue
 * check kern_comm_aborted.  Only kern_comm_destroy is useful afterwards. */
void kern_comm_abort(kern_comm_t *c);
bool kern_comm_aborted(const kern_comm_t *c);
/* The host thread pool the device's own kernels run on, which host work
 * (the host optimizer) may share while the device's compute is idle: the
 * CPU backend's kernel pool.  NULL when the device has none (CUDA): make a
 * pool of your own (kernels/host/threadpool.h). */
kern_threadpool_t *kern_device_host_pool(kern_device_t *dev);

kern_device_stats_t kern_device_stats(const kern_device_t *dev);
void kern_device_reset_peaks(kern_device_t *dev);

#endif
