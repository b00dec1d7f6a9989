/* The CPU backend (see device.h for the model).
 *
 * - Device memory: one anonymous mapping of the budget (MAP_NORESERVE, so an
 *   unused budget costs nothing), sub-allocated by device.c's arena.
 * - Compute stream: runs on the issuing thread; a wait on an event blocks
 *   the caller until the event fires.
 * - Copy streams (H2D, D2H): one worker thread each, executing a FIFO of
 *   commands (copy, memset, host function, event signal, event wait).  A
 *   copy can be throttled to `link_*_bytes_per_s` and `link_latency_s`: it
 *   does the memcpy, then sleeps until latency + bytes / bandwidth has
 *   passed since it started, so transfer time behaves like a real link and
 *   overlap with compute can be measured.
 * - Events: each record is a reference-counted node; a wait targets the
 *   node current when it was issued, as cudaStreamWaitEvent does, and an
 *   event may be destroyed while a record is pending.
 * - Registration: the backend registers itself with the device layer when
 *   it is linked (backend_registry.h; its library is alwayslink), so a
 *   program opens CPU devices by linking //kernels/backends:cpu. */
#include "kernels/cpu/backend_cpu.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "kernels/backend_registry.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/ops.h"
#include "base/clock.h"

void openblas_set_num_threads(int num_threads); /* OpenBLAS, linked by //kernels/cpu:kernels */

typedef enum { CMD_COPY, CMD_MEMSET, CMD_HOST_FN, CMD_SIGNAL, CMD_WAIT } cmd_kind_t;

/* One record of an event: waits issued after a record target that record's
 * node, so a later re-record (on any stream) cannot release them early, as
 * with cudaStreamWaitEvent.  Nodes are reference counted: the event holds
 * its latest, each queued signal or wait holds the one it names, so an
 * event may be destroyed while its record is still pending (CUDA allows it). */
typedef struct record_node {
    int fired;
    int refs;
} record_node_t;

struct kern_event {
    struct cpu_device *dev;
    record_node_t *latest; /* NULL until first recorded */
};

typedef struct cmd {
    cmd_kind_t kind;
    bool throttled; /* a host<->device copy (D2D and memset never cross the link) */
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    kern_host_fn fn;
    void *arg;
    record_node_t *node;
    struct cmd *next;
} cmd_t;

struct kern_stream {
    struct cpu_device *dev;
    kern_stream_role_t role;
    bool threaded;
    double bytes_per_s, latency_s;
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    cmd_t *head, *tail;
    uint64_t submitted, finished; /* commands */
    bool stopping;
};

typedef struct cpu_device {
    kern_device_t base; /* first: the generic layer casts */
    pthread_mutex_t ev_lock; /* guards every record node; ev_cond signals any firing */
    pthread_cond_t ev_cond;
    struct kern_stream stream_storage[KERN_STREAM_COUNT];
    kern_threadpool_t *pool;
    size_t arena_bytes;
    /* pin_threads: compute cores and the rest (see pin_compute) */
    bool pinned;
    cpu_set_t compute_cpus, host_cpus;
    pthread_t creator;
} cpu_device_t;

static void sleep_until(double deadline) {
    for (;;) {
        double left = deadline - mt_now_s();
        if (left <= 0) return;
        struct timespec ts = {.tv_sec = (time_t)left, .tv_nsec = (long)((left - (double)(time_t)left) * 1e9)};
        nanosleep(&ts, NULL);
    }
}

static void node_unref_locked(record_node_t *n) {
    if (n && --n->refs == 0) free(n);
}

static void node_fire(struct cpu_device *dev, record_node_t *n) {
    pthread_mutex_lock(&dev->ev_lock);
    n->fired = 1;
    node_unref_locked(n);
    pthread_cond_broadcast(&dev->ev_cond);
    pthread_mutex_unlock(&dev->ev_lock);
}

/* Waits for n to fire, then drops the reference the caller held. */
static void node_wait(struct cpu_device *dev, record_node_t *n) {
    if (!n) return;
    pthread_mutex_lock(&dev->ev_lock);
    while (!n->fired) pthread_cond_wait(&dev->ev_cond, &dev->ev_lock);
    node_unref_locked(n);
    pthread_mutex_unlock(&dev->ev_lock);
}

/* The event's latest record with one more reference, or NULL. */
static record_node_t *event_latest_ref(kern_event_t *ev) {
    pthread_mutex_lock(&ev->dev->ev_lock);
    record_node_t *n = ev->latest;
    if (n) n->refs++;
    pthread_mutex_unlock(&ev->dev->ev_lock);
    return n;
}

static void run_cmd(kern_stream_t *s, const cmd_t *c) {
    switch (c->kind) {
    case CMD_COPY: {
        double start = mt_now_s();
        memcpy(c->dst, c->src, c->bytes);
        if (c->throttled && (s->bytes_per_s > 0 || s->latency_s > 0))
            sleep_until(start + s->latency_s + (s->bytes_per_s > 0 ? (double)c->bytes / s->bytes_per_s : 0));
        const kern_device_t *d = &s->dev->base;
        if (c->throttled && d->copy_observer) d->copy_observer(d->copy_observer_ctx, s->role, c->bytes, start, mt_now_s());
        break;
    }
    case CMD_MEMSET: memset(c->dst, c->value, c->bytes); break;
    case CMD_HOST_FN: c->fn(c->arg); break;
    case CMD_SIGNAL: node_fire(s->dev, c->node); break;
    case CMD_WAIT: node_wait(s->dev, c->node); break;
    }
}

static void cpu_pin_host_thread(kern_device_t *d);
static void unpin_compute(cpu_device_t *dev);

static void *stream_main(void *arg) {
    kern_stream_t *s = arg;
    cpu_pin_host_thread(&s->dev->base); /* a copy engine, not the compute cores */
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->head && !s->stopping) pthread_cond_wait(&s->cond, &s->lock);
        if (!s->head) break; /* stopping and drained */
        cmd_t *c = s->head;
        s->head = c->next;
        if (!s->head) s->tail = NULL;
        pthread_mutex_unlock(&s->lock);
        run_cmd(s, c);
        free(c);
        pthread_mutex_lock(&s->lock);
        s->finished++;
        pthread_cond_broadcast(&s->cond);
    }
    pthread_mutex_unlock(&s->lock);
    return NULL;
}

/* Inline streams run the command now; threaded ones queue it. */
static void submit(kern_stream_t *s, cmd_t c) {
    if (!s->threaded) {
        run_cmd(s, &c);
        return;
    }
    cmd_t *n = malloc(sizeof *n);
    MT_CHECK_ALLOC(n, "stream command");
    *n = c;
    n->next = NULL;
    pthread_mutex_lock(&s->lock);
    if (s->tail) s->tail->next = n; else s->head = n;
    s->tail = n;
    s->submitted++;
    pthread_cond_broadcast(&s->cond);
    pthread_mutex_unlock(&s->lock);
}

static void cpu_stream_sync(kern_stream_t *s) {
    if (!s->threaded) return;
    pthread_mutex_lock(&s->lock);
    while (s->finished < s->submitted) pthread_cond_wait(&s->cond, &s->lock);
    pthread_mutex_unlock(&s->lock);
}

static void cpu_destroy(kern_device_t *d) {
    cpu_device_t *dev = (cpu_device_t *)d;
    for (int r = 0; r < KERN_STREAM_COUNT; r++) {
        kern_stream_t *s = &dev->stream_storage[r];
        if (!s->threaded) continue;
        pthread_mutex_lock(&s->lock);
        s->stopping = true;
        pthread_cond_broadcast(&s->cond);
        pthread_mutex_unlock(&s->lock);
        pthread_join(s->thread, NULL);
        pthread_cond_destroy(&s->cond);
        pthread_mutex_destroy(&s->lock);
    }
    kern_threadpool_destroy(dev->pool);
    unpin_compute(dev);
    pthread_cond_destroy(&dev->ev_cond);
    pthread_mutex_destroy(&dev->ev_lock);
    free(dev);
}

static mt_status_t cpu_arena_reserve(kern_device_t *d, size_t capacity, void **base, mt_error_t *err) {
    cpu_device_t *dev = (cpu_device_t *)d;
    void *p = mmap(NULL, capacity ? capacity : 4096, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return mt_error_set(err, MT_ERR_NOMEM, "CPU backend: cannot reserve a %zu-byte device arena: %s",
                            capacity, strerror(errno));
    dev->arena_bytes = capacity ? capacity : 4096;
    *base = p;
    return MT_OK;
}

static void cpu_arena_release(kern_device_t *d, void *base) {
    cpu_device_t *dev = (cpu_device_t *)d;
    if (base) munmap(base, dev->arena_bytes);
}

static void *cpu_pinned_alloc(kern_device_t *d, size_t bytes) {
    (void)d;
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    (void)mlock(p, bytes); /* best effort: RLIMIT_MEMLOCK may forbid it */
    return p;
}

static void cpu_pinned_free(kern_device_t *d, void *p, size_t bytes) {
    (void)d;
    munlock(p, bytes);
    munmap(p, bytes ? bytes : 1);
}

static kern_event_t *cpu_event_create(kern_device_t *d) {
    kern_event_t *ev = calloc(1, sizeof *ev);
    MT_CHECK_ALLOC(ev, "event");
    ev->dev = (cpu_device_t *)d;
    return ev;
}

static void cpu_event_destroy(kern_event_t *ev) {
    pthread_mutex_lock(&ev->dev->ev_lock);
    node_unref_locked(ev->latest);
    pthread_mutex_unlock(&ev->dev->ev_lock);
    free(ev);
}

static void cpu_event_record(kern_event_t *ev, kern_stream_t *s) {
    record_node_t *n = calloc(1, sizeof *n);
    MT_CHECK_ALLOC(n, "event record");
    n->refs = 2; /* the event's and the signal command's */
    pthread_mutex_lock(&ev->dev->ev_lock);
    node_unref_locked(ev->latest);
    ev->latest = n;
    pthread_mutex_unlock(&ev->dev->ev_lock);
    submit(s, (cmd_t){.kind = CMD_SIGNAL, .node = n});
}

static void cpu_stream_wait_event(kern_stream_t *s, kern_event_t *ev) {
    record_node_t *n = event_latest_ref(ev);
    if (n) submit(s, (cmd_t){.kind = CMD_WAIT, .node = n});
}

static void cpu_event_sync(kern_event_t *ev) { node_wait(ev->dev, event_latest_ref(ev)); }

static bool cpu_event_query(kern_event_t *ev) {
    pthread_mutex_lock(&ev->dev->ev_lock);
    bool done = !ev->latest || ev->latest->fired;
    pthread_mutex_unlock(&ev->dev->ev_lock);
    return done;
}

static void cpu_copy_link(kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    submit(s, (cmd_t){.kind = CMD_COPY, .throttled = true, .dst = dst, .src = src, .bytes = bytes});
}

static void cpu_copy_local(kern_stream_t *s, void *dst, const void *src, size_t bytes) {
    submit(s, (cmd_t){.kind = CMD_COPY, .throttled = false, .dst = dst, .src = src, .bytes = bytes});
}

static void cpu_memset(kern_stream_t *s, void *dst, int value, size_t bytes) {
    submit(s, (cmd_t){.kind = CMD_MEMSET, .dst = dst, .value = value, .bytes = bytes});
}

static void cpu_launch_host_fn(kern_stream_t *s, kern_host_fn fn, void *arg) {
    submit(s, (cmd_t){.kind = CMD_HOST_FN, .fn = fn, .arg = arg});
}

static kern_device_caps_t cpu_caps(kern_device_t *d);
static kern_threadpool_t *cpu_host_pool(kern_device_t *d);

static const kern_device_i k_cpu_vtable = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .pin_host_thread = cpu_pin_host_thread,
    .arena_reserve = cpu_arena_reserve,
    .arena_release = cpu_arena_release,
    .pinned_alloc = cpu_pinned_alloc,
    .pinned_free = cpu_pinned_free,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .event_query = cpu_event_query,
    .stream_sync = cpu_stream_sync,
    .memcpy_h2d = cpu_copy_link,
    .memcpy_d2h = cpu_copy_link,
    .memcpy_d2d = cpu_copy_local,
    .memset = cpu_memset,
    .launch_host_fn = cpu_launch_host_fn,
    .caps = cpu_caps,
    .host_pool = cpu_host_pool,
    .comm_create = kern_cpu_comm_create,
};

/* Splits the cores this process may use: the first host_threads compute
 * (the creating thread is pinned there, and so the pool it starts), the
 * rest are the host's.  Without enough cores nothing is pinned.  Several
 * pinned devices may live at once (bench step runs plans side by side):
 * the split is made from the creator's cores before the first of them, and
 * the last one destroyed gives them back. */
static pthread_mutex_t g_pin_lock = PTHREAD_MUTEX_INITIALIZER;
static cpu_set_t g_pin_original; /* the creator's cores before the first live pinned device */
static int g_pin_live;

static void pin_compute(cpu_device_t *dev) {
    const int want = dev->base.opts.host_threads;
    if (!dev->base.opts.pin_threads || want <= 0) return;
    pthread_mutex_lock(&g_pin_lock);
    cpu_set_t all;
    if (g_pin_live > 0) {
        all = g_pin_original;
    } else if (pthread_getaffinity_np(pthread_self(), sizeof all, &all) != 0) {
        pthread_mutex_unlock(&g_pin_lock);
        return;
    }
    if (CPU_COUNT(&all) > want) {
        CPU_ZERO(&dev->compute_cpus);
        CPU_ZERO(&dev->host_cpus);
        int taken = 0;
        for (int c = 0; c < CPU_SETSIZE; c++) {
            if (!CPU_ISSET(c, &all)) continue;
            if (taken++ < want) CPU_SET(c, &dev->compute_cpus);
            else CPU_SET(c, &dev->host_cpus);
        }
        dev->creator = pthread_self();
        dev->pinned = pthread_setaffinity_np(dev->creator, sizeof dev->compute_cpus, &dev->compute_cpus) == 0;
        if (dev->pinned && g_pin_live++ == 0) g_pin_original = all;
    }
    pthread_mutex_unlock(&g_pin_lock);
}

/* The last pinned device gives its creator the cores it had. */
static void unpin_compute(cpu_device_t *dev) {
    if (!dev->pinned) return;
    pthread_mutex_lock(&g_pin_lock);
    if (--g_pin_live == 0 && pthread_equal(dev->creator, pthread_self()))
        pthread_setaffinity_np(dev->creator, sizeof g_pin_original, &g_pin_original);
    pthread_mutex_unlock(&g_pin_lock);
}

static void cpu_pin_host_thread(kern_device_t *d) {
    cpu_device_t *dev = (cpu_device_t *)d;
    if (dev->pinned) pthread_setaffinity_np(pthread_self(), sizeof dev->host_cpus, &dev->host_cpus);
}

int kern_cpu_host_cores(kern_device_t *d) {
    if (!d || d->kind != KERN_BACKEND_CPU) return 0;
    const cpu_device_t *dev = (const cpu_device_t *)d;
    return dev->pinned ? CPU_COUNT(&dev->host_cpus) : 0;
}

kern_threadpool_t *kern_cpu_stream_threadpool(kern_stream_t *s) { return s ? s->dev->pool : NULL; }

static kern_device_caps_t cpu_caps(kern_device_t *d) {
    return (kern_device_caps_t){
        .bf16_compute = kern_cpu_bf16_path_default() != KERN_CPU_BF16_SGEMM,
        .kernels_async = false,
        .device_memory_host_addressable = true,
        .copy_engines = 2, /* one thread per copy stream (H2D, D2H) */
        .host_cores = kern_cpu_host_cores(d),
    };
}

static kern_threadpool_t *cpu_host_pool(kern_device_t *d) { return ((cpu_device_t *)d)->pool; }

mt_status_t kern_cpu_device_create(const kern_device_opts_t *opts, kern_device_t **out,
                                   mt_error_t *err) {
    (void)err;
    cpu_device_t *dev = calloc(1, sizeof *dev);
    MT_CHECK_ALLOC(dev, "CPU device");
    dev->base.vt = &k_cpu_vtable;
    dev->base.ops = &kern_ops_cpu;
    dev->base.kind = KERN_BACKEND_CPU;
    dev->base.opts = *opts;
    if (dev->base.opts.device_budget_bytes == 0) {
        /* default budget: the machine's physical memory */
        dev->base.opts.device_budget_bytes =
            (size_t)sysconf(_SC_PHYS_PAGES) * (size_t)sysconf(_SC_PAGESIZE);
    }
    pthread_mutex_init(&dev->ev_lock, NULL);
    pthread_cond_init(&dev->ev_cond, NULL);
    /* The backend's pool splits products and every other kernel itself
     * (kernels/cpu/gemm.c cuts a product into fixed pieces when OpenBLAS is
     * single-threaded); OpenBLAS's own idle workers would otherwise spin in
     * sched_yield beside the pool and the copy and optimizer threads
     * (measured: 37-48% of samples; quick start 46k -> 58k tokens/s).
     * Process-wide, as OpenBLAS's setting is. */
    openblas_set_num_threads(1);
    pin_compute(dev);
    dev->pool = kern_threadpool_create(opts->host_threads); /* workers inherit the compute cores */
    for (int r = 0; r < KERN_STREAM_COUNT; r++) {
        kern_stream_t *s = &dev->stream_storage[r];
        s->dev = dev;
        s->role = (kern_stream_role_t)r;
        s->threaded = r != KERN_STREAM_COMPUTE;
        if (r == KERN_STREAM_H2D) s->bytes_per_s = opts->link_h2d_bytes_per_s;
        if (r == KERN_STREAM_D2H) s->bytes_per_s = opts->link_d2h_bytes_per_s;
        if (r == KERN_STREAM_H2D || r == KERN_STREAM_D2H) s->latency_s = opts->link_latency_s;
        if (s->threaded) {
            pthread_mutex_init(&s->lock, NULL);
            pthread_cond_init(&s->cond, NULL);
            MT_CHECK(pthread_create(&s->thread, NULL, stream_main, s) == 0,
                     "cannot start CPU copy stream thread");
        }
        dev->base.streams[r] = s;
    }
    *out = &dev->base;
    return MT_OK;
}

static const kern_backend_t k_cpu_backend = {
    .kind = KERN_BACKEND_CPU,
    .name = "cpu",
    .probe = NULL, /* the host is always there */
    .create = kern_cpu_device_create,
};

__attribute__((constructor)) static void register_cpu_backend(void) { kern_backend_register(&k_cpu_backend); }
