/* eng_layer_act_slot (engine/layers/acts.c): every saved activation id the
 * model description may list has its own field in the layer's acts, and
 * only x_mid, the residual between the halves, is left to the caller. */
#include <stdint.h>
#include <stdio.h>

#include "engine/layers/acts.h"

int main(void) {
    eng_attn_acts_t a;
    eng_mlp_acts_t m;
    const uintptr_t a0 = (uintptr_t)&a, a1 = a0 + sizeof a, m0 = (uintptr_t)&m, m1 = m0 + sizeof m;
    void **seen[ENG_ACT_COUNT] = {0};
    int failures = 0;
    for (int id = 0; id < ENG_ACT_COUNT; id++) {
        void **slot = eng_layer_act_slot(&a, &m, (eng_act_id_t)id);
        if (id == ENG_A_X_MID) {
            if (slot) {
                fprintf(stderr, "x_mid: a field of the layer's acts, want NULL (the caller's)\n");
                failures++;
            }
            continue;
        }
        const uintptr_t p = (uintptr_t)slot;
        if (!slot || !((p >= a0 && p + sizeof *slot <= a1) || (p >= m0 && p + sizeof *slot <= m1))) {
            fprintf(stderr, "activation id %d: no field inside the attention or MLP acts\n", id);
            failures++;
            continue;
        }
        for (int j = 0; j < id; j++) {
            if (seen[j] != slot) continue;
            fprintf(stderr, "activation ids %d and %d share a field\n", j, id);
            failures++;
        }
        seen[id] = slot;
    }
    if (failures) {
        fprintf(stderr, "acts_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("acts_test: ok, %d activation ids, each its own field\n", ENG_ACT_COUNT - 1);
    return 0;
}
