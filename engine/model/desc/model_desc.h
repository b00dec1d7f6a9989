/* The model description: the one place a model family is described.
 *
 * From a family's description everything else is derived: the parameter
 * list that checkpoint loading and saving, random initialisation and
 * `moetune inspect` walk; the saved activations whose sizes the forward
 * allocates (engine/layers/blocks.c, moe/moe_layer.c through eng_moe_dims) and the
 * executor offloads (engine/exec/step.c); and the generic tensor and op
 * list the scheduler plans from (engine/model/desc/program.c, ops.c).
 *
 * A family is one row of k_families in family.c: its HF names, a
 * function that lists parameters, buffers and per-layer saved activations,
 * and a function that lists the step's ops with their FLOPs and bytes.
 * Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE and GLM-4.5 share the decoder
 * functions and differ in their names table; a family with another layer
 * structure (DeepSeek's MLA attention, gpt-oss's fused experts) writes its
 * own describe function and the half of the decoder's ops walk it replaces
 * (walk.h).  Its config reader is engine/model/hf's and its block code
 * engine/layers' (DeepSeek: mla.c; gpt-oss: gpt_oss.c; GLM-4.5:
 * rope_partial.c); a family described without block code, for `inspect`
 * and `plan` only, has eng_model_desc_trains false and training refuses
 * it.
 *
 * Shapes of saved activations are affine in the micro-batch's token count
 * n: numel = per_token * n + fixed (e.g. q (n, nh*hd): per_token nh*hd;
 * the expert counts (E): fixed E).  Every activation of today's families is
 * of that form, including those laid out (B, nh, T). */
#ifndef MT_ENGINE_MODEL_DESC_H
#define MT_ENGINE_MODEL_DESC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "base/status.h"
#include "engine/model/hf/model_config.h"

/* What a tensor is in its layer, whatever its HF name.  A role a layer
 * holds once goes into the model's layer index (eng_layer_index_t) through
 * one table, engine/model/model.c's k_layer_field: a row per role. */
typedef enum {
    ENG_P_EMBED = 0,     /* model.embed_tokens.weight (V, H) */
    ENG_P_ATTN_NORM,     /* input_layernorm (H) */
    ENG_P_Q, ENG_P_K, ENG_P_V, ENG_P_O, /* (nh*hd, H), (nkv*hd, H), (nkv*hd, H), (H, nh*hd) */
    ENG_P_Q_BIAS, ENG_P_K_BIAS, ENG_P_V_BIAS,
    ENG_P_O_BIAS,        /* Qwen3 / OLMoE with attention_bias: o_proj has a bias too */
    ENG_P_Q_NORM, ENG_P_K_NORM, /* (hd) per head; OLMoE: (nh*hd), (nkv*hd) */
    ENG_P_MLP_NORM,      /* post_attention_layernorm (H) */
    ENG_P_ROUTER,        /* (E, H) */
    ENG_P_EXP_GATE, ENG_P_EXP_UP, ENG_P_EXP_DOWN, /* (I, H), (I, H), (H, I) */
    ENG_P_SHARED_GATE, ENG_P_SHARED_UP, ENG_P_SHARED_DOWN, /* (Is, H), (Is, H), (H, Is) */
    ENG_P_SHARED_EXPERT_GATE, /* (1, H) */
    ENG_P_DENSE_GATE, ENG_P_DENSE_UP, ENG_P_DENSE_DOWN, /* Qwen dense layers */
    ENG_P_FINAL_NORM,    /* model.norm.weight (H) */
    ENG_P_LM_HEAD,       /* lm_head.weight (V, H); absent when tied */
    ENG_P_ROUTER_BIAS,   /* a router's score correction bias (E): a buffer, never trained */
    /* MLA (DeepSeek-V2/V3): q through a low-rank latent, k and v from one
     * compressed latent shared by all heads plus a rotary key part */
    ENG_P_Q_A,           /* q_a_proj (q_lora_rank, H) */
    ENG_P_Q_A_NORM,      /* q_a_layernorm (q_lora_rank) */
    ENG_P_Q_B,           /* q_b_proj (nh*(qk_nope+qk_rope), q_lora_rank) */
    ENG_P_KV_A,          /* kv_a_proj_with_mqa (kv_lora_rank + qk_rope, H) */
    ENG_P_KV_A_NORM,     /* kv_a_layernorm (kv_lora_rank) */
    ENG_P_KV_B,          /* kv_b_proj (nh*(qk_nope + v_head), kv_lora_rank) */
    /* gpt-oss */
    ENG_P_ATTN_SINKS,    /* self_attn.sinks (nh) */
    ENG_P_ROUTER_B,      /* mlp.router.bias (E): trained, unlike ENG_P_ROUTER_BIAS */
    ENG_P_EXP_GATE_UP_FUSED, /* experts.gate_up_proj (E, H, 2I): gate and up interleaved in the last dim */
    ENG_P_EXP_GATE_UP_BIAS,  /* experts.gate_up_proj_bias (E, 2I) */
    ENG_P_EXP_DOWN_FUSED,    /* experts.down_proj (E, I, H) */
    ENG_P_EXP_DOWN_BIAS,     /* experts.down_proj_bias (E, H) */
    /* A LoRA run's adapter factors (engine/model/lora_model.h): not in the base
     * description, added by the run beside the module they adapt */
    ENG_P_LORA_A,        /* (r, in) */
    ENG_P_LORA_B,        /* (out, r) */
    ENG_P_ROLE_COUNT,
} eng_param_role_t;

/* A parameter is trained (or frozen by the run); a buffer is checkpoint
 * state the model reads but no optimizer touches (DeepSeek-V3's and
 * GLM-4.5's e_score_correction_bias).  The trained families have none. */
typedef enum { ENG_TENSOR_PARAM = 0, ENG_TENSOR_BUFFER } eng_tensor_kind_t;

typedef struct {
    char name[128];      /* HF name */
    eng_param_role_t role;
    eng_tensor_kind_t kind;
    int layer;           /* -1 for embed / final norm / lm_head */
    int expert;          /* -1 unless a routed expert tensor */
    int ndim;
    int64_t shape[3];    /* 3-D only for experts fused over E (gpt-oss) */
    size_t numel;
    mt_dtype_t dtype;    /* storage dtype: config.json's dtype, or the checkpoint's once known
                          * (eng_model_desc_note_dtype) */
    bool trainable;      /* full fine-tuning trains it (parameters yes, buffers no) */
    eng_param_role_t adapts; /* ENG_P_LORA_A / _B: the role of the module the factor adapts */
} eng_param_spec_t;

/* What a saved activation's elements are stored as. */
typedef enum {
    /* the compute dtype (bf16 in a bf16 run): activations that nothing but
     * products reads (the tensor-core attention included), which round
     * their operands to the compute dtype anyway, so storing them rounded
     * changes no result; and the routed experts' gate/up/down outputs,
     * which their products write in bf16 as autocast's linear layers do
     * (moe/moe_experts.c) */
    ENG_ACT_COMPUTE = 0,
    /* fp32 always: what fp32 kernels read (residuals, attention's q/k/v and
     * output where the fp32 attention kernel runs, the dense and shared
     * MLPs' SwiGLU inputs, the router's input), norm rstd, logsumexp,
     * router logits and probabilities */
    ENG_ACT_FP32,
    ENG_ACT_INT32,       /* routing indices and counts */
} eng_act_class_t;

/* Every saved activation a decoder layer may have.  The layers map ids to
 * the fields that hold them (engine/layers/acts.c); a family lists the ids
 * its layers save. */
typedef enum {
    ENG_A_X_MID = 0,     /* (n, H) residual after attention */
    ENG_A_ATTN_XN, ENG_A_ATTN_RSTD, /* (n, H), (n) */
    ENG_A_Q, ENG_A_K, ENG_A_V,      /* (n, nh*hd), (n, nkv*hd) x2 after q/k norm and RoPE */
    ENG_A_Q_PRE, ENG_A_K_PRE,       /* before the q/k norm */
    ENG_A_Q_RSTD, ENG_A_K_RSTD,     /* (n*nh), (n*nkv); OLMoE (n) */
    ENG_A_ATT, ENG_A_LSE,           /* (n, nh*hd), (B, nh, T) */
    ENG_A_MLP_XN, ENG_A_MLP_RSTD,   /* (n, H), (n) */
    ENG_A_DENSE_G, ENG_A_DENSE_U,   /* (n, Id) */
    ENG_A_ROUTER_LOGITS, ENG_A_ROUTER_PROBS, /* (n, E) */
    ENG_A_TOPW, ENG_A_TOPK_IDX,     /* (n, k) */
    ENG_A_EXPERT_COUNTS, ENG_A_EXPERT_OFFSETS, /* (E), (E + 1) */
    ENG_A_PERM, ENG_A_INV_PERM,     /* (n*k) */
    ENG_A_EXPERT_X,                 /* (n*k, H) gathered inputs */
    ENG_A_EXPERT_G, ENG_A_EXPERT_U, /* (n*k, I) */
    ENG_A_EXPERT_OUT,               /* (n*k, H) */
    ENG_A_SHARED_G, ENG_A_SHARED_U, /* (n, Is) */
    ENG_A_SHARED_OUT,               /* (n, H) */
    ENG_A_SHARED_GATE_LOGIT,        /* (n) */
    ENG_ACT_COUNT,
} eng_act_id_t;

typedef struct {
    eng_act_id_t id;
    const char *name;    /* e.g. "attn.q" (static storage) */
    eng_act_class_t cls;
    int64_t per_token;   /* numel = per_token * n + fixed */
    int64_t fixed;
} eng_act_desc_t;

/* One layer's saved activations, in the order the forward allocates them. */
typedef struct {
    eng_act_desc_t act[ENG_ACT_COUNT];
    int count;
    int8_t index[ENG_ACT_COUNT]; /* position in act[], -1 when this layer does not save it */
} eng_layer_acts_t;

typedef struct eng_family eng_family_t;

typedef struct {
    const eng_family_t *family;
    eng_param_spec_t *params;    /* HF module order (the order checkpoints are saved in) */
    int count;
    eng_param_spec_t *buffers;   /* non-trainable checkpoint state, kind ENG_TENSOR_BUFFER */
    int num_buffers;
    eng_layer_acts_t *layer_acts; /* (num_layers) */
    int num_layers;
    /* index of each (layer, role[, expert]) in params, -1 if absent:
     * role_at[(layer + 1) * ENG_P_ROLE_COUNT + role] (layer -1 = outside the layers),
     * expert_at[(layer * 3 + r) * E + e] for r = gate, up, down */
    int *role_at;
    int *expert_at;
    int num_experts;
} eng_model_desc_t;

mt_status_t eng_model_desc_build(const eng_model_config_t *cfg, eng_model_desc_t *out, mt_error_t *err);
void eng_model_desc_free(eng_model_desc_t *d);
/* The family's display name ("Mixtral") and its expert FFN's HF leaf names. */
const char *eng_model_desc_family_name(const eng_model_desc_t *d);

/* Index of the parameter (or -1) by name, or by where it sits. */
int eng_model_desc_find(const eng_model_desc_t *d, const char *name);
int eng_model_desc_find_role(const eng_model_desc_t *d, int layer, eng_param_role_t role, int expert);
/* Records the storage dtype a checkpoint holds a tensor in (params or buffers). */
void eng_model_desc_note_dtype(eng_model_desc_t *d, const char *name, mt_dtype_t dtype);

/* Saved activations of layer l: NULL when the layer does not save `id`. */
const eng_act_desc_t *eng_model_desc_act(const eng_model_desc_t *d, int layer, eng_act_id_t id);
/* Elements of a saved activation for n tokens. */
size_t eng_act_numel(const eng_act_desc_t *a, int64_t n);
/* The stored dtype of a class, given the run's compute storage dtype. */
/* The dtype of a parameter's device working copy in a run whose products
 * are formed in `compute`: bf16 in a bf16 run for the matrices only
 * products read (every 2-D weight but the embedding table, whose rows are
 * gathered, and the router, whose products stay fp32); fp32 otherwise.
 * The executor allocates and the planner counts by this one rule. */
mt_dtype_t eng_param_working_dtype(const eng_param_spec_t *p, mt_dtype_t compute);
mt_dtype_t eng_act_dtype(eng_act_class_t cls, mt_dtype_t compute);
/* Bytes of layer l's saved activations for n tokens, each buffer rounded up
 * to `align` (the device arena's block size; 1 for raw bytes). */
size_t eng_model_desc_layer_act_bytes(const eng_model_desc_t *d, int layer, int64_t n, mt_dtype_t compute,
                                      size_t align);

const char *eng_param_role_name(eng_param_role_t role);
size_t eng_model_desc_numel(const eng_model_desc_t *d);
/* Parameters a token touches: everything but the experts it was not routed
 * to (k/E of the routed experts' tensors, per-expert or fused).  The
 * embedding table and lm_head count whole, as most model cards count them. */
size_t eng_model_desc_active_numel(const eng_model_desc_t *d, const eng_model_config_t *cfg);
/* A tensor holding every routed expert of its layer (gpt-oss's fused experts). */
bool eng_param_role_fused_experts(eng_param_role_t role);
/* Whether the family has block code: false for the families described for
 * `inspect` and `plan` only, which training refuses. */
bool eng_model_desc_trains(const eng_model_desc_t *d);

/* The head in chunks.  A micro-batch's fp32 logits are tokens x vocab
 * (4096 x 151936 for Qwen3: 2.3 GiB, and as much again as d(logits)):
 * above ENG_HEAD_LOGITS_BYTES the lm_head and the loss run over chunks of
 * rows whose logits fit in it.  The forward then keeps no logits (each
 * chunk's loss is taken and the chunk dropped) and the backward computes
 * each chunk's logits again, turns them into d(logits) and takes the
 * chunk's share of d(x) and of the head's gradient: one more product of
 * the head's size for a head's memory that no longer grows with the
 * vocabulary.  Below it, one chunk: the head as it always ran. */
#define ENG_HEAD_LOGITS_BYTES ((size_t)64 << 20)

/* ENG_HEAD_LOGITS_BYTES, or MOETUNE_HEAD_LOGITS_BYTES when set to a
 * positive number of bytes (the tests run the reference models in chunks
 * of a few rows with it). */
static inline size_t eng_head_logits_bytes(void) {
    const char *env = getenv("MOETUNE_HEAD_LOGITS_BYTES");
    char *end = NULL;
    const unsigned long long v = env && *env ? strtoull(env, &end, 10) : 0;
    return v > 0 && end && *end == '\0' ? (size_t)v : ENG_HEAD_LOGITS_BYTES;
}

static inline int64_t eng_head_chunk_rows(int64_t vocab, int64_t rows) {
    const int64_t fit = (int64_t)(eng_head_logits_bytes() / sizeof(float)) / (vocab > 0 ? vocab : 1);
    return rows <= fit ? rows : fit > 0 ? fit : 1;
}

#endif
