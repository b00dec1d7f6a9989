/* A model on a device: its parameters (weights, gradients, AdamW state)
 * and the forward/backward of one micro-batch.
 *
 * Parameters are indexed by the model spec (engine/model_spec.h): one
 * eng_param_t per HF tensor, so gradients, optimizer state and checkpoint
 * names line up one to one.  In this version every parameter, its gradient
 * and its AdamW moments live in the device arena (the scheduler's keep_all
 * plan); the device budget is enforced on all of them and on activations.
 *
 * Semantics follow the HF modeling code of each family (see
 * shared/notes/conventions.md): RMSNorm, rotate_half RoPE, causal GQA
 * attention, the family's router, SwiGLU experts, Qwen2-MoE's gated shared
 * expert, Qwen3's per-head q/k norm, causal-LM loss with -100 ignored and
 * the load-balancing aux loss when output_router_logits is set. */
#ifndef MT_ENGINE_MODEL_H
#define MT_ENGINE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/data.h"
#include "engine/model_config.h"
#include "engine/model_spec.h"
#include "kernels/device.h"
#include "kernels/ops.h"

typedef struct {
    const eng_param_spec_t *spec;
    float *w;       /* device: the weight (fp32 master) */
    float *g;       /* device: gradient, accumulated over micro-batches */
    float *m, *v;   /* device: AdamW moments (allocated on first update) */
    int64_t step;   /* this tensor's AdamW step count (PyTorch keeps one per parameter) */
    bool has_grad;  /* received a gradient in the current optimizer step */
} eng_param_t;

/* Indices into eng_model_t.params for one decoder layer (-1 = absent). */
typedef struct {
    int attn_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, mlp_norm;
    int router, sh_gate, sh_up, sh_down, sh_expert_gate;
    int dense_gate, dense_up, dense_down;
    int *exp_gate, *exp_up, *exp_down; /* (E) when the layer is MoE */
} eng_layer_index_t;

typedef struct {
    eng_model_config_t cfg;
    eng_model_spec_t spec;
    kern_device_t *dev;        /* not owned */
    eng_param_t *params;       /* spec.count */
    eng_layer_index_t *layers; /* num_hidden_layers */
    int embed, final_norm, lm_head; /* lm_head == embed when tied */
    int num_moe_layers;
    /* RoPE tables on the device for sequence length rope_T */
    float *rope_cos, *rope_sin;
    int rope_T;
} eng_model_t;

/* Statistics of one micro-batch's forward/backward. */
typedef struct {
    double loss;       /* ce + aux_coef * aux (what HF returns as .loss) */
    double ce_loss;
    double aux_loss;   /* raw load-balancing loss (before the coefficient), 0 when off */
    int64_t tokens;    /* B * T */
    int64_t counted;   /* targets != -100 */
} eng_micro_stats_t;

/* Builds the spec, allocates parameters and gradients on dev and loads the
 * checkpoint in dir (config from dir/config.json with overrides). */
mt_status_t eng_model_load(eng_model_t *m, kern_device_t *dev, const char *dir,
                           const char *overrides_json, mt_error_t *err);
void eng_model_free(eng_model_t *m);

/* Forward and backward of one micro-batch; gradients are accumulated (+=)
 * with the loss multiplied by loss_scale (1 / gradient_accumulation_steps).
 * When logits_out (host, (B*T, V)) is non-NULL the logits are copied there
 * before the loss consumes them. */
mt_status_t eng_model_forward_backward(eng_model_t *m, const eng_batch_t *batch,
                                       float loss_scale, float *logits_out,
                                       eng_micro_stats_t *stats, mt_error_t *err);

/* Forward only: loss statistics (and logits) without touching gradients. */
mt_status_t eng_model_forward(eng_model_t *m, const eng_batch_t *batch, float *logits_out,
                              eng_micro_stats_t *stats, mt_error_t *err);

/* Zeroes every gradient and clears has_grad. */
void eng_model_zero_grad(eng_model_t *m);

/* Copies parameter i's weight (or gradient) to host memory (numel floats). */
void eng_model_read_param(eng_model_t *m, int i, float *host, bool gradient);

/* Saves the weights as an HF checkpoint directory (config.json + safetensors). */
mt_status_t eng_model_save(eng_model_t *m, const char *dir, size_t max_shard_bytes, bool bf16,
                           mt_error_t *err);

#endif
