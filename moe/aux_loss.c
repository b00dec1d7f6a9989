/* The load-balancing aux loss (see aux_loss.h). */
#include "moe/aux_loss.h"

#include <stdlib.h>
#include <string.h>

void moe_aux_init(moe_aux_t *a, int num_experts, int top_k) {
    memset(a, 0, sizeof *a);
    a->num_experts = num_experts;
    a->top_k = top_k;
    a->F = calloc((size_t)num_experts + 1, sizeof *a->F);
    a->P = calloc((size_t)num_experts + 1, sizeof *a->P);
    MT_CHECK(a->F && a->P, "out of host memory for the aux loss");
}

void moe_aux_free(moe_aux_t *a) {
    free(a->F);
    free(a->P);
    memset(a, 0, sizeof *a);
}

void moe_aux_accumulate(moe_aux_t *a, kern_device_t *dev, const moe_layer_acts_t *acts, int n,
                        const uint8_t *mask) {
    const int E = a->num_experts, k = a->top_k;
    int32_t *idx = malloc((size_t)n * k * sizeof *idx);
    float *probs = malloc((size_t)n * E * sizeof *probs);
    MT_CHECK(idx && probs, "out of host memory for the aux loss");
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    kern_memcpy_d2h(dev, s, idx, acts->idx, (size_t)n * k * sizeof *idx);
    kern_memcpy_d2h(dev, s, probs, acts->probs, (size_t)n * E * sizeof *probs);
    kern_stream_sync(dev, s);
    for (int t = 0; t < n; t++) {
        if (!mask[t]) continue;
        for (int j = 0; j < k; j++) a->F[idx[(size_t)t * k + j]] += 1.0;
        for (int e = 0; e < E; e++) a->P[e] += probs[(size_t)t * E + e];
        a->N += 1.0;
    }
    free(idx);
    free(probs);
}

/* aux = E * sum_e F[e] P[e] with F, P divided by N; d aux / d probs_l[t, e] = E * F[e] / N * mask[t]. */
double moe_aux_finish(const moe_aux_t *a, double coef, double loss_scale, float *coef_out) {
    const int E = a->num_experts;
    const double N = a->N;
    double aux = 0;
    for (int e = 0; e < E; e++) {
        const double f = N > 0 ? a->F[e] / N : 0, p = N > 0 ? a->P[e] / N : 0;
        aux += f * p;
        /* coef, then loss_scale: the product order the step always used (bit-identical gradients) */
        coef_out[e] = (float)((N > 0 ? (double)E * f / N : 0) * coef * loss_scale);
    }
    return aux * E;
}
