/* `moetune inspect DIR`: what a checkpoint directory holds, in a form a
 * person can read for a 128-expert model: the architecture from
 * config.json, total and active parameters per token, a per-layer table
 * (identical consecutive layers merged, experts counted as E x per-expert
 * size rather than listed), the dtypes and bytes on disk, and whether the
 * weights match what config.json implies.  A directory with only a
 * config.json is fine (the weights part then says so). */
#ifndef MT_ENGINE_INSPECT_H
#define MT_ENGINE_INSPECT_H

#include <stdio.h>

#include "base/status.h"

/* Errors: missing/invalid config.json, unreadable or malformed weights
 * files.  Tensors missing from or unexpected in the weights are reported in
 * the output, not as errors. */
mt_status_t eng_inspect(const char *dir, FILE *out, mt_error_t *err);

#endif
