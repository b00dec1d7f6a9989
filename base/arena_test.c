/* Arena allocator: alignment, best fit, coalescing, budget exhaustion, and a
 * randomised run checked against a shadow model of live blocks. */
#include "base/arena.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

static int failures;
#define EXPECT(c)                                                        \
    do {                                                                 \
        if (!(c)) {                                                      \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                  \
        }                                                                \
    } while (0)

int main(void) {
    mt_arena_t a;
    mt_arena_init(&a, 4096);
    size_t o1, o2, o3, o4;
    EXPECT(mt_arena_alloc(&a, 1, &o1) && o1 == 0);
    EXPECT(mt_arena_alloc(&a, 300, &o2) && o2 == 256); /* aligned to 256 */
    EXPECT(mt_arena_alloc(&a, 256, &o3) && o3 == 768);
    EXPECT(a.in_use == 1024);
    EXPECT(!mt_arena_alloc(&a, 4096, &o4)); /* over budget */
    mt_arena_release(&a, o2);
    EXPECT(mt_arena_largest_free(&a) == 3072);
    /* best fit: the 512-byte hole is chosen for a 400-byte request */
    EXPECT(mt_arena_alloc(&a, 400, &o4) && o4 == 256);
    mt_arena_release(&a, o1);
    mt_arena_release(&a, o3);
    mt_arena_release(&a, o4);
    EXPECT(a.in_use == 0 && a.nblocks == 1 && mt_arena_largest_free(&a) == 4096);
    EXPECT(a.peak == 1024 + 0 || a.peak >= 1024);
    mt_arena_free_all(&a);

    /* Two ends: a step's buffers around long-lived tensors.  Placed by best
     * fit alone, the long-lived ones sit between the step's buffers and
     * split what the step frees; from the top, what the step frees is one
     * block again. */
    for (int lasting = 0; lasting < 2; lasting++) {
        mt_arena_init(&a, 100 * 256);
        const mt_arena_life_t life = lasting ? MT_ARENA_LASTING : MT_ARENA_TRANSIENT;
        size_t t1, l1, t2, l2, t3;
        EXPECT(mt_arena_alloc(&a, 20 * 256, &t1));
        EXPECT(mt_arena_alloc_life(&a, 10 * 256, life, &l1));
        EXPECT(mt_arena_alloc(&a, 20 * 256, &t2));
        EXPECT(mt_arena_alloc_life(&a, 10 * 256, life, &l2));
        EXPECT(mt_arena_alloc(&a, 20 * 256, &t3));
        if (lasting) EXPECT(l1 == 90 * 256 && l2 == 80 * 256); /* from the top down */
        mt_arena_release(&a, t1);
        mt_arena_release(&a, t2);
        mt_arena_release(&a, t3);
        const size_t largest = mt_arena_largest_free(&a);
        if (lasting) EXPECT(largest == 80 * 256);
        else EXPECT(largest < 80 * 256); /* what the two ends avoid */
        EXPECT(a.in_use == 20 * 256);
        mt_arena_release(&a, l1);
        mt_arena_release(&a, l2);
        EXPECT(a.in_use == 0 && a.nblocks == 1);
        mt_arena_free_all(&a);
    }

    /* random alloc/free against a shadow list: no overlap, exact in_use */
    mt_arena_init(&a, 1 << 20);
    enum { N = 64 };
    size_t off[N], sz[N];
    int live[N] = {0};
    srand(7);
    for (int it = 0; it < 20000; it++) {
        int i = rand() % N;
        if (live[i]) {
            mt_arena_release(&a, off[i]);
            live[i] = 0;
        } else {
            size_t want = (size_t)(rand() % 40000) + 1;
            const mt_arena_life_t life = rand() % 4 == 0 ? MT_ARENA_LASTING : MT_ARENA_TRANSIENT;
            if (mt_arena_alloc_life(&a, want, life, &off[i])) {
                sz[i] = (want + 255) & ~(size_t)255;
                live[i] = 1;
                EXPECT(off[i] % MT_ARENA_ALIGN == 0 && off[i] + sz[i] <= a.capacity);
            }
        }
        size_t total = 0;
        for (int j = 0; j < N; j++) {
            if (!live[j]) continue;
            total += sz[j];
            for (int q = j + 1; q < N; q++)
                if (live[q]) EXPECT(off[j] + sz[j] <= off[q] || off[q] + sz[q] <= off[j]);
        }
        EXPECT(total == a.in_use);
        if (failures) break;
    }
    mt_arena_free_all(&a);
    if (failures) {
        fprintf(stderr, "arena_test: %d failures\n", failures);
        return 1;
    }
    printf("arena_test: ok\n");
    return 0;
}
