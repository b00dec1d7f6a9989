/* AdamW's hyper-parameters for one optimizer step, as the run config gives
 * them (PyTorch's names).  Their own header because both the optimizer
 * step (engine/exec/optim.h) and the host AdamW worker below the executor
 * (engine/optim/host_optim.h) take them. */
#ifndef MT_ENGINE_OPTIM_HPARAMS_H
#define MT_ENGINE_OPTIM_HPARAMS_H

typedef struct {
    double lr, beta1, beta2, eps, weight_decay;
    double max_grad_norm; /* 0 = no clipping */
} eng_optim_hparams_t;

#endif
