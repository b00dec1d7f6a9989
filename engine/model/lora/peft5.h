/* The adapter_config.json that PEFT on transformers 5 loads completely,
 * and the notes on what it still cannot load.
 *
 * On transformers 5 the routed experts are fused parameters and PEFT
 * rewrites every target_modules entry naming a routed expert's leaf (w1,
 * w2, w3, or gate_proj, up_proj, down_proj) or the router's `gate` into a
 * target_parameters one (peft/utils/transformers_weight_conversion.py), so a
 * dense MLP or a shared expert named that way loses its adapter, and a
 * regex naming experts by index matches nothing.  What moetune writes
 * instead, from the adapted modules themselves:
 *   target_modules     every adapted module PEFT wraps as nn.Linear;
 *   target_parameters  the routed experts' gate_up_proj and down_proj, and
 *                      every other adapted module whose leaf PEFT would
 *                      rewrite, as its weight
 *                      (`model.layers.0.mlp.gate_proj.weight`: PEFT wraps it
 *                      with the same W + s B A);
 *   rank_pattern, alpha_pattern  each wrapped thing whose rank or alpha is
 *                      not r / lora_alpha.
 * Each entry is the shortest dot-separated suffix of the name (the leaf,
 * q_proj, where it can) that matches nothing left out, or nothing of
 * another value for a pattern key (dots escaped).  Per-expert gate and up
 * adapters are one gate_up_proj to PEFT there (A's stacked along the rank,
 * B block-diagonal): rank r_gate + r_up and the alpha that keeps their s
 * (2 alpha, or sqrt(2) alpha under rsLoRA, where PEFT's own rewrite of
 * 2 alpha would give 2a / sqrt(2r) instead of a / sqrt(r)).
 *
 * What no config fixes is a warning: lora_dropout > 0 with anything PEFT
 * wraps as a parameter (its ParamWrapper refuses dropout), an expert
 * layer's gate adapted without its up or with another scale, an adapter on
 * only some experts of a layer (PEFT's fused wrapper covers all). */
#ifndef MT_ENGINE_LORA_PEFT5_H
#define MT_ENGINE_LORA_PEFT5_H

#include <stddef.h>

#include "engine/model/desc/model_desc.h"
#include "engine/model/lora/config.h"
#include "engine/model/lora/targets.h"

/* Fills c's target_modules, target_parameters, rank_pattern and
 * alpha_pattern for plan p; c's r, lora_alpha and use_rslora must be set. */
void eng_lora_peft_config(const eng_model_desc_t *d, const eng_lora_plan_t *p, eng_lora_config_t *c);

/* One line per thing PEFT on transformers 5 will refuse or drop, naming it
 * and why, into buf; returns how many ("" and 0 when none). */
int eng_lora_peft_warnings(const eng_model_desc_t *d, const eng_lora_plan_t *p, double dropout, char *buf,
                           size_t cap);

#endif
