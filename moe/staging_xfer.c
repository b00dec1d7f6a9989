/* Batched transfers through the staging pool (see staging.h).  The jobs
 * that pack pageable sources into staging, and the threads that run them,
 * are staging_pack.c's; regions and counters are staging.c's.
 *
 * A batch is issued in groups.  A group is a set of regions whose host
 * side is handled by one job (a list of memcpys, or adds for gradients)
 * and whose copies are issued together; it is flushed (job handed over,
 * copies issued, regions released after them) when a reservation would
 * have to wait for space, when it has gathered FLUSH_BYTES, and at the end
 * of the batch.  Flushing before waiting matters: the space a full pool
 * waits for may be held by this group's own regions.
 *
 * Compact layout.  Items are sorted by device address and cut into runs of
 * adjacent device ranges (see moe_staging_batch_t.dev_pad_align).  A chunk
 * region is laid out like the device: each run starts aligned, items sit
 * at their device offset from the run's start, so each run moves in one
 * copy.  A chunk asks for the whole remaining batch (at most a slab); when
 * no free block holds that, it takes the largest free block if that holds
 * at least half of what the batch first asked for, else it waits.  So a
 * batch that fits a slab moves in at most two chunks.
 *
 * H2D packing.  With pack threads the job is queued to them and the copy
 * stream gets a host function that waits for the job before the copies
 * (stream order keeps the copies behind it), so packing batch k+1 overlaps
 * the transfer of batch k.  Without them the caller packs inline.  D2H
 * unpacking runs as a host function on the unpack stream
 * (KERN_STREAM_UNPACK) once the group's copies have landed, and the
 * group's regions go back after it there; the copy stream meanwhile
 * copies the next group, so a batch takes the longer of its copies and its
 * unpacks, not their sum.  At the batch's end the copy stream waits for the
 * unpack stream: the destinations are complete when the stream passes the
 * batch, as callers expect, and the one unpack stream keeps the adds into
 * a destination in issue order. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "moe/staging_internal.h"

enum { FLUSH_BYTES = 2 << 20 };

static size_t align_to(size_t x, size_t a) { return (x + a - 1) & ~(a - 1); }

/* A read item's room in staging (moe_staging_read_t). */
static size_t read_cap(const moe_staging_xfer_t *it) { return ((const moe_staging_read_t *)it->host)->room; }

/* The most a read item's start moves to reach the read alignment in a
 * region aligned to `align`. */
static size_t read_slack(size_t align) { return align < MOE_STAGING_READ_ALIGN ? MOE_STAGING_READ_ALIGN - align : 0; }

/* The first offset at or after pos in a region at host address base where
 * an item starts: aligned to align, and for a read item its address aligned
 * to the read alignment too. */
static size_t item_start(const void *base, size_t pos, size_t align, bool read) {
    pos = align_to(pos, align);
    if (!read) return pos;
    const uintptr_t at = (uintptr_t)base + pos;
    return pos + (align_to(at, MOE_STAGING_READ_ALIGN) - at);
}

/* ---- groups --------------------------------------------------------------- */

typedef struct {
    int reg;     /* index into the group's regions */
    size_t off;  /* offset in that region */
    char *dev;
    size_t bytes;
} group_copy_t;

typedef struct {
    int dir;
    kern_stream_t *stream;
    moe_staging_region_t *reg;
    int nreg, cap_reg;
    group_copy_t *cp;
    int ncp, cap_cp;
    staging_pack_job_t *job;
    size_t bytes;
    bool unpacking; /* D2H: some group's unpack went to the unpack stream */
} group_t;

static int group_add_region(group_t *g, const moe_staging_region_t *r) {
    if (g->nreg == g->cap_reg) {
        g->cap_reg = g->cap_reg ? 2 * g->cap_reg : 16;
        g->reg = realloc(g->reg, (size_t)g->cap_reg * sizeof *g->reg);
        MT_CHECK_ALLOC(g->reg, "staging batch regions");
    }
    g->reg[g->nreg] = *r;
    return g->nreg++;
}

static void group_add_copy(group_t *g, int reg, size_t off, char *dev, size_t bytes) {
    if (g->ncp == g->cap_cp) {
        g->cap_cp = g->cap_cp ? 2 * g->cap_cp : 16;
        g->cp = realloc(g->cp, (size_t)g->cap_cp * sizeof *g->cp);
        MT_CHECK_ALLOC(g->cp, "staging batch copies");
    }
    g->cp[g->ncp++] = (group_copy_t){reg, off, dev, bytes};
}

/* Places item bytes at region `reg` + off: a memcpy (H2D: pack), a read
 * (into `room` aligned bytes there, 0: through a buffer) or an op (D2H:
 * unpack) in the job. */
static void group_add_item(moe_staging_t *p, group_t *g, int reg, size_t off, const moe_staging_xfer_t *it,
                           size_t room) {
    if (!g->job) g->job = staging_job_new(p);
    char *staged = (char *)g->reg[reg].host + off;
    if (it->op == MOE_STAGING_READ) staging_job_add_read(g->job, staged, it->host, it->bytes, room);
    else if (g->dir == MOE_STAGING_H2D) staging_job_add(g->job, staged, it->host, it->bytes, it->op);
    else staging_job_add(g->job, it->host, staged, it->bytes, it->op);
    g->bytes += it->bytes;
}

/* Stream `s` runs what is issued on it next only after what was issued on `after` so far. */
static void stream_follows(moe_staging_t *p, kern_stream_t *s, kern_stream_t *after) {
    if (!p->follow) p->follow = kern_event_create(p->dev);
    kern_event_record(p->dev, p->follow, after);
    kern_stream_wait_event(p->dev, s, p->follow);
}

static void group_flush(moe_staging_t *p, group_t *g) {
    kern_device_t *dev = p->dev;
    if (g->dir == MOE_STAGING_H2D && g->job) {
        staging_pack_before(p, g->stream, g->job);
        g->job = NULL;
    }
    for (int c = 0; c < g->ncp; c++) {
        const group_copy_t *cp = &g->cp[c];
        char *staged = (char *)g->reg[cp->reg].host + cp->off;
        if (g->dir == MOE_STAGING_H2D) kern_memcpy_h2d(dev, g->stream, cp->dev, staged, cp->bytes);
        else kern_memcpy_d2h(dev, g->stream, staged, cp->dev, cp->bytes);
        staging_count_copy(p, g->dir, cp->bytes);
    }
    kern_stream_t *release_on = g->stream;
    if (g->dir == MOE_STAGING_D2H && g->job) {
        release_on = kern_stream(dev, KERN_STREAM_UNPACK);
        stream_follows(p, release_on, g->stream);
        staging_unpack_after(p, release_on, g->job);
        g->job = NULL;
        g->unpacking = true;
    }
    for (int r = 0; r < g->nreg; r++) moe_staging_release_after(p, &g->reg[r], release_on);
    g->nreg = g->ncp = 0;
    g->bytes = 0;
}

static void group_free(group_t *g) {
    if (g->job) staging_job_free(g->job);
    free(g->reg);
    free(g->cp);
}

/* ---- the batch ------------------------------------------------------------ */

static int cmp_dev(const void *a, const void *b) {
    const moe_staging_xfer_t *x = *(const moe_staging_xfer_t *const *)a, *y = *(const moe_staging_xfer_t *const *)b;
    const uintptr_t u = (uintptr_t)x->dev, v = (uintptr_t)y->dev;
    return u < v ? -1 : u > v;
}

/* True when item b continues item a's device run (see dev_pad_align).  A
 * read item is a run of its own: it fills its whole rounded room, which may
 * reach into the next item's place. */
static bool adjacent(const moe_staging_xfer_t *a, const moe_staging_xfer_t *b, size_t pad_align) {
    if (a->op == MOE_STAGING_READ || b->op == MOE_STAGING_READ) return false;
    const uintptr_t end = (uintptr_t)a->dev + a->bytes, next = (uintptr_t)b->dev;
    if (next == end) return true;
    return pad_align && next > end && next <= align_to(end, pad_align);
}

/* Staging bytes items [i, n) need as one chunk laid out like the device. */
static size_t chunk_span(const moe_staging_xfer_t *const *it, int i, int n, size_t align, size_t pad) {
    size_t pos = 0, run_pos = 0;
    uintptr_t run_dev = 0;
    for (int k = i; k < n; k++) {
        const bool read = it[k]->op == MOE_STAGING_READ;
        if (k == i || !adjacent(it[k - 1], it[k], pad)) {
            run_pos = align_to(pos, align) + (read ? read_slack(align) : 0);
            run_dev = (uintptr_t)it[k]->dev;
        }
        pos = run_pos + ((uintptr_t)it[k]->dev - run_dev) + (read ? read_cap(it[k]) : it[k]->bytes);
    }
    return pos;
}

static mt_status_t batch_compact(moe_staging_t *p, group_t *g, const moe_staging_xfer_t *const *it, int n,
                                 const moe_staging_batch_t *b, mt_error_t *err) {
    const size_t pad = b ? b->dev_pad_align : 0, largest_slab = staging_largest_slab(p);
    const char *tag = b && b->tag ? b->tag : "a staged batch";
    size_t first_want = 0;
    int i = 0;
    while (i < n) {
        size_t want = chunk_span(it, i, n, p->align, pad);
        if (want > largest_slab) want = largest_slab;
        if (!first_want) first_want = want;
        const size_t min = it[i]->bytes, accept = first_want / 2 < want ? first_want / 2 : want;
        moe_staging_region_t r;
        bool got = false;
        mt_status_t st = staging_reserve_flex(p, min, want, accept, tag, false, &r, &got, err);
        if (st == MT_OK && !got) {
            group_flush(p, g); /* what we hold may be what we would wait for */
            st = staging_reserve_flex(p, min, want, accept, tag, true, &r, &got, err);
        }
        if (st != MT_OK) return st;
        const size_t room = p->rec[r.id].size;
        const int reg = group_add_region(g, &r);
        size_t pos = 0, run_pos = 0, payload = 0;
        uintptr_t run_dev = 0;
        int j = i;
        for (; j < n; j++) {
            const bool new_run = j == i || !adjacent(it[j - 1], it[j], pad);
            const bool read = it[j]->op == MOE_STAGING_READ;
            size_t start = new_run ? item_start(r.host, pos, p->align, read) : run_pos;
            size_t fills = read ? read_cap(it[j]) : it[j]->bytes;
            if (read && start + fills > room) { /* no aligned room left: read through a buffer */
                start = align_to(pos, p->align);
                fills = it[j]->bytes;
            }
            const uintptr_t dev0 = new_run ? (uintptr_t)it[j]->dev : run_dev;
            const size_t at = start + ((uintptr_t)it[j]->dev - dev0);
            if (at + fills > room) break;
            if (new_run) {
                run_pos = start;
                run_dev = dev0;
                group_add_copy(g, reg, at, it[j]->dev, it[j]->bytes);
            } else {
                group_copy_t *c = &g->cp[g->ncp - 1];
                c->bytes = at + it[j]->bytes - c->off; /* the run grows: padding between items rides along */
            }
            group_add_item(p, g, reg, at, it[j], read && fills == read_cap(it[j]) ? fills : 0);
            pos = at + fills;
            payload += it[j]->bytes;
        }
        MT_CHECK(j > i, "staging: a %zu-byte region cannot hold a %zu-byte item", room, it[i]->bytes);
        staging_shrink(p, &g->reg[reg], pos, payload);
        i = j;
        if (g->bytes >= FLUSH_BYTES) group_flush(p, g);
    }
    return MT_OK;
}

static mt_status_t batch_each(moe_staging_t *p, group_t *g, const moe_staging_xfer_t *const *it, int n,
                              const moe_staging_batch_t *b, mt_error_t *err) {
    const char *tag = b && b->tag ? b->tag : "a staged tensor";
    for (int i = 0; i < n; i++) {
        moe_staging_region_t r;
        bool got = false;
        mt_status_t st = staging_try_reserve(p, it[i]->bytes, tag, &r, &got, err);
        if (st == MT_OK && !got) {
            group_flush(p, g);
            st = moe_staging_reserve(p, it[i]->bytes, tag, &r, err);
        }
        if (st != MT_OK) return st;
        const int reg = group_add_region(g, &r);
        /* a read lands straight in the region when it is aligned and holds
         * the rounded read (a page-rounded block does; a slot may not) */
        const bool direct = it[i]->op == MOE_STAGING_READ && (uintptr_t)r.host % MOE_STAGING_READ_ALIGN == 0 &&
                            read_cap(it[i]) <= p->rec[r.id].size;
        group_add_copy(g, reg, 0, it[i]->dev, it[i]->bytes);
        group_add_item(p, g, reg, 0, it[i], direct ? read_cap(it[i]) : 0);
        if (g->bytes >= FLUSH_BYTES) group_flush(p, g);
    }
    return MT_OK;
}

static mt_status_t batch(moe_staging_t *p, int dir, kern_stream_t *stream, const moe_staging_xfer_t *items, int n,
                         const moe_staging_batch_t *b, mt_error_t *err) {
    if (n <= 0) return MT_OK;
    const char *tag = b && b->tag ? b->tag : "staged batch";
    const size_t pad = b ? b->dev_pad_align : 0;
    if (pad & (pad - 1))
        return mt_error_set(err, MT_ERR_INTERNAL, "%s: dev_pad_align %zu is not a power of two", tag, pad);
    const moe_staging_xfer_t **it = malloc((size_t)n * sizeof *it);
    MT_CHECK_ALLOC(it, "staging batch");
    int m = 0, direct = 0;
    for (int k = 0; k < n; k++) {
        if (items[k].bytes == 0) continue;
        if (!items[k].host || !items[k].dev) {
            free(it);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: item %d has no %s address", tag, k,
                                items[k].host ? "device" : "host");
        }
        const bool h2d_op_ok = items[k].op == MOE_STAGING_COPY || items[k].op == MOE_STAGING_PINNED ||
                               items[k].op == MOE_STAGING_READ ||
                               (items[k].op == MOE_STAGING_F32_TO_BF16 && items[k].bytes % 2 == 0);
        const bool d2h_op_ok = items[k].op == MOE_STAGING_COPY || items[k].op == MOE_STAGING_PINNED ||
                               items[k].op == MOE_STAGING_ADD_F32;
        if (dir == MOE_STAGING_H2D ? !h2d_op_ok : !d2h_op_ok) {
            free(it);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: item %d: operation %d does not apply to %s copies of %zu bytes",
                                tag, k, (int)items[k].op, dir == MOE_STAGING_H2D ? "H2D" : "D2H", items[k].bytes);
        }
        if (items[k].op == MOE_STAGING_READ && (read_cap(&items[k]) < items[k].bytes ||
                                                read_cap(&items[k]) % MOE_STAGING_READ_ALIGN)) {
            free(it);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: item %d reads %zu bytes into a room of %zu", tag, k,
                                items[k].bytes, read_cap(&items[k]));
        }
        if (dir == MOE_STAGING_D2H && items[k].op == MOE_STAGING_ADD_F32 && items[k].bytes % sizeof(float)) {
            free(it);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: item %d adds floats but has %zu bytes", tag, k,
                                items[k].bytes);
        }
        if (items[k].op == MOE_STAGING_PINNED) { /* nothing to stage: its own copy, in the batch's stream order */
            if (dir == MOE_STAGING_H2D) kern_memcpy_h2d(p->dev, stream, items[k].dev, items[k].host, items[k].bytes);
            else kern_memcpy_d2h(p->dev, stream, items[k].host, items[k].dev, items[k].bytes);
            staging_count_copy(p, dir, items[k].bytes);
            direct++;
            continue;
        }
        it[m++] = &items[k];
    }
    if (p->o.mode == MOE_STAGING_COMPACT) qsort(it, (size_t)m, sizeof *it, cmp_dev);
    for (int k = 1; k < m && p->o.mode == MOE_STAGING_COMPACT; k++)
        if ((uintptr_t)it[k]->dev < (uintptr_t)it[k - 1]->dev + it[k - 1]->bytes) {
            free(it);
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: device ranges of two items overlap", tag);
        }
    group_t g = {.dir = dir, .stream = stream};
    mt_status_t st = p->o.mode == MOE_STAGING_COMPACT ? batch_compact(p, &g, it, m, b, err)
                                                      : batch_each(p, &g, it, m, b, err);
    if (st == MT_OK) staging_count_tensors(p, dir, m + direct);
    group_flush(p, &g); /* also on error: what was laid out is issued, nothing leaks */
    if (g.unpacking) stream_follows(p, stream, kern_stream(p->dev, KERN_STREAM_UNPACK));
    group_free(&g);
    free(it);
    return st;
}

mt_status_t moe_staging_h2d_batch(moe_staging_t *p, kern_stream_t *stream, const moe_staging_xfer_t *items, int n,
                                  const moe_staging_batch_t *b, mt_error_t *err) {
    return batch(p, MOE_STAGING_H2D, stream, items, n, b, err);
}

mt_status_t moe_staging_d2h_batch(moe_staging_t *p, kern_stream_t *stream, const moe_staging_xfer_t *items, int n,
                                  const moe_staging_batch_t *b, mt_error_t *err) {
    return batch(p, MOE_STAGING_D2H, stream, items, n, b, err);
}

size_t moe_staging_layout(const size_t *bytes, int n, size_t align, size_t *offsets) {
    if (!align) align = MT_ARENA_ALIGN;
    size_t pos = 0;
    for (int k = 0; k < n; k++) {
        pos = align_to(pos, align);
        offsets[k] = pos;
        pos += bytes[k];
    }
    return align_to(pos, align);
}
