/* PEFT LoRA adapter files: adapter_config.json and adapter_model.safetensors.
 *
 * What a loaded adapter means: y = W x + s · B (A x) per adapted module,
 * A (r, in), B (out, r), s = lora_alpha / r, or lora_alpha / sqrt(r) with
 * use_rslora.  A config option that would change that math (DoRA, a bias
 * on the adapter, fan_in_fan_out, per-module rank or alpha patterns, an
 * init that rewrites the base weights such as PiSSA or OLoRA) is refused
 * with the file and key named, rather than loaded and silently computed
 * wrong.
 *
 * Tensors are held per expert, the form moetune computes in and the form
 * it writes (`base_model.model.model.layers.N.block_sparse_moe.experts.E.w1
 * .lora_A.weight`), which every PEFT version loads.  PEFT on transformers 5
 * writes routed experts fused instead (its ParamWrapper over the 3-D
 * `gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I)): `…mlp.experts
 * [.base_layer].lora_A.weight` (E·r, d1) and `lora_B.weight` (d2, E·r) for a
 * parameter (E, d1, d2).  PEFT's get_delta_weight reads A as (E, r, d1)
 * and B as (d2, r, E) (note: experts outermost in A, innermost in B) and
 * adds delta[e] = A_e^T B_e^T, which is (d1, d2) = (out, in).  So the
 * per-expert form of expert e is B' = A_e^T (out, r), A' = B_e^T (r, in);
 * for gate_up_proj B' splits into gate rows then up rows sharing A'.  That
 * conversion is exact, and the two nested wrappers are told apart by shape.
 *
 * modules_to_save tensors are stored under the module's own name
 * (`base_model.model.lm_head.weight`), as PEFT saves them. */
#ifndef MT_ENGINE_LORA_ADAPTER_H
#define MT_ENGINE_LORA_ADAPTER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model_desc.h"

typedef struct {
    char *base_model_name_or_path; /* may be NULL */
    int r;
    double lora_alpha;
    double lora_dropout;
    bool use_rslora;
    char **target_modules;       /* list form (num_target_modules); NULL when a regex */
    int num_target_modules;
    char *target_regex;          /* string form, or NULL */
    char **target_parameters;    /* PEFT's 3-D parameter targets (transformers 5 experts) */
    int num_target_parameters;
    char **modules_to_save;
    int num_modules_to_save;
} eng_lora_config_t;

/* s in y = W x + s · B A x. */
double eng_lora_scale(const eng_lora_config_t *c);

/* Errors: MT_ERR_IO, MT_ERR_FORMAT (not JSON, a key of the wrong type),
 * MT_ERR_UNSUPPORTED (an option moetune does not compute), each naming the
 * file and the key. */
mt_status_t eng_lora_config_read(const char *path, eng_lora_config_t *out, mt_error_t *err);
mt_status_t eng_lora_config_write(const char *path, const eng_lora_config_t *c, mt_error_t *err);
void eng_lora_config_free(eng_lora_config_t *c);

/* One adapted module. */
typedef struct {
    int param;        /* index into desc->params of the base weight */
    int64_t out, in;
    int r;
    float *a;         /* (r, in) */
    float *b;         /* (out, r) */
} eng_lora_pair_t;

/* A fully trained module (modules_to_save). */
typedef struct {
    int param;
    float *data;      /* desc->params[param].numel elements */
} eng_lora_full_t;

typedef struct {
    eng_lora_pair_t *pairs;  /* (count), in description order */
    int count;
    eng_lora_full_t *saved;  /* (num_saved), in description order */
    int num_saved;
} eng_lora_weights_t;

/* Reads adapter_model.safetensors against the base model's description:
 * every tensor must name a linear module of the model (or, for a
 * modules_to_save tensor, a parameter) with the shapes the description
 * gives, rank r, A and B both present; fused expert tensors are converted
 * to per-expert pairs.  Errors (MT_ERR_FORMAT) name the tensor, and for a
 * shape mismatch both shapes. */
mt_status_t eng_lora_weights_read(const char *path, const eng_model_desc_t *d, int r, eng_lora_weights_t *out,
                                  mt_error_t *err);
/* Writes per-expert keys in fp32, A before B, in description order. */
mt_status_t eng_lora_weights_write(const char *path, const eng_model_desc_t *d, const eng_lora_weights_t *w,
                                   mt_error_t *err);
void eng_lora_weights_free(eng_lora_weights_t *w);
/* The pair adapting parameter `param`, or NULL. */
const eng_lora_pair_t *eng_lora_weights_find(const eng_lora_weights_t *w, int param);

#endif
