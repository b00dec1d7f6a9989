/* Tensor registry builder (see registry.h).
 *
 * The engine's list (sched_program_t) says what a step computes; this file
 * derives what training adds to it and what the cost model needs: per
 * trainable weight its master copy (bf16 working copies only), gradient and
 * Adam moments; per block an AdamW op, the weight, gradient, optimizer and
 * activation footprints and the expected experts hit.  Nothing here knows
 * a model family.  Where the engine lists several temporaries in one group
 * the block's temporary peak is their sum (a slight over-estimate where
 * some are freed before others are allocated). */
#include "scheduler/registry.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    sched_registry_t *r;
    int cap_t, cap_o;
    mt_dtype_t wdt;         /* working copies of the base weights */
    double n;               /* tokens per micro-batch */
    int block, layer;
    int num_experts, top_k; /* the block's routing facts */
    int optim_op;           /* the block's AdamW op (its bytes are set at block end) */
    int temp_group;         /* group of the temporaries being summed */
    double half_fwd_temp, half_bwd_temp; /* temporaries of the current group */
    double train_dense, train_expert;    /* trainable params: non-expert, one expert */
    double train_wb_dense, train_wb_expert; /* their working-copy bytes */
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

/* ---- the engine's list ------------------------------------------------------ */

void sched_program_init(sched_program_t *p, int num_blocks) {
    memset(p, 0, sizeof *p);
    p->num_blocks = num_blocks;
    p->blocks = calloc((size_t)(num_blocks > 0 ? num_blocks : 1), sizeof *p->blocks);
    MT_CHECK_ALLOC(p->blocks, "program blocks");
    for (int i = 0; i < num_blocks; i++) p->blocks[i].layer = -1;
}

void sched_program_free(sched_program_t *p) {
    if (!p) return;
    free(p->blocks);
    free(p->tensors);
    free(p->ops);
    memset(p, 0, sizeof *p);
}

int sched_program_add_op(sched_program_t *p, int block, sched_phase_t phase, bool matmul, double flops,
                         double bytes, const char *fmt, ...) {
    if (p->num_ops == p->cap_ops) {
        p->cap_ops = p->cap_ops ? 2 * p->cap_ops : 1024;
        p->ops = realloc(p->ops, (size_t)p->cap_ops * sizeof *p->ops);
        MT_CHECK_ALLOC(p->ops, "program ops");
    }
    sched_op_t *o = &p->ops[p->num_ops];
    memset(o, 0, sizeof *o);
    o->id = p->num_ops++;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(o->name, sizeof o->name, fmt, ap);
    va_end(ap);
    o->block = block;
    o->phase = phase;
    o->matmul = matmul;
    o->flops = flops;
    o->bytes = bytes;
    return o->id;
}

int sched_program_add_tensor(sched_program_t *p, const sched_prog_tensor_t *t) {
    if (p->num_tensors == p->cap_tensors) {
        p->cap_tensors = p->cap_tensors ? 2 * p->cap_tensors : 4096;
        p->tensors = realloc(p->tensors, (size_t)p->cap_tensors * sizeof *p->tensors);
        MT_CHECK_ALLOC(p->tensors, "program tensors");
    }
    sched_prog_tensor_t *d = &p->tensors[p->num_tensors];
    *d = *t;
    d->num_consumers = 0;
    return p->num_tensors++;
}

void sched_program_add_consumer(sched_program_t *p, int t, int op) {
    sched_prog_tensor_t *x = &p->tensors[t];
    if (op < 0 || x->num_consumers == SCHED_MAX_CONSUMERS) return;
    for (int i = 0; i < x->num_consumers; i++)
        if (x->consumers[i] == op) return;
    x->consumers[x->num_consumers++] = op;
}

/* ---- parameters, activations, temporaries ---------------------------------- */

/* A weight: its working copy, and when trainable its master copy (when the
 * working copy is not fp32), gradient and Adam moments.  `ops` maps the
 * program's op indices to the registry's. */
static void add_weight(builder_t *b, const sched_prog_tensor_t *pt, const int *ops, const sched_program_t *p) {
    sched_registry_t *r = b->r;
    sched_block_info_t *bi = &r->blocks[b->block];
    const double numel = (double)pt->numel;
    const int expert = pt->expert;
    const mt_dtype_t wdt = pt->dtype;
    int w = add_tensor(b, SCHED_T_WEIGHT, wdt, numel, expert, -1, pt->name);
    r->tensors[w].trainable = pt->trainable;
    int bwd_op = -1;
    for (int i = 0; i < pt->num_consumers; i++) {
        add_consumer(b, w, ops[pt->consumers[i]]);
        if (bwd_op < 0 && p->ops[pt->consumers[i]].phase == SCHED_PHASE_BWD) bwd_op = ops[pt->consumers[i]];
    }
    const double bytes = numel * (double)mt_dtype_size(wdt);
    bi->w_bytes += bytes;
    if (expert < 0) bi->w_dense_bytes += bytes, bi->w_dense_tensors++;
    else if (expert == 0) bi->w_expert_bytes += bytes, bi->w_expert_tensors++;
    if (!pt->adapter) {
        bi->params += numel;
        r->params += numel;
        /* a token passes through k of the E routed experts */
        r->active_params += expert < 0 ? numel : numel * b->top_k / b->num_experts;
    }
    if (!pt->trainable) return;
    char dn[160];
    const bool master = wdt != MT_F32;
    if (master) {
        snprintf(dn, sizeof dn, "%s#master", pt->name);
        int t = add_tensor(b, SCHED_T_MASTER, MT_F32, numel, expert, b->optim_op, dn);
        add_consumer(b, t, b->optim_op);
    }
    snprintf(dn, sizeof dn, "%s#grad", pt->name);
    int g = add_tensor(b, SCHED_T_GRAD, MT_F32, numel, expert, bwd_op, dn);
    add_consumer(b, g, b->optim_op);
    snprintf(dn, sizeof dn, "%s#adam_m", pt->name);
    int m = add_tensor(b, SCHED_T_ADAM_M, MT_F32, numel, expert, b->optim_op, dn);
    add_consumer(b, m, b->optim_op);
    snprintf(dn, sizeof dn, "%s#adam_v", pt->name);
    int v = add_tensor(b, SCHED_T_ADAM_V, MT_F32, numel, expert, b->optim_op, dn);
    add_consumer(b, v, b->optim_op);
    bi->train_params += numel;
    bi->grad_bytes += 4.0 * numel;
    bi->optim_bytes += (master ? 12.0 : 8.0) * numel;
    /* AdamW: read p, g, m, v (fp32) and write p, m, v; plus the bf16 working copy written back. */
    bi->adam_bytes_per_param = master ? 30.0 : 28.0;
    if (!master) bi->train_fp32_params += numel;
    else bi->train_work_bytes += bytes;
    if (expert < 0) b->train_dense += numel, b->train_wb_dense += bytes, bi->train_dense_tensors++;
    else if (expert == 0) b->train_expert += numel, b->train_wb_expert += bytes, bi->train_expert_tensors++;
    r->train_params += numel;
}

/* Ends a group of temporaries: the block's temporary peak is the largest group's. */
static void end_group(builder_t *b) {
    sched_block_info_t *bi = &b->r->blocks[b->block];
    if (b->half_fwd_temp > bi->fwd_temp_bytes) bi->fwd_temp_bytes = b->half_fwd_temp;
    if (b->half_bwd_temp > bi->bwd_temp_bytes) bi->bwd_temp_bytes = b->half_bwd_temp;
    b->half_fwd_temp = b->half_bwd_temp = 0;
}

/* A saved activation or a temporary. */
static void add_data(builder_t *b, const sched_prog_tensor_t *pt, const int *ops) {
    sched_block_info_t *bi = &b->r->blocks[b->block];
    const int producer = pt->producer >= 0 ? ops[pt->producer] : -1;
    int t = add_tensor(b, pt->kind, pt->dtype, (double)pt->numel, pt->expert, producer, pt->name);
    for (int i = 0; i < pt->num_consumers; i++) add_consumer(b, t, ops[pt->consumers[i]]);
    const double bytes = (double)pt->numel * (double)mt_dtype_size(pt->dtype);
    if (pt->kind == SCHED_T_ACT) {
        bi->act_saved_bytes += bytes;
        bi->act_tensors++;
        return;
    }
    if (pt->group != b->temp_group) {
        end_group(b);
        b->temp_group = pt->group;
    }
    if (pt->phase == SCHED_PHASE_FWD) b->half_fwd_temp += bytes;
    else b->half_bwd_temp += bytes;
}

/* ---- blocks ----------------------------------------------------------------- */

static void begin_block(builder_t *b, const sched_prog_block_t *pb, int block) {
    b->block = block;
    b->layer = pb->layer;
    b->num_experts = pb->num_experts;
    b->top_k = pb->top_k;
    sched_block_info_t *bi = &b->r->blocks[block];
    bi->layer = pb->layer;
    bi->is_moe = pb->is_moe;
    bi->tokens_mb = b->n;
    if (pb->is_moe) bi->num_experts = pb->num_experts, bi->top_k = pb->top_k;
    if (pb->is_moe) {
        bi->experts_hit = sched_expected_experts_hit(pb->num_experts, pb->top_k, b->n);
        bi->experts_hit_step = sched_expected_experts_hit(pb->num_experts, pb->top_k, b->r->tokens_per_step);
    }
    bi->first_op = b->r->num_ops;
    b->train_dense = b->train_expert = 0;
    b->train_wb_dense = b->train_wb_expert = 0;
    b->half_fwd_temp = b->half_bwd_temp = 0;
    b->temp_group = 0;
    char pre[24];
    if (pb->layer >= 0) snprintf(pre, sizeof pre, "L%d.", pb->layer);
    else snprintf(pre, sizeof pre, "%s", block == 0 ? "embed." : "head.");
    b->optim_op = add_op(b, SCHED_PHASE_OPTIM, false, 0, 0, "%sadamw", pre);
}

static void end_block(builder_t *b, const sched_prog_block_t *pb) {
    sched_registry_t *r = b->r;
    sched_block_info_t *bi = &r->blocks[b->block];
    end_group(b);
    bi->train_params_mb = b->train_dense + b->train_expert * bi->experts_hit;
    bi->train_params_step = b->train_dense + b->train_expert * bi->experts_hit_step;
    bi->train_w_bytes_step = b->train_wb_dense + b->train_wb_expert * bi->experts_hit_step;
    bi->train_expert_params = b->train_expert;
    bi->train_expert_w_bytes = b->train_wb_expert;
    if (bi->adam_bytes_per_param == 0) bi->adam_bytes_per_param = b->wdt == MT_F32 ? 28.0 : 30.0;
    sched_op_t *o = &r->ops[b->optim_op];
    o->bytes = bi->adam_bytes_per_param * bi->train_params_step;
    o->flops = 12.0 * bi->train_params_step;
    bi->w_fetch_bytes = bi->w_dense_bytes + bi->w_expert_bytes * bi->experts_hit;
    bi->bwd_temp_bytes += pb->bwd_stream_bytes;
    bi->act_input_bytes = pb->act_input_bytes;
}

static mt_status_t check_program(const sched_program_t *p, const sched_run_shape_t *s, mt_error_t *err) {
#define NEED(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return mt_error_set(err, MT_ERR_CONFIG, __VA_ARGS__); \
    } while (0)
    NEED(p->num_blocks >= 3 && p->num_blocks <= SCHED_MAX_LAYERS + 2,
         "program: %d blocks (an embedding, 1..%d layers and a head expected)", p->num_blocks, SCHED_MAX_LAYERS);
    NEED(s->micro_batch_size >= 1 && s->sequence_len >= 1 && s->grad_accum >= 1,
         "run: micro_batch_size (%d), sequence_len (%d) and gradient_accumulation_steps (%d) must be >= 1",
         s->micro_batch_size, s->sequence_len, s->grad_accum);
    NEED(!s->lora || (s->lora_r >= 1 && s->num_lora_targets >= 1), "run: LoRA needs lora_r >= 1 and target modules");
    for (int b = 0; b < p->num_blocks; b++) {
        const sched_prog_block_t *pb = &p->blocks[b];
        NEED(!pb->is_moe || (pb->num_experts > 0 && pb->top_k >= 1 && pb->top_k <= pb->num_experts),
             "program: block %d is MoE but has num_experts %d, top_k %d (1 <= top_k <= num_experts expected)", b,
             pb->num_experts, pb->top_k);
    }
    for (int i = 0; i < p->num_ops; i++)
        NEED(p->ops[i].block >= 0 && p->ops[i].block < p->num_blocks && (i == 0 || p->ops[i].block >= p->ops[i - 1].block),
             "program: op %d (%s) of block %d is out of block order", i, p->ops[i].name, p->ops[i].block);
    for (int i = 0; i < p->num_tensors; i++) {
        const sched_prog_tensor_t *t = &p->tensors[i];
        NEED(t->block >= 0 && t->block < p->num_blocks && (i == 0 || t->block >= p->tensors[i - 1].block),
             "program: tensor %d (%s) of block %d is out of block order", i, t->name, t->block);
        NEED(t->kind == SCHED_T_WEIGHT || t->kind == SCHED_T_ACT || t->kind == SCHED_T_TEMP,
             "program: tensor %s has kind %s (the registry derives it)", t->name, sched_tensor_kind_name(t->kind));
        NEED(t->numel >= 0, "program: tensor %s has %lld elements", t->name, (long long)t->numel);
        NEED(t->producer >= -1 && t->producer < p->num_ops, "program: tensor %s: producer op %d of %d", t->name,
             t->producer, p->num_ops);
        NEED(t->kind != SCHED_T_WEIGHT || !t->trainable || t->num_consumers > 0,
             "program: trainable weight %s has no op using it", t->name);
        NEED(t->expert < 0 || p->blocks[t->block].is_moe, "program: expert tensor %s in block %d without routing",
             t->name, t->block);
        for (int c = 0; c < t->num_consumers; c++)
            NEED(t->consumers[c] >= 0 && t->consumers[c] < p->num_ops, "program: tensor %s: consumer op %d of %d",
                 t->name, t->consumers[c], p->num_ops);
    }
#undef NEED
    return MT_OK;
}

mt_status_t sched_registry_build(const sched_program_t *prog, const sched_run_shape_t *shape,
                                 sched_registry_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    mt_status_t st = check_program(prog, shape, err);
    if (st != MT_OK) return st;
    out->shape = *shape;
    out->tied_head = prog->tied_head;
    out->num_blocks = prog->num_blocks;
    out->blocks = calloc((size_t)out->num_blocks, sizeof *out->blocks);
    MT_CHECK_ALLOC(out->blocks, "registry blocks");
    builder_t b = {.r = out};
    b.wdt = shape->bf16 ? MT_BF16 : MT_F32;
    b.n = (double)shape->micro_batch_size * shape->sequence_len;
    out->tokens_per_step = b.n * shape->grad_accum;
    /* program op index -> registry op id: each block's AdamW op comes
     * first, so op i of block b lands at i + b + 1 (ops are in block order) */
    int *ops = malloc((size_t)(prog->num_ops > 0 ? prog->num_ops : 1) * sizeof *ops);
    MT_CHECK_ALLOC(ops, "registry op map");
    for (int i = 0; i < prog->num_ops; i++) ops[i] = i + prog->ops[i].block + 1;
    int oi = 0, ti = 0;
    for (int blk = 0; blk < prog->num_blocks; blk++) {
        const sched_prog_block_t *pb = &prog->blocks[blk];
        begin_block(&b, pb, blk);
        for (; oi < prog->num_ops && prog->ops[oi].block == blk; oi++) {
            const sched_op_t *o = &prog->ops[oi];
            const int id = add_op(&b, o->phase, o->matmul, o->flops, o->bytes, "%s", o->name);
            b.r->ops[id].attention = o->attention;
            b.r->ops[id].attention_tc = o->attention_tc;
        }
        for (; ti < prog->num_tensors && prog->tensors[ti].block == blk; ti++) {
            const sched_prog_tensor_t *t = &prog->tensors[ti];
            if (t->kind == SCHED_T_WEIGHT) add_weight(&b, t, ops, prog);
            else add_data(&b, t, ops);
        }
        end_block(&b, pb);
    }
    free(ops);
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

double sched_registry_model_flops_per_token(const sched_registry_t *reg) {
    const double tokens = (double)reg->shape.micro_batch_size * reg->shape.sequence_len;
    double fwd = 0;
    for (int i = 0; i < reg->num_ops; i++)
        if (reg->ops[i].phase == SCHED_PHASE_FWD && reg->ops[i].matmul) fwd += reg->ops[i].flops;
    return tokens > 0 ? 3.0 * fwd / tokens : 0;
}
