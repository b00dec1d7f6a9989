/* A layer's saved activations on the device: the attention half's and the
 * MLP half's (moe/'s for a sparse MLP), which the forward allocates, the
 * executor keeps, offloads or drops, and the backward consumes.
 *
 * Which of them a layer saves, and their sizes, come from the model
 * description (engine/model/desc/model_desc.h); the structs say where each
 * is held, and eng_layer_act_slot maps the description's ids to those
 * fields, here beside them so that a new field and its id meet in one
 * place. */
#ifndef MT_ENGINE_LAYERS_ACTS_H
#define MT_ENGINE_LAYERS_ACTS_H

#include "engine/model/desc/model_desc.h"
#include "kernels/device.h"
#include "moe/moe_layer.h"

typedef struct {
    float *xn, *rstd;            /* (n, H), (n) input norm; xn in the description's dtype for it (bf16 in a
                                  * bf16 run: only q/k/v's products read it), so use it as an operand */
    float *q, *k, *v;            /* (n, nh*hd), (n, nkv*hd) x2: after q/k norm and RoPE; q, k, v and att
                                  * in the description's dtype for them (bf16 in a bf16 run where the
                                  * tensor-core attention takes the shape: engine/model/desc/decoder.c) */
    float *q_pre, *k_pre;        /* before the per-head norm (Qwen3) */
    float *q_rstd, *k_rstd;      /* (n*nh), (n*nkv) */
    float *att;                  /* (n, nh*hd) attention output */
    float *lse;                  /* (B, nh, T) */
    bool tc;                     /* att and lse came from the tensor-core path (attn_core.c): the
                                  * backward takes it too */
} eng_attn_acts_t;

typedef struct {
    float *xn, *rstd;            /* (n, H), (n) post-attention norm */
    float *g, *u;                /* dense MLP: (n, Id) */
    moe_layer_acts_t moe;        /* sparse MLP */
    bool is_moe;
} eng_mlp_acts_t;

/* Frees every saved activation of the half (NULL ones are skipped) and
 * clears its pointers. */
void eng_attn_acts_release(kern_device_t *dev, eng_attn_acts_t *a);
void eng_mlp_acts_release(kern_device_t *dev, eng_mlp_acts_t *a);

/* The field of a layer's acts that holds the description's activation
 * `id` (in a, m, or m's MoE acts); NULL for ENG_A_X_MID, the residual
 * between the halves, which the caller holds. */
void **eng_layer_act_slot(eng_attn_acts_t *a, eng_mlp_acts_t *m, eng_act_id_t id);

#endif
