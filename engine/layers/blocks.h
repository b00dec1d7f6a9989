/* The decoder layer's two halves, forward and backward, for the step
 * (engine/step.c).  Internal to the engine.
 *
 *   attention half: x_mid = x_in + o_proj(attn(rope(norm_qk(qkv(rmsnorm(x_in))))))
 *   MLP half:       x_out = x_mid + mlp(rmsnorm(x_mid)), mlp = dense SwiGLU or MoE
 *
 * Forward allocates the half's saved activations from the device arena;
 * backward consumes and frees them.  Gradients are accumulated (+=). */
#ifndef MT_ENGINE_BLOCKS_H
#define MT_ENGINE_BLOCKS_H

#include "engine/layers/env.h"
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
} eng_shape_t;

typedef struct {
    float *xn, *rstd;            /* (n, H), (n) input norm; xn in the description's dtype for it (bf16 in a
                                  * bf16 run: only q/k/v's products read it), so use it as an operand */
    float *q, *k, *v;            /* (n, nh*hd), (n, nkv*hd) x2: after q/k norm and RoPE */
    float *q_pre, *k_pre;        /* before the per-head norm (Qwen3) */
    float *q_rstd, *k_rstd;      /* (n*nh), (n*nkv) */
    float *att;                  /* (n, nh*hd) attention output */
    float *lse;                  /* (B, nh, T) */
} eng_attn_acts_t;

typedef struct {
    float *xn, *rstd;            /* (n, H), (n) post-attention norm */
    float *g, *u;                /* dense MLP: (n, Id) */
    moe_layer_acts_t moe;        /* sparse MLP */
    bool is_moe;
} eng_mlp_acts_t;

mt_status_t eng_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                             float *x_mid, eng_attn_acts_t *a, mt_error_t *err);
/* dx (n, H): on entry d(x_mid), on return d(x_in). */
mt_status_t eng_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in,
                              float *dx, eng_attn_acts_t *a, mt_error_t *err);
void eng_attn_acts_release(kern_device_t *dev, eng_attn_acts_t *a);

mt_status_t eng_mlp_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                            float *x_out, eng_fetch_experts_fn fetch, void *fetch_ctx, eng_mlp_acts_t *a,
                            mt_error_t *err);
/* dx (n, H): on entry d(x_out), on return d(x_mid). aux_dp/tok_w: see moe_layer.h. */
mt_status_t eng_mlp_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_mid,
                             float *dx, const float *aux_dp, const float *tok_w,
                             eng_mlp_acts_t *a, mt_error_t *err);
void eng_mlp_acts_release(kern_device_t *dev, eng_mlp_acts_t *a);

/* The MoE weights (or gradients) of a layer as moe/ wants them. */
void eng_moe_params(eng_layer_env_t *env, int layer, bool gradients, moe_layer_params_t *out,
                    void **scratch_ptrs /* 3*E */);
/* The dtype "compute"-class saved activations are stored in (the model
 * description's classes resolve against it). */
mt_dtype_t eng_act_storage_dtype(const eng_model_t *m);

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

/* An operand of a product: a device tensor and its storage dtype. */
typedef struct {
    const void *data;
    mt_dtype_t dtype;
} eng_operand_t;

/* An fp32 activation or gradient as an operand. */
eng_operand_t eng_f32(const float *p);
/* C (F32) = alpha * op(A) op(B) + beta * C on the compute stream, formed in
 * the model's compute dtype (kernels/gemm.h); argument order as kern_mm_make. */
void eng_mm(eng_layer_env_t *env, float *C, eng_operand_t A, eng_operand_t B, int M, int N, int K, bool trans_a,
            bool trans_b, float alpha, float beta);

/* ---- shared with the family-specific halves beside blocks.c (blocks_mla.c,
 * rope_partial.c, router_bias.c): the same helpers, so every family sizes
 * its saved activations, forms frozen weights' gradients and closes the
 * residual the one way. ---- */

/* Bytes and storage dtype of layer `layer`'s saved activation `id` for n
 * tokens, from the model description (aborts when it is not described). */
size_t eng_blocks_act_bytes(const eng_model_t *m, int layer, eng_act_id_t id, int n);
mt_dtype_t eng_blocks_act_dtype(const eng_model_t *m, int layer, eng_act_id_t id);
/* Parameter i's LoRA factors (a == NULL: none). */
kern_lora_t eng_blocks_lora_of(const eng_layer_env_t *env, int i);
/* The gradient target of a small parameter (norm, bias), or a zeroed
 * scratch when it is frozen (*scratch set; the caller frees it); NULL on an
 * allocation failure (err set). */
float *eng_blocks_grad_or_scratch(eng_layer_env_t *env, int i, float **scratch, mt_error_t *err);
/* dx (n, H) += rmsnorm_bwd(dxn) through norm weight `norm` at input x. */
mt_status_t eng_blocks_norm_bwd_into_residual(eng_layer_env_t *env, int norm, float *dx, const float *dxn, const float *x,
                                              const float *rstd, int n, const char *tag, mt_error_t *err);

/* Multi-head Latent Attention (DeepSeek-V2/V3), eng_attn_forward/backward's
 * half when cfg.mla (blocks_mla.c); same contracts. */
mt_status_t eng_mla_attn_forward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *x_mid,
                                 eng_attn_acts_t *a, mt_error_t *err);
mt_status_t eng_mla_attn_backward(eng_layer_env_t *env, int layer, const eng_shape_t *sh, const float *x_in, float *dx,
                                  eng_attn_acts_t *a, mt_error_t *err);

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
