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
} eng_arch_t;

typedef struct {
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
    bool layer_is_moe[ENG_MAX_LAYERS]; /* from decoder_sparse_step / mlp_only_layers */
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
