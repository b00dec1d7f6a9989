/* libFuzzer harness: the run-config YAML reader (engine/config/config.c and the
 * value and validation code beside it).
 *
 * The input is run.yaml's text, optionally followed by NUL-separated
 * `key=value` overrides as `--set` gives them. Odd-sized inputs go through a
 * file (eng_run_config_load, the path `moetune train` takes), even-sized
 * ones through the string parser; then the overrides, validation, and the
 * learning rate at a few steps, as training asks for it. */
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"
#include "tools/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const uint8_t *nul = memchr(data, '\0', size);
    const size_t yaml_len = nul ? (size_t)(nul - data) : size;
    eng_run_config_t cfg;
    mt_error_t err = {0};
    mt_status_t st;
    if (size % 2) {
        char path[512];
        fz_write_file("run.yaml", data, yaml_len, path, sizeof path);
        st = eng_run_config_load(path, &cfg, &err);
    } else {
        st = eng_run_config_parse((const char *)data, yaml_len, "run.yaml", &cfg, &err);
    }
    if (st == MT_OK && nul) {
        const uint8_t *p = nul + 1, *end = data + size;
        while (st == MT_OK && p < end) {
            const uint8_t *q = memchr(p, '\0', (size_t)(end - p));
            const size_t n = q ? (size_t)(q - p) : (size_t)(end - p);
            char *one = fz_strndup(p, n);
            st = eng_run_config_set(&cfg, one, &err);
            free(one);
            p += n + 1;
        }
    }
    if (st == MT_OK && eng_run_config_validate(&cfg, &err) == MT_OK) {
        (void)eng_lr_at(&cfg, 0, 10);
        (void)eng_lr_at(&cfg, 9, 10);
    }
    eng_run_config_free(&cfg);
    return 0;
}
