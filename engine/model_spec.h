/* The parameter tensors of a model: HF names, shapes, and where each sits
 * (layer, expert, role).  Derived from the config alone, so the planner,
 * `inspect`, checkpoint loading/saving and random initialisation all agree
 * on one list. */
#ifndef MT_ENGINE_MODEL_SPEC_H
#define MT_ENGINE_MODEL_SPEC_H

#include <stddef.h>
#include <stdint.h>

#include "engine/model_config.h"

typedef enum {
    ENG_P_EMBED = 0,     /* model.embed_tokens.weight (V, H) */
    ENG_P_ATTN_NORM,     /* input_layernorm (H) */
    ENG_P_Q, ENG_P_K, ENG_P_V, ENG_P_O, /* (nh*hd, H), (nkv*hd, H), (nkv*hd, H), (H, nh*hd) */
    ENG_P_Q_BIAS, ENG_P_K_BIAS, ENG_P_V_BIAS,
    ENG_P_O_BIAS,        /* Qwen3 with attention_bias: o_proj has a bias too */
    ENG_P_Q_NORM, ENG_P_K_NORM, /* (hd) */
    ENG_P_MLP_NORM,      /* post_attention_layernorm (H) */
    ENG_P_ROUTER,        /* (E, H) */
    ENG_P_EXP_GATE, ENG_P_EXP_UP, ENG_P_EXP_DOWN, /* (I, H), (I, H), (H, I) */
    ENG_P_SHARED_GATE, ENG_P_SHARED_UP, ENG_P_SHARED_DOWN, /* (Is, H), (Is, H), (H, Is) */
    ENG_P_SHARED_EXPERT_GATE, /* (1, H) */
    ENG_P_DENSE_GATE, ENG_P_DENSE_UP, ENG_P_DENSE_DOWN, /* Qwen dense layers */
    ENG_P_FINAL_NORM,    /* model.norm.weight (H) */
    ENG_P_LM_HEAD,       /* lm_head.weight (V, H); absent when tied */
    ENG_P_ROLE_COUNT,
} eng_param_role_t;

typedef struct {
    char name[128];
    eng_param_role_t role;
    int layer;  /* -1 for embed / final norm / lm_head */
    int expert; /* -1 unless a routed expert tensor */
    int ndim;
    int64_t shape[2];
    size_t numel;
} eng_param_spec_t;

typedef struct {
    eng_param_spec_t *params;
    int count;
    /* index[layer][role] / expert_index[layer][expert][0..2] into params, -1 if absent */
} eng_model_spec_t;

mt_status_t eng_model_spec_build(const eng_model_config_t *cfg, eng_model_spec_t *out,
                                 mt_error_t *err);
void eng_model_spec_free(eng_model_spec_t *spec);
/* Index of the parameter with this name, or -1. */
int eng_model_spec_find(const eng_model_spec_t *spec, const char *name);
const char *eng_param_role_name(eng_param_role_t role);
size_t eng_model_spec_numel(const eng_model_spec_t *spec);
/* Parameters a token touches: everything but the experts it was not routed to. */
size_t eng_model_spec_active_numel(const eng_model_spec_t *spec, const eng_model_config_t *cfg);

#endif
