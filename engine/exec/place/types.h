/* The executor's plain data types, shared by its public header (exec.h),
 * its private one (executor.h) and its concerns' headers, so that none of
 * them includes another for them: the executor's name, a micro-batch's
 * statistics and how the staging pool was sized (a parameter's copies on a
 * device are the layers' eng_dparam_t). */
#ifndef MT_ENGINE_EXEC_TYPES_H
#define MT_ENGINE_EXEC_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/layers/dparam.h"
#include "moe/staging.h"

/* An executor: runs a model on one device (engine/exec/exec.h). */
typedef struct eng_exec eng_exec_t;

/* Statistics of one micro-batch's forward/backward. */
typedef struct {
    double loss;       /* ce + aux_coef * aux (what HF returns as .loss) */
    double ce_loss;
    double ce_sum;     /* the counted targets' cross entropies summed (ce_loss = ce_sum / counted) */
    double aux_loss;   /* raw load-balancing loss (before the coefficient), 0 when off */
    int64_t tokens;    /* B * T */
    int64_t counted;   /* targets != -100 */
} eng_micro_stats_t;

/* How the pool was sized. */
typedef struct {
    moe_staging_mode_t mode;
    int tokens;               /* tokens per micro-batch the activation share is for (0: none yet) */
    int window_blocks;        /* blocks of streamed weights in flight: prefetch_window + 1 */
    int window_tensors;       /* tensors (activation regions count as one) */
    size_t window_payload;    /* their bytes: the floor no pool can beat */
    size_t window_weights, window_grads, window_acts; /* the payload's parts */
    size_t window_need;       /* what the mode needs for the window (moe_staging_plan_bytes) */
    size_t capacity;          /* the pool's pinned capacity (after the cap) */
    size_t largest_tensor;    /* the largest single staged tensor or activation region */
    char largest_name[160];
} eng_exec_staging_info_t;

#endif
