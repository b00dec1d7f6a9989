/* Tensor registry: byte counts of a tiny model computed by hand, the
 * published parameter counts of real models, LoRA adapters, tied
 * embeddings, the expected-experts formula, and the producer/consumer
 * links every tensor must have. */
#include "scheduler/registry.h"

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

static sched_model_desc_t tiny(void) {
    sched_model_desc_t m = {0};
    m.family = SCHED_FAMILY_MIXTRAL;
    m.num_layers = 2;
    m.hidden = 8;
    m.heads = 2;
    m.kv_heads = 1;
    m.head_dim = 4;
    m.vocab = 16;
    m.num_experts = 4;
    m.top_k = 2;
    m.expert_inter = 6;
    m.dense_inter = 6;
    for (int l = 0; l < m.num_layers; l++) m.layer_is_moe[l] = true;
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

static sched_model_desc_t mixtral_8x7b(void) {
    sched_model_desc_t m = {0};
    m.family = SCHED_FAMILY_MIXTRAL;
    m.num_layers = 32, m.hidden = 4096, m.heads = 32, m.kv_heads = 8, m.head_dim = 128, m.vocab = 32000;
    m.num_experts = 8, m.top_k = 2, m.expert_inter = 14336, m.dense_inter = 14336;
    for (int l = 0; l < 32; l++) m.layer_is_moe[l] = true;
    return m;
}

static void test_tiny_by_hand(void) {
    sched_model_desc_t m = tiny();
    sched_run_shape_t s = shape(1, 4, true);
    sched_registry_t r;
    mt_error_t err = {0};
    mt_status_t st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    /* embed 16*8 = 128; per layer: norms 2*8, q 8*8, k 4*8, v 4*8, o 8*8,
     * router 4*8, experts 4 * 3 * 6*8 = 576 -> 816; final norm 8; lm_head 128 */
    EXPECT(r.params == 128 + 2 * 816 + 8 + 128, "params %.0f", r.params);
    EXPECT(r.num_blocks == 4, "blocks %d", r.num_blocks);
    /* bf16 working copies (2 B), fp32 master, grad, m, v (4 B each) */
    EXPECT(r.kind_bytes[SCHED_T_WEIGHT] == 2 * 1896.0, "weight bytes %.0f", r.kind_bytes[SCHED_T_WEIGHT]);
    EXPECT(r.kind_bytes[SCHED_T_MASTER] == 4 * 1896.0, "master bytes %.0f", r.kind_bytes[SCHED_T_MASTER]);
    EXPECT(r.kind_bytes[SCHED_T_GRAD] == 4 * 1896.0, "grad bytes %.0f", r.kind_bytes[SCHED_T_GRAD]);
    EXPECT(r.kind_bytes[SCHED_T_ADAM_M] == 4 * 1896.0 && r.kind_bytes[SCHED_T_ADAM_V] == 4 * 1896.0, "adam bytes");
    const sched_block_info_t *l0 = &r.blocks[1];
    EXPECT(l0->w_bytes == 2 * 816.0, "layer weights %.0f", l0->w_bytes);
    EXPECT(l0->w_expert_bytes == 2 * 144.0, "one expert %.0f", l0->w_expert_bytes);
    EXPECT(l0->w_dense_bytes == 2 * (816.0 - 576.0), "dense %.0f", l0->w_dense_bytes);
    /* 4 tokens, top-2 of 4: 4 * (1 - (1/2)^4) = 3.75 experts hit */
    EXPECT(fabs(l0->experts_hit - 3.75) < 1e-12, "experts hit %g", l0->experts_hit);
    EXPECT(fabs(l0->w_fetch_bytes - 2 * (240 + 3.75 * 144)) < 1e-9, "fetch %g", l0->w_fetch_bytes);
    EXPECT(l0->optim_bytes == 12.0 * 816 && l0->grad_bytes == 4.0 * 816, "optim %g grad %g", l0->optim_bytes,
           l0->grad_bytes);
    EXPECT(l0->adam_bytes_per_param == 30.0, "adam bytes/param %g", l0->adam_bytes_per_param);
    sched_registry_free(&r);

    /* fp32: saved activations of a layer, element by element (n = 4 tokens, m = 8 rows):
     * input 32, attn xn 32 + rstd 4, q 32, k 16, v 16, out 32, lse 8;
     * mid 32, mlp xn 32 + rstd 4, logits 16, probs 16, topw 8, idx 8, counts 4,
     * offsets 5, perm 8, inv 8, xp 64, g 48, u 48, ep 64 -> 537 elements */
    s = shape(1, 4, false);
    st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st != MT_OK) return;
    EXPECT(r.blocks[1].act_saved_bytes == 4.0 * 537, "layer activations %g", r.blocks[1].act_saved_bytes);
    EXPECT(r.blocks[1].act_input_bytes == 4.0 * 32, "layer input %g", r.blocks[1].act_input_bytes);
    /* head: input 32, xn 32, rstd 4, logits n*V = 64 (fp32) */
    EXPECT(r.blocks[3].act_saved_bytes == 4.0 * (32 + 32 + 4 + 64), "head activations %g", r.blocks[3].act_saved_bytes);
    EXPECT(r.kind_bytes[SCHED_T_MASTER] == 0, "no master copy in fp32 runs");
    EXPECT(r.blocks[1].adam_bytes_per_param == 28.0, "fp32 AdamW bytes/param %g", r.blocks[1].adam_bytes_per_param);
    EXPECT(r.blocks[1].optim_bytes == 8.0 * 816, "fp32 optimizer state is m + v: %g", r.blocks[1].optim_bytes);
    /* every tensor is linked to the ops that make and use it */
    for (int i = 0; i < r.num_tensors; i++) {
        const sched_tensor_t *t = &r.tensors[i];
        EXPECT(t->num_consumers >= 1 || t->kind == SCHED_T_TEMP, "%s has no consumer", t->name);
        if (t->kind == SCHED_T_GRAD)
            EXPECT(t->producer >= 0 && r.ops[t->producer].phase == SCHED_PHASE_BWD, "%s not produced by a backward op",
                   t->name);
        if (t->kind == SCHED_T_ACT && t->block > 0)
            EXPECT(t->producer >= 0 && r.ops[t->producer].phase == SCHED_PHASE_FWD, "%s not produced by a forward op",
                   t->name);
        if (t->kind == SCHED_T_WEIGHT) EXPECT(t->producer == -1, "%s: weights are loaded", t->name);
    }
    EXPECT(strcmp(r.tensors[0].name, "model.embed_tokens.weight") == 0, "first tensor %s", r.tensors[0].name);
    bool found = false;
    for (int i = 0; i < r.num_tensors; i++)
        found |= strcmp(r.tensors[i].name, "model.layers.1.block_sparse_moe.experts.3.w2.weight") == 0 &&
                 r.tensors[i].expert == 3 && r.tensors[i].layer == 1 && r.tensors[i].block == 2;
    EXPECT(found, "HF names for Mixtral experts");
    /* FLOPs: the backward of a trained linear is twice its forward */
    double fwd = 0, bwd = 0;
    for (int i = 0; i < r.num_ops; i++)
        if (strcmp(r.ops[i].name, "L0.q_proj.fwd") == 0) fwd = r.ops[i].flops;
        else if (strcmp(r.ops[i].name, "L0.q_proj.bwd") == 0) bwd = r.ops[i].flops;
    EXPECT(fwd == 2.0 * 4 * 8 * 8 && bwd == 2 * fwd, "q_proj flops %g / %g", fwd, bwd);
    sched_registry_free(&r);
}

static void test_real_counts(void) {
    sched_model_desc_t m = mixtral_8x7b();
    sched_run_shape_t s = shape(1, 4096, true);
    sched_registry_t r;
    mt_error_t err = {0};
    mt_status_t st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) {
        /* Mixtral-8x7B: 46,702,792,704 parameters (the checkpoint's tensors) */
        EXPECT(r.params == 46702792704.0, "mixtral params %.0f", r.params);
        EXPECT(r.active_params > 12.8e9 && r.active_params < 13.0e9, "mixtral active %.0f (card: 12.9B)", r.active_params);
        /* fp32 master + m + v: 12 B/param = 560.4 GB (the number) */
        double optim = 0;
        for (int b = 0; b < r.num_blocks; b++) optim += r.blocks[b].optim_bytes;
        EXPECT(fabs(optim - 12.0 * 46702792704.0) < 1, "optimizer bytes %.0f", optim);
        /* 4096 tokens over 8 experts top-2: every expert is hit */
        EXPECT(fabs(r.blocks[1].experts_hit - 8) < 1e-9, "experts hit %g", r.blocks[1].experts_hit);
        sched_registry_free(&r);
    }

    /* LoRA r=8 on q_proj and v_proj: A (8, 4096) + B (4096, 8) + A (8, 4096) + B (1024, 8) per layer */
    s.lora = true;
    s.lora_r = 8;
    s.num_lora_targets = 2;
    snprintf(s.lora_targets[0], sizeof s.lora_targets[0], "q_proj");
    snprintf(s.lora_targets[1], sizeof s.lora_targets[1], "v_proj");
    st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_OK, "%s", err.msg);
    if (st == MT_OK) {
        EXPECT(r.train_params == 32.0 * (32768 + 32768 + 32768 + 8192), "lora trainable %.0f", r.train_params);
        EXPECT(r.params == 46702792704.0, "adapters are not model parameters");
        EXPECT(r.kind_bytes[SCHED_T_MASTER] == 0, "fp32 adapters need no master copy");
        bool named = false;
        for (int i = 0; i < r.num_tensors; i++)
            named |= strcmp(r.tensors[i].name, "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight") == 0;
        EXPECT(named, "PEFT adapter names");
        sched_registry_free(&r);
    }
    snprintf(s.lora_targets[1], sizeof s.lora_targets[1], "gate_proj"); /* Qwen's name; Mixtral says w1 */
    st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "'gate_proj' matches no module"), "unknown target: %s", err.msg);

    /* Qwen3-30B-A3B: 30,532,122,624 parameters; OLMoE-1B-7B: 6,919,161,856 */
    sched_model_desc_t q = {0};
    q.family = SCHED_FAMILY_QWEN3_MOE;
    q.num_layers = 48, q.hidden = 2048, q.heads = 32, q.kv_heads = 4, q.head_dim = 128, q.vocab = 151936;
    q.num_experts = 128, q.top_k = 8, q.expert_inter = 768, q.dense_inter = 6144, q.qk_norm = SCHED_QK_NORM_PER_HEAD;
    for (int l = 0; l < 48; l++) q.layer_is_moe[l] = true;
    s = shape(1, 2048, true);
    st = sched_registry_build(&q, &s, &r, &err);
    EXPECT(st == MT_OK && r.params == 30532122624.0, "qwen3 params %.0f", r.params);
    if (st == MT_OK) {
        /* 2048 tokens, top-8 of 128: 128 * (1 - (120/128)^2048), every expert in practice */
        EXPECT(r.blocks[1].experts_hit > 127.99, "qwen3 experts hit %g", r.blocks[1].experts_hit);
        sched_registry_free(&r);
    }
    sched_model_desc_t o = {0};
    o.family = SCHED_FAMILY_OLMOE;
    o.num_layers = 16, o.hidden = 2048, o.heads = 16, o.kv_heads = 16, o.head_dim = 128, o.vocab = 50304;
    o.num_experts = 64, o.top_k = 8, o.expert_inter = 1024, o.dense_inter = 1024, o.qk_norm = SCHED_QK_NORM_FULL;
    for (int l = 0; l < 16; l++) o.layer_is_moe[l] = true;
    st = sched_registry_build(&o, &s, &r, &err);
    EXPECT(st == MT_OK && r.params == 6919161856.0, "olmoe params %.0f", r.params);
    if (st == MT_OK) sched_registry_free(&r);

    /* tied embeddings: no lm_head tensor */
    m = tiny();
    m.tied_embeddings = true;
    s = shape(1, 4, false);
    st = sched_registry_build(&m, &s, &r, &err);
    EXPECT(st == MT_OK && r.params == 1896 - 128, "tied params %.0f", r.params);
    if (st == MT_OK) sched_registry_free(&r);
}

static void test_errors_and_formula(void) {
    EXPECT(sched_expected_experts_hit(8, 2, 1) == 2.0, "one token hits k experts");
    EXPECT(fabs(sched_expected_experts_hit(64, 8, 2) - 64 * (1 - pow(56.0 / 64, 2))) < 1e-12, "two tokens");
    EXPECT(sched_expected_experts_hit(8, 8, 3) == 8, "k = E");
    sched_model_desc_t m = tiny();
    sched_run_shape_t s = shape(1, 4, false);
    sched_registry_t r;
    mt_error_t err = {0};
    m.kv_heads = 3;
    EXPECT(sched_registry_build(&m, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "kv_heads"), "%s", err.msg);
    m = tiny();
    m.top_k = 5;
    EXPECT(sched_registry_build(&m, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "top_k"), "%s", err.msg);
    m = tiny();
    s.sequence_len = 0;
    EXPECT(sched_registry_build(&m, &s, &r, &err) == MT_ERR_CONFIG && strstr(err.msg, "sequence_len"), "%s", err.msg);
}

int main(void) {
    test_tiny_by_hand();
    test_real_counts();
    test_errors_and_formula();
    if (failures) fprintf(stderr, "registry_test: %d failure(s)\n", failures);
    else printf("registry_test: all passed\n");
    return failures != 0;
}
