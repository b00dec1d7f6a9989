/* PEFT LoRA adapter files: adapter_model.safetensors read against the
 * base model and its adapter_config.json (config.h), and written back.
 *
 * What a loaded adapter means: y = W x + s · B (A x) per adapted module,
 * A (r, in), B (out, r), s = alpha / r (alpha / sqrt(r) with use_rslora),
 * r and alpha the module's own from the config's rank_pattern and
 * alpha_pattern (config.h: PEFT's first-match rule).  Every tensor's shape
 * is checked against the rank its module claims, and a mismatch is refused
 * naming the tensor, the shape found, the shape expected and where the rank
 * came from: a factor is never copied into a buffer of another shape.
 *
 * Two forms of the routed experts:
 *
 * Per expert (`…experts.3.w1.lora_A.weight`), what every PEFT version
 * loads: one adapter per expert and projection, pattern keys matched
 * against that module's name.  PEFT on transformers 5 fuses them on load
 * (A's stacked along the rank, B block-diagonal: the same function).
 *
 * Fused, what PEFT writes on transformers 5 (its ParamWrapper over the 3-D
 * `gate_up_proj` (E, 2I, H: gate rows then up rows) and `down_proj`
 * (E, H, I)): lora_A (E·rf, in), lora_B (out, E·rf), read by PEFT 0.21's
 * get_delta_factors as (E, rf, in) and (out, rf, E), so expert e's factors
 * are A_e = A[e·rf .. (e+1)·rf) and B_e[:, k] = B[:, k·E + e], and
 * W_e' = W_e + s · B_e A_e.  With both parameters targeted gate_up is the
 * inner wrapper (`…mlp.experts.base_layer.lora_*`) and down_proj the outer
 * (`…mlp.experts.lora_*`); a lone one is `…mlp.experts.lora_*`, so the two
 * are told apart by shape.  Their pattern names are
 * `model.layers.N.mlp.experts.gate_up_proj` / `.down_proj`, and when
 * target_modules names gate and up (w1 and w3, gate_proj and up_proj, or
 * all-linear) PEFT rewrites them into a gate_up_proj target at rank 2r,
 * alpha 2·alpha (config.h, eng_lora_config_lookup).
 *
 * PEFT's fused gate_up is one adapter over the fused output: expert e's
 * gate and up rows share one A_e of rank rf and split one B_e (2I, rf).  It
 * is read as two pairs per expert, gate (A_e, B_e[:I]) and up (A_e,
 * B_e[I:], shares_a), which a run trains as PEFT does: one A, whose
 * gradient is the sum of what gate and up send it
 * (tests/reference/lora_README.md: two separate A's start equal and move
 * apart).  Written back in the same fused form, so a fused adapter stays
 * fused and a per-expert one per expert.
 *
 * target_parameters entries that match nothing in the model (PEFT's names,
 * targets.h eng_lora_peft_param) are refused naming the file and the entry.
 * modules_to_save tensors are stored under the module's own name
 * (`base_model.model.lm_head.weight`), as PEFT saves them. */
#ifndef MT_ENGINE_LORA_ADAPTER_H
#define MT_ENGINE_LORA_ADAPTER_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model/lora/config.h"
#include "engine/model/lora/targets.h"
#include "engine/model/desc/model_desc.h"

/* One adapted module. */
typedef struct {
    int param;        /* index into desc->params of the base weight */
    int64_t out, in;
    int r;
    double alpha;     /* its lora_alpha (rank_pattern / alpha_pattern applied) */
    double scale;     /* s of this module (its rank and alpha under the config's use_rslora) */
    bool shares_a;    /* a routed expert's up adapter in PEFT's fused gate_up form: trained with the
                       * same A as its gate (a holds a copy of it) */
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

/* Reads adapter_model.safetensors (path) against the base model's
 * description and the adapter's config c (read from config_path, named in
 * errors): every tensor must name a linear module of the model (or, for a
 * modules_to_save tensor, a parameter) with the shape its rank gives, A
 * and B both present; fused expert tensors become per-expert pairs.
 * Errors (MT_ERR_FORMAT) name the file and the tensor or entry, and for a
 * shape both shapes and the rank's source. */
mt_status_t eng_lora_weights_read(const char *path, const eng_model_desc_t *d, const eng_lora_config_t *c,
                                  const char *config_path, eng_lora_weights_t *out, mt_error_t *err);
/* Writes fp32 factors in description order, A before B: per-expert keys,
 * except a layer whose up adapters share their gate's A, written in PEFT's
 * fused form (gate_up and down_proj); meta_kv (key, value pairs, may be
 * NULL) goes in the file's __metadata__. */
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
