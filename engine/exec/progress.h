/* The optimizer step in progress, as the step program and the optimizer
 * share it on one executor: whether the running backward is its last, how
 * the optimizer runs (overlapping host AdamW with that last backward,
 * finishing every update before it returns), and the hook through which
 * the step program says that a block's gradients are complete.  (How many
 * micro-batches are still to run is the executor's micro_left, which the
 * data-parallel layer also resets on its replicas: executor.h.)
 *
 * The optimizer sits above the step program: it sets the hook when a step
 * begins (eng_optim_begin_step), and the step program calls it after each
 * block's backward without knowing who listens, so no call goes from the
 * step program up to the optimizer.  Plain data, read and written by both. */
#ifndef MT_ENGINE_EXEC_PROGRESS_H
#define MT_ENGINE_EXEC_PROGRESS_H

#include <stdbool.h>

#include "engine/exec/place/types.h"

/* Block b's gradients were folded (exec_finish_grads), in every micro-batch
 * order; in_last_micro says whether that was the step's last backward. */
typedef void (*exec_block_ready_fn)(eng_exec_t *x, int b);

typedef struct {
    bool in_last_micro; /* the running backward is the step's last */
    bool overlap;       /* this step's last micro-batch updates blocks as they finish */
    bool norm_ahead;    /* ... and sums host gradients' squares for the norm as they land (one device) */
    /* every update done before eng_optim_step returns (eng_exec_finish_updates_in_step):
     * off by default, so a streamed host-optimizer block's update runs into the next step */
    bool finish_updates_in_step;
    exec_block_ready_fn block_ready; /* NULL: nobody listens */
} exec_progress_t;

#endif
