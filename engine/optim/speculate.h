/* A speculative host AdamW step: the state a block's update replaces, kept
 * so that the update can be taken back.
 *
 * With clipping on (max_grad_norm > 0) the clipping factor needs the
 * global gradient norm, known only when the backward ends, so host AdamW
 * would wait for it.  Speculation runs each block's update as soon as its
 * gradients land, as if the factor were 1, which it is whenever the norm
 * is at most max_grad_norm (torch multiplies by clamp(coef, max=1): by
 * exactly 1.0 then, which changes no bit).  When the norm then clips, or is
 * not finite, every speculative update is undone and the step runs as
 * without speculation, with the real factor.  Either way the result is the
 * non-speculative step's, bit for bit.
 *
 * How the old state is kept: each parameter has a spare master and spare
 * moments (allocated at its first speculative update, kept from step to
 * step).  The update runs out of place (kern_adamw_cpu_pool_from), reading
 * host_w and host_mom and writing the new state into the spare, and then
 * the pointers swap: host_w and host_mom hold the new state, the spare the
 * old.  Undo swaps back; keeping the step leaves the old state in the spare
 * to be overwritten next step.  No byte is copied: the cost is the spare's
 * host memory (the master's 4 bytes and the moments' bytes, 8 in fp32, per
 * trainable parameter the host updates speculatively) and, where the CPU
 * allocates on write, a read of each spare line the update writes.
 *
 * Why a swap cannot pull a buffer from under a reader: nothing holds
 * host_w or host_mom across a step.  Staging packs (exec_w_home, streamed
 * fetches) read them when the fetch runs, and a block's fetch runs before
 * its backward (so before its gradients reach the host optimizer) or after
 * its update (the next step's fetch waits for the update:
 * exec_host_optim_wait_block, prefetch_next_step after update_blocks);
 * checkpoint reads and writes (engine/exec/optim_state.c) and the replicas'
 * refresh (engine/parallel/devices.c) run between optimizer steps, after
 * exec_host_optim_wait and the undo or keep; a streamed bf16 weight's
 * fetch reads work_bf16, which the update rewrites in place and never
 * swaps.  The worker's swap and the main thread's next read are ordered by
 * the optimizer's lock (exec_host_optim_wait).  Speculation is off with the
 * NVMe tier (engine/exec/optim_step.c), whose loads and unloads own
 * host_mom and host_w buffers of their own. */
#ifndef MT_ENGINE_OPTIM_SPECULATE_H
#define MT_ENGINE_OPTIM_SPECULATE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/model/model.h"
#include "kernels/host/threadpool.h"

typedef struct {
    float *w;         /* the spare master (NULL until first needed); after an update, the old master */
    void *mom;        /* the spare moments, in their format (kern_moments_bytes); after an update, the old */
    bool had_state;   /* the moments existed before the update (else the update created them) */
    int64_t step;     /* the step count before the update */
    bool saved;       /* this step's update of the parameter is speculative and can be undone */
} eng_spec_copy_t;

typedef struct {
    eng_spec_copy_t *copy; /* per parameter */
    int num_params;
    uint64_t bytes;        /* held by the spares */
} eng_spec_t;

void eng_spec_init(eng_spec_t *s, int num_params);
void eng_spec_free(eng_spec_t *s);

/* Before parameter i's speculative update (p->host_w must be its master;
 * p->host_mom may still be NULL): notes its step count and whether its
 * moments exist, and returns the spare its update writes into, allocated
 * the first time. */
eng_spec_copy_t *eng_spec_begin(eng_spec_t *s, const eng_param_t *p, int i);
/* After the update wrote the new state into the spare: the parameter takes
 * it, the spare keeps the old state. */
void eng_spec_swap_in(eng_spec_t *s, eng_param_t *p, int i);
/* Puts parameter i back as eng_spec_begin found it (re-rounding its host
 * bf16 working copy from the old master on `pool`, NULL: the caller's
 * thread); false when nothing was saved for it this step. */
bool eng_spec_undo(eng_spec_t *s, eng_param_t *p, int i, kern_threadpool_t *pool);
/* The step is kept: the spare is free for the next one. */
void eng_spec_keep(eng_spec_t *s, int i);

#endif
