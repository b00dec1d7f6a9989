#include "base/grow.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/status.h"

void mt_grow(void **items, int *cap, int need, size_t elem, const char *what) {
    MT_CHECK(need >= 0, "negative element count for %s", what);
    if (need <= *cap) return;
    int64_t n = *cap > 0 ? *cap : 16;
    while (n < need) n *= 2;
    MT_CHECK(n <= INT32_MAX && (size_t)n <= SIZE_MAX / elem, "too many elements for %s", what);
    void *p = realloc(*items, (size_t)n * elem);
    MT_CHECK_ALLOC(p, what);
    *items = p;
    *cap = (int)n;
}
