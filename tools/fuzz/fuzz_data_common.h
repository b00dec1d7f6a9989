/* Shared body of fuzz_data_jsonl.c and fuzz_data_bin.c. */
#ifndef MOETUNE_TOOLS_FUZZ_DATA_COMMON_H
#define MOETUNE_TOOLS_FUZZ_DATA_COMMON_H

#include <stddef.h>
#include <stdint.h>

/* Writes data[1:] to the scratch file `name` (its extension picks the
 * format) and loads it with sequence_len and vocabulary from data[0]. */
void fz_data_one(const char *name, const uint8_t *data, size_t size);

#endif
