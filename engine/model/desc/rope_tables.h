/* The RoPE cos / sin tables (T, dim/2) of a model's config, as transformers
 * computes them in fp32, over `dim` rotary dims per head (head_dim; the
 * rope part of an MLA head; GLM-4.5's partial share, engine/layers/blocks.h's
 * eng_rope_dim): plain RoPE (kernels/rope.h's kern_rope_table), or YaRN
 * (gpt-oss's and DeepSeek-V3's rope_scaling; _compute_yarn_parameters):
 * inverse frequencies blended between theta^(-2i/d) and that over `factor`
 * by a linear ramp over the correction range of beta_fast .. beta_slow
 * rotations within original_max_position_embeddings (rounded outwards
 * unless truncate is false), and cos / sin scaled by the attention factor
 * (attention_factor when the config gives it, else get_mscale(factor,
 * mscale) / get_mscale(factor, mscale_all_dim) with both, else
 * get_mscale(factor)).  factor unset: max_position_embeddings /
 * original_max_position_embeddings, as transformers. */
#ifndef MT_ENGINE_ROPE_TABLES_H
#define MT_ENGINE_ROPE_TABLES_H

#include <stdbool.h>

#include "engine/model/hf/model_config.h"

/* Whether eng_rope_tables computes the config's RoPE type. */
bool eng_rope_type_computed(const eng_model_config_t *c);

void eng_rope_tables(const eng_model_config_t *c, int T, int dim, float *cos_out, float *sin_out);

/* The factor MLA's softmax scale gains under YaRN (DeepSeek-V3:
 * get_mscale(factor, mscale_all_dim) squared; 1 without it). */
double eng_rope_yarn_softmax_factor(const eng_model_config_t *c);

#endif
