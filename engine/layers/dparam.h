/* A parameter's copies on one device: what the block math reads (the
 * working copy) and writes (the gradient target), and what the executor
 * keeps beside them.  Here, below the executor, because the layers compute
 * with these copies while the executor decides where they live. */
#ifndef MT_ENGINE_LAYERS_DPARAM_H
#define MT_ENGINE_LAYERS_DPARAM_H

#include <stdbool.h>

/* A parameter's copies on one device, and the gradients this device
 * accumulates for it; its executor owns them.  The home (fp32 master or
 * frozen bf16 home, host AdamW state) is the model's (eng_param_t), one
 * for every device.  Which exist depends on the plan of the parameter's block:
 *   weights RESIDENT: w lives on the device for the whole run;
 *           STREAM:   w exists only while a block that uses it computes;
 *   grads   DEVICE:   g_acc accumulates on the device over micro-batches;
 *           HOST:     host_g accumulates in host memory;
 *   optim   DEVICE:   the fp32 master (dev_master, or w itself when w is
 *                     fp32) and AdamW moments on the device. */
typedef struct {
    void *w;            /* working copy in the parameter's w_dtype, NULL when not on the device */
    float *dev_master;  /* device fp32 master when the optimizer is on the device and w is bf16 */
    float *g;           /* gradient target of the running backward (see exec.c) */
    float *g_acc;       /* device accumulator (grads DEVICE) */
    float *host_g;      /* host accumulator (grads HOST or optimizer HOST) */
    bool host_g_pinned; /* host_g is in pinned memory the executor owns (engine/exec/place/host_buffers.h):
                         * a gradient copy that fills it lands there directly */
    void *mom;          /* device AdamW moments (optimizer DEVICE), lazily allocated, laid out as
                         * the host's (eng_param_t.host_mom) */
    bool has_grad;      /* received a gradient in the current optimizer step */
    bool acc_has_data;  /* the accumulator already holds an earlier micro-batch's gradient */
    bool g_transient;   /* g is a per-micro-batch buffer to fold into the accumulator */
} eng_dparam_t;

#endif
