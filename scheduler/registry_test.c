/* Tensor registry from a generic list: byte counts of a tiny
 * decoder-shaped list computed by hand (derived master copies, gradients,
 * Adam state, expected experts hit, activation and temporary footprints,
 * the AdamW op of each block), LoRA adapters, tied embeddings, the
 * expected-experts formula, the producer/consumer links every tensor must
 * have, and the list's consistency checks.  The published parameter counts
 * of real models are the engine's descriptions' to meet
 * (engine/model/model_desc_test.c). */
#include "scheduler/registry.h"
#include "scheduler/testutil.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static int failures;
#define EXPECT(c, ...)                                                          \
    do {                                                                        \
        if (!(c)) {                                                             \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                       \
            fprintf(stderr, "\n");                                              \
            failures++;                                                         \
        }                                                                       \
    } while (0)

static sched_test_model_t tiny(void) {
    sched_test_model_t m = {0};
    m.num_layers = 2;
    m.hidden = 8;
    m.heads = 2;
    m.kv_heads = 1;
    m.head_dim = 4;
    m.vocab = 16;
    m.num_experts = 4;
    m.top_k = 2;
    m.expert_inter = 6;
    return m;
}

static sched_run_shape_t shape(int B, int T, bool bf16) {
    sched_run_shape_t s = {0};
    s.micro_batch_size = B;
    s.sequence_len = T;
    s.grad_accum = 1;
    s.bf16 = bf16;
    s.max_grad_norm = 1.0;
    return s;
}

static mt_status_t build(const sched_test_model_t *m, const sched_run_shape_t *s, sched_registry_t *r,
                         mt_error_t *err) {
    sched_program_t p;
    sched_test_program(m, s, &p);
    mt_status_t st = sched_registry_build(&p, s, r, err);
    sched_program_free(&p);
    return st;
}

static int find(const sched_registry_t *r, const char *name) {
    for (int i = 0; i < r->num_tensors; i++)
        if (strcmp(r->tensors[i].name, name) == 0) return i;
    return -1;
}

static void test_tiny_by_hand(void) {
    sched_test_model_t m = tiny();
    sched_run_shape_t s = shape(1, 4, true);
    sched_registry_t r;
    mt_error_t err = {0};
    mt_status_t st = build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    /* embed 16*8 = 128; per layer: norms 2*8, q 8*8, k 4*8, v 4*8, o 8*8,
     * router 4*8, experts 4 * 3 * 6*8 = 576 -> 816; final norm 8; lm_head 128 */
    EXPECT(r.params == 128 + 2 * 816 + 8 + 128, "params %.0f", r.params);
    /* active: everything but 2 of the 4 experts' 144 parameters per layer */
    EXPECT(r.active_params == 1896 - 2 * 2 * 144, "active %.0f", r.active_params);
    EXPECT(r.num_blocks == 4, "blocks %d", r.num_blocks);
    /* bf16 working copies (2 B), fp32 master, grad, m, v (4 B each) */
    EXPECT(r.kind_bytes[SCHED_T_WEIGHT] == 2 * 1896.0, "weight bytes %.0f", r.kind_bytes[SCHED_T_WEIGHT]);
    EXPECT(r.kind_bytes[SCHED_T_MASTER] == 4 * 1896.0, "master bytes %.0f", r.kind_bytes[SCHED_T_MASTER]);
    EXPECT(r.kind_bytes[SCHED_T_GRAD] == 4 * 1896.0, "grad bytes %.0f", r.kind_bytes[SCHED_T_GRAD]);
    EXPECT(r.kind_bytes[SCHED_T_ADAM_M] == 4 * 1896.0 && r.kind_bytes[SCHED_T_ADAM_V] == 4 * 1896.0, "adam bytes");
    const sched_block_info_t *l0 = &r.blocks[1];
    EXPECT(l0->w_bytes == 2 * 816.0, "layer weights %.0f", l0->w_bytes);
    EXPECT(l0->w_expert_bytes == 2 * 144.0 && l0->w_expert_tensors == 3, "one expert %.0f in %d tensors",
           l0->w_expert_bytes, l0->w_expert_tensors);
    EXPECT(l0->w_dense_bytes == 2 * (816.0 - 576.0), "dense %.0f", l0->w_dense_bytes);
    /* 4 tokens, top-2 of 4: 4 * (1 - (1/2)^4) = 3.75 experts hit */
    EXPECT(fabs(l0->experts_hit - 3.75) < 1e-12, "experts hit %g", l0->experts_hit);
    EXPECT(fabs(l0->w_fetch_bytes - 2 * (240 + 3.75 * 144)) < 1e-9, "fetch %g", l0->w_fetch_bytes);
    EXPECT(l0->optim_bytes == 12.0 * 816 && l0->grad_bytes == 4.0 * 816, "optim %g grad %g", l0->optim_bytes,
           l0->grad_bytes);
    EXPECT(l0->adam_bytes_per_param == 30.0, "adam bytes/param %g", l0->adam_bytes_per_param);
    EXPECT(r.blocks[0].experts_hit == 0 && !r.blocks[0].is_moe && l0->is_moe, "routing facts per block");
    /* each block's AdamW op comes first, and moves the expected trainable bytes */
    const sched_op_t *adam = &r.ops[l0->first_op];
    EXPECT(adam->phase == SCHED_PHASE_OPTIM && strcmp(adam->name, "L0.adamw") == 0, "first op of layer 0: %s",
           adam->name);
    EXPECT(fabs(adam->bytes - 30.0 * (240 + 3.75 * 144)) < 1e-9, "adamw bytes %g", adam->bytes);
    for (int b = 0; b < r.num_blocks; b++)
        for (int i = r.blocks[b].first_op; i < r.blocks[b].first_op + r.blocks[b].num_ops; i++)
            EXPECT(r.ops[i].id == i && r.ops[i].block == b, "op %d (%s) in block %d", i, r.ops[i].name, b);
    sched_registry_free(&r);

    /* fp32: saved activations of a layer (testutil.h's list, n = 4 tokens,
     * m = 8 rows): input 32, attn xn 32 + rstd 4, q 32, k 16, v 16, out 32,
     * lse 8; mid 32, mlp xn 32, logits 16, idx 8, xp 64, g 48, u 48, ep 64
     * -> 484 elements */
    s = shape(1, 4, false);
    st = build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    EXPECT(r.blocks[1].act_saved_bytes == 4.0 * 484 && r.blocks[1].act_tensors == 16, "layer activations %g in %d",
           r.blocks[1].act_saved_bytes, r.blocks[1].act_tensors);
    EXPECT(r.blocks[1].act_input_bytes == 4.0 * 32, "layer input %g", r.blocks[1].act_input_bytes);
    /* temporaries: the larger group (m I + m I + m H = 160 against n qd + n qd + n H = 96)
     * plus the gradient stream (n H = 32) */
    EXPECT(r.blocks[1].bwd_temp_bytes == 4.0 * (160 + 32) && r.blocks[1].fwd_temp_bytes == 0, "temporaries %g / %g",
           r.blocks[1].bwd_temp_bytes, r.blocks[1].fwd_temp_bytes);
    /* head: input 32, logits n*V = 64 (fp32) */
    EXPECT(r.blocks[3].act_saved_bytes == 4.0 * (32 + 64), "head activations %g", r.blocks[3].act_saved_bytes);
    EXPECT(r.kind_bytes[SCHED_T_MASTER] == 0, "no master copy in fp32 runs");
    EXPECT(r.blocks[1].adam_bytes_per_param == 28.0, "fp32 AdamW bytes/param %g", r.blocks[1].adam_bytes_per_param);
    EXPECT(r.blocks[1].optim_bytes == 8.0 * 816, "fp32 optimizer state is m + v: %g", r.blocks[1].optim_bytes);
    /* every tensor is linked to the ops that make and use it */
    for (int i = 0; i < r.num_tensors; i++) {
        const sched_tensor_t *t = &r.tensors[i];
        EXPECT(t->num_consumers >= 1 || t->kind == SCHED_T_TEMP, "%s has no consumer", t->name);
        if (t->kind == SCHED_T_GRAD)
            EXPECT(t->producer >= 0 && r.ops[t->producer].phase == SCHED_PHASE_BWD &&
                       r.ops[t->producer].block == t->block,
                   "%s not produced by its block's backward op", t->name);
        if (t->kind == SCHED_T_ACT && t->block > 0 && t->producer >= 0)
            EXPECT(r.ops[t->producer].phase == SCHED_PHASE_FWD && r.ops[t->producer].block == t->block,
                   "%s not produced by its block's forward op", t->name);
        if (t->kind == SCHED_T_ADAM_M || t->kind == SCHED_T_ADAM_V)
            EXPECT(t->producer == r.blocks[t->block].first_op, "%s not updated by its block's AdamW op", t->name);
        if (t->kind == SCHED_T_WEIGHT) EXPECT(t->producer == -1, "%s: weights are loaded", t->name);
    }
    int w2 = find(&r, "model.layers.1.block_sparse_moe.experts.3.w2.weight");
    EXPECT(w2 >= 0 && r.tensors[w2].expert == 3 && r.tensors[w2].layer == 1 && r.tensors[w2].block == 2 &&
               r.tensors[w2 + 1].kind == SCHED_T_GRAD && strcmp(r.tensors[w2 + 1].name, "model.layers.1.block_sparse_moe.experts.3.w2.weight#grad") == 0,
           "a weight is followed by its gradient");
    sched_registry_free(&r);

    /* tied embeddings: no lm_head tensor; the head's ops read the embedding */
    m.tied_embeddings = true;
    st = build(&m, &s, &r, &err);
    EXPECT(st == MT_OK && r.params == 1896 - 128 && r.tied_head, "tied params %.0f", r.params);
    if (st == MT_OK) {
        int head_reads = 0;
        for (int c = 0; c < r.tensors[0].num_consumers; c++) head_reads += r.ops[r.tensors[0].consumers[c]].block == 3;
        EXPECT(head_reads == 2, "the head's forward and backward read the embedding: %d", head_reads);
        sched_registry_free(&r);
    }
}

static void test_lora(void) {
    sched_test_model_t m = tiny();
    sched_run_shape_t s = shape(1, 4, true);
    s.lora = true;
    s.lora_r = 2;
    s.num_lora_targets = 2;
    snprintf(s.lora_targets[0], sizeof s.lora_targets[0], "q_proj");
    snprintf(s.lora_targets[1], sizeof s.lora_targets[1], "w1");
    sched_registry_t r;
    mt_error_t err = {0};
    mt_status_t st = build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    /* per layer: q A (2, 8) + B (8, 2); w1 A (2, 8) + B (6, 2) per expert, 4 experts */
    EXPECT(r.train_params == 2.0 * (32 + 4 * 28), "lora trainable %.0f", r.train_params);
    EXPECT(r.params == 1896, "adapters are not model parameters");
    EXPECT(r.kind_bytes[SCHED_T_MASTER] == 0, "fp32 adapters need no master copy");
    EXPECT(r.blocks[1].train_expert_tensors == 2 && r.blocks[1].train_dense_tensors == 2, "trainable tensors %d / %d",
           r.blocks[1].train_expert_tensors, r.blocks[1].train_dense_tensors);
    /* a micro-batch updates the dense adapters and those of the experts hit */
    EXPECT(fabs(r.blocks[1].train_params_mb - (32 + 3.75 * 28)) < 1e-9, "trained per micro-batch %g",
           r.blocks[1].train_params_mb);
    int q = find(&r, "model.layers.0.self_attn.q_proj.weight");
    EXPECT(q >= 0 && !r.tensors[q].trainable && r.tensors[q].dtype == MT_BF16, "frozen base weight");
    int a = find(&r, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight");
    EXPECT(a >= 0 && r.tensors[a].trainable && r.tensors[a].dtype == MT_F32, "fp32 trainable adapter");
    sched_registry_free(&r);
}

static void test_errors_and_formula(void) {
    EXPECT(sched_expected_experts_hit(8, 2, 1) == 2.0, "one token hits k experts");
    EXPECT(fabs(sched_expected_experts_hit(64, 8, 2) - 64 * (1 - pow(56.0 / 64, 2))) < 1e-12, "two tokens");
    EXPECT(sched_expected_experts_hit(8, 8, 3) == 8, "k = E");
    sched_test_model_t m = tiny();
    sched_run_shape_t s = shape(1, 4, false);
    sched_registry_t r;
    mt_error_t err = {0};
    sched_program_t p;
    sched_test_program(&m, &s, &p);
    /* routing facts out of range */
    p.blocks[1].top_k = 5;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "top_k"), "%s", err.msg);
    p.blocks[1].top_k = 2;
    /* tensors must come block by block */
    const int last = p.num_tensors - 1;
    p.tensors[last].block = 1;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "out of block order"), "%s",
           err.msg);
    p.tensors[last].block = 3;
    /* derived kinds are the registry's to add */
    p.tensors[last].kind = SCHED_T_GRAD;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "derives"), "%s", err.msg);
    p.tensors[last].kind = SCHED_T_ACT;
    /* an expert tensor needs a routed block */
    p.tensors[last].expert = 0;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "without routing"), "%s",
           err.msg);
    p.tensors[last].expert = -1;
    /* an op index past the list */
    p.tensors[last].consumers[0] = p.num_ops;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "consumer op"), "%s", err.msg);
    p.tensors[last].consumers[0] = 0;
    s.sequence_len = 0;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "sequence_len"), "%s", err.msg);
    s.sequence_len = 4;
    EXPECT(sched_registry_build(&p, &s, &r, &err) == MT_OK, "restored list builds: %s", err.msg);
    sched_registry_free(&r);
    sched_program_free(&p);
}

int main(void) {
    test_tiny_by_hand();
    test_lora();
    test_errors_and_formula();
    if (failures) fprintf(stderr, "registry_test: %d failure(s)\n", failures);
    else printf("registry_test: all passed\n");
    return failures != 0;
}
