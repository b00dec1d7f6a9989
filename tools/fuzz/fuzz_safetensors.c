/* libFuzzer harness: the safetensors header reader (engine/model/io/safetensors.c).
 *
 * The input is a whole .safetensors file. A file the reader accepts must be
 * safe to use as accepted: every tensor is found by its name, and every
 * small F32/BF16/F16 tensor is converted, so an offset that points outside
 * the mapping shows up as an ASan report, not later in training. */
#include <stdlib.h>

#include "engine/model/io/safetensors.h"
#include "tools/fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[512];
    fz_write_file("model.safetensors", data, size, path, sizeof path);
    eng_st_file_t f;
    mt_error_t err = {0};
    if (eng_st_open(path, &f, &err) != MT_OK) return 0;
    for (int i = 0; i < f.count; i++) {
        const eng_st_tensor_t *t = &f.tensors[i];
        if (eng_st_find(&f, t->name) != t) abort(); /* names are unique: each finds itself */
        if (t->numel > 4096) continue;
        float *dst = malloc((size_t)(t->numel ? t->numel : 1) * sizeof *dst);
        if (!dst) abort();
        (void)eng_st_read_f32(&f, t, dst, &err);
        free(dst);
    }
    (void)eng_st_metadata_get(&f, "format");
    eng_st_close(&f);
    return 0;
}
