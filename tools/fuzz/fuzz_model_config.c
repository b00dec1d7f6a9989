/* libFuzzer harness: the HF config.json reader (engine/model/hf/model_config.c).
 *
 * The input is config.json's text, optionally followed by a NUL byte and
 * the run config's model_config overrides (JSON). A config the reader
 * accepts is then turned into the model's parameter list
 * (engine/model/desc/builder.c), the first thing every command does with it: sizes
 * the reader lets through must not overflow there. */
#include <stdlib.h>
#include <string.h>

#include "engine/model/hf/model_config.h"
#include "engine/model/desc/model_desc.h"
#include "tools/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *text = fz_strndup(data, size);
    const size_t first = strlen(text);
    const char *overrides = first < size ? text + first + 1 : NULL;
    eng_model_config_t cfg;
    mt_error_t err = {0};
    if (eng_model_config_parse(text, "config.json", overrides, &cfg, &err) == MT_OK) {
        eng_model_desc_t spec;
        if (eng_model_desc_build(&cfg, &spec, &err) == MT_OK) {
            (void)eng_model_desc_numel(&spec);
            (void)eng_model_desc_active_numel(&spec, &cfg);
            eng_model_desc_free(&spec);
        }
        eng_model_config_free(&cfg);
    }
    free(text);
    return 0;
}
