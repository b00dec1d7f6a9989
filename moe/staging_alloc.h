/* Sub-allocator of one compact staging slab (internal to moe/staging).
 *
 * Like base/arena.h it keeps an offset-ordered array of blocks tiling
 * [0, capacity), coalesces free neighbours on release and never touches
 * the memory; unlike the arena the alignment is chosen per slab (the
 * pool's `align`, no power-of-two rounding of sizes), the policy is first
 * fit (lowest address: a stream of reservations released in order then
 * behaves like a ring buffer) or best fit, and a block can be shrunk in
 * place, which lets a batch take the largest free block, pack as many
 * tensors as fit, and hand the tail back.  O(blocks) per call: a slab
 * holds at most a few windows' worth of batches. */
#ifndef MT_MOE_STAGING_ALLOC_H
#define MT_MOE_STAGING_ALLOC_H

#include <stdbool.h>
#include <stddef.h>

#include "moe/staging.h"

typedef struct {
    size_t off, size;
    bool used;
} moe_salloc_block_t;

typedef struct {
    size_t capacity;       /* a multiple of align */
    size_t align;          /* power of two */
    size_t in_use;         /* bytes in used blocks */
    moe_staging_fit_t fit;
    moe_salloc_block_t *b; /* sorted by offset, tiling [0, capacity) */
    int n, cap;
} moe_salloc_t;

/* capacity is rounded down to a multiple of align. */
void moe_salloc_init(moe_salloc_t *a, size_t capacity, size_t align, moe_staging_fit_t fit);
void moe_salloc_free_all(moe_salloc_t *a);
/* Allocates align_up(bytes) (at least align); false when no free block fits. */
bool moe_salloc_alloc(moe_salloc_t *a, size_t bytes, size_t *off);
/* Size of the largest free block. */
size_t moe_salloc_largest_free(const moe_salloc_t *a);
/* Size of the used block at off (aborts on an offset never returned). */
size_t moe_salloc_size(const moe_salloc_t *a, size_t off);
/* Shrinks the used block at off to align_up(bytes) (>= align); the tail becomes free. */
void moe_salloc_shrink(moe_salloc_t *a, size_t off, size_t bytes);
void moe_salloc_release(moe_salloc_t *a, size_t off);
/* Checks the tiling invariants; returns false and a reason when broken (tests). */
bool moe_salloc_check(const moe_salloc_t *a, char *why, size_t why_len);

#endif
