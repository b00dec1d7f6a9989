/* A decoder-shaped generic list for the scheduler's tests (see testutil.h). */
#include "scheduler/testutil.h"

#include <stdio.h>
#include <string.h>

typedef struct {
    sched_program_t *p;
    const sched_run_shape_t *s;
    int block, layer;
    mt_dtype_t wdt;
} fx_t;

static int tensor(fx_t *f, sched_tensor_kind_t kind, const char *name, mt_dtype_t dt, double numel, int expert,
                  int producer, int c0, int c1) {
    sched_prog_tensor_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.kind = kind;
    t.block = f->block;
    t.layer = f->layer;
    t.expert = expert;
    t.dtype = dt;
    t.numel = (int64_t)numel;
    t.producer = producer;
    int i = sched_program_add_tensor(f->p, &t);
    sched_program_add_consumer(f->p, i, c0);
    sched_program_add_consumer(f->p, i, c1);
    return i;
}

static bool targeted(const sched_run_shape_t *s, const char *leaf) {
    for (int i = 0; s->lora && i < s->num_lora_targets; i++)
        if (strcmp(s->lora_targets[i], leaf) == 0 || strcmp(s->lora_targets[i], "all-linear") == 0) return true;
    return false;
}

/* A linear (out, in) over `rows` rows, `experts` > 0 for a grouped one; returns the forward op. */
static int linear(fx_t *f, const char *module_fmt, const char *leaf, double rows, double out, double in,
                  int experts, int *bwd) {
    const bool lora = targeted(f->s, leaf), train = !f->s->lora;
    const double wb = (double)mt_dtype_size(f->wdt), mm = 2.0 * rows * out * in;
    const double rk = lora ? f->s->lora_r : 0;
    char label[64];
    snprintf(label, sizeof label, "L%d.%s", f->layer, leaf);
    int fw = sched_program_add_op(f->p, f->block, SCHED_PHASE_FWD, true, mm + 2 * rows * rk * (in + out),
                                  out * in * wb + rows * (in + out) * wb, "%s.fwd", label);
    int bw = sched_program_add_op(f->p, f->block, SCHED_PHASE_BWD, true, (train ? 2 : 1) * mm + 4 * rows * rk * (in + out),
                                  out * in * wb + 2 * rows * (in + out) * wb, "%s.bwd", label);
    *bwd = bw;
    for (int e = 0; e < (experts > 0 ? experts : 1); e++) {
        char module[96], name[160];
        snprintf(module, sizeof module, module_fmt, f->layer, e);
        snprintf(name, sizeof name, "%s.weight", module);
        int w = tensor(f, SCHED_T_WEIGHT, name, f->wdt, out * in, experts > 0 ? e : -1, -1, fw, bw);
        f->p->tensors[w].trainable = train;
        if (!lora) continue;
        snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", module);
        w = tensor(f, SCHED_T_WEIGHT, name, MT_F32, rk * in, experts > 0 ? e : -1, -1, fw, bw);
        f->p->tensors[w].trainable = f->p->tensors[w].adapter = true;
        snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", module);
        w = tensor(f, SCHED_T_WEIGHT, name, MT_F32, out * rk, experts > 0 ? e : -1, -1, fw, bw);
        f->p->tensors[w].trainable = f->p->tensors[w].adapter = true;
    }
    return fw;
}

static void norm(fx_t *f, const char *name, double H, int fwd, int bwd) {
    int w = tensor(f, SCHED_T_WEIGHT, name, f->wdt, H, -1, -1, fwd, bwd);
    f->p->tensors[w].trainable = !f->s->lora;
}

void sched_test_program(const sched_test_model_t *m, const sched_run_shape_t *s, sched_program_t *out) {
    const int L = m->num_layers;
    sched_program_init(out, L + 2);
    fx_t f = {.p = out, .s = s, .wdt = s->bf16 ? MT_BF16 : MT_F32};
    const mt_dtype_t adt = f.wdt;
    const double ab = (double)mt_dtype_size(adt);
    const double n = (double)s->micro_batch_size * s->sequence_len, H = m->hidden, V = m->vocab;
    const double qd = (double)m->heads * m->head_dim, kd = (double)m->kv_heads * m->head_dim;
    const double E = m->num_experts, k = m->top_k, I = m->expert_inter, rows = n * k;
    char name[128];

    f.layer = -1;
    int ef = sched_program_add_op(out, 0, SCHED_PHASE_FWD, false, n * H, n * H * 2 * ab, "embed.fwd");
    int eb = sched_program_add_op(out, 0, SCHED_PHASE_BWD, false, n * H, n * H * (ab + 8), "embed.bwd");
    norm(&f, "model.embed_tokens.weight", V * H, ef, eb);
    tensor(&f, SCHED_T_ACT, "input_ids", MT_I32, n, -1, -1, eb, -1);
    out->blocks[0].act_input_bytes = 4 * n;
    out->blocks[0].bwd_stream_bytes = n * H * ab;

    for (int l = 0; l < L; l++) {
        f.block = l + 1, f.layer = l;
        sched_prog_block_t *pb = &out->blocks[l + 1];
        pb->layer = l, pb->is_moe = true, pb->num_experts = m->num_experts, pb->top_k = m->top_k;
        pb->act_input_bytes = n * H * ab;
        pb->bwd_stream_bytes = n * H * ab;
        int nf = sched_program_add_op(out, f.block, SCHED_PHASE_FWD, false, 5 * n * H, 2 * n * H * ab, "L%d.norm.fwd", l);
        int nb = sched_program_add_op(out, f.block, SCHED_PHASE_BWD, false, 5 * n * H, 4 * n * H * ab, "L%d.norm.bwd", l);
        snprintf(name, sizeof name, "model.layers.%d.input_layernorm.weight", l);
        norm(&f, name, H, nf, nb);
        snprintf(name, sizeof name, "model.layers.%d.post_attention_layernorm.weight", l);
        norm(&f, name, H, nf, nb);
        int b;
        int fq = linear(&f, "model.layers.%d.self_attn.q_proj", "q_proj", n, qd, H, 0, &b);
        linear(&f, "model.layers.%d.self_attn.k_proj", "k_proj", n, kd, H, 0, &b);
        linear(&f, "model.layers.%d.self_attn.v_proj", "v_proj", n, kd, H, 0, &b);
        const double pairs = s->micro_batch_size * (double)s->sequence_len * (s->sequence_len + 1) / 2 * m->heads;
        int fa = sched_program_add_op(out, f.block, SCHED_PHASE_FWD, true, 4 * pairs * m->head_dim,
                                      n * (2 * qd + 2 * kd) * ab, "L%d.attention.fwd", l);
        int ga = sched_program_add_op(out, f.block, SCHED_PHASE_BWD, true, 10 * pairs * m->head_dim,
                                      2 * n * (2 * qd + 2 * kd) * ab, "L%d.attention.bwd", l);
        /* the engine's rule (engine/model/desc/ops.c): the tensor-core path takes bf16 runs of such shapes */
        out->ops[fa].attention = out->ops[ga].attention = true;
        out->ops[fa].attention_tc = out->ops[ga].attention_tc =
            s->bf16 && !s->packed_segments && m->kv_heads > 0 && m->heads % m->kv_heads == 0 && m->head_dim % 8 == 0 &&
            m->head_dim <= 256;
        int fo = linear(&f, "model.layers.%d.self_attn.o_proj", "o_proj", n, H, qd, 0, &b);
        int fr = linear(&f, "model.layers.%d.block_sparse_moe.gate", "gate", n, E, H, 0, &b);
        int fg = linear(&f, "model.layers.%d.block_sparse_moe.experts.%d.w1", "w1", rows, I, H, m->num_experts, &b);
        linear(&f, "model.layers.%d.block_sparse_moe.experts.%d.w3", "w3", rows, I, H, m->num_experts, &b);
        int fd = linear(&f, "model.layers.%d.block_sparse_moe.experts.%d.w2", "w2", rows, H, I, m->num_experts, &b);
        const struct {
            const char *name;
            mt_dtype_t dt;
            double numel;
            int producer;
        } acts[] = {
            {"input", adt, n * H, -1},       {"attn.xn", adt, n * H, nf},    {"attn.rstd", MT_F32, n, nf},
            {"attn.q", adt, n * qd, fq},     {"attn.k", adt, n * kd, fq},    {"attn.v", adt, n * kd, fq},
            {"attn.out", adt, n * qd, fa},   {"attn.lse", MT_F32, n * m->heads, fa},
            {"mid", adt, n * H, fo},         {"mlp.xn", adt, n * H, nf},     {"moe.logits", MT_F32, n * E, fr},
            {"moe.idx", MT_I32, n * k, fr},  {"moe.xp", adt, rows * H, fr},  {"moe.g", adt, rows * I, fg},
            {"moe.u", adt, rows * I, fg},    {"moe.ep", adt, rows * H, fd},
        };
        for (size_t i = 0; i < sizeof acts / sizeof acts[0]; i++) {
            snprintf(name, sizeof name, "layers.%d.%s", l, acts[i].name);
            tensor(&f, SCHED_T_ACT, name, acts[i].dt, acts[i].numel, -1, acts[i].producer, ga, nb);
        }
        /* temporaries: the attention half's backward, then the MLP half's */
        const struct {
            double numel;
            int group;
        } temps[] = {{n * qd, 0}, {n * qd, 0}, {n * H, 0}, {rows * I, 1}, {rows * I, 1}, {rows * H, 1}};
        for (size_t i = 0; i < sizeof temps / sizeof temps[0]; i++) {
            snprintf(name, sizeof name, "layers.%d.temp%zu", l, i);
            int t = tensor(&f, SCHED_T_TEMP, name, adt, temps[i].numel, -1, ga, ga, -1);
            out->tensors[t].phase = SCHED_PHASE_BWD;
            out->tensors[t].group = temps[i].group;
        }
    }

    f.block = L + 1, f.layer = -1;
    out->blocks[L + 1].act_input_bytes = n * H * ab;
    out->blocks[L + 1].bwd_stream_bytes = n * H * ab;
    int hf = sched_program_add_op(out, L + 1, SCHED_PHASE_FWD, true, 2 * n * V * H, V * H * ab + n * (H + V) * ab,
                                  "head.lm_head.fwd");
    int hb = sched_program_add_op(out, L + 1, SCHED_PHASE_BWD, true, (s->lora ? 2 : 4) * n * V * H,
                                  V * H * ab + 2 * n * (H + V) * ab, "head.lm_head.bwd");
    tensor(&f, SCHED_T_ACT, "final.input", adt, n * H, -1, -1, hb, -1);
    norm(&f, "model.norm.weight", H, hf, hb);
    if (m->tied_embeddings) {
        out->tied_head = true;
        sched_program_add_consumer(out, 0, hf);
        sched_program_add_consumer(out, 0, hb);
    } else {
        norm(&f, "lm_head.weight", V * H, hf, hb);
    }
    tensor(&f, SCHED_T_ACT, "logits", MT_F32, n * V, -1, hf, hb, -1);
}

mt_status_t sched_test_setup(sched_test_setup_t *s, const sched_test_model_t *m, const sched_run_shape_t *sh,
                             const sched_hw_t *hw, mt_error_t *err) {
    memset(s, 0, sizeof *s);
    s->hw = *hw;
    sched_program_t prog;
    sched_test_program(m, sh, &prog);
    mt_status_t st = sched_registry_build(&prog, sh, &s->reg, err);
    sched_program_free(&prog);
    if (st == MT_OK) st = sched_workload_build(&s->reg, &s->hw, &s->w, err);
    if (st != MT_OK) sched_test_teardown(s);
    return st;
}

void sched_test_teardown(sched_test_setup_t *s) {
    sched_workload_free(&s->w);
    sched_registry_free(&s->reg);
}
