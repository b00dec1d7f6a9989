/* The executor (see exec.h): placement of a model under a plan, weight
 * streaming, activation offload / recompute, and the per-block gradient
 * flow.  The forward/backward program itself is in exec_step.c.
 *
 * Gradients and plan invariance.  Every plan must give bit-identical
 * results, so gradients are accumulated the same way whatever their home:
 * the first micro-batch of an optimizer step computes into a zeroed buffer
 * (the accumulator itself when it lives on the device), later micro-batches
 * compute into a fresh zeroed buffer that is then added element-wise into
 * the accumulator (on the device or, for host gradients, on the host).
 * Adding in the GEMM (beta = 1 on a non-zero C) would round differently
 * from that add, so it is used only on zeroed buffers. */
#include "engine/exec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec_internal.h"
#include "engine/trace.h"
#include "kernels/cpu/backend_cpu.h"

/* ---- tracing ------------------------------------------------------------ */

static void copy_observer(void *ctx, kern_stream_role_t role, size_t bytes, double t0, double t1) {
    eng_model_t *m = ctx;
    if (!m->trace) return;
    eng_trace_span(m->trace, role == KERN_STREAM_H2D ? ENG_TRACK_H2D : ENG_TRACK_D2H,
                   role == KERN_STREAM_H2D ? "H2D" : "D2H", "copy", t0, t1, bytes);
}

void eng_model_set_trace(eng_model_t *m, struct eng_trace *trace) {
    m->trace = trace;
    m->dev->copy_observer = trace ? copy_observer : NULL;
    m->dev->copy_observer_ctx = trace ? m : NULL;
}

void eng_model_block_times(eng_model_t *m, double *fwd_s, double *bwd_s, bool reset) {
    eng_exec_t *x = m->exec;
    const double k = x->timed_micro > 0 ? 1.0 / x->timed_micro : 0.0;
    for (int b = 0; b < x->nb; b++) {
        if (fwd_s) fwd_s[b] = x->fwd_s[b] * k;
        if (bwd_s) bwd_s[b] = x->bwd_s[b] * k;
        if (reset) x->fwd_s[b] = x->bwd_s[b] = 0;
    }
    if (reset) x->timed_micro = 0;
}

void exec_trace_memory(eng_model_t *m, double t) {
    if (!m->trace) return;
    const kern_device_stats_t st = kern_device_stats(m->dev);
    eng_trace_counter(m->trace, "device bytes", t, (double)st.device_in_use);
    eng_trace_counter(m->trace, "pinned bytes", t, (double)st.pinned_in_use);
}

/* ---- pinned buffer cache ---------------------------------------------- */

void *exec_pinned_get(eng_model_t *m, size_t bytes) {
    eng_exec_t *x = m->exec;
    for (int i = x->npin_cache - 1; i >= 0; i--)
        if (x->pin_cache[i].bytes == bytes) {
            void *p = x->pin_cache[i].p;
            x->pin_cache[i] = x->pin_cache[--x->npin_cache];
            return p;
        }
    return kern_pinned_alloc(m->dev, bytes);
}

void exec_pinned_put(eng_model_t *m, void *p, size_t bytes) {
    eng_exec_t *x = m->exec;
    if (x->npin_cache == x->cap_pin_cache) {
        x->cap_pin_cache = x->cap_pin_cache ? 2 * x->cap_pin_cache : 64;
        x->pin_cache = realloc(x->pin_cache, (size_t)x->cap_pin_cache * sizeof *x->pin_cache);
        MT_CHECK_ALLOC(x->pin_cache, "pinned buffer cache");
    }
    x->pin_cache[x->npin_cache].p = p;
    x->pin_cache[x->npin_cache].bytes = bytes;
    x->npin_cache++;
}

/* ---- deferred frees ----------------------------------------------------- */

void exec_defer_free(eng_model_t *m, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after) {
    eng_exec_t *x = m->exec;
    if (x->npending == x->cap_pending) {
        x->cap_pending = x->cap_pending ? 2 * x->cap_pending : 64;
        x->pending = realloc(x->pending, (size_t)x->cap_pending * sizeof *x->pending);
        MT_CHECK_ALLOC(x->pending, "pending frees");
    }
    kern_event_t *ev = kern_event_create(m->dev);
    kern_event_record(m->dev, ev, after);
    x->pending[x->npending++] = (exec_pending_t){dev_ptr, pinned, pinned_bytes, ev};
}

void exec_process_pending(eng_model_t *m, bool force) {
    eng_exec_t *x = m->exec;
    int keep = 0;
    for (int i = 0; i < x->npending; i++) {
        exec_pending_t *p = &x->pending[i];
        if (force) kern_event_sync(m->dev, p->ev);
        if (force || kern_event_query(m->dev, p->ev)) {
            if (p->dev) kern_free(m->dev, p->dev);
            if (p->pinned) exec_pinned_put(m, p->pinned, p->pinned_bytes);
            kern_event_destroy(m->dev, p->ev);
        } else {
            x->pending[keep++] = *p;
        }
    }
    x->npending = keep;
}

/* Reclaim hook: an allocation did not fit; buffers still read by copies in
 * flight are freed once those copies finish. */
static bool reclaim_pending(void *ctx) {
    eng_model_t *m = ctx;
    if (!m->exec || m->exec->npending == 0) return false;
    exec_process_pending(m, true);
    return true;
}

void eng_exec_drain(eng_model_t *m) {
    kern_device_sync(m->dev);
    exec_process_pending(m, true);
}

/* ---- placement ---------------------------------------------------------- */

static const sched_block_plan_t *block_plan(const eng_model_t *m, int b) { return &m->plan.blocks[b]; }

bool exec_param_streamed(const eng_model_t *m, const eng_param_t *p) {
    return block_plan(m, p->block)->weights == SCHED_WEIGHTS_STREAM;
}

static void add_used(eng_exec_t *x, int b, int i) {
    if (i < 0) return;
    x->used[b][x->nused[b]++] = i;
}

static void build_block_lists(eng_model_t *m) {
    eng_exec_t *x = m->exec;
    const int L = m->cfg.num_hidden_layers;
    x->used = calloc((size_t)x->nb, sizeof *x->used);
    x->nused = calloc((size_t)x->nb, sizeof *x->nused);
    MT_CHECK(x->used && x->nused, "out of memory for block lists");
    for (int b = 0; b < x->nb; b++) {
        x->used[b] = malloc((size_t)m->spec.count * sizeof(int));
        MT_CHECK_ALLOC(x->used[b], "block list");
    }
    /* dense (non-routed) parameters each block computes with */
    for (int i = 0; i < m->spec.count; i++)
        if (m->params[i].spec->expert < 0 && m->params[i].block != L + 1 && i != m->embed)
            add_used(x, m->params[i].block, i);
    add_used(x, 0, m->embed);
    add_used(x, L + 1, m->final_norm);
    add_used(x, L + 1, m->lm_head);
}

static mt_status_t place_param(eng_model_t *m, eng_param_t *p, mt_error_t *err) {
    const sched_block_plan_t *bp = block_plan(m, p->block);
    const size_t bytes = p->spec->numel * sizeof(float);
    kern_stream_t *s = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    char tag[200];
    if (bp->optim == SCHED_OPTIM_DEVICE &&
        (bp->weights != SCHED_WEIGHTS_RESIDENT || bp->grads != SCHED_GRADS_DEVICE))
        return mt_error_set(err, MT_ERR_CONFIG,
                            "invalid plan for block %d: a device optimizer needs resident weights "
                            "and device gradients",
                            p->block);
    if (bp->weights == SCHED_WEIGHTS_RESIDENT) {
        snprintf(tag, sizeof tag, "weight %s", p->spec->name);
        p->w = kern_alloc(m->dev, bytes, tag, err);
        if (!p->w) return err->code;
        kern_memcpy_h2d(m->dev, s, p->w, p->host_w, bytes);
    }
    if (bp->grads == SCHED_GRADS_DEVICE) {
        snprintf(tag, sizeof tag, "gradient of %s", p->spec->name);
        p->g_acc = kern_alloc(m->dev, bytes, tag, err);
        if (!p->g_acc) return err->code;
        kern_memset(m->dev, s, p->g_acc, 0, bytes);
    }
    if (bp->grads == SCHED_GRADS_HOST || bp->optim == SCHED_OPTIM_HOST) {
        p->host_g = calloc(p->spec->numel, sizeof(float));
        MT_CHECK_ALLOC(p->host_g, p->spec->name);
    }
    return MT_OK;
}

mt_status_t eng_exec_create(eng_model_t *m, const sched_plan_t *plan, mt_error_t *err) {
    const int nb = eng_model_num_blocks(m);
    if (plan->num_blocks != nb)
        return mt_error_set(err, MT_ERR_INTERNAL, "plan has %d blocks, model has %d", plan->num_blocks, nb);
    m->plan = *plan;
    m->plan.blocks = malloc((size_t)nb * sizeof *m->plan.blocks);
    MT_CHECK_ALLOC(m->plan.blocks, "plan copy");
    memcpy(m->plan.blocks, plan->blocks, (size_t)nb * sizeof *plan->blocks);
    if (m->plan.prefetch_window < 1) m->plan.prefetch_window = 1;
    if (m->dev->kind == KERN_BACKEND_CUDA)
        for (int b = 0; b < nb; b++) {
            const sched_block_plan_t *bp = &plan->blocks[b];
            /* Streamed weights, offloaded activations and host gradients free
             * device buffers as soon as compute has been issued; that is
             * exact on the CPU backend (compute runs in order on the issuing
             * thread) but on a GPU needs stream-ordered frees first. */
            if (bp->weights != SCHED_WEIGHTS_RESIDENT || bp->acts == SCHED_ACTS_OFFLOAD ||
                bp->grads != SCHED_GRADS_DEVICE)
                return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                    "the CUDA backend runs keep-everything plans only for now (block %d "
                                    "asks for streamed weights, offloaded activations or host "
                                    "gradients); use backend: cpu for offloading plans",
                                    b);
        }

    eng_exec_t *x = calloc(1, sizeof *x);
    MT_CHECK_ALLOC(x, "executor");
    m->exec = x;
    x->nb = nb;
    build_block_lists(m);
    x->w_ready = calloc((size_t)nb, sizeof *x->w_ready);
    x->a_ready = calloc((size_t)nb, sizeof *x->a_ready);
    x->o_done = calloc((size_t)nb, sizeof *x->o_done);
    x->holding = calloc((size_t)nb, sizeof *x->holding);
    x->param_refs = calloc((size_t)m->spec.count, sizeof *x->param_refs);
    x->offl = calloc((size_t)nb, sizeof *x->offl);
    x->layer_counts = calloc((size_t)m->cfg.num_hidden_layers, sizeof *x->layer_counts);
    x->opt_done = calloc((size_t)m->spec.count, sizeof *x->opt_done);
    x->opt_queue = calloc((size_t)nb + 1, sizeof *x->opt_queue);
    MT_CHECK(x->opt_done && x->opt_queue, "out of memory for the host optimizer queue");
    x->fwd_s = calloc((size_t)nb, sizeof *x->fwd_s);
    x->bwd_s = calloc((size_t)nb, sizeof *x->bwd_s);
    MT_CHECK(x->fwd_s && x->bwd_s, "out of memory for block timings");
    MT_CHECK(x->w_ready && x->a_ready && x->holding && x->param_refs && x->offl && x->layer_counts,
             "out of memory for executor state");
    for (int b = 0; b < nb; b++) {
        x->w_ready[b] = kern_event_create(m->dev);
        x->a_ready[b] = kern_event_create(m->dev);
        x->o_done[b] = kern_event_create(m->dev);
    }
    for (int l = 0; l < m->cfg.num_hidden_layers; l++)
        if (m->cfg.layer_is_moe[l]) {
            x->layer_counts[l] = calloc((size_t)m->cfg.num_experts, sizeof(int32_t));
            MT_CHECK_ALLOC(x->layer_counts[l], "expert counts");
        }
    kern_set_reclaim_hook(m->dev, reclaim_pending, m);
    x->pool = m->dev->kind == KERN_BACKEND_CPU ? kern_cpu_stream_threadpool(kern_stream(m->dev, KERN_STREAM_COMPUTE))
                                               : NULL;
    for (int i = 0; i < m->spec.count; i++) {
        mt_status_t st = place_param(m, &m->params[i], err);
        if (st != MT_OK) return st;
    }
    kern_stream_sync(m->dev, kern_stream(m->dev, KERN_STREAM_COMPUTE));
    /* A device optimizer owns the master: the host copy would only go stale. */
    for (int i = 0; i < m->spec.count; i++) {
        eng_param_t *p = &m->params[i];
        if (block_plan(m, p->block)->optim == SCHED_OPTIM_DEVICE) {
            free(p->host_w);
            p->host_w = NULL;
        }
    }
    return MT_OK;
}

void eng_exec_destroy(eng_model_t *m) {
    eng_exec_t *x = m->exec;
    if (!x) return;
    exec_optim_worker_stop(m);
    eng_exec_drain(m);
    if (m->trace) eng_model_set_trace(m, NULL);
    kern_set_reclaim_hook(m->dev, NULL, NULL);
    for (int i = 0; i < m->spec.count; i++) {
        eng_param_t *p = &m->params[i];
        void *bufs[] = {p->w, p->g_transient ? p->g : NULL, p->g_acc, p->m, p->v};
        for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
            if (bufs[k]) kern_free(m->dev, bufs[k]);
        p->w = p->g = p->g_acc = p->m = p->v = NULL;
    }
    for (int b = 0; b < x->nb; b++) {
        kern_event_destroy(m->dev, x->w_ready[b]);
        kern_event_destroy(m->dev, x->a_ready[b]);
        kern_event_destroy(m->dev, x->o_done[b]);
        free(x->used[b]);
        for (int k = 0; k < x->offl[b].n; k++)
            if (x->offl[b].e[k].host) exec_pinned_put(m, x->offl[b].e[k].host, x->offl[b].e[k].bytes);
        free(x->offl[b].e);
        free(x->holding[b].idx);
    }
    for (int i = 0; i < x->npin_cache; i++) kern_pinned_free(m->dev, x->pin_cache[i].p, x->pin_cache[i].bytes);
    free(x->pin_cache);
    for (int l = 0; l < m->cfg.num_hidden_layers; l++) free(x->layer_counts[l]);
    if (m->rope_cos) kern_free(m->dev, m->rope_cos);
    if (m->rope_sin) kern_free(m->dev, m->rope_sin);
    m->rope_cos = m->rope_sin = NULL;
    free(x->layer_counts);
    free(x->used);
    free(x->nused);
    free(x->w_ready);
    free(x->a_ready);
    free(x->o_done);
    free(x->holding);
    free(x->param_refs);
    free(x->offl);
    free(x->pending);
    free(x->opt_done);
    free(x->opt_queue);
    free(x->fwd_s);
    free(x->bwd_s);
    free(x);
    m->exec = NULL;
}

/* ---- weight streaming -------------------------------------------------- */

static mt_status_t hold_param(eng_model_t *m, int b, int i, mt_error_t *err) {
    eng_exec_t *x = m->exec;
    eng_param_t *p = &m->params[i];
    if (!exec_param_streamed(m, p)) return MT_OK;
    if (x->param_refs[i]++ == 0) {
        char tag[200];
        snprintf(tag, sizeof tag, "streamed weight %s", p->spec->name);
        p->w = kern_alloc(m->dev, p->spec->numel * sizeof(float), tag, err);
        if (!p->w) {
            x->param_refs[i]--;
            return err->code;
        }
        kern_memcpy_h2d(m->dev, kern_stream(m->dev, KERN_STREAM_H2D), p->w, p->host_w,
                        p->spec->numel * sizeof(float));
    }
    exec_held_t *h = &x->holding[b];
    if (h->n == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 32;
        h->idx = realloc(h->idx, (size_t)h->cap * sizeof *h->idx);
        MT_CHECK_ALLOC(h->idx, "held weights");
    }
    h->idx[h->n++] = i;
    return MT_OK;
}

/* Experts of layer l with tokens according to counts (NULL: none). */
static mt_status_t hold_experts(eng_model_t *m, int b, int l, const int32_t *counts, mt_error_t *err) {
    const eng_layer_index_t *Lx = &m->layers[l];
    for (int e = 0; e < m->cfg.num_experts; e++) {
        if (!counts || counts[e] == 0) continue;
        const int ids[3] = {Lx->exp_gate[e], Lx->exp_up[e], Lx->exp_down[e]};
        for (int k = 0; k < 3; k++) {
            if (m->params[ids[k]].w && !exec_param_streamed(m, &m->params[ids[k]])) continue;
            mt_status_t st = hold_param(m, b, ids[k], err);
            if (st != MT_OK) return st;
        }
    }
    return MT_OK;
}

mt_status_t exec_fetch_block(eng_model_t *m, int b, bool backward, mt_error_t *err) {
    eng_exec_t *x = m->exec;
    if (b < 0 || b >= x->nb || x->holding[b].fetched) return MT_OK;
    x->holding[b].fetched = true;
    for (int k = 0; k < x->nused[b]; k++) {
        mt_status_t st = hold_param(m, b, x->used[b][k], err);
        if (st != MT_OK) return st;
    }
    const int l = b - 1;
    if (l >= 0 && l < m->cfg.num_hidden_layers && m->cfg.layer_is_moe[l] && (backward || x->counts_valid)) {
        /* Backward knows which experts this forward used.  Forward cannot
         * know before the router runs, so it prefetches the experts the
         * previous micro-batch used in this layer (with many tokens per
         * micro-batch that is nearly every expert); the router's choice then
         * fetches whatever is missing (exec_fetch_experts), and a prefetched
         * expert that gets no token is dropped unused. */
        mt_status_t st = hold_experts(m, b, l, x->layer_counts[l], err);
        if (st != MT_OK) return st;
    }
    kern_event_record(m->dev, x->w_ready[b], kern_stream(m->dev, KERN_STREAM_H2D));
    return MT_OK;
}

void exec_wait_block(eng_model_t *m, int b) {
    kern_stream_wait_event(m->dev, kern_stream(m->dev, KERN_STREAM_COMPUTE), m->exec->w_ready[b]);
}

/* Forward: the router has run; fetch the experts that got tokens now. */
mt_status_t exec_fetch_experts(eng_model_t *m, int l, const int32_t *counts, mt_error_t *err) {
    eng_exec_t *x = m->exec;
    const int b = l + 1;
    if (block_plan(m, b)->weights != SCHED_WEIGHTS_STREAM) return MT_OK;
    mt_status_t st = hold_experts(m, b, l, counts, err);
    if (st != MT_OK) return st;
    kern_event_record(m->dev, x->w_ready[b], kern_stream(m->dev, KERN_STREAM_H2D));
    exec_wait_block(m, b);
    return MT_OK;
}

void exec_release_block(eng_model_t *m, int b) {
    eng_exec_t *x = m->exec;
    exec_held_t *h = &x->holding[b];
    for (int k = 0; k < h->n; k++) {
        const int i = h->idx[k];
        if (--x->param_refs[i] == 0) {
            /* compute is done with it; the copy that filled it fired before use */
            kern_free(m->dev, m->params[i].w);
            m->params[i].w = NULL;
        }
    }
    h->n = 0;
    h->fetched = false;
}

/* ---- activation offload ------------------------------------------------- */

mt_status_t exec_offload_acts(eng_model_t *m, int b, void **const *slots, int nslots, mt_error_t *err) {
    eng_exec_t *x = m->exec;
    kern_stream_t *d2h = kern_stream(m->dev, KERN_STREAM_D2H);
    kern_event_t *ready = kern_event_create(m->dev);
    kern_event_record(m->dev, ready, kern_stream(m->dev, KERN_STREAM_COMPUTE));
    kern_stream_wait_event(m->dev, d2h, ready);
    kern_event_destroy(m->dev, ready);
    exec_offload_t *o = &x->offl[b];
    o->n = 0;
    if (o->cap < nslots) {
        o->cap = nslots;
        o->e = realloc(o->e, (size_t)o->cap * sizeof *o->e);
        MT_CHECK_ALLOC(o->e, "offload table");
    }
    for (int k = 0; k < nslots; k++) {
        void *dev_ptr = *slots[k];
        if (!dev_ptr) continue;
        const size_t bytes = kern_alloc_size(m->dev, dev_ptr);
        void *host = exec_pinned_get(m, bytes);
        if (!host)
            return mt_error_set(err, MT_ERR_NOMEM, "cannot allocate %zu bytes of pinned memory to offload "
                                "activations of block %d", bytes, b);
        kern_memcpy_d2h(m->dev, d2h, host, dev_ptr, bytes);
        o->e[o->n++] = (exec_offload_entry_t){slots[k], host, bytes};
        exec_defer_free(m, dev_ptr, NULL, 0, d2h);
        *slots[k] = NULL;
    }
    kern_event_record(m->dev, x->o_done[b], d2h);
    return MT_OK;
}

mt_status_t exec_fetch_acts(eng_model_t *m, int b, mt_error_t *err) {
    eng_exec_t *x = m->exec;
    exec_offload_t *o = &x->offl[b];
    if (o->fetched || o->n == 0) return MT_OK;
    kern_stream_t *h2d = kern_stream(m->dev, KERN_STREAM_H2D);
    kern_stream_wait_event(m->dev, h2d, x->o_done[b]); /* the offload copies have landed */
    for (int k = 0; k < o->n; k++) {
        exec_offload_entry_t *e = &o->e[k];
        void *dev_ptr = kern_alloc(m->dev, e->bytes, "activation fetched back for backward", err);
        if (!dev_ptr) return err->code;
        kern_memcpy_h2d(m->dev, h2d, dev_ptr, e->host, e->bytes);
        *e->slot = dev_ptr;
        exec_defer_free(m, NULL, e->host, e->bytes, h2d);
        e->host = NULL;
    }
    kern_event_record(m->dev, x->a_ready[b], h2d);
    o->fetched = true;
    return MT_OK;
}

void exec_wait_acts(eng_model_t *m, int b) {
    eng_exec_t *x = m->exec;
    if (!x->offl[b].fetched) return;
    kern_stream_wait_event(m->dev, kern_stream(m->dev, KERN_STREAM_COMPUTE), x->a_ready[b]);
    x->offl[b].fetched = false;
    x->offl[b].n = 0;
}

/* ---- gradients ---------------------------------------------------------- */

mt_status_t exec_prepare_grad(eng_model_t *m, int i, mt_error_t *err) {
    eng_param_t *p = &m->params[i];
    if (p->g) return MT_OK; /* already the target in this micro-batch (tied weights) */
    const sched_block_plan_t *bp = block_plan(m, p->block);
    if (bp->grads == SCHED_GRADS_DEVICE && !p->acc_has_data) {
        p->g = p->g_acc; /* zeroed: computing into it is exact */
        p->g_transient = false;
        return MT_OK;
    }
    char tag[200];
    snprintf(tag, sizeof tag, "gradient of %s (this micro-batch)", p->spec->name);
    const size_t bytes = p->spec->numel * sizeof(float);
    p->g = kern_alloc(m->dev, bytes, tag, err);
    if (!p->g) return err->code;
    kern_memset(m->dev, kern_stream(m->dev, KERN_STREAM_COMPUTE), p->g, 0, bytes);
    p->g_transient = true;
    return MT_OK;
}

typedef struct {
    float *dst;
    const float *src;
    size_t n;
} host_add_t;

static void host_add_fn(void *arg) {
    host_add_t *a = arg;
    for (size_t j = 0; j < a->n; j++) a->dst[j] += a->src[j];
    free(a);
}

void eng_exec_finish_grad(eng_model_t *m, int i) {
    eng_param_t *p = &m->params[i];
    if (!p->g) return;
    const sched_block_plan_t *bp = block_plan(m, p->block);
    const size_t n = p->spec->numel, bytes = n * sizeof(float);
    kern_stream_t *cs = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    p->has_grad = true;
    if (bp->grads == SCHED_GRADS_DEVICE) {
        if (p->g_transient) {
            m->dev->ops->add(cs, p->g_acc, p->g_acc, p->g, n);
            kern_free(m->dev, p->g); /* the compute stream is the only user */
        }
    } else {
        kern_stream_t *d2h = kern_stream(m->dev, KERN_STREAM_D2H);
        kern_event_t *ready = kern_event_create(m->dev);
        kern_event_record(m->dev, ready, cs);
        kern_stream_wait_event(m->dev, d2h, ready);
        kern_event_destroy(m->dev, ready);
        if (!p->acc_has_data) {
            kern_memcpy_d2h(m->dev, d2h, p->host_g, p->g, bytes);
            exec_defer_free(m, p->g, NULL, 0, d2h);
        } else {
            float *staging = exec_pinned_get(m, bytes);
            MT_CHECK(staging != NULL, "cannot allocate pinned staging for the gradient of %s", p->spec->name);
            kern_memcpy_d2h(m->dev, d2h, staging, p->g, bytes);
            host_add_t *a = malloc(sizeof *a);
            MT_CHECK_ALLOC(a, "host gradient add");
            *a = (host_add_t){p->host_g, staging, n};
            kern_launch_host_fn(m->dev, d2h, host_add_fn, a);
            exec_defer_free(m, p->g, staging, bytes, d2h);
        }
    }
    p->acc_has_data = true;
    p->g = NULL;
    p->g_transient = false;
}

/* ---- reading back ------------------------------------------------------- */

void eng_model_read_param(eng_model_t *m, int i, float *host, bool gradient) {
    eng_exec_drain(m);
    const eng_param_t *p = &m->params[i];
    const size_t bytes = p->spec->numel * sizeof(float);
    kern_stream_t *s = kern_stream(m->dev, KERN_STREAM_COMPUTE);
    const void *src_host = gradient ? p->host_g : p->host_w;
    const void *src_dev = gradient ? p->g_acc : p->w;
    if (gradient && block_plan(m, p->block)->grads == SCHED_GRADS_DEVICE) src_host = NULL;
    if (src_host) {
        memcpy(host, src_host, bytes);
    } else if (src_dev) {
        kern_memcpy_d2h(m->dev, s, host, src_dev, bytes);
        kern_stream_sync(m->dev, s);
    } else {
        memset(host, 0, bytes);
    }
}
