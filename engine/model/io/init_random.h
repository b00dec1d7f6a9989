/* Random initialisation of a model, as transformers' _init_weights does for
 * Mixtral / Qwen2-MoE / Qwen3-MoE: every nn.Linear weight (attention,
 * router, experts, shared expert and its gate, dense MLP, lm_head) and the
 * embedding ~ normal(0, initializer_range), the padding_idx row of the
 * embedding zeroed when pad_token_id is set, biases zero, RMSNorm weights
 * (input/post-attention/final norms, q_norm, k_norm) one.
 *
 * Values come from moetune's own generator (splitmix64 + Box-Muller), keyed
 * by (seed, tensor name), so a tensor's values do not depend on which other
 * tensors exist or in which order they are generated.  They are not
 * torch's values for the same seed. */
#ifndef MT_ENGINE_INIT_RANDOM_H
#define MT_ENGINE_INIT_RANDOM_H

#include <stdint.h>

#include "engine/model/desc/model_desc.h"
#include "base/status.h"

/* Fills dst[i] (spec->params[i].numel floats) for every parameter.
 * pad_token_id < 0: no padding row. */
void eng_init_random_params(const eng_model_desc_t *spec, double initializer_range,
                            int pad_token_id, uint64_t seed, float *const *dst);

/* Parses config_json_text (initializer_range default 0.02, pad_token_id
 * default none), writes DIR/config.json (the text unchanged) and a
 * checkpoint in the dtype config.json names (fp32 when none; sharded past
 * 5 GB like save_pretrained).  Holds the whole
 * model in host memory while writing: meant for small models such as the
 * quick-start one. */
mt_status_t eng_checkpoint_init_random(const char *dir, const char *config_json_text, uint64_t seed,
                                       mt_error_t *err);

#endif
