/* Backend-independent half of the device layer: creation, the arena's
 * bookkeeping and budget errors, stream-ordered frees (arena_defer.h, its
 * markers are the backend's events), statistics, and thin wrappers over
 * the vtable (see device.h).  It names no backend: a device is created by
 * the backend registered for its kind (backend_registry.h), so what a
 * program can open is what it links. */
#include "kernels/device.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend_registry.h"

/* ---- hooks of the pending-free queue: one marker per stream ---- */

static void *defer_event_create(void *ctx) {
    kern_device_t *dev = ctx;
    return dev->vt->event_create(dev);
}
static void defer_event_destroy(void *ctx, void *ev) { ((kern_device_t *)ctx)->vt->event_destroy(ev); }
static void defer_event_record(void *ctx, void *ev, int stream) {
    kern_device_t *dev = ctx;
    dev->vt->event_record(ev, dev->streams[stream]);
}
static bool defer_event_query(void *ctx, void *ev) { return ((kern_device_t *)ctx)->vt->event_query(ev); }
static void defer_event_sync(void *ctx, void *ev) { ((kern_device_t *)ctx)->vt->event_sync(ev); }

static bool defer_on(const kern_device_t *dev) { return dev->opts.stream_ordered_frees; }

mt_status_t kern_device_create(kern_backend_kind_t kind, const kern_device_opts_t *opts,
                               kern_device_t **out, mt_error_t *err) {
    *out = NULL;
    kern_device_opts_t o = opts ? *opts : (kern_device_opts_t){0};
    const kern_backend_t *backend = kern_backend_find(kind);
    if (!backend) {
        char linked[64];
        kern_backend_names(linked, sizeof linked);
        if ((unsigned)kind >= KERN_BACKEND_COUNT)
            return mt_error_set(err, MT_ERR_DEVICE, "no such device kind %d (backends linked: %s)", (int)kind,
                                linked);
        return mt_error_set(err, MT_ERR_DEVICE,
                            "no %s backend is linked into this program (backends linked: %s); link "
                            "//kernels/backends:%s",
                            kern_backend_kind_name(kind), linked, kern_backend_kind_name(kind));
    }
    kern_device_t *dev = NULL;
    mt_status_t st = backend->create(&o, &dev, err);
    if (st != MT_OK) return st;
    size_t capacity = dev->opts.device_budget_bytes;
    st = dev->vt->arena_reserve(dev, capacity, &dev->arena_base, err);
    if (st != MT_OK) {
        dev->vt->destroy(dev);
        return st;
    }
    mt_arena_init(&dev->arena, capacity);
    dev->stats.device_capacity = dev->arena.capacity;
    if (defer_on(dev)) {
        for (int r = 0; r < KERN_STREAM_COUNT; r++)
            MT_CHECK(dev->streams[r] != NULL, "backend %s: stream %d missing", dev->vt->name, r);
        const kern_arena_defer_hooks_t h = {
            .ctx = dev,
            .nstreams = KERN_STREAM_COUNT,
            .event_create = defer_event_create,
            .event_destroy = defer_event_destroy,
            .event_record = defer_event_record,
            .event_query = defer_event_query,
            .event_sync = defer_event_sync,
        };
        kern_arena_defer_init(&dev->defer, &dev->arena, &h);
    }
    *out = dev;
    return MT_OK;
}

void kern_device_destroy(kern_device_t *dev) {
    if (!dev) return;
    kern_device_sync(dev);
    if (defer_on(dev)) kern_arena_defer_destroy(&dev->defer); /* its markers are the backend's events */
    dev->vt->arena_release(dev, dev->arena_base);
    mt_arena_free_all(&dev->arena);
    dev->vt->destroy(dev);
}

bool kern_cuda_available(char *why, size_t why_len) {
    const kern_backend_t *cuda = kern_backend_find(KERN_BACKEND_CUDA);
    if (!cuda) {
        if (why && why_len) snprintf(why, why_len, "no CUDA backend is linked into this program");
        return false;
    }
    if (cuda->probe) return cuda->probe(why, why_len);
    if (why && why_len) why[0] = '\0';
    return true;
}

static char *arena_ptr(kern_device_t *dev, size_t offset) { return (char *)dev->arena_base + offset; }

/* With stream-ordered frees: reuses completed frees, waits for pending ones before failing. */
static bool arena_alloc(kern_device_t *dev, size_t bytes, mt_arena_life_t life, size_t *off) {
    return defer_on(dev) ? kern_arena_defer_alloc_life(&dev->defer, bytes, life, off)
                         : mt_arena_alloc_life(&dev->arena, bytes, life, off);
}

static void *alloc_life(kern_device_t *dev, size_t bytes, mt_arena_life_t life, const char *tag, mt_error_t *err) {
    size_t off;
    bool ok = arena_alloc(dev, bytes, life, &off);
    /* what the hook frees may be stream-ordered too: arena_alloc waits for it */
    while (!ok && dev->reclaim && dev->reclaim(dev->reclaim_ctx)) ok = arena_alloc(dev, bytes, life, &off);
    if (!ok) {
        mt_error_set(err, MT_ERR_BUDGET,
                     "device memory budget exceeded allocating %s (%zu bytes): %zu of %zu bytes in "
                     "use, largest free block %zu bytes",
                     tag ? tag : "a tensor", bytes, dev->arena.in_use, dev->arena.capacity,
                     mt_arena_largest_free(&dev->arena));
        return NULL;
    }
    dev->stats.device_in_use = dev->arena.in_use;
    if (dev->arena.in_use > dev->stats.device_peak) dev->stats.device_peak = dev->arena.in_use;
    return arena_ptr(dev, off);
}

void *kern_alloc(kern_device_t *dev, size_t bytes, const char *tag, mt_error_t *err) {
    return alloc_life(dev, bytes, MT_ARENA_TRANSIENT, tag, err);
}

void *kern_alloc_lasting(kern_device_t *dev, size_t bytes, const char *tag, mt_error_t *err) {
    return alloc_life(dev, bytes, MT_ARENA_LASTING, tag, err);
}

void kern_set_reclaim_hook(kern_device_t *dev, bool (*fn)(void *ctx), void *ctx) {
    dev->reclaim = fn;
    dev->reclaim_ctx = ctx;
}

void kern_free(kern_device_t *dev, void *p) {
    if (!p) return;
    const size_t off = (size_t)((char *)p - (char *)dev->arena_base);
    if (defer_on(dev)) kern_arena_defer_free(&dev->defer, off);
    else mt_arena_release(&dev->arena, off);
    dev->stats.device_in_use = dev->arena.in_use;
}

size_t kern_alloc_size(const kern_device_t *dev, const void *p) {
    return mt_arena_block_size(&dev->arena, (size_t)((const char *)p - (const char *)dev->arena_base));
}

void *kern_pinned_alloc(kern_device_t *dev, size_t bytes) {
    void *p = dev->vt->pinned_alloc(dev, bytes);
    if (p) {
        dev->stats.pinned_in_use += bytes;
        if (dev->stats.pinned_in_use > dev->stats.pinned_peak)
            dev->stats.pinned_peak = dev->stats.pinned_in_use;
    }
    return p;
}

void kern_pinned_free(kern_device_t *dev, void *p, size_t bytes) {
    if (!p) return;
    dev->vt->pinned_free(dev, p, bytes);
    dev->stats.pinned_in_use -= bytes;
}

kern_stream_t *kern_stream(kern_device_t *dev, kern_stream_role_t role) { return dev->streams[role]; }
kern_event_t *kern_event_create(kern_device_t *dev) { return dev->vt->event_create(dev); }
void kern_event_destroy(kern_device_t *dev, kern_event_t *ev) {
    if (ev) dev->vt->event_destroy(ev);
}
void kern_event_record(kern_device_t *dev, kern_event_t *ev, kern_stream_t *s) {
    dev->vt->event_record(ev, s);
}
void kern_stream_wait_event(kern_device_t *dev, kern_stream_t *s, kern_event_t *ev) {
    dev->vt->stream_wait_event(s, ev);
}
void kern_event_sync(kern_device_t *dev, kern_event_t *ev) { dev->vt->event_sync(ev); }
bool kern_event_query(kern_device_t *dev, kern_event_t *ev) { return dev->vt->event_query(ev); }
void kern_stream_sync(kern_device_t *dev, kern_stream_t *s) { dev->vt->stream_sync(s); }

void kern_device_sync(kern_device_t *dev) {
    for (int r = 0; r < KERN_STREAM_COUNT; r++)
        if (dev->streams[r]) dev->vt->stream_sync(dev->streams[r]);
    if (defer_on(dev)) { /* every stream is idle: nothing pending can still be touched */
        kern_arena_defer_release_all(&dev->defer);
        dev->stats.device_in_use = dev->arena.in_use;
    }
}

void kern_memcpy_h2d(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    dev->stats.h2d_copies++;
    dev->stats.h2d_bytes += bytes;
    dev->vt->memcpy_h2d(s, dst, src, bytes);
}

void kern_memcpy_d2h(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    dev->stats.d2h_copies++;
    dev->stats.d2h_bytes += bytes;
    dev->vt->memcpy_d2h(s, dst, src, bytes);
}

void kern_memcpy_d2d(kern_device_t *dev, kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    dev->vt->memcpy_d2d(s, dst, src, bytes);
}

void kern_memset(kern_device_t *dev, kern_stream_t *s, void *dst, int value, size_t bytes) {
    dev->vt->memset(s, dst, value, bytes);
}

void kern_launch_host_fn(kern_device_t *dev, kern_stream_t *s, kern_host_fn fn, void *arg) {
    dev->vt->launch_host_fn(s, fn, arg);
}

void kern_device_pin_host_thread(kern_device_t *dev) {
    if (dev && dev->vt->pin_host_thread) dev->vt->pin_host_thread(dev);
}

kern_device_caps_t kern_device_caps(kern_device_t *dev) { return dev->vt->caps(dev); }

mt_status_t kern_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out, mt_error_t *err) {
    *out = NULL;
    if (n < 1 || !devs)
        return mt_error_set(err, MT_ERR_CONFIG, "kern_comm_create: %d devices (want at least 1)", n);
    for (int r = 0; r < n; r++) {
        if (!devs[r])
            return mt_error_set(err, MT_ERR_CONFIG, "kern_comm_create: device of rank %d is NULL", r);
        if (devs[r]->vt != devs[0]->vt)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "kern_comm_create: rank %d is a %s device, rank 0 a %s one (one "
                                "backend per communicator)",
                                r, devs[r]->vt->name, devs[0]->vt->name);
        for (int q = 0; q < r; q++)
            if (devs[q] == devs[r])
                return mt_error_set(err, MT_ERR_CONFIG,
                                    "kern_comm_create: ranks %d and %d are the same device", q, r);
    }
    if (!devs[0]->vt->comm_create)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "kern_comm_create: the %s backend has no collectives",
                            devs[0]->vt->name);
    return devs[0]->vt->comm_create(devs, n, out, err);
}

void kern_comm_destroy(kern_comm_t *c) {
    if (c) c->vt->destroy(c);
}

int kern_comm_size(const kern_comm_t *c) { return c->size; }

void kern_comm_allreduce_sum(kern_comm_t *c, int rank, void *buf, size_t count, mt_dtype_t dt) {
    MT_CHECK(rank >= 0 && rank < c->size, "kern_comm_allreduce_sum: rank %d of a communicator of %d",
             rank, c->size);
    MT_CHECK(dt == MT_F32 || dt == MT_BF16, "kern_comm_allreduce_sum: dtype %s (want F32 or BF16)",
             mt_dtype_name(dt));
    if (kern_comm_aborted(c)) return;
    c->vt->allreduce_sum(c, rank, buf, count, dt);
}

mt_status_t kern_comm_alltoallv(kern_comm_t *c, int rank, const void *send, const size_t *send_counts,
                                const size_t *send_offs, void *recv, const size_t *recv_counts,
                                const size_t *recv_offs, mt_dtype_t dt, mt_error_t *err) {
    MT_CHECK(rank >= 0 && rank < c->size, "kern_comm_alltoallv: rank %d of a communicator of %d", rank,
             c->size);
    if (!c->vt->alltoallv)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "kern_comm_alltoallv: this backend's communicator has no all-to-all");
    if (kern_comm_aborted(c))
        return mt_error_set(err, MT_ERR_DEVICE, "kern_comm_alltoallv (rank %d): the communicator was aborted", rank);
    const size_t esz = mt_dtype_size(dt);
    const int n = c->size;
    /* bytes for the backends: one conversion here, so they all see the same */
    size_t stack[4 * 8];
    size_t *b = n <= 8 ? stack : malloc(4 * (size_t)n * sizeof *b);
    MT_CHECK_ALLOC(b, "kern_comm_alltoallv byte counts");
    for (int q = 0; q < n; q++) {
        b[q] = send_counts[q] * esz;
        b[n + q] = send_offs[q] * esz;
        b[2 * n + q] = recv_counts[q] * esz;
        b[3 * n + q] = recv_offs[q] * esz;
    }
    const mt_status_t st = c->vt->alltoallv(c, rank, send, b, b + n, recv, b + 2 * n, b + 3 * n, err);
    if (b != stack) free(b);
    return st;
}

void kern_comm_abort(kern_comm_t *c) {
    if (!c || __atomic_exchange_n(&c->aborted, 1, __ATOMIC_SEQ_CST)) return;
    if (c->vt->abort) c->vt->abort(c);
}

bool kern_comm_aborted(const kern_comm_t *c) { return __atomic_load_n(&c->aborted, __ATOMIC_SEQ_CST) != 0; }

kern_threadpool_t *kern_device_host_pool(kern_device_t *dev) {
    return dev->vt->host_pool ? dev->vt->host_pool(dev) : NULL;
}

kern_device_stats_t kern_device_stats(const kern_device_t *dev) {
    kern_device_stats_t st = dev->stats;
    if (defer_on(dev)) {
        st.device_pending = dev->defer.pending_bytes;
        st.device_pending_peak = dev->defer.pending_peak;
        st.deferred_frees = dev->defer.frees;
        st.free_waits = dev->defer.waits;
    }
    return st;
}

void kern_device_reset_peaks(kern_device_t *dev) {
    dev->stats.device_peak = dev->arena.in_use;
    dev->arena.peak = dev->arena.in_use;
    dev->defer.pending_peak = dev->defer.pending_bytes;
    dev->stats.pinned_peak = dev->stats.pinned_in_use;
}

