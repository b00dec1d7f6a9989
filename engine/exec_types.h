/* The executor's plain data types, shared by its public header (exec.h)
 * and its private one (exec_internal.h), so that neither includes the
 * other: a parameter's copies on a device, a micro-batch's statistics and
 * how the staging pool was sized. */
#ifndef MT_ENGINE_EXEC_TYPES_H
#define MT_ENGINE_EXEC_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "moe/staging.h"

/* An executor: runs a model on one device (engine/exec.h). */
typedef struct eng_exec eng_exec_t;

/* A parameter's copies on one device, and the gradients this device
 * accumulates for it; its executor owns them.  The home (fp32 master or
 * frozen bf16 home, host AdamW state) is the model's (eng_param_t), one
 * for every device.  Which exist depends on the plan of the parameter's block:
 *   weights RESIDENT: w lives on the device for the whole run;
 *           STREAM:   w exists only while a block that uses it computes;
 *   grads   DEVICE:   g_acc accumulates on the device over micro-batches;
 *           HOST:     host_g accumulates in host memory;
 *   optim   DEVICE:   the fp32 master (dev_master, or w itself when w is
 *                     fp32) and AdamW state m, v on the device. */
typedef struct {
    void *w;            /* working copy in the parameter's w_dtype, NULL when not on the device */
    float *dev_master;  /* device fp32 master when the optimizer is on the device and w is bf16 */
    float *g;           /* gradient target of the running backward (see exec.c) */
    float *g_acc;       /* device accumulator (grads DEVICE) */
    float *host_g;      /* host accumulator (grads HOST or optimizer HOST) */
    float *m, *v;       /* device AdamW state (optimizer DEVICE), lazily allocated */
    bool has_grad;      /* received a gradient in the current optimizer step */
    bool acc_has_data;  /* the accumulator already holds an earlier micro-batch's gradient */
    bool g_transient;   /* g is a per-micro-batch buffer to fold into the accumulator */
} eng_dparam_t;

/* Statistics of one micro-batch's forward/backward. */
typedef struct {
    double loss;       /* ce + aux_coef * aux (what HF returns as .loss) */
    double ce_loss;
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
