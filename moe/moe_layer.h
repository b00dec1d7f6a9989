/* One sparse MoE block, forward and backward, on any backend.
 *
 * Input xn (n, H) (the post-attention-normed hidden states), output
 * y (n, H) = sum over the k chosen experts of w * expert(xn)
 *           [+ sigmoid(shared_gate . xn) * shared_expert(xn)]   (Qwen2-MoE)
 *           [+ shared_expert(xn)]      (DeepSeek, GLM-4.5: no sh_expert_gate)
 * Each expert is down(silu(gate(x)) * up(x)).  Tokens are permuted so that
 * each expert's rows are contiguous and every expert runs as one product of
 * a grouped GEMM; experts that received no token are not run and get no
 * gradient (their `used` flag stays false).
 *
 * The block allocates its activations from the device arena in forward and
 * frees them in backward (moe_layer_acts_release), so the device budget
 * sees them.  Nothing here knows about the engine's parameter registry:
 * the caller passes device pointers. */
#ifndef MT_MOE_MOE_LAYER_H
#define MT_MOE_MOE_LAYER_H

#include <stdbool.h>
#include <stdint.h>

#include "kernels/device.h"
#include "kernels/lora.h"
#include "kernels/ops.h"
#include "moe/expert_parallel.h"

/* The activations forward saves for backward (moe_layer_acts_t's fields). */
typedef enum {
    MOE_ACT_LOGITS = 0, MOE_ACT_PROBS, MOE_ACT_TOPW, MOE_ACT_IDX,
    MOE_ACT_COUNTS, MOE_ACT_OFFSETS, MOE_ACT_PERM, MOE_ACT_INV,
    MOE_ACT_XP, MOE_ACT_G, MOE_ACT_U, MOE_ACT_EP,
    MOE_ACT_SG, MOE_ACT_SU, MOE_ACT_SO, MOE_ACT_SGL,
    MOE_ACT_COUNT,
} moe_act_t;

/* One saved activation's size for n tokens: (per_token * n + fixed)
 * elements of dtype.  The caller fills these from its model description
 * (the engine's eng_moe_dims), so the block allocates exactly what the
 * description says it saves. */
typedef struct {
    int64_t per_token, fixed;
    mt_dtype_t dtype;
} moe_act_size_t;

typedef struct {
    int H, E, k, I;      /* hidden, experts, top-k, expert width */
    int Is;              /* shared expert width, 0 = none */
    kern_router_mode_t router_mode;
    /* DeepSeek-V3 / GLM-4.5: the grouped sigmoid router (kernels/router_group.h)
     * instead of router_mode's softmax; it has no load-balancing term */
    bool router_grouped;
    kern_router_group_t router_group;
    mt_dtype_t compute;  /* how products are formed (kernels/gemm.h): MT_F32 or MT_BF16 */
    moe_act_size_t acts[MOE_ACT_COUNT];
} moe_layer_dims_t;

/* Device pointers of one layer's parameters (or of their gradients), all
 * stored as `dtype`: the weights' working dtype (F32 or BF16), F32 for
 * gradients. */
typedef struct {
    void *router;                /* (E, H), always F32 (see moe_layer.c) */
    void **gate, **up, **down;   /* E pointers: (I, H), (I, H), (H, I) */
    void *sh_gate, *sh_up, *sh_down; /* (Is, H), (Is, H), (H, Is) */
    void *sh_expert_gate;        /* (1, H); NULL: the shared expert's output is added ungated */
    const float *router_bias;    /* (E) the grouped router's e_score_correction_bias (a buffer, no
                                  * gradient), NULL = none; read in forward only */
    mt_dtype_t dtype;
    /* LoRA factors (kernels/lora.h) in the weights' table: per routed expert
     * (E entries each, or NULL when no expert module is adapted; an entry
     * with a == NULL has none), and one each for the shared expert, its gate
     * and the router (a == NULL: none).  In backward their ga / gb are the
     * factors' gradient targets (NULL: not wanted).  The gradient table's
     * entries are not read.  Frozen base weights have NULL gradient targets:
     * their products are skipped. */
    kern_lora_t *lora_gate, *lora_up, *lora_down;
    kern_lora_t lora_sh_gate, lora_sh_up, lora_sh_down, lora_sh_expert_gate, lora_router;
    /* Forward only, may be NULL: called once routing is known and before any
     * expert runs, with the tokens per expert (host), to make the weights of
     * the experts that received tokens available and store their device
     * pointers in gate/up/down (weights streamed from host memory). */
    mt_status_t (*fetch_experts)(void *ctx, const int32_t *counts, void **gate, void **up,
                                 void **down, mt_error_t *err);
    void *fetch_ctx;
    /* Expert parallelism (moe/expert_parallel.h), NULL: none.  With it the
     * routed experts' pointers (gate/up/down, and their gradients) are read
     * only for the experts this rank owns, and fetch_experts is told the
     * rows this rank's experts receive from every device. */
    const moe_ep_t *ep;
} moe_layer_params_t;

/* What forward saves for backward. */
typedef struct {
    int n, m;                 /* tokens, permuted rows (n * k) */
    float *logits, *probs;    /* (n, E); probs are the sigmoid scores for the grouped router */
    float *topw;              /* (n, k) */
    int32_t *idx;             /* (n, k) */
    int32_t *counts, *offsets, *perm_tok, *inv; /* device plan */
    int32_t *counts_host;     /* (E) host copy: sizes of the grouped products */
    int32_t *offsets_host;    /* (E + 1) */
    void *xp;                 /* (m, H) gathered inputs in acts[MOE_ACT_XP].dtype: bf16 in a bf16
                               * run, as only the experts' products read them (rounded anyway) */
    void *g, *u;              /* (m, I) gate and up projections in acts[MOE_ACT_G / _U].dtype: bf16
                               * in a bf16 run, where the products write them as autocast does;
                               * gpt-oss's fused block keeps its gate_up fp32 in g */
    void *ep;                 /* (m, H) expert outputs in acts[MOE_ACT_EP].dtype (bf16 in a bf16
                               * run, as g and u) */
    float *sg, *su, *so;      /* (n, Is), (n, Is), (n, H) shared expert */
    float *sgl;               /* (n) shared gate logit */
    /* expert parallelism: the rows this rank's experts received, and their
     * activations (g, u above stay NULL; ep above is this rank's own rows) */
    struct moe_ep_acts *ep_acts;
} moe_layer_acts_t;

/* Forward: y (n, H) is overwritten. On return acts holds saved tensors and
 * counts_host says which experts received tokens. */
mt_status_t moe_layer_forward(kern_device_t *dev, const moe_layer_dims_t *d,
                              const moe_layer_params_t *p, const float *xn, int n, float *y,
                              moe_layer_acts_t *acts, mt_error_t *err);

/* Backward: dxn (n, H) is overwritten with the input gradient; parameter
 * gradients are accumulated (+=) into gp, for experts with tokens only.
 * aux_dp (E) / tok_w (n) carry the load-balancing loss term (may be NULL). */
mt_status_t moe_layer_backward(kern_device_t *dev, const moe_layer_dims_t *d,
                               const moe_layer_params_t *p, const moe_layer_params_t *gp,
                               const float *xn, const float *dy, const float *aux_dp,
                               const float *tok_w, moe_layer_acts_t *acts, float *dxn,
                               mt_error_t *err);

void moe_layer_acts_release(kern_device_t *dev, moe_layer_acts_t *acts);

/* (E) host, after forward: the rows each routed expert ran on this device,
 * i.e. which experts get a gradient (and need their weights) here:
 * counts_host, or under expert parallelism the rows this rank's experts
 * received from every device (0 for the other ranks' experts). */
const int32_t *moe_layer_expert_rows(const moe_layer_acts_t *acts);

#endif
