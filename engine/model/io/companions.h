/* The files a Hugging Face model folder carries beside its weights that
 * loading the model for use needs: the tokenizer, its chat template and the
 * generation config.  A saved model or adapter carries the base model's
 * copies, so `AutoTokenizer.from_pretrained(output_dir)` and
 * `GenerationConfig.from_pretrained(output_dir)` work on what a run wrote. */
#ifndef MT_ENGINE_MODEL_IO_COMPANIONS_H
#define MT_ENGINE_MODEL_IO_COMPANIONS_H

#include "base/status.h"
#include "engine/model/io/outdir.h"

/* The names copied, NULL-terminated. */
extern const char *const eng_companion_files[];

/* Copies each of eng_companion_files that base_dir holds as a regular file
 * into the checkpoint being written (fsync'd, listed in its manifest);
 * those base_dir lacks are skipped.  A file that exists but cannot be read
 * (or is not a regular file) is an error naming it. */
mt_status_t eng_ckpt_dir_copy_companions(eng_ckpt_dir_t *tx, const char *base_dir, mt_error_t *err);

#endif
