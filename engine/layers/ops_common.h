/* What every family's block code computes with: operands and products, a
 * parameter's working copy and gradient target, its LoRA term, a frozen
 * small parameter's scratch gradient, the pre-norm's backward into the
 * residual, saved activations' sizes, and the allocation macros.
 *
 * One file below the block code of every family (blocks.c, mla.c,
 * gpt_oss.c, moe.c), so that each half is written with the same helpers
 * and none of them calls into another family's file for them.
 *
 * Allocation inside a block goes to the function's `fail:` cleanup when it
 * fails, as in moe/'s blocks, with the same macros (moe/moe_alloc.h): ALLOC
 * (device `dev`, `err` in scope) and TRY, and ALLOC_SAVED for a saved
 * activation, sized by the model description. */
#ifndef MT_ENGINE_LAYERS_OPS_COMMON_H
#define MT_ENGINE_LAYERS_OPS_COMMON_H

#include "engine/layers/env.h"
#include "kernels/lora.h"
#include "moe/moe_alloc.h"

/* The dtype "compute"-class saved activations are stored in (the model
 * description's classes resolve against it). */
mt_dtype_t eng_act_storage_dtype(const eng_model_t *m);
/* Bytes and storage dtype of layer `layer`'s saved activation `id` for n
 * tokens, from the model description, which the executor and the
 * scheduler read too (aborts when the description does not list it: block
 * code using an activation its family does not describe is a bug). */
size_t eng_layer_act_bytes(const eng_model_t *m, int layer, eng_act_id_t id, int n);
mt_dtype_t eng_layer_act_dtype(const eng_model_t *m, int layer, eng_act_id_t id);

/* Saved activation `id` of layer `layer` for n tokens, sized by the model
 * description (env, layer, n and err in scope). */
#define ALLOC_SAVED(ptr, id, tag)                                                                           \
    do {                                                                                                    \
        (ptr) = (float *)kern_alloc(env->dev, eng_layer_act_bytes(env->model, layer, (id), n), (tag), err); \
        if (!(ptr)) goto fail;                                                                              \
    } while (0)

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

/* Parameter i's device working copy (fp32, or bf16 in a bf16 run) as an
 * operand; i < 0: none. */
eng_operand_t eng_weight(eng_layer_env_t *env, int i);
/* Its working copy for an fp32 kernel (norms, biases: only products read
 * bf16 copies); aborts when it is bf16.  i < 0: NULL. */
float *eng_weight_f32(eng_layer_env_t *env, int i);
/* The gradient target the executor prepared for this backward; NULL for a
 * frozen parameter (a LoRA run's base), whose gradient is not formed. */
float *eng_grad(eng_layer_env_t *env, int i);
/* The weight gradient product g(i) += op(A)^T B, skipped for a frozen weight. */
void eng_mm_grad(eng_layer_env_t *env, int i, eng_operand_t A, eng_operand_t B, int M, int N, int K);

/* Parameter i's LoRA factors (kernels/lora.h): a == NULL when it has none
 * (or i < 0).  Gradient targets are set in backward, when prepared. */
kern_lora_t eng_lora_of(const eng_layer_env_t *env, int i);
/* y (n, out) += the LoRA term of module i on x (n, in); none: nothing. */
mt_status_t eng_lora_fwd(eng_layer_env_t *env, int i, float *y, eng_operand_t x, int n, int in, int out,
                         mt_error_t *err);
/* Its backward: the factors' gradients, and dx (n, in) += its input gradient. */
mt_status_t eng_lora_bwd(eng_layer_env_t *env, int i, const float *dy, eng_operand_t x, float *dx, int n, int in,
                         int out, mt_error_t *err);

/* The gradient target of a small parameter (norm, bias), or a zeroed
 * scratch when it is frozen (*scratch set; the caller frees it); NULL on an
 * allocation failure (err set). */
float *eng_grad_or_scratch(eng_layer_env_t *env, int i, float **scratch, mt_error_t *err);
/* dx (n, H) += rmsnorm_bwd(dxn) through norm weight `norm` at input x:
 * how both halves of every family's layer end their backward. */
mt_status_t eng_norm_bwd_into_residual(eng_layer_env_t *env, int norm, float *dx, const float *dxn, const float *x,
                                       const float *rstd, int n, const char *tag, mt_error_t *err);

/* Frees *p when set and clears it. */
void eng_dfree(kern_device_t *dev, float **p);

#endif
