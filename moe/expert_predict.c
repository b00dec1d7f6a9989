/* Expert prediction for prefetch (see expert_predict.h). */
#include "moe/expert_predict.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

void moe_predict_init(moe_predict_t *p, int num_layers, const bool *is_moe, int num_experts) {
    memset(p, 0, sizeof *p);
    p->num_layers = num_layers;
    p->num_experts = num_experts;
    p->counts = calloc((size_t)(num_layers > 0 ? num_layers : 1), sizeof *p->counts);
    MT_CHECK_ALLOC(p->counts, "expert counts");
    for (int l = 0; l < num_layers; l++)
        if (is_moe[l]) {
            p->counts[l] = calloc((size_t)num_experts, sizeof(int32_t));
            MT_CHECK_ALLOC(p->counts[l], "expert counts");
        }
}

void moe_predict_free(moe_predict_t *p) {
    if (p->counts)
        for (int l = 0; l < p->num_layers; l++) free(p->counts[l]);
    free(p->counts);
    memset(p, 0, sizeof *p);
}

void moe_predict_observe(moe_predict_t *p, int l, const int32_t *counts) {
    memcpy(p->counts[l], counts, (size_t)p->num_experts * sizeof(int32_t));
}

void moe_predict_forward_done(moe_predict_t *p) { p->valid = true; }

const int32_t *moe_predict_counts(const moe_predict_t *p, int l, bool backward) {
    if (l < 0 || l >= p->num_layers) return NULL;
    return backward || p->valid ? p->counts[l] : NULL;
}
