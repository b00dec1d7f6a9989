/* A layer's saved activations (see acts.h): releasing them. */
#include "engine/layers/acts.h"

#include "engine/layers/ops_common.h"

void eng_attn_acts_release(kern_device_t *dev, eng_attn_acts_t *a) {
    float **ptrs[] = {&a->xn, &a->rstd, &a->q, &a->k, &a->v, &a->q_pre, &a->k_pre,
                      &a->q_rstd, &a->k_rstd, &a->att, &a->lse};
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) eng_dfree(dev, ptrs[i]);
}

void eng_mlp_acts_release(kern_device_t *dev, eng_mlp_acts_t *a) {
    eng_dfree(dev, &a->xn);
    eng_dfree(dev, &a->rstd);
    eng_dfree(dev, &a->g);
    eng_dfree(dev, &a->u);
    if (a->is_moe) moe_layer_acts_release(dev, &a->moe);
}
