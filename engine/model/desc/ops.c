/* The decoder families' step as the scheduler sees it (see
 * family.h): per block the weights (the description's
 * parameters, LoRA adapters where the run targets them), the saved
 * activations (the description's per-layer list, plus the block input),
 * the temporaries, and the ops with their FLOPs and bytes.
 *
 * The walk follows the engine's step (engine/exec/step.c, engine/layers/blocks.c,
 * moe/moe_layer.c): per layer the attention half, then the MLP half; the
 * head (final norm, lm_head, loss) after the last layer.  Temporaries of a
 * half form one group (the scheduler takes the larger half as the block's
 * peak).  Working copies are bf16 when the run shape says bf16, fp32
 * otherwise; LoRA adapters stay fp32; gradients and optimizer state are the
 * scheduler's to add. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/desc/walk.h"
#include "kernels/attention.h"


/* ---- list growth ---------------------------------------------------------- */

int eng_walk_add_op(eng_walk_t *w, sched_phase_t phase, bool matmul, double flops, double bytes, const char *fmt, ...) {
    char name[64];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(name, sizeof name, fmt, ap);
    va_end(ap);
    return sched_program_add_op(w->p, w->block, phase, matmul, flops, bytes, "%s", name);
}

static int add_tensor(eng_walk_t *w, sched_tensor_kind_t kind, const char *name, mt_dtype_t dt, double numel, int expert,
                      int producer) {
    sched_prog_tensor_t t;
    memset(&t, 0, sizeof t);
    snprintf(t.name, sizeof t.name, "%s", name);
    t.kind = kind;
    t.block = w->block;
    t.layer = w->layer;
    t.expert = expert;
    t.dtype = dt;
    t.numel = (int64_t)numel;
    t.producer = producer;
    t.group = w->group;
    return sched_program_add_tensor(w->p, &t);
}

/* A weight's working copy, read by fwd_op and (for its gradient and dX) bwd_op. */
void eng_walk_add_weight_as(eng_walk_t *w, const char *name, mt_dtype_t dt, double numel, int expert, bool trainable,
                          bool adapter, int fwd_op, int bwd_op) {
    int t = add_tensor(w, SCHED_T_WEIGHT, name, dt, numel, expert, -1);
    w->p->tensors[t].trainable = trainable;
    w->p->tensors[t].adapter = adapter;
    sched_program_add_consumer(w->p, t, fwd_op);
    sched_program_add_consumer(w->p, t, bwd_op);
}

/* A parameter's working copy, in the dtype the executor keeps it in
 * (eng_param_working_dtype: bf16 only for the matrices only products read). */
static void add_weight(eng_walk_t *w, const eng_param_spec_t *p, int expert, bool trainable, int fwd_op, int bwd_op) {
    eng_walk_add_weight_as(w, p->name, eng_param_working_dtype(p, w->wdt), (double)p->numel, expert, trainable, false,
                  fwd_op, bwd_op);
}

/* A LoRA adapter matrix: fp32, as they are tiny and trained in full precision. */
static void add_adapter(eng_walk_t *w, const char *name, double numel, int expert, int fwd_op, int bwd_op) {
    eng_walk_add_weight_as(w, name, MT_F32, numel, expert, true, true, fwd_op, bwd_op);
}

/* A parameter of the description by where it sits (it must exist). */
const eng_param_spec_t *eng_walk_param(eng_walk_t *w, eng_param_role_t role, int expert) {
    const int i = eng_model_desc_find_role(w->d, w->layer, role, expert);
    MT_CHECK(i >= 0, "model description of %s: layer %d has no %s", w->f->name, w->layer,
             eng_param_role_name(role));
    return &w->d->params[i];
}

bool eng_walk_has_param(eng_walk_t *w, eng_param_role_t role) {
    return eng_model_desc_find_role(w->d, w->layer, role, -1) >= 0;
}

void eng_walk_add_param(eng_walk_t *w, eng_param_role_t role, int fwd_op, int bwd_op) {
    const eng_param_spec_t *p = eng_walk_param(w, role, -1);
    add_weight(w, p, -1, !w->s->lora, fwd_op, bwd_op);
}

int eng_walk_add_act(eng_walk_t *w, const char *name, mt_dtype_t dt, double numel, int producer, int consumer) {
    char full[160];
    if (w->layer >= 0) snprintf(full, sizeof full, "layers.%d.%s", w->layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int t = add_tensor(w, SCHED_T_ACT, full, dt, numel, -1, producer);
    sched_program_add_consumer(w->p, t, consumer);
    return t;
}

/* A saved activation of the description's layer list (none when the layer does not save it). */
int eng_walk_act(eng_walk_t *w, eng_act_id_t id, int producer, int consumer) {
    const eng_act_desc_t *a = eng_model_desc_act(w->d, w->layer, id);
    if (!a) return -1;
    return eng_walk_add_act(w, a->name, eng_act_dtype(a->cls, w->adt), (double)eng_act_numel(a, (int64_t)w->n), producer,
                   consumer);
}

void eng_walk_add_temp(eng_walk_t *w, sched_phase_t phase, const char *name, mt_dtype_t dt, double numel, int op) {
    char full[160];
    if (w->layer >= 0) snprintf(full, sizeof full, "layers.%d.%s", w->layer, name);
    else snprintf(full, sizeof full, "%s", name);
    int t = add_tensor(w, SCHED_T_TEMP, full, dt, numel, -1, op);
    w->p->tensors[t].phase = phase;
    sched_program_add_consumer(w->p, t, op);
}

/* ---- LoRA targets ----------------------------------------------------------- */

/* The run's selection as engine/model/lora/targets.h states it; all-linear leaves
 * out the gates that decide routing, as the executor's selection does. */
static bool lora_targeted(eng_walk_t *w, const char *module, eng_param_role_t role) {
    const sched_run_shape_t *s = w->s;
    if (!s->lora) return false;
    const char *leaf = strrchr(module, '.');
    leaf = leaf ? leaf + 1 : module;
    bool hit = false;
    for (int i = 0; i < s->num_lora_targets; i++) {
        const char *t = s->lora_targets[i];
        size_t tl = strlen(t), ml = strlen(module);
        bool m = strcmp(t, leaf) == 0 || strcmp(t, module) == 0 ||
                 (ml > tl && module[ml - tl - 1] == '.' && strcmp(module + ml - tl, t) == 0) ||
                 (strcmp(t, "all-linear") == 0 && strcmp(module, "lm_head") != 0 && role != ENG_P_ROUTER &&
                  role != ENG_P_SHARED_EXPERT_GATE);
        if (m) w->target_hit[i] = hit = true;
    }
    return hit;
}

/* The module a weight belongs to: its HF name without ".weight". */
static void module_of(const eng_param_spec_t *p, char *buf, size_t cap) {
    snprintf(buf, cap, "%s", p->name);
    char *dot = strrchr(buf, '.');
    if (dot && strcmp(dot, ".weight") == 0) *dot = '\0';
}

/* ---- linear layers ---------------------------------------------------------- */

/* y = x W^T (+ bias) over `rows` rows, W the description's parameter of
 * `role` (out, in); `bias_role` adds its bias when the layer has one.
 * `experts` > 0: a grouped product over that many routed experts (rows are
 * the permuted rows of all experts, and weights are read for the expected
 * number of experts hit).  Returns the forward op; *bwd_out gets the
 * backward op. */
int eng_walk_linear(eng_walk_t *w, const char *label, double rows, eng_param_role_t role, eng_param_role_t bias_role,
                  int experts, int *bwd_out) {
    const sched_run_shape_t *s = w->s;
    const eng_param_spec_t *p0 = eng_walk_param(w, role, experts > 0 ? 0 : -1);
    const double out = (double)p0->shape[0], in = (double)p0->shape[1];
    const bool bias = bias_role != ENG_P_ROLE_COUNT && eng_walk_has_param(w, bias_role);
    const int count = experts > 0 ? experts : 1;
    const double hit = experts > 0 ? w->experts_hit : 1.0;
    char module[160];
    module_of(p0, module, sizeof module);
    const bool lora = lora_targeted(w, module, role);
    const bool train_w = !s->lora;
    const double mm = 2.0 * rows * out * in;
    const double wread = hit * out * in * w->wb;
    const double io = rows * (in + out) * w->ab;
    char pre[24];
    if (w->layer >= 0) snprintf(pre, sizeof pre, "L%d.", w->layer);
    else pre[0] = '\0';
    /* LoRA: the adapters' products add 2 rows r (in + out) forward; backward
     * recomputes x A^T (the executor saves nothing for it) and forms dB, dy B,
     * dA and dx: 2 rows r (3 in + 2 out) */
    const double rk = lora ? s->lora_r : 0;
    int fwd = eng_walk_add_op(w, SCHED_PHASE_FWD, true, mm + 2.0 * rows * rk * (in + out), wread + io, "%s%s.fwd", pre, label);
    /* backward: dX always (the gradient flows down), dW only for trained weights */
    double bflops = mm + (train_w ? mm : 0), bbytes = wread + io + (train_w ? io + hit * out * in * 8.0 : 0);
    int bwd = eng_walk_add_op(w, SCHED_PHASE_BWD, true, bflops + 2.0 * rows * rk * (3.0 * in + 2.0 * out), bbytes,
                              "%s%s.bwd", pre, label);
    if (bwd_out) *bwd_out = bwd;
    for (int e = 0; e < count; e++) {
        const eng_param_spec_t *p = experts > 0 ? eng_walk_param(w, role, e) : p0;
        const int ex = experts > 0 ? e : -1;
        add_weight(w, p, ex, train_w, fwd, bwd);
        if (bias) {
            const eng_param_spec_t *pb = eng_walk_param(w, bias_role, -1);
            add_weight(w, pb, ex, train_w, fwd, bwd);
        }
        if (lora) {
            char m[160], name[256];
            module_of(p, m, sizeof m);
            snprintf(name, sizeof name, "base_model.model.%s.lora_A.weight", m);
            add_adapter(w, name, rk * in, ex, fwd, bwd);
            snprintf(name, sizeof name, "base_model.model.%s.lora_B.weight", m);
            add_adapter(w, name, out * rk, ex, fwd, bwd);
        }
    }
    return fwd;
}

/* An elementwise-class op (norm, rope, softmax, permutation): memory bound. */
int eng_walk_elementwise(eng_walk_t *w, sched_phase_t phase, const char *label, double elems, double bytes) {
    char pre[24];
    if (w->layer >= 0) snprintf(pre, sizeof pre, "L%d.", w->layer);
    else pre[0] = '\0';
    return eng_walk_add_op(w, phase, false, 5.0 * elems, bytes, "%s%s.%s", pre, label, phase == SCHED_PHASE_FWD ? "fwd" : "bwd");
}

/* ---- blocks ----------------------------------------------------------------- */

/* causal attention pairs per sequence: sum over queries of keys attended */
double eng_walk_attn_pairs(double T, int window) {
    if (window <= 0 || window >= T) return T * (T + 1) / 2;
    const double W = window;
    return W * (W + 1) / 2 + (T - W) * W;
}

int eng_walk_window(const eng_walk_t *w) {
    return w->layer >= 0 && w->cfg->layer_full_attention[w->layer] ? 0 : w->cfg->sliding_window;
}

/* The attention kernels' rule (kernels/attention.h): the tensor-core path
 * takes bf16 compute, heads a multiple of kv heads, head dims a multiple
 * of 8 up to 256 and rows without packed segments; the fp32 kernel takes
 * the rest.  The cost model times each at its own rate. */
void eng_walk_attention_core(eng_walk_t *w, int fwd_op, int bwd_op, int nh, int nkv, int hd) {
    const bool tc = w->s->bf16 && !w->s->packed_segments && kern_attention_tc_takes(nh, nkv, hd);
    w->p->ops[fwd_op].attention = w->p->ops[bwd_op].attention = true;
    w->p->ops[fwd_op].attention_tc = w->p->ops[bwd_op].attention_tc = tc;
}

int eng_walk_attn_input(eng_walk_t *w, int *norm_bwd) {
    const double n = w->n, H = w->cfg->hidden_size;
    w->group = 0;
    int in_act = eng_walk_add_act(w, "input", w->adt, n * H, w->prev_out_op, -1);
    int f = eng_walk_elementwise(w, SCHED_PHASE_FWD, "attn_norm", n * H, 2 * n * H * w->ab);
    int g = eng_walk_elementwise(w, SCHED_PHASE_BWD, "attn_norm", n * H, 4 * n * H * w->ab);
    sched_program_add_consumer(w->p, in_act, g);
    eng_walk_add_param(w, ENG_P_ATTN_NORM, f, g);
    int xn = eng_walk_act(w, ENG_A_ATTN_XN, f, -1);
    eng_walk_act(w, ENG_A_ATTN_RSTD, f, g);
    *norm_bwd = g;
    return xn;
}

static void attention_half(eng_walk_t *w) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size, hd = c->head_dim;
    const double qd = (double)c->num_attention_heads * hd, kd = (double)c->num_key_value_heads * hd;
    const mt_dtype_t adt = w->adt;
    int g;
    int xn = eng_walk_attn_input(w, &g);
    int bq, bk, bv, bo;
    int fq = eng_walk_linear(w, "q_proj", n, ENG_P_Q, ENG_P_Q_BIAS, 0, &bq);
    eng_walk_linear(w, "k_proj", n, ENG_P_K, ENG_P_K_BIAS, 0, &bk);
    int fv = eng_walk_linear(w, "v_proj", n, ENG_P_V, ENG_P_V_BIAS, 0, &bv);
    sched_program_add_consumer(w->p, xn, bq); /* the weight gradients read the normed input */
    sched_program_add_consumer(w->p, xn, bk);
    sched_program_add_consumer(w->p, xn, bv);
    if (c->qk_norm) {
        int fn = eng_walk_elementwise(w, SCHED_PHASE_FWD, "qk_norm", n * (qd + kd), 2 * n * (qd + kd) * w->ab);
        int gn = eng_walk_elementwise(w, SCHED_PHASE_BWD, "qk_norm", n * (qd + kd), 4 * n * (qd + kd) * w->ab);
        eng_walk_add_param(w, ENG_P_Q_NORM, fn, gn);
        eng_walk_add_param(w, ENG_P_K_NORM, fn, gn);
        eng_walk_act(w, ENG_A_Q_PRE, fq, gn);
        eng_walk_act(w, ENG_A_K_PRE, fq, gn);
        eng_walk_act(w, ENG_A_Q_RSTD, fn, gn);
        eng_walk_act(w, ENG_A_K_RSTD, fn, gn);
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_qk_pre", adt, n * qd, gn);
    }
    int fr = eng_walk_elementwise(w, SCHED_PHASE_FWD, "rope", n * (qd + kd), 2 * n * (qd + kd) * w->ab);
    eng_walk_elementwise(w, SCHED_PHASE_BWD, "rope", n * (qd + kd), 2 * n * (qd + kd) * w->ab);
    /* attention core: QK^T and PV over the causal (or windowed) pairs; the
     * backward recomputes the scores (flash-style, only logsumexp saved) */
    const double pairs = w->B * eng_walk_attn_pairs(w->T, eng_walk_window(w)) * c->num_attention_heads;
    const double core_io = n * (2 * qd + 2 * kd) * w->ab;
    int fa = eng_walk_add_op(w, SCHED_PHASE_FWD, true, 4.0 * pairs * hd, core_io, "L%d.attention.fwd", w->layer);
    int ga = eng_walk_add_op(w, SCHED_PHASE_BWD, true, 10.0 * pairs * hd, 2 * core_io, "L%d.attention.bwd", w->layer);
    eng_walk_attention_core(w, fa, ga, c->num_attention_heads, c->num_key_value_heads, c->head_dim);
    eng_walk_act(w, ENG_A_Q, fr, ga);
    eng_walk_act(w, ENG_A_K, fr, ga);
    eng_walk_act(w, ENG_A_V, fv, ga);
    eng_walk_act(w, ENG_A_ATT, fa, ga);
    eng_walk_act(w, ENG_A_LSE, fa, ga);
    /* gpt-oss: one learned logit per head joins each row's softmax */
    if (eng_walk_has_param(w, ENG_P_ATTN_SINKS)) eng_walk_add_param(w, ENG_P_ATTN_SINKS, fa, ga);
    int fo = eng_walk_linear(w, "o_proj", n, ENG_P_O, ENG_P_O_BIAS, 0, &bo);
    /* backward temporaries: d(att), dq, dk, dv, d(xn) */
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_out", adt, n * qd, bo);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dq", adt, n * qd, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dk", adt, n * kd, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.dv", adt, n * kd, ga);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "attn.d_xn", adt, n * H, g);
    w->prev_out_op = fo;
}

/* Whether LoRA adapts the routed experts' `role` module. */
static bool experts_adapted(eng_walk_t *w, eng_param_role_t role) {
    char module[160];
    module_of(eng_walk_param(w, role, 0), module, sizeof module);
    return lora_targeted(w, module, role);
}

static void moe_mlp(eng_walk_t *w, int xn) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size;
    const mt_dtype_t adt = w->adt;
    const double E = c->num_experts, k = c->num_experts_per_tok, I = c->moe_intermediate_size, m = n * k;
    int br;
    int fr = eng_walk_linear(w, "router", n, ENG_P_ROUTER, ENG_P_ROLE_COUNT, 0, &br);
    sched_program_add_consumer(w->p, xn, br);
    int fs = eng_walk_elementwise(w, SCHED_PHASE_FWD, "route", n * E, 3 * n * E * 4.0);
    eng_walk_act(w, ENG_A_ROUTER_LOGITS, fr, br);
    const eng_act_id_t routing[] = {ENG_A_ROUTER_PROBS, ENG_A_TOPW,  ENG_A_TOPK_IDX, ENG_A_EXPERT_COUNTS,
                                    ENG_A_EXPERT_OFFSETS, ENG_A_PERM, ENG_A_INV_PERM};
    for (size_t i = 0; i < sizeof routing / sizeof routing[0]; i++) eng_walk_act(w, routing[i], fs, br);
    int fp = eng_walk_elementwise(w, SCHED_PHASE_FWD, "permute", m * H, 2 * m * H * w->ab);
    int gp = eng_walk_elementwise(w, SCHED_PHASE_BWD, "permute", m * H, 2 * m * H * w->ab);
    sched_program_add_consumer(w->p, xn, gp);
    eng_walk_act(w, ENG_A_EXPERT_X, fp, gp);
    int bg, bu, bd;
    int fg = eng_walk_linear(w, "experts.gate", m, ENG_P_EXP_GATE, ENG_P_ROLE_COUNT, (int)E, &bg);
    int fu = eng_walk_linear(w, "experts.up", m, ENG_P_EXP_UP, ENG_P_ROLE_COUNT, (int)E, &bu);
    int fw = eng_walk_elementwise(w, SCHED_PHASE_FWD, "experts.swiglu", m * I, 3 * m * I * w->ab);
    int fd = eng_walk_linear(w, "experts.down", m, ENG_P_EXP_DOWN, ENG_P_ROLE_COUNT, (int)E, &bd);
    eng_walk_act(w, ENG_A_EXPERT_G, fg, bg);
    eng_walk_act(w, ENG_A_EXPERT_U, fu, bu);
    eng_walk_act(w, ENG_A_EXPERT_OUT, fd, bd);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "moe.h", adt, m * I, fw);
    /* bf16 g, u, ep with LoRA on their module: product and adapter summed
     * in an fp32 scratch, then rounded (moe/moe_experts.c) */
    if (adt != MT_F32 && (experts_adapted(w, ENG_P_EXP_GATE) || experts_adapted(w, ENG_P_EXP_UP))) {
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "moe.gate_lora_sum", MT_F32, m * I, fg);
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "moe.up_lora_sum", MT_F32, m * I, fu);
    }
    if (adt != MT_F32 && experts_adapted(w, ENG_P_EXP_DOWN))
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "moe.down_lora_sum", MT_F32, m * H, fd);
    int last = eng_walk_elementwise(w, SCHED_PHASE_FWD, "combine", m * H, (m + n) * H * w->ab);
    int gc = eng_walk_elementwise(w, SCHED_PHASE_BWD, "combine", m * H, 2 * (m + n) * H * w->ab);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "mlp.y", adt, n * H, last);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_topw", MT_F32, n * k, gc);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_ep", adt, m * H, gc);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.h_recomputed", adt, m * I, bd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.dh", adt, m * I, bd);
    /* bf16: xp's gradient leaves the experts as two bf16 parts, the gate
     * part over d_ep and the up part apart; LoRA's backward terms on an
     * adapted module are summed in fp32 scratch first (moe/moe_experts.c) */
    if (adt != MT_F32) {
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_xp_up", adt, m * H, bu);
        if (experts_adapted(w, ENG_P_EXP_DOWN))
            eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.dh_lora_sum", MT_F32, m * I, bd);
        if (experts_adapted(w, ENG_P_EXP_GATE) || experts_adapted(w, ENG_P_EXP_UP))
            eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_xp_lora_sum", MT_F32, m * H, bg);
    }
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "moe.d_logits", MT_F32, n * E, br);
    if (!eng_walk_has_param(w, ENG_P_SHARED_GATE)) return;
    const double Is = (double)eng_walk_param(w, ENG_P_SHARED_GATE, -1)->shape[0];
    int sg, su, sd;
    int fsg = eng_walk_linear(w, "shared.gate", n, ENG_P_SHARED_GATE, ENG_P_ROLE_COUNT, 0, &sg);
    sched_program_add_consumer(w->p, xn, sg);
    int fsu = eng_walk_linear(w, "shared.up", n, ENG_P_SHARED_UP, ENG_P_ROLE_COUNT, 0, &su);
    int fsd = eng_walk_linear(w, "shared.down", n, ENG_P_SHARED_DOWN, ENG_P_ROLE_COUNT, 0, &sd);
    eng_walk_act(w, ENG_A_SHARED_G, fsg, sg);
    eng_walk_act(w, ENG_A_SHARED_U, fsu, su);
    eng_walk_act(w, ENG_A_SHARED_OUT, fsd, sd);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "shared.h", adt, n * Is, fsd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "shared.d_out", adt, n * H, sd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "shared.h_recomputed", adt, n * Is, sd);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "shared.dh", adt, n * Is, sd);
    if (eng_walk_has_param(w, ENG_P_SHARED_EXPERT_GATE)) {
        int sgb;
        int fsgl = eng_walk_linear(w, "shared_gate", n, ENG_P_SHARED_EXPERT_GATE, ENG_P_ROLE_COUNT, 0, &sgb);
        eng_walk_act(w, ENG_A_SHARED_GATE_LOGIT, fsgl, sgb);
    }
}

static void mlp_half(eng_walk_t *w, bool moe) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size;
    const mt_dtype_t adt = w->adt;
    w->group = 1;
    /* x_mid, the residual after attention: read again by the MLP norm's backward */
    int mid = eng_walk_act(w, ENG_A_X_MID, w->prev_out_op, -1);
    int f = eng_walk_elementwise(w, SCHED_PHASE_FWD, "mlp_norm", n * H, 2 * n * H * w->ab);
    int g = eng_walk_elementwise(w, SCHED_PHASE_BWD, "mlp_norm", n * H, 4 * n * H * w->ab);
    sched_program_add_consumer(w->p, mid, g);
    eng_walk_add_param(w, ENG_P_MLP_NORM, f, g);
    int xn = eng_walk_act(w, ENG_A_MLP_XN, f, -1);
    eng_walk_act(w, ENG_A_MLP_RSTD, f, g);
    if (moe && w->f->moe_ops) {
        w->f->moe_ops(w, xn);
    } else if (moe) {
        moe_mlp(w, xn);
    } else {
        const double Id = c->intermediate_size;
        int bg, bu, bd;
        int fg = eng_walk_linear(w, "mlp.gate_proj", n, ENG_P_DENSE_GATE, ENG_P_ROLE_COUNT, 0, &bg);
        sched_program_add_consumer(w->p, xn, bg);
        int fu = eng_walk_linear(w, "mlp.up_proj", n, ENG_P_DENSE_UP, ENG_P_ROLE_COUNT, 0, &bu);
        int fw = eng_walk_elementwise(w, SCHED_PHASE_FWD, "mlp.swiglu", n * Id, 3 * n * Id * w->ab);
        int last = eng_walk_linear(w, "mlp.down_proj", n, ENG_P_DENSE_DOWN, ENG_P_ROLE_COUNT, 0, &bd);
        eng_walk_act(w, ENG_A_DENSE_G, fg, bg);
        eng_walk_act(w, ENG_A_DENSE_U, fu, bu);
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "mlp.h", adt, n * Id, fw);
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "mlp.y", adt, n * H, last);
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "mlp.h_recomputed", adt, n * Id, bd);
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "mlp.dh", adt, n * Id, bd);
    }
    int res = eng_walk_elementwise(w, SCHED_PHASE_FWD, "residual", n * H, 3 * n * H * w->ab);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "output", adt, n * H, res);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "mlp.d_xn", adt, n * H, g);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "mlp.d_mid", adt, n * H, g);
    w->prev_out_op = res;
}

static void begin_block(eng_walk_t *w, int block, int layer) {
    w->block = block;
    w->layer = layer;
    w->group = 0;
    sched_prog_block_t *pb = &w->p->blocks[block];
    pb->layer = layer;
    /* the gradient stream d(residual) (n, H) lives through every backward */
    pb->bwd_stream_bytes = w->n * w->cfg->hidden_size * w->ab;
}

static void embedding_block(eng_walk_t *w) {
    const double n = w->n, H = w->cfg->hidden_size;
    begin_block(w, 0, -1);
    int f = eng_walk_add_op(w, SCHED_PHASE_FWD, false, n * H, n * H * (w->wb + w->ab) + 4 * n, "embed.fwd");
    int g = eng_walk_add_op(w, SCHED_PHASE_BWD, false, n * H, n * H * (w->ab + 8.0), "embed.bwd");
    eng_walk_add_param(w, ENG_P_EMBED, f, g);
    eng_walk_add_act(w, "input_ids", MT_I32, n, -1, g);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "embeddings", w->adt, n * H, f);
    w->prev_out_op = f;
    w->p->blocks[0].act_input_bytes = n * 4.0;
}

static void head_block(eng_walk_t *w) {
    const eng_model_config_t *c = w->cfg;
    const double n = w->n, H = c->hidden_size, V = c->vocab_size;
    const int hb_index = c->num_hidden_layers + 1;
    begin_block(w, hb_index, -1);
    int in = eng_walk_add_act(w, "final.input", w->adt, n * H, w->prev_out_op, -1);
    int f = eng_walk_elementwise(w, SCHED_PHASE_FWD, "final_norm", n * H, 2 * n * H * w->ab);
    int g = eng_walk_elementwise(w, SCHED_PHASE_BWD, "final_norm", n * H, 4 * n * H * w->ab);
    sched_program_add_consumer(w->p, in, g);
    eng_walk_add_param(w, ENG_P_FINAL_NORM, f, g);
    int xn = eng_walk_add_act(w, "final.xn", w->adt, n * H, f, -1);
    eng_walk_add_act(w, "final.rstd", MT_F32, n, f, g);
    int hb, fh;
    if (!eng_walk_has_param(w, ENG_P_LM_HEAD)) {
        /* tied: the embedding table is the head's weight, no tensor of its own */
        const bool train = !w->s->lora;
        const double mm = 2.0 * n * V * H;
        fh = eng_walk_add_op(w, SCHED_PHASE_FWD, true, mm, V * H * w->wb + n * (H + V) * w->ab, "head.lm_head.fwd");
        hb = eng_walk_add_op(w, SCHED_PHASE_BWD, true, train ? 2 * mm : mm,
                    V * H * (w->wb + (train ? 8.0 : 0)) + 2 * n * (H + V) * w->ab, "head.lm_head.bwd");
        sched_program_add_consumer(w->p, 0 /* first tensor: the embedding */, fh);
        sched_program_add_consumer(w->p, 0, hb);
        w->p->tied_head = true;
    } else {
        fh = eng_walk_linear(w, "lm_head", n, ENG_P_LM_HEAD, ENG_P_ROLE_COUNT, 0, &hb);
    }
    sched_program_add_consumer(w->p, xn, hb);
    /* logits are fp32 (HF upcasts before the loss); the loss's backward
     * writes d(logits) in place.  In chunks (eng_head_chunk_rows): no
     * logits kept, a chunk's in each pass, and the backward forms them
     * again (its op counts one more product and the loss's backward) */
    const double chunk = (double)eng_head_chunk_rows((int64_t)V, (int64_t)n);
    if (chunk >= n) {
        eng_walk_add_act(w, "logits", MT_F32, n * V, fh, hb);
    } else {
        eng_walk_add_temp(w, SCHED_PHASE_FWD, "logits chunk", MT_F32, chunk * V, fh);
        eng_walk_add_temp(w, SCHED_PHASE_BWD, "logits chunk", MT_F32, chunk * V, hb);
        sched_op_t *o = &w->p->ops[hb];
        o->flops += 2.0 * n * V * H + 5.0 * n * V;
        o->bytes += 2 * n * V * 4.0;
    }
    int fl = eng_walk_elementwise(w, SCHED_PHASE_FWD, "loss", n * V, 2 * n * V * 4.0);
    eng_walk_add_temp(w, SCHED_PHASE_FWD, "loss_rows", MT_F32, n, fl);
    eng_walk_add_temp(w, SCHED_PHASE_BWD, "d_final_xn", w->adt, n * H, hb);
    w->p->blocks[hb_index].act_input_bytes = n * H * w->ab;
}

/* The leaves of the model's linear layers, in parameter order, once each
 * ("q_proj, k_proj, ..., gate (router), w1, w2, w3"), for the message
 * about a LoRA target that matches nothing. */
static void linear_leaves(const eng_model_desc_t *d, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < d->count; i++) {
        const eng_param_spec_t *p = &d->params[i];
        const size_t nl = strlen(p->name);
        if (p->layer < 0 || p->ndim != 2 || nl < 7 || strcmp(p->name + nl - 7, ".weight") != 0) continue;
        char mod[160], item[192];
        module_of(p, mod, sizeof mod);
        const char *leaf = strrchr(mod, '.');
        leaf = leaf ? leaf + 1 : mod;
        snprintf(item, sizeof item, "%s%s", leaf, p->role == ENG_P_ROUTER && strcmp(leaf, "router") ? " (router)" : "");
        bool seen = false;
        for (const char *at = buf; !seen && (at = strstr(at, item)) != NULL; at++)
            seen = (at == buf || at[-1] == ' ') && (at[strlen(item)] == ',' || at[strlen(item)] == '\0');
        if (seen) continue;
        const int n = snprintf(buf + len, cap - len, "%s%s", len ? ", " : "", item);
        if (n < 0 || (size_t)n >= cap - len) break;
        len += (size_t)n;
    }
}

static mt_status_t check_config(const eng_model_config_t *m, mt_error_t *err) {
#define NEED(cond, ...)                                                   \
    do {                                                                  \
        if (!(cond)) return mt_error_set(err, MT_ERR_CONFIG, __VA_ARGS__); \
    } while (0)
    NEED(m->num_hidden_layers >= 1 && m->num_hidden_layers <= SCHED_MAX_LAYERS,
         "model: num_hidden_layers must be 1..%d, got %d", SCHED_MAX_LAYERS, m->num_hidden_layers);
    NEED(m->hidden_size > 0 && m->num_attention_heads > 0 && m->num_key_value_heads > 0 && m->head_dim > 0 &&
             m->vocab_size > 0,
         "model: hidden_size (%d), num_attention_heads (%d), num_key_value_heads (%d), head_dim (%d) and vocab_size "
         "(%d) must be positive",
         m->hidden_size, m->num_attention_heads, m->num_key_value_heads, m->head_dim, m->vocab_size);
    NEED(m->num_attention_heads % m->num_key_value_heads == 0,
         "model: num_attention_heads (%d) must be a multiple of num_key_value_heads (%d)", m->num_attention_heads,
         m->num_key_value_heads);
    bool any_moe = false, any_dense = false;
    for (int l = 0; l < m->num_hidden_layers; l++) {
        any_moe |= m->layer_is_moe[l];
        any_dense |= !m->layer_is_moe[l];
    }
    NEED(!any_moe || (m->num_experts > 0 && m->num_experts_per_tok >= 1 &&
                      m->num_experts_per_tok <= m->num_experts && m->moe_intermediate_size > 0),
         "model: MoE layers need num_experts > 0, 1 <= num_experts_per_tok <= num_experts and "
         "moe_intermediate_size > 0 (got %d, %d, %d)",
         m->num_experts, m->num_experts_per_tok, m->moe_intermediate_size);
    NEED(!any_dense || m->intermediate_size > 0, "model: dense layers need intermediate_size > 0");
#undef NEED
    return MT_OK;
}

mt_status_t eng_decoder_ops(const eng_family_t *f, const eng_model_desc_t *d, const eng_model_config_t *cfg,
                            const sched_run_shape_t *shape, sched_program_t *out, mt_error_t *err) {
    mt_status_t st = check_config(cfg, err);
    if (st != MT_OK) return st;
    const int L = cfg->num_hidden_layers;
    sched_program_init(out, L + 2);
    eng_walk_t w = {.p = out, .f = f, .d = d, .cfg = cfg, .s = shape};
    w.wdt = shape->bf16 ? MT_BF16 : MT_F32;
    w.adt = w.wdt;
    w.wb = (double)mt_dtype_size(w.wdt);
    w.ab = (double)mt_dtype_size(w.adt);
    w.B = shape->micro_batch_size;
    w.T = shape->sequence_len;
    w.n = w.B * w.T;
    w.prev_out_op = -1;
    w.target_hit = calloc((size_t)(shape->num_lora_targets + 1), sizeof *w.target_hit);
    MT_CHECK_ALLOC(w.target_hit, "LoRA target flags");

    embedding_block(&w);
    for (int l = 0; l < L; l++) {
        begin_block(&w, l + 1, l);
        sched_prog_block_t *pb = &out->blocks[l + 1];
        pb->is_moe = cfg->layer_is_moe[l];
        w.experts_hit = 0;
        if (pb->is_moe) {
            pb->num_experts = cfg->num_experts;
            pb->top_k = cfg->num_experts_per_tok;
            w.experts_hit = sched_expected_experts_hit(pb->num_experts, pb->top_k, w.n);
        }
        if (f->attention_ops) f->attention_ops(&w);
        else attention_half(&w);
        mlp_half(&w, pb->is_moe);
        pb->act_input_bytes = w.n * cfg->hidden_size * w.ab;
    }
    head_block(&w);

    for (int i = 0; i < shape->num_lora_targets && shape->lora; i++)
        if (!w.target_hit[i]) {
            char names[512];
            linear_leaves(d, names, sizeof names);
            st = mt_error_set(err, MT_ERR_CONFIG,
                              "lora_target_modules: '%s' matches no module of this model (e.g. %s, all-linear)%s",
                              shape->lora_targets[i], names,
                              f->moe_ops ? "; its experts are fused tensors (gate_up_proj, down_proj), which "
                                           "moetune cannot put adapters on yet"
                                         : "");
            break;
        }
    free(w.target_hit);
    if (st != MT_OK) sched_program_free(out);
    return st;
}
