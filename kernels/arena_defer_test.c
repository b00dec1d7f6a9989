/* Stream-ordered frees (arena_defer.h) with fake events, so every ordering
 * is deterministic: a fake stream counts work items issued and completed,
 * a marker records the issued count of its stream, and it has completed
 * once the stream's completed count reaches it.  A sync completes the
 * stream up to the marker, as waiting on a real event would.
 *
 * Checks: a freed block is not handed out while a stream has unfinished
 * work from before the free, and is once that work is done; frees between
 * two allocations share one epoch (one marker per stream); an allocation
 * that only pending frees can satisfy waits for the oldest epochs, no
 * more; one that cannot fit fails after releasing everything; bad and
 * double frees abort; and a randomised run against a shadow list of freed
 * blocks with the work issued before each free. */
#include "kernels/arena_defer.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static int failures;
#define EXPECT(c, ...)                                                     \
    do {                                                                   \
        if (!(c)) {                                                        \
            fprintf(stderr, "%s:%d: FAIL: %s: ", __FILE__, __LINE__, #c);  \
            fprintf(stderr, __VA_ARGS__);                                  \
            fputc('\n', stderr);                                           \
            failures++;                                                    \
        }                                                                  \
    } while (0)

enum { NS = 3 };

typedef struct {
    unsigned long long issued[NS], completed[NS];
    int live_events, records, syncs;
} fake_dev_t;

typedef struct {
    int stream;
    unsigned long long pos;
} fake_event_t;

static void *fe_create(void *ctx) {
    fake_dev_t *f = ctx;
    fake_event_t *e = calloc(1, sizeof *e);
    if (!e) abort();
    f->live_events++;
    return e;
}
static void fe_destroy(void *ctx, void *ev) {
    ((fake_dev_t *)ctx)->live_events--;
    free(ev);
}
static void fe_record(void *ctx, void *ev, int stream) {
    fake_dev_t *f = ctx;
    fake_event_t *e = ev;
    e->stream = stream;
    e->pos = f->issued[stream];
    f->records++;
}
static bool fe_query(void *ctx, void *ev) {
    const fake_dev_t *f = ctx;
    const fake_event_t *e = ev;
    return f->completed[e->stream] >= e->pos;
}
static void fe_sync(void *ctx, void *ev) {
    fake_dev_t *f = ctx;
    const fake_event_t *e = ev;
    if (f->completed[e->stream] < e->pos) f->completed[e->stream] = e->pos;
    f->syncs++;
}

static void setup(mt_arena_t *a, kern_arena_defer_t *d, fake_dev_t *f, size_t capacity) {
    memset(f, 0, sizeof *f);
    mt_arena_init(a, capacity);
    const kern_arena_defer_hooks_t h = {f, NS, fe_create, fe_destroy, fe_record, fe_query, fe_sync};
    kern_arena_defer_init(d, a, &h);
}

static void teardown(mt_arena_t *a, kern_arena_defer_t *d, fake_dev_t *f) {
    kern_arena_defer_destroy(d);
    EXPECT(f->live_events == 0, "%d markers not destroyed", f->live_events);
    mt_arena_free_all(a);
}

static void issue(fake_dev_t *f, int s) { f->issued[s]++; }
static void finish_all(fake_dev_t *f) { memcpy(f->completed, f->issued, sizeof f->issued); }

/* A block freed behind unfinished work on one stream is not reused until that work is done. */
static void test_no_reuse_while_pending(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 4096);
    size_t A, B, C;
    EXPECT(kern_arena_defer_alloc(&d, 1024, &A) && A == 0, "first block at %zu", A);
    issue(&f, 1); /* e.g. a D2H copy still reading A */
    kern_arena_defer_free(&d, A);
    EXPECT(a.in_use == 1024 && d.pending_bytes == 1024, "a pending block stays in use: %zu / %zu", a.in_use,
           d.pending_bytes);
    EXPECT(kern_arena_defer_alloc(&d, 1024, &B) && B != A, "reused the pending block at %zu", B);
    EXPECT(f.syncs == 0 && d.waits == 0, "room elsewhere: no wait expected (%d syncs)", f.syncs);
    EXPECT(kern_arena_defer_alloc(&d, 1024, &C) && C != A, "still pending, yet reused at %zu", C);
    finish_all(&f);
    size_t D;
    EXPECT(kern_arena_defer_alloc(&d, 1024, &D) && D == A, "completed block not reused: got %zu, want %zu", D, A);
    EXPECT(d.pending_bytes == 0 && a.in_use == 3072, "after reuse: pending %zu in use %zu", d.pending_bytes, a.in_use);
    teardown(&a, &d, &f);
}

/* Frees between two allocations share one epoch: one marker per stream. */
static void test_epoch_batching(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 1 << 16);
    size_t o[8];
    for (int i = 0; i < 8; i++) EXPECT(kern_arena_defer_alloc(&d, 512, &o[i]), "alloc %d", i);
    EXPECT(f.records == 0 && d.epochs == 0, "allocations without frees recorded %d markers", f.records);
    for (int i = 0; i < 5; i++) kern_arena_defer_free(&d, o[i]);
    EXPECT(f.records == 0, "markers are recorded by the next allocation, not by each free (%d)", f.records);
    size_t x;
    EXPECT(kern_arena_defer_alloc(&d, 512, &x), "alloc after frees");
    EXPECT(f.records == NS && d.epochs == 1, "5 frees: %d markers, %llu epochs; want %d and 1", f.records,
           (unsigned long long)d.epochs, NS);
    EXPECT(d.pending_bytes == 0, "idle streams: the epoch completes at once (pending %zu)", d.pending_bytes);
    /* reused markers: a second epoch creates no new events */
    const int live = f.live_events;
    kern_arena_defer_free(&d, o[5]);
    EXPECT(kern_arena_defer_alloc(&d, 512, &x), "alloc");
    EXPECT(f.live_events == live, "markers not reused: %d live, was %d", f.live_events, live);
    teardown(&a, &d, &f);
}

/* Only pending frees can satisfy the request: it waits, oldest epoch first, no further than needed. */
static void test_wait_for_pending(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 4096);
    size_t p[4];
    for (int i = 0; i < 4; i++) kern_arena_defer_alloc(&d, 1024, &p[i]);
    issue(&f, 0);
    kern_arena_defer_free(&d, p[0]);
    size_t tmp;
    kern_arena_defer_close(&d); /* epoch 1: p[0] */
    issue(&f, 2);
    kern_arena_defer_free(&d, p[1]); /* epoch 2 (open): p[1] */
    EXPECT(!kern_arena_defer_poll(&d), "nothing has completed");
    EXPECT(kern_arena_defer_alloc(&d, 1024, &tmp) && tmp == p[0], "wanted the oldest epoch's block %zu, got %zu",
           p[0], tmp);
    EXPECT(d.waits == 1 && f.syncs == NS, "one wait on one epoch: %llu waits, %d syncs",
           (unsigned long long)d.waits, f.syncs);
    EXPECT(d.pending_bytes == 1024, "epoch 2 still pending: %zu", d.pending_bytes);
    /* a request larger than anything but the whole arena waits for everything, then fails cleanly */
    EXPECT(!kern_arena_defer_alloc(&d, 8192, &tmp), "8 KiB in a 4 KiB arena");
    EXPECT(d.pending_bytes == 0 && d.count == 0, "a failing allocation releases every pending block first");
    teardown(&a, &d, &f);
}

/* Later epochs are held back by an earlier incomplete one (streams complete in order). */
static void test_in_order(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 1 << 14);
    size_t p[3], x;
    for (int i = 0; i < 3; i++) kern_arena_defer_alloc(&d, 1024, &p[i]);
    issue(&f, 1);
    kern_arena_defer_free(&d, p[0]);
    kern_arena_defer_alloc(&d, 256, &x); /* closes epoch 1 behind stream 1's work */
    kern_arena_defer_free(&d, p[1]);
    kern_arena_defer_close(&d); /* epoch 2: its stream-1 marker is behind the same work */
    EXPECT(!kern_arena_defer_poll(&d) && d.pending_bytes == 2048, "pending %zu", d.pending_bytes);
    f.completed[1] = f.issued[1];
    EXPECT(kern_arena_defer_poll(&d) && d.pending_bytes == 0, "both epochs complete: pending %zu", d.pending_bytes);
    /* release_all after the caller synchronised: everything back, open epoch included */
    issue(&f, 0);
    kern_arena_defer_free(&d, p[2]);
    kern_arena_defer_free(&d, x);
    kern_arena_defer_release_all(&d);
    EXPECT(a.in_use == 0 && d.pending_bytes == 0 && !d.open, "after release_all: in use %zu", a.in_use);
    teardown(&a, &d, &f);
}

static jmp_buf g_jmp;
static void fatal_to_longjmp(const char *msg) {
    (void)msg;
    longjmp(g_jmp, 1);
}

static void test_bad_frees(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 4096);
    size_t p;
    kern_arena_defer_alloc(&d, 1024, &p);
    kern_arena_defer_free(&d, p);
    volatile int fatal = 0;
    mt_set_fatal_hook(fatal_to_longjmp);
    if (setjmp(g_jmp) == 0) kern_arena_defer_free(&d, p); /* double free while pending */
    else fatal++;
    if (setjmp(g_jmp) == 0) kern_arena_defer_free(&d, 2048 + 256); /* not a block */
    else fatal++;
    mt_set_fatal_hook(NULL);
    EXPECT(fatal == 2, "double free and bad free must be fatal (%d of 2)", fatal);
    EXPECT(d.pending_bytes == 1024, "queue intact after the fatals: %zu", d.pending_bytes);
    teardown(&a, &d, &f);
}

/* Random allocations, frees, stream work and completions.  Every freed
 * block is remembered with the work issued on each stream when it was
 * freed; whenever an allocation overlaps it, that work must be done. */
static void test_random(void) {
    mt_arena_t a;
    kern_arena_defer_t d;
    fake_dev_t f;
    setup(&a, &d, &f, 1 << 18);
    enum { N = 48, MAXF = 4096 };
    size_t off[N], sz[N];
    int live[N] = {0};
    struct {
        size_t off, size;
        unsigned long long need[NS];
    } freed[MAXF];
    int nfreed = 0;
    srand(11);
    for (int it = 0; it < 40000 && !failures; it++) {
        const int r = rand() % 10;
        if (r < 3) {
            issue(&f, rand() % NS);
        } else if (r == 3) {
            const int s = rand() % NS; /* a stream catches up part of the way */
            f.completed[s] += (f.issued[s] - f.completed[s] + 1) / 2;
        } else {
            const int i = rand() % N;
            if (live[i]) {
                kern_arena_defer_free(&d, off[i]);
                live[i] = 0;
                if (nfreed < MAXF) {
                    freed[nfreed].off = off[i];
                    freed[nfreed].size = sz[i];
                    memcpy(freed[nfreed].need, f.issued, sizeof f.issued);
                    nfreed++;
                }
            } else {
                const size_t want = (size_t)(rand() % 30000) + 1;
                if (kern_arena_defer_alloc(&d, want, &off[i])) {
                    sz[i] = (want + 255) & ~(size_t)255;
                    live[i] = 1;
                    int keep = 0;
                    for (int k = 0; k < nfreed; k++) {
                        const bool overlap = freed[k].off < off[i] + sz[i] && off[i] < freed[k].off + freed[k].size;
                        if (overlap)
                            for (int s = 0; s < NS; s++)
                                EXPECT(f.completed[s] >= freed[k].need[s],
                                       "iteration %d: [%zu, +%zu) handed out while stream %d has done %llu of the "
                                       "%llu items issued before [%zu, +%zu) was freed",
                                       it, off[i], sz[i], s, f.completed[s], freed[k].need[s], freed[k].off,
                                       freed[k].size);
                        bool done = true; /* can no longer be handed out too early */
                        for (int s = 0; s < NS; s++) done &= f.completed[s] >= freed[k].need[s];
                        if (!overlap && !done) freed[keep++] = freed[k];
                    }
                    nfreed = keep;
                }
            }
        }
        size_t total = 0;
        for (int j = 0; j < N; j++) total += live[j] ? sz[j] : 0;
        EXPECT(a.in_use == total + d.pending_bytes, "in use %zu != live %zu + pending %zu", a.in_use, total,
               d.pending_bytes);
    }
    printf("random: %llu frees in %llu epochs, %llu allocations waited, pending peak %zu bytes\n",
           (unsigned long long)d.frees, (unsigned long long)d.epochs, (unsigned long long)d.waits, d.pending_peak);
    EXPECT(d.waits > 0 && d.epochs > 8, "the run should exercise waits and ring growth");
    finish_all(&f);
    for (int j = 0; j < N; j++)
        if (live[j]) kern_arena_defer_free(&d, off[j]);
    kern_arena_defer_release_all(&d);
    EXPECT(a.in_use == 0 && a.nblocks == 1, "everything back: in use %zu, %d blocks", a.in_use, a.nblocks);
    teardown(&a, &d, &f);
}

int main(void) {
    test_no_reuse_while_pending();
    test_epoch_batching();
    test_wait_for_pending();
    test_in_order();
    test_bad_frees();
    test_random();
    if (failures) {
        fprintf(stderr, "arena_defer_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("arena_defer_test: all checks passed\n");
    return 0;
}
