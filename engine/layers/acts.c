/* A layer's saved activations (see acts.h): releasing them, and where each
 * activation id of the model description is held. */
#include "engine/layers/acts.h"

#include <stddef.h>

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

/* Where each id lives: 0 (no entry) is an id the table has not been told
 * of, refused rather than read as some field at offset 0. */
typedef enum { UNMAPPED = 0, IN_CALLER, IN_ATTN, IN_MLP, IN_MOE } act_home_t;

static const struct {
    act_home_t home;
    size_t off;
} k_act_slot[ENG_ACT_COUNT] = {
    [ENG_A_X_MID] = {IN_CALLER, 0},
    [ENG_A_ATTN_XN] = {IN_ATTN, offsetof(eng_attn_acts_t, xn)},
    [ENG_A_ATTN_RSTD] = {IN_ATTN, offsetof(eng_attn_acts_t, rstd)},
    [ENG_A_Q] = {IN_ATTN, offsetof(eng_attn_acts_t, q)},
    [ENG_A_K] = {IN_ATTN, offsetof(eng_attn_acts_t, k)},
    [ENG_A_V] = {IN_ATTN, offsetof(eng_attn_acts_t, v)},
    [ENG_A_Q_PRE] = {IN_ATTN, offsetof(eng_attn_acts_t, q_pre)},
    [ENG_A_K_PRE] = {IN_ATTN, offsetof(eng_attn_acts_t, k_pre)},
    [ENG_A_Q_RSTD] = {IN_ATTN, offsetof(eng_attn_acts_t, q_rstd)},
    [ENG_A_K_RSTD] = {IN_ATTN, offsetof(eng_attn_acts_t, k_rstd)},
    [ENG_A_ATT] = {IN_ATTN, offsetof(eng_attn_acts_t, att)},
    [ENG_A_LSE] = {IN_ATTN, offsetof(eng_attn_acts_t, lse)},
    [ENG_A_MLP_XN] = {IN_MLP, offsetof(eng_mlp_acts_t, xn)},
    [ENG_A_MLP_RSTD] = {IN_MLP, offsetof(eng_mlp_acts_t, rstd)},
    [ENG_A_DENSE_G] = {IN_MLP, offsetof(eng_mlp_acts_t, g)},
    [ENG_A_DENSE_U] = {IN_MLP, offsetof(eng_mlp_acts_t, u)},
    [ENG_A_ROUTER_LOGITS] = {IN_MOE, offsetof(moe_layer_acts_t, logits)},
    [ENG_A_ROUTER_PROBS] = {IN_MOE, offsetof(moe_layer_acts_t, probs)},
    [ENG_A_TOPW] = {IN_MOE, offsetof(moe_layer_acts_t, topw)},
    [ENG_A_TOPK_IDX] = {IN_MOE, offsetof(moe_layer_acts_t, idx)},
    [ENG_A_EXPERT_COUNTS] = {IN_MOE, offsetof(moe_layer_acts_t, counts)},
    [ENG_A_EXPERT_OFFSETS] = {IN_MOE, offsetof(moe_layer_acts_t, offsets)},
    [ENG_A_PERM] = {IN_MOE, offsetof(moe_layer_acts_t, perm_tok)},
    [ENG_A_INV_PERM] = {IN_MOE, offsetof(moe_layer_acts_t, inv)},
    [ENG_A_EXPERT_X] = {IN_MOE, offsetof(moe_layer_acts_t, xp)},
    [ENG_A_EXPERT_G] = {IN_MOE, offsetof(moe_layer_acts_t, g)},
    [ENG_A_EXPERT_U] = {IN_MOE, offsetof(moe_layer_acts_t, u)},
    [ENG_A_EXPERT_OUT] = {IN_MOE, offsetof(moe_layer_acts_t, ep)},
    [ENG_A_SHARED_G] = {IN_MOE, offsetof(moe_layer_acts_t, sg)},
    [ENG_A_SHARED_U] = {IN_MOE, offsetof(moe_layer_acts_t, su)},
    [ENG_A_SHARED_OUT] = {IN_MOE, offsetof(moe_layer_acts_t, so)},
    [ENG_A_SHARED_GATE_LOGIT] = {IN_MOE, offsetof(moe_layer_acts_t, sgl)},
};

void **eng_layer_act_slot(eng_attn_acts_t *a, eng_mlp_acts_t *m, eng_act_id_t id) {
    MT_CHECK((unsigned)id < ENG_ACT_COUNT && k_act_slot[id].home != UNMAPPED,
             "saved activation id %d has no field in the layers' acts (engine/layers/acts.c)", (int)id);
    char *base = NULL;
    switch (k_act_slot[id].home) {
    case UNMAPPED:
    case IN_CALLER: return NULL;
    case IN_ATTN: base = (char *)a; break;
    case IN_MLP: base = (char *)m; break;
    case IN_MOE: base = (char *)&m->moe; break;
    }
    return (void **)(base + k_act_slot[id].off);
}
