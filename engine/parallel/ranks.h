/* The processes ("ranks") of a run that mpirun or a torchrun-style launch
 * started (kernels/comm_ranks.h): data parallel
 * across ranks on top of data parallel across each rank's local devices
 * (engine/parallel/devices.h).
 *
 * Every rank opens the model from the checkpoint into its own host copy
 * and runs its local `devices:`.  Of a step's K micro-batches (K =
 * gradient_accumulation_steps, global) rank r runs the contiguous share
 * r*K/R .. (r+1)*K/R - 1, split further over its devices as multi_device
 * does, so K must be a multiple of R * devices.  Contiguous shares make
 * the cross-rank sum (rank order, after each rank's in-process sum) the
 * same adds as `devices: R` in one process when each rank has one device:
 * bit-identical results.  With N > 1 devices per rank the sum is
 * (rank 0's devices' sum) + (rank 1's ...), a different order of fp32 adds
 * from `devices: R*N`'s ((d0 + d1) + d2) + d3, so the two agree to rounding
 * only.  Every rank then
 * runs the same optimizer step on the same bits, so the weights stay
 * identical without a broadcast; the loss statistics are gathered so that
 * rank 0 logs the global step.  Only rank 0 writes the output directory.
 *
 * This file knows nothing of the model: gradients arrive as plain buffers
 * (eng_rank_grad_t), so whoever owns the parameter table builds the list.
 * With one rank every call is a no-op and no transport is started. */
#ifndef MT_ENGINE_RANKS_H
#define MT_ENGINE_RANKS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "kernels/comm_ranks.h"
#include "kernels/device.h"

typedef struct eng_ranks {
    kern_ranks_t *k;
    int rank;       /* 0..size-1 */
    int size;       /* 1 when no launcher started this process */
    int local_rank; /* among the ranks of this node */
    const char *launcher; /* what started them, for messages (kern_ranks_launcher) */
} eng_ranks_t;

/* Whether mpirun or a torchrun-style launch started this process (before
 * eng_ranks_open). */
bool eng_ranks_launched(void);
/* From the environment (kernels/comm_ranks.h): mpirun's, torchrun's, or
 * one rank. */
mt_status_t eng_ranks_open(eng_ranks_t *r, mt_error_t *err);
void eng_ranks_close(eng_ranks_t *r);
/* whether this rank writes the output directory (rank 0) */
bool eng_ranks_writes(const eng_ranks_t *r);
/* K micro-batches per step over size ranks of `devices` devices each:
 * MT_ERR_CONFIG naming both keys unless K divides evenly. */
mt_status_t eng_ranks_check_accum(const eng_ranks_t *r, int accum, int devices, mt_error_t *err);
/* Device-resident gradients live on dev (the rank's first device). */
mt_status_t eng_ranks_bind_device(eng_ranks_t *r, kern_device_t *dev, mt_error_t *err);

/* One trained parameter's accumulated gradient on this rank. */
typedef struct {
    const char *name; /* for errors */
    float *buf;       /* count floats: device memory when on_device, else host */
    size_t count;
    bool on_device;   /* on the bound device; then a buffer without a gradient holds zeros */
    bool has;         /* this rank produced a gradient for it this step (else buf is ignored) */
} eng_rank_grad_t;

/* Every g[i] that some rank has becomes the rank-order sum over the ranks
 * that have it, the same bits on every rank, and g[i].has the union.
 * Collective: every rank passes the same parameters in the same order;
 * MT_ERR_CONFIG when they do not (different models or plans). */
mt_status_t eng_ranks_sum_grads(eng_ranks_t *r, eng_rank_grad_t *g, int n, mt_error_t *err);

/* items holds k_global records of item_bytes, this rank's share (k_global /
 * size records from rank * share) filled in: after the call every rank
 * holds all of them, in the global order. */
void eng_ranks_gather_shares(eng_ranks_t *r, void *items, size_t item_bytes, int k_global);
/* the largest v over the ranks (a stop signal that reached only some) */
int eng_ranks_agree_max(eng_ranks_t *r, int v);
void eng_ranks_barrier(eng_ranks_t *r);
/* A failure on this rank: prints "moetune: rank R of N: error: msg" and
 * ends every rank (the others may wait in a collective this rank will never
 * join).  Only with more than one rank. */
_Noreturn void eng_ranks_abort(eng_ranks_t *r, const char *msg);

#endif
