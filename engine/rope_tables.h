/* The RoPE cos / sin tables (T, hd/2) of a model's config, as transformers
 * computes them in fp32: plain RoPE (kernels/rope.h's kern_rope_table), or
 * YaRN (gpt-oss's rope_scaling; _compute_yarn_parameters): inverse
 * frequencies blended between theta^(-2i/d) and that over `factor` by a
 * linear ramp over the correction range of beta_fast .. beta_slow
 * rotations within original_max_position_embeddings, and cos / sin scaled
 * by the attention factor (0.1 ln(factor) + 1 unless the config says). */
#ifndef MT_ENGINE_ROPE_TABLES_H
#define MT_ENGINE_ROPE_TABLES_H

#include <stdbool.h>

#include "engine/model_config.h"

/* Whether rope_tables computes the config's RoPE type. */
bool eng_rope_type_computed(const eng_model_config_t *c);

void eng_rope_tables(const eng_model_config_t *c, int T, float *cos_out, float *sin_out);

#endif
