/* The load-balancing aux loss of a MoE model (HF's load_balancing_loss_func
 * with the attention mask): token fractions F[e] and mean router
 * probabilities P[e] over the unmasked tokens of every MoE layer, then
 * aux = E * sum_e F[e] P[e].
 *
 * The executor calls it as a hook: moe_aux_accumulate after each MoE
 * layer's forward, moe_aux_finish once the forward ends.  It knows nothing
 * of the engine; sums run in double in token, then expert order, so the
 * value does not depend on where the layer ran. */
#ifndef MT_MOE_AUX_LOSS_H
#define MT_MOE_AUX_LOSS_H

#include <stdint.h>

#include "kernels/device.h"
#include "moe/moe_layer.h"

typedef struct {
    int num_experts, top_k;
    double *F;  /* (E) tokens routed to each expert, summed over layers */
    double *P;  /* (E) router probabilities, summed over layers */
    double N;   /* unmasked (token, layer) pairs */
} moe_aux_t;

void moe_aux_init(moe_aux_t *a, int num_experts, int top_k);
void moe_aux_free(moe_aux_t *a);
/* Adds one MoE layer's routing (acts->idx (n, k), acts->probs (n, E) on
 * dev) over the tokens whose mask is set.  Reads them back on the compute
 * stream and waits for it. */
void moe_aux_accumulate(moe_aux_t *a, kern_device_t *dev, const moe_layer_acts_t *acts, int n,
                        const uint8_t *mask);
/* The aux loss (before its coefficient); coef_out (E, host) receives
 * d(coef * loss_scale * aux) / d probs_l[t, e] for an unmasked token:
 * E * F[e] / N^2 * coef * loss_scale (0 when no token was counted). */
double moe_aux_finish(const moe_aux_t *a, double coef, double loss_scale, float *coef_out);

#endif
