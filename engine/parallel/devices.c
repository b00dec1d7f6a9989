/* Data parallel over devices sharing one host copy (see devices.h). */
#include "engine/parallel/devices.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/place/copies.h"
#include "engine/exec/executor.h"
#include "engine/exec/expert_parallel.h"
#include "engine/exec/xfer.h"
#include "engine/model/lora_model.h"
#include "kernels/host/threadpool.h"

/* ---- opening -------------------------------------------------------------- */

mt_status_t eng_multi_open(eng_multi_t *mm, kern_device_t *dev0, const eng_devices_t *devices, int accum,
                           const char *dir, const eng_model_opts_t *opts, mt_error_t *err) {
    memset(mm, 0, sizeof *mm);
    const int n = devices && devices->count > 0 ? devices->count : 1;
    mm->n = n;
    mm->x = calloc((size_t)n, sizeof *mm->x);
    mm->devs = calloc((size_t)n, sizeof *mm->devs);
    MT_CHECK(mm->x && mm->devs, "out of memory for %d devices", n);
    mm->devs[0] = dev0;
    if (n == 1) {
        mt_status_t st = eng_exec_open(&mm->x[0], dev0, dir, opts, err);
        mm->primary = mm->x[0];
        if (st != MT_OK) eng_multi_free(mm);
        return st;
    }
    if (accum % n != 0) {
        eng_multi_free(mm);
        return mt_error_set(err, MT_ERR_CONFIG,
                            "gradient_accumulation_steps (%d) must be a multiple of devices (%d): each device "
                            "runs an equal share of a step's micro-batches",
                            accum, n);
    }
    /* One model, its homes read once; an executor per device over it.  The
     * primary (device 0) is placed last, because a device optimizer's
     * placement frees the host masters the others place from. */
    mt_status_t st = MT_OK;
    mm->model = calloc(1, sizeof *mm->model);
    MT_CHECK_ALLOC(mm->model, "model");
    st = eng_model_init(mm->model, dir, opts, err);
    if (st != MT_OK) {
        free(mm->model);
        mm->model = NULL;
        goto fail;
    }
    if (opts->lora && (st = eng_lora_attach(mm->model, opts->lora, err)) != MT_OK) goto fail;
    sched_plan_t keep_all, *plan = (sched_plan_t *)opts->plan;
    if (!plan) {
        sched_plan_init_uniform(&keep_all, eng_model_num_blocks(mm->model), SCHED_POLICY_KEEP_ALL);
        plan = &keep_all;
    }
    bool expert_parallel = false;
    if ((st = eng_ep_check(mm->model, plan, n, &expert_parallel, err)) != MT_OK) {
        if (plan == &keep_all) sched_plan_free(&keep_all);
        goto fail;
    }
    st = eng_exec_create(&mm->x[0], mm->model, dev0, plan, opts->staging, false, err);
    mm->primary = mm->x[0];
    /* the other devices read the shared homes without the primary's
     * executor: every update must be done when the optimizer step returns */
    if (st == MT_OK) eng_exec_finish_updates_in_step(mm->x[0]);
    if (st == MT_OK) st = eng_model_read_weights(mm->model, dir, err);
    if (st == MT_OK && opts->lora) st = eng_lora_init_weights(mm->model, opts->lora, err);
    for (int d = 1; d < n && st == MT_OK; d++) {
        kern_device_opts_t o = dev0->opts; /* the same budget, link and threads on every device */
        o.device_index = devices->ids[d];
        st = kern_device_create(dev0->kind, &o, &mm->devs[d], err);
        if (st != MT_OK) mt_error_prefix(err, "devices: device %d: ", devices->ids[d]);
        if (st == MT_OK) st = eng_exec_create(&mm->x[d], mm->model, mm->devs[d], plan, opts->staging, true, err);
        if (st != MT_OK) mt_error_prefix(err, "device %d: ", d);
    }
    if (plan == &keep_all) sched_plan_free(&keep_all);
    /* the communicator before placement: with expert parallelism each
     * device places only the experts its rank owns */
    if (st == MT_OK && (st = kern_comm_create(mm->devs, n, &mm->comm, err)) != MT_OK) mt_error_prefix(err, "devices: ");
    if (st == MT_OK && expert_parallel) {
        mm->ep = calloc((size_t)n, sizeof *mm->ep);
        MT_CHECK_ALLOC(mm->ep, "expert-parallel ranks");
        for (int d = 0; d < n; d++) {
            mm->ep[d] = (moe_ep_t){mm->comm, d};
            exec_ep_set(mm->x[d], &mm->ep[d]);
        }
    }
    for (int d = 1; d < n && st == MT_OK; d++)
        if ((st = eng_exec_place(mm->x[d], err)) != MT_OK) mt_error_prefix(err, "device %d: ", d);
    if (st == MT_OK) st = eng_exec_place(mm->x[0], err);
    if (st != MT_OK) goto fail;
    mm->updated = calloc((size_t)mm->model->num_params, sizeof *mm->updated);
    MT_CHECK_ALLOC(mm->updated, "gradient union");
    return MT_OK;
fail:
    eng_multi_free(mm);
    return st;
}

void eng_multi_free(eng_multi_t *mm) {
    if (mm->comm) kern_comm_destroy(mm->comm);
    for (int d = mm->n - 1; d >= 0; d--) {
        if (mm->x) eng_exec_free(mm->x[d]);
        if (d > 0 && mm->devs && mm->devs[d]) kern_device_destroy(mm->devs[d]);
    }
    if (mm->model) {
        eng_model_release(mm->model);
        free(mm->model);
    }
    free(mm->x);
    free(mm->devs);
    free(mm->updated);
    free(mm->ep);
    memset(mm, 0, sizeof *mm);
}

eng_model_t *eng_multi_model(const eng_multi_t *mm) { return eng_exec_model(mm->x[0]); }

static eng_exec_t *rep_of(eng_multi_t *mm, int d) { return mm->x[d]; }

/* ---- a step --------------------------------------------------------------- */

static int ranks_of(const eng_multi_t *mm) { return mm->ranks ? mm->ranks->size : 1; }

void eng_multi_begin_step(eng_multi_t *mm, const eng_optim_hparams_t *hp, int k, bool overlap) {
    const int R = ranks_of(mm);
    if (mm->n == 1) {
        eng_optim_begin_step(mm->primary, hp, k / R, overlap && R == 1);
        return;
    }
    for (int d = 0; d < mm->n; d++) eng_optim_begin_step(rep_of(mm, d), hp, k / R / mm->n, false);
}

typedef struct {
    eng_multi_t *mm;
    int d;
    const eng_batch_t *batches;
    int k;
    float scale;
    eng_step_order_t order;
    eng_micro_stats_t *stats;
    mt_status_t st;
    mt_error_t err;
    bool aborted_first; /* this device's failure aborted the communicator (not a peer's) */
} worker_t;

static void *fwd_bwd_main(void *arg) {
    worker_t *w = arg;
    eng_exec_t *x = rep_of(w->mm, w->d);
    w->st = eng_exec_step_fwd_bwd(x, w->batches, w->k, w->scale, w->order, w->stats, &w->err);
    /* expert-parallel layers exchange tokens: a device that stopped must
     * not leave the others waiting for it in an exchange */
    if (w->st != MT_OK && w->mm->ep) {
        w->aborted_first = !kern_comm_aborted(w->mm->comm);
        kern_comm_abort(w->mm->comm);
    }
    eng_exec_drain(x); /* every gradient has landed before the reduction reads it */
    return NULL;
}

/* Each rank from its own thread, the same collectives in the same order
 * (kern_comm's contract): one allreduce per device-resident gradient that
 * some device produced, in parameter order. */
static void *allreduce_main(void *arg) {
    worker_t *w = arg;
    eng_multi_t *mm = w->mm;
    eng_exec_t *x = rep_of(mm, w->d);
    const eng_model_t *m = x->model;
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        if (!mm->updated[i] || x->plan.blocks[p->block].grads != SCHED_GRADS_DEVICE) continue;
        kern_comm_allreduce_sum(mm->comm, w->d, x->dp[i].g_acc, p->spec->numel, MT_F32);
    }
    kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_COMPUTE));
    return NULL;
}

/* Runs fn for every device at once: devices 1..n-1 on threads of their
 * own, device 0 on the caller's. */
static void run_all(eng_multi_t *mm, worker_t *w, void *(*fn)(void *)) {
    pthread_t *th = calloc((size_t)mm->n, sizeof *th);
    MT_CHECK_ALLOC(th, "device threads");
    for (int d = 1; d < mm->n; d++)
        MT_CHECK(pthread_create(&th[d], NULL, fn, &w[d]) == 0, "cannot start the thread of device %d", d);
    fn(&w[0]);
    for (int d = 1; d < mm->n; d++) pthread_join(th[d], NULL);
    free(th);
}

/* a[e] = a[e] + b[e] over the host optimizer's pool, in chunks: each
 * element is one float add whatever the chunking, so the sum is the same
 * as one thread's, at host memory bandwidth rather than one core's. */
typedef struct {
    float *a;
    const float *b;
    size_t n;
} add_job_t;
enum { ADD_CHUNK = 1 << 14 }; /* 64 KiB of each operand per task */

static void add_chunk(void *ctx, size_t t) {
    const add_job_t *j = ctx;
    const size_t lo = t * ADD_CHUNK, hi = lo + ADD_CHUNK < j->n ? lo + ADD_CHUNK : j->n;
    for (size_t e = lo; e < hi; e++) j->a[e] = j->a[e] + j->b[e];
}

static void host_add(kern_threadpool_t *pool, float *a, const float *b, size_t n) {
    add_job_t j = {a, b, n};
    const size_t tasks = (n + ADD_CHUNK - 1) / ADD_CHUNK;
    if (pool && tasks > 1) {
        kern_threadpool_parallel_for(pool, tasks, add_chunk, &j);
    } else {
        for (size_t t = 0; t < tasks; t++) add_chunk(&j, t);
    }
}

/* Sums every device's gradient into the primary's accumulator in rank
 * order, and empties the replicas' for the next step. */
static void reduce_grads(eng_multi_t *mm, worker_t *w) {
    eng_exec_t *x0 = mm->x[0];
    const eng_model_t *m = x0->model;
    const int P = m->num_params;
    bool any_device = false;
    for (int i = 0; i < P; i++) {
        mm->updated[i] = false;
        for (int d = 0; d < mm->n; d++) mm->updated[i] |= mm->x[d]->dp[i].has_grad;
        any_device |= mm->updated[i] && x0->plan.blocks[m->params[i].block].grads == SCHED_GRADS_DEVICE;
    }
    /* a device accumulator without a gradient this step is zero (zeroed at
     * placement and after each optimizer step), so adding it changes nothing */
    if (any_device) run_all(mm, w, allreduce_main);
    for (int i = 0; i < P; i++) {
        if (!mm->updated[i]) continue;
        const eng_param_t *p = &m->params[i];
        eng_dparam_t *d0 = &x0->dp[i];
        if (x0->plan.blocks[p->block].grads == SCHED_GRADS_HOST) {
            /* a host accumulator without a gradient this step holds a stale
             * one: the first contribution is copied, the next ones added,
             * as the staging pool's COPY / ADD_F32 do for one device */
            for (int d = 1; d < mm->n; d++) {
                const eng_dparam_t *q = &mm->x[d]->dp[i];
                if (!q->has_grad) continue;
                if (!d0->has_grad) {
                    memcpy(d0->host_g, q->host_g, p->spec->numel * sizeof(float));
                } else {
                    host_add(x0->hopt.pool, d0->host_g, q->host_g, p->spec->numel);
                }
                d0->has_grad = true;
            }
        }
        d0->has_grad = true;
        d0->acc_has_data = true;
    }
    for (int d = 1; d < mm->n; d++) {
        eng_exec_t *r = mm->x[d];
        kern_stream_t *s = kern_stream(r->dev, KERN_STREAM_COMPUTE);
        for (int i = 0; i < P; i++) {
            eng_dparam_t *q = &r->dp[i];
            /* the allreduce left the sum in every rank's accumulator */
            if (q->g_acc && mm->updated[i])
                kern_memset(r->dev, s, q->g_acc, 0, m->params[i].spec->numel * sizeof(float));
            q->has_grad = false;
            q->acc_has_data = false;
        }
        kern_stream_sync(r->dev, s);
        r->micro_left = 0;
    }
}

/* Across ranks: the primary's gradients (this rank's in-process sum) summed
 * over the ranks in rank order (engine/parallel/ranks.h), as plain buffers. */
static mt_status_t reduce_ranks(eng_multi_t *mm, mt_error_t *err) {
    eng_exec_t *x0 = mm->primary;
    const eng_model_t *m = x0->model;
    eng_exec_drain(x0); /* every gradient has landed in its accumulator */
    const int P = m->num_params;
    eng_rank_grad_t *g = calloc((size_t)(P > 0 ? P : 1), sizeof *g);
    int *which = calloc((size_t)(P > 0 ? P : 1), sizeof *which);
    MT_CHECK(g && which, "out of host memory for the cross-rank gradient list");
    int n = 0;
    for (int i = 0; i < P; i++) {
        const eng_param_t *p = &m->params[i];
        const eng_dparam_t *d = &x0->dp[i];
        if (p->frozen) continue;
        const bool dev = x0->plan.blocks[p->block].grads == SCHED_GRADS_DEVICE;
        which[n] = i;
        g[n++] = (eng_rank_grad_t){.name = p->spec->name, .buf = dev ? d->g_acc : d->host_g,
                                   .count = p->spec->numel, .on_device = dev, .has = d->has_grad};
    }
    const mt_status_t st = eng_ranks_sum_grads(mm->ranks, g, n, err);
    for (int j = 0; st == MT_OK && j < n; j++) {
        if (!g[j].has) continue;
        eng_dparam_t *d = &x0->dp[which[j]];
        d->has_grad = true;
        d->acc_has_data = true;
        if (mm->updated) mm->updated[which[j]] = true; /* the replicas' refresh follows the union */
    }
    free(g);
    free(which);
    return st;
}

mt_status_t eng_multi_step_fwd_bwd(eng_multi_t *mm, const eng_batch_t *batches, int k, eng_step_order_t order,
                                   eng_micro_stats_t *stats, mt_error_t *err) {
    const int R = ranks_of(mm);
    if (mm->n == 1) {
        mt_status_t st = eng_exec_step_fwd_bwd(mm->primary, batches, k, 1.0f / (float)(k * R), order, stats, err);
        if (st == MT_OK && R > 1) st = reduce_ranks(mm, err);
        return st;
    }
    if (k % mm->n != 0)
        return mt_error_set(err, MT_ERR_CONFIG, "gradient_accumulation_steps (%d) must be a multiple of devices (%d)",
                            k, mm->n);
    const int share = k / mm->n;
    worker_t *w = calloc((size_t)mm->n, sizeof *w);
    MT_CHECK_ALLOC(w, "device workers");
    for (int d = 0; d < mm->n; d++)
        w[d] = (worker_t){.mm = mm, .d = d, .batches = batches + d * share, .k = share,
                          .scale = 1.0f / (float)(k * R), .order = order, .stats = stats + d * share};
    run_all(mm, w, fwd_bwd_main);
    mt_status_t st = MT_OK;
    /* the device whose failure stopped the others first: their errors (an
     * exchange aborted under them, MT_ERR_DEVICE) are its consequence.  A
     * failure inside an MoE block aborts the communicator there already,
     * so a device that did not abort first but failed otherwise than an
     * exchange does (budget, data) is a cause too. */
    for (int pass = 0; pass < 2 && st == MT_OK; pass++)
        for (int d = 0; d < mm->n && st == MT_OK; d++)
            if (w[d].st != MT_OK && (pass == 1 || w[d].aborted_first || w[d].st != MT_ERR_DEVICE))
                st = mt_error_set(err, w[d].st, "device %d: %s", d, w[d].err.msg);
    if (st == MT_OK) reduce_grads(mm, w);
    if (st == MT_OK && R > 1) st = reduce_ranks(mm, err);
    free(w);
    return st;
}

mt_status_t eng_multi_step_from_loader(eng_multi_t *mm, eng_loader_t *ld, int k, eng_step_order_t order,
                                       eng_micro_stats_t *stats, mt_error_t *err) {
    const int R = ranks_of(mm);
    if (mm->n == 1 && R == 1) return eng_exec_step_from_loader(mm->primary, ld, k, order, stats, err);
    if (k % R != 0)
        return mt_error_set(err, MT_ERR_CONFIG, "gradient_accumulation_steps (%d) must be a multiple of the ranks (%d)",
                            k, R);
    const int share = k / R, first = mm->ranks ? mm->ranks->rank * share : 0;
    eng_batch_t *bs = eng_loader_take(ld, k);
    const mt_status_t st = eng_multi_step_fwd_bwd(mm, bs + first, share, order, stats + first, err);
    eng_batches_free(bs, k);
    if (st == MT_OK && R > 1) eng_ranks_gather_shares(mm->ranks, stats, sizeof *stats, k);
    return st;
}

/* ---- the optimizer step and the replicas' refresh ------------------------- */

/* The replicas' resident working copies of the parameters the step updated
 * take the new values, a block at a time through each device's staging
 * pool: from the shared host master (host optimizer), or from the primary's
 * updated working copy brought to host memory once (device optimizer). */
static mt_status_t refresh_replicas(eng_multi_t *mm, mt_error_t *err) {
    eng_exec_t *x0 = mm->x[0];
    const eng_model_t *m = x0->model;
    const int P = m->num_params;
    moe_staging_xfer_t *items = malloc((size_t)(P > 0 ? P : 1) * sizeof *items);
    size_t *off = malloc((size_t)(P > 0 ? P : 1) * sizeof *off);
    int *which = malloc((size_t)(P > 0 ? P : 1) * sizeof *which);
    MT_CHECK(items && off && which, "out of memory for the replicas' refresh");
    mt_status_t st = MT_OK;
    for (int b = 0; b < eng_model_num_blocks(m) && st == MT_OK; b++) {
        const sched_block_plan_t *bp = &x0->plan.blocks[b];
        if (bp->weights != SCHED_WEIGHTS_RESIDENT) continue; /* streamed: fetched from the shared home */
        int n = 0;
        size_t bytes = 0;
        for (int i = 0; i < P; i++) {
            const eng_param_t *p = &m->params[i];
            if (p->block != b || !mm->updated[i] || p->frozen) continue;
            which[n] = i;
            off[n++] = bytes;
            bytes += exec_w_bytes(p);
        }
        if (n == 0) continue;
        char tag[96];
        uint8_t *tmp = NULL;
        if (bp->optim == SCHED_OPTIM_DEVICE) {
            tmp = malloc(bytes);
            MT_CHECK_ALLOC(tmp, "replica refresh buffer");
            for (int j = 0; j < n; j++) {
                const eng_param_t *p = &m->params[which[j]];
                items[j] = (moe_staging_xfer_t){tmp + off[j], x0->dp[which[j]].w, exec_w_bytes(p), MOE_STAGING_COPY};
            }
            snprintf(tag, sizeof tag, "updated weights of block %d for the other devices", b);
            st = exec_stage_d2h(x0, items, n, tag, err);
            kern_stream_sync(x0->dev, kern_stream(x0->dev, KERN_STREAM_D2H));
        }
        for (int d = 1; d < mm->n && st == MT_OK; d++) {
            eng_exec_t *r = mm->x[d];
            int nr = 0;
            for (int j = 0; j < n; j++) {
                const eng_param_t *q = &m->params[which[j]];
                void *w = r->dp[which[j]].w;
                if (!w) continue; /* another device's expert (expert parallel): no copy here */
                items[nr++] = tmp ? (moe_staging_xfer_t){tmp + off[j], w, exec_w_bytes(q), MOE_STAGING_COPY}
                                  : exec_w_refresh_item(q, w);
            }
            snprintf(tag, sizeof tag, "weights of block %d after the optimizer (device %d)", b, d);
            st = exec_stage_h2d(r, items, nr, tag, err);
            kern_stream_sync(r->dev, kern_stream(r->dev, KERN_STREAM_H2D)); /* tmp is read until here */
        }
        free(tmp);
    }
    free(items);
    free(off);
    free(which);
    return st;
}

mt_status_t eng_multi_sync_replicas(eng_multi_t *mm, mt_error_t *err) {
    if (mm->n == 1) return MT_OK;
    const eng_model_t *m = mm->x[0]->model;
    eng_exec_drain(mm->x[0]);
    for (int i = 0; i < m->num_params; i++) mm->updated[i] = !m->params[i].frozen;
    mt_status_t st = refresh_replicas(mm, err);
    for (int i = 0; i < m->num_params; i++) mm->updated[i] = false;
    for (int d = 1; d < mm->n; d++) eng_exec_drain(mm->x[d]);
    return st;
}

mt_status_t eng_multi_optim_step(eng_multi_t *mm, const eng_optim_hparams_t *hp, eng_optim_stats_t *out,
                                 mt_error_t *err) {
    mt_status_t st = eng_optim_step(mm->primary, hp, out, err);
    if (st != MT_OK || mm->n == 1) return st;
    st = refresh_replicas(mm, err);
    for (int d = 1; d < mm->n; d++) eng_exec_drain(mm->x[d]);
    return st;
}
