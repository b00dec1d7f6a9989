/* A LoRA run's adapters as parameters of the model.
 *
 * Every targeted module (engine/model/lora/targets.h: PEFT's matching rules) gets
 * two trainable factors, A (r, in) and B (out, r), appended to the model's
 * parameter table after the base's (eng_model_t.params[spec.count ..]), in
 * the owning block of the module they adapt: the executor places, streams,
 * accumulates and updates them like any parameter, as the block's plan
 * says, and the base's parameters are frozen (no gradient, no master, no
 * AdamW state).  Modules named in lora_modules_to_save stay trainable in
 * full.  The forward adds s * B (A dropout(x)) to the module's output
 * (engine/layers/blocks.c, moe/moe_layer.c), s the module's own.
 *
 * Initial values: the adapter in init_dir (PEFT's files, per-expert or
 * fused expert keys: engine/model/lora/adapter.h), read at attach with the
 * adapter_config.json beside it, which must adapt exactly the modules the
 * run selects and gives each its rank and s (rank_pattern, alpha_pattern);
 * a routed expert's up adapter in PEFT's fused gate_up form has no A of its
 * own and trains its gate's, as PEFT does.  Without one, PEFT's default
 * init at the run's r: A from kaiming_uniform(a = sqrt(5)), i.e. uniform
 * in +-1/sqrt(in), drawn from the run's seed, and B = 0, so training
 * starts from the base model's outputs. */
#ifndef MT_ENGINE_LORA_MODEL_H
#define MT_ENGINE_LORA_MODEL_H

#include "base/status.h"
#include "engine/config/config.h"
#include "engine/model/lora/adapter.h"
#include "engine/model/model.h"

/* A run config's LoRA settings as model options, with the storage the
 * options point into.  With lora_model_dir, adapter_config.json there is
 * read and must agree with the run's lora_r, lora_alpha and use_rslora
 * (MT_ERR_CONFIG naming the key and both values); a run that names no
 * targets takes the adapter's. */
typedef struct {
    eng_lora_opts_t opts;
    const char *modules[ENG_MAX_LORA_TARGETS + 1];
    const char *to_save[ENG_MAX_LORA_TARGETS];
    eng_lora_config_t init_cfg; /* adapter_config.json of lora_model_dir (zeroed without one) */
} eng_lora_run_opts_t;

mt_status_t eng_lora_run_opts(const eng_run_config_t *rc, eng_lora_run_opts_t *out, mt_error_t *err);
void eng_lora_run_opts_free(eng_lora_run_opts_t *o);

/* After eng_model_init, before the executor exists: selects the targets,
 * reads the adapter in o->init_dir (errors name its files and tensors),
 * appends the factors to the parameter table and freezes the base. */
mt_status_t eng_lora_attach(eng_model_t *m, const eng_lora_opts_t *o, mt_error_t *err);

/* After the base's weights are read: the factors' initial values (and the
 * modules_to_save tensors the adapter file holds). */
mt_status_t eng_lora_init_weights(eng_model_t *m, const eng_lora_opts_t *o, mt_error_t *err);

/* The adapter_config.json a run writes, in the form PEFT on transformers 5
 * loads completely (engine/model/lora/peft5.h; free with
 * eng_lora_config_free). */
void eng_lora_saved_config(const eng_model_t *m, const eng_run_config_t *rc, eng_lora_config_t *out);

#endif
