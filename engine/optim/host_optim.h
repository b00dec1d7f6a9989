/* The host optimizer of the executor: AdamW on fp32 masters in host
 * memory, over a thread pool, and the worker thread that runs it for one
 * block at a time while backward goes on with the blocks below (the
 * overlapped step of eng_optim_begin_step, engine/exec/optim.h).
 *
 * It owns the worker, its FIFO of block indices, the pool it runs on and
 * the per-parameter record of what it updated during backward and of each
 * gradient's sum of squares, which it takes as soon as a block's gradients
 * have landed (by the same function the step would use, so the global
 * norm is bit-identical either way, and is known as the backward ends
 * instead of costing a pass over every gradient after it).  It knows
 * nothing of streams' other work, the staging pool or the plan: the
 * optimizer step tells it when a block's gradients have landed (through
 * the step program's block-ready hook, progress.h). */
#ifndef MT_ENGINE_EXEC_HOST_OPTIM_H
#define MT_ENGINE_EXEC_HOST_OPTIM_H

#include <pthread.h>
#include <stdbool.h>

#include "engine/layers/dparam.h"
#include "engine/model/model.h"
#include "engine/optim/hparams.h"
#include "engine/optim/nvme_state.h"
#include "engine/optim/speculate.h"
#include "kernels/adamw.h"
#include "kernels/host/numa.h"
#include "kernels/host/threadpool.h"

/* What a queued job does with its block. */
typedef enum {
    EXEC_JOB_OVERLAPPED, /* the update during the backward (exec_host_optim_enqueue) */
    EXEC_JOB_DEFERRED,   /* the update after the norm, into the next step (exec_host_optim_defer) */
    EXEC_JOB_NORM,       /* the gradients' sums of squares only (exec_host_optim_enqueue_norm) */
} exec_host_job_kind_t;

/* One queued job: a block, and the AdamW parameters an update runs with (a
 * job may run after the next step has started and changed the step's). */
typedef struct {
    int block;
    exec_host_job_kind_t kind;
    kern_adamw_params_t base;
} exec_host_job_t;

typedef struct {
    eng_model_t *m;              /* not owned: the parameters it updates (their homes) */
    eng_dparam_t *dp;            /* not owned: their gradients on the executor's device (eng_exec_t.dp) */
    kern_device_t *dev;          /* not owned */
    struct eng_trace *const *trace; /* the executor's trace pointer (NULL inside: no trace) */
    kern_threadpool_t *pool;     /* host AdamW's threads */
    kern_threadpool_t *own_pool; /* the pool above when made here (GPU backends) */
    /* Where the host has several NUMA nodes: each parameter's host state
     * (master, working copy, gradient, moments, spare) is homed on one node,
     * the nodes' shares of every block balanced by size (kern_numa_assign),
     * and its AdamW and norm sums run on that node's cores, every node at
     * once (kern_numa_team_run), so host AdamW has every socket's memory
     * bandwidth.  NULL team on one node.  With the NVMe tier, a block whose
     * moments were read in as one batch is updated the same way; one whose
     * moments stream in one parameter at a time, one by one. */
    kern_numa_team_t *team;      /* owned */
    int *node_of;                /* per parameter: its home node (NULL without a team) */
    unsigned char *placed;       /* per parameter: EXEC_PLACED_* bits of what was moved to its node */
    pthread_t thread;
    pthread_mutex_t lock;
    pthread_cond_t cond;
    exec_host_job_t *queue;      /* ring of jobs (capacity 3 x blocks + 1), run in order, except that
                                  * norm jobs go ahead of updates (host_optim.c's next_job) */
    int head, tail, cap;
    int *block_pending;          /* per block: deferred updates queued or running */
    int *overlap_pending;        /* per block: overlapped updates on their way (behind the block's
                                  * gradient copies), queued or running */
    int outstanding;             /* queued or running */
    bool stop, started;
    bool hold;                   /* tests' (exec_host_optim_hold): no overlapped job starts */
    eng_optim_hparams_t hp;      /* the overlapped step's hyper-parameters (no clipping) */
    bool *done;                  /* per parameter: updated during backward this step */
    bool step_idle_experts;      /* this step's idle routed experts get a zero gradient (hparams.h) */
    int pad_row;                 /* the embedding row of config.json's pad_token_id, whose gradient is
                                  * zero as nn.Embedding(padding_idx) gives it; -1 none, -2 not read yet */
    float *gnorm_part;           /* per parameter summed (below): its gradient's sum of squares */
    bool *summed;                /* per parameter: gnorm_part holds this step's sum, taken by the worker as
                                  * the gradient landed (cleared when the norm has read it) */
    bool *wrote_nonfinite;       /* per parameter: its last host update wrote a NaN or Inf (the
                                  * kernel's fused check, kern_adamw_params_t.nonfinite) */
    int nonfinite_param;         /* first parameter a deferred update left with a NaN or Inf, or -1
                                    (written by the worker, read after exec_host_optim_wait) */
    eng_optim_nvme_t *nvme;      /* owned: the NVMe tier holding host AdamW moments (nvme_state.h), or NULL */
    int last_block;              /* the worker's: the block it updated before the current one (-1: none);
                                  * which way the updates walk, for the read ahead */
    bool speculative;            /* this step's overlapped updates run before the clipping factor is
                                  * known, each out of place so it can be undone (speculate.h) */
    eng_spec_t spec;             /* their spares */
} exec_host_optim_t;

/* For model m's parameters, their gradients dp on device dev, spans
 * recorded into *trace; the worker is not started yet. */
void exec_host_optim_init(exec_host_optim_t *h, eng_model_t *m, eng_dparam_t *dp, kern_device_t *dev,
                          struct eng_trace *const *trace);
/* Stops the worker (after the jobs queued so far) and frees everything. */
void exec_host_optim_free(exec_host_optim_t *h);

/* Parameters idx[0..n) of one block, their gradients in host memory,
 * updated in place with base (not speculatively), each on its home node's
 * cores with every node at once where the host has several, else one by
 * one on h->pool; whether each wrote a NaN or Inf lands in
 * h->wrote_nonfinite.  On an error (the NVMe tier) *done_out says how many
 * of idx, in order, were updated. */
mt_status_t exec_host_adamw_params(exec_host_optim_t *h, const int *idx, int n, const kern_adamw_params_t *base,
                                   int *done_out, mt_error_t *err);

/* The AdamW kernel's parameters for hp, gradients scaled by clip_scale. */
kern_adamw_params_t exec_adamw_params(const eng_optim_hparams_t *hp, double clip_scale);
/* One AdamW step of parameter i on its host master with gradient grad
 * (state allocated on first use; streamed in from the NVMe tier and back
 * out when h->nvme holds it: an error there is returned); whether it wrote
 * a NaN or Inf into the master lands in h->wrote_nonfinite[i].
 * speculative: the update can be undone (h->spec: written into the
 * parameter's spare and swapped in; never with the NVMe tier). */
mt_status_t exec_host_adamw(exec_host_optim_t *h, kern_threadpool_t *pool, int i, const float *grad,
                            const kern_adamw_params_t *base, bool speculative, mt_error_t *err);

/* Starts the worker if needed, for a step with these hyper-parameters. */
void exec_host_optim_start(exec_host_optim_t *h, const eng_optim_hparams_t *hp);
/* Queues block b's update, to run when the work issued so far on the D2H
 * stream (its gradient copies) is done. */
void exec_host_optim_enqueue(exec_host_optim_t *h, int b);
/* Queues the sums of squares of block b's host gradients (the step's
 * final ones), to run when the work issued so far on the D2H stream is
 * done; the optimizer step's norm then reads them (summed). */
void exec_host_optim_enqueue_norm(exec_host_optim_t *h, int b);
/* Waits until every queued job has run (no-op without a worker). */
void exec_host_optim_wait(exec_host_optim_t *h);
/* Takes the queued overlapped updates (exec_host_optim_enqueue) of the
 * blocks `take` marks back out of the queue: the worker has not started
 * them; nothing of theirs has run.  Returns how many. */
int exec_host_optim_take_back(exec_host_optim_t *h, const bool *take);
/* For tests, to take every overlapped update back deterministically rather
 * than by timing: while held, the worker starts no overlapped job (norm and deferred
 * ones run); the caller must take them back, or release the hold, before
 * waiting for them. */
void exec_host_optim_hold(exec_host_optim_t *h, bool hold);

/* The optimizer step's own update of block b (its gradients already in
 * host memory, the norm known: base carries the clipping), run by the
 * worker in queue order while the caller goes on to the next step.  The
 * worker clears the block's parameters' has_grad / acc_has_data when done.
 * Everything that reads or writes the block's host tensors first waits for
 * it (exec_host_optim_wait_block). */
void exec_host_optim_defer(exec_host_optim_t *h, int b, const eng_optim_hparams_t *hp,
                           const kern_adamw_params_t *base);
/* Waits for block b's deferred update, if one is queued or running. */
void exec_host_optim_wait_block(exec_host_optim_t *h, int b);
/* Waits for block b's overlapped update (exec_host_optim_enqueue), if one
 * is on its way, queued or running. */
void exec_host_optim_wait_overlapped(exec_host_optim_t *h, int b);

#endif
