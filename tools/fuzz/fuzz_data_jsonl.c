/* libFuzzer harness: the tokenized JSONL reader (engine/data/data.c).
 * The input is one byte of settings (see fuzz_data_common.c), then the file. */
#include "tools/fuzz/fuzz_data_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_data_one("data.jsonl", data, size);
    return 0;
}
