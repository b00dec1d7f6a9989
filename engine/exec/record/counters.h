/* The executor's counters of one optimizer step: what crossed the link and
 * how MoE layers' expert batches moved (the staging report's numbers, see
 * moetune profile), and the per-layer copy counts of the running
 * micro-batch they are summed from.
 *
 * The optimizer step fetches the next step's first blocks before that step
 * begins (between_steps); those copies are carried and counted in the next
 * step's first micro-batch, where the simulator counts them too. */
#ifndef MT_ENGINE_EXEC_COUNTERS_H
#define MT_ENGINE_EXEC_COUNTERS_H

#include <stdbool.h>
#include <stdint.h>

/* The executor's own counts, since the last eng_optim_begin_step.  Index
 * [0] is H2D (weight fetches), [1] D2H (gradients). */
typedef struct {
    uint64_t moe_passes[2];     /* (MoE layer, micro-batch) pairs whose experts moved that way */
    uint64_t moe_copies[2];     /* copies the batches holding those experts issued */
    int max_moe_copies[2];      /* most copies one MoE layer took in one micro-batch */
    uint64_t experts_moved[2];  /* expert fetches / expert gradient copies */
    uint64_t experts_skipped[2];/* ... not made because the expert got no token */
    uint64_t experts_unused;    /* prefetched for a forward, then got no token */
    uint64_t acts_unstaged;     /* offloads that fell back to a plain pinned buffer (pool too small) */
    uint64_t acts_offloaded;    /* bytes of saved activations offloaded */
    /* layer-major order: bytes of micro-batches' block inputs sent to the
     * host after a layer's forward, and fetched back before its backward */
    uint64_t inputs_d2h_bytes, inputs_h2d_bytes;
    /* Bytes that crossed the link: weight working copies host -> device
     * (streamed fetches and resident weights refreshed by a host optimizer;
     * bf16 copies count their bf16 bytes) and gradients device -> host. */
    uint64_t weight_h2d_bytes;
    uint64_t grad_d2h_bytes;
} eng_exec_staging_counters_t;

typedef struct {
    eng_exec_staging_counters_t ctr; /* since the step began; the executor's modules add to it directly */
    int nlayers;
    int (*mb_copies)[2];   /* per layer: expert-batch copies this micro-batch, per direction */
    bool between_steps;    /* fetches now are the next step's (exec_counters_moe_batch carries them) */
    int *carry_copies;     /* per layer, H2D, for the next step's first micro-batch */
    uint64_t carry_experts;
    uint64_t carry_weight_bytes; /* weight bytes fetched between steps, the next step's */
} exec_counters_t;

void exec_counters_init(exec_counters_t *c, int nlayers);
void exec_counters_free(exec_counters_t *c);
/* Zeroes the step's counts (carried fetches stay for its first micro-batch). */
void exec_counters_step_begin(exec_counters_t *c);
void exec_counters_micro_begin(exec_counters_t *c);
/* Folds the micro-batch's per-layer copy counts into the step's. */
void exec_counters_micro_end(exec_counters_t *c);
/* Layer l's experts moved in one batch direction dir (0 H2D, 1 D2H):
 * `copies` copies for `experts` experts. */
void exec_counters_moe_batch(exec_counters_t *c, int l, int dir, int copies, int experts);
/* Weight working-copy bytes sent host -> device (a fetch between steps
 * counts in the next step, whose forward it serves). */
void exec_counters_weight_h2d(exec_counters_t *c, uint64_t bytes);

#endif
