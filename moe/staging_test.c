/* Tests of the staging pool (moe/staging.h) on the CPU backend:
 *  - the slab sub-allocator never overlaps, stays aligned and coalesces
 *    (randomised, both fits);
 *  - pool regions of every mode never overlap (pattern check, randomised);
 *  - backpressure: a 2 MiB pool with throttled copies makes a third 1 MiB
 *    reservation wait for the first copy, without growing;
 *  - H2D / D2H batches are bit-identical round trips in every mode, with
 *    and without the pack thread, contiguous and scattered device ranges,
 *    and never write device bytes outside the items (sentinels);
 *  - compact on a realistic window reserves <= 1.10x the payload with
 *    waste <= 10% and moves each layer in at most 3 copies;
 *  - per_tensor rounds to pages or (pow2_round) powers of two; raw copies
 *    into a held region are counted; slab_bytes alone sets the slab count.
 * Sizing, settings and the profiler's writers: staging_report_test.c. */
#include "moe/staging.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/staging_alloc.h"
#include "moe/staging_testutil.h"
#include "base/clock.h"
#include "base/dtype.h"

static int g_failures;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull; /* test-local: deterministic inputs */
static uint64_t rnd(void) { /* xorshift64* */
    g_rng ^= g_rng >> 12;
    g_rng ^= g_rng << 25;
    g_rng ^= g_rng >> 27;
    return g_rng * 2685821657736338717ull;
}
static size_t rnd_in(size_t lo, size_t hi) { return lo + (size_t)(rnd() % (hi - lo + 1)); }

/* ---- sub-allocator -------------------------------------------------------- */

static void test_alloc_random(void) {
    for (int fit = 0; fit < 2; fit++) {
        const size_t align = fit ? 64 : 256;
        moe_salloc_t a;
        moe_salloc_init(&a, (size_t)1 << 20, align, (moe_staging_fit_t)fit);
        enum { MAXLIVE = 200 };
        size_t off[MAXLIVE], len[MAXLIVE];
        int live = 0;
        char why[256];
        for (int it = 0; it < 20000; it++) {
            const int op = (int)(rnd() % 10);
            if (op < 5 && live < MAXLIVE) {
                const size_t want = rnd_in(1, 40000);
                size_t o;
                if (moe_salloc_alloc(&a, want, &o)) {
                    EXPECT(o % align == 0, "offset %zu not aligned to %zu", o, align);
                    EXPECT(moe_salloc_size(&a, o) >= want && moe_salloc_size(&a, o) < want + align,
                           "block of %zu bytes for a %zu-byte request (align %zu): rounding beyond the alignment",
                           moe_salloc_size(&a, o), want, align);
                    for (int k = 0; k < live; k++)
                        EXPECT(o + want <= off[k] || off[k] + len[k] <= o,
                               "new block [%zu,+%zu) overlaps live [%zu,+%zu)", o, want, off[k], len[k]);
                    off[live] = o, len[live] = want, live++;
                } else {
                    EXPECT(moe_salloc_largest_free(&a) < ((want + align - 1) & ~(align - 1)),
                           "alloc of %zu failed with a free block of %zu", want, moe_salloc_largest_free(&a));
                }
            } else if (op < 7 && live > 0) {
                const int k = (int)(rnd() % (size_t)live);
                const size_t keep = rnd_in(1, len[k]);
                moe_salloc_shrink(&a, off[k], keep);
                len[k] = keep;
            } else if (live > 0) {
                const int k = (int)(rnd() % (size_t)live);
                moe_salloc_release(&a, off[k]);
                off[k] = off[live - 1], len[k] = len[live - 1], live--;
            }
            if (!moe_salloc_check(&a, why, sizeof why)) {
                EXPECT(false, "sub-allocator invariant broken after op %d: %s", it, why);
                break;
            }
        }
        while (live > 0) moe_salloc_release(&a, off[--live]);
        EXPECT(a.n == 1 && a.in_use == 0 && moe_salloc_largest_free(&a) == a.capacity,
               "after freeing everything: %d blocks, %zu in use (free space not coalesced)", a.n, a.in_use);
        moe_salloc_free_all(&a);
    }
}

/* ---- regions through the pool ---------------------------------------------- */

static void test_pool_regions_random(void) {
    kern_device_t *dev = staging_test_device((size_t)8 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++) {
        moe_staging_t *p = staging_test_pool(dev, (moe_staging_mode_t)mode, (size_t)1 << 20, 64 << 10, false);
        enum { MAXLIVE = 64 };
        moe_staging_region_t r[MAXLIVE];
        unsigned char tag[MAXLIVE];
        int live = 0;
        mt_error_t err = {0};
        for (int it = 0; it < 1500; it++) {
            if (live < MAXLIVE && rnd() % 3 != 0) {
                const size_t want = rnd_in(1, 64 << 10);
                moe_staging_region_t x;
                mt_status_t st = moe_staging_reserve(p, want, "random region", &x, &err);
                if (st == MT_ERR_BUDGET) { /* full and nothing pending: hand some back */
                    while (live > 0) moe_staging_release_after(p, &r[--live], h2d);
                    continue;
                }
                EXPECT(st == MT_OK, "%s reserve: %s", moe_staging_mode_name(mode), err.msg);
                if (st != MT_OK) break;
                const size_t a = mode == MOE_STAGING_COMPACT ? MOE_STAGING_DEFAULT_ALIGN : MOE_STAGING_PAGE;
                EXPECT((uintptr_t)x.host % a == 0, "%s region %p not aligned to %zu", moe_staging_mode_name(mode),
                       x.host, a);
                EXPECT(x.bytes == want, "region of %zu bytes for %zu", x.bytes, want);
                tag[live] = (unsigned char)(it * 7 + 1);
                memset(x.host, tag[live], x.bytes);
                r[live++] = x;
            } else if (live > 0) {
                const int k = (int)(rnd() % (size_t)live);
                /* the pattern survives: no other live region overlapped it */
                const unsigned char *b = r[k].host;
                size_t bad = r[k].bytes;
                for (size_t j = 0; j < r[k].bytes && bad == r[k].bytes; j++)
                    if (b[j] != tag[k]) bad = j;
                EXPECT(bad == r[k].bytes, "%s: byte %zu of a live region was overwritten (overlap)",
                       moe_staging_mode_name(mode), bad);
                if (rnd() % 2) moe_staging_release_now(p, &r[k]);
                else moe_staging_release_after(p, &r[k], h2d);
                r[k] = r[live - 1];
                tag[k] = tag[live - 1];
                live--;
            }
        }
        while (live > 0) moe_staging_release_now(p, &r[--live]);
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        EXPECT(s.peak_reserved <= s.capacity, "%s grew past its capacity: %zu > %zu", moe_staging_mode_name(mode),
               s.peak_reserved, s.capacity);
        moe_staging_destroy(p);
    }
    EXPECT(kern_device_stats(dev).pinned_in_use == 0, "pinned memory left after destroying the pools: %zu bytes",
           kern_device_stats(dev).pinned_in_use);
    kern_device_destroy(dev);
}

/* ---- backpressure --------------------------------------------------------- */

static void test_backpressure(void) {
    const size_t MiB = (size_t)1 << 20;
    /* 100 MB/s: each 1 MiB copy takes >= 10 ms on the throttled link */
    kern_device_t *dev = staging_test_device(8 * MiB, 100e6, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    char *dst = kern_alloc(dev, 3 * MiB, "backpressure target", NULL);
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++) {
        const char *mn = moe_staging_mode_name(mode);
        const size_t pinned_before = kern_device_stats(dev).pinned_in_use;
        moe_staging_t *p = staging_test_pool(dev, (moe_staging_mode_t)mode, 2 * MiB, MiB, false);
        mt_error_t err = {0};
        moe_staging_region_t a, b, c;
        kern_event_t *a_done = kern_event_create(dev);
        EXPECT(moe_staging_reserve(p, MiB, "A", &a, &err) == MT_OK, "%s A: %s", mn, err.msg);
        void *a_host = a.host;
        kern_memcpy_h2d(dev, h2d, dst, a.host, MiB);
        kern_event_record(dev, a_done, h2d);
        moe_staging_release_after(p, &a, h2d);
        EXPECT(moe_staging_reserve(p, MiB, "B", &b, &err) == MT_OK, "%s B: %s", mn, err.msg);
        kern_memcpy_h2d(dev, h2d, dst + MiB, b.host, MiB);
        moe_staging_release_after(p, &b, h2d);
        const double t0 = mt_now_s();
        EXPECT(moe_staging_reserve(p, MiB, "C", &c, &err) == MT_OK, "%s C: %s", mn, err.msg);
        const double waited = mt_now_s() - t0;
        EXPECT(kern_event_query(dev, a_done), "%s: the third reservation returned before the first copy completed",
               mn);
        EXPECT(c.host == a_host, "%s: the third reservation did not reuse the first one's space", mn);
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        EXPECT(s.waits == 1, "%s: %llu waits counted, expected 1", mn, (unsigned long long)s.waits);
        /* lower bound only (a loaded machine makes copies slower, never faster):
         * A's 10 ms copy had barely started when C asked */
        EXPECT(s.wait_s > 0.004 && waited > 0.004, "%s: waited %.4f s (counted %.4f s), expected > 4 ms", mn,
               waited, s.wait_s);
        EXPECT(s.peak_reserved == 2 * MiB, "%s: peak reserved %zu bytes, expected the 2 MiB pool (no growth)", mn,
               s.peak_reserved);
        EXPECT(kern_device_stats(dev).pinned_peak - pinned_before <= 2 * MiB,
               "%s: the device saw %zu pinned bytes for a 2 MiB pool (the pool grew)", mn,
               kern_device_stats(dev).pinned_peak - pinned_before);
        moe_staging_release_now(p, &c);
        kern_event_destroy(dev, a_done);
        kern_stream_sync(dev, h2d);
        moe_staging_destroy(p);
    }
    kern_free(dev, dst);
    kern_device_destroy(dev);
}

/* per_tensor's two granularities, and a region kept across raw copies
 * (activations held from forward to backward), counted like batches. */
static void test_per_tensor_rounding_and_raw_copies(void) {
    kern_device_t *dev = staging_test_device((size_t)8 << 20, 0, 0);
    const size_t MiB = (size_t)1 << 20, req = 3 * MiB + 1;
    for (int pow2 = 0; pow2 < 2; pow2++) {
        moe_staging_opts_t o;
        moe_staging_opts_init(&o, MOE_STAGING_PER_TENSOR);
        o.capacity_bytes = 16 * MiB;
        o.max_tensor_bytes = 4 * MiB;
        o.pow2_round = pow2;
        moe_staging_t *p = NULL;
        mt_error_t err = {0};
        EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "%s", err.msg);
        if (!p) continue;
        moe_staging_region_t r;
        EXPECT(moe_staging_reserve(p, req, "activation", &r, &err) == MT_OK, "%s", err.msg);
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        const size_t want = pow2 ? 4 * MiB : 3 * MiB + 4096; /* next power of two, or the next page */
        EXPECT(s.peak_in_use == want && s.peak_reserved == want, "pow2_round %d: %zu bytes pinned for %zu, expected %zu",
               pow2, s.peak_in_use, req, want);
        char *d = kern_alloc(dev, 4096, "activation", NULL);
        memset(r.host, 7, 4096);
        kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
        moe_staging_copy_h2d(p, h2d, d, &r, 0, 4096);
        kern_stream_sync(dev, h2d);
        moe_staging_copy_d2h(p, d2h, &r, 8192, d, 4096);
        kern_stream_sync(dev, d2h);
        EXPECT(((unsigned char *)r.host)[8192 + 4095] == 7, "raw copies did not round-trip");
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        EXPECT(s.copies[0] == 1 && s.copies[1] == 1 && s.bytes[0] == 4096 && s.bytes[1] == 4096,
               "raw copies not counted: %llu/%llu", (unsigned long long)s.copies[0], (unsigned long long)s.copies[1]);
        moe_staging_release_after(p, &r, d2h);
        kern_free(dev, d);
        moe_staging_destroy(p);
    }
    /* slab_bytes alone: as many slabs as the capacity needs */
    moe_staging_opts_t o;
    moe_staging_opts_init(&o, MOE_STAGING_COMPACT);
    o.capacity_bytes = 5 * MiB;
    o.slab_bytes = 2 * MiB;
    o.max_tensor_bytes = MiB;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "%s", err.msg);
    if (p) {
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        EXPECT(s.capacity == 6 * MiB, "5 MiB in 2 MiB slabs should give 3 slabs, got %zu bytes", s.capacity);
        moe_staging_region_t r;
        err = (mt_error_t){0};
        EXPECT(moe_staging_reserve(p, 3 * MiB, "spanning", &r, &err) == MT_ERR_BUDGET && strstr(err.msg, "slab"),
               "a region larger than a slab must be refused: %s", err.msg);
        moe_staging_destroy(p);
    }
    kern_device_destroy(dev);
}

static void test_full_without_pending(void) {
    kern_device_t *dev = staging_test_device((size_t)4 << 20, 0, 0);
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++) {
        const char *mn = moe_staging_mode_name(mode);
        moe_staging_t *p = staging_test_pool(dev, (moe_staging_mode_t)mode, 256 << 10, 128 << 10, false);
        mt_error_t err = {0};
        moe_staging_region_t a, b, c;
        EXPECT(moe_staging_reserve(p, 128 << 10, "first", &a, &err) == MT_OK, "%s: %s", mn, err.msg);
        EXPECT(moe_staging_reserve(p, 128 << 10, "second", &b, &err) == MT_OK, "%s: %s", mn, err.msg);
        err = (mt_error_t){0};
        EXPECT(moe_staging_reserve(p, 100 << 10, "third tensor", &c, &err) == MT_ERR_BUDGET &&
                   strstr(err.msg, "nothing is pending") && strstr(err.msg, "third tensor"),
               "%s: a full pool with nothing pending should fail naming the tensor, got %d: %s", mn, err.code,
               err.msg);
        err = (mt_error_t){0};
        EXPECT(moe_staging_reserve(p, 1 << 20, "huge tensor", &c, &err) == MT_ERR_BUDGET &&
                   strstr(err.msg, "huge tensor"),
               "%s: a tensor larger than the pool should fail naming it: %s", mn, err.msg);
        moe_staging_release_now(p, &a);
        moe_staging_release_now(p, &b);
        moe_staging_destroy(p);
    }
    kern_device_destroy(dev);
}

/* ---- data integrity ------------------------------------------------------- */

typedef struct {
    int n;
    size_t *bytes;
    float **src, **back, **acc, **ref;
    void **dev;
    void *span;       /* contiguous layout: one device block */
    void **others;    /* scattered layout: sentinel tensors between the items */
    int nothers;
} case_t;

enum { SENTINEL = 0x5a };

static void fill_random(float *x, size_t bytes) {
    for (size_t k = 0; k < bytes / sizeof(float); k++) x[k] = (float)((double)(rnd() >> 11) / 9007199254740992.0 - 0.5);
}

static void case_make(kern_device_t *dev, case_t *c, int n, bool contiguous) {
    memset(c, 0, sizeof *c);
    c->n = n;
    c->bytes = calloc((size_t)n, sizeof *c->bytes);
    c->src = calloc((size_t)n, sizeof *c->src);
    c->back = calloc((size_t)n, sizeof *c->back);
    c->acc = calloc((size_t)n, sizeof *c->acc);
    c->ref = calloc((size_t)n, sizeof *c->ref);
    c->dev = calloc((size_t)n, sizeof *c->dev);
    c->others = calloc((size_t)n, sizeof *c->others);
    size_t *off = calloc((size_t)n, sizeof *off);
    MT_CHECK(c->bytes && c->src && c->back && c->acc && c->ref && c->dev && c->others && off, "test memory");
    for (int k = 0; k < n; k++) {
        /* mostly expert-sized, some tiny (norms), some odd sizes (not multiples of the alignment) */
        const int kind = (int)(rnd() % 4);
        c->bytes[k] = 4 * (kind == 0 ? rnd_in(1, 64) : kind == 1 ? rnd_in(1000, 24000) : 24576);
        c->src[k] = malloc(c->bytes[k]);
        c->back[k] = malloc(c->bytes[k]);
        c->acc[k] = malloc(c->bytes[k]);
        c->ref[k] = malloc(c->bytes[k]);
        MT_CHECK(c->src[k] && c->back[k] && c->acc[k] && c->ref[k], "test memory");
        fill_random(c->src[k], c->bytes[k]);
        fill_random(c->acc[k], c->bytes[k]);
        for (size_t j = 0; j < c->bytes[k] / 4; j++) c->ref[k][j] = c->acc[k][j] + c->src[k][j];
    }
    kern_stream_t *cs = kern_stream(dev, KERN_STREAM_COMPUTE);
    if (contiguous) {
        const size_t span = moe_staging_layout(c->bytes, n, MT_ARENA_ALIGN, off);
        c->span = kern_alloc(dev, span, "test span", NULL);
        MT_CHECK(c->span, "test span");
        kern_memset(dev, cs, c->span, SENTINEL, span);
        for (int k = 0; k < n; k++) c->dev[k] = (char *)c->span + off[k];
    } else {
        for (int k = 0; k < n; k++) {
            c->dev[k] = kern_alloc(dev, c->bytes[k], "test tensor", NULL);
            MT_CHECK(c->dev[k], "test tensor");
            if (rnd() % 3 == 0) { /* a neighbour that is not part of the batch */
                c->others[c->nothers] = kern_alloc(dev, 1000, "sentinel tensor", NULL);
                MT_CHECK(c->others[c->nothers], "sentinel");
                kern_memset(dev, cs, c->others[c->nothers++], SENTINEL, 1000);
            }
        }
    }
    kern_stream_sync(dev, cs);
    free(off);
}

static void case_free(kern_device_t *dev, case_t *c) {
    for (int k = 0; k < c->n; k++) {
        free(c->src[k]);
        free(c->back[k]);
        free(c->acc[k]);
        free(c->ref[k]);
        if (!c->span) kern_free(dev, c->dev[k]);
    }
    for (int k = 0; k < c->nothers; k++) kern_free(dev, c->others[k]);
    if (c->span) kern_free(dev, c->span);
    free(c->bytes);
    free(c->src);
    free(c->back);
    free(c->acc);
    free(c->ref);
    free(c->dev);
    free(c->others);
}

static void test_integrity(void) {
    kern_device_t *dev = staging_test_device((size_t)64 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++)
        for (int thread = 0; thread < 2; thread++)
            for (int contiguous = 0; contiguous < 2; contiguous++) {
                const char *mn = moe_staging_mode_name(mode);
                case_t c;
                const int n = 150;
                case_make(dev, &c, n, contiguous);
                /* small pool: batches are chunked and wait for space; compact with one slab,
                 * or three (a batch then also breaks at slab ends) */
                moe_staging_t *p = staging_test_pool_slabs(dev, (moe_staging_mode_t)mode,
                                                   mode == MOE_STAGING_MAX_SLOT ? 16 * 98304 : 320 << 10, 98304, thread,
                                                   thread ? 3 : MOE_STAGING_SLABS_AUTO);
                moe_staging_xfer_t *it = calloc((size_t)n, sizeof *it);
                MT_CHECK_ALLOC(it, "items");
                const moe_staging_batch_t b = {"integrity batch", MT_ARENA_ALIGN};
                mt_error_t err = {0};
                for (int k = 0; k < n; k++) it[k] = (moe_staging_xfer_t){c.src[k], c.dev[k], c.bytes[k], MOE_STAGING_COPY};
                mt_status_t st = moe_staging_h2d_batch(p, h2d, it, n, &b, &err);
                EXPECT(st == MT_OK, "%s h2d: %s", mn, err.msg);
                /* the D2H stream reads what H2D wrote */
                kern_event_t *ev = kern_event_create(dev);
                kern_event_record(dev, ev, h2d);
                kern_stream_wait_event(dev, d2h, ev);
                for (int k = 0; k < n; k++) it[k] = (moe_staging_xfer_t){c.back[k], c.dev[k], c.bytes[k], MOE_STAGING_COPY};
                st = moe_staging_d2h_batch(p, d2h, it, n, &b, &err);
                EXPECT(st == MT_OK, "%s d2h: %s", mn, err.msg);
                for (int k = 0; k < n; k++) it[k] = (moe_staging_xfer_t){c.acc[k], c.dev[k], c.bytes[k], MOE_STAGING_ADD_F32};
                st = moe_staging_d2h_batch(p, d2h, it, n, &b, &err);
                EXPECT(st == MT_OK, "%s d2h add: %s", mn, err.msg);
                kern_stream_sync(dev, d2h);
                int bad = 0;
                for (int k = 0; k < n; k++) {
                    bad += memcmp(c.back[k], c.src[k], c.bytes[k]) != 0;
                    bad += memcmp(c.acc[k], c.ref[k], c.bytes[k]) != 0;
                }
                EXPECT(bad == 0, "%s (thread %d, contiguous %d): %d tensors differ after the round trip", mn, thread,
                       contiguous, bad);
                /* nothing outside the items was written on the device */
                unsigned char probe[1000];
                for (int k = 0; k < c.nothers; k++) {
                    kern_memcpy_d2h(dev, d2h, probe, c.others[k], sizeof probe);
                    kern_stream_sync(dev, d2h);
                    int clobbered = 0;
                    for (size_t j = 0; j < sizeof probe; j++) clobbered += probe[j] != SENTINEL;
                    EXPECT(clobbered == 0, "%s: %d bytes of a neighbouring device tensor were overwritten", mn,
                           clobbered);
                }
                moe_staging_stats_t s;
                moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
                EXPECT(s.tensors[0] == (uint64_t)n && s.tensors[1] == 2 * (uint64_t)n, "%s: tensors counted %llu/%llu",
                       mn, (unsigned long long)s.tensors[0], (unsigned long long)s.tensors[1]);
                /* compact: a chunk per slab-sized piece (>= half a slab each, slabs >= 106 KiB here),
                 * plus a copy per break in the device ranges when scattered */
                size_t total = 0;
                for (int k = 0; k < n; k++) total += c.bytes[k];
                const uint64_t chunks = 2 * total / (106 << 10) + 3;
                if (mode == MOE_STAGING_COMPACT)
                    EXPECT(contiguous ? s.copies[0] <= chunks : s.copies[0] < (uint64_t)n,
                           "compact (contiguous %d) issued %llu H2D copies for %d tensors (%zu bytes): not coalesced",
                           contiguous, (unsigned long long)s.copies[0], n, total);
                else
                    EXPECT(s.copies[0] == (uint64_t)n, "%s issued %llu H2D copies for %d tensors (one each expected)",
                           mn, (unsigned long long)s.copies[0], n);
                EXPECT(s.peak_reserved <= s.capacity, "%s grew: %zu > %zu", mn, s.peak_reserved, s.capacity);
                kern_event_destroy(dev, ev);
                free(it);
                moe_staging_destroy(p);
                case_free(dev, &c);
            }
    kern_device_destroy(dev);
}

/* Several pack threads on one job: tensors larger than a pack piece (4 MiB)
 * are cut and packed by three threads at once, copies and fp32-to-bf16
 * conversions alike; what reaches the device is what one thread makes. */
static void test_pack_threads(void) {
    kern_device_t *dev = staging_test_device((size_t)96 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    enum { N = 4 };
    const size_t elems[N] = {(size_t)3 << 20, 5, (size_t)2 << 20, ((size_t)5 << 20) + 3}; /* floats */
    const moe_staging_op_t ops[N] = {MOE_STAGING_COPY, MOE_STAGING_COPY, MOE_STAGING_F32_TO_BF16,
                                     MOE_STAGING_F32_TO_BF16};
    moe_staging_opts_t o;
    moe_staging_opts_init(&o, MOE_STAGING_COMPACT);
    o.capacity_bytes = (size_t)48 << 20;
    o.max_tensor_bytes = (size_t)24 << 20;
    o.pack_threads = 3;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "pool: %s", err.msg);
    float *src[N];
    void *d[N], *back[N];
    moe_staging_xfer_t it[N];
    for (int k = 0; k < N; k++) {
        const size_t out = elems[k] * (ops[k] == MOE_STAGING_F32_TO_BF16 ? 2 : 4);
        src[k] = malloc(elems[k] * sizeof(float));
        back[k] = malloc(out);
        MT_CHECK(src[k] && back[k], "test buffers");
        for (size_t i = 0; i < elems[k]; i++) src[k][i] = (float)((i * 2654435761u + (unsigned)k) % 100003) * 1e-3f - 50.0f;
        d[k] = kern_alloc(dev, out, "pack test tensor", &err);
        EXPECT(d[k] != NULL, "%s", err.msg);
        it[k] = (moe_staging_xfer_t){src[k], d[k], out, ops[k]};
    }
    const moe_staging_batch_t b = {"pack threads batch", MT_ARENA_ALIGN};
    EXPECT(moe_staging_h2d_batch(p, h2d, it, N, &b, &err) == MT_OK, "h2d: %s", err.msg);
    kern_stream_sync(dev, h2d);
    for (int k = 0; k < N; k++) {
        kern_memcpy_d2h(dev, d2h, back[k], d[k], it[k].bytes);
        kern_stream_sync(dev, d2h);
        size_t bad = 0;
        if (ops[k] == MOE_STAGING_COPY) {
            bad = memcmp(back[k], src[k], it[k].bytes) != 0;
        } else {
            const uint16_t *h = back[k];
            for (size_t i = 0; i < elems[k]; i++) bad += h[i] != mt_f32_to_bf16(src[k][i]);
        }
        EXPECT(bad == 0, "tensor %d (%zu floats, %s): %zu wrong", k, elems[k],
               ops[k] == MOE_STAGING_COPY ? "copy" : "to bf16", bad);
    }
    /* back through the pool on the same threads: a copy, then a gradient
     * add into a host accumulator, each cut into pieces three threads share;
     * the adds must give the bits of a serial loop */
    for (int k = 0; k < N; k++) {
        if (ops[k] != MOE_STAGING_COPY) continue; /* the fp32 tensors */
        const size_t n = elems[k];
        float *acc = malloc(n * sizeof *acc), *ref = malloc(n * sizeof *ref);
        MT_CHECK(acc && ref, "test buffers");
        for (size_t i = 0; i < n; i++) acc[i] = ref[i] = (float)(i % 977) * 0.37f - 11.0f;
        for (size_t i = 0; i < n; i++) ref[i] += src[k][i];
        memset(back[k], 0, it[k].bytes);
        const moe_staging_xfer_t copy = {back[k], d[k], it[k].bytes, MOE_STAGING_COPY};
        const moe_staging_xfer_t add = {acc, d[k], it[k].bytes, MOE_STAGING_ADD_F32};
        EXPECT(moe_staging_d2h_batch(p, d2h, &copy, 1, &b, &err) == MT_OK, "d2h: %s", err.msg);
        EXPECT(moe_staging_d2h_batch(p, d2h, &add, 1, &b, &err) == MT_OK, "d2h add: %s", err.msg);
        kern_stream_sync(dev, d2h);
        EXPECT(memcmp(back[k], src[k], it[k].bytes) == 0, "tensor %d: copied back wrong", k);
        EXPECT(memcmp(acc, ref, n * sizeof *acc) == 0, "tensor %d: gradient add differs from a serial add", k);
        free(acc);
        free(ref);
    }
    for (int k = 0; k < N; k++) {
        kern_free(dev, d[k]);
        free(src[k]);
        free(back[k]);
    }
    moe_staging_destroy(p);
    kern_device_destroy(dev);
}

/* Gradient batches of many groups (each group unpacks on the unpack stream
 * while the D2H stream copies the next): a copy, then two adds into the
 * same destinations in consecutive batches, give a serial loop's bits and
 * are complete once the D2H stream passes the last batch.  A pinned host
 * tensor among staged ones is copied from (H2D) or into (D2H) where it is
 * and lands like the others. */
static void test_unpack_stream_and_pinned(void) {
    kern_device_t *dev = staging_test_device((size_t)64 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    enum { N = 24, ELEMS = 1 << 18 }; /* 1 MiB each: several 2 MiB groups per batch */
    moe_staging_opts_t o;
    moe_staging_opts_init(&o, MOE_STAGING_COMPACT);
    o.capacity_bytes = (size_t)8 << 20; /* less than a batch: groups wait for earlier unpacks */
    o.max_tensor_bytes = (size_t)4 << 20;
    o.pack_threads = 2;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "pool: %s", err.msg);
    float *src[N], *acc[N], *ref[N];
    void *d[N];
    moe_staging_xfer_t up[N], cp[N], add[N];
    const size_t bytes = ELEMS * sizeof(float);
    for (int k = 0; k < N; k++) {
        src[k] = k == 0 ? kern_pinned_alloc(dev, bytes) : malloc(bytes);
        acc[k] = k == 0 ? kern_pinned_alloc(dev, bytes) : malloc(bytes);
        ref[k] = malloc(bytes);
        MT_CHECK(src[k] && acc[k] && ref[k], "test buffers");
        for (size_t i = 0; i < ELEMS; i++) src[k][i] = (float)((i * 2654435761u + (unsigned)k) % 100003) * 1e-3f - 50.0f;
        for (size_t i = 0; i < ELEMS; i++) ref[k][i] = (src[k][i] + src[k][i]) + src[k][i];
        d[k] = kern_alloc(dev, bytes, "unpack test tensor", &err);
        EXPECT(d[k] != NULL, "%s", err.msg);
        up[k] = (moe_staging_xfer_t){src[k], d[k], bytes, k == 0 ? MOE_STAGING_PINNED : MOE_STAGING_COPY};
        cp[k] = (moe_staging_xfer_t){acc[k], d[k], bytes, k == 0 ? MOE_STAGING_PINNED : MOE_STAGING_COPY};
        add[k] = (moe_staging_xfer_t){acc[k], d[k], bytes, MOE_STAGING_ADD_F32};
    }
    const moe_staging_batch_t b = {"unpack stream batch", MT_ARENA_ALIGN};
    moe_staging_stats_t st0, st1;
    moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &st0);
    EXPECT(moe_staging_h2d_batch(p, h2d, up, N, &b, &err) == MT_OK, "h2d: %s", err.msg);
    moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &st1);
    EXPECT(st1.tensors[MOE_STAGING_H2D] - st0.tensors[MOE_STAGING_H2D] == N, "every tensor counted, the pinned one too");
    kern_event_t *up_done = kern_event_create(dev);
    kern_event_record(dev, up_done, h2d);
    kern_stream_wait_event(dev, d2h, up_done);
    kern_event_destroy(dev, up_done);
    EXPECT(moe_staging_d2h_batch(p, d2h, cp, N, &b, &err) == MT_OK, "d2h copy: %s", err.msg);
    EXPECT(moe_staging_d2h_batch(p, d2h, add, N, &b, &err) == MT_OK, "d2h add: %s", err.msg);
    EXPECT(moe_staging_d2h_batch(p, d2h, add, N, &b, &err) == MT_OK, "d2h add again: %s", err.msg);
    kern_stream_sync(dev, d2h); /* the D2H stream alone: its batches end waiting for their unpacks */
    int wrong = 0;
    for (int k = 0; k < N; k++) wrong += memcmp(acc[k], ref[k], bytes) != 0;
    EXPECT(wrong == 0, "%d of %d tensors differ from (x + x) + x after a copy and two adds", wrong, N);
    for (int k = 0; k < N; k++) {
        kern_free(dev, d[k]);
        if (k == 0) kern_pinned_free(dev, src[k], bytes), kern_pinned_free(dev, acc[k], bytes);
        else free(src[k]), free(acc[k]);
        free(ref[k]);
    }
    moe_staging_destroy(p);
    kern_device_destroy(dev);
}

/* ---- efficiency on a realistic window ------------------------------------------ */

/* One scaled-down Qwen3-MoE layer: attention, norms, router and the active
 * experts (gate, up, down of 96 x 256 fp32). */
static int layer_tensors(size_t *t, int active) {
    const size_t H = 256, I = 96, E = 64, f = sizeof(float);
    int n = 0;
    t[n++] = H * f;           /* input_layernorm */
    t[n++] = 256 * H * f;     /* q_proj */
    t[n++] = 64 * H * f;      /* k_proj */
    t[n++] = 64 * H * f;      /* v_proj */
    t[n++] = H * 256 * f;     /* o_proj */
    t[n++] = 32 * f;          /* q_norm (head_dim) */
    t[n++] = 32 * f;          /* k_norm */
    t[n++] = H * f;           /* post_attention_layernorm */
    t[n++] = E * H * f;       /* router */
    for (int e = 0; e < 3 * active; e++) t[n++] = I * H * f;
    return n;
}

static void test_compact_window(void) {
    const int active = 48, L = 4;
    size_t t[2][512];
    int nt[2];
    for (int l = 0; l < 2; l++) nt[l] = layer_tensors(t[l], active);
    size_t window[1024], payload = 0;
    int nw = 0;
    for (int l = 0; l < 2; l++)
        for (int k = 0; k < nt[l]; k++) window[nw++] = t[l][k], payload += t[l][k];
    const size_t cap = moe_staging_plan_bytes(MOE_STAGING_COMPACT, window, nw, NULL);
    EXPECT(cap <= payload + payload / 10, "planned compact %zu bytes > 1.10 x payload %zu", cap, payload);

    /* 2 GB/s, 10 us: the window's copies are in flight together */
    kern_device_t *dev = staging_test_device((size_t)64 << 20, 2e9, 10e-6);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    moe_staging_t *p = staging_test_pool(dev, MOE_STAGING_COMPACT, cap, 256 * 256 * 4, true);
    size_t off[512];
    const size_t span = moe_staging_layout(t[0], nt[0], MT_ARENA_ALIGN, off);
    float *host = malloc(span);
    MT_CHECK_ALLOC(host, "layer host");
    memset(host, 1, span);
    void *bufs[2] = {kern_alloc(dev, span, "layer buffer 0", NULL), kern_alloc(dev, span, "layer buffer 1", NULL)};
    moe_staging_xfer_t it[512];
    mt_error_t err = {0};
    for (int l = 0; l < L; l++) {
        moe_staging_step_begin(p);
        for (int k = 0; k < nt[0]; k++)
            it[k] = (moe_staging_xfer_t){(char *)host + off[k], (char *)bufs[l % 2] + off[k], t[0][k], MOE_STAGING_COPY};
        EXPECT(moe_staging_h2d_batch(p, h2d, it, nt[0], &(moe_staging_batch_t){"layer", MT_ARENA_ALIGN}, &err) == MT_OK,
               "layer %d: %s", l, err.msg);
        moe_staging_count_skipped(p, 64 - active);
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_STEP, &s);
        EXPECT(s.copies[0] >= 1 && s.copies[0] <= 3, "layer %d moved in %llu copies (at most 3 expected)", l,
               (unsigned long long)s.copies[0]);
        EXPECT(s.experts_skipped == (uint64_t)(64 - active), "step counter of skipped experts: %llu",
               (unsigned long long)s.experts_skipped);
    }
    kern_stream_sync(dev, h2d);
    moe_staging_stats_t s;
    moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
    EXPECT(s.peak_reserved <= payload + payload / 10, "compact reserved %zu bytes for a %zu-byte window (> 1.10x)",
           s.peak_reserved, payload);
    EXPECT(s.waste_pct <= 10.0, "compact internal waste %.2f%% at peak (> 10%%)", s.waste_pct);
    EXPECT(s.peak_payload >= payload * 9 / 10, "the window was not in flight: peak payload %zu of %zu",
           s.peak_payload, payload);
    EXPECT(s.experts_skipped == (uint64_t)L * (64 - active), "total skipped %llu", (unsigned long long)s.experts_skipped);
    printf("compact window: payload %zu, reserved %zu (%.3fx), waste %.2f%%, %llu H2D copies for %d layers\n",
           payload, s.peak_reserved, (double)s.peak_reserved / (double)payload, s.waste_pct,
           (unsigned long long)s.copies[0], L);
    moe_staging_destroy(p);
    kern_free(dev, bufs[0]);
    kern_free(dev, bufs[1]);
    free(host);
    kern_device_destroy(dev);
}

int main(void) {
    test_alloc_random();
    test_pool_regions_random();
    test_backpressure();
    test_per_tensor_rounding_and_raw_copies();
    test_full_without_pending();
    test_integrity();
    test_pack_threads();
    test_unpack_stream_and_pinned();
    test_compact_window();
    return staging_test_finish("staging_test", g_failures);
}
