/* Best-fit sub-allocation over offsets (see arena.h). */
#include "base/arena.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static size_t align_up(size_t x) { return (x + MT_ARENA_ALIGN - 1) & ~(size_t)(MT_ARENA_ALIGN - 1); }

static void ensure_blocks(mt_arena_t *a, int need) {
    if (need <= a->cap_blocks) return;
    int cap = a->cap_blocks ? a->cap_blocks * 2 : 64;
    while (cap < need) cap *= 2;
    a->blocks = realloc(a->blocks, (size_t)cap * sizeof *a->blocks);
    MT_CHECK_ALLOC(a->blocks, "arena block table");
    a->cap_blocks = cap;
}

void mt_arena_init(mt_arena_t *a, size_t capacity) {
    memset(a, 0, sizeof *a);
    a->capacity = capacity & ~(size_t)(MT_ARENA_ALIGN - 1);
    ensure_blocks(a, 1);
    a->blocks[0] = (mt_arena_block_t){.offset = 0, .size = a->capacity, .used = false};
    a->nblocks = a->capacity ? 1 : 0;
}

void mt_arena_free_all(mt_arena_t *a) {
    free(a->blocks);
    memset(a, 0, sizeof *a);
}

bool mt_arena_alloc(mt_arena_t *a, size_t bytes, size_t *offset) {
    return mt_arena_alloc_life(a, bytes, MT_ARENA_TRANSIENT, offset);
}

bool mt_arena_alloc_life(mt_arena_t *a, size_t bytes, mt_arena_life_t life, size_t *offset) {
    size_t need = align_up(bytes ? bytes : 1);
    int best = -1;
    for (int i = 0; i < a->nblocks; i++) {
        const mt_arena_block_t *b = &a->blocks[i];
        if (b->used || b->size < need) continue;
        if (life == MT_ARENA_LASTING) best = i; /* the last one that fits: the highest */
        else if (best < 0 || b->size < a->blocks[best].size) best = i;
    }
    if (best < 0) return false;
    mt_arena_block_t *b = &a->blocks[best];
    if (b->size > need) { /* split: the rest stays free, below a lasting block, above any other */
        ensure_blocks(a, a->nblocks + 1);
        b = &a->blocks[best];
        memmove(&a->blocks[best + 2], &a->blocks[best + 1],
                (size_t)(a->nblocks - best - 1) * sizeof *a->blocks);
        if (life == MT_ARENA_LASTING) {
            a->blocks[best + 1] = (mt_arena_block_t){.offset = b->offset + b->size - need, .size = need};
            b->size -= need;
            b = &a->blocks[best + 1];
        } else {
            a->blocks[best + 1] = (mt_arena_block_t){.offset = b->offset + need, .size = b->size - need};
            b->size = need;
        }
        a->nblocks++;
    }
    b->used = true;
    a->in_use += b->size;
    if (a->in_use > a->peak) a->peak = a->in_use;
    *offset = b->offset;
    return true;
}

static int find_block(const mt_arena_t *a, size_t offset) {
    int lo = 0, hi = a->nblocks - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (a->blocks[mid].offset == offset) return a->blocks[mid].used ? mid : -1;
        if (a->blocks[mid].offset < offset) lo = mid + 1; else hi = mid - 1;
    }
    return -1;
}

size_t mt_arena_block_size(const mt_arena_t *a, size_t offset) {
    int i = find_block(a, offset);
    MT_CHECK(i >= 0, "arena: offset %zu is not an allocated block", offset);
    return a->blocks[i].size;
}

size_t mt_arena_retire(mt_arena_t *a, size_t offset) {
    int i = find_block(a, offset);
    MT_CHECK(i >= 0, "arena: freeing offset %zu that is not an allocated block", offset);
    MT_CHECK(!a->blocks[i].retired, "arena: freeing offset %zu twice (it waits for its streams already)", offset);
    a->blocks[i].retired = true;
    return a->blocks[i].size;
}

void mt_arena_release(mt_arena_t *a, size_t offset) {
    int i = find_block(a, offset);
    MT_CHECK(i >= 0, "arena: freeing offset %zu that is not an allocated block", offset);
    a->blocks[i].used = false;
    a->blocks[i].retired = false;
    a->in_use -= a->blocks[i].size;
    if (i + 1 < a->nblocks && !a->blocks[i + 1].used) { /* merge with next */
        a->blocks[i].size += a->blocks[i + 1].size;
        memmove(&a->blocks[i + 1], &a->blocks[i + 2], (size_t)(a->nblocks - i - 2) * sizeof *a->blocks);
        a->nblocks--;
    }
    if (i > 0 && !a->blocks[i - 1].used) { /* merge with previous */
        a->blocks[i - 1].size += a->blocks[i].size;
        memmove(&a->blocks[i], &a->blocks[i + 1], (size_t)(a->nblocks - i - 1) * sizeof *a->blocks);
        a->nblocks--;
    }
}

size_t mt_arena_largest_free(const mt_arena_t *a) {
    size_t best = 0;
    for (int i = 0; i < a->nblocks; i++)
        if (!a->blocks[i].used && a->blocks[i].size > best) best = a->blocks[i].size;
    return best;
}
