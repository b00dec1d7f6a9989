/* AdamW's hyper-parameters for one optimizer step, as the run config gives
 * them (PyTorch's names).  Their own header because both the optimizer
 * step (engine/exec/optim.h) and the host AdamW worker below the executor
 * (engine/optim/host_optim.h) take them. */
#ifndef MT_ENGINE_OPTIM_HPARAMS_H
#define MT_ENGINE_OPTIM_HPARAMS_H

#include <stdbool.h>

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double max_grad_norm; /* 0 = no clipping */
    /* a trainable routed expert with no gradient this step: false (the
     * default, run config idle_experts: step) steps it with a zero gradient,
     * as torch's AdamW does transformers 5's fused experts; true skips it,
     * as transformers 4's per-expert modules (grad None) were */
    bool skip_idle_experts;
    /* with clipping on, the host AdamW of each block still starts during the
     * backward, undone and run again when the norm clips (speculate.h) */
    bool speculative;
} eng_optim_hparams_t;

#endif
