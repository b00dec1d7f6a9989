/* The executor's doors to its staging pool (see xfer.h). */
#include "engine/exec/xfer.h"

#include "engine/exec/executor.h"
#include "engine/exec/place/stage.h"

mt_status_t exec_stage_h2d(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err) {
    return exec_stage_batch_h2d(&x->stage, items, n, tag, err);
}

mt_status_t exec_stage_d2h(eng_exec_t *x, const moe_staging_xfer_t *items, int n, const char *tag,
                           mt_error_t *err) {
    return exec_stage_batch_d2h(&x->stage, items, n, tag, err);
}
