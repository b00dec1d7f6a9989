/* Slab sub-allocator of the compact staging pool (see staging_alloc.h). */
#include "moe/staging_alloc.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static size_t align_up(const moe_salloc_t *a, size_t x) { return (x + a->align - 1) & ~(a->align - 1); }

static void ensure_blocks(moe_salloc_t *a, int need) {
    if (need <= a->cap) return;
    int cap = a->cap ? 2 * a->cap : 16;
    while (cap < need) cap *= 2;
    a->b = realloc(a->b, (size_t)cap * sizeof *a->b);
    MT_CHECK_ALLOC(a->b, "staging slab block table");
    a->cap = cap;
}

void moe_salloc_init(moe_salloc_t *a, size_t capacity, size_t align, moe_staging_fit_t fit) {
    MT_CHECK(align && (align & (align - 1)) == 0, "staging alignment %zu is not a power of two", align);
    memset(a, 0, sizeof *a);
    a->align = align;
    a->fit = fit;
    a->capacity = capacity & ~(align - 1);
    ensure_blocks(a, 1);
    a->b[0] = (moe_salloc_block_t){0, a->capacity, false};
    a->n = a->capacity ? 1 : 0;
}

void moe_salloc_free_all(moe_salloc_t *a) {
    free(a->b);
    memset(a, 0, sizeof *a);
}

/* Splits block i so that it keeps `size` bytes; the rest becomes a free block after it. */
static void split(moe_salloc_t *a, int i, size_t size) {
    if (a->b[i].size == size) return;
    ensure_blocks(a, a->n + 1);
    memmove(&a->b[i + 2], &a->b[i + 1], (size_t)(a->n - i - 1) * sizeof *a->b);
    a->b[i + 1] = (moe_salloc_block_t){a->b[i].off + size, a->b[i].size - size, false};
    a->b[i].size = size;
    a->n++;
}

/* Merges block i with block i + 1 (both free). */
static void merge_next(moe_salloc_t *a, int i) {
    a->b[i].size += a->b[i + 1].size;
    memmove(&a->b[i + 1], &a->b[i + 2], (size_t)(a->n - i - 2) * sizeof *a->b);
    a->n--;
}

bool moe_salloc_alloc(moe_salloc_t *a, size_t bytes, size_t *off) {
    const size_t need = align_up(a, bytes ? bytes : 1);
    int pick = -1;
    for (int i = 0; i < a->n; i++) {
        const moe_salloc_block_t *b = &a->b[i];
        if (b->used || b->size < need) continue;
        if (a->fit == MOE_STAGING_FIRST_FIT) {
            pick = i;
            break;
        }
        if (pick < 0 || b->size < a->b[pick].size) pick = i;
    }
    if (pick < 0) return false;
    split(a, pick, need);
    a->b[pick].used = true;
    a->in_use += need;
    *off = a->b[pick].off;
    return true;
}

size_t moe_salloc_largest_free(const moe_salloc_t *a) {
    size_t best = 0;
    for (int i = 0; i < a->n; i++)
        if (!a->b[i].used && a->b[i].size > best) best = a->b[i].size;
    return best;
}

static int find_used(const moe_salloc_t *a, size_t off) {
    int lo = 0, hi = a->n - 1;
    while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (a->b[mid].off == off) return a->b[mid].used ? mid : -1;
        if (a->b[mid].off < off) lo = mid + 1;
        else hi = mid - 1;
    }
    return -1;
}

size_t moe_salloc_size(const moe_salloc_t *a, size_t off) {
    const int i = find_used(a, off);
    MT_CHECK(i >= 0, "staging slab: offset %zu is not an allocated block", off);
    return a->b[i].size;
}

void moe_salloc_shrink(moe_salloc_t *a, size_t off, size_t bytes) {
    const int i = find_used(a, off);
    MT_CHECK(i >= 0, "staging slab: shrinking offset %zu that is not an allocated block", off);
    const size_t keep = align_up(a, bytes ? bytes : 1);
    MT_CHECK(keep <= a->b[i].size, "staging slab: shrinking block at %zu from %zu to %zu bytes grows it", off,
             a->b[i].size, keep);
    if (keep == a->b[i].size) return;
    a->in_use -= a->b[i].size - keep;
    split(a, i, keep);
    if (i + 2 < a->n && !a->b[i + 2].used) merge_next(a, i + 1);
}

void moe_salloc_release(moe_salloc_t *a, size_t off) {
    int i = find_used(a, off);
    MT_CHECK(i >= 0, "staging slab: releasing offset %zu that is not an allocated block", off);
    a->b[i].used = false;
    a->in_use -= a->b[i].size;
    if (i + 1 < a->n && !a->b[i + 1].used) merge_next(a, i);
    if (i > 0 && !a->b[i - 1].used) merge_next(a, i - 1);
}

bool moe_salloc_check(const moe_salloc_t *a, char *why, size_t why_len) {
    size_t pos = 0, used = 0;
    for (int i = 0; i < a->n; i++) {
        const moe_salloc_block_t *b = &a->b[i];
        if (b->off != pos) {
            snprintf(why, why_len, "block %d starts at %zu, expected %zu (gap or overlap)", i, b->off, pos);
            return false;
        }
        if (b->size == 0 || b->off % a->align || b->size % a->align) {
            snprintf(why, why_len, "block %d (%zu, %zu bytes) empty or not aligned to %zu", i, b->off, b->size,
                     a->align);
            return false;
        }
        if (i > 0 && !b->used && !a->b[i - 1].used) {
            snprintf(why, why_len, "free blocks %d and %d not coalesced", i - 1, i);
            return false;
        }
        if (b->used) used += b->size;
        pos += b->size;
    }
    if (pos != a->capacity || used != a->in_use) {
        snprintf(why, why_len, "blocks cover %zu of %zu bytes, %zu used vs in_use %zu", pos, a->capacity, used,
                 a->in_use);
        return false;
    }
    return true;
}
