/* Executor state shared by exec.c (placement, streaming, gradients),
 * exec_step.c (the forward/backward program) and exec_optim.c (the
 * optimizer step).  Private to the engine. */
#ifndef MT_ENGINE_EXEC_INTERNAL_H
#define MT_ENGINE_EXEC_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/exec.h"
#include "kernels/cpu/threadpool.h"

typedef struct {
    void *dev;      /* device buffer to free, or NULL */
    void *pinned;   /* pinned host buffer to free, or NULL */
    size_t pinned_bytes;
    kern_event_t *ev; /* fires when the copy reading them is done */
} exec_pending_t;

typedef struct {
    int *idx;  /* parameters this block holds a device reference to */
    int n, cap;
    bool fetched;
} exec_held_t;

typedef struct {
    void **slot;  /* where the device pointer lives in the block's activation structs */
    void *host;   /* pinned copy while offloaded */
    size_t bytes;
} exec_offload_entry_t;

typedef struct {
    exec_offload_entry_t *e;
    int n, cap;
    bool fetched;
} exec_offload_t;

typedef struct eng_exec {
    int nb;                 /* blocks: L + 2 */
    int **used, *nused;     /* dense parameters each block computes with */
    kern_event_t **w_ready; /* per block: its weight fetches are done */
    kern_event_t **a_ready; /* per block: its offloaded activations are back */
    kern_event_t **o_done;  /* per block: its activations have reached host memory */
    exec_held_t *holding;   /* per block: streamed weights it holds */
    int *param_refs;        /* per parameter: blocks holding its device copy */
    exec_offload_t *offl;   /* per block: activations offloaded to host */
    int32_t **layer_counts; /* per MoE layer: tokens per expert in the latest forward */
    bool counts_valid;      /* layer_counts hold a finished forward (prefetch predictor) */
    exec_pending_t *pending;
    int npending, cap_pending;
    kern_threadpool_t *pool; /* host optimizer threads */
    /* host optimizer worker: AdamW per block during backward (see optim.h) */
    pthread_t opt_thread;
    pthread_mutex_t opt_lock;
    pthread_cond_t opt_cond;
    int *opt_queue, opt_head, opt_tail; /* FIFO of block indices (capacity nb + 1) */
    int opt_outstanding;                /* queued or running */
    bool opt_stop, opt_started;
    bool overlap_step;   /* this step's last micro-batch updates blocks as they finish */
    int micro_left;      /* micro-batches of this step still to run */
    bool in_last_micro;  /* the running backward is the step's last */
    eng_optim_hparams_t step_hp;
    bool *opt_done;      /* per parameter: updated during backward this step */
    /* pinned buffers returned by finished copies, kept for reuse: a step asks
     * for the same sizes every time, and pinning fresh pages (mlock faults
     * them in) on the compute thread costs more than the copy itself.  The
     * staging pool (moe/staging) is the compact successor of this cache. */
    struct { void *p; size_t bytes; } *pin_cache;
    int npin_cache, cap_pin_cache;
    /* profiling: compute seconds per block, summed over micro-batches since the last reset */
    double *fwd_s, *bwd_s;
    int timed_micro;
} eng_exec_t;

/* Samples device and pinned bytes into the trace (if any) at time t. */
void exec_trace_memory(eng_model_t *m, double t);

/* Called after block b's gradients were folded, on the last micro-batch. */
void exec_optim_block_ready(eng_model_t *m, int b);
void exec_optim_worker_stop(eng_model_t *m);

void *exec_pinned_get(eng_model_t *m, size_t bytes);
void exec_pinned_put(eng_model_t *m, void *p, size_t bytes);
bool exec_param_streamed(const eng_model_t *m, const eng_param_t *p);
void exec_defer_free(eng_model_t *m, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after);
void exec_process_pending(eng_model_t *m, bool force);
mt_status_t exec_fetch_block(eng_model_t *m, int b, bool backward, mt_error_t *err);
void exec_wait_block(eng_model_t *m, int b);
mt_status_t exec_fetch_experts(eng_model_t *m, int l, const int32_t *counts, mt_error_t *err);
void exec_release_block(eng_model_t *m, int b);
mt_status_t exec_offload_acts(eng_model_t *m, int b, void **const *slots, int nslots, mt_error_t *err);
mt_status_t exec_fetch_acts(eng_model_t *m, int b, mt_error_t *err);
void exec_wait_acts(eng_model_t *m, int b);
mt_status_t exec_prepare_grad(eng_model_t *m, int i, mt_error_t *err);

#endif
