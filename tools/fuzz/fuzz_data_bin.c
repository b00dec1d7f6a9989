/* libFuzzer harness: the llm.c token-file reader (engine/data/data.c: 256 int32
 * header words, then uint16 or uint32 tokens).
 * The input is one byte of settings (see fuzz_data_common.c), then the file. */
#include "tools/fuzz/fuzz_data_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fz_data_one("data.bin", data, size);
    return 0;
}
