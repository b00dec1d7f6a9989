/* Forward and backward of one micro-batch under the model's plan (see
 * step.h and exec.h).  Layer halves live in engine/layers/blocks.c, the MoE
 * block in moe/.
 *
 * Blocks run in order 0..L+1 forward and L+1..0 backward.  Before a block
 * computes, its streamed weights (and, backward, its offloaded
 * activations) must have arrived; the fetches of the next
 * `prefetch_window` blocks are issued first so the copies overlap this
 * block's compute.  After a block's forward its activations are kept,
 * offloaded (D2H, freed when the copy is done) or dropped to be recomputed
 * from the block input before its backward.
 *
 * Residual stream: xin[l] is layer l's input (xin[L] the final norm's input);
 * these block inputs stay on the device (layer-major order may offload
 * them, exec_micro_input_slot) and each is freed by the backward of the
 * block it enters, its last reader.  x_mid (after attention) belongs to the
 * layer's saved activations.
 *
 * Loss: CE over the shifted targets, mean over counted tokens, plus
 * router_aux_loss_coef * aux when output_router_logits (HF's
 * load_balancing_loss_func over all MoE layers with the attention mask).
 * The aux statistics are gathered layer by layer during the forward pass;
 * their gradient is known once the forward pass ends.
 *
 * After each block's backward the program calls the executor's block-ready
 * hook (progress.h): the optimizer, above it, listens there to start host
 * AdamW on blocks whose gradients are complete.
 *
 * Forward only (eng_exec_forward, evaluation): the same forward under the
 * same plan, streamed weights fetched as in training, but nothing is kept
 * for a backward: each layer's saved activations and its input are freed
 * as soon as its output exists (never offloaded), no aux statistics are
 * gathered, and nothing the training step reads afterwards changes (the
 * expert prediction for prefetch, the block timings, the staging pool's
 * sizing, LoRA's dropout, which is off as in PEFT's eval mode). */
#include "engine/exec/step.h"

#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/clock.h"
#include "engine/exec/place/acts.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/exec/place/grads.h"
#include "engine/exec/place/pending.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/place/residency.h"
#include "engine/exec/place/stage.h"
#include "engine/exec/record/trace.h"
#include "engine/layers/blocks.h"
#include "engine/model/desc/rope_tables.h"
#include "moe/aux_loss.h"

struct exec_micro {
    eng_shape_t sh;
    uint64_t serial;       /* the batch's (eng_batch_t.serial): seeds LoRA's dropout masks */
    int32_t *ids, *targets;
    int32_t *kv_len;       /* (B) attention's key lengths (sh.kv_len), NULL without padding */
    int32_t *seg, *pos;    /* (B, T) packed rows' segment starts and positions (sh), else NULL */
    float *tok_w;          /* (n) attention mask as weights */
    float **xin;           /* (L + 1) block inputs */
    float **xmid;          /* (L) */
    eng_attn_acts_t *aa;   /* (L) */
    eng_mlp_acts_t *ma;    /* (L) */
    float *xf, *rstdf, *logits, *aux_dp, *dx;
    /* the head in chunks (eng_head_chunk_rows): no logits kept between the
     * loss and the backward, which forms them again with the loss's scale */
    bool head_chunked;
    float grad_scale;
    /* aux loss statistics over all MoE layers */
    moe_aux_t aux;
    bool use_aux;
    bool eval; /* forward only: nothing saved for a backward (see the note at the top) */
};
typedef struct exec_micro step_t;

static void dfree(kern_device_t *dev, void *p) {
    if (p) kern_free(dev, p);
}

#define DALLOC(ptr, bytes, tag)                              \
    do {                                                     \
        (ptr) = kern_alloc(x->dev, (bytes), (tag), err);     \
        if (!(ptr)) return err->code;                        \
    } while (0)

/* Samples device and pinned bytes into the trace (if any) at time t. */
static void trace_memory(eng_exec_t *x, double t) {
    if (!x->trace) return;
    const kern_device_stats_t st = kern_device_stats(x->dev);
    eng_trace_counter(x->trace, "device bytes", t, (double)st.device_in_use);
    eng_trace_counter(x->trace, "pinned bytes", t, (double)st.pinned_in_use);
}

mt_status_t exec_micro_prepare(eng_exec_t *x, int tokens, mt_error_t *err) {
    if (exec_stage_fits(&x->stage, tokens)) return MT_OK;
    /* between micro-batches nothing is held: re-size for this shape */
    eng_exec_drain(x);
    exec_stage_destroy(&x->stage);
    return exec_stage_create(&x->stage, tokens, err);
}

void exec_micro_block_ready(eng_exec_t *x, int b) {
    if (x->prog.block_ready) x->prog.block_ready(x, b);
}

static mt_status_t ensure_rope(eng_exec_t *x, int T, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (x->env.rope_T == T) return MT_OK;
    const int rd = eng_rope_dim(&m->cfg), half = rd / 2; /* partial RoPE: the rotated dims only */
    dfree(x->dev, x->env.rope_cos);
    dfree(x->dev, x->env.rope_sin);
    x->env.rope_T = 0;
    x->env.rope_cos = kern_alloc_lasting(x->dev, (size_t)T * half * sizeof(float), "rope cos table", err);
    x->env.rope_sin = x->env.rope_cos ? kern_alloc_lasting(x->dev, (size_t)T * half * sizeof(float), "rope sin table", err) : NULL;
    if (!x->env.rope_cos || !x->env.rope_sin) return err->code;
    float *c = malloc((size_t)T * half * sizeof *c), *s = malloc((size_t)T * half * sizeof *s);
    MT_CHECK(c && s, "out of host memory for rope tables");
    eng_rope_tables(&m->cfg, T, rd, c, s);
    kern_stream_t *st = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    kern_memcpy_h2d(x->dev, st, x->env.rope_cos, c, (size_t)T * half * sizeof(float));
    kern_memcpy_h2d(x->dev, st, x->env.rope_sin, s, (size_t)T * half * sizeof(float));
    kern_stream_sync(x->dev, st);
    free(c);
    free(s);
    x->env.rope_T = T;
    return MT_OK;
}

/* The aux loss (moe/aux_loss.h) and its gradient factors on the device. */
static mt_status_t aux_finish(eng_exec_t *x, step_t *st, float loss_scale, double *aux_out,
                              mt_error_t *err) {
    eng_model_t *m = x->model;
    const int E = m->cfg.num_experts;
    float *coef = malloc((size_t)E * sizeof *coef);
    MT_CHECK_ALLOC(coef, "aux loss gradient");
    *aux_out = moe_aux_finish(&st->aux, m->cfg.router_aux_loss_coef, loss_scale, coef);
    st->aux_dp = kern_alloc(x->dev, (size_t)E * sizeof(float), "aux loss gradient", err);
    if (st->aux_dp) {
        kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(x->dev, s, st->aux_dp, coef, (size_t)E * sizeof(float));
        kern_stream_sync(x->dev, s);
    }
    free(coef);
    return st->aux_dp ? MT_OK : err->code;
}

/* The MoE forward's call once routing is known (ctx: the executor's residency). */
static mt_status_t fetch_experts_hook(void *ctx, int layer, const int32_t *counts, mt_error_t *err) {
    return exec_fetch_experts(ctx, layer, counts, err);
}

/* Forward of decoder layer l (block l + 1). */
static mt_status_t layer_forward(eng_exec_t *x, step_t *st, int l, bool recompute, mt_error_t *err) {
    eng_model_t *m = x->model;
    const size_t act = (size_t)st->sh.n * m->cfg.hidden_size * sizeof(float);
    const bool streamed = x->plan.blocks[l + 1].weights == SCHED_WEIGHTS_STREAM;
    float *xout = NULL;
    const eng_act_desc_t *mid = eng_model_desc_act(&m->spec, l, ENG_A_X_MID); /* a saved activation */
    MT_CHECK(mid, "layer %d: the model description lists no x_mid", l);
    DALLOC(st->xmid[l], eng_act_numel(mid, st->sh.n) * mt_dtype_size(eng_act_dtype(mid->cls, eng_act_storage_dtype(m))),
           "residual after attention");
    mt_status_t s = eng_attn_forward(&x->env, l, &st->sh, st->xin[l], st->xmid[l], &st->aa[l], err);
    if (s != MT_OK) return s;
    if (recompute) { /* the layer's output is already stored as the next block's input */
        DALLOC(xout, act, "recomputed layer output");
    } else {
        DALLOC(st->xin[l + 1], act, "residual after mlp");
        xout = st->xin[l + 1];
    }
    s = eng_mlp_forward(&x->env, l, &st->sh, st->xmid[l], xout, streamed ? fetch_experts_hook : NULL, &x->res,
                        &st->ma[l], err);
    if (recompute) dfree(x->dev, xout);
    return s;
}

/* lm_head's working copy as a product operand (the embedding table's, in
 * its dtype, when tied). */
static eng_operand_t head_weight(const eng_exec_t *x) {
    const eng_model_t *m = x->model;
    const eng_param_t *p = &m->params[m->lm_head];
    const eng_dparam_t *d = &x->dp[m->lm_head];
    return (eng_operand_t){d->w, p->w_dtype};
}

/* Where each activation the description may list lives: x_mid in the
 * step, the rest in the layer's acts (engine/layers/acts.h says which
 * field holds which).  Which of them a layer saves, and their sizes, come
 * from the model description (engine/model/desc/model_desc.h). */
static void **act_slot(step_t *st, int l, eng_act_id_t id) {
    if (id == ENG_A_X_MID) return (void **)&st->xmid[l];
    return eng_layer_act_slot(&st->aa[l], &st->ma[l], id);
}

/* Every device pointer of layer l's saved activations, for offloading: the
 * description's list.  Each is checked against the description (allocated,
 * of the described size, and nothing saved that it does not list), so the
 * forward, the staging pool's sizing (exec_layer_act_bytes, copies.h) and the
 * scheduler, which all read the description, cannot drift apart. */
static mt_status_t layer_act_slots(eng_exec_t *x, step_t *st, int l, void ***slots, int *count, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_layer_acts_t *la = &m->spec.layer_acts[l];
    const mt_dtype_t cdt = eng_act_storage_dtype(m);
    for (int id = 0; id < ENG_ACT_COUNT; id++) {
        void **slot = act_slot(st, l, (eng_act_id_t)id);
        if (la->index[id] < 0) {
            if (*slot)
                return mt_error_set(err, MT_ERR_INTERNAL,
                                    "layer %d saved activation id %d, which %s's model description does not list", l,
                                    id, eng_model_desc_family_name(&m->spec));
            continue;
        }
        const eng_act_desc_t *a = &la->act[la->index[id]];
        const size_t raw = eng_act_numel(a, st->sh.n) * mt_dtype_size(eng_act_dtype(a->cls, cdt));
        const size_t want = (raw + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN;
        if (!*slot || kern_alloc_size(x->dev, *slot) != want)
            return mt_error_set(err, MT_ERR_INTERNAL,
                                "layer %d activation %s: the forward saved %zu bytes, the model description says %zu", l,
                                a->name, *slot ? kern_alloc_size(x->dev, *slot) : 0, want);
        slots[(*count)++] = slot;
    }
    return MT_OK;
}

void **exec_micro_input_slot(step_t *st, int b) { return (void **)&st->xin[b - 1]; }

static void layer_acts_drop(eng_exec_t *x, step_t *st, int l) {
    eng_attn_acts_release(x->dev, &st->aa[l]);
    eng_mlp_acts_release(x->dev, &st->ma[l]);
    dfree(x->dev, st->xmid[l]);
    st->xmid[l] = NULL;
}

/* Issues the fetches a block needs (weights; backward also activations). */
static mt_status_t fetch_ahead(eng_exec_t *x, int b, bool backward, mt_error_t *err) {
    if (b < 0 || b >= x->nb) return MT_OK;
    mt_status_t s = exec_fetch_block(&x->res, b, backward, err);
    if (s == MT_OK && backward && exec_acts_offloaded(&x->env, b)) s = exec_fetch_acts(&x->acts, b, err);
    return s;
}

void exec_micro_destroy(eng_exec_t *x, step_t *st) {
    eng_model_t *m = x->model;
    if (!st) return;
    const int L = m->cfg.num_hidden_layers;
    kern_device_sync(x->dev);
    for (int l = 0; l < L; l++) layer_acts_drop(x, st, l);
    for (int l = 0; l <= L; l++) dfree(x->dev, st->xin[l]);
    void *bufs[] = {st->ids,   st->targets, st->kv_len, st->seg,    st->pos, st->tok_w,
                    st->xf,    st->rstdf,   st->logits, st->aux_dp, st->dx};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) dfree(x->dev, bufs[i]);
    free(st->xin);
    free(st->xmid);
    free(st->aa);
    free(st->ma);
    moe_aux_free(&st->aux);
    free(st);
}

/* What a step leaves held once its micro-batches are gone: offloads never
 * fetched back (forward only, errors), blocks' weights, pending frees. */
static void step_release(eng_exec_t *x) {
    kern_device_sync(x->dev);
    exec_drop_offloads(&x->acts);
    for (int b = 0; b < x->nb; b++) exec_release_block(&x->res, b);
    exec_process_pending(&x->pend, true);
}

mt_status_t exec_micro_create(eng_exec_t *x, const eng_batch_t *batch, step_t **out, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_model_config_t *c = &m->cfg;
    const int L = c->num_hidden_layers;
    step_t *st = calloc(1, sizeof *st);
    MT_CHECK_ALLOC(st, "the step");
    st->sh = (eng_shape_t){.B = batch->B, .T = batch->T, .n = batch->B * batch->T};
    st->serial = batch->serial;
    const int n = st->sh.n;
    st->xin = calloc((size_t)L + 1, sizeof *st->xin);
    st->xmid = calloc((size_t)L, sizeof *st->xmid);
    st->aa = calloc((size_t)L, sizeof *st->aa);
    st->ma = calloc((size_t)L, sizeof *st->ma);
    moe_aux_init(&st->aux, c->num_experts, c->num_experts_per_tok);
    MT_CHECK(st->xin && st->xmid && st->aa && st->ma, "out of host memory for the step");
    /* transformers' DeepSeek-V2/V3 and GLM-4.5 models add no load-balancing
     * loss whatever output_router_logits says (their routers are balanced by
     * the score bias, or not at all) */
    const bool family_aux = c->arch != ENG_ARCH_DEEPSEEK_V2 && c->arch != ENG_ARCH_DEEPSEEK_V3 &&
                            c->arch != ENG_ARCH_GLM4_MOE;
    st->use_aux = c->output_router_logits && family_aux && m->num_moe_layers > 0;
    *out = st;

    mt_status_t r = ensure_rope(x, st->sh.T, err);
    float *host_tw = malloc((size_t)n * sizeof *host_tw);
    MT_CHECK_ALLOC(host_tw, "attention mask weights");
    if (r == MT_OK) {
        st->ids = kern_alloc(x->dev, (size_t)n * sizeof(int32_t), "input ids", err);
        st->targets = st->ids ? kern_alloc(x->dev, (size_t)n * sizeof(int32_t), "targets", err) : NULL;
        st->tok_w = st->targets ? kern_alloc(x->dev, (size_t)n * sizeof(float), "attention mask weights", err) : NULL;
        if (!st->tok_w) r = err->code;
    }
    if (r == MT_OK && batch->padded) { /* padded keys are masked in attention; else NULL */
        st->kv_len = kern_alloc(x->dev, (size_t)batch->B * sizeof(int32_t), "attention key lengths", err);
        if (!st->kv_len) r = err->code;
        st->sh.kv_len = st->kv_len;
    }
    if (r == MT_OK && batch->seg_start) { /* packed rows: attention per example, RoPE from each start */
        st->seg = kern_alloc(x->dev, (size_t)n * sizeof(int32_t), "packed segment starts", err);
        st->pos = st->seg ? kern_alloc(x->dev, (size_t)n * sizeof(int32_t), "packed positions", err) : NULL;
        if (!st->pos) r = err->code;
        st->sh.seg_start = st->seg;
        st->sh.pos = st->pos;
    }
    if (r == MT_OK) {
        kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
        for (int t = 0; t < n; t++) host_tw[t] = batch->mask[t] ? 1.0f : 0.0f;
        kern_memcpy_h2d(x->dev, s, st->ids, batch->inputs, (size_t)n * sizeof(int32_t));
        kern_memcpy_h2d(x->dev, s, st->targets, batch->targets, (size_t)n * sizeof(int32_t));
        kern_memcpy_h2d(x->dev, s, st->tok_w, host_tw, (size_t)n * sizeof(float));
        if (st->kv_len) kern_memcpy_h2d(x->dev, s, st->kv_len, batch->kv_len, (size_t)batch->B * sizeof(int32_t));
        if (st->seg) kern_memcpy_h2d(x->dev, s, st->seg, batch->seg_start, (size_t)n * sizeof(int32_t));
        if (st->pos) kern_memcpy_h2d(x->dev, s, st->pos, batch->pos, (size_t)n * sizeof(int32_t));
        kern_stream_sync(x->dev, s);
    }
    free(host_tw);
    return r;
}

/* Offloaded saved activations go to the executor's offload table for b
 * (exec_offload_acts). */
mt_status_t exec_micro_forward_block(eng_exec_t *x, step_t *st, int b, const eng_batch_t *batch,
                                     float *logits_out, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_model_config_t *c = &m->cfg;
    const kern_ops_t *ops = x->dev->ops;
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const int L = c->num_hidden_layers, H = c->hidden_size, V = c->vocab_size, n = st->sh.n;
    const size_t act = (size_t)n * H * sizeof(float);
    mt_status_t r;
    m->lora.batch_serial = st->serial; /* this micro-batch's dropout masks, in either step order */
    const double t0 = mt_now_s();
    if (st->eval && b >= 1 && b <= L) {
        const int l = b - 1;
        if ((r = layer_forward(x, st, l, false, err)) != MT_OK) return r;
        layer_acts_drop(x, st, l);
        dfree(x->dev, st->xin[l]); /* the residual stream moves on; no backward reads it */
        st->xin[l] = NULL;
        return MT_OK;
    }
    if (b == 0) {
        DALLOC(st->xin[0], act, "embeddings");
        ops->embedding_fwd(s, st->xin[0], x->dp[m->embed].w, st->ids, n, H);
    } else if (b <= L) {
        const int l = b - 1;
        if ((r = layer_forward(x, st, l, false, err)) != MT_OK) return r;
        if (st->ma[l].is_moe) {
            moe_predict_observe(&x->predict, l, moe_layer_expert_rows(&st->ma[l].moe));
            if (st->use_aux) moe_aux_accumulate(&st->aux, x->dev, &st->ma[l].moe, st->sh.n, batch->mask);
        }
        const sched_act_place_t ap = x->plan.blocks[b].acts;
        if (exec_acts_offloaded(&x->env, b)) {
            void **slots[ENG_ACT_COUNT];
            int ns = 0;
            if ((r = layer_act_slots(x, st, l, slots, &ns, err)) != MT_OK) return r;
            if ((r = exec_offload_acts(&x->acts, b, slots, ns, err)) != MT_OK) return r;
        } else if (ap == SCHED_ACTS_RECOMPUTE) {
            layer_acts_drop(x, st, l);
        }
    } else {
        DALLOC(st->xf, act, "final norm output");
        DALLOC(st->rstdf, (size_t)n * sizeof(float), "final norm rstd");
        ops->rmsnorm_fwd(s, st->xf, st->rstdf, st->xin[L], x->dp[m->final_norm].w, n, H, c->rms_norm_eps);
        /* in chunks the loss forms them; logits wanted whole (logits_out) are formed whole */
        st->head_chunked = !logits_out && eng_head_chunk_rows(V, n) < n;
        if (!st->head_chunked) {
            DALLOC(st->logits, (size_t)n * V * sizeof(float), "logits");
            eng_mm(&x->env, st->logits, eng_f32(st->xf), head_weight(x), n, V, H, false, true, 1.0f, 0.0f);
            if (logits_out) {
                kern_memcpy_d2h(x->dev, s, logits_out, st->logits, (size_t)n * V * sizeof(float));
                kern_stream_sync(x->dev, s);
            }
        }
    }
    if (st->eval) return MT_OK;
    x->fwd_s[b] += mt_now_s() - t0;
    if (x->trace) {
        char name[32];
        snprintf(name, sizeof name, b == 0 ? "embed fwd" : b <= L ? "layer %d fwd" : "head fwd", b - 1);
        const double t1 = mt_now_s();
        eng_trace_span(x->trace, ENG_TRACK_COMPUTE, name, "forward", t0, t1, 0);
        trace_memory(x, t1);
    }
    return MT_OK;
}

mt_status_t exec_micro_loss(eng_exec_t *x, step_t *st, const eng_batch_t *batch, float loss_scale, bool backward,
                            eng_micro_stats_t *stats, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_model_config_t *c = &m->cfg;
    const kern_ops_t *ops = x->dev->ops;
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const int V = c->vocab_size, n = st->sh.n;
    mt_status_t r;
    if (st->use_aux && (r = aux_finish(x, st, loss_scale, &stats->aux_loss, err)) != MT_OK) return r;
    stats->tokens = n;
    stats->counted = batch->counted;
    const float grad_scale = batch->counted > 0 ? loss_scale / (float)batch->counted : 0.0f;
    float *loss_rows = kern_alloc(x->dev, (size_t)n * sizeof(float), "per-token loss", err);
    if (!loss_rows) return err->code;
    float *host_loss = malloc((size_t)n * sizeof *host_loss);
    MT_CHECK_ALLOC(host_loss, "per-token loss (host)");
    st->grad_scale = grad_scale;
    if (st->head_chunked) {
        /* each chunk's logits, its rows' loss, dropped (the backward forms them again) */
        const int H = c->hidden_size, chunk = (int)eng_head_chunk_rows(V, n);
        float *lc = kern_alloc(x->dev, (size_t)chunk * V * sizeof(float), "logits chunk", err);
        if (!lc) {
            kern_free(x->dev, loss_rows);
            free(host_loss);
            return err->code;
        }
        for (int r0 = 0; r0 < n; r0 += chunk) {
            const int rows = n - r0 < chunk ? n - r0 : chunk;
            eng_mm(&x->env, lc, eng_f32(st->xf + (size_t)r0 * H), head_weight(x), rows, V, H, false, true, 1.0f, 0.0f);
            ops->xent(s, loss_rows + r0, NULL, lc, st->targets + r0, rows, V, grad_scale);
        }
        kern_free(x->dev, lc);
    } else {
        ops->xent(s, loss_rows, backward ? st->logits : NULL, st->logits, st->targets, n, V, grad_scale);
    }
    kern_memcpy_d2h(x->dev, s, host_loss, loss_rows, (size_t)n * sizeof(float));
    kern_stream_sync(x->dev, s);
    kern_free(x->dev, loss_rows);
    /* a weight this pass computed with was read from the NVMe tier beside
     * it; if that failed, this is no loss (residency.h) */
    if (eng_optim_nvme_error(x->hopt.nvme, err) != MT_OK) {
        free(host_loss);
        return err->code;
    }
    double sum = 0;
    for (int t = 0; t < n; t++) sum += host_loss[t];
    free(host_loss);
    stats->ce_sum = sum;
    stats->ce_loss = batch->counted > 0 ? sum / (double)batch->counted : 0.0;
    stats->loss = stats->ce_loss + (st->use_aux ? c->router_aux_loss_coef * stats->aux_loss : 0.0);
    return MT_OK;
}

mt_status_t exec_micro_backward_block(eng_exec_t *x, step_t *st, int b, mt_error_t *err) {
    eng_model_t *m = x->model;
    const eng_model_config_t *c = &m->cfg;
    const kern_ops_t *ops = x->dev->ops;
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const int L = c->num_hidden_layers, H = c->hidden_size, V = c->vocab_size, n = st->sh.n;
    const size_t act = (size_t)n * H * sizeof(float);
    mt_status_t r;
    m->lora.batch_serial = st->serial;
    const double t0 = mt_now_s();
    if (b >= 1 && b <= L && x->plan.blocks[b].acts == SCHED_ACTS_RECOMPUTE &&
        (r = layer_forward(x, st, b - 1, true, err)) != MT_OK)
        return r;
    if ((r = exec_prepare_grads(&x->grads, b, err)) != MT_OK) return r;
    if (b == L + 1) {
        float *dxf;
        DALLOC(dxf, act, "d(final norm output)");
        float *g = x->dp[m->lm_head].g; /* NULL when frozen (a LoRA run) */
        if (st->head_chunked) {
            /* per chunk: its logits again, d(logits) in their place, its
             * rows of d(x) and its share of the head's gradient */
            const int chunk = (int)eng_head_chunk_rows(V, n);
            float *lc, *lrows;
            DALLOC(lc, (size_t)chunk * V * sizeof(float), "logits chunk");
            DALLOC(lrows, (size_t)chunk * sizeof(float), "per-token loss of a chunk (discarded)");
            for (int r0 = 0; r0 < n; r0 += chunk) {
                const int rows = n - r0 < chunk ? n - r0 : chunk;
                const eng_operand_t xc = eng_f32(st->xf + (size_t)r0 * H);
                eng_mm(&x->env, lc, xc, head_weight(x), rows, V, H, false, true, 1.0f, 0.0f);
                ops->xent(s, lrows, lc, lc, st->targets + r0, rows, V, st->grad_scale);
                eng_mm(&x->env, dxf + (size_t)r0 * H, eng_f32(lc), head_weight(x), rows, H, V, false, false, 1.0f, 0.0f);
                if (g) eng_mm(&x->env, g, eng_f32(lc), xc, V, H, rows, true, false, 1.0f, 1.0f);
            }
            dfree(x->dev, lrows);
            dfree(x->dev, lc);
        } else {
            /* st->logits now holds d(logits) (xent wrote it in place) */
            eng_mm(&x->env, dxf, eng_f32(st->logits), head_weight(x), n, H, V, false, false, 1.0f, 0.0f);
            if (g) eng_mm(&x->env, g, eng_f32(st->logits), eng_f32(st->xf), V, H, n, true, false, 1.0f, 1.0f);
            dfree(x->dev, st->logits);
            st->logits = NULL;
        }
        DALLOC(st->dx, act, "d(residual)");
        /* a frozen final norm's kernel still writes a weight gradient: into scratch */
        float *gnorm = x->dp[m->final_norm].g, *gscratch = NULL;
        if (!gnorm) {
            DALLOC(gscratch, (size_t)H * sizeof(float), "gradient of the frozen final norm (discarded)");
            kern_memset(x->dev, s, gscratch, 0, (size_t)H * sizeof(float));
            gnorm = gscratch;
        }
        ops->rmsnorm_bwd(s, st->dx, gnorm, dxf, st->xin[L], x->dp[m->final_norm].w, st->rstdf, n, H);
        if (gscratch) dfree(x->dev, gscratch);
        dfree(x->dev, dxf);
        dfree(x->dev, st->xin[L]);
        st->xin[L] = NULL;
    } else if (b >= 1) {
        const int l = b - 1;
        r = eng_mlp_backward(&x->env, l, &st->sh, st->xmid[l], st->dx, st->ma[l].is_moe ? st->aux_dp : NULL,
                             st->tok_w, &st->ma[l], err);
        if (r != MT_OK) return r;
        r = eng_attn_backward(&x->env, l, &st->sh, st->xin[l], st->dx, &st->aa[l], err);
        if (r != MT_OK) return r;
        dfree(x->dev, st->xmid[l]);
        st->xmid[l] = NULL;
        dfree(x->dev, st->xin[l]);
        st->xin[l] = NULL;
    } else {
        if (x->dp[m->embed].g) ops->embedding_bwd(s, x->dp[m->embed].g, st->dx, st->ids, n, H);
    }
    x->bwd_s[b] += mt_now_s() - t0;
    if (x->trace) {
        char name[32];
        snprintf(name, sizeof name, b == 0 ? "embed bwd" : b <= L ? "layer %d bwd" : "head bwd", b - 1);
        const double t1 = mt_now_s();
        eng_trace_span(x->trace, ENG_TRACK_COMPUTE, name, "backward", t0, t1, 0);
        trace_memory(x, t1);
    }
    return MT_OK;
}

static mt_status_t run_forward(eng_exec_t *x, step_t *st, const eng_batch_t *batch, float loss_scale,
                               float *logits_out, bool backward, eng_micro_stats_t *stats,
                               mt_error_t *err) {
    eng_model_t *m = x->model;
    const int L = m->cfg.num_hidden_layers;
    const int W = x->plan.prefetch_window;
    mt_status_t r;

    for (int b = 0; b < x->nb; b++) {
        for (int w = 0; w <= W; w++)
            if ((r = fetch_ahead(x, b + w, false, err)) != MT_OK) return r;
        exec_wait_block(&x->res, b);
        if ((r = exec_micro_forward_block(x, st, b, batch, logits_out, err)) != MT_OK) return r;
        /* the head's weights serve its backward right away, and so do the
         * last layer's at the turn (exec_turn_held) */
        if (!(backward && (b == L + 1 || exec_turn_held(&x->env, b)))) exec_release_block(&x->res, b);
        exec_process_pending(&x->pend, false);
    }

    if (!st->eval) moe_predict_forward_done(&x->predict);
    return exec_micro_loss(x, st, batch, loss_scale, backward, stats, err);
}

static mt_status_t run_backward(eng_exec_t *x, step_t *st, mt_error_t *err) {
    const int W = x->plan.prefetch_window;
    mt_status_t r;

    x->prog.in_last_micro = x->micro_left == 1;
    for (int b = x->nb - 1; b >= 0; b--) {
        for (int w = 0; w <= W; w++)
            if ((r = fetch_ahead(x, b - w, true, err)) != MT_OK) return r;
        exec_wait_block(&x->res, b);
        /* waiting is not compute: the block's clock starts once its inputs are here */
        if (exec_acts_offloaded(&x->env, b)) exec_wait_acts(&x->acts, b);
        if ((r = exec_micro_backward_block(x, st, b, err)) != MT_OK) return r;
        if ((r = exec_finish_grads(&x->grads, b, err)) != MT_OK) return r;
        exec_micro_block_ready(x, b);
        exec_release_block(&x->res, b);
        exec_process_pending(&x->pend, false);
    }
    return MT_OK;
}

/* backward false: forward only (evaluation), nothing kept for a backward. */
static mt_status_t run(eng_exec_t *x, const eng_batch_t *batch, float loss_scale, float *logits_out,
                       eng_micro_stats_t *stats, bool backward, mt_error_t *err) {
    const int n = batch->B * batch->T;
    memset(stats, 0, sizeof *stats);
    step_t *st = NULL;
    /* the pool's activation share is for offloads, which a forward alone never makes */
    mt_status_t r = backward ? exec_micro_prepare(x, n, err) : MT_OK;
    exec_counters_micro_begin(&x->cnt);
    if (r == MT_OK) r = exec_micro_create(x, batch, &st, err);
    if (r == MT_OK && !backward) {
        st->eval = true;
        st->use_aux = false; /* evaluation reports the cross entropy; the aux loss trains the router */
    }
    if (r == MT_OK) r = run_forward(x, st, batch, loss_scale, logits_out, backward, stats, err);
    if (r == MT_OK && backward) {
        r = run_backward(x, st, err);
        x->timed_micro++;
        if (x->micro_left > 0) x->micro_left--;
    }
    if (r != MT_OK) exec_drop_grads(&x->grads); /* half-made gradient targets of this micro-batch */
    else exec_counters_micro_end(&x->cnt);
    exec_micro_destroy(x, st);
    step_release(x);
    return r;
}

mt_status_t eng_exec_forward_backward(eng_exec_t *x, const eng_batch_t *batch, float loss_scale,
                                       float *logits_out, eng_micro_stats_t *stats, mt_error_t *err) {
    return run(x, batch, loss_scale, logits_out, stats, true, err);
}

mt_status_t eng_exec_forward(eng_exec_t *x, const eng_batch_t *batch, float *logits_out,
                              eng_micro_stats_t *stats, mt_error_t *err) {
    eng_model_t *m = x->model;
    /* evaluation, as PEFT in eval mode: no dropout */
    const float dropout = m->lora.dropout;
    m->lora.dropout = 0;
    const mt_status_t st = run(x, batch, 1.0f, logits_out, stats, false, err);
    m->lora.dropout = dropout;
    return st;
}
