/* The tensor registry: every tensor of one training step and every op that
 * produces or consumes one, with bytes and FLOPs, from the engine's generic
 * list and a run shape alone (no checkpoint, no device).
 *
 * Design notes:
 * - The scheduler does not include engine headers (layering: engine ->
 *   scheduler -> kernels) and knows no model family: the engine gives it a
 *   generic list of blocks, tensors and ops (sched_program_t), filled from
 *   its model description (engine/model/desc/model_desc.h) by engine/model/desc/program.c.
 * - Blocks are the unit the plan decides on (scheduler/plan.h): block 0 is
 *   the embedding, 1..L the decoder layers, L+1 the final norm and lm_head.
 *   Every tensor and op belongs to one block.
 * - Tensors: the working copy of each parameter (kind WEIGHT, HF name; bf16
 *   when the run keeps bf16 working copies, fp32 otherwise), its fp32
 *   master copy (only with bf16 working copies), gradient, Adam m and v
 *   (only trainable parameters: all of them in full fine-tuning, the LoRA
 *   A/B matrices with an adapter), the saved activations of each block
 *   (what the forward keeps for the backward, as the engine's description
 *   lists them) and the temporaries of each block (buffers that live only
 *   while the block computes).
 * - Gradients are fp32 whatever the working dtype: they are summed over
 *   micro-batches, and AdamW reads fp32 gradients.  This is the dominant
 *   choice in mixed-precision trainers and keeps host accumulation exact.
 * - Routed experts: a micro-batch of n tokens with top-k routing over E
 *   experts touches on average E * (1 - (1 - k/E)^n) distinct experts
 *   (uniform routing).  Expert weights are read (and fetched, when
 *   streamed) only for those; expert GEMM FLOPs do not depend on the
 *   routing (n * k rows in total).
 * - Per-block aggregates (sched_block_info_t) are what the cost model and
 *   simulator use; the tensor and op lists are the detailed view (names,
 *   producers, consumers) for reports and the executor. */
#ifndef MT_SCHEDULER_REGISTRY_H
#define MT_SCHEDULER_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/dtype.h"
#include "base/status.h"

#define SCHED_MAX_LAYERS 256
#define SCHED_MAX_LORA_TARGETS 32
#define SCHED_MAX_CONSUMERS 4

/* One optimizer step's shape. */
typedef struct {
    int micro_batch_size;   /* B */
    int sequence_len;       /* T */
    int grad_accum;         /* micro-batches per optimizer step */
    bool bf16;              /* bf16 working copies (weights, activations) + fp32 master */
    bool lora;              /* adapter: lora (base weights frozen) */
    int lora_r;
    /* PEFT target_modules semantics: a module is targeted when its name's
     * last component equals an entry ("q_proj", "w1", "gate" = router),
     * or the entry is "all-linear" (every linear but lm_head). */
    char lora_targets[SCHED_MAX_LORA_TARGETS][128];
    int num_lora_targets;
    double max_grad_norm;   /* 0 = no clipping */
    bool speculative_optimizer; /* scheduler.speculative_optimizer: with clipping, host AdamW still
                                   overlaps the backward (engine/optim/speculate.h) */
    bool packed_segments;   /* sample_packing: rows hold several examples (attention masks by segment) */
} sched_run_shape_t;

typedef enum {
    SCHED_T_WEIGHT = 0, /* the working copy compute reads (HF name) */
    SCHED_T_MASTER,     /* fp32 master copy (bf16 working copies only) */
    SCHED_T_GRAD,       /* fp32 gradient */
    SCHED_T_ADAM_M,
    SCHED_T_ADAM_V,
    SCHED_T_ACT,        /* saved for the backward */
    SCHED_T_TEMP,       /* lives while its block computes */
    SCHED_T_KIND_COUNT,
} sched_tensor_kind_t;

typedef enum { SCHED_PHASE_FWD = 0, SCHED_PHASE_BWD, SCHED_PHASE_OPTIM } sched_phase_t;

typedef struct {
    int id;
    char name[112];      /* HF name for weights ("...#master", "#grad", "#adam_m" suffixes for derived) */
    sched_tensor_kind_t kind;
    int block;           /* 0 = embedding, 1..L = layers, L+1 = head */
    int layer;           /* HF layer index, -1 for embedding / head */
    int expert;          /* routed expert index, -1 otherwise */
    mt_dtype_t dtype;
    int64_t numel;
    size_t bytes;
    bool trainable;      /* WEIGHT only: receives a gradient */
    int producer;        /* op id; -1 = loaded from the checkpoint / initialised */
    int consumers[SCHED_MAX_CONSUMERS];
    int num_consumers;
} sched_tensor_t;

typedef struct {
    int id;
    char name[64];       /* e.g. "L3.q_proj.fwd" */
    int block;
    sched_phase_t phase;
    bool matmul;         /* runs at the matmul rate; else an elementwise-class op */
    bool attention;      /* the attention core: at the profile's attention rate of its path and direction */
    bool attention_tc;   /* ... and the tensor-core path takes its shape (bf16 compute, head dim a
                            multiple of 8 up to 256, heads a multiple of kv heads, no packed
                            segments: kernels/attention.h); else the fp32 kernel runs it */
    double flops;
    double bytes;        /* device memory traffic (reads + writes) */
} sched_op_t;

/* ---- the generic list the engine gives ---------------------------------------
 *
 * A model's step as the scheduler sees it, knowing no model family: blocks
 * with the routing facts that size expert traffic, the tensors of each
 * block (working copies of weights, saved activations, temporaries) and
 * the ops of each block with their FLOPs and bytes.  The engine fills it
 * from its model description (engine/model/desc/program.c); the registry derives the
 * rest (master copies, gradients, Adam state, the optimizer op, per-block
 * aggregates).  Tensors and ops are listed block by block, blocks in
 * ascending order; consumers and producers are indices into ops. */
typedef struct {
    char name[112];
    sched_tensor_kind_t kind; /* WEIGHT, ACT or TEMP */
    int block;
    int layer;                /* HF layer, -1 outside the decoder layers */
    int expert;               /* routed expert index, -1 otherwise */
    mt_dtype_t dtype;         /* as stored: the run's working / compute dtype already applied */
    int64_t numel;
    bool trainable;           /* WEIGHT: receives a gradient and optimizer state */
    bool adapter;             /* WEIGHT: a LoRA adapter (not counted as a model parameter) */
    sched_phase_t phase;      /* TEMP: the pass it lives in */
    int group;                /* TEMP: temporaries of one group of a block are alive together;
                               * the block's peak is its largest group */
    int producer;             /* op; -1 = loaded from the checkpoint / the batch */
    int consumers[SCHED_MAX_CONSUMERS];
    int num_consumers;
} sched_prog_tensor_t;

typedef struct {
    int layer;                /* HF layer, -1 for the embedding / head */
    bool is_moe;              /* routed experts: expected experts hit from num_experts and top_k */
    int num_experts, top_k;
    double act_input_bytes;   /* what RECOMPUTE keeps: the block input */
    double bwd_stream_bytes;  /* the gradient stream alive through the block's backward */
} sched_prog_block_t;

typedef struct {
    sched_prog_block_t *blocks; /* 0 = embedding, 1..L = layers, last = head */
    int num_blocks;
    sched_prog_tensor_t *tensors;
    int num_tensors, cap_tensors;
    sched_op_t *ops;          /* id = index */
    int num_ops, cap_ops;
    bool tied_head;           /* the head reads the embedding's weight (no tensor of its own) */
} sched_program_t;

void sched_program_init(sched_program_t *p, int num_blocks);
void sched_program_free(sched_program_t *p);
/* Appends an op to block `block`; returns its index. */
int sched_program_add_op(sched_program_t *p, int block, sched_phase_t phase, bool matmul, double flops,
                         double bytes, const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* Appends a tensor (consumers empty); returns its index. */
int sched_program_add_tensor(sched_program_t *p, const sched_prog_tensor_t *t);
/* Adds op to tensor t's consumers (ignored when op < 0, already listed, or full). */
void sched_program_add_consumer(sched_program_t *p, int t, int op);

/* What the cost model and simulator need of one block. */
typedef struct {
    int layer;               /* HF layer, -1 for embedding / head */
    bool is_moe;
    int num_experts, top_k;  /* routing (MoE blocks): what splitting the experts between devices changes */
    double tokens_mb;        /* tokens of one micro-batch (B * T) */
    /* weights (working copies) */
    double w_bytes;          /* all of the block's weights: the resident footprint */
    double w_dense_bytes;    /* everything but routed experts */
    double w_expert_bytes;   /* one routed expert's tensors */
    double experts_hit;      /* expected distinct experts per micro-batch */
    double experts_hit_step; /* expected over the step's micro-batches */
    double w_fetch_bytes;    /* one fetch when streamed: dense + experts_hit experts */
    double params;           /* parameter count (base weights; LoRA adapters not included) */
    /* trainable state (LoRA: the adapters only) */
    double train_params;     /* trainable parameters */
    double train_params_step;/* of those, expected to receive a gradient in a step */
    double train_params_mb;  /* ... in one micro-batch */
    double grad_bytes;       /* fp32 gradients of all trainable parameters */
    double optim_bytes;      /* master (bf16 runs) + m + v */
    double adam_bytes_per_param; /* 28 (fp32 p, g, m, v read; p, m, v written) + 2 with a bf16 copy */
    double train_w_bytes_step;   /* working-copy bytes of the trainable tensors updated in a step */
    double train_fp32_params;    /* trainable params whose working copy is the fp32 master itself */
    double train_work_bytes;     /* bytes of the trainable tensors' working copies kept beside an fp32
                                    master (bf16 runs): what a pinned home holds */
    double train_expert_params;  /* trainable params of one routed expert */
    double train_expert_w_bytes; /* ... their working-copy bytes */
    /* tensor counts: one copy each when moved (per-copy latency) */
    int w_dense_tensors, w_expert_tensors; /* expert: tensors of one routed expert */
    int train_dense_tensors, train_expert_tensors;
    int act_tensors;
    /* activations */
    double act_saved_bytes;  /* KEEP / OFFLOAD footprint, the block input included */
    double act_input_bytes;  /* what RECOMPUTE keeps: the block input */
    double fwd_temp_bytes;   /* peak of temporaries while the forward runs */
    double bwd_temp_bytes;   /* ... while the backward runs (the gradient stream included) */
    /* ops */
    int first_op, num_ops;
    double fwd_flops, bwd_flops;
} sched_block_info_t;

typedef struct {
    sched_run_shape_t shape;
    bool tied_head;          /* the head reads the embedding's weight */
    int num_blocks;          /* L + 2 */
    sched_block_info_t *blocks;
    sched_tensor_t *tensors;
    int num_tensors;
    sched_op_t *ops;
    int num_ops;
    /* totals */
    double params;           /* base parameters (HF count) */
    double active_params;    /* per token: all but the routed experts it is not sent to */
    double train_params;     /* trainable (LoRA: adapters) */
    double tokens_per_step;  /* B * T * grad_accum */
    double model_flops;      /* one step's useful FLOPs: forward + backward, no recomputation */
    double kind_bytes[SCHED_T_KIND_COUNT]; /* sum of bytes per tensor kind */
} sched_registry_t;

/* Builds the registry from the engine's list.  Errors (MT_ERR_CONFIG) name
 * the field: a run shape that is not positive, blocks or ops out of order,
 * an op index out of range.  The list has the run shape applied already
 * (bf16 working copies, LoRA adapters); the registry takes the shape's
 * bf16 flag for the optimizer's bytes and its batch for experts hit. */
mt_status_t sched_registry_build(const sched_program_t *prog, const sched_run_shape_t *shape,
                                 sched_registry_t *out, mt_error_t *err);
void sched_registry_free(sched_registry_t *reg);

/* Model FLOPs per trained token, as MFU counts them: three times the
 * forward products of one micro-batch (the backward's two products per
 * forward one), over its B * T tokens; recomputation is not counted, and
 * elementwise ops (norms, softmax, SwiGLU, the loss) are not products.
 * The forward products, per token, are the ones the engine describes
 * (engine/model/desc/ops.c): 2 in out for every linear layer a token passes
 * through (the attention projections, the router, its top-k experts' three
 * products, shared experts, lm_head) and the attention core's score and
 * value products over the causal pairs, per layer
 *     2 * 2 * T_avg * n_heads * head_dim,   T_avg = (T + 1) / 2
 * (a query at position t attends t + 1 keys; a sliding window caps it).
 * LoRA adapters' products count when the run is LoRA.  Also used to judge
 * a plan's step time against the device's peak (`moetune bench step`). */
double sched_registry_model_flops_per_token(const sched_registry_t *reg);

const char *sched_tensor_kind_name(sched_tensor_kind_t k);
/* "embed", "layer 3", "head" */
void sched_block_label(const sched_registry_t *reg, int block, char *buf, size_t cap);
/* Expected distinct experts hit by `tokens` tokens with top-k of E (uniform routing). */
double sched_expected_experts_hit(int num_experts, int top_k, double tokens);

#endif
