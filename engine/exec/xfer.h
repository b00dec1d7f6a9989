/* Batches of copies through the executor's staging pool for callers that
 * hold the executor rather than the pool: placement, the optimizer step
 * and its state, and the data-parallel broadcast of engine/parallel.
 *
 * The staging pool itself (stage.h) sits below the executor and cannot
 * see it; these are the executor-level doors to it. */
#ifndef MT_ENGINE_EXEC_XFER_H
#define MT_ENGINE_EXEC_XFER_H

#include "base/status.h"
#include "engine/exec/place/types.h"
#include "moe/staging.h"

/* Copies between pageable host tensors and x's device memory through its
 * pool (stream-ordered on the H2D / D2H stream; `tag` names the batch in
 * errors). */
mt_status_t exec_stage_h2d(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err);
mt_status_t exec_stage_d2h(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err);

#endif
