/* libFuzzer harness: the sharded checkpoint's index reader
 * (engine/model/io/checkpoint.c: model.safetensors.index.json and its weight_map).
 *
 * The input is the index file. The directory beside it holds two small
 * valid shards, written once: a.safetensors with tensors "x" and "y",
 * b.safetensors with "z", so an index can name present and absent shards
 * and tensors, and shard names can try to leave the directory. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"
#include "tools/fuzz/fuzz_util.h"

static void write_shards(void) {
    static const float xs[6] = {1, 2, 3, 4, 5, 6};
    const int64_t s23[2] = {2, 3}, s1[1] = {1};
    const eng_st_write_tensor_t a[2] = {
        {.name = "x", .dtype = ENG_ST_F32, .ndim = 2, .shape = s23, .f32 = xs},
        {.name = "y", .dtype = ENG_ST_BF16, .ndim = 1, .shape = s1, .f32 = xs},
    };
    const eng_st_write_tensor_t b[1] = {{.name = "z", .dtype = ENG_ST_F16, .ndim = 1, .shape = s1, .f32 = xs}};
    char path[512];
    mt_error_t err = {0};
    snprintf(path, sizeof path, "%s/a.safetensors", fz_scratch_dir());
    if (eng_st_write(path, a, 2, NULL, 0, &err) != MT_OK) goto fail;
    snprintf(path, sizeof path, "%s/b.safetensors", fz_scratch_dir());
    if (eng_st_write(path, b, 1, NULL, 0, &err) != MT_OK) goto fail;
    return;
fail:
    fprintf(stderr, "fuzz_checkpoint_index: cannot write the shards: %s\n", err.msg);
    abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static int ready;
    if (!ready) {
        write_shards();
        ready = 1;
    }
    char path[512];
    fz_write_file(ENG_CKPT_INDEX_FILE, data, size, path, sizeof path);
    eng_checkpoint_t ck;
    mt_error_t err = {0};
    if (eng_checkpoint_open(fz_scratch_dir(), &ck, &err) != MT_OK) return 0;
    float buf[8];
    for (int i = 0; i < ck.count; i++) {
        if (eng_checkpoint_find(&ck, ck.entries[i].name) == NULL) abort(); /* every entry is findable */
        const eng_st_tensor_t *t = ck.entries[i].tensor;
        if (t->numel <= 8) (void)eng_st_read_f32(&ck.files[ck.entries[i].file], t, buf, &err);
    }
    eng_checkpoint_close(&ck);
    return 0;
}
