/* The decoder layer's two halves, forward and backward, for the step
 * (engine/exec/step.c), and the family-specific pieces they are made of.
 *
 *   attention half: x_mid = x_in + o_proj(attn(rope(norm_qk(qkv(rmsnorm(x_in))))))
 *   MLP half:       x_out = x_mid + mlp(rmsnorm(x_mid)), mlp = dense SwiGLU or MoE
 *
 * Forward allocates the half's saved activations (acts.h) from the device
 * arena; backward consumes and frees them.  Gradients are accumulated (+=).
 * blocks.c holds the decoder's halves and picks a family's piece where its
 * layer differs (MLA: mla.c; sparse MoE: moe.c; gpt-oss's fused experts:
 * gpt_oss.c; partial RoPE: rope_partial.c; grouped router: router_bias.c);
 * all of them compute with ops_common.h's helpers. */
#ifndef MT_ENGINE_BLOCKS_H
#define MT_ENGINE_BLOCKS_H

#include "engine/layers/acts.h"
#include "engine/layers/env.h"
#include "engine/layers/ops_common.h"
#include "engine/model/model.h"
#include "moe/moe_layer.h"

/* Streamed expert weights: called by the MoE forward once routing is known,
 * with the context given beside it (the executor provides it, to fetch the
 * experts that got tokens; NULL when all weights are resident). */
typedef mt_status_t (*eng_fetch_experts_fn)(void *ctx, int layer, const int32_t *counts, mt_error_t *err);

typedef struct {
    int B, T, n;           /* n = B * T tokens */
    const int32_t *kv_len; /* (B) device: keys attention may read per row (attention.h);
                            * NULL when every row has all T */
    const int32_t *seg_start; /* (B, T) device: where each token's packed example starts
                               * in its row (attention.h); NULL: one example per row */
    const int32_t *pos;       /* (B, T) device: each token's position in its example, the
                               * RoPE position (rope.h); NULL: the index in the row */
} eng_shape_t;

mt_status_t eng_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                             float *x_mid, eng_attn_acts_t *a, mt_error_t *err);
/* dx (n, H): on entry d(x_mid), on return d(x_in). */
mt_status_t eng_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                              float *dx, eng_attn_acts_t *a, mt_error_t *err);

mt_status_t eng_mlp_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                            float *x_out, eng_fetch_experts_fn fetch, void *fetch_ctx, eng_mlp_acts_t *a,
                            mt_error_t *err);
/* dx (n, H): on entry d(x_out), on return d(x_mid). aux_dp/tok_w: see moe_layer.h. */
mt_status_t eng_mlp_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                             float *dx, const float *aux_dp, const float *tok_w,
                             eng_mlp_acts_t *a, mt_error_t *err);

/* The sparse MoE half (moe/moe_layer.h; moe.c): y (n, H) from a->xn, the
 * streamed experts fetched through `fetch` once routing is known; and its
 * backward into dxn (n, H) from dy. */
mt_status_t eng_moe_forward(eng_layer_env_t *env, int layer, int n, eng_fetch_experts_fn fetch, void *fetch_ctx,
                            eng_mlp_acts_t *a, float *y, mt_error_t *err);
mt_status_t eng_moe_backward(eng_layer_env_t *env, int layer, const float *dy, const float *aux_dp,
                             const float *tok_w, eng_mlp_acts_t *a, float *dxn, mt_error_t *err);
/* The MoE weights (or gradients) of a layer as moe/ wants them. */
void eng_moe_params(eng_layer_env_t *env, int layer, bool gradients, moe_layer_params_t *out,
                    void **scratch_ptrs /* 3*E */);
/* moe/'s dimensions of layer `layer`, its saved activations sized from the
 * model description. */
moe_layer_dims_t eng_moe_dims(const eng_model_t *m, int layer);

/* The attention window of layer `layer`: 0 (full causal) on gpt-oss's
 * full_attention layers, else the config's sliding_window (0 = none). */
int eng_layer_window(const eng_model_config_t *c, int layer);

/* gpt-oss's MoE half (experts fused over E; engine/layers/gpt_oss.c): y (n, H)
 * from a->xn, and its backward into dxn (n, H) from dy. */
mt_status_t eng_gpt_oss_moe_forward(eng_layer_env_t *env, int layer, int n, eng_mlp_acts_t *a, float *y, mt_error_t *err);
mt_status_t eng_gpt_oss_moe_backward(eng_layer_env_t *env, int layer, const float *dy, const float *aux_dp,
                                     const float *tok_w, eng_mlp_acts_t *a, float *dxn, mt_error_t *err);

/* Multi-head Latent Attention (DeepSeek-V2/V3), eng_attn_forward/backward's
 * half when cfg.mla (mla.c); same contracts. */
mt_status_t eng_mla_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *x_mid,
                                 eng_attn_acts_t *a, mt_error_t *err);
mt_status_t eng_mla_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *dx,
                                  eng_attn_acts_t *a, mt_error_t *err);

/* The attention core (attn_core.c): a->att, a->lse from a->q, a->k, a->v
 * (kernels/attention.h), which with a->att are stored as dt (the model
 * description's dtype for them), on the tensor-core path in a bf16 run when
 * the backend takes the call, else the fp32 kernel; a->tc records which.
 * Its backward writes dq, dk, dv (fp32) from datt through the path a->tc
 * names. */
mt_status_t eng_attn_core_fwd(eng_layer_env_t *env, const eng_shape_t *sh, eng_attn_acts_t *a, mt_dtype_t dt,
                              int nh, int nkv, int hd, int window, mt_error_t *err);
mt_status_t eng_attn_core_bwd(eng_layer_env_t *env, const eng_shape_t *sh, const eng_attn_acts_t *a, mt_dtype_t dt,
                              float *dq, float *dk, float *dv, const float *datt, int nh, int nkv, int hd, int window,
                              mt_error_t *err);

/* The rotary dims per head RoPE's tables are built for: head_dim, or
 * int(head_dim * partial_rotary_factor) (GLM-4.5) (rope_partial.c). */
int eng_rope_dim(const eng_model_config_t *c);
/* RoPE (backward: its inverse) in place on q (n, nh, hd) and k (n, nkv, hd),
 * over the whole head or its first eng_rope_dim dims. */
mt_status_t eng_rope_qk(eng_layer_env_t *env, const eng_shape_t *sh, float *q, float *k, bool backward, mt_error_t *err);

/* Whether the model routes with kernels/router_group.h (DeepSeek-V2/V3,
 * GLM-4.5), and its parameters into *g (router_bias.c). */
bool eng_router_group_of(const eng_model_config_t *c, kern_router_group_t *g);
/* The grouped router's e_score_correction_bias of `layer` on the device
 * (E floats, uploaded from its host copy on the compute stream; *out NULL
 * when the layer has none).  Free with kern_free after the router ran. */
mt_status_t eng_router_bias_upload(eng_layer_env_t *env, int layer, float **out, mt_error_t *err);

#endif
