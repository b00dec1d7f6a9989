/* The CUDA backend of the device layer (device.h): one device ordinal, its
 * arena carved from a single cudaMalloc, pinned host memory from
 * cudaHostAlloc, three non-blocking streams (compute, H2D, D2H), events
 * without timing, asynchronous copies, and the cuBLASLt handle.  The kernel
 * table is kern_ops_cuda (ops_table_cuda.c); kernels live in the .cu files.
 *
 * Failure policy (status.h): "no usable GPU", "budget larger than free
 * memory" and "cudaMalloc refused" are recoverable and come back as
 * mt_status_t with the CUDA error text; any other failing CUDA call is a
 * broken invariant and aborts through MT_CUDA_CHECK naming the call.
 * Never managed memory: the arena is plain device memory and the budget is
 * checked against cudaMemGetInfo's free bytes before anything is reserved.
 *
 * Every entry point makes the stream's (or event's) device current first,
 * so one process may drive two devices from one thread.
 *
 * Kernels and copies run asynchronously to the host, so device memory is
 * freed in stream order (device.h, arena_defer.h): the device is created
 * with opts.stream_ordered_frees set, whatever the caller asked.
 *
 * The backend registers itself with the device layer when it is linked
 * (backend_registry.h; its library is alwayslink): a program opens CUDA
 * devices by linking //kernels/backends:cuda, and kern_cuda_available asks
 * kern_cuda_probe through that entry. */
#include "kernels/cuda/backend_cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_registry.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/ops.h"
#include "base/clock.h"

/* Compute capability the objects carry code for (sm_80 SASS upwards). */
#define KERN_CUDA_MIN_CC_MAJOR 8

static kern_cuda_device_t *as_cuda(kern_device_t *dev) { return (kern_cuda_device_t *)dev; }

bool kern_cuda_probe(char *why, size_t why_len) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        if (why && why_len)
            snprintf(why, why_len,
                     "no usable CUDA device: cudaGetDeviceCount failed with CUDA error %d (%s: %s)",
                     (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
        return false;
    }
    if (n == 0) {
        if (why && why_len) snprintf(why, why_len, "no CUDA device found");
        return false;
    }
    int usable = 0;
    for (int i = 0; i < n; i++) {
        int major = 0;
        if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, i) != cudaSuccess) {
            (void)cudaGetLastError();
            continue;
        }
        if (major >= KERN_CUDA_MIN_CC_MAJOR) usable++;
    }
    if (!usable) {
        if (why && why_len)
            snprintf(why, why_len,
                     "%d CUDA device(s) found, none of compute capability %d.0 or newer (this build "
                     "carries sm_80/sm_90 code)",
                     n, KERN_CUDA_MIN_CC_MAJOR);
        return false;
    }
    if (why && why_len) snprintf(why, why_len, "%d usable CUDA device(s) of %d", usable, n);
    return true;
}

/* Bytes of arena_reserve's region that are not arena. */
static size_t backend_extra_bytes(void) {
    return KERN_CUDA_LT_WORKSPACE_BYTES + KERN_CUDA_SCRATCH_COMPUTE_BYTES +
           2 * KERN_CUDA_SCRATCH_COPY_BYTES;
}

static void cuda_destroy(kern_device_t *dev) {
    kern_cuda_device_t *d = as_cuda(dev);
    kern_cuda_set_device(d->ordinal);
    for (int r = 0; r < KERN_STREAM_COUNT; r++) {
        struct kern_stream *s = &d->streams[r];
        if (s->cs) {
            MT_CUDA_CHECK(cudaStreamSynchronize(s->cs));
            kern_cudnn_attn_free(s->cudnn_attn); /* its handle is bound to the stream */
            MT_CUDA_CHECK(cudaStreamDestroy(s->cs));
        }
        kern_cuda_gemm_cache_free(s->gemm_cache);
        kern_cuda_grouped_free(s->grouped);
    }
    if (d->lt) MT_CUBLAS_CHECK(cublasLtDestroy(d->lt));
    if (d->region) MT_CUDA_CHECK(cudaFree(d->region));
    free(d);
}

static mt_status_t cuda_arena_reserve(kern_device_t *dev, size_t capacity, void **base,
                                      mt_error_t *err) {
    kern_cuda_device_t *d = as_cuda(dev);
    kern_cuda_set_device(d->ordinal);
    size_t extra = backend_extra_bytes();
    size_t free_b = 0, total_b = 0;
    MT_CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
    if (capacity > free_b || extra > free_b - capacity)
        return mt_error_set(err, MT_ERR_BUDGET,
                            "CUDA device %d (%s): device budget of %zu bytes plus %zu bytes of "
                            "backend workspace exceeds the %zu bytes free (of %zu)",
                            d->ordinal, d->name, capacity, extra, free_b, total_b);
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, capacity + extra);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return mt_error_set(err, MT_ERR_BUDGET,
                            "CUDA device %d (%s): cudaMalloc of %zu bytes (budget %zu + workspace "
                            "%zu) failed with CUDA error %d (%s)",
                            d->ordinal, d->name, capacity + extra, capacity, extra, (int)e,
                            cudaGetErrorString(e));
    }
    d->region = p;
    d->region_bytes = capacity + extra;
    /* Every piece is a multiple of 1 MiB, so each starts 256-byte aligned
     * like the cudaMalloc itself. */
    char *c = p;
    struct kern_stream *cs = &d->streams[KERN_STREAM_COMPUTE];
    cs->lt_workspace = c;
    cs->lt_workspace_bytes = KERN_CUDA_LT_WORKSPACE_BYTES;
    c += KERN_CUDA_LT_WORKSPACE_BYTES;
    cs->scratch = c;
    cs->scratch_bytes = KERN_CUDA_SCRATCH_COMPUTE_BYTES;
    c += KERN_CUDA_SCRATCH_COMPUTE_BYTES;
    for (int r = KERN_STREAM_H2D; r <= KERN_STREAM_D2H; r++) {
        d->streams[r].scratch = c;
        d->streams[r].scratch_bytes = KERN_CUDA_SCRATCH_COPY_BYTES;
        c += KERN_CUDA_SCRATCH_COPY_BYTES;
    }
    *base = c;
    return MT_OK;
}

static void cuda_arena_release(kern_device_t *dev, void *base) {
    (void)base;
    kern_cuda_device_t *d = as_cuda(dev);
    if (!d->region) return;
    kern_cuda_set_device(d->ordinal);
    for (int r = 0; r < KERN_STREAM_COUNT; r++)
        if (d->streams[r].cs) MT_CUDA_CHECK(cudaStreamSynchronize(d->streams[r].cs));
    MT_CUDA_CHECK(cudaFree(d->region));
    d->region = NULL;
    d->region_bytes = 0;
    for (int r = 0; r < KERN_STREAM_COUNT; r++) {
        d->streams[r].scratch = NULL;
        d->streams[r].scratch_bytes = 0;
        d->streams[r].lt_workspace = NULL;
        d->streams[r].lt_workspace_bytes = 0;
    }
}

/* Portable: the staging slabs are pinned for every device of the process
 * (two-GPU runs share them). NULL when the OS refuses. */
static void *cuda_pinned_alloc(kern_device_t *dev, size_t bytes) {
    kern_cuda_set_device(as_cuda(dev)->ordinal);
    void *p = NULL;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_pinned_free(kern_device_t *dev, void *p, size_t bytes) {
    (void)bytes;
    kern_cuda_set_device(as_cuda(dev)->ordinal);
    MT_CUDA_CHECK(cudaFreeHost(p));
}

static kern_event_t *cuda_event_create(kern_device_t *dev) {
    kern_event_t *ev = calloc(1, sizeof *ev);
    MT_CHECK_ALLOC(ev, "CUDA event");
    ev->ordinal = as_cuda(dev)->ordinal;
    kern_cuda_set_device(ev->ordinal);
    MT_CUDA_CHECK(cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming));
    return ev;
}

static void cuda_event_destroy(kern_event_t *ev) {
    kern_cuda_set_device(ev->ordinal);
    MT_CUDA_CHECK(cudaEventDestroy(ev->ev));
    free(ev);
}

static void cuda_event_record(kern_event_t *ev, kern_stream_t *s) {
    MT_CUDA_CHECK(cudaEventRecord(ev->ev, kern_cuda_stream_begin(s)));
}

static void cuda_stream_wait_event(kern_stream_t *s, kern_event_t *ev) {
    MT_CUDA_CHECK(cudaStreamWaitEvent(kern_cuda_stream_begin(s), ev->ev, 0));
}

static void cuda_event_sync(kern_event_t *ev) {
    kern_cuda_set_device(ev->ordinal);
    MT_CUDA_CHECK(cudaEventSynchronize(ev->ev));
}

static bool cuda_event_query(kern_event_t *ev) {
    kern_cuda_set_device(ev->ordinal);
    cudaError_t e = cudaEventQuery(ev->ev);
    if (e == cudaErrorNotReady) {
        (void)cudaGetLastError(); /* "not ready" is an answer, not an error to keep */
        return false;
    }
    MT_CUDA_CHECK(e);
    return true;
}

static void cuda_stream_sync(kern_stream_t *s) {
    MT_CUDA_CHECK(cudaStreamSynchronize(kern_cuda_stream_begin(s)));
}

/* A pageable host buffer also works: CUDA then stages it and the call
 * returns once the host side has been read (H2D) or written (D2H). */
/* A traced copy (kern_device_t.copy_observer set): host functions on the
 * copy's stream just before and just after it take its start and end times
 * on the host clock, as the CPU backend's copy threads report theirs.  Only
 * while tracing: each host function costs the stream some microseconds. */
typedef struct {
    kern_device_t *dev;
    kern_stream_role_t role;
    size_t bytes;
    double t0;
} traced_copy_t;

static void traced_copy_begin(void *arg) { ((traced_copy_t *)arg)->t0 = mt_now_s(); }

static void traced_copy_end(void *arg) {
    traced_copy_t *c = arg;
    if (c->dev->copy_observer) c->dev->copy_observer(c->dev->copy_observer_ctx, c->role, c->bytes, c->t0, mt_now_s());
    free(c);
}

static void cuda_memcpy(kern_stream_t *s, void *dst, const void *src, size_t bytes,
                        enum cudaMemcpyKind kind) {
    if (!bytes) return;
    cudaStream_t cs = kern_cuda_stream_begin(s);
    kern_device_t *dev = &s->dev->base;
    traced_copy_t *traced = NULL;
    if (dev->copy_observer && kind != cudaMemcpyDeviceToDevice) {
        traced = malloc(sizeof *traced);
        MT_CHECK_ALLOC(traced, "traced copy");
        *traced = (traced_copy_t){dev, s->role, bytes, 0};
        MT_CUDA_CHECK(cudaLaunchHostFunc(cs, traced_copy_begin, traced));
    }
    MT_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, kind, cs));
    if (traced) MT_CUDA_CHECK(cudaLaunchHostFunc(cs, traced_copy_end, traced));
}

static void cuda_memcpy_h2d(kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    cuda_memcpy(s, dst, src, bytes, cudaMemcpyHostToDevice);
}
static void cuda_memcpy_d2h(kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    cuda_memcpy(s, dst, src, bytes, cudaMemcpyDeviceToHost);
}
static void cuda_memcpy_d2d(kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    cuda_memcpy(s, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

static void cuda_memset(kern_stream_t *s, void *dst, int value, size_t bytes) {
    if (!bytes) return;
    MT_CUDA_CHECK(cudaMemsetAsync(dst, value, bytes, kern_cuda_stream_begin(s)));
}

static void cuda_launch_host_fn(kern_stream_t *s, kern_host_fn fn, void *arg) {
    MT_CUDA_CHECK(cudaLaunchHostFunc(kern_cuda_stream_begin(s), fn, arg));
}

static kern_device_caps_t cuda_caps(kern_device_t *d) {
    const kern_cuda_device_t *dev = (const kern_cuda_device_t *)d;
    return (kern_device_caps_t){
        .bf16_compute = dev->cc_major >= 8, /* bf16 tensor cores: Ampere on */
        .kernels_async = true,
        .device_memory_host_addressable = false,
        .copy_engines = dev->copy_engines,
        .host_cores = 0,
    };
}

static mt_status_t cuda_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out,
                                    mt_error_t *err);

static const kern_device_i cuda_vtable = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .arena_reserve = cuda_arena_reserve,
    .arena_release = cuda_arena_release,
    .pinned_alloc = cuda_pinned_alloc,
    .pinned_free = cuda_pinned_free,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .stream_wait_event = cuda_stream_wait_event,
    .event_sync = cuda_event_sync,
    .event_query = cuda_event_query,
    .stream_sync = cuda_stream_sync,
    .memcpy_h2d = cuda_memcpy_h2d,
    .memcpy_d2h = cuda_memcpy_d2h,
    .memcpy_d2d = cuda_memcpy_d2d,
    .memset = cuda_memset,
    .launch_host_fn = cuda_launch_host_fn,
    .caps = cuda_caps,
    .comm_create = cuda_comm_create,
};

static mt_status_t cuda_failed(mt_error_t *err, int ordinal, const char *what, cudaError_t e) {
    (void)cudaGetLastError();
    return mt_error_set(err, MT_ERR_DEVICE, "CUDA device %d: %s failed with CUDA error %d (%s: %s)",
                        ordinal, what, (int)e, cudaGetErrorName(e), cudaGetErrorString(e));
}

mt_status_t kern_cuda_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                    mt_error_t *err) {
    *out = NULL;
    char why[512];
    if (!kern_cuda_probe(why, sizeof why))
        return mt_error_set(err, MT_ERR_DEVICE, "backend cuda is not usable: %s", why);
    int n = 0;
    MT_CUDA_CHECK(cudaGetDeviceCount(&n));
    int ord = opts->device_index;
    if (ord < 0 || ord >= n)
        return mt_error_set(err, MT_ERR_DEVICE,
                            "CUDA device index %d is out of range: this machine has %d device(s)",
                            ord, n);
    struct cudaDeviceProp prop;
    cudaError_t e = cudaGetDeviceProperties(&prop, ord);
    if (e != cudaSuccess) return cuda_failed(err, ord, "cudaGetDeviceProperties", e);
    if (prop.major < KERN_CUDA_MIN_CC_MAJOR)
        return mt_error_set(err, MT_ERR_DEVICE,
                            "CUDA device %d (%s) has compute capability %d.%d; this build needs "
                            "%d.0 or newer",
                            ord, prop.name, prop.major, prop.minor, KERN_CUDA_MIN_CC_MAJOR);
    e = cudaSetDevice(ord);
    if (e != cudaSuccess) return cuda_failed(err, ord, "cudaSetDevice", e);
    size_t free_b = 0, total_b = 0;
    e = cudaMemGetInfo(&free_b, &total_b); /* also creates the context: may fail if busy */
    if (e != cudaSuccess) return cuda_failed(err, ord, "cudaMemGetInfo", e);

    size_t extra = backend_extra_bytes();
    size_t budget = opts->device_budget_bytes;
    if (budget == 0) {
        size_t dflt = (size_t)((double)free_b * KERN_CUDA_DEFAULT_BUDGET_FRACTION);
        if (dflt <= extra)
            return mt_error_set(err, MT_ERR_BUDGET,
                                "CUDA device %d (%s): only %zu bytes free, less than the backend's "
                                "%zu bytes of workspace",
                                ord, prop.name, free_b, extra);
        budget = dflt - extra;
    }
    if (budget > free_b || extra > free_b - budget)
        return mt_error_set(err, MT_ERR_BUDGET,
                            "CUDA device %d (%s): device budget of %zu bytes plus %zu bytes of "
                            "backend workspace exceeds the %zu bytes free (of %zu); lower the "
                            "device memory budget",
                            ord, prop.name, budget, extra, free_b, total_b);

    kern_cuda_device_t *d = calloc(1, sizeof *d);
    MT_CHECK_ALLOC(d, "CUDA device");
    d->ordinal = ord;
    d->cc_major = prop.major;
    d->cc_minor = prop.minor;
    d->sm_count = prop.multiProcessorCount;
    d->copy_engines = prop.asyncEngineCount;
    d->max_smem_optin = prop.sharedMemPerBlockOptin;
    snprintf(d->name, sizeof d->name, "%s", prop.name);
    const char *sync = getenv("MOETUNE_CUDA_SYNC");
    d->sync_check = sync && *sync && strcmp(sync, "0") != 0;
    d->base.vt = &cuda_vtable;
    d->base.ops = &kern_ops_cuda;
    d->base.kind = KERN_BACKEND_CUDA;
    d->base.opts = *opts;
    d->base.opts.device_budget_bytes = budget;
    d->base.opts.stream_ordered_frees = true; /* a freed block may still be read by queued work */
    for (int r = 0; r < KERN_STREAM_COUNT; r++) {
        struct kern_stream *s = &d->streams[r];
        s->dev = d;
        s->role = (kern_stream_role_t)r;
        MT_CUDA_CHECK(cudaStreamCreateWithFlags(&s->cs, cudaStreamNonBlocking));
        d->base.streams[r] = s;
    }
    MT_CUBLAS_CHECK(cublasLtCreate(&d->lt));
    *out = &d->base;
    return MT_OK;
}

static const kern_backend_t k_cuda_backend = {
    .kind = KERN_BACKEND_CUDA,
    .name = "cuda",
    .probe = kern_cuda_probe,
    .create = kern_cuda_device_create,
};

__attribute__((constructor)) static void register_cuda_backend(void) { kern_backend_register(&k_cuda_backend); }

/* ---- NCCL ---------------------------------------------------------------- */

struct kern_cuda_nccl {
    int ndev;
    int *ordinals;
    ncclComm_t *comms;
};

mt_status_t kern_cuda_nccl_create(const int *ordinals, int ndev, kern_cuda_nccl_t **out,
                                  mt_error_t *err) {
    *out = NULL;
    char why[512];
    if (!kern_cuda_probe(why, sizeof why))
        return mt_error_set(err, MT_ERR_DEVICE, "NCCL needs CUDA devices: %s", why);
    int n = 0;
    MT_CUDA_CHECK(cudaGetDeviceCount(&n));
    if (ndev < 1) return mt_error_set(err, MT_ERR_DEVICE, "NCCL: %d devices requested", ndev);
    for (int i = 0; i < ndev; i++)
        if (ordinals[i] < 0 || ordinals[i] >= n)
            return mt_error_set(err, MT_ERR_DEVICE,
                                "NCCL: device %d requested but this machine has %d device(s)",
                                ordinals[i], n);
    kern_cuda_nccl_t *nc = calloc(1, sizeof *nc);
    MT_CHECK_ALLOC(nc, "NCCL communicator set");
    nc->ndev = ndev;
    nc->ordinals = malloc((size_t)ndev * sizeof *nc->ordinals);
    nc->comms = calloc((size_t)ndev, sizeof *nc->comms);
    MT_CHECK_ALLOC(nc->ordinals, "NCCL ordinals");
    MT_CHECK_ALLOC(nc->comms, "NCCL communicators");
    memcpy(nc->ordinals, ordinals, (size_t)ndev * sizeof *ordinals);
    ncclResult_t r = ncclCommInitAll(nc->comms, ndev, nc->ordinals);
    if (r != ncclSuccess) {
        free(nc->comms);
        free(nc->ordinals);
        free(nc);
        return mt_error_set(err, MT_ERR_DEVICE, "NCCL: ncclCommInitAll over %d device(s) failed: %s",
                            ndev, ncclGetErrorString(r));
    }
    *out = nc;
    return MT_OK;
}

void kern_cuda_nccl_destroy(kern_cuda_nccl_t *nc) {
    if (!nc) return;
    for (int i = 0; i < nc->ndev; i++) MT_NCCL_CHECK(ncclCommDestroy(nc->comms[i]));
    free(nc->comms);
    free(nc->ordinals);
    free(nc);
}

int kern_cuda_nccl_size(const kern_cuda_nccl_t *nc) { return nc->ndev; }

void kern_cuda_nccl_allreduce_sum(kern_cuda_nccl_t *nc, kern_stream_t *const *streams,
                                  float *const *bufs, size_t n) {
    /* One thread drives every device: the calls must form one NCCL group. */
    MT_NCCL_CHECK(ncclGroupStart());
    for (int i = 0; i < nc->ndev; i++) {
        MT_CHECK(streams[i]->dev->ordinal == nc->ordinals[i],
                 "NCCL all-reduce: stream %d belongs to device %d, communicator rank %d to %d", i,
                 streams[i]->dev->ordinal, i, nc->ordinals[i]);
        kern_cuda_set_device(nc->ordinals[i]);
        MT_NCCL_CHECK(ncclAllReduce(bufs[i], bufs[i], n, ncclFloat32, ncclSum, nc->comms[i],
                                    streams[i]->cs));
    }
    MT_NCCL_CHECK(ncclGroupEnd());
}

/* ---- kern_comm over NCCL (device.h) --------------------------------------- */

typedef struct {
    kern_comm_t base; /* first: device.c sees a kern_comm_t */
    kern_cuda_nccl_t *nc;
    kern_stream_t **streams; /* per rank: its device's compute stream */
} cuda_comm_t;

static void cuda_comm_destroy(kern_comm_t *c) {
    cuda_comm_t *cc = (cuda_comm_t *)c;
    if (__atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST)) { /* ncclCommAbort freed the communicators */
        free(cc->nc->comms);
        free(cc->nc->ordinals);
        free(cc->nc);
    } else {
        kern_cuda_nccl_destroy(cc->nc);
    }
    free(cc->streams);
    free(cc);
}

/* Each rank from its own thread: one ncclAllReduce on its communicator and
 * compute stream (no group: NCCL matches the ranks' calls by order). */
static void cuda_comm_allreduce(kern_comm_t *c, int rank, void *buf, size_t count, mt_dtype_t dt) {
    cuda_comm_t *cc = (cuda_comm_t *)c;
    MT_CHECK(dt == MT_F32, "kern_comm_allreduce_sum on CUDA: dtype %s (F32 only)", mt_dtype_name(dt));
    kern_stream_t *s = cc->streams[rank];
    const cudaStream_t cs = kern_cuda_stream_begin(s);
    MT_NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, cc->nc->comms[rank], cs));
}

/* Each rank from its own thread: one NCCL group of a send and a receive per
 * peer (itself included, which NCCL serves as a local copy), on its
 * communicator and compute stream.  Bytes as ncclUint8: a copy, any dtype.
 * Errors are returned, not fatal: a peer that failed may have aborted the
 * communicator (kern_comm_abort), and this rank must report that and stop. */
static mt_status_t cuda_comm_alltoallv(kern_comm_t *c, int rank, const void *send, const size_t *send_bytes,
                                       const size_t *send_offs, void *recv, const size_t *recv_bytes,
                                       const size_t *recv_offs, mt_error_t *err) {
    cuda_comm_t *cc = (cuda_comm_t *)c;
    const cudaStream_t cs = kern_cuda_stream_begin(cc->streams[rank]);
    ncclComm_t comm = cc->nc->comms[rank];
    ncclResult_t r = ncclGroupStart();
    for (int q = 0; q < c->size && r == ncclSuccess; q++) {
        if (send_bytes[q])
            r = ncclSend((const char *)send + send_offs[q], send_bytes[q], ncclUint8, q, comm, cs);
        if (r == ncclSuccess && recv_bytes[q])
            r = ncclRecv((char *)recv + recv_offs[q], recv_bytes[q], ncclUint8, q, comm, cs);
    }
    const ncclResult_t r_end = ncclGroupEnd(); /* always closes the group opened above */
    if (r == ncclSuccess) r = r_end;
    if (r != ncclSuccess)
        return mt_error_set(err, MT_ERR_DEVICE, "kern_comm_alltoallv (rank %d, CUDA device %d): NCCL: %s%s", rank,
                            kern_cuda_current_device(), ncclGetErrorString(r),
                            __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST) ? " (the communicator was aborted)" : "");
    return MT_OK;
}

/* ncclCommAbort makes pending and later operations on every rank's
 * communicator fail instead of waiting for a peer that will not come. */
static void cuda_comm_abort(kern_comm_t *c) {
    cuda_comm_t *cc = (cuda_comm_t *)c;
    for (int i = 0; i < cc->nc->ndev; i++) (void)ncclCommAbort(cc->nc->comms[i]);
}

static const kern_comm_i k_cuda_comm_vtable = {
    .destroy = cuda_comm_destroy,
    .allreduce_sum = cuda_comm_allreduce,
    .alltoallv = cuda_comm_alltoallv,
    .abort = cuda_comm_abort,
};

static mt_status_t cuda_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out,
                                    mt_error_t *err) {
    if (n > 2)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "kern_comm_create: %d CUDA devices; NCCL sums three or more in ring "
                            "order, not rank order, so at most 2 are supported",
                            n);
    int ordinals[2];
    for (int r = 0; r < n; r++) ordinals[r] = ((kern_cuda_device_t *)devs[r])->ordinal;
    cuda_comm_t *cc = calloc(1, sizeof *cc);
    MT_CHECK_ALLOC(cc, "CUDA communicator");
    cc->streams = calloc((size_t)n, sizeof *cc->streams);
    MT_CHECK_ALLOC(cc->streams, "CUDA communicator streams");
    for (int r = 0; r < n; r++) cc->streams[r] = devs[r]->streams[KERN_STREAM_COMPUTE];
    mt_status_t st = kern_cuda_nccl_create(ordinals, n, &cc->nc, err);
    if (st != MT_OK) {
        free(cc->streams);
        free(cc);
        return st;
    }
    cc->base.vt = &k_cuda_comm_vtable;
    cc->base.size = n;
    cc->base.aborted = 0;
    *out = &cc->base;
    return MT_OK;
}
