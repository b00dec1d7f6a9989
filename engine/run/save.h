/* Where a run's outputs go and how it saves its model (see train_save.c). */
#ifndef MT_ENGINE_TRAIN_SAVE_H
#define MT_ENGINE_TRAIN_SAVE_H

#include <stdbool.h>

#include "engine/config/config.h"
#include "engine/exec/place/types.h"
#include "engine/model/model.h"
#include "engine/model/io/outdir.h"
#include "base/dtype.h"
#include "base/status.h"

/* Refuses a run whose output_dir is, contains or lies inside base_model,
 * lora_model_dir or a dataset path (after '.', '..', symlinks and relative paths).  Writes
 * nothing. */
mt_status_t eng_run_check_paths(const eng_run_config_t *rc, mt_error_t *err);

/* The config.json a run saves: base_text (the base model's file) with the
 * run's model_config overrides merged in (what the model was trained with)
 * and the dtype actually saved as torch_dtype and transformers 5's dtype.
 * Returns malloc'ed text (indent 2, as save_pretrained writes it). */
char *eng_saved_config_json(const char *base_text, const char *overrides_json, mt_dtype_t dtype,
                            const char *source, mt_error_t *err);

/* Saves what the run trains through an atomic checkpoint transaction
 * (engine/model/io/outdir.h): the model's weights in dtype (MT_F32, MT_BF16 or
 * MT_F16) with that config.json, or in a LoRA run the adapter in PEFT's
 * format (adapter_model.safetensors, adapter_config.json). */
mt_status_t eng_train_save(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                           eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, mt_error_t *err);

/* The full model in HF's layout, in a LoRA run merged as PEFT's
 * merge_and_unload does: W + s * B A for every adapted module (the
 * modules trained in full as trained).  Holds one fp32 copy of the model
 * in host memory while writing. */
mt_status_t eng_train_save_model(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                 eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, mt_error_t *err);

/* More files for the same transaction, written after the model's (a
 * checkpoint's training state, engine/run/state.h), so that the
 * completion manifest covers them too. */
typedef mt_status_t (*eng_save_extra_fn)(eng_ckpt_dir_t *tx, void *ctx, mt_error_t *err);

/* eng_train_save, with extra(tx, ctx) before the commit (extra may be NULL). */
mt_status_t eng_train_save_with(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, eng_save_extra_fn extra, void *ctx,
                                mt_error_t *err);

#endif
