/* The kernel table: every op of the step program, forward and backward.
 *
 * Each op family has its own header (gemm.h, norm.h, rope.h, attention.h,
 * elementwise.h, embedding.h, moe_ops.h, loss.h, adamw.h) declaring a CPU
 * twin `kern_X_cpu` and a CUDA twin `kern_X_cuda` with the same signature
 * and semantics.  A backend fills this table with one or the other; the
 * engine calls only through dev->ops.
 *
 * Conventions for every op:
 *  - all tensor pointers are device pointers, fp32 unless the type says
 *    otherwise, row-major and contiguous; shapes are written (A, B, C);
 *  - outputs named d* for gradients: "overwrite" or "accumulate (+=)" is
 *    stated per op, because the engine relies on it;
 *  - results are deterministic: the same inputs give bit-identical outputs
 *    run to run on one backend (no atomics whose order varies). */
#ifndef MT_KERNELS_OPS_H
#define MT_KERNELS_OPS_H

#include "kernels/adamw.h"
#include "kernels/attention.h"
#include "kernels/copy4d.h"
#include "kernels/dequant.h"
#include "kernels/elementwise.h"
#include "kernels/embedding.h"
#include "kernels/gemm.h"
#include "kernels/gpt_oss.h"
#include "kernels/loss.h"
#include "kernels/moe_ops.h"
#include "kernels/norm.h"
#include "kernels/rope.h"
#include "kernels/router_group.h"

typedef struct kern_ops kern_ops_t;

struct kern_ops {
    kern_mm_fn mm; /* matrix products, fp32 or bf16 compute (gemm.h) */
    kern_mm_grouped_fn mm_grouped;
    kern_rmsnorm_fwd_fn rmsnorm_fwd;
    kern_rmsnorm_bwd_fn rmsnorm_bwd;
    kern_rope_fn rope_fwd;
    kern_rope_fn rope_bwd;
    kern_attention_fwd_fn attention_fwd;
    kern_attention_bwd_fn attention_bwd;
    /* bf16 tensor-core attention (attention.h): false = not handled, run the two above */
    kern_attention_fwd_tc_fn attention_fwd_tc;
    kern_attention_bwd_tc_fn attention_bwd_tc;
    kern_add_fn add;
    kern_axpy_fn axpy;
    kern_scale_fn scale;
    kern_bias_fwd_fn bias_fwd;
    kern_bias_bwd_fn bias_bwd;
    kern_swiglu_fwd_fn swiglu_fwd;
    kern_swiglu_bwd_fn swiglu_bwd;
    kern_clamp_fwd_fn clamp_fwd;
    kern_clamp_bwd_fn clamp_bwd;
    kern_sumsq_fn sumsq;
    kern_sumsq_many_fn sumsq_many;
    kern_add_bf16_many_fn add_bf16_many;
    kern_zero_many_fn zero_many;
    kern_f32_to_bf16_fn f32_to_bf16;
    kern_bf16_to_f32_fn bf16_to_f32;
    kern_dropout_fn dropout;
    kern_embedding_fwd_fn embedding_fwd;
    kern_embedding_bwd_fn embedding_bwd;
    kern_router_fwd_fn router_fwd;
    kern_router_bwd_fn router_bwd;
    kern_router_group_fwd_fn router_group_fwd; /* DeepSeek-V3 / GLM-4.5 (router_group.h) */
    kern_router_group_bwd_fn router_group_bwd;
    kern_copy4d_fn copy4d; /* MLA's head splits and broadcasts (copy4d.h) */
    kern_moe_plan_fn moe_plan;
    kern_moe_gather_fn moe_gather;
    kern_moe_unpermute_sum_fn moe_unpermute_sum;
    kern_moe_combine_bwd_fn moe_combine_bwd;
    kern_gate_scale_fwd_fn gate_scale_fwd;
    kern_gate_scale_bwd_fn gate_scale_bwd;
    kern_xent_fn xent;
    /* gpt-oss (gpt_oss.h) */
    kern_attn_sink_fwd_fn attn_sink_fwd;
    kern_attn_sink_bwd_fn attn_sink_bwd;
    kern_swiglu_clamped_fwd_fn swiglu_clamped_fwd;
    kern_swiglu_clamped_bwd_fn swiglu_clamped_bwd;
    kern_expert_bias_fwd_fn expert_bias_fwd;
    kern_expert_bias_bwd_fn expert_bias_bwd;
    kern_adamw_fn adamw;
    kern_adamw_many_fn adamw_many;
    kern_dequant_fn dequant; /* quantised frozen weights -> working copy (dequant.h) */
    /* SwiGLU over bf16 g, u, h (the routed experts in a bf16 run; elementwise.h) */
    kern_swiglu_fwd_bf16_fn swiglu_fwd_bf16;
    kern_swiglu_bwd_bf16_fn swiglu_bwd_bf16;
    /* the combine and its backward over bf16 expert outputs (moe_ops.h) */
    kern_moe_unpermute_sum_bf16_fn moe_unpermute_sum_bf16;
    kern_moe_combine_bwd_bf16_fn moe_combine_bwd_bf16;
};

extern const kern_ops_t kern_ops_cpu;
/* Defined only when the CUDA backend is linked. */
extern const kern_ops_t kern_ops_cuda;

#endif
