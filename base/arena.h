/* A budget-limited sub-allocator over one contiguous address range.
 *
 * Shared by the CPU backend (range = an aligned host slab) and the CUDA
 * backend (range = one cudaMalloc).  It only does bookkeeping on offsets,
 * never touches the memory, so it works for device addresses.
 *
 * Policy: best fit over a free list kept sorted by offset, neighbours
 * coalesced on free, every block aligned to MT_ARENA_ALIGN.  Blocks are
 * tracked in an offset-ordered array: O(blocks) per call, which is fine for
 * the few thousand live tensors of a step.
 *
 * Two ends.  Memory that lives for the whole run (resident weights,
 * accumulators, optimizer state) is taken from the top of the arena
 * (MT_ARENA_LASTING), everything else by best fit from the rest: a step's
 * short-lived buffers then come and go below the long-lived ones and leave
 * no holes between them.  Mixed in one best-fit pool, a long-lived tensor
 * placed between two buffers of a step splits the free space that the next
 * step's large activations need (seen on a GPU: 600 MB free in pieces, no
 * block of 92 MB). */
#ifndef MT_BASE_ARENA_H
#define MT_BASE_ARENA_H

#include <stdbool.h>
#include <stddef.h>

#define MT_ARENA_ALIGN 256

typedef struct {
    size_t offset;
    size_t size;
    bool used;
    bool retired; /* used, but freed by its owner: waits for stream-ordered release (arena_defer.h) */
} mt_arena_block_t;

typedef struct {
    size_t capacity;
    size_t in_use; /* bytes in used blocks (aligned sizes) */
    size_t peak;
    mt_arena_block_t *blocks; /* sorted by offset, tiling [0, capacity) */
    int nblocks, cap_blocks;
} mt_arena_t;

void mt_arena_init(mt_arena_t *a, size_t capacity);
void mt_arena_free_all(mt_arena_t *a); /* releases bookkeeping */
typedef enum {
    MT_ARENA_TRANSIENT = 0, /* best fit */
    MT_ARENA_LASTING,       /* the top of the highest free block that fits */
} mt_arena_life_t;

/* Returns true and the offset on success; false when no free block fits. */
bool mt_arena_alloc(mt_arena_t *a, size_t bytes, size_t *offset);
/* mt_arena_alloc for memory of the given lifetime (see "Two ends"). */
bool mt_arena_alloc_life(mt_arena_t *a, size_t bytes, mt_arena_life_t life, size_t *offset);
/* Frees the block starting at offset (retired or not); aborts on an offset never returned. */
void mt_arena_release(mt_arena_t *a, size_t offset);
/* Marks the block starting at offset as freed by its owner but not reusable
 * yet (it stays in use until mt_arena_release); returns its size.  Aborts
 * on an offset never returned and on a block retired already (a double free). */
size_t mt_arena_retire(mt_arena_t *a, size_t offset);
/* Size of the allocated block starting at offset; aborts on an offset never returned. */
size_t mt_arena_block_size(const mt_arena_t *a, size_t offset);
/* Largest free block, for the over-budget message (fragmentation shows). */
size_t mt_arena_largest_free(const mt_arena_t *a);

#endif
