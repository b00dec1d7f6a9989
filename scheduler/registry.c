/* Tensor registry builder (see registry.h).
 *
 * The walk mirrors the engine's step (engine/step.c, engine/blocks.c,
 * moe/moe_layer.c) so that the saved activations and temporaries here are
 * the buffers the engine allocates, in its order: per layer the attention
 * half, then the MLP half; the head (final norm, lm_head, loss) after the
 * last layer.  Where the engine allocates several temporaries at once the
 * block's temporary peak is their sum (a slight over-estimate where some
 * are freed before others are allocated). */
#include "scheduler/registry.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sched_registry_t *r;
    int cap_t, cap_o;
    mt_dtype_t wdt, adt;    /* working copies, activations */
    double wb, ab;          /* their sizes in bytes */
    double n, B, T;         /* tokens per micro-batch, batch, sequence */
    int block, layer;
    int optim_op;           /* the block's AdamW op (its bytes are set at block end) */
    int prev_out_op;        /* op that produced the block input */
    double half_fwd_temp, half_bwd_temp; /* temporaries of the current half */
    double train_dense, train_expert;    /* trainable params: non-expert, one expert */
    double train_wb_dense, train_wb_expert; /* their working-copy bytes */
    bool *target_hit;       /* (num_lora_targets) */
    mt_error_t *err;
} builder_t;

static const char *const k_kind_names[SCHED_T_KIND_COUNT] = {
    "weight", "master", "grad", "adam_m", "adam_v", "activation", "temporary",
};

const char *sched_tensor_kind_name(sched_tensor_kind_t k) {
    return (unsigned)k < SCHED_T_KIND_COUNT ? k_kind_names[k] : "?";
}

double sched_expected_experts_hit(int num_experts, int top_k, double tokens) {
    if (num_experts <= 0 || top_k <= 0 || tokens <= 0) return 0.0;
    if (top_k >= num_experts) return num_experts;
    return num_experts * (1.0 - pow(1.0 - (double)top_k / num_experts, tokens));
}

void sched_block_label(const sched_registry_t *reg, int block, char *buf, size_t cap) {
    if (block == 0) snprintf(buf, cap, "embed");
    else if (block == reg->num_blocks - 1) snprintf(buf, cap, "head");
    else snprintf(buf, cap, "layer %d", block - 1);
}

/* ---- list growth ---------------------------------------------------------- */

static int add_op(builder_t *b, sched_phase_t phase, bool matmul, double flops, double bytes,
                  const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static int add_op(builder_t *b, sched_phase_t phase, bool matmul, double flops, double bytes,
                  const char *fmt, ...) {
    sched_registry_t *r = b->r;
    if (r->num_ops == b->cap_o) {
        b->cap_o = b->cap_o ? 2 * b->cap_o : 1024;
        r->ops = realloc(r->ops, (size_t)b->cap_o * sizeof *r->ops);
        MT_CHECK_ALLOC(r->ops, "registry ops");
    }
    sched_op_t *o = &r->ops[r->num_ops];
    memset(o, 0, sizeof *o);
    o->id = r->num_ops++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->name, sizeof o->name, fmt, ap);
    va_end(ap);
    o->block = b->block;
    o->phase = phase;
    o->matmul = matmul;
    o->flops = flops;
    o->bytes = bytes;
    sched_block_info_t *bi = &r->blocks[b->block];
    if (phase == SCHED_PHASE_FWD) bi->fwd_flops += flops;
    if (phase == SCHED_PHASE_BWD) bi->bwd_flops += flops;
    bi->num_ops++;
    return o->id;
}

static void add_consumer(builder_t *b, int tensor, int op) {
    sched_tensor_t *t = &b->r->tensors[tensor];
    if (op < 0 || t->num_consumers == SCHED_MAX_CONSUMERS) return;
    for (int i = 0; i < t->num_consumers; i++)
        if (t->consumers[i] == op) return;
    t->consumers[t->num_consumers++] = op;
}

static int add_tensor(builder_t *b, sched_tensor_kind_t kind, mt_dtype_t dt, double numel, int expert,
                      int producer, const char *name) {
    sched_registry_t *r = b->r;
    if (r->num_tensors == b->cap_t) {
        b->cap_t = b->cap_t ? 2 * b->cap_t : 4096;
        r->tensors = realloc(r->tensors, (size_t)b->cap_t * sizeof *r->tensors);
        MT_CHECK_ALLOC(r->tensors, "registry tensors");
    }
    sched_tensor_t *t = &r->tensors[r->num_tensors];
    memset(t, 0, sizeof *t);
    t->id = r->num_tensors++;
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->block = b->block;
    t->layer = b->layer;
    t->expert = expert;
    t->dtype = dt;
    t->numel = (int64_t)numel;
    t->bytes = (size_t)t->numel * mt_dtype_size(dt);
    t->producer = producer;
    r->kind_bytes[kind] += (double)t->bytes;
    return t->id;
}

/* ---- parameters, activations, temporaries ---------------------------------- */

/* A parameter: its working copy, and when trainable its master copy (bf16
 * runs), gradient and Adam moments. */
static int add_param(builder_t *b, const char *name, double numel, int expert, bool trainable, bool adapter,
                     int fwd_op, int bwd_op) {
    sched_registry_t *r = b->r;
    sched_block_info_t *bi = &r->blocks[b->block];
    /* LoRA adapters stay fp32: they are tiny and trained in full precision. */
    const mt_dtype_t wdt = adapter ? MT_F32 : b->wdt;
    int w = add_tensor(b, SCHED_T_WEIGHT, wdt, numel, expert, -1, name);
    r->tensors[w].trainable = trainable;
    add_consumer(b, w, fwd_op);
    add_consumer(b, w, bwd_op);
    const double bytes = numel * (double)mt_dtype_size(wdt);
    bi->w_bytes += bytes;
    if (expert < 0) bi->w_dense_bytes += bytes, bi->w_dense_tensors++;
    else if (expert == 0) bi->w_expert_bytes += bytes, bi->w_expert_tensors++;
    if (!adapter) {
        bi->params += numel;
        r->params += numel;
        /* a token passes through k of the E routed experts */
        r->active_params += expert < 0 ? numel : numel * r->model.top_k / r->model.num_experts;
    }
    if (!trainable) return w;
    char dn[160];
    const bool master = wdt != MT_F32;
    if (master) {
        snprintf(dn, sizeof dn, "%s#master", name);
        int t = add_tensor(b, SCHED_T_MASTER, MT_F32, numel, expert, b->optim_op, dn);
        add_consumer(b, t, b->optim_op);
    }
    snprintf(dn, sizeof dn, "%s#grad", name);
    int g = add_tensor(b, SCHED_T_GRAD, MT_F32, numel, expert, bwd_op, dn);
    add_consumer(b, g, b->optim_op);
    snprintf(dn, sizeof dn, "%s#adam_m", name);
    int m = add_tensor(b, SCHED_T_ADAM_M, MT_F32, numel, expert, b->optim_op, dn);
    add_consumer(b, m, b->optim_op);
    snprintf(dn, sizeof dn, "%s#adam_v", name);
    int v = add_tensor(b, SCHED_T_ADAM_V, MT_F32, numel, expert, b->optim_op, dn);
    add_consumer(b, v, b->optim_op);
    bi->train_params += numel;
    bi->grad_bytes += 4.0 * numel;
    bi->optim_bytes += (master ? 12.0 : 8.0) * numel;
    /* AdamW: read p, g, m, v (fp32) and write p, m, v; plus the bf16 working copy written back. */
    bi->adam_bytes_per_param = master ? 30.0 : 28.0;
    if (!master) bi->train_fp32_params += numel;
    if (expert < 0) b->train_dense += numel, b->train_wb_dense += bytes, bi->train_dense_tensors++;
    else if (expert == 0) b->train_expert += numel, b->train_wb_expert += bytes, bi->train_expert_tensors++;
    r->train_params += numel;
    return w;
}

static int add_act(builder_t *b, const char *name, mt_dtype_t dt, double numel, int producer, int consumer) {
    char full[160];
    if (b->layer >= 0) snprintf(full, sizeof full, "layers.%d.%s", b->layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int t = add_tensor(b, SCHED_T_ACT, dt, numel, -1, producer, full);
    add_consumer(b, t, consumer);
    b->r->blocks[b->block].act_saved_bytes += numel * (double)mt_dtype_size(dt);
    b->r->blocks[b->block].act_tensors++;
    return t;
}

static void add_temp(builder_t *b, sched_phase_t phase, const char *name, mt_dtype_t dt, double numel, int op) {
    char full[160];
    if (b->layer >= 0) snprintf(full, sizeof full, "layers.%d.%s", b->layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int t = add_tensor(b, SCHED_T_TEMP, dt, numel, -1, op, full);
    add_consumer(b, t, op);
    const double bytes = numel * (double)mt_dtype_size(dt);
    if (phase == SCHED_PHASE_FWD) b->half_fwd_temp += bytes;
    else b->half_bwd_temp += bytes;
}

/* Ends a half (attention, MLP): the block's temporary peak is the larger half's. */
static void end_half(builder_t *b) {
    sched_block_info_t *bi = &b->r->blocks[b->block];
    if (b->half_fwd_temp > bi->fwd_temp_bytes) bi->fwd_temp_bytes = b->half_fwd_temp;
    if (b->half_bwd_temp > bi->bwd_temp_bytes) bi->bwd_temp_bytes = b->half_bwd_temp;
    b->half_fwd_temp = b->half_bwd_temp = 0;
}

/* ---- LoRA targets ----------------------------------------------------------- */

static bool lora_targeted(builder_t *b, const char *module) {
    const sched_run_shape_t *s = &b->r->shape;
    if (!s->lora) return false;
    const char *leaf = strrchr(module, '.');
    leaf = leaf ? leaf + 1 : module;
    bool hit = false;
    for (int i = 0; i < s->num_lora_targets; i++) {
        const char *t = s->lora_targets[i];
        size_t tl = strlen(t), ml = strlen(module);
        bool m = strcmp(t, leaf) == 0 || strcmp(t, module) == 0 ||
                 (ml > tl && module[ml - tl - 1] == '.' && strcmp(module + ml - tl, t) == 0) ||
                 (strcmp(t, "all-linear") == 0 && strcmp(module, "lm_head") != 0);
        if (m) b->target_hit[i] = hit = true;
    }
    return hit;
}

/* ---- linear layers ---------------------------------------------------------- */

/* y = x W^T (+ bias) over `rows` rows, W (out, in).  `experts` > 0: a grouped
 * product over that many routed experts (module_fmt holds one %d for the
 * expert index; rows are the permuted rows of all experts, and weights are
 * read for the expected number of experts hit).  Returns the forward op;
 * *bwd_out gets the backward op. */
static int linear(builder_t *b, const char *label, double rows, double out, double in, bool bias, int experts,
                  int *bwd_out, const char *module_fmt, ...) __attribute__((format(printf, 9, 10)));

static int linear(builder_t *b, const char *label, double rows, double out, double in, bool bias, int experts,
                  int *bwd_out, const char *module_fmt, ...) {
    sched_registry_t *r = b->r;
    const sched_run_shape_t *s = &r->shape;
    char fmt[160];
    va_list ap;
    va_start(ap, module_fmt);
    vsnprintf(fmt, sizeof fmt, module_fmt, ap); /* the layer index filled in; "%d" for the expert remains */
    va_end(ap);
    const int count = experts > 0 ? experts : 1;
    const double hit = experts > 0 ? r->blocks[b->block].experts_hit : 1.0;
    char module[160];
    if (experts > 0) snprintf(module, sizeof module, fmt, 0);
    else snprintf(module, sizeof module, "%s", fmt);
    const bool lora = lora_targeted(b, module);
    const bool train_w = !s->lora;
    const double mm = 2.0 * rows * out * in;
    const double wread = hit * out * in * b->wb;
    const double io = rows * (in + out) * b->ab;
    const char *lname = b->layer >= 0 ? "L" : "";
    char pre[24];
    if (b->layer >= 0) snprintf(pre, sizeof pre, "%s%d.", lname, b->layer);
    else pre[0] = '\0';
    int fwd = add_op(b, SCHED_PHASE_FWD, true, mm, wread + io, "%s%s.fwd", pre, label);
    /* backward: dX always (the gradient flows down), dW only for trained weights */
    double bflops = mm + (train_w ? mm : 0), bbytes = wread + io + (train_w ? io + hit * out * in * 8.0 : 0);
    int bwd = add_op(b, SCHED_PHASE_BWD, true, bflops, bbytes, "%s%s.bwd", pre, label);
    if (bwd_out) *bwd_out = bwd;
    for (int e = 0; e < count; e++) {
        char m[160], name[256];
        if (experts > 0) snprintf(m, sizeof m, fmt, e);
        else snprintf(m, sizeof m, "%s", fmt);
        snprintf(name, sizeof name, "%s.weight", m);
        add_param(b, name, out * in, experts > 0 ? e : -1, train_w, false, fwd, bwd);
        if (bias) {
            snprintf(name, sizeof name, "%s.bias", m);
            add_param(b, name, out, experts > 0 ? e : -1, train_w, false, fwd, bwd);
        }
        if (lora) {
            const double rk = s->lora_r;
            snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", m);
            add_param(b, name, rk * in, experts > 0 ? e : -1, true, true, fwd, bwd);
            snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", m);
            add_param(b, name, out * rk, experts > 0 ? e : -1, true, true, fwd, bwd);
        }
    }
    if (lora) {
        const double rk = s->lora_r;
        /* A x is saved for B's gradient: (rows, r) */
        r->ops[fwd].flops += 2.0 * rows * rk * (in + out);
        r->ops[bwd].flops += 4.0 * rows * rk * (in + out);
        r->blocks[b->block].fwd_flops += 2.0 * rows * rk * (in + out);
        r->blocks[b->block].bwd_flops += 4.0 * rows * rk * (in + out);
        char an[96];
        snprintf(an, sizeof an, "%s.lora_ax", label);
        add_act(b, an, b->adt, rows * rk, fwd, bwd);
    }
    return fwd;
}

/* An elementwise-class op (norm, rope, softmax, permutation): memory bound. */
static int elementwise(builder_t *b, sched_phase_t phase, const char *label, double elems, double bytes) {
    char pre[24];
    if (b->layer >= 0) snprintf(pre, sizeof pre, "L%d.", b->layer);
    else pre[0] = '\0';
    return add_op(b, phase, false, 5.0 * elems, bytes, "%s%s.%s", pre, label, phase == SCHED_PHASE_FWD ? "fwd" : "bwd");
}

/* ---- blocks ----------------------------------------------------------------- */

static void begin_block(builder_t *b, int block, int layer) {
    b->block = block;
    b->layer = layer;
    sched_block_info_t *bi = &b->r->blocks[block];
    bi->layer = layer;
    bi->first_op = b->r->num_ops;
    b->train_dense = b->train_expert = 0;
    b->train_wb_dense = b->train_wb_expert = 0;
    b->half_fwd_temp = b->half_bwd_temp = 0;
    char pre[24];
    if (layer >= 0) snprintf(pre, sizeof pre, "L%d.", layer);
    else snprintf(pre, sizeof pre, "%s", block == 0 ? "embed." : "head.");
    b->optim_op = add_op(b, SCHED_PHASE_OPTIM, false, 0, 0, "%sadamw", pre);
}

static void end_block(builder_t *b) {
    sched_registry_t *r = b->r;
    sched_block_info_t *bi = &r->blocks[b->block];
    end_half(b);
    bi->train_params_mb = b->train_dense + b->train_expert * bi->experts_hit;
    bi->train_params_step = b->train_dense + b->train_expert * bi->experts_hit_step;
    bi->train_w_bytes_step = b->train_wb_dense + b->train_wb_expert * bi->experts_hit_step;
    if (bi->adam_bytes_per_param == 0) bi->adam_bytes_per_param = b->wdt == MT_F32 ? 28.0 : 30.0;
    sched_op_t *o = &r->ops[b->optim_op];
    o->bytes = bi->adam_bytes_per_param * bi->train_params_step;
    o->flops = 12.0 * bi->train_params_step;
    bi->w_fetch_bytes = bi->w_dense_bytes + bi->w_expert_bytes * bi->experts_hit;
    /* the gradient stream d(residual) (n, H) lives through every backward */
    bi->bwd_temp_bytes += b->n * r->model.hidden * b->ab;
}

/* causal attention pairs per sequence: sum over queries of keys attended */
static double attn_pairs(double T, int window) {
    if (window <= 0 || window >= T) return T * (T + 1) / 2;
    const double W = window;
    return W * (W + 1) / 2 + (T - W) * W;
}

static void attention_half(builder_t *b, const char *pre) {
    const sched_model_desc_t *md = &b->r->model;
    const double n = b->n, H = md->hidden, hd = md->head_dim;
    const double qd = (double)md->heads * hd, kd = (double)md->kv_heads * hd;
    const mt_dtype_t adt = b->adt;
    int in_act = add_act(b, "input", adt, n * H, b->prev_out_op, -1);
    int f = elementwise(b, SCHED_PHASE_FWD, "attn_norm", n * H, 2 * n * H * b->ab);
    int g = elementwise(b, SCHED_PHASE_BWD, "attn_norm", n * H, 4 * n * H * b->ab);
    add_consumer(b, in_act, g);
    char name[160];
    snprintf(name, sizeof name, "%s.input_layernorm.weight", pre);
    add_param(b, name, H, -1, !b->r->shape.lora, false, f, g);
    int xn = add_act(b, "attn.xn", adt, n * H, f, -1);
    add_act(b, "attn.rstd", MT_F32, n, f, g);
    int bq, bk, bv, bo;
    int fq = linear(b, "q_proj", n, qd, H, md->qkv_bias, 0, &bq, "%s.self_attn.q_proj", pre);
    linear(b, "k_proj", n, kd, H, md->qkv_bias, 0, &bk, "%s.self_attn.k_proj", pre);
    int fv = linear(b, "v_proj", n, kd, H, md->qkv_bias, 0, &bv, "%s.self_attn.v_proj", pre);
    add_consumer(b, xn, bq); /* the weight gradients read the normed input */
    add_consumer(b, xn, bk);
    add_consumer(b, xn, bv);
    if (md->qk_norm != SCHED_QK_NORM_NONE) {
        const bool full = md->qk_norm == SCHED_QK_NORM_FULL;
        int fn = elementwise(b, SCHED_PHASE_FWD, "qk_norm", n * (qd + kd), 2 * n * (qd + kd) * b->ab);
        int gn = elementwise(b, SCHED_PHASE_BWD, "qk_norm", n * (qd + kd), 4 * n * (qd + kd) * b->ab);
        snprintf(name, sizeof name, "%s.self_attn.q_norm.weight", pre);
        add_param(b, name, full ? qd : hd, -1, !b->r->shape.lora, false, fn, gn);
        snprintf(name, sizeof name, "%s.self_attn.k_norm.weight", pre);
        add_param(b, name, full ? kd : hd, -1, !b->r->shape.lora, false, fn, gn);
        add_act(b, "attn.q_pre", adt, n * qd, fq, gn);
        add_act(b, "attn.k_pre", adt, n * kd, fq, gn);
        add_act(b, "attn.q_rstd", MT_F32, full ? n : n * md->heads, fn, gn);
        add_act(b, "attn.k_rstd", MT_F32, full ? n : n * md->kv_heads, fn, gn);
        add_temp(b, SCHED_PHASE_BWD, "attn.d_qk_pre", adt, n * qd, gn);
    }
    int fr = elementwise(b, SCHED_PHASE_FWD, "rope", n * (qd + kd), 2 * n * (qd + kd) * b->ab);
    elementwise(b, SCHED_PHASE_BWD, "rope", n * (qd + kd), 2 * n * (qd + kd) * b->ab);
    /* attention core: QK^T and PV over the causal (or windowed) pairs; the
     * backward recomputes the scores (flash-style, only logsumexp saved) */
    const double pairs = b->B * attn_pairs(b->T, md->sliding_window) * md->heads;
    const double core_io = n * (2 * qd + 2 * kd) * b->ab;
    int fa = add_op(b, SCHED_PHASE_FWD, true, 4.0 * pairs * hd, core_io, "L%d.attention.fwd", b->layer);
    int ga = add_op(b, SCHED_PHASE_BWD, true, 10.0 * pairs * hd, 2 * core_io, "L%d.attention.bwd", b->layer);
    add_act(b, "attn.q", adt, n * qd, fr, ga);
    add_act(b, "attn.k", adt, n * kd, fr, ga);
    add_act(b, "attn.v", adt, n * kd, fv, ga);
    add_act(b, "attn.out", adt, n * qd, fa, ga);
    add_act(b, "attn.lse", MT_F32, n * md->heads, fa, ga);
    int fo = linear(b, "o_proj", n, H, qd, md->o_bias, 0, &bo, "%s.self_attn.o_proj", pre);
    /* backward temporaries: d(att), dq, dk, dv, d(xn), d(x_in) */
    add_temp(b, SCHED_PHASE_BWD, "attn.d_out", adt, n * qd, bo);
    add_temp(b, SCHED_PHASE_BWD, "attn.dq", adt, n * qd, ga);
    add_temp(b, SCHED_PHASE_BWD, "attn.dk", adt, n * kd, ga);
    add_temp(b, SCHED_PHASE_BWD, "attn.dv", adt, n * kd, ga);
    add_temp(b, SCHED_PHASE_BWD, "attn.d_xn", adt, n * H, g);
    b->prev_out_op = fo;
    end_half(b);
}

static void mlp_half(builder_t *b, const char *pre, bool moe) {
    sched_registry_t *r = b->r;
    const sched_model_desc_t *md = &r->model;
    const double n = b->n, H = md->hidden;
    const mt_dtype_t adt = b->adt;
    /* x_mid, the residual after attention: read again by the MLP norm's backward */
    int mid = add_act(b, "mid", adt, n * H, b->prev_out_op, -1);
    int f = elementwise(b, SCHED_PHASE_FWD, "mlp_norm", n * H, 2 * n * H * b->ab);
    int g = elementwise(b, SCHED_PHASE_BWD, "mlp_norm", n * H, 4 * n * H * b->ab);
    add_consumer(b, mid, g);
    char name[160];
    snprintf(name, sizeof name, "%s.post_attention_layernorm.weight", pre);
    add_param(b, name, H, -1, !r->shape.lora, false, f, g);
    int xn = add_act(b, "mlp.xn", adt, n * H, f, -1);
    add_act(b, "mlp.rstd", MT_F32, n, f, g);
    int last;
    if (moe) {
        const double E = md->num_experts, k = md->top_k, I = md->expert_inter, m = n * k;
        const bool mixtral = md->family == SCHED_FAMILY_MIXTRAL;
        const char *blk = mixtral ? "block_sparse_moe" : "mlp";
        int br;
        int fr = linear(b, "router", n, E, H, false, 0, &br, "%s.%s.gate", pre, blk);
        add_consumer(b, xn, br);
        int fs = elementwise(b, SCHED_PHASE_FWD, "route", n * E, 3 * n * E * 4.0);
        add_act(b, "moe.logits", MT_F32, n * E, fr, br);
        add_act(b, "moe.probs", MT_F32, n * E, fs, br);
        add_act(b, "moe.topw", MT_F32, n * k, fs, br);
        add_act(b, "moe.idx", MT_I32, n * k, fs, br);
        add_act(b, "moe.counts", MT_I32, E, fs, br);
        add_act(b, "moe.offsets", MT_I32, E + 1, fs, br);
        add_act(b, "moe.perm", MT_I32, m, fs, br);
        add_act(b, "moe.inv", MT_I32, m, fs, br);
        int fp = elementwise(b, SCHED_PHASE_FWD, "permute", m * H, 2 * m * H * b->ab);
        int gp = elementwise(b, SCHED_PHASE_BWD, "permute", m * H, 2 * m * H * b->ab);
        add_consumer(b, xn, gp);
        add_act(b, "moe.xp", adt, m * H, fp, gp);
        int bg, bu, bd;
        const char *wg = mixtral ? "%s.%s.experts.%%d.w1" : "%s.%s.experts.%%d.gate_proj";
        const char *wu = mixtral ? "%s.%s.experts.%%d.w3" : "%s.%s.experts.%%d.up_proj";
        const char *wd = mixtral ? "%s.%s.experts.%%d.w2" : "%s.%s.experts.%%d.down_proj";
        char fmt[96];
        snprintf(fmt, sizeof fmt, wg, pre, blk);
        int fg = linear(b, "experts.gate", m, I, H, false, (int)E, &bg, "%s", fmt);
        snprintf(fmt, sizeof fmt, wu, pre, blk);
        int fu = linear(b, "experts.up", m, I, H, false, (int)E, &bu, "%s", fmt);
        int fw = elementwise(b, SCHED_PHASE_FWD, "experts.swiglu", m * I, 3 * m * I * b->ab);
        snprintf(fmt, sizeof fmt, wd, pre, blk);
        int fd = linear(b, "experts.down", m, H, I, false, (int)E, &bd, "%s", fmt);
        add_act(b, "moe.g", adt, m * I, fg, bg);
        add_act(b, "moe.u", adt, m * I, fu, bu);
        add_act(b, "moe.ep", adt, m * H, fd, bd);
        add_temp(b, SCHED_PHASE_FWD, "moe.h", adt, m * I, fw);
        last = elementwise(b, SCHED_PHASE_FWD, "combine", m * H, (m + n) * H * b->ab);
        int gc = elementwise(b, SCHED_PHASE_BWD, "combine", m * H, 2 * (m + n) * H * b->ab);
        add_temp(b, SCHED_PHASE_FWD, "mlp.y", adt, n * H, last);
        add_temp(b, SCHED_PHASE_BWD, "moe.d_topw", MT_F32, n * k, gc);
        add_temp(b, SCHED_PHASE_BWD, "moe.d_ep", adt, m * H, gc);
        add_temp(b, SCHED_PHASE_BWD, "moe.h_recomputed", adt, m * I, bd);
        add_temp(b, SCHED_PHASE_BWD, "moe.dh", adt, m * I, bd);
        add_temp(b, SCHED_PHASE_BWD, "moe.d_logits", MT_F32, n * E, br);
        if (md->shared_inter > 0) {
            const double Is = md->shared_inter;
            int sg, su, sd;
            int fsg = linear(b, "shared.gate", n, Is, H, false, 0, &sg, "%s.mlp.shared_expert.gate_proj", pre);
            add_consumer(b, xn, sg);
            int fsu = linear(b, "shared.up", n, Is, H, false, 0, &su, "%s.mlp.shared_expert.up_proj", pre);
            int fsd = linear(b, "shared.down", n, H, Is, false, 0, &sd, "%s.mlp.shared_expert.down_proj", pre);
            add_act(b, "shared.g", adt, n * Is, fsg, sg);
            add_act(b, "shared.u", adt, n * Is, fsu, su);
            add_act(b, "shared.out", adt, n * H, fsd, sd);
            add_temp(b, SCHED_PHASE_FWD, "shared.h", adt, n * Is, fsd);
            add_temp(b, SCHED_PHASE_BWD, "shared.d_out", adt, n * H, sd);
            add_temp(b, SCHED_PHASE_BWD, "shared.h_recomputed", adt, n * Is, sd);
            add_temp(b, SCHED_PHASE_BWD, "shared.dh", adt, n * Is, sd);
            if (md->shared_expert_gate) {
                int sgb;
                int fsgl = linear(b, "shared_gate", n, 1, H, false, 0, &sgb, "%s.mlp.shared_expert_gate", pre);
                add_act(b, "shared.gate_logit", MT_F32, n, fsgl, sgb);
            }
        }
    } else {
        const double Id = md->dense_inter;
        int bg, bu, bd;
        int fg = linear(b, "mlp.gate_proj", n, Id, H, false, 0, &bg, "%s.mlp.gate_proj", pre);
        add_consumer(b, xn, bg);
        int fu = linear(b, "mlp.up_proj", n, Id, H, false, 0, &bu, "%s.mlp.up_proj", pre);
        int fw = elementwise(b, SCHED_PHASE_FWD, "mlp.swiglu", n * Id, 3 * n * Id * b->ab);
        last = linear(b, "mlp.down_proj", n, H, Id, false, 0, &bd, "%s.mlp.down_proj", pre);
        add_act(b, "mlp.g", adt, n * Id, fg, bg);
        add_act(b, "mlp.u", adt, n * Id, fu, bu);
        add_temp(b, SCHED_PHASE_FWD, "mlp.h", adt, n * Id, fw);
        add_temp(b, SCHED_PHASE_FWD, "mlp.y", adt, n * H, last);
        add_temp(b, SCHED_PHASE_BWD, "mlp.h_recomputed", adt, n * Id, bd);
        add_temp(b, SCHED_PHASE_BWD, "mlp.dh", adt, n * Id, bd);
    }
    int res = elementwise(b, SCHED_PHASE_FWD, "residual", n * H, 3 * n * H * b->ab);
    add_temp(b, SCHED_PHASE_FWD, "output", adt, n * H, res);
    add_temp(b, SCHED_PHASE_BWD, "mlp.d_xn", adt, n * H, g);
    add_temp(b, SCHED_PHASE_BWD, "mlp.d_mid", adt, n * H, g);
    (void)last;
    b->prev_out_op = res;
    end_half(b);
}

static void embedding_block(builder_t *b) {
    sched_registry_t *r = b->r;
    const double n = b->n, H = r->model.hidden, V = r->model.vocab;
    begin_block(b, 0, -1);
    int f = add_op(b, SCHED_PHASE_FWD, false, n * H, n * H * (b->wb + b->ab) + 4 * n, "embed.fwd");
    int g = add_op(b, SCHED_PHASE_BWD, false, n * H, n * H * (b->ab + 8.0), "embed.bwd");
    add_param(b, "model.embed_tokens.weight", V * H, -1, !r->shape.lora, false, f, g);
    add_act(b, "input_ids", MT_I32, n, -1, g);
    add_temp(b, SCHED_PHASE_FWD, "embeddings", b->adt, n * H, f);
    b->prev_out_op = f;
    end_block(b);
    r->blocks[0].act_input_bytes = n * 4.0;
}

static void head_block(builder_t *b) {
    sched_registry_t *r = b->r;
    const sched_model_desc_t *md = &r->model;
    const double n = b->n, H = md->hidden, V = md->vocab;
    begin_block(b, md->num_layers + 1, -1);
    int in = add_act(b, "final.input", b->adt, n * H, b->prev_out_op, -1);
    int f = elementwise(b, SCHED_PHASE_FWD, "final_norm", n * H, 2 * n * H * b->ab);
    int g = elementwise(b, SCHED_PHASE_BWD, "final_norm", n * H, 4 * n * H * b->ab);
    add_consumer(b, in, g);
    add_param(b, "model.norm.weight", H, -1, !r->shape.lora, false, f, g);
    int xn = add_act(b, "final.xn", b->adt, n * H, f, -1);
    add_act(b, "final.rstd", MT_F32, n, f, g);
    int hb;
    int fh;
    if (md->tied_embeddings) {
        /* the embedding table is the head's weight: no tensor of its own */
        const bool train = !r->shape.lora;
        const double mm = 2.0 * n * V * H;
        fh = add_op(b, SCHED_PHASE_FWD, true, mm, V * H * b->wb + n * (H + V) * b->ab, "head.lm_head.fwd");
        hb = add_op(b, SCHED_PHASE_BWD, true, train ? 2 * mm : mm, V * H * (b->wb + (train ? 8.0 : 0)) + 2 * n * (H + V) * b->ab,
                    "head.lm_head.bwd");
        add_consumer(b, 0 /* first tensor: model.embed_tokens.weight */, fh);
        add_consumer(b, 0, hb);
    } else {
        fh = linear(b, "lm_head", n, V, H, false, 0, &hb, "lm_head");
    }
    add_consumer(b, xn, hb);
    /* logits are fp32 (HF upcasts before the loss); the loss's backward
     * writes d(logits) in place */
    add_act(b, "logits", MT_F32, n * V, fh, hb);
    int fl = elementwise(b, SCHED_PHASE_FWD, "loss", n * V, 2 * n * V * 4.0);
    add_temp(b, SCHED_PHASE_FWD, "loss_rows", MT_F32, n, fl);
    add_temp(b, SCHED_PHASE_BWD, "d_final_xn", b->adt, n * H, hb);
    end_block(b);
    r->blocks[md->num_layers + 1].act_input_bytes = n * H * b->ab;
}

static mt_status_t check_desc(const sched_model_desc_t *m, const sched_run_shape_t *s, mt_error_t *err) {
#define NEED(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return mt_error_set(err, MT_ERR_CONFIG, __VA_ARGS__); \
    } while (0)
    NEED(m->num_layers >= 1 && m->num_layers <= SCHED_MAX_LAYERS, "model: num_layers must be 1..%d, got %d",
         SCHED_MAX_LAYERS, m->num_layers);
    NEED(m->hidden > 0 && m->heads > 0 && m->kv_heads > 0 && m->head_dim > 0 && m->vocab > 0,
         "model: hidden (%d), heads (%d), kv_heads (%d), head_dim (%d) and vocab (%d) must be positive", m->hidden,
         m->heads, m->kv_heads, m->head_dim, m->vocab);
    NEED(m->heads % m->kv_heads == 0, "model: heads (%d) must be a multiple of kv_heads (%d)", m->heads, m->kv_heads);
    bool any_moe = false, any_dense = false;
    for (int l = 0; l < m->num_layers; l++) {
        any_moe |= m->layer_is_moe[l];
        any_dense |= !m->layer_is_moe[l];
    }
    NEED(!any_moe || (m->num_experts > 0 && m->top_k >= 1 && m->top_k <= m->num_experts && m->expert_inter > 0),
         "model: MoE layers need num_experts > 0, 1 <= top_k <= num_experts and expert_inter > 0 (got %d, %d, %d)",
         m->num_experts, m->top_k, m->expert_inter);
    NEED(!any_dense || m->dense_inter > 0, "model: dense layers need dense_inter > 0");
    NEED(s->micro_batch_size >= 1 && s->sequence_len >= 1 && s->grad_accum >= 1,
         "run: micro_batch_size (%d), sequence_len (%d) and gradient_accumulation_steps (%d) must be >= 1",
         s->micro_batch_size, s->sequence_len, s->grad_accum);
    NEED(!s->lora || (s->lora_r >= 1 && s->num_lora_targets >= 1), "run: LoRA needs lora_r >= 1 and target modules");
#undef NEED
    return MT_OK;
}

mt_status_t sched_registry_build(const sched_model_desc_t *model, const sched_run_shape_t *shape,
                                 sched_registry_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t st = check_desc(model, shape, err);
    if (st != MT_OK) return st;
    out->model = *model;
    out->shape = *shape;
    const int L = model->num_layers;
    out->num_blocks = L + 2;
    out->blocks = calloc((size_t)out->num_blocks, sizeof *out->blocks);
    MT_CHECK_ALLOC(out->blocks, "registry blocks");
    builder_t b = {.r = out, .err = err};
    b.wdt = shape->bf16 ? MT_BF16 : MT_F32;
    b.adt = b.wdt;
    b.wb = (double)mt_dtype_size(b.wdt);
    b.ab = (double)mt_dtype_size(b.adt);
    b.B = shape->micro_batch_size;
    b.T = shape->sequence_len;
    b.n = b.B * b.T;
    b.prev_out_op = -1;
    b.target_hit = calloc((size_t)(shape->num_lora_targets + 1), sizeof *b.target_hit);
    MT_CHECK_ALLOC(b.target_hit, "LoRA target flags");
    out->tokens_per_step = b.n * shape->grad_accum;

    embedding_block(&b);
    for (int l = 0; l < L; l++) {
        begin_block(&b, l + 1, l);
        sched_block_info_t *bi = &out->blocks[l + 1];
        bi->is_moe = model->layer_is_moe[l];
        if (bi->is_moe) {
            bi->experts_hit = sched_expected_experts_hit(model->num_experts, model->top_k, b.n);
            bi->experts_hit_step = sched_expected_experts_hit(model->num_experts, model->top_k, out->tokens_per_step);
        }
        char pre[48];
        snprintf(pre, sizeof pre, "model.layers.%d", l);
        attention_half(&b, pre);
        mlp_half(&b, pre, bi->is_moe);
        end_block(&b);
        bi->act_input_bytes = b.n * model->hidden * b.ab;
    }
    head_block(&b);

    for (int i = 0; i < shape->num_lora_targets && shape->lora; i++)
        if (!b.target_hit[i]) {
            st = mt_error_set(err, MT_ERR_CONFIG,
                              "lora_target_modules: '%s' matches no module of this model (e.g. q_proj, k_proj, "
                              "v_proj, o_proj, %s, gate = router, all-linear)",
                              shape->lora_targets[i],
                              model->family == SCHED_FAMILY_MIXTRAL ? "w1, w2, w3" : "gate_proj, up_proj, down_proj");
            break;
        }
    free(b.target_hit);
    if (st != MT_OK) {
        sched_registry_free(out);
        return st;
    }
    for (int i = 0; i < out->num_blocks; i++)
        out->model_flops += (out->blocks[i].fwd_flops + out->blocks[i].bwd_flops) * shape->grad_accum;
    return MT_OK;
}

void sched_registry_free(sched_registry_t *reg) {
    if (!reg) return;
    free(reg->blocks);
    free(reg->tensors);
    free(reg->ops);
    memset(reg, 0, sizeof *reg);
}
