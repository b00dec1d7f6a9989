/* The optimizer step: global gradient-norm clipping and AdamW over every
 * parameter that received a gradient in this optimizer step.
 *
 * PyTorch semantics: clip_grad_norm_ scales by max_norm / (norm + 1e-6)
 * when that is below 1, over the parameters that have a gradient; AdamW
 * keeps one step count per parameter, so an expert that got no token in
 * this step is neither updated nor counted (as torch does for p.grad None). */
#ifndef MT_ENGINE_OPTIM_H
#define MT_ENGINE_OPTIM_H

#include "engine/exec/place/types.h"
#include "engine/optim/hparams.h"
#include "engine/model/model.h"


typedef struct {
    double grad_norm;     /* before clipping */
    double clip_scale;    /* the factor applied (1 when not clipped) */
    int updated, skipped; /* parameters updated / without gradient */
    int updated_during_backward; /* host AdamW runs that overlapped the backward pass (and stood) */
    int taken_back;       /* blocks whose overlapped update had not started when the backward ended:
                             deferred into the next step instead */
    int summed_ahead;     /* parameters whose gradient's sum of squares (for the norm) the host worker
                             took as the gradient landed, during the backward */
    bool speculative;     /* the overlapped host AdamW ran before the clipping factor was known */
    bool speculation_undone; /* ... and the norm clipped (or was not finite): it was undone and redone */
    double optim_wall_s;  /* time eng_optim_step took (the optimizer's share on the critical path) */
    bool weights_nonfinite; /* the step failed because an update left a weight NaN or Inf: the
                               weights are changed, so the step cannot be skipped */
} eng_optim_stats_t;

/* Announces the next optimizer step: its hyper-parameters and how many
 * micro-batches it has.  With `overlap` and optimizer state on the host, the
 * host AdamW of each block starts as soon as that block's gradients of the
 * last micro-batch have landed in host memory, while backward goes on with
 * the blocks below.  With clipping (max_grad_norm > 0) the factor needs the
 * global norm, known only when backward ends: then the updates overlap only
 * when hp->speculative, each saved first and undone when the norm clips
 * (engine/optim/speculate.h).  Updates the host has not started when the
 * backward ends are taken back and run into the next step (as deferred
 * ones do: only that block's next fetch waits for its update).  Results
 * are bit-identical either way.  With `overlap`, whether or not the
 * updates may overlap, the host worker also sums the squares of each
 * block's host gradients for the norm as they land, so the norm is known
 * when the backward ends (the same bits as summed after it); `overlap` is
 * for one device only, whose host gradients are final as they land.
 * Optional: without it every update happens in eng_optim_step. */
void eng_optim_begin_step(eng_exec_t *x, const eng_optim_hparams_t *hp, int micro_batches,
                          bool overlap);

mt_status_t eng_optim_step(eng_exec_t *x, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                           mt_error_t *err);

#endif
