/* The executor's step counters: per-layer copy counts fold into the step's
 * totals at the end of each micro-batch, and fetches issued between steps
 * are carried into the next step's first micro-batch (not lost, not
 * counted in the step that issued them). */
#include "engine/exec/record/counters.h"

#include <stdio.h>

static int failures;
#define EXPECT(cond)                                                   \
    do {                                                               \
        if (!(cond)) {                                                 \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                \
        }                                                              \
    } while (0)

int main(void) {
    exec_counters_t c;
    exec_counters_init(&c, 3);

    /* step 1, one micro-batch: layer 1 fetches its experts in 2 copies and
     * sends their gradients back in 3; layer 2 moves nothing */
    exec_counters_step_begin(&c);
    exec_counters_micro_begin(&c);
    exec_counters_moe_batch(&c, 1, 0, 2, 5);
    exec_counters_moe_batch(&c, 1, 1, 3, 4);
    exec_counters_micro_end(&c);
    EXPECT(c.ctr.moe_passes[0] == 1 && c.ctr.moe_passes[1] == 1);
    EXPECT(c.ctr.moe_copies[0] == 2 && c.ctr.moe_copies[1] == 3);
    EXPECT(c.ctr.max_moe_copies[0] == 2 && c.ctr.max_moe_copies[1] == 3);
    EXPECT(c.ctr.experts_moved[0] == 5 && c.ctr.experts_moved[1] == 4);

    /* the optimizer step fetches layer 0 for step 2: carried, and a D2H
     * batch at that time still counts now */
    const uint64_t w1 = c.ctr.weight_h2d_bytes;
    c.between_steps = true;
    exec_counters_moe_batch(&c, 0, 0, 4, 6);
    exec_counters_weight_h2d(&c, 1000); /* step 2's weights: counted in step 2 */
    c.between_steps = false;
    EXPECT(c.ctr.weight_h2d_bytes == w1);
    EXPECT(c.ctr.experts_moved[0] == 5);
    EXPECT(c.ctr.moe_copies[0] == 2);

    /* step 2: its counts start from zero, the carried fetch lands in its
     * first micro-batch together with that micro-batch's own copies */
    exec_counters_step_begin(&c);
    EXPECT(c.ctr.experts_moved[0] == 0 && c.ctr.moe_passes[0] == 0);
    EXPECT(c.ctr.weight_h2d_bytes == 1000);
    exec_counters_weight_h2d(&c, 24);
    EXPECT(c.ctr.weight_h2d_bytes == 1024);
    exec_counters_micro_begin(&c);
    EXPECT(c.ctr.experts_moved[0] == 6);
    exec_counters_moe_batch(&c, 0, 0, 1, 1);
    exec_counters_micro_end(&c);
    EXPECT(c.ctr.moe_passes[0] == 1);
    EXPECT(c.ctr.moe_copies[0] == 5); /* 4 carried + 1 */
    EXPECT(c.ctr.max_moe_copies[0] == 5);
    EXPECT(c.ctr.experts_moved[0] == 7);

    /* a second micro-batch starts from clean per-layer counts: the carry is
     * spent and layer 0's 5 copies are not counted again */
    exec_counters_micro_begin(&c);
    exec_counters_moe_batch(&c, 2, 0, 2, 2);
    exec_counters_micro_end(&c);
    EXPECT(c.ctr.moe_passes[0] == 2);
    EXPECT(c.ctr.moe_copies[0] == 7);
    EXPECT(c.ctr.max_moe_copies[0] == 5);
    EXPECT(c.ctr.moe_passes[1] == 0);

    exec_counters_free(&c);
    if (failures) {
        fprintf(stderr, "%d failure(s)\n", failures);
        return 1;
    }
    printf("exec_counters_test: all passed\n");
    return 0;
}
