/* The host optimizer worker (see host_optim.h).  Jobs enter the queue
 * from a host function on the D2H stream, so a block is summed or updated
 * only once its gradients have reached host memory; the worker takes them
 * in order, norm jobs ahead of updates. */
#include "engine/optim/host_optim.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/finite.h"
#include "engine/exec/record/trace.h"
#include "kernels/elementwise.h"
#include "kernels/host/adamw_host.h"

/* What of parameter i's host state was moved to its home node. */
enum { EXEC_PLACED_HOMES = 1, EXEC_PLACED_SPARE = 2 };

/* Each block's trainable parameters shared out between the nodes by size,
 * in parameter order (kern_numa_assign): a block's update then takes every
 * node about as long. */
static void assign_homes(exec_host_optim_t *h, int nodes) {
    const eng_model_t *m = h->m;
    const int P = m->num_params;
    h->node_of = calloc((size_t)(P > 0 ? P : 1), sizeof *h->node_of);
    h->placed = calloc((size_t)(P > 0 ? P : 1), sizeof *h->placed);
    size_t *bytes = malloc((size_t)(P > 0 ? P : 1) * sizeof *bytes);
    int *idx = malloc((size_t)(P > 0 ? P : 1) * sizeof *idx), *node = malloc((size_t)(P > 0 ? P : 1) * sizeof *node);
    MT_CHECK(h->node_of && h->placed && bytes && idx && node, "out of host memory for the host optimizer's homes");
    for (int b = 0; b < eng_model_num_blocks(m); b++) {
        int n = 0;
        for (int i = 0; i < P; i++)
            if (m->params[i].block == b && !m->params[i].frozen) idx[n] = i, bytes[n++] = m->params[i].spec->numel;
        kern_numa_assign(bytes, n, nodes, node);
        for (int k = 0; k < n; k++) h->node_of[idx[k]] = node[k];
    }
    free(bytes);
    free(idx);
    free(node);
}

/* Asks for [ptr, ptr + bytes) on parameter i's home node (a no-op on one node). */
static void place_on_home(const exec_host_optim_t *h, const void *ptr, size_t bytes, int i) {
    if (h->node_of && ptr) (void)kern_numa_place(kern_numa_host(), (void *)ptr, bytes, h->node_of[i]);
}

/* Parameter i's host state moved to its home node, once: the master, the
 * working copy and gradient (those the executor pinned stay: pinned pages
 * do not move), the moments; the spare once it exists. */
static void place_param(exec_host_optim_t *h, int i) {
    if (!h->node_of) return;
    const eng_param_t *p = &h->m->params[i];
    const eng_dparam_t *d = &h->dp[i];
    const size_t n = p->spec->numel;
    if (!(h->placed[i] & EXEC_PLACED_HOMES)) {
        place_on_home(h, p->host_w, n * sizeof(float), i);
        if (!p->work_pinned) place_on_home(h, p->work_bf16, n * sizeof(uint16_t), i);
        if (!d->host_g_pinned) place_on_home(h, d->host_g, n * sizeof(float), i);
        place_on_home(h, p->host_mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n), i);
        h->placed[i] |= EXEC_PLACED_HOMES;
    }
    const eng_spec_copy_t *c = &h->spec.copy[i];
    if (!(h->placed[i] & EXEC_PLACED_SPARE) && c->w) {
        place_on_home(h, c->w, n * sizeof(float), i);
        place_on_home(h, c->mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n), i);
        h->placed[i] |= EXEC_PLACED_SPARE;
    }
}

void exec_host_optim_init(exec_host_optim_t *h, eng_model_t *m, eng_dparam_t *dp, kern_device_t *dev,
                          struct eng_trace *const *trace) {
    memset(h, 0, sizeof *h);
    h->pad_row = -2; /* read at the first step (engine/exec/optim_step.c) */
    h->m = m;
    h->dp = dp;
    h->dev = dev;
    h->trace = trace;
    h->nonfinite_param = -1;
    h->last_block = -1;
    eng_spec_init(&h->spec, m->num_params);
    /* a step's norm and overlapped jobs and the previous step's deferred ones */
    h->cap = 3 * eng_model_num_blocks(m) + 1;
    h->queue = calloc((size_t)h->cap, sizeof *h->queue);
    h->block_pending = calloc((size_t)eng_model_num_blocks(m), sizeof *h->block_pending);
    h->overlap_pending = calloc((size_t)eng_model_num_blocks(m), sizeof *h->overlap_pending);
    MT_CHECK(h->block_pending && h->overlap_pending, "out of host memory for the host optimizer's block tables");
    h->done = calloc((size_t)m->num_params, sizeof *h->done);
    h->wrote_nonfinite = calloc((size_t)(m->num_params > 0 ? m->num_params : 1), sizeof *h->wrote_nonfinite);
    MT_CHECK_ALLOC(h->wrote_nonfinite, "host optimizer finite flags");
    h->gnorm_part = calloc((size_t)m->num_params, sizeof *h->gnorm_part);
    h->summed = calloc((size_t)m->num_params, sizeof *h->summed);
    MT_CHECK(h->queue && h->done && h->gnorm_part && h->summed, "out of memory for the host optimizer");
    /* host AdamW's threads: the device's own host pool where its kernels run
     * on host cores (compute is idle while the optimizer step runs); beside
     * a GPU, a pool over every host core */
    h->pool = kern_device_host_pool(dev);
    if (!h->pool) {
        h->own_pool = kern_threadpool_create(0);
        h->pool = h->own_pool;
    }
    if (kern_numa_host()->nodes > 1) assign_homes(h, kern_numa_host()->nodes);
}

/* The nodes' runners, made when the host optimizer is first used (an
 * executor that never updates on the host, another device's, makes
 * none): beside a GPU, the host cores it leaves the optimizer, shared out;
 * on the CPU backend every core of each node. */
static void ensure_team(exec_host_optim_t *h) {
    if (!h->node_of || h->team) return;
    const kern_numa_t *numa = kern_numa_host();
    const int host_cores = kern_device_caps(h->dev).host_cores;
    h->team = kern_numa_team_create(numa, host_cores > 0 ? (host_cores + numa->nodes - 1) / numa->nodes : 0);
}

kern_adamw_params_t exec_adamw_params(const eng_optim_hparams_t *hp, double clip_scale) {
    return (kern_adamw_params_t){
        .lr = (float)hp->lr,
        .beta1 = (float)hp->beta1,
        .beta2 = (float)hp->beta2,
        .eps = (float)hp->eps,
        .weight_decay = (float)hp->weight_decay,
        .grad_scale = (float)clip_scale,
    };
}

mt_status_t exec_host_adamw(exec_host_optim_t *h, kern_threadpool_t *pool, int i, const float *grad,
                            const kern_adamw_params_t *base, bool speculative, mt_error_t *err) {
    eng_param_t *p = &h->m->params[i];
    const size_t n = p->spec->numel;
    h->wrote_nonfinite[i] = false;
    /* in the store and not loaded with its block (block_stream): on its own */
    const bool streamed = eng_optim_nvme_holds(h->nvme, i) && !p->host_mom;
    /* the tier's buffers are its own (speculation is off with it: optim_step.c) */
    MT_CHECK(!speculative || !h->nvme, "speculative update of %s with the NVMe tier", p->spec->name);
    /* before the moments are made below: an undo must know they were not there */
    const eng_spec_copy_t *spare = speculative ? eng_spec_begin(&h->spec, p, i) : NULL;
    if (streamed) {
        const mt_status_t st = eng_optim_nvme_load(h->nvme, h->m, i, err);
        if (st != MT_OK) return st;
    } else if (!p->host_mom) {
        p->host_mom = calloc(1, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n));
        MT_CHECK(p->host_mom, "out of host memory for AdamW state of %s", p->spec->name);
        /* untouched yet: its pages come from the home node as the update first writes them */
        place_on_home(h, p->host_mom, kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, n), i);
    }
    place_param(h, i);
    kern_adamw_params_t ap = *base;
    ap.step = ++p->step;
    int bad = 0;
    ap.nonfinite = &bad; /* checked as it is written: no second pass over the master */
    const kern_moments_t mom = kern_moments_view((kern_moments_fmt_t)p->mom_fmt, p->host_mom, n, p->mom_seed);
    if (spare) {
        /* the new state into the spare, then swapped in: the old one stays
         * there, untouched, for an undo (speculate.h) */
        const kern_moments_t next = kern_moments_view((kern_moments_fmt_t)p->mom_fmt, spare->mom, n, p->mom_seed);
        kern_adamw_cpu_pool_from(pool, p->host_w, &mom, spare->w, &next, grad, NULL, p->work_bf16, n, &ap);
        eng_spec_swap_in(&h->spec, p, i);
    } else {
        kern_adamw_cpu_pool(pool, p->host_w, &mom, grad, NULL, p->work_bf16, n, &ap); /* work_bf16 NULL: none */
    }
    h->wrote_nonfinite[i] = bad != 0;
    return streamed ? eng_optim_nvme_unload(h->nvme, h->m, i, true, err) : MT_OK;
}

/* The worker's update of parameter i; a failure of the NVMe tier is kept
 * for the next optimizer step to report (eng_optim_nvme_error). */
static void worker_adamw(exec_host_optim_t *h, kern_threadpool_t *pool, int i, const float *grad,
                         const kern_adamw_params_t *base, bool speculative) {
    mt_error_t err = {0};
    const mt_status_t st = exec_host_adamw(h, pool, i, grad, base, speculative, &err);
    if (st != MT_OK) eng_optim_nvme_note(h->nvme, st, &err);
}

/* The NVMe tier's parameters of block b that the job updates: their
 * moments read as one batch (load) or handed to one background write
 * (!load: the worker goes on to the next block while it runs).  A failure
 * is kept for the next step; after a failed load the parameters stream one
 * by one (exec_host_adamw), which reports it again or succeeds. */
static void block_stream(exec_host_optim_t *h, int b, bool load, int *idx) {
    if (!h->nvme) return;
    int n = 0;
    for (int i = 0; i < h->m->num_params; i++) {
        const eng_param_t *p = &h->m->params[i];
        /* loading: those with a gradient; writing back: those loaded (a
         * deferred update has cleared has_grad by then) */
        if (p->block == b && eng_optim_nvme_holds(h->nvme, i) && (load ? h->dp[i].has_grad : p->host_mom != NULL))
            idx[n++] = i;
    }
    mt_error_t err = {0};
    const mt_status_t st = load ? eng_optim_nvme_load_many(h->nvme, h->m, idx, n, &err)
                                : eng_optim_nvme_unload_many(h->nvme, h->m, idx, n, true, &err);
    eng_optim_nvme_note(h->nvme, st, &err);
}

/* Whether the tier holds any of block b's state. */
static bool tier_holds_block(const exec_host_optim_t *h, int b) {
    for (int i = 0; i < h->m->num_params; i++)
        if (h->m->params[i].block == b && eng_optim_nvme_holds(h->nvme, i)) return true;
    return false;
}

/* The block whose update most likely follows block b's, when none is
 * queued yet: the next one the tier holds state of, walking the way the
 * updates walk.  During the backward a block's gradients land (and its
 * update is queued) only as the backward reaches it, so the queue is
 * mostly empty here; the backward updates blocks in descending order,
 * deferred updates after the norm in ascending order.  -1: none. */
static int predicted_next(const exec_host_optim_t *h, int b) {
    const int dir = h->last_block == b - 1 ? 1 : -1;
    const int nb = eng_model_num_blocks(h->m);
    for (int c = b + dir; c >= 0 && c < nb; c += dir)
        if (tier_holds_block(h, c)) return c;
    return -1;
}

/* While block b updates, the state of the block updated next is read in
 * the background, so its load finds it in memory
 * (eng_optim_nvme_prefetch): the block queued next (its gradients have
 * landed: the parameters its load will ask for, block_stream's
 * selection), else the predicted one (every parameter of it the tier
 * holds: what its load asks for once all its gradients have landed; a
 * load asking for other parameters drops the read, nothing is lost but
 * the disk's time). */
static void prefetch_next(exec_host_optim_t *h, int b, int *idx) {
    if (!h->nvme) return;
    pthread_mutex_lock(&h->lock);
    int queued = -1; /* the first queued update (norm jobs go first and are short) */
    for (int k = h->head; k != h->tail && queued < 0; k = (k + 1) % h->cap)
        if (h->queue[k].kind != EXEC_JOB_NORM) queued = h->queue[k].block;
    pthread_mutex_unlock(&h->lock);
    const int nb = queued >= 0 ? queued : predicted_next(h, b);
    if (nb < 0) return;
    int n = 0;
    for (int i = 0; i < h->m->num_params; i++)
        if (h->m->params[i].block == nb && eng_optim_nvme_holds(h->nvme, i) && (queued < 0 || h->dp[i].has_grad))
            idx[n++] = i;
    eng_optim_nvme_prefetch(h->nvme, h->m, idx, n);
}

/* Parameter i's host gradient handed back to the kernel once its update
 * is final (no speculation to undo): with its AdamW state on the NVMe tier
 * a gradient needs host memory only from its landing to its update, as
 * the planner counts it (scheduler/simulate.h), not for the whole run.
 * The buffer's whole pages then read as zeros until written again; the
 * next step's first gradient copy overwrites the buffer (clear_grads in
 * engine/exec/optim_step.c), and a parameter that gets none is zeroed. */
static void release_gradient(const exec_host_optim_t *h, int i) {
    const eng_dparam_t *d = &h->dp[i];
    if (h->speculative || d->host_g_pinned || !eng_optim_nvme_holds(h->nvme, i)) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t at = (uintptr_t)d->host_g, end = at + h->m->params[i].spec->numel * sizeof(float);
    const uintptr_t lo = (at + page - 1) & ~(page - 1), hi = end & ~(page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED); /* a hint: failing, the pages stay */
}

/* What runs on one of a block's parameters (on `pool`: its home node's
 * where the host has several). */
typedef void (*param_fn)(exec_host_optim_t *h, kern_threadpool_t *pool, int i, void *ctx);

typedef struct {
    exec_host_optim_t *h;
    const int *idx; /* the parameters, in order */
    int n;
    param_fn fn;
    void *ctx;
} on_nodes_t;

static void run_on_node(void *arg, int node, kern_threadpool_t *pool) {
    const on_nodes_t *o = arg;
    for (int k = 0; k < o->n; k++)
        if (o->h->node_of[o->idx[k]] == node) o->fn(o->h, pool, o->idx[k], o->ctx);
}

/* Whether any of idx[0..n) has its moments on the NVMe tier and not read
 * in (block_stream reads a block's in one batch before its update): the
 * store is then driven one parameter at a time, by one thread. */
static bool streams_one_by_one(const exec_host_optim_t *h, const int *idx, int n) {
    for (int k = 0; k < n && h->nvme; k++)
        if (eng_optim_nvme_holds(h->nvme, idx[k]) && !h->m->params[idx[k]].host_mom) return true;
    return false;
}

/* fn on each of idx[0..n): every node at once, each on the parameters homed
 * there (in order), where the host has several nodes (unless the NVMe tier
 * streams one of them one by one); else one by one on `pool`, in order. */
static void for_params(exec_host_optim_t *h, kern_threadpool_t *pool, const int *idx, int n, param_fn fn,
                       void *ctx) {
    if (h->team && n > 1 && !streams_one_by_one(h, idx, n)) {
        on_nodes_t o = {h, idx, n, fn, ctx};
        kern_numa_team_run(h->team, run_on_node, &o);
        return;
    }
    for (int k = 0; k < n; k++) fn(h, pool, idx[k], ctx);
}

/* Block b's parameters with a gradient (host memory, when host_only), in
 * order, into idx; returns how many. */
static int block_params(const exec_host_optim_t *h, int b, bool host_only, int *idx) {
    int n = 0;
    for (int i = 0; i < h->m->num_params; i++)
        if (h->m->params[i].block == b && h->dp[i].has_grad && (!host_only || h->dp[i].host_g)) idx[n++] = i;
    return n;
}

typedef struct {
    const kern_adamw_params_t *base;
    int done;       /* updates made (atomic: nodes count at once) */
    mt_status_t st; /* the first failure (the NVMe tier, where the updates go one by one) */
    mt_error_t err;
} in_step_t;

/* One of exec_host_adamw_params' updates; none after a failure. */
static void in_step_param(exec_host_optim_t *h, kern_threadpool_t *pool, int i, void *arg) {
    in_step_t *u = arg;
    if (u->st != MT_OK) return;
    mt_error_t err = {0};
    const mt_status_t st = exec_host_adamw(h, pool, i, h->dp[i].host_g, u->base, false, &err);
    if (st != MT_OK) { /* only with the NVMe tier, where for_params runs one parameter at a time */
        u->st = st;
        u->err = err;
        return;
    }
    __atomic_fetch_add(&u->done, 1, __ATOMIC_RELAXED);
}

mt_status_t exec_host_adamw_params(exec_host_optim_t *h, const int *idx, int n, const kern_adamw_params_t *base,
                                   int *done_out, mt_error_t *err) {
    ensure_team(h);
    in_step_t u = {.base = base, .st = MT_OK};
    for_params(h, h->pool, idx, n, in_step_param, &u);
    *done_out = u.done;
    if (u.st != MT_OK && err) *err = u.err;
    return u.st;
}

static void sum_param(exec_host_optim_t *h, kern_threadpool_t *pool, int i, void *ctx) {
    (void)ctx;
    place_param(h, i);
    kern_sumsq_host(pool, &h->gnorm_part[i], h->dp[i].host_g, h->m->params[i].spec->numel);
    h->summed[i] = true;
}

/* A norm job: the sums of squares of block b's gradients (in host
 * memory, final: the step's last backward has handed the block over).
 * Returns the bytes read. */
static size_t sum_block(exec_host_optim_t *h, kern_threadpool_t *pool, int b, int *idx) {
    const int n = block_params(h, b, true, idx);
    for_params(h, pool, idx, n, sum_param, NULL);
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += h->m->params[idx[k]].spec->numel * sizeof(float);
    return bytes;
}

typedef struct {
    const exec_host_job_t *job;
    int first_bad; /* the first parameter, in order, a deferred update left with a NaN or Inf; -1 none */
} update_ctx_t;

static void update_param(exec_host_optim_t *h, kern_threadpool_t *pool, int i, void *arg) {
    update_ctx_t *u = arg;
    eng_dparam_t *d = &h->dp[i];
    if (u->job->kind == EXEC_JOB_DEFERRED) {
        worker_adamw(h, pool, i, d->host_g, &u->job->base, false);
        /* the kernel's fused check: the step that deferred it has returned
         * (eng_optim_step reports it next, scanning only this parameter for
         * the element); the lowest index, whichever node got there first */
        if (h->wrote_nonfinite[i]) {
            int seen = __atomic_load_n(&u->first_bad, __ATOMIC_RELAXED);
            while ((seen < 0 || i < seen) &&
                   !__atomic_compare_exchange_n(&u->first_bad, &seen, i, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
            }
        }
        d->has_grad = false; /* as the step leaves every parameter it updated */
        d->acc_has_data = false;
        return;
    }
    /* the norm's share, normally taken by the block's norm job ahead of this */
    if (!h->summed[i]) sum_param(h, pool, i, NULL);
    worker_adamw(h, pool, i, d->host_g, &u->job->base, h->speculative);
    h->done[i] = true;
    release_gradient(h, i);
}

/* An update job: block b's parameters with a gradient, their state read
 * from and written back to the NVMe tier around it where it holds them.
 * Returns the bytes the updates moved. */
static size_t update_block(exec_host_optim_t *h, kern_threadpool_t *pool, const exec_host_job_t *job, int *idx) {
    eng_model_t *m = h->m;
    const int b = job->block;
    block_stream(h, b, true, idx);
    prefetch_next(h, b, idx + m->num_params);
    h->last_block = b;
    const int n = block_params(h, b, false, idx);
    update_ctx_t u = {job, -1};
    for_params(h, pool, idx, n, update_param, &u);
    if (h->nonfinite_param < 0 && u.first_bad >= 0) h->nonfinite_param = u.first_bad;
    size_t bytes = 0;
    for (int k = 0; k < n; k++) bytes += m->params[idx[k]].spec->numel * 28; /* read p, g, m, v; write p, m, v */
    block_stream(h, b, false, idx);
    return bytes;
}

/* The queue slot of the job the worker runs next, under the lock: the
 * first norm job (a pass over a block's gradients, a fraction of an
 * update's traffic, on the critical path once the backward ends: so it
 * goes ahead of the updates that have piled up), else the first job,
 * unless that is an overlapped update while held; -1: none. */
static int next_job(const exec_host_optim_t *h) {
    for (int k = h->head; k != h->tail; k = (k + 1) % h->cap)
        if (h->queue[k].kind == EXEC_JOB_NORM) return k;
    if (h->head == h->tail || (h->hold && h->queue[h->head].kind == EXEC_JOB_OVERLAPPED)) return -1;
    return h->head;
}

/* Removes queue slot k, keeping the others' order. */
static exec_host_job_t pop_job(exec_host_optim_t *h, int k) {
    const exec_host_job_t job = h->queue[k];
    for (int j = k; j != h->head; j = (j - 1 + h->cap) % h->cap) h->queue[j] = h->queue[(j - 1 + h->cap) % h->cap];
    h->head = (h->head + 1) % h->cap;
    return job;
}

static void *worker_main(void *arg) {
    exec_host_optim_t *h = arg;
    eng_model_t *m = h->m;
    /* On a device that keeps its compute cores to itself, the host
     * optimizer runs on the host cores with a pool of its own (started
     * here, so its workers inherit this thread's cores); otherwise it shares
     * the kernel pool with compute, one parallel pass at a time. */
    kern_device_pin_host_thread(h->dev);
    const int host_cores = kern_device_caps(h->dev).host_cores;
    kern_threadpool_t *own = host_cores > 0 ? kern_threadpool_create(host_cores) : NULL;
    kern_threadpool_t *pool = own ? own : h->pool;
    int *idx = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * 2 * sizeof *idx); /* block_stream's list, */
    MT_CHECK_ALLOC(idx, "host optimizer parameter list");                                   /* prefetch_next's */
    pthread_mutex_lock(&h->lock);
    for (;;) {
        int k;
        while ((k = next_job(h)) < 0 && !h->stop) pthread_cond_wait(&h->cond, &h->lock);
        if (k < 0 && h->head == h->tail) break; /* stopping, queue empty */
        if (k < 0) k = h->head;                 /* stopping: the held ones run too */
        const exec_host_job_t job = pop_job(h, k);
        const int b = job.block;
        pthread_mutex_unlock(&h->lock);
        const double t0 = mt_now_s();
        const size_t bytes = job.kind == EXEC_JOB_NORM ? sum_block(h, pool, b, idx) : update_block(h, pool, &job, idx);
        if (*h->trace) {
            char name[32];
            snprintf(name, sizeof name, "%s block %d", job.kind == EXEC_JOB_NORM ? "norm" : "AdamW", b);
            eng_trace_span(*h->trace, ENG_TRACK_HOST_OPTIM, name, "optimizer", t0, mt_now_s(), bytes);
        }
        pthread_mutex_lock(&h->lock);
        h->outstanding--;
        if (job.kind == EXEC_JOB_DEFERRED) h->block_pending[b]--;
        else if (job.kind == EXEC_JOB_OVERLAPPED) h->overlap_pending[b]--;
        pthread_cond_broadcast(&h->cond);
    }
    pthread_mutex_unlock(&h->lock);
    free(idx);
    kern_threadpool_destroy(own);
    return NULL;
}

void exec_host_optim_start(exec_host_optim_t *h, const eng_optim_hparams_t *hp) {
    h->hp = *hp;
    if (h->started) return;
    ensure_team(h);
    pthread_mutex_init(&h->lock, NULL);
    pthread_cond_init(&h->cond, NULL);
    MT_CHECK(pthread_create(&h->thread, NULL, worker_main, h) == 0, "cannot start the host optimizer thread");
    h->started = true;
}

typedef struct {
    exec_host_optim_t *h;
    exec_host_job_t job;
} enqueue_arg_t;

/* Runs on the D2H stream after the block's gradient copies and adds. */
static void enqueue_block(void *arg) {
    enqueue_arg_t *a = arg;
    exec_host_optim_t *h = a->h;
    pthread_mutex_lock(&h->lock);
    h->queue[h->tail] = a->job;
    h->tail = (h->tail + 1) % h->cap;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    free(a);
}

/* Queues job once the work issued so far on the D2H stream (block b's
 * gradient copies) is done, counted as outstanding from now. */
static void enqueue_after_d2h(exec_host_optim_t *h, exec_host_job_t job) {
    MT_CHECK(h->started, "host optimizer job queued before the worker started");
    enqueue_arg_t *a = malloc(sizeof *a);
    MT_CHECK_ALLOC(a, "optimizer job");
    *a = (enqueue_arg_t){h, job};
    pthread_mutex_lock(&h->lock);
    h->outstanding++;
    if (job.kind == EXEC_JOB_OVERLAPPED) h->overlap_pending[job.block]++;
    pthread_mutex_unlock(&h->lock);
    kern_launch_host_fn(h->dev, kern_stream(h->dev, KERN_STREAM_D2H), enqueue_block, a);
}

void exec_host_optim_enqueue(exec_host_optim_t *h, int b) {
    /* no clipping in overlap mode: the norm is not known yet */
    enqueue_after_d2h(h, (exec_host_job_t){.block = b, .kind = EXEC_JOB_OVERLAPPED,
                                           .base = exec_adamw_params(&h->hp, 1.0)});
}

void exec_host_optim_enqueue_norm(exec_host_optim_t *h, int b) {
    enqueue_after_d2h(h, (exec_host_job_t){.block = b, .kind = EXEC_JOB_NORM});
}

void exec_host_optim_wait(exec_host_optim_t *h) {
    if (!h->started) return;
    pthread_mutex_lock(&h->lock);
    while (h->outstanding > 0) pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

void exec_host_optim_hold(exec_host_optim_t *h, bool hold) {
    if (!h->started) {
        h->hold = hold;
        return;
    }
    pthread_mutex_lock(&h->lock);
    h->hold = hold;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
}

int exec_host_optim_take_back(exec_host_optim_t *h, const bool *take) {
    if (!h->started) return 0;
    pthread_mutex_lock(&h->lock);
    int kept = h->head, n = 0;
    for (int k = h->head; k != h->tail; k = (k + 1) % h->cap) {
        const exec_host_job_t job = h->queue[k];
        if (job.kind == EXEC_JOB_OVERLAPPED && take[job.block]) {
            n++;
            h->overlap_pending[job.block]--;
            continue;
        }
        h->queue[kept] = job;
        kept = (kept + 1) % h->cap;
    }
    h->tail = kept;
    h->outstanding -= n;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
    return n;
}

void exec_host_optim_defer(exec_host_optim_t *h, int b, const eng_optim_hparams_t *hp,
                           const kern_adamw_params_t *base) {
    exec_host_optim_start(h, hp);
    pthread_mutex_lock(&h->lock);
    h->queue[h->tail] = (exec_host_job_t){.block = b, .kind = EXEC_JOB_DEFERRED, .base = *base};
    h->tail = (h->tail + 1) % h->cap;
    h->outstanding++;
    h->block_pending[b]++;
    pthread_cond_broadcast(&h->cond);
    pthread_mutex_unlock(&h->lock);
}

void exec_host_optim_wait_block(exec_host_optim_t *h, int b) {
    if (!h->started) return;
    pthread_mutex_lock(&h->lock);
    while (h->block_pending[b] > 0) pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

void exec_host_optim_wait_overlapped(exec_host_optim_t *h, int b) {
    if (!h->started) return;
    pthread_mutex_lock(&h->lock);
    while (h->overlap_pending[b] > 0) pthread_cond_wait(&h->cond, &h->lock);
    pthread_mutex_unlock(&h->lock);
}

void exec_host_optim_free(exec_host_optim_t *h) {
    if (h->started) {
        kern_device_sync(h->dev); /* queued enqueue_block calls have run */
        exec_host_optim_wait(h);
        pthread_mutex_lock(&h->lock);
        h->stop = true;
        pthread_cond_broadcast(&h->cond);
        pthread_mutex_unlock(&h->lock);
        pthread_join(h->thread, NULL);
        pthread_cond_destroy(&h->cond);
        pthread_mutex_destroy(&h->lock);
        h->started = false;
    }
    kern_threadpool_destroy(h->own_pool);
    kern_numa_team_destroy(h->team);
    free(h->node_of);
    free(h->placed);
    eng_optim_nvme_free(h->nvme);
    eng_spec_free(&h->spec);
    free(h->queue);
    free(h->block_pending);
    free(h->overlap_pending);
    free(h->done);
    free(h->wrote_nonfinite);
    free(h->gnorm_part);
    free(h->summed);
    memset(h, 0, sizeof *h);
}
