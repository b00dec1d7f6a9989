/* Generic lists for the scheduler's tests: the scheduler cannot see the
 * engine's model descriptions, so its tests build a decoder-shaped list
 * from a few sizes here (names in Mixtral's style, every layer sparse).
 * It is a fixture, not a model: the engine's descriptions are tested in
 * engine/model/model_desc_test.c. */
#ifndef MT_SCHEDULER_TESTUTIL_H
#define MT_SCHEDULER_TESTUTIL_H

#include <stdbool.h>

#include "scheduler/costmodel.h"
#include "scheduler/hw.h"
#include "scheduler/registry.h"

typedef struct {
    int num_layers, hidden, heads, kv_heads, head_dim, vocab;
    int num_experts, top_k, expert_inter;
    bool tied_embeddings;
} sched_test_model_t;

/* Fills *out (free with sched_program_free).  Per layer: two norms, q/k/v/o,
 * a router and E experts of three (I, H) / (H, I) matrices; LoRA adapters
 * (fp32) on the shape's targets among q_proj, k_proj, v_proj, o_proj, w1,
 * w2, w3.  Saved activations per layer for n tokens, m = n k rows:
 * input, attn xn, q, k, v, attention out (n H, n H, n qd, n kd, n kd, n qd),
 * rstd and lse (fp32, n and n nh), mid and mlp xn (n H), router logits
 * (fp32, n E), top-k indices (int32, n k), gathered rows and expert outputs
 * (m H each), expert gate and up (m I each). */
void sched_test_program(const sched_test_model_t *m, const sched_run_shape_t *s, sched_program_t *out);

/* What the planner's tests start from: the model's registry and its
 * workload on a hardware profile. */
typedef struct {
    sched_registry_t reg;
    sched_hw_t hw;
    sched_workload_t w;
} sched_test_setup_t;

/* Builds s from the model, the run shape and hw (a loaded profile, copied:
 * a test may change it first).  On failure err says why and nothing needs
 * freeing. */
mt_status_t sched_test_setup(sched_test_setup_t *s, const sched_test_model_t *m, const sched_run_shape_t *sh,
                             const sched_hw_t *hw, mt_error_t *err);
void sched_test_teardown(sched_test_setup_t *s);

#endif
