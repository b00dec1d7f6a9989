/* Growable arrays: one place for "make room for n elements, doubling".
 *
 *     item_t *items = NULL; int count = 0, cap = 0;
 *     MT_GROW(items, cap, count + 1, "staging copies");
 *     items[count++] = x;
 *
 * Capacity doubles (from 16), so appends are amortised O(1).  Running out
 * of host memory, or a count whose bytes overflow size_t, is fatal and
 * names `what` (MT_CHECK_ALLOC): these arrays hold bookkeeping, never
 * tensors, so there is no useful way to go on. */
#ifndef MT_BASE_GROW_H
#define MT_BASE_GROW_H

#include <stddef.h>

/* Ensures *items (elements of elem bytes) has room for need elements. */
void mt_grow(void **items, int *cap, int need, size_t elem, const char *what);

#define MT_GROW(arr, cap, need, what) mt_grow((void **)&(arr), &(cap), (need), sizeof *(arr), (what))

#endif
