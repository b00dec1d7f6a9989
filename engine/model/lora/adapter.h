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
 * `gate_up_proj` (E, 2I, H) and `down_proj` (E, H, I), stored (E, out, in)):
 * `…mlp.experts.base_layer.lora_*` wraps gate_up_proj and `…mlp.experts.lora_*`
 * down_proj, lora_A (E·r, in) and lora_B (out, E·r).  PEFT 0.21's
 * get_delta_factors reads A as (E, r, in) and B as (out, r, E) (experts
 * outermost in A, innermost in B): expert e's pair is A_e = A[e*r:(e+1)*r]
 * and B_e[:, k] = B[:, k*E + e], delta = s · B_e A_e.  The two wrappers are
 * told apart by shape, not by name.  gate_up's B holds gate rows then up
 * rows; converted from per-expert gate and up adapters it has rank 2r
 * (their A's stacked, B block-diagonal) and splits back into two rank-r
 * pairs exactly; otherwise gate and up share the fused A at its own rank
 * (eng_lora_pair_t.r says which).  Caveat measured with peft 0.21.2: when
 * it fuses per-expert targets it doubles lora_alpha for gate_up to keep
 * alpha/r, which is wrong under use_rslora (2a/sqrt(2r) != a/sqrt(r)); moetune
 * keeps the per-expert scale.
 *
 * modules_to_save tensors are stored under the module's own name
 * (`base_model.model.lm_head.weight`), as PEFT saves them. */
#ifndef MT_ENGINE_LORA_ADAPTER_H
#define MT_ENGINE_LORA_ADAPTER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model/lora/targets.h"
#include "engine/model/desc/model_desc.h"

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

/* The selection an adapter_config.json describes (pointers into c; valid
 * while c lives).  A string target_modules is a regex, or all-linear. */
void eng_lora_config_select(const eng_lora_config_t *c, eng_lora_select_t *out);

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
/* Writes per-expert keys in fp32, A before B, in description order, with
 * meta_kv (key, value pairs, may be NULL) in the file's __metadata__. */
mt_status_t eng_lora_weights_write(const char *path, const eng_model_desc_t *d, const eng_lora_weights_t *w,
                                   const char *const *meta_kv, int meta_count, mt_error_t *err);
void eng_lora_weights_free(eng_lora_weights_t *w);
/* An adapter loaded to resume or continue (lora_model_dir) must adapt
 * exactly the modules the run selects: MT_ERR_CONFIG naming the first module
 * the file lacks or holds beyond the selection, and the file. */
mt_status_t eng_lora_weights_match(const eng_lora_weights_t *w, const eng_lora_plan_t *p, const eng_model_desc_t *d,
                                   const char *path, mt_error_t *err);
/* The pair adapting parameter `param`, or NULL. */
const eng_lora_pair_t *eng_lora_weights_find(const eng_lora_weights_t *w, int param);

#endif
