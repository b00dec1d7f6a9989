/* A speculative host AdamW step: the state a block's update is about to
 * overwrite, kept so that the update can be taken back.
 *
 * With clipping on (max_grad_norm > 0) the clipping factor needs the
 * global gradient norm, known only when the backward ends, so host AdamW
 * would wait for it.  Speculation runs each block's update as soon as its
 * gradients land, as if the factor were 1, which it is whenever the norm
 * is at most max_grad_norm (torch multiplies by clamp(coef, max=1): by
 * exactly 1.0 then, which changes no bit).  Before each such update the
 * parameter's fp32 master, AdamW moments and step count are copied here;
 * when the norm then clips, or is not finite, every speculative update is
 * undone from the copies and the step runs as without speculation, with
 * the real factor.  Either way the result is the non-speculative step's,
 * bit for bit.
 *
 * The copies cost the master's 4 bytes and the moments' bytes (8 in fp32,
 * optimizer_state) per trainable parameter the host updates speculatively,
 * kept from step to step so that none is allocated on the critical path. */
#ifndef MT_ENGINE_OPTIM_SPECULATE_H
#define MT_ENGINE_OPTIM_SPECULATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "kernels/host/threadpool.h"

typedef struct {
    float *w;         /* the master's copy (NULL until first needed) */
    void *mom;        /* the moments' copy, in their format (kern_moments_bytes) */
    bool had_state;   /* the moments existed before the update (else the update created them) */
    int64_t step;
    bool saved;       /* this step's update of the parameter is speculative and can be undone */
} eng_spec_copy_t;

typedef struct {
    eng_spec_copy_t *copy; /* per parameter */
    int num_params;
    uint64_t bytes;        /* held by the copies */
} eng_spec_t;

void eng_spec_init(eng_spec_t *s, int num_params);
void eng_spec_free(eng_spec_t *s);

/* Copies parameter i's master, moments and step count before its
 * speculative update (p->host_w must be its master), on `pool`'s threads
 * (NULL: the caller's). */
void eng_spec_save(eng_spec_t *s, const eng_param_t *p, int i, kern_threadpool_t *pool);
/* Puts parameter i back as eng_spec_save found it; false when nothing was
 * saved for it this step. */
bool eng_spec_undo(eng_spec_t *s, eng_param_t *p, int i, kern_threadpool_t *pool);
/* The step is kept: the copies are free for the next one. */
void eng_spec_keep(eng_spec_t *s, int i);

#endif
