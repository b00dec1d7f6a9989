/* Data parallel over several devices of one process, sharing one host copy
 * of the model (`devices: N` in a run config).
 *
 * The model (engine/model/model.h) is opened once: one copy of the fp32 masters
 * (host_w), of a frozen base's bf16 homes and of the host optimizer state.
 * Each device runs its own executor (engine/exec/exec.h: own budget, streams,
 * staging pool, its own copies of the parameters) over that one model;
 * a streamed weight is fetched from the shared home by whichever device
 * needs it.  Executor 0 (the primary) runs the optimizer step; the others
 * are replicas, with no master or optimizer state of their own.
 *
 * One optimizer step of K micro-batches (K a multiple of N): device d runs
 * the contiguous share d*K/N .. (d+1)*K/N - 1, all devices at once (one host
 * thread each), each micro-batch with loss scale 1/K.  Contiguous rather
 * than interleaved: device 0's partial sum is then a prefix of the
 * single-device accumulation (g0 + g1 + ...), so with K = N (one micro-batch
 * per device) the reduced gradient is bit-identical to one device's.
 * The gradients are then summed in rank order (device 0's + device 1's
 * + ...): device-resident accumulators through kern_comm_allreduce_sum,
 * host-resident ones by the same float add on the host.  Then the
 * primary's optimizer step runs once over the sum (clipping sees the
 * global norm), and every other device's resident weights that changed are
 * refreshed: from the updated host master, or, when the optimizer lives on
 * device 0, from the primary's updated working copy.
 *
 * With N = 1 every call is the single-device one, unchanged. */
#ifndef MT_ENGINE_MULTI_DEVICE_H
#define MT_ENGINE_MULTI_DEVICE_H

#include <stdbool.h>

#include "engine/config/config.h"
#include "engine/exec/exec.h"
#include "engine/model/model.h"
#include "engine/exec/optim.h"
#include "engine/parallel/ranks.h"
#include "kernels/device.h"
#include "moe/expert_parallel.h"

typedef struct {
    int n;                 /* devices */
    eng_exec_t **x;        /* (n) an executor per device, all over one model */
    eng_exec_t *primary;   /* x[0]: runs the one optimizer step */
    eng_model_t *model;    /* the one model, when n > 1 (with n == 1, x[0] owns it) */
    kern_device_t **devs;  /* (n) devs[0] the caller's; devs[1..n) opened (and destroyed) here */
    kern_comm_t *comm;     /* over devs, for device-resident gradients; NULL when n == 1 */
    bool *updated;         /* (num_params) got a gradient on some device in this step */
    /* (n) each device's rank for the MoE layers the plan runs expert
     * parallel (engine/exec/expert_parallel.h); NULL when it runs none */
    moe_ep_t *ep;
    eng_ranks_t *ranks;    /* the mpirun job this process is a rank of (engine/parallel/ranks.h), set by the
                              caller after eng_multi_open; NULL or one rank: this process alone */
} eng_multi_t;

/* Opens the model in dir once and an executor for it on dev0 (`primary`,
 * as eng_exec_open does) and on devices->count - 1 more devices of dev0's
 * backend with dev0's options (device ordinal devices->ids[d]).  accum is
 * the run's gradient_accumulation_steps: it must be a multiple of the
 * device count (checked before any weight is read). */
mt_status_t eng_multi_open(eng_multi_t *mm, kern_device_t *dev0, const eng_devices_t *devices, int accum,
                           const char *dir, const eng_model_opts_t *opts, mt_error_t *err);
/* Frees the executors, the devices opened here and the model (not dev0). */
void eng_multi_free(eng_multi_t *mm);
/* The one model every device runs. */
eng_model_t *eng_multi_model(const eng_multi_t *mm);

/* eng_optim_begin_step on every device (each with its share of the k
 * micro-batches, k global over the ranks; with N > 1 or several ranks the
 * host optimizer never overlaps backward, since it must wait for the other
 * devices' and ranks' gradients). */
void eng_multi_begin_step(eng_multi_t *mm, const eng_optim_hparams_t *hp, int k, bool overlap);
/* Forward and backward of batches[0..k) with loss scale 1/k, device d on
 * its contiguous share, then the gradients reduced into the primary.
 * stats[j] is micro-batch j's, in the global order.  With R ranks, k is
 * this rank's share (loss scale 1 / (k R)) and the primary's gradients are
 * then summed across the ranks (engine/parallel/ranks.h). */
mt_status_t eng_multi_step_fwd_bwd(eng_multi_t *mm, const eng_batch_t *batches, int k, eng_step_order_t order,
                                   eng_micro_stats_t *stats, mt_error_t *err);
/* Draws k micro-batches from ld and runs eng_multi_step_fwd_bwd.  With R
 * ranks k is the step's global count: every rank draws all k (so the
 * loader's position, which checkpoints record, is the same everywhere),
 * runs its share and gathers every rank's stats[0..k). */
mt_status_t eng_multi_step_from_loader(eng_multi_t *mm, eng_loader_t *ld, int k, eng_step_order_t order,
                                       eng_micro_stats_t *stats, mt_error_t *err);
/* Every trained parameter's resident copy on the other devices takes the
 * primary's current weights (after a resume wrote them). */
mt_status_t eng_multi_sync_replicas(eng_multi_t *mm, mt_error_t *err);
/* The primary's optimizer step, then the replicas' resident weights refreshed. */
mt_status_t eng_multi_optim_step(eng_multi_t *mm, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                                 mt_error_t *err);

#endif
