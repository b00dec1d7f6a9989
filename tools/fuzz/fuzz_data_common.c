/* The body both data harnesses share: load the file as a dataset, then walk
 * it with the loader as training does, so rows the reader accepts are used
 * the way the model uses them. */
#include <stdlib.h>

#include "engine/data/data.h"
#include "tools/fuzz/fuzz_data_common.h"
#include "tools/fuzz/fuzz_util.h"

void fz_data_one(const char *name, const uint8_t *data, size_t size) {
    /* The first byte picks sequence_len (1..16) and whether token ids are
     * checked against a vocabulary (64) or only against int32: the reader's
     * truncation, padding and range checks all depend on them. */
    int T = 8, vocab = 64;
    if (size > 0) {
        T = 1 + (data[0] & 15);
        vocab = (data[0] & 16) ? 0 : 64;
        data++, size--;
    }
    char path[512];
    fz_write_file(name, data, size, path, sizeof path);
    const char *paths[1] = {path};
    eng_dataset_t ds;
    mt_error_t err = {0};
    if (eng_dataset_load(&ds, paths, 1, T, vocab, &err) != MT_OK) return;
    for (int64_t i = 0; i < ds.num_rows * T; i++) {
        if (vocab > 0 && (ds.inputs[i] < 0 || ds.inputs[i] >= vocab)) abort(); /* an id the check let through */
        if (ds.targets[i] != -100 && vocab > 0 && (ds.targets[i] < 0 || ds.targets[i] >= vocab)) abort();
    }
    char warn[1024];
    (void)eng_dataset_mask_warning(&ds, warn, sizeof warn);
    if (ds.num_rows > 0) {
        eng_loader_t ld;
        eng_loader_init(&ld, &ds, 3, true, 7);
        eng_batch_t b;
        for (int k = 0; k < 4; k++) eng_loader_next(&ld, &b);
        eng_loader_free(&ld);
    }
    eng_dataset_free(&ds);
}
