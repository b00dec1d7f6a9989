/* The decoder walk (internal to the model description): the state and
 * helpers ops.c lists a step's tensors and ops with, shared by the
 * families that replace one half of a layer (DeepSeek's MLA attention,
 * mla.c; gpt-oss's fused experts, gpt_oss.c) so that
 * every family's ops are counted by the same rules. */
#ifndef MT_ENGINE_MODEL_DESC_WALK_H
#define MT_ENGINE_MODEL_DESC_WALK_H

#include "engine/model/desc/family.h"

struct eng_walk {
    sched_program_t *p;
    const eng_family_t *f;
    const eng_model_desc_t *d;
    const eng_model_config_t *cfg;
    const sched_run_shape_t *s;
    mt_dtype_t wdt, adt;    /* working copies, compute-class activations */
    double wb, ab;          /* their sizes in bytes */
    double n, B, T;         /* tokens per micro-batch, batch, sequence */
    int block, layer, group;
    double experts_hit;     /* expected distinct experts per micro-batch in this block */
    int prev_out_op;        /* op that produced the block input */
    bool *target_hit;       /* (num_lora_targets) */
};

int eng_walk_add_op(eng_walk_t *w, sched_phase_t phase, bool matmul, double flops, double bytes, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* A weight's working copy under `name` (any dtype, numel), read by fwd_op and bwd_op. */
void eng_walk_add_weight_as(eng_walk_t *w, const char *name, mt_dtype_t dt, double numel, int expert, bool trainable,
                            bool adapter, int fwd_op, int bwd_op);
/* The layer's parameter of `role` (it must exist; expert -1 unless routed). */
const eng_param_spec_t *eng_walk_param(eng_walk_t *w, eng_param_role_t role, int expert);
bool eng_walk_has_param(eng_walk_t *w, eng_param_role_t role);
/* The layer's parameter of `role` as a weight of fwd_op / bwd_op. */
void eng_walk_add_param(eng_walk_t *w, eng_param_role_t role, int fwd_op, int bwd_op);
int eng_walk_add_act(eng_walk_t *w, const char *name, mt_dtype_t dt, double numel, int producer, int consumer);
/* A saved activation of the description's layer list (-1 when the layer does not save it). */
int eng_walk_act(eng_walk_t *w, eng_act_id_t id, int producer, int consumer);
void eng_walk_add_temp(eng_walk_t *w, sched_phase_t phase, const char *name, mt_dtype_t dt, double numel, int op);
/* y = x W^T (+ bias) over `rows` rows (see ops.c); returns the forward op, *bwd_out the backward. */
int eng_walk_linear(eng_walk_t *w, const char *label, double rows, eng_param_role_t role, eng_param_role_t bias_role,
                    int experts, int *bwd_out);
int eng_walk_elementwise(eng_walk_t *w, sched_phase_t phase, const char *label, double elems, double bytes);
/* Causal (query, key) pairs per sequence of T tokens under a window (0 = none). */
double eng_walk_attn_pairs(double T, int window);
/* Marks fwd_op and bwd_op as the attention core of nh query heads over nkv
 * kv heads of width hd, and whether the tensor-core path takes that shape. */
void eng_walk_attention_core(eng_walk_t *w, int fwd_op, int bwd_op, int nh, int nkv, int hd);
/* The window of the walk's layer (0 = full causal). */
int eng_walk_window(const eng_walk_t *w);
/* The attention half's start: block input, input norm; returns the normed
 * input's activation, *norm_bwd the norm's backward op. */
int eng_walk_attn_input(eng_walk_t *w, int *norm_bwd);

#endif
