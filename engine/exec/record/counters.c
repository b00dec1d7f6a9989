/* The executor's step counters (see counters.h). */
#include "engine/exec/record/counters.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void exec_counters_init(exec_counters_t *c, int nlayers) {
    memset(c, 0, sizeof *c);
    c->nlayers = nlayers;
    c->mb_copies = calloc((size_t)(nlayers > 0 ? nlayers : 1), sizeof *c->mb_copies);
    c->carry_copies = calloc((size_t)(nlayers > 0 ? nlayers : 1), sizeof *c->carry_copies);
    MT_CHECK(c->mb_copies && c->carry_copies, "out of memory for the executor's counters");
}

void exec_counters_free(exec_counters_t *c) {
    free(c->mb_copies);
    free(c->carry_copies);
    memset(c, 0, sizeof *c);
}

void exec_counters_step_begin(exec_counters_t *c) {
    memset(&c->ctr, 0, sizeof c->ctr);
    c->ctr.weight_h2d_bytes = c->carry_weight_bytes;
    c->carry_weight_bytes = 0;
}

void exec_counters_weight_h2d(exec_counters_t *c, uint64_t bytes) {
    if (c->between_steps) c->carry_weight_bytes += bytes;
    else c->ctr.weight_h2d_bytes += bytes;
}

void exec_counters_micro_begin(exec_counters_t *c) {
    for (int l = 0; l < c->nlayers; l++) {
        c->mb_copies[l][0] = c->carry_copies[l];
        c->mb_copies[l][1] = 0;
        c->carry_copies[l] = 0;
    }
    c->ctr.experts_moved[0] += c->carry_experts;
    c->carry_experts = 0;
}

void exec_counters_micro_end(exec_counters_t *c) {
    for (int l = 0; l < c->nlayers; l++)
        for (int d = 0; d < 2; d++) {
            const int n = c->mb_copies[l][d];
            if (n <= 0) continue;
            c->ctr.moe_passes[d]++;
            c->ctr.moe_copies[d] += (uint64_t)n;
            if (n > c->ctr.max_moe_copies[d]) c->ctr.max_moe_copies[d] = n;
        }
}

void exec_counters_moe_batch(exec_counters_t *c, int l, int dir, int copies, int experts) {
    if (dir == 0 && c->between_steps) {
        c->carry_copies[l] += copies;
        c->carry_experts += (uint64_t)experts;
        return;
    }
    c->mb_copies[l][dir] += copies;
    c->ctr.experts_moved[dir] += (uint64_t)experts;
}
