/* Stream-ordered frees over the arena (see arena_defer.h). */
#include "kernels/arena_defer.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void kern_arena_defer_init(kern_arena_defer_t *d, mt_arena_t *arena, const kern_arena_defer_hooks_t *hooks) {
    MT_CHECK(hooks->nstreams >= 1 && hooks->nstreams <= KERN_ARENA_DEFER_MAX_STREAMS,
             "arena_defer: %d streams (1..%d)", hooks->nstreams, KERN_ARENA_DEFER_MAX_STREAMS);
    memset(d, 0, sizeof *d);
    d->arena = arena;
    d->h = *hooks;
}

static kern_arena_epoch_t *slot(kern_arena_defer_t *d, int k) { return &d->ring[(d->head + k) % d->cap]; }

static void spare_put(kern_arena_defer_t *d, void *ev) {
    if (!ev) return;
    if (d->nspare == d->cap_spare) {
        d->cap_spare = d->cap_spare ? 2 * d->cap_spare : 16;
        d->spare = realloc(d->spare, (size_t)d->cap_spare * sizeof *d->spare);
        MT_CHECK_ALLOC(d->spare, "arena_defer markers");
    }
    d->spare[d->nspare++] = ev;
}

/* The oldest epoch goes back to the arena; its markers are kept for reuse. */
static void release_oldest(kern_arena_defer_t *d) {
    kern_arena_epoch_t *e = slot(d, 0);
    for (int k = 0; k < e->n; k++) mt_arena_release(d->arena, e->offs[k]);
    d->pending_bytes -= e->bytes;
    for (int s = 0; s < d->h.nstreams; s++) {
        spare_put(d, e->ev[s]);
        e->ev[s] = NULL;
    }
    e->n = 0;
    e->bytes = 0;
    d->head = (d->head + 1) % d->cap;
    d->count--;
    if (d->count == 0) d->open = false;
}

void kern_arena_defer_destroy(kern_arena_defer_t *d) {
    kern_arena_defer_release_all(d);
    for (int k = 0; k < d->cap; k++) free(d->ring[k].offs);
    for (int k = 0; k < d->nspare; k++) d->h.event_destroy(d->h.ctx, d->spare[k]);
    free(d->ring);
    free(d->spare);
    memset(d, 0, sizeof *d);
}

/* A new open epoch at the tail; the ring doubles (kept in order) when full. */
static kern_arena_epoch_t *open_epoch(kern_arena_defer_t *d) {
    if (d->open) return slot(d, d->count - 1);
    if (d->count == d->cap) {
        const int cap = d->cap ? 2 * d->cap : 8;
        kern_arena_epoch_t *r = calloc((size_t)cap, sizeof *r);
        MT_CHECK_ALLOC(r, "arena_defer epochs");
        for (int k = 0; k < d->cap; k++) r[k] = *slot(d, k); /* full: every slot is live, oldest first */
        free(d->ring);
        d->ring = r;
        d->head = 0;
        d->cap = cap;
    }
    d->count++;
    d->open = true;
    return slot(d, d->count - 1);
}

void kern_arena_defer_free(kern_arena_defer_t *d, size_t offset) {
    const size_t size = mt_arena_retire(d->arena, offset); /* aborts on a bad or double free */
    kern_arena_epoch_t *e = open_epoch(d);
    if (e->n == e->cap) {
        e->cap = e->cap ? 2 * e->cap : 16;
        e->offs = realloc(e->offs, (size_t)e->cap * sizeof *e->offs);
        MT_CHECK_ALLOC(e->offs, "arena_defer frees");
    }
    e->offs[e->n++] = offset;
    e->bytes += size;
    d->pending_bytes += size;
    if (d->pending_bytes > d->pending_peak) d->pending_peak = d->pending_bytes;
    d->frees++;
}

void kern_arena_defer_close(kern_arena_defer_t *d) {
    if (!d->open) return;
    kern_arena_epoch_t *e = slot(d, d->count - 1);
    for (int s = 0; s < d->h.nstreams; s++) {
        e->ev[s] = d->nspare ? d->spare[--d->nspare] : d->h.event_create(d->h.ctx);
        d->h.event_record(d->h.ctx, e->ev[s], s);
    }
    d->open = false;
    d->epochs++;
}

static bool epoch_done(kern_arena_defer_t *d, const kern_arena_epoch_t *e) {
    for (int s = 0; s < d->h.nstreams; s++)
        if (!d->h.event_query(d->h.ctx, e->ev[s])) return false;
    return true;
}

bool kern_arena_defer_poll(kern_arena_defer_t *d) {
    bool any = false;
    /* closed epochs only (the open one, last, has no markers yet); in order:
     * the first incomplete one holds every later one back */
    while (d->count > (d->open ? 1 : 0) && epoch_done(d, slot(d, 0))) {
        release_oldest(d);
        any = true;
    }
    return any;
}

bool kern_arena_defer_wait_oldest(kern_arena_defer_t *d) {
    if (d->count == 0) return false;
    if (d->open && d->count == 1) kern_arena_defer_close(d);
    kern_arena_epoch_t *e = slot(d, 0);
    for (int s = 0; s < d->h.nstreams; s++) d->h.event_sync(d->h.ctx, e->ev[s]);
    release_oldest(d);
    return true;
}

void kern_arena_defer_release_all(kern_arena_defer_t *d) {
    while (d->count > 0) release_oldest(d);
}

bool kern_arena_defer_alloc(kern_arena_defer_t *d, size_t bytes, size_t *offset) {
    return kern_arena_defer_alloc_life(d, bytes, MT_ARENA_TRANSIENT, offset);
}

bool kern_arena_defer_alloc_life(kern_arena_defer_t *d, size_t bytes, mt_arena_life_t life, size_t *offset) {
    kern_arena_defer_close(d);
    kern_arena_defer_poll(d);
    bool waited = false, ok = mt_arena_alloc_life(d->arena, bytes, life, offset);
    while (!ok && kern_arena_defer_wait_oldest(d)) {
        waited = true;
        ok = mt_arena_alloc_life(d->arena, bytes, life, offset);
    }
    if (waited) d->waits++;
    return ok;
}
