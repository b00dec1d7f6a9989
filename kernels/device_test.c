/* The device layer on the CPU backend (kernels/device.h, device.c,
 * cpu/backend_cpu.c), through kern_device_create(KERN_BACKEND_CPU, ...).
 *
 * Ordering is tested with gates rather than sleeps where possible: a host
 * function on a copy stream that blocks until the test opens it makes "B
 * must not have happened yet" a deterministic check instead of a race.
 * Timing checks are lower bounds only (the throttle must slow a copy down to
 * the configured link); nothing asserts that something is fast, so a loaded
 * machine or ASan cannot make them fail. */
#include "kernels/device.h"
#include "kernels/host/threadpool.h"
#include "base/clock.h"

#include <setjmp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static int failures;
#define EXPECT(c, ...)                                                        \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #c);     \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            failures++;                                                       \
        }                                                                     \
    } while (0)

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Polls flag until it is nonzero or `timeout` seconds pass. */
static int wait_flag(atomic_int *flag, double timeout) {
    const double end = mt_now_s() + timeout;
    while (!atomic_load(flag) && mt_now_s() < end) sleep_s(1e-3);
    return atomic_load(flag);
}

static kern_device_t *make_dev(size_t budget, double h2d_bps, double d2h_bps, double latency) {
    kern_device_opts_t o = {.device_budget_bytes = budget,
                            .host_threads = 1,
                            .link_h2d_bytes_per_s = h2d_bps,
                            .link_d2h_bytes_per_s = d2h_bps,
                            .link_latency_s = latency};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    mt_status_t st = kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err);
    if (st != MT_OK || !dev) {
        fprintf(stderr, "cannot create CPU device: %s\n", err.msg);
        exit(2);
    }
    return dev;
}

/* ---- host functions used as stream commands ---- */
typedef struct {
    atomic_int open;
} gate_t;
static void gate_fn(void *arg) { /* blocks its stream until the test opens the gate */
    gate_t *g = arg;
    while (!atomic_load(&g->open)) sleep_s(1e-3);
}
static void set_flag_fn(void *arg) { atomic_store((atomic_int *)arg, 1); }
static void sleep_fn(void *arg) { sleep_s(*(const double *)arg); }

typedef struct {
    const unsigned char *got, *want;
    size_t n;
    atomic_int ran, ok;
} verify_t;
static void verify_fn(void *arg) { /* runs on the stream, after the copy before it */
    verify_t *v = arg;
    atomic_store(&v->ok, memcmp(v->got, v->want, v->n) == 0);
    atomic_store(&v->ran, 1);
}

typedef struct {
    int log[100];
    atomic_int n;
} order_log_t;
typedef struct {
    order_log_t *log;
    int id;
} order_item_t;
static void log_fn(void *arg) {
    order_item_t *it = arg;
    int i = atomic_fetch_add(&it->log->n, 1);
    if (i < 100) it->log->log[i] = it->id;
}

/* ---- tests ---- */
static void test_budget(void) {
    const size_t budget = 1 << 20;
    kern_device_t *dev = make_dev(budget, 0, 0, 0);
    kern_device_stats_t st = kern_device_stats(dev);
    EXPECT(st.device_capacity == budget, "capacity %zu, want %zu", st.device_capacity, budget);
    EXPECT(st.device_in_use == 0 && st.device_peak == 0, "fresh device in use %zu peak %zu",
           st.device_in_use, st.device_peak);

    mt_error_t err = {0};
    const size_t big = 600 * 1024;
    void *a = kern_alloc(dev, big, "a", &err);
    EXPECT(a != NULL, "600 KiB of 1 MiB must fit: %s", err.msg);
    EXPECT(((uintptr_t)a % 256) == 0, "alloc not 256-byte aligned: %p", a);
    const char *tag = "model.layers.3.block_sparse_moe.experts.7.w1.weight";
    err = (mt_error_t){0};
    void *b = kern_alloc(dev, big, tag, &err);
    EXPECT(b == NULL, "second 600 KiB must not fit in 1 MiB");
    EXPECT(err.code == MT_ERR_BUDGET, "over-budget code %d (%s), want MT_ERR_BUDGET", err.code,
           mt_status_name(err.code));
    EXPECT(strstr(err.msg, tag) != NULL, "message must name the tensor: \"%s\"", err.msg);
    EXPECT(strstr(err.msg, "614400") != NULL, "message should give the requested bytes: \"%s\"",
           err.msg);
    st = kern_device_stats(dev);
    EXPECT(st.device_in_use == big && st.device_peak == big,
           "after a failed alloc: in use %zu peak %zu, want %zu", st.device_in_use, st.device_peak,
           big);

    /* free + re-alloc reuses the space */
    kern_free(dev, a);
    st = kern_device_stats(dev);
    EXPECT(st.device_in_use == 0 && st.device_peak == big, "after free: in use %zu peak %zu",
           st.device_in_use, st.device_peak);
    void *c = kern_alloc(dev, big, "c", &err);
    EXPECT(c == a, "re-allocation after free should reuse the block: %p vs %p", c, a);
    void *d = kern_alloc(dev, 1000, "d", &err); /* rounded up to 1024 */
    void *z = kern_alloc(dev, 0, "z", &err);    /* legal, distinct */
    EXPECT(d && z && z != d && z != c, "small and zero-byte allocations: %p %p", d, z);
    st = kern_device_stats(dev);
    EXPECT(st.device_in_use == big + 1024 + 256, "in use %zu, want %zu (aligned sizes)",
           st.device_in_use, big + 1024 + 256);
    kern_free(dev, c);
    kern_free(dev, NULL); /* no-op */
    st = kern_device_stats(dev);
    EXPECT(st.device_peak == big + 1024 + 256, "peak %zu, want %zu", st.device_peak,
           big + 1024 + 256);
    kern_device_reset_peaks(dev);
    st = kern_device_stats(dev);
    EXPECT(st.device_peak == st.device_in_use && st.device_in_use == 1024 + 256,
           "after reset_peaks: peak %zu in use %zu", st.device_peak, st.device_in_use);
    kern_free(dev, d);
    kern_free(dev, z);

    /* exactly the budget fits, one byte more does not */
    void *all = kern_alloc(dev, budget, "all", &err);
    EXPECT(all != NULL, "the whole budget must fit: %s", err.msg);
    err = (mt_error_t){0};
    EXPECT(kern_alloc(dev, 1, "one.more.byte", &err) == NULL && err.code == MT_ERR_BUDGET &&
               strstr(err.msg, "one.more.byte"),
           "1 byte past a full arena must fail naming it: \"%s\"", err.msg);
    kern_free(dev, all);
    err = (mt_error_t){0};
    EXPECT(kern_alloc(dev, budget + 1, "too.big", &err) == NULL && err.code == MT_ERR_BUDGET,
           "budget + 1 bytes in an empty arena must fail");

    /* the arena memory is usable through copies */
    unsigned char *buf = kern_alloc(dev, 4096, "buf", &err);
    unsigned char host[4096], back[4096];
    for (int i = 0; i < 4096; i++) host[i] = (unsigned char)(i * 7 + 1);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    kern_memcpy_h2d(dev, h2d, buf, host, sizeof host);
    kern_stream_sync(dev, h2d);
    memset(back, 0, sizeof back);
    kern_memcpy_d2h(dev, d2h, back, buf, sizeof back);
    kern_stream_sync(dev, d2h);
    EXPECT(memcmp(back, host, sizeof host) == 0, "H2D then D2H round trip differs");
    kern_free(dev, buf);
    kern_device_destroy(dev);
}

static jmp_buf g_fatal_jmp;
static void fatal_to_longjmp(const char *msg) {
    (void)msg;
    longjmp(g_fatal_jmp, 1);
}

static void test_free_unknown_is_fatal(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    mt_error_t err = {0};
    char *a = kern_alloc(dev, 1024, "a", &err);
    volatile int fatal = 0;
    mt_set_fatal_hook(fatal_to_longjmp);
    if (setjmp(g_fatal_jmp) == 0)
        kern_free(dev, a + 256); /* inside a block, not its start */
    else
        fatal = 1;
    mt_set_fatal_hook(NULL);
    EXPECT(fatal, "freeing a pointer that is not a block start must go through the fatal hook");
    kern_free(dev, a);
    EXPECT(kern_device_stats(dev).device_in_use == 0, "arena still consistent after the fatal");
    kern_device_destroy(dev);
}

/* D2H waits on an event recorded after an H2D copy that is held back by a
 * gate: the D2H copy must see the new data, and must not run before. */
static void test_event_ordering(void) {
    kern_device_t *dev = make_dev(1 << 22, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    const size_t n = 1 << 20;
    mt_error_t err = {0};
    unsigned char *D = kern_alloc(dev, n, "D", &err);
    unsigned char *A = malloc(n), *B = malloc(n), *zero = calloc(n, 1);
    if (!D || !A || !B || !zero) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i++) A[i] = (unsigned char)(i * 13 + 5);
    memset(B, 0, n);
    kern_memset(dev, h2d, D, 0, n);
    kern_stream_sync(dev, h2d);

    kern_event_t *ev = kern_event_create(dev);
    /* CUDA: cudaEventQuery on a never-recorded event returns cudaSuccess */
    EXPECT(kern_event_query(dev, ev), "a never-recorded event counts as complete (CUDA semantics)");

    gate_t gate = {0};
    kern_launch_host_fn(dev, h2d, gate_fn, &gate);
    kern_memcpy_h2d(dev, h2d, D, A, n);
    kern_event_record(dev, ev, h2d);
    kern_stream_wait_event(dev, d2h, ev);
    kern_memcpy_d2h(dev, d2h, B, D, n);
    verify_t v = {.got = B, .want = A, .n = n};
    kern_launch_host_fn(dev, d2h, verify_fn, &v);

    sleep_s(0.05);
    EXPECT(!kern_event_query(dev, ev), "event behind a closed gate reported complete");
    EXPECT(!atomic_load(&v.ran), "D2H ran past stream_wait_event before the event fired");
    EXPECT(memcmp(B, zero, n) == 0, "D2H copied before the H2D copy it waits on");
    atomic_store(&gate.open, 1);
    kern_event_sync(dev, ev);
    EXPECT(kern_event_query(dev, ev), "event not complete after event_sync");
    kern_stream_sync(dev, d2h);
    EXPECT(atomic_load(&v.ran) && atomic_load(&v.ok),
           "host fn after the D2H copy saw data %s", atomic_load(&v.ok) ? "ok" : "stale");
    EXPECT(memcmp(B, A, n) == 0, "D2H result differs from the H2D source");

    kern_event_destroy(dev, ev);
    kern_free(dev, D);
    free(A); free(B); free(zero);
    kern_device_destroy(dev);
}

/* A wait targets the record that was latest when the wait was issued
 * (cudaStreamWaitEvent): a later re-record of the same event must not hold
 * the waiting stream back. */
static void test_wait_targets_issued_record(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    kern_event_t *ev = kern_event_create(dev);
    gate_t gate = {0};
    atomic_int flag = 0;
    kern_event_record(dev, ev, h2d);         /* record 1: fires at once */
    kern_stream_wait_event(dev, d2h, ev);    /* targets record 1 */
    kern_launch_host_fn(dev, d2h, set_flag_fn, &flag);
    kern_launch_host_fn(dev, h2d, gate_fn, &gate);
    kern_event_record(dev, ev, h2d);         /* record 2: held by the gate */
    const int ran = wait_flag(&flag, 5.0);
    EXPECT(ran, "D2H waited for a record issued after its wait (5 s timeout)");
    EXPECT(!kern_event_query(dev, ev), "record 2 is behind the gate but query says complete");
    atomic_store(&gate.open, 1);
    kern_device_sync(dev);
    EXPECT(kern_event_query(dev, ev), "event incomplete after device sync");
    kern_event_destroy(dev, ev);
    kern_device_destroy(dev);
}

/* The compute stream runs on the caller: waiting on an event blocks the
 * caller until it fires, and the data is there when the call returns. */
static void test_compute_wait_blocks(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    kern_stream_t *comp = kern_stream(dev, KERN_STREAM_COMPUTE);
    mt_error_t err = {0};
    float *D = kern_alloc(dev, 256 * sizeof(float), "D", &err);
    float src[256], back[256];
    for (int i = 0; i < 256; i++) src[i] = (float)i * 0.5f;
    kern_event_t *ev = kern_event_create(dev);
    double delay = 0.06;
    const double t0 = mt_now_s();
    kern_launch_host_fn(dev, h2d, sleep_fn, &delay);
    kern_memcpy_h2d(dev, h2d, D, src, sizeof src);
    kern_event_record(dev, ev, h2d);
    kern_stream_wait_event(dev, comp, ev);
    const double waited = mt_now_s() - t0;
    EXPECT(waited >= 0.05, "compute-stream wait returned after %.3f s, before the event (0.06 s)",
           waited);
    kern_memcpy_d2h(dev, comp, back, D, sizeof back); /* inline on the compute stream */
    EXPECT(memcmp(back, src, sizeof src) == 0, "data not in place when the compute wait returned");
    kern_event_destroy(dev, ev);
    kern_free(dev, D);
    kern_device_destroy(dev);
}

static void test_stream_order_and_stats(void) {
    kern_device_t *dev = make_dev(1 << 20, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    order_log_t log = {.n = 0};
    order_item_t items[100];
    for (int i = 0; i < 100; i++) {
        items[i] = (order_item_t){&log, i};
        kern_launch_host_fn(dev, h2d, log_fn, &items[i]);
    }
    kern_stream_sync(dev, h2d);
    int bad = atomic_load(&log.n) != 100;
    for (int i = 0; i < 100 && !bad; i++) bad += log.log[i] != i;
    EXPECT(!bad, "100 host functions on one stream did not run once each in issue order");

    mt_error_t err = {0};
    unsigned char *D = kern_alloc(dev, 3000, "D", &err), *D2 = kern_alloc(dev, 3000, "D2", &err);
    unsigned char h[3000], back[3000];
    memset(h, 0x5a, sizeof h);
    kern_memset(dev, h2d, D, 0xab, 3000);
    kern_memcpy_h2d(dev, h2d, D, h, 1000); /* after the memset, in order */
    kern_memcpy_d2d(dev, h2d, D2, D, 3000);
    kern_stream_sync(dev, h2d);
    kern_memcpy_d2h(dev, d2h, back, D2, 3000);
    kern_memcpy_d2h(dev, d2h, back, D2, 0); /* zero bytes: counted, harmless */
    kern_stream_sync(dev, d2h);
    int ok = 1;
    for (int i = 0; i < 3000; i++) ok &= back[i] == (i < 1000 ? 0x5a : 0xab);
    EXPECT(ok, "memset, partial H2D copy and D2D copy did not compose in stream order");
    kern_device_stats_t st = kern_device_stats(dev);
    EXPECT(st.h2d_copies == 1 && st.h2d_bytes == 1000, "h2d stats %llu copies %llu bytes",
           (unsigned long long)st.h2d_copies, (unsigned long long)st.h2d_bytes);
    EXPECT(st.d2h_copies == 2 && st.d2h_bytes == 3000, "d2h stats %llu copies %llu bytes",
           (unsigned long long)st.d2h_copies, (unsigned long long)st.d2h_bytes);
    kern_free(dev, D);
    kern_free(dev, D2);
    kern_device_destroy(dev);
}

/* Lower bounds only: the throttle must make copies at least as slow as the
 * configured link. The backend starts its clock when the copy starts, after
 * our t0, so the bound is exact; 1% slack covers clock granularity. */
static void test_throttle(void) {
    const size_t n = 10u << 20; /* 10 MiB */
    kern_device_t *dev = make_dev(32u << 20, 100e6, 50e6, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    mt_error_t err = {0};
    unsigned char *D = kern_alloc(dev, n, "D", &err);
    unsigned char *H = calloc(n, 1), *B = malloc(n);
    if (!D || !H || !B) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    for (size_t i = 0; i < n; i += 4096) H[i] = (unsigned char)(i >> 12);
    double t0 = mt_now_s();
    kern_memcpy_h2d(dev, h2d, D, H, n);
    kern_stream_sync(dev, h2d);
    double t = mt_now_s() - t0;
    const double want_h2d = (double)n / 100e6;
    printf("throttled H2D: %zu bytes in %.3f s (link 100 MB/s -> >= %.3f s)\n", n, t, want_h2d);
    EXPECT(t >= 0.99 * want_h2d, "10 MiB at 100 MB/s took %.3f s < %.3f s", t, want_h2d);

    const size_t n2 = 1u << 20;
    t0 = mt_now_s();
    kern_memcpy_d2h(dev, d2h, B, D, n2);
    kern_stream_sync(dev, d2h);
    t = mt_now_s() - t0;
    const double want_d2h = (double)n2 / 50e6;
    printf("throttled D2H: %zu bytes in %.3f s (link 50 MB/s -> >= %.3f s)\n", n2, t, want_d2h);
    EXPECT(t >= 0.99 * want_d2h, "1 MiB at 50 MB/s took %.3f s < %.3f s", t, want_d2h);
    EXPECT(memcmp(B, H, n2) == 0, "throttled copies moved the wrong bytes");
    kern_free(dev, D);
    kern_device_destroy(dev);

    /* per-copy latency: 5 tiny copies at 20 ms each take >= 100 ms */
    dev = make_dev(1 << 16, 0, 0, 0.02);
    h2d = kern_stream(dev, KERN_STREAM_H2D);
    D = kern_alloc(dev, 1024, "D", &err);
    t0 = mt_now_s();
    for (int i = 0; i < 5; i++) kern_memcpy_h2d(dev, h2d, D, H, 1024);
    kern_stream_sync(dev, h2d);
    t = mt_now_s() - t0;
    printf("latency: 5 copies of 1 KiB in %.3f s (20 ms each -> >= 0.100 s)\n", t);
    EXPECT(t >= 0.099, "5 copies with 20 ms latency took %.3f s", t);
    kern_free(dev, D);
    kern_device_destroy(dev);
    free(H);
    free(B);
}

static void test_pinned(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    const size_t a_n = 1u << 20, b_n = 3u << 20;
    unsigned char *a = kern_pinned_alloc(dev, a_n), *b = kern_pinned_alloc(dev, b_n);
    EXPECT(a && b, "pinned allocations failed");
    if (a && b) {
        memset(a, 1, a_n);
        memset(b, 2, b_n);
        EXPECT(a[a_n - 1] == 1 && b[b_n - 1] == 2, "pinned memory not writable");
    }
    kern_device_stats_t st = kern_device_stats(dev);
    EXPECT(st.pinned_in_use == a_n + b_n && st.pinned_peak == a_n + b_n,
           "pinned in use %zu peak %zu, want %zu", st.pinned_in_use, st.pinned_peak, a_n + b_n);
    kern_pinned_free(dev, b, b_n);
    st = kern_device_stats(dev);
    EXPECT(st.pinned_in_use == a_n && st.pinned_peak == a_n + b_n,
           "after free: pinned in use %zu peak %zu", st.pinned_in_use, st.pinned_peak);
    kern_device_reset_peaks(dev);
    st = kern_device_stats(dev);
    EXPECT(st.pinned_peak == a_n, "after reset: pinned peak %zu, want %zu", st.pinned_peak, a_n);
    kern_pinned_free(dev, a, a_n);
    kern_pinned_free(dev, NULL, 0);
    st = kern_device_stats(dev);
    EXPECT(st.pinned_in_use == 0, "pinned in use %zu after freeing all", st.pinned_in_use);
    kern_device_destroy(dev);
}

/* Destroying a device with queued work drains it first. */
static void test_destroy_drains(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0.03);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    mt_error_t err = {0};
    unsigned char *D = kern_alloc(dev, 64, "D", &err);
    unsigned char h[64] = {0};
    atomic_int flag = 0;
    kern_memcpy_h2d(dev, h2d, D, h, sizeof h);
    kern_launch_host_fn(dev, h2d, set_flag_fn, &flag);
    kern_device_destroy(dev);
    EXPECT(atomic_load(&flag), "queued host function did not run before destroy returned");
}

/* An event re-recorded on another stream before its first record fired:
 * a wait issued between the two records targets the first record's work
 * (cudaStreamWaitEvent captures the event's state at the call), so the
 * second record completing early must not release it. */
static void test_wait_survives_rerecord_on_other_stream(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    kern_stream_t *comp = kern_stream(dev, KERN_STREAM_COMPUTE);
    kern_event_t *ev = kern_event_create(dev);
    gate_t gate = {0};
    atomic_int flag = 0;
    kern_launch_host_fn(dev, h2d, gate_fn, &gate);
    kern_event_record(dev, ev, h2d);      /* record 1: behind the gate */
    kern_stream_wait_event(dev, d2h, ev); /* must wait for record 1 */
    kern_launch_host_fn(dev, d2h, set_flag_fn, &flag);
    kern_event_record(dev, ev, comp);     /* record 2 on the compute stream: fires at once */
    sleep_s(0.05);
    EXPECT(!atomic_load(&flag),
           "test_wait_survives_rerecord_on_other_stream: D2H passed its wait on record 1 of an "
           "event while record 1 (H2D, gated) had not fired; record 2 on the compute stream "
           "released it (completion must be tracked per record, not as the highest fired one)");
    atomic_store(&gate.open, 1);
    kern_device_sync(dev);
    EXPECT(atomic_load(&flag), "D2H host function never ran");
    kern_event_destroy(dev, ev);
    kern_device_destroy(dev);
}

/* CUDA allows destroying an event whose record has not completed yet (its
 * resources are released when it completes). The stream still holds the
 * signal command, so the backend must not free the event under it. This
 * one shows up as heap-use-after-free under --config=asan. */
static void test_event_destroy_while_pending(void) {
    kern_device_t *dev = make_dev(1 << 16, 0, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    kern_event_t *ev = kern_event_create(dev);
    gate_t gate = {0};
    kern_launch_host_fn(dev, h2d, gate_fn, &gate);
    kern_event_record(dev, ev, h2d);
    kern_event_destroy(dev, ev); /* pending: the H2D queue still signals it */
    atomic_store(&gate.open, 1);
    kern_stream_sync(dev, h2d);
    kern_device_destroy(dev);
}

/* A device-to-device copy never crosses the host link, so a copy stream's
 * link throttle must not apply to it (on a GPU, D2D runs at HBM speed).
 * 1 MiB on a 1 MB/s link would take 1 s if throttled; a memcpy of 1 MiB
 * takes about a millisecond even under ASan, so 0.5 s is a generous bound
 * that only a throttled copy can exceed. */
static void test_d2d_not_throttled(void) {
    const size_t n = 1u << 20;
    kern_device_t *dev = make_dev(4u << 20, 1e6, 1e6, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    mt_error_t err = {0};
    void *a = kern_alloc(dev, n, "a", &err), *b = kern_alloc(dev, n, "b", &err);
    kern_memset(dev, h2d, a, 7, n);
    const double t0 = mt_now_s();
    kern_memcpy_d2d(dev, h2d, b, a, n);
    kern_stream_sync(dev, h2d);
    const double t = mt_now_s() - t0;
    printf("D2D 1 MiB on a copy stream with a 1 MB/s link: %.3f s\n", t);
    EXPECT(t < 0.5,
           "test_d2d_not_throttled: a 1 MiB device-to-device copy took %.3f s: the H2D link "
           "throttle (1 MB/s) was applied to a copy that does not cross the link", t);
    kern_free(dev, a);
    kern_free(dev, b);
    kern_device_destroy(dev);
}

/* ---- stream-ordered frees (the CUDA backend's policy) on the CPU backend ---- */

static kern_device_t *make_ordered_dev(size_t budget, double d2h_bps) {
    kern_device_opts_t o = {.device_budget_bytes = budget,
                            .host_threads = 1,
                            .link_d2h_bytes_per_s = d2h_bps,
                            .stream_ordered_frees = true};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        fprintf(stderr, "cannot create CPU device: %s\n", err.msg);
        exit(2);
    }
    return dev;
}

static bool all_bytes(const unsigned char *p, size_t n, unsigned char v) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != v) return false;
    return true;
}

/* A buffer freed while a D2H copy (held by a gate) still reads it is not
 * handed out again: the next allocation of the same size gets other memory,
 * and writing that memory leaves the copy's source intact. */
static void test_ordered_free_no_alias(void) {
    const size_t n = 1u << 20;
    kern_device_t *dev = make_ordered_dev(2 * n, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    mt_error_t err = {0};
    unsigned char *A = kern_alloc(dev, n, "A", &err), *B = calloc(n, 1);
    if (!A || !B) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    kern_memset(dev, h2d, A, 0x11, n);
    kern_stream_sync(dev, h2d);
    gate_t gate = {0};
    kern_launch_host_fn(dev, d2h, gate_fn, &gate);
    kern_memcpy_d2h(dev, d2h, B, A, n); /* queued behind the gate: still to read A */
    kern_free(dev, A);
    unsigned char *C = kern_alloc(dev, n, "C", &err);
    EXPECT(C != NULL, "a second buffer fits the 2-buffer budget: %s", err.msg);
    EXPECT(C && (C + n <= A || A + n <= C),
           "test_ordered_free_no_alias: the allocation after freeing A (%p) overlaps it (%p) while a D2H copy "
           "queued before the free still reads A",
           (void *)A, (void *)C);
    kern_device_stats_t st = kern_device_stats(dev);
    EXPECT(st.device_pending == n && st.device_in_use == 2 * n && st.deferred_frees == 1,
           "pending %zu in use %zu deferred %llu; want %zu, %zu, 1", st.device_pending, st.device_in_use,
           (unsigned long long)st.deferred_frees, n, 2 * n);
    if (C) {
        kern_memset(dev, h2d, C, 0x22, n); /* on another stream, while the copy waits */
        kern_stream_sync(dev, h2d);
    }
    atomic_store(&gate.open, 1);
    kern_stream_sync(dev, d2h);
    EXPECT(all_bytes(B, n, 0x11), "the D2H copy read A after it was freed and reused");
    kern_device_sync(dev);
    st = kern_device_stats(dev);
    EXPECT(st.device_pending == 0 && st.device_in_use == n, "after device sync: pending %zu in use %zu",
           st.device_pending, st.device_in_use);
    /* once everything is done the block is reused as usual */
    unsigned char *D = kern_alloc(dev, n, "D", &err);
    EXPECT(D == A, "A's block not reused after the copy finished: %p vs %p", (void *)D, (void *)A);
    kern_free(dev, C);
    kern_free(dev, D);
    free(B);
    kern_device_destroy(dev);
}

/* Under a budget of one buffer: the only way to satisfy the next allocation
 * is the block a throttled D2H copy still reads.  The allocation waits for
 * the copy (it never fails), returns only after it, and the copy's data is
 * intact.  A request that cannot fit even then fails naming its tensor. */
static void test_ordered_free_waits(void) {
    const size_t n = 1u << 20;
    const double link = 20e6; /* 1 MiB in >= 52 ms */
    kern_device_t *dev = make_ordered_dev(n, link);
    kern_stream_t *d2h = kern_stream(dev, KERN_STREAM_D2H);
    mt_error_t err = {0};
    unsigned char *A = kern_alloc(dev, n, "A", &err), *B = calloc(n, 1);
    if (!A || !B) {
        fprintf(stderr, "allocation failed\n");
        exit(2);
    }
    atomic_int copied = 0;
    kern_memset(dev, d2h, A, 0x33, n);
    const double t0 = mt_now_s();
    kern_memcpy_d2h(dev, d2h, B, A, n);
    kern_launch_host_fn(dev, d2h, set_flag_fn, &copied);
    kern_free(dev, A);
    unsigned char *C = kern_alloc(dev, n, "C", &err);
    const double waited = mt_now_s() - t0;
    EXPECT(C != NULL, "test_ordered_free_waits: an allocation only a pending free can satisfy failed: %s", err.msg);
    EXPECT(atomic_load(&copied), "the allocation returned before the copy reading the freed block finished");
    EXPECT(waited >= 0.99 * (double)n / link, "returned after %.3f s, the throttled copy takes >= %.3f s", waited,
           (double)n / link);
    printf("stream-ordered free: the allocation waited %.3f s for a 1 MiB D2H copy at 20 MB/s\n", waited);
    kern_device_stats_t st = kern_device_stats(dev);
    EXPECT(st.free_waits == 1 && st.device_pending == 0 && st.device_peak == n,
           "waits %llu pending %zu peak %zu", (unsigned long long)st.free_waits, st.device_pending, st.device_peak);
    EXPECT(all_bytes(B, n, 0x33), "the copy's data changed");
    /* nothing pending can help a request over the budget: a clear error, no hang */
    kern_free(dev, C);
    err = (mt_error_t){0};
    EXPECT(kern_alloc(dev, 2 * n, "layer.9.too_big", &err) == NULL && err.code == MT_ERR_BUDGET &&
               strstr(err.msg, "layer.9.too_big"),
           "over budget with pending frees: \"%s\"", err.msg);
    EXPECT(kern_device_stats(dev).device_pending == 0, "a failed allocation waits for every pending free first");
    free(B);
    kern_device_destroy(dev);
}

/* The reclaim hook's frees are stream-ordered too: kern_alloc waits for them. */
typedef struct {
    kern_device_t *dev;
    void *held;
    int calls;
} reclaim_ctx_t;
static bool reclaim_fn(void *arg) {
    reclaim_ctx_t *r = arg;
    r->calls++;
    if (!r->held) return false;
    kern_free(r->dev, r->held);
    r->held = NULL;
    return true;
}

static void test_ordered_free_reclaim_and_fatal(void) {
    const size_t n = 64u << 10;
    kern_device_t *dev = make_ordered_dev(n, 1e6);
    kern_stream_t *d2h = kern_stream(dev, KERN_STREAM_D2H);
    mt_error_t err = {0};
    unsigned char *X = kern_alloc(dev, n, "X", &err), *B = malloc(n / 4);
    kern_memcpy_d2h(dev, d2h, B, X, n / 4); /* 16 ms at 1 MB/s: X is still read when the hook frees it */
    reclaim_ctx_t rc = {dev, X, 0};
    kern_set_reclaim_hook(dev, reclaim_fn, &rc);
    void *Y = kern_alloc(dev, n, "Y", &err);
    EXPECT(Y == X && rc.calls == 1, "reclaimed block: %p (want %p), hook called %d times: %s", Y, (void *)X, rc.calls,
           err.msg);
    kern_set_reclaim_hook(dev, NULL, NULL);
    volatile int fatal = 0;
    mt_set_fatal_hook(fatal_to_longjmp);
    kern_free(dev, Y);
    if (setjmp(g_fatal_jmp) == 0) kern_free(dev, Y); /* twice, while the first is pending */
    else fatal++;
    mt_set_fatal_hook(NULL);
    EXPECT(fatal == 1, "a double free while pending must go through the fatal hook");
    kern_device_sync(dev);
    EXPECT(kern_device_stats(dev).device_in_use == 0, "arena consistent after the fatal");
    free(B);
    kern_device_destroy(dev);
}

static void test_cuda_probe(void) {
    char why[256] = "";
    const bool avail = kern_cuda_available(why, sizeof why);
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20};
    const mt_status_t st = kern_device_create(KERN_BACKEND_CUDA, &o, &dev, &err);
    printf("kern_cuda_available: %s (%s); create: %s\n", avail ? "true" : "false", why,
           mt_status_name(st));
    if (!avail) {
        EXPECT(why[0] != '\0', "no reason given for CUDA being unavailable");
        EXPECT(st == MT_ERR_DEVICE && dev == NULL && err.msg[0] != '\0',
               "creating a CUDA device without CUDA: status %s, dev %p, msg \"%s\"",
               mt_status_name(st), (void *)dev, err.msg);
    } else {
        EXPECT(st == MT_OK, "CUDA reported available but create failed: %s", err.msg);
    }
    if (dev) kern_device_destroy(dev);
    /* a short reason buffer is truncated, not overrun */
    char tiny[4];
    (void)kern_cuda_available(tiny, sizeof tiny);
    EXPECT(memchr(tiny, '\0', sizeof tiny) != NULL, "reason not NUL-terminated in a 4-byte buffer");
}

/* bump(ctx, task): counts the tasks a pool ran */
static void count_task(void *ctx, size_t t) {
    (void)t;
    atomic_fetch_add((atomic_int *)ctx, 1);
}

/* The CPU backend's capabilities, and its kernel pool lent to host work. */
static void test_caps(void) {
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20, .host_threads = 2};
    kern_device_t *dev = NULL;
    mt_error_t err = {0};
    EXPECT(kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) == MT_OK, "%s", err.msg);
    if (!dev) return;
    const kern_device_caps_t c = kern_device_caps(dev);
    __builtin_cpu_init();
    const bool has_dpbf16 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
    EXPECT(c.bf16_compute == has_dpbf16, "caps.bf16_compute %d on a CPU %s avx512_bf16",
           c.bf16_compute, has_dpbf16 ? "with" : "without");
    EXPECT(!c.kernels_async, "the CPU backend's kernels finish before they return");
    EXPECT(c.device_memory_host_addressable, "CPU device memory is host memory");
    EXPECT(c.copy_engines == 2, "copy_engines %d, want 2 (H2D and D2H threads)", c.copy_engines);
    EXPECT(c.host_cores == 0, "unpinned: host_cores %d, want 0", c.host_cores);
    kern_threadpool_t *pool = kern_device_host_pool(dev);
    EXPECT(pool != NULL && kern_threadpool_size(pool) == 2, "host pool %p of %d threads, want 2",
           (void *)pool, pool ? kern_threadpool_size(pool) : 0);
    atomic_int ran = 0;
    if (pool) kern_threadpool_parallel_for(pool, 37, count_task, &ran);
    EXPECT(atomic_load(&ran) == 37, "host pool ran %d of 37 tasks", atomic_load(&ran));
    kern_device_destroy(dev);
}

int main(void) {
    test_caps();
    test_budget();
    test_free_unknown_is_fatal();
    test_event_ordering();
    test_wait_targets_issued_record();
    test_compute_wait_blocks();
    test_stream_order_and_stats();
    test_throttle();
    test_pinned();
    test_destroy_drains();
    test_wait_survives_rerecord_on_other_stream();
    test_d2d_not_throttled();
    test_cuda_probe();
    test_ordered_free_no_alias();
    test_ordered_free_waits();
    test_ordered_free_reclaim_and_fatal();
    /* last: were pending events freed early again, this would write freed
     * memory (ASan reports it) and could upset the tests after it */
    printf("test_event_destroy_while_pending (a crash here means that regression)\n");
    fflush(stdout);
    test_event_destroy_while_pending();
    if (failures) {
        fprintf(stderr, "device_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("device_test: all checks passed\n");
    return 0;
}
