/* Which experts of a MoE layer a streamed fetch should bring, before the
 * router has run: the hook behind the executor's expert prefetch.
 *
 * Backward knows which experts the forward used (the router's counts are
 * recorded as each layer runs).  Forward cannot know before the router
 * runs, so the prediction is the experts the previous micro-batch used in
 * that layer (with many tokens per micro-batch nearly every expert); the
 * executor then fetches whatever the router picks beyond it and drops a
 * prefetched expert that gets no token.  Knows nothing of the engine. */
#ifndef MT_MOE_EXPERT_PREDICT_H
#define MT_MOE_EXPERT_PREDICT_H

#include <stdbool.h>
#include <stdint.h>

typedef struct {
    int num_layers, num_experts;
    int32_t **counts; /* per layer: tokens per expert in the latest forward (NULL for a dense layer) */
    bool valid;       /* counts hold a finished forward */
} moe_predict_t;

/* is_moe: (num_layers) which layers route to experts. */
void moe_predict_init(moe_predict_t *p, int num_layers, const bool *is_moe, int num_experts);
void moe_predict_free(moe_predict_t *p);
/* Layer l's router has chosen: counts (num_experts, host) tokens per expert. */
void moe_predict_observe(moe_predict_t *p, int l, const int32_t *counts);
/* A forward pass has finished: its counts predict the next forward. */
void moe_predict_forward_done(moe_predict_t *p);
/* Tokens per expert to fetch layer l for: in backward, what this forward
 * routed; in forward, the previous forward's, or NULL when there is none
 * yet (or l is dense). */
const int32_t *moe_predict_counts(const moe_predict_t *p, int l, bool backward);

#endif
