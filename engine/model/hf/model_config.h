/* A model's architecture, read from HF config.json (plus run-config
 * overrides). Only what moetune needs; the raw JSON is kept so that saved
 * checkpoints carry the original config.json unchanged. */
#ifndef MT_ENGINE_MODEL_CONFIG_H
#define MT_ENGINE_MODEL_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "base/status.h"

#define ENG_MAX_LAYERS 256

typedef enum {
    ENG_ARCH_MIXTRAL = 0,
    ENG_ARCH_QWEN2_MOE,
    ENG_ARCH_QWEN3_MOE,
    ENG_ARCH_OLMOE,
    /* DeepSeek's MLA (engine/layers/mla.c) and, with GLM-4.5, the grouped
     * routers (kernels/router_group.h) */
    ENG_ARCH_DEEPSEEK_V2,
    ENG_ARCH_DEEPSEEK_V3,
    ENG_ARCH_GLM4_MOE,
    ENG_ARCH_GPT_OSS, /* trained: its block code is engine/layers/gpt_oss.c */
} eng_arch_t;

/* How the router turns logits into expert weights (DeepSeek's
 * scoring_func / topk_method; gpt-oss's top-k-then-softmax). */
typedef enum {
    ENG_ROUTE_SOFTMAX = 0,        /* softmax over all experts, top-k (Mixtral, Qwen, OLMoE, DeepSeek-V2 greedy) */
    ENG_ROUTE_SOFTMAX_GROUP,      /* DeepSeek-V2 group_limited_greedy: top-k inside the topk_group best groups */
    ENG_ROUTE_SIGMOID_GROUP_BIAS, /* DeepSeek-V3 / GLM-4.5 noaux_tc: sigmoid scores, groups and top-k chosen on
                                     score + e_score_correction_bias, weights from the unbiased scores */
    ENG_ROUTE_TOPK_SOFTMAX,       /* gpt-oss: top-k of the logits (router has a bias), softmax over those k */
} eng_route_t;

/* (tagged so that read.h can name it without including this header) */
typedef struct eng_model_config {
    eng_arch_t arch;
    char model_type[32];          /* as in config.json */
    int vocab_size;
    int hidden_size;              /* H */
    int intermediate_size;        /* dense MLP width (Qwen dense layers); Mixtral: expert width */
    int moe_intermediate_size;    /* expert width I (Mixtral: = intermediate_size) */
    int shared_expert_intermediate_size; /* Qwen2-MoE; 0 = no shared expert */
    int num_hidden_layers;        /* L */
    int num_attention_heads;      /* nh */
    int num_key_value_heads;      /* nkv */
    int head_dim;                 /* hd: config's head_dim, else H / nh */
    int num_experts;              /* E (Mixtral: num_local_experts) */
    int num_experts_per_tok;      /* k */
    bool norm_topk_prob;          /* Mixtral: always true */
    bool qkv_bias;                /* Qwen2-MoE: true; Qwen3: attention_bias */
    bool qk_norm;                 /* Qwen3: per-head RMSNorm on q and k; OLMoE: see qk_norm_whole */
    bool qk_norm_whole;           /* OLMoE: the norm spans the whole q / k projection, weights
                                     (nh*hd) and (nkv*hd), applied before splitting into heads */
    float clip_qkv;               /* OLMoE: q, k, v clamped to [-clip_qkv, clip_qkv] after the q/k
                                     norm, before RoPE; 0 = no clamp (clip_qkv: null) */
    bool tie_word_embeddings;
    bool output_router_logits;    /* aux loss added to the loss when true */
    float router_aux_loss_coef;
    float rope_theta;
    float rms_norm_eps;
    int sliding_window;           /* 0 = full causal attention */
    int max_position_embeddings;
    bool layer_is_moe[ENG_MAX_LAYERS]; /* from decoder_sparse_step / mlp_only_layers; DeepSeek/GLM:
                                          first_k_dense_replace, moe_layer_freq */
    /* gpt-oss: layers whose layer_types entry is full_attention ignore
     * sliding_window (false everywhere for the other families, whose one
     * window applies to every layer) */
    bool layer_full_attention[ENG_MAX_LAYERS];

    /* RoPE beyond the default.  Training computes "default" and YaRN for
     * every family (engine/model/desc/rope_tables.h) and refuses the other types
     * (engine/model/trainable.c). */
    char rope_type[16];           /* "default", "yarn", ... */
    float rope_factor;            /* rope_scaling.factor (0 = unset) */
    int rope_original_max_position_embeddings;
    float rope_beta_fast, rope_beta_slow, rope_mscale, rope_mscale_all_dim;
    float rope_attention_factor;  /* YaRN's attention_factor (0 = unset: from factor and mscale) */
    bool rope_truncate;           /* YaRN: round the correction range outwards (transformers' default; gpt-oss false) */
    bool rope_interleave;         /* DeepSeek: rotate adjacent pairs (not halves) */
    float partial_rotary_factor;  /* GLM-4.5: fraction of each head rotated (1 = whole head) */

    /* MLA (DeepSeek-V2/V3).  head_dim is qk_rope_head_dim there, as
     * transformers sets it; num_key_value_heads = num_attention_heads. */
    bool mla;
    int q_lora_rank;              /* 0: q_proj directly (V2-Lite's q_lora_rank null) */
    int kv_lora_rank;
    int qk_nope_head_dim, qk_rope_head_dim, v_head_dim;

    /* DeepSeek / GLM MoE */
    int n_shared_experts;         /* shared experts' FFN width = n_shared_experts * moe_intermediate_size
                                     (also in shared_expert_intermediate_size; no sigmoid gate) */
    int first_k_dense_replace, moe_layer_freq;
    int n_group, topk_group;      /* group-limited routing; 0 = not grouped */
    float routed_scaling_factor;  /* routed output multiplied by it (1 = none) */
    eng_route_t routing;
    bool router_score_bias;       /* mlp.gate.e_score_correction_bias: a buffer, never trained */
    int num_nextn_predict_layers; /* multi-token-prediction layers stored after the last layer; not part of
                                     the model moetune describes (their tensors are allowed, unused) */

    /* gpt-oss */
    bool attn_sinks;              /* self_attn.sinks (nh): a learned logit per head in attention's softmax */
    bool router_bias;             /* mlp.router.bias (E): a trained parameter */
    bool experts_fused;           /* experts stored as gate_up_proj (E, H, 2I) interleaved gate/up, down_proj
                                     (E, I, H), each with a bias */
    float swiglu_limit;           /* gate clamped above, up to [-limit, limit] */
    float swiglu_alpha;           /* gpt-oss: h = (u + 1) * g * sigmoid(alpha * g) */
    char *config_json;            /* the file as read (owned), written back on save */
} eng_model_config_t;

/* Parses config.json text (`path` is only for messages) with overrides (a
 * JSON object text, or NULL) merged over it first.  Unknown model_type,
 * missing or mistyped keys, and unsupported features (rope_scaling, router
 * jitter) are errors naming the key and the file. */
mt_status_t eng_model_config_parse(const char *json_text, const char *path,
                                   const char *overrides_json, eng_model_config_t *out,
                                   mt_error_t *err);
/* Reads DIR/config.json. */
mt_status_t eng_model_config_load(const char *dir, const char *overrides_json,
                                  eng_model_config_t *out, mt_error_t *err);
void eng_model_config_free(eng_model_config_t *cfg);

#endif
