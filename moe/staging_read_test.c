/* Reads into staging (MOE_STAGING_READ): a reader fills the staged bytes
 * where a pack would copy them.  Each read must land at an address aligned
 * to MOE_STAGING_READ_ALIGN with the room it asked for (an O_DIRECT read's
 * rounded length and a trailer), and the tail it writes must never reach a
 * neighbour's bytes: the reader here fills its whole room, the tail with a
 * pattern that would show on the device if it landed on another item.
 * Where the layout has no aligned room (a slot just the item's size), the
 * read goes through a buffer and lands the same. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/device.h"
#include "moe/staging.h"
#include "moe/staging_testutil.h"

static int g_failures;

typedef struct {
    moe_staging_read_t base;
    unsigned seed;
    size_t bytes;
    int calls, misaligned, short_room;
} test_read_t;

static uint8_t byte_of(unsigned seed, size_t i) { return (uint8_t)((i * 2654435761u + seed * 40503u) >> 13); }

static void test_reader(moe_staging_read_t *req, void *dst, size_t cap) {
    test_read_t *r = (test_read_t *)req;
    r->calls++;
    r->misaligned += (uintptr_t)dst % MOE_STAGING_READ_ALIGN != 0;
    r->short_room += cap != r->base.room;
    uint8_t *d = dst;
    for (size_t i = 0; i < r->bytes; i++) d[i] = byte_of(r->seed, i);
    memset(d + r->bytes, 0xEE, cap - r->bytes); /* the read's rounded tail and trailer */
}

/* Items alternating read and copy over one device span laid out adjacent
 * (so the compact layout would run them together), moved in one batch. */
static void run_batch(moe_staging_mode_t mode, int pack_threads, size_t max_tensor) {
    kern_device_t *dev = staging_test_device((size_t)64 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D), *d2h = kern_stream(dev, KERN_STREAM_D2H);
    enum { N = 7 };
    const size_t bytes[N] = {5000, 256, 12288, 1, 100000, 4096, 777};
    moe_staging_opts_t o;
    moe_staging_opts_init(&o, mode);
    o.capacity_bytes = (size_t)1 << 20;
    o.max_tensor_bytes = max_tensor;
    o.pack_threads = pack_threads;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "pool: %s", err.msg);
    size_t off[N];
    const size_t span = moe_staging_layout(bytes, N, MT_ARENA_ALIGN, off);
    char *d = kern_alloc(dev, span, "read test span", &err);
    EXPECT(d != NULL, "%s", err.msg);
    test_read_t reads[N];
    uint8_t *src[N];
    moe_staging_xfer_t it[N];
    for (int k = 0; k < N; k++) {
        src[k] = malloc(bytes[k]);
        MT_CHECK_ALLOC(src[k], "test source");
        for (size_t i = 0; i < bytes[k]; i++) src[k][i] = byte_of(100u + (unsigned)k, i);
        /* rounded up, and for some a trailer page of the reader's own after it */
        const size_t room = (bytes[k] + 4095) / 4096 * 4096 + (k % 4 == 0 ? 4096 : 0);
        reads[k] = (test_read_t){.base = {test_reader, room}, .seed = (unsigned)k, .bytes = bytes[k]};
        const bool read = k % 2 == 0;
        it[k] = (moe_staging_xfer_t){read ? (void *)&reads[k] : src[k], d + off[k], bytes[k],
                                     read ? MOE_STAGING_READ : MOE_STAGING_COPY};
    }
    const moe_staging_batch_t b = {"read test batch", MT_ARENA_ALIGN};
    EXPECT(moe_staging_h2d_batch(p, h2d, it, N, &b, &err) == MT_OK, "h2d: %s", err.msg);
    kern_stream_sync(dev, h2d);
    uint8_t *back = malloc(span);
    MT_CHECK_ALLOC(back, "test readback");
    kern_memcpy_d2h(dev, d2h, back, d, span);
    kern_stream_sync(dev, d2h);
    const char *name = moe_staging_mode_name(mode);
    for (int k = 0; k < N; k++) {
        size_t wrong = 0;
        for (size_t i = 0; i < bytes[k]; i++)
            wrong += back[off[k] + i] != (k % 2 == 0 ? byte_of((unsigned)k, i) : src[k][i]);
        EXPECT(wrong == 0, "%s, %d pack threads: item %d (%zu bytes, %s): %zu bytes wrong", name, pack_threads, k,
               bytes[k], k % 2 == 0 ? "read" : "copied", wrong);
        if (k % 2) continue;
        EXPECT(reads[k].calls == 1, "%s: item %d read %d times", name, k, reads[k].calls);
        EXPECT(reads[k].misaligned == 0 && reads[k].short_room == 0, "%s: item %d read into %s", name, k,
               reads[k].misaligned ? "a misaligned address" : "too little room");
    }
    free(back);
    for (int k = 0; k < N; k++) free(src[k]);
    kern_free(dev, d);
    moe_staging_destroy(p);
    kern_device_destroy(dev);
}

/* A read item in a D2H batch is refused: only H2D packs can read. */
static void test_d2h_refused(void) {
    kern_device_t *dev = staging_test_device((size_t)8 << 20, 0, 0);
    moe_staging_t *p = staging_test_pool(dev, MOE_STAGING_COMPACT, (size_t)1 << 20, 4096, false);
    mt_error_t err = {0};
    char *d = kern_alloc(dev, 4096, "read test", &err);
    test_read_t r = {.base = {test_reader, 4096}, .bytes = 4096};
    const moe_staging_xfer_t it = {&r, d, 4096, MOE_STAGING_READ};
    EXPECT(moe_staging_d2h_batch(p, kern_stream(dev, KERN_STREAM_D2H), &it, 1, NULL, &err) == MT_ERR_INTERNAL &&
               strstr(err.msg, "does not apply to D2H"),
           "a D2H read: %s", err.msg);
    EXPECT(r.calls == 0, "the refused read ran");
    r.base.room = 100; /* less than the item, and not a multiple of the alignment */
    EXPECT(moe_staging_h2d_batch(p, kern_stream(dev, KERN_STREAM_H2D), &it, 1, NULL, &err) == MT_ERR_INTERNAL &&
               strstr(err.msg, "into a room of 100"),
           "a read without room: %s", err.msg);
    kern_free(dev, d);
    moe_staging_destroy(p);
    kern_device_destroy(dev);
}

int main(void) {
    for (int threads = 0; threads <= 2; threads += 2) {
        run_batch(MOE_STAGING_COMPACT, threads, 100000);
        run_batch(MOE_STAGING_PER_TENSOR, threads, 100000);
        run_batch(MOE_STAGING_MAX_SLOT, threads, 100000); /* slots of 100096 bytes: the large read has no room */
    }
    test_d2h_refused();
    return staging_test_finish("staging_read_test", g_failures);
}
