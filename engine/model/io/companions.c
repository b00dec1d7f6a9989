/* Copying the base model's tokenizer, chat template and generation config
 * into a checkpoint (see companions.h).  They are copied byte for byte:
 * moetune does not change the tokenizer, and a copy cannot drift from what
 * the user's tools read from the base model. */
#include "engine/model/io/companions.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "base/fileio.h"
#include "engine/model/io/safetensors.h" /* eng_write_file_atomic */

/* transformers' tokenizer files (fast and slow), the chat template in both
 * places transformers 5 reads it, and the generation defaults. */
const char *const eng_companion_files[] = {
    "tokenizer.json",      "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "tokenizer.model",     "vocab.json",            "merges.txt",              "chat_template.jinja",
    "chat_template.json",  "generation_config.json", NULL,
};

/* Large enough for any real tokenizer.json (the largest vocabularies are
 * tens of MB); a bigger file is refused rather than read without bound. */
#define COMPANION_MAX_BYTES (512u << 20)

mt_status_t eng_ckpt_dir_copy_companions(eng_ckpt_dir_t *tx, const char *base_dir, mt_error_t *err) {
    for (int i = 0; eng_companion_files[i]; i++) {
        const char *name = eng_companion_files[i];
        char src[4200];
        snprintf(src, sizeof src, "%s/%s", base_dir, name);
        struct stat sb;
        if (stat(src, &sb) != 0) {
            if (errno == ENOENT) continue;
            return mt_error_set(err, MT_ERR_IO, "%s: %s", src, strerror(errno));
        }
        char *buf;
        size_t len;
        mt_status_t st = mt_read_regular_file(src, "base model file", COMPANION_MAX_BYTES, &buf, &len, err);
        if (st != MT_OK) return st;
        char *dst = eng_ckpt_dir_path(tx, name);
        st = eng_write_file_atomic(dst, buf, len, err);
        free(dst);
        free(buf);
        if (st != MT_OK) return st;
        eng_ckpt_dir_add(tx, name);
    }
    return MT_OK;
}
