/* Stream-ordered frees over the arena (arena.h): a freed block is handed
 * out again only after every stream of the device has finished the work
 * issued before the free.
 *
 * Why.  The engine frees a device buffer as soon as the work that uses it
 * has been *issued*.  On the CPU backend the compute stream runs inline on
 * the issuing thread, so "issued" means "done" for kernels; on a GPU it does
 * not: a block freed after a kernel launch and reused at once by a copy on
 * another stream (a weight prefetch into a fresh span) would be overwritten
 * while the kernel still reads it.  Which streams still touch a block is
 * not known here (a buffer moves between compute, H2D and D2H through
 * events), so the rule is the simplest correct one: a free is ordered after
 * everything issued so far on EVERY stream.
 *
 * How.  Frees are batched into epochs: the frees between two allocations
 * share one epoch, closed by the next allocation, which records one marker
 * event on each stream.  Recording at the allocation rather than at each
 * free is never early (the markers cover all work issued before the frees)
 * and costs one event per stream per allocation that follows frees, not one
 * per free.  Epochs are closed in order and every stream completes in
 * order, so epoch k + 1 cannot complete before epoch k: a poll releases
 * completed epochs oldest first and stops at the first incomplete one.
 *
 * Allocation: close the open epoch, release the completed ones (queries
 * only), try the arena; when the request does not fit, wait for the oldest
 * epoch (event sync), release it and retry, until nothing is pending.  An
 * allocation therefore never fails while pending frees could satisfy it,
 * and waits only as long as it must.  After the caller has synchronised
 * every stream, everything pending is released at once.
 *
 * Markers are the device's events, reached through hooks, so this piece is
 * backend-agnostic: device.c wires it to the backend's vtable, its unit
 * test drives it with fake events, device_test runs it on the CPU backend's
 * threaded copy streams.  Single-threaded, like the arena. */
#ifndef MT_KERNELS_ARENA_DEFER_H
#define MT_KERNELS_ARENA_DEFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/arena.h"

#define KERN_ARENA_DEFER_MAX_STREAMS 4

typedef struct {
    void *ctx;
    int nstreams; /* markers per epoch, 1..KERN_ARENA_DEFER_MAX_STREAMS */
    void *(*event_create)(void *ctx);
    void (*event_destroy)(void *ctx, void *ev);
    /* Records ev behind everything issued so far on stream `stream`. */
    void (*event_record)(void *ctx, void *ev, int stream);
    bool (*event_query)(void *ctx, void *ev); /* true once the record has completed */
    void (*event_sync)(void *ctx, void *ev);  /* blocks until it has */
} kern_arena_defer_hooks_t;

typedef struct {
    size_t *offs; /* (n) arena offsets released when the epoch completes */
    int n, cap;
    size_t bytes;
    void *ev[KERN_ARENA_DEFER_MAX_STREAMS]; /* one marker per stream, set when closed */
} kern_arena_epoch_t;

typedef struct {
    mt_arena_t *arena;
    kern_arena_defer_hooks_t h;
    kern_arena_epoch_t *ring; /* (cap) epochs oldest first from `head`; the last is open when `open` */
    int head, count, cap;
    bool open;
    void **spare; /* (nspare) markers whose records completed, for reuse */
    int nspare, cap_spare;
    size_t pending_bytes;   /* retired, not released yet */
    size_t pending_peak;
    uint64_t frees;         /* blocks that went through the queue */
    uint64_t epochs;        /* epochs closed (marker sets recorded) */
    uint64_t waits;         /* allocations that synchronised on a pending epoch */
} kern_arena_defer_t;

void kern_arena_defer_init(kern_arena_defer_t *d, mt_arena_t *arena, const kern_arena_defer_hooks_t *hooks);
/* Every stream has been synchronised by the caller: pending blocks return
 * to the arena and the markers are destroyed. */
void kern_arena_defer_destroy(kern_arena_defer_t *d);

/* Frees the block at offset once every stream has passed this point.
 * Aborts on an offset that is not an allocated block, or one already freed. */
void kern_arena_defer_free(kern_arena_defer_t *d, size_t offset);
/* Allocates as mt_arena_alloc, reusing pending blocks as they complete and
 * waiting for them (oldest first) before it gives up.  False only when the
 * request does not fit with nothing pending. */
bool kern_arena_defer_alloc(kern_arena_defer_t *d, size_t bytes, size_t *offset);
/* kern_arena_defer_alloc for memory of the given lifetime (base/arena.h). */
bool kern_arena_defer_alloc_life(kern_arena_defer_t *d, size_t bytes, mt_arena_life_t life, size_t *offset);

/* Records the open epoch's markers (done by every allocation). */
void kern_arena_defer_close(kern_arena_defer_t *d);
/* Releases completed epochs, oldest first; true when any was. */
bool kern_arena_defer_poll(kern_arena_defer_t *d);
/* Waits for the oldest pending epoch (closing the open one if it is the
 * only one) and releases it; false when nothing is pending. */
bool kern_arena_defer_wait_oldest(kern_arena_defer_t *d);
/* Every stream has been synchronised: releases everything pending now. */
void kern_arena_defer_release_all(kern_arena_defer_t *d);

#endif
