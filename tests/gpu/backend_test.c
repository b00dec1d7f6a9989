/* GPU suite: the CUDA device layer itself (device.h) and NCCL.
 *
 * Checks: a budget above free memory is a clear MT_ERR_BUDGET at creation;
 * the arena refuses an allocation over the budget naming the tensor, and
 * reuses freed space; pinned memory; a pipeline over the three streams
 * (H2D copy -> event -> compute -> event -> D2H copy -> host function) gives
 * the right data in the right order; memset, D2D copies and the copy
 * counters; event query; stream-ordered frees (a buffer freed while a
 * queued kernel still reads it is not handed to an H2D copy, and an
 * allocation only that free can satisfy waits for the kernel instead of
 * failing); NCCL over one device (and two when present). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/cuda/backend_cuda.h"
#include "tests/gpu/gpu_test.h"

static void host_mark(void *arg) { *(volatile int *)arg += 1; }

static void budget_checks(gt_ctx_t *t) {
    mt_error_t err;
    kern_device_t *dev = NULL;
    kern_device_opts_t o = {.device_budget_bytes = (size_t)1 << 50};
    mt_status_t st = kern_device_create(KERN_BACKEND_CUDA, &o, &dev, &err);
    gt_expect(t, st == MT_ERR_BUDGET && dev == NULL, "a 1 PiB budget should be MT_ERR_BUDGET, got %s",
              mt_status_name(st));
    if (st != MT_OK) printf("ok   over-budget creation says: %s\n", err.msg);

    o.device_budget_bytes = (size_t)64 << 20;
    st = kern_device_create(KERN_BACKEND_CUDA, &o, &dev, &err);
    gt_expect(t, st == MT_OK, "64 MiB device: %s", err.msg);
    if (st != MT_OK) return;
    gt_expect(t, kern_device_stats(dev).device_capacity == ((size_t)64 << 20), "capacity %zu",
              kern_device_stats(dev).device_capacity);
    void *a = kern_alloc(dev, (size_t)48 << 20, "first tensor", &err);
    gt_expect(t, a != NULL, "48 MiB of 64: %s", err.msg);
    void *b = kern_alloc(dev, (size_t)32 << 20, "layer.7.big_tensor", &err);
    gt_expect(t, b == NULL && err.code == MT_ERR_BUDGET && strstr(err.msg, "layer.7.big_tensor"),
              "32 MiB more should fail naming the tensor: %s", b ? "it succeeded" : err.msg);
    kern_free(dev, a);
    b = kern_alloc(dev, (size_t)32 << 20, "after free", &err);
    gt_expect(t, b != NULL, "after freeing, 32 MiB should fit: %s", err.msg);
    kern_free(dev, b);
    kern_device_destroy(dev);
}

static void stream_pipeline(gt_ctx_t *t) {
    kern_device_t *d = t->gpu;
    const size_t n = (size_t)1 << 22, bytes = n * 4;
    float *pin_in = kern_pinned_alloc(d, bytes), *pin_out = kern_pinned_alloc(d, bytes);
    gt_expect(t, pin_in && pin_out, "pinned allocation of 2 x %zu bytes", bytes);
    if (!pin_in || !pin_out) return;
    for (size_t i = 0; i < n; i++) pin_in[i] = (float)(i % 1000) - 500.0f;
    memset(pin_out, 0, bytes);
    mt_error_t err;
    float *buf = kern_alloc(d, bytes, "pipeline", &err), *buf2 = kern_alloc(d, bytes, "pipeline copy", &err);
    MT_CHECK(buf && buf2, "pipeline buffers: %s", err.msg);
    kern_stream_t *h2d = kern_stream(d, KERN_STREAM_H2D), *cmp = kern_stream(d, KERN_STREAM_COMPUTE);
    kern_stream_t *d2h = kern_stream(d, KERN_STREAM_D2H);
    kern_event_t *up = kern_event_create(d), *done = kern_event_create(d), *back = kern_event_create(d);
    const kern_device_stats_t s0 = kern_device_stats(d);
    volatile int mark = 0;

    kern_memcpy_h2d(d, h2d, buf, pin_in, bytes);
    kern_event_record(d, up, h2d);
    kern_stream_wait_event(d, cmp, up);
    d->ops->scale(cmp, buf, 2.0f, n);
    kern_memcpy_d2d(d, cmp, buf2, buf, bytes);
    d->ops->scale(cmp, buf2, 0.5f, n);
    kern_event_record(d, done, cmp);
    kern_stream_wait_event(d, d2h, done);
    kern_memcpy_d2h(d, d2h, pin_out, buf, bytes);
    kern_launch_host_fn(d, d2h, host_mark, (void *)&mark);
    kern_event_record(d, back, d2h);
    kern_event_sync(d, back);
    gt_expect(t, d->vt->event_query(back), "event_query after event_sync should be true");
    gt_expect(t, mark == 1, "host function ran %d times before the event after it fired", mark);
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += pin_out[i] != 2.0f * pin_in[i];
    gt_expect(t, bad == 0, "H2D -> scale -> D2H pipeline: %zu wrong elements", bad);

    kern_memcpy_d2h(d, cmp, pin_out, buf2, bytes);
    kern_stream_sync(d, cmp);
    bad = 0;
    for (size_t i = 0; i < n; i++) bad += pin_out[i] != pin_in[i];
    gt_expect(t, bad == 0, "D2D copy then scale: %zu wrong elements", bad);

    kern_memset(d, cmp, buf, 0x3c, bytes);
    kern_memcpy_d2h(d, cmp, pin_out, buf, bytes);
    kern_device_sync(d);
    const unsigned char *u = (const unsigned char *)pin_out;
    bad = 0;
    for (size_t i = 0; i < bytes; i++) bad += u[i] != 0x3c;
    gt_expect(t, bad == 0, "memset: %zu wrong bytes", bad);

    const kern_device_stats_t s1 = kern_device_stats(d);
    gt_expect(t, s1.h2d_copies - s0.h2d_copies == 1 && s1.d2h_copies - s0.d2h_copies == 3 &&
                     s1.h2d_bytes - s0.h2d_bytes == bytes,
              "copy counters: %llu h2d, %llu d2h", (unsigned long long)(s1.h2d_copies - s0.h2d_copies),
              (unsigned long long)(s1.d2h_copies - s0.d2h_copies));
    gt_expect(t, s1.pinned_in_use >= 2 * bytes, "pinned_in_use %zu", s1.pinned_in_use);
    kern_event_destroy(d, up);
    kern_event_destroy(d, done);
    kern_event_destroy(d, back);
    kern_free(d, buf);
    kern_free(d, buf2);
    kern_pinned_free(d, pin_in, bytes);
    kern_pinned_free(d, pin_out, bytes);
    printf("ok   stream pipeline, memset, d2d, counters\n");
}

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* A host function that holds its stream until the test opens it. */
static void gate_fn(void *arg) {
    while (!atomic_load((atomic_int *)arg)) sleep_s(1e-3);
}

static void *open_gate_later(void *arg) {
    sleep_s(0.1);
    atomic_store((atomic_int *)arg, 1);
    return NULL;
}

/* Stream-ordered frees: the compute stream is held by a gate with a scale
 * of buffer A and its D2H copy queued behind it; A is freed at once, then
 * an allocation of the same size is filled with zeros by an H2D copy (a
 * stream the gate does not hold).  Freed-on-issue memory would let the
 * zeros land in A before the scale reads it.  Budget 2 buffers: the new
 * one must be elsewhere; budget 1 buffer: the allocation must wait for the
 * gate (opened by a thread after 0.1 s) and still succeed. */
static void ordered_frees(gt_ctx_t *t) {
    const size_t n = (size_t)1 << 20, bytes = n * 4;
    for (int room = 2; room >= 1; room--) {
        mt_error_t err;
        kern_device_t *d = NULL;
        kern_device_opts_t o = {.device_budget_bytes = room * bytes};
        if (kern_device_create(KERN_BACKEND_CUDA, &o, &d, &err) != MT_OK) {
            gt_expect(t, false, "device with a %d-buffer budget: %s", room, err.msg);
            return;
        }
        float *pin_in = kern_pinned_alloc(d, bytes), *pin_out = kern_pinned_alloc(d, bytes);
        float *pin_zero = kern_pinned_alloc(d, bytes);
        MT_CHECK(pin_in && pin_out && pin_zero, "pinned buffers");
        for (size_t i = 0; i < n; i++) pin_in[i] = (float)(i % 977) - 400.0f;
        memset(pin_out, 0xff, bytes);
        memset(pin_zero, 0, bytes);
        kern_stream_t *cmp = kern_stream(d, KERN_STREAM_COMPUTE), *h2d = kern_stream(d, KERN_STREAM_H2D);
        float *A = kern_alloc(d, bytes, "A", &err);
        MT_CHECK(A, "A: %s", err.msg);
        kern_memcpy_h2d(d, cmp, A, pin_in, bytes);
        kern_stream_sync(d, cmp);

        atomic_int gate = 0;
        kern_launch_host_fn(d, cmp, gate_fn, &gate);
        d->ops->scale(cmp, A, 2.0f, n);
        kern_memcpy_d2h(d, cmp, pin_out, A, bytes);
        kern_free(d, A); /* issued, not run: the gate holds the compute stream */
        pthread_t opener;
        if (room == 1) MT_CHECK(pthread_create(&opener, NULL, open_gate_later, &gate) == 0, "thread");
        float *C = kern_alloc(d, bytes, "C", &err);
        const int opened = atomic_load(&gate);
        gt_expect(t, C != NULL, "budget %d buffer(s): the allocation after the free failed: %s", room,
                  C ? "" : err.msg);
        if (room == 2)
            gt_expect(t, C && ((char *)C + bytes <= (char *)A || (char *)A + bytes <= (char *)C),
                      "budget 2: the new buffer %p overlaps A %p, freed while a queued kernel reads it",
                      (void *)C, (void *)A);
        else
            gt_expect(t, opened, "budget 1: the allocation returned before the kernel using the freed block ran");
        if (C) {
            kern_memcpy_h2d(d, h2d, C, pin_zero, bytes);
            kern_stream_sync(d, h2d);
        }
        atomic_store(&gate, 1);
        if (room == 1) pthread_join(opener, NULL);
        kern_device_sync(d);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += pin_out[i] != 2.0f * pin_in[i];
        gt_expect(t, bad == 0, "budget %d: %zu elements of the scaled buffer were overwritten after its free",
                  room, bad);
        const kern_device_stats_t st = kern_device_stats(d);
        gt_expect(t, st.deferred_frees == 1 && st.device_pending == 0 && st.free_waits == (room == 1 ? 1u : 0u),
                  "budget %d: deferred %llu pending %zu waits %llu", room, (unsigned long long)st.deferred_frees,
                  st.device_pending, (unsigned long long)st.free_waits);
        kern_free(d, C);
        kern_pinned_free(d, pin_in, bytes);
        kern_pinned_free(d, pin_out, bytes);
        kern_pinned_free(d, pin_zero, bytes);
        kern_device_destroy(d);
    }
    printf("ok   stream-ordered frees (no reuse under a queued kernel; waiting allocation)\n");
}

static void nccl_checks(gt_ctx_t *t) {
    mt_error_t err;
    kern_cuda_nccl_t *nc = NULL;
    const int one[1] = {0};
    mt_status_t st = kern_cuda_nccl_create(one, 1, &nc, &err);
    gt_expect(t, st == MT_OK, "NCCL over device 0: %s", err.msg);
    if (st == MT_OK) {
        float *x = kern_alloc(t->gpu, 1024 * 4, "nccl", &err);
        float h[1024], back[1024];
        for (int i = 0; i < 1024; i++) h[i] = (float)i;
        kern_memcpy_h2d(t->gpu, t->sg, x, h, sizeof h);
        kern_stream_t *ss[1] = {t->sg};
        float *bufs[1] = {x};
        kern_cuda_nccl_allreduce_sum(nc, ss, bufs, 1024);
        kern_memcpy_d2h(t->gpu, t->sg, back, x, sizeof back);
        kern_stream_sync(t->gpu, t->sg);
        gt_expect(t, memcmp(h, back, sizeof h) == 0, "one-device all-reduce is not the identity");
        kern_free(t->gpu, x);
        kern_cuda_nccl_destroy(nc);
        printf("ok   NCCL one device\n");
    }
    const int two[2] = {0, 1};
    st = kern_cuda_nccl_create(two, 2, &nc, &err);
    if (st != MT_OK) {
        printf("note NCCL over two devices not run: %s\n", err.msg);
        return;
    }
    kern_device_opts_t o = {.device_budget_bytes = (size_t)64 << 20, .device_index = 1};
    kern_device_t *d1 = NULL;
    st = kern_device_create(KERN_BACKEND_CUDA, &o, &d1, &err);
    gt_expect(t, st == MT_OK, "second device: %s", err.msg);
    if (st == MT_OK) {
        float *x0 = kern_alloc(t->gpu, 4096, "nccl0", &err), *x1 = kern_alloc(d1, 4096, "nccl1", &err);
        float h0[1024], h1[1024], r0[1024], r1[1024];
        for (int i = 0; i < 1024; i++) h0[i] = (float)i, h1[i] = 0.5f * (float)i;
        kern_stream_t *s1 = kern_stream(d1, KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(t->gpu, t->sg, x0, h0, sizeof h0);
        kern_memcpy_h2d(d1, s1, x1, h1, sizeof h1);
        kern_stream_t *ss[2] = {t->sg, s1};
        float *bufs[2] = {x0, x1};
        kern_cuda_nccl_allreduce_sum(nc, ss, bufs, 1024);
        kern_memcpy_d2h(t->gpu, t->sg, r0, x0, sizeof r0);
        kern_memcpy_d2h(d1, s1, r1, x1, sizeof r1);
        kern_stream_sync(t->gpu, t->sg);
        kern_stream_sync(d1, s1);
        size_t bad = 0;
        for (int i = 0; i < 1024; i++) bad += r0[i] != 1.5f * (float)i || r1[i] != 1.5f * (float)i;
        gt_expect(t, bad == 0, "two-device all-reduce: %zu wrong", bad);
        kern_free(t->gpu, x0);
        kern_free(d1, x1);
        kern_device_destroy(d1);
        printf("ok   NCCL two devices\n");
    }
    kern_cuda_nccl_destroy(nc);
}

/* What a CUDA device says it can do (kern_device_caps). */
static void caps_checks(gt_ctx_t *t) {
    const kern_device_caps_t c = kern_device_caps(t->gpu);
    gt_expect(t, c.bf16_compute, "caps: a supported GPU (cc >= 8.0) has bf16 tensor cores");
    gt_expect(t, c.kernels_async, "caps: CUDA kernels run after the call returns");
    gt_expect(t, !c.device_memory_host_addressable, "caps: device memory is not host memory");
    gt_expect(t, c.copy_engines >= 1, "caps: copy_engines %d, want >= 1", c.copy_engines);
    gt_expect(t, c.host_cores == 0, "caps: host_cores %d, want 0 (CUDA pins nothing)", c.host_cores);
    gt_expect(t, kern_device_host_pool(t->gpu) == NULL, "caps: a GPU lends no host pool");
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "backend_test", 0xbac);
    caps_checks(&t);
    budget_checks(&t);
    stream_pipeline(&t);
    ordered_frees(&t);
    nccl_checks(&t);
    return gt_close(&t);
}
