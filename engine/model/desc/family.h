/* What a model family provides (internal to the model description).
 *
 * A family is a row of k_families (family.c):
 *   - its display name and HF names (the MoE block's module name, the
 *     routed experts' projection names in checkpoint order);
 *   - `describe`: its parameters, buffers and per-layer saved activations,
 *     through eng_desc_param / eng_desc_buffer / eng_desc_act;
 *   - `ops`: the step's tensors and ops for the scheduler (sched_program_t),
 *     with FLOPs and bytes, under a run shape (bf16 working copies, LoRA).
 * The decoder functions below serve every family whose layers are
 * attention + (dense or sparse) SwiGLU MLP with pre-norms. */
#ifndef MT_ENGINE_MODEL_DESC_FAMILY_H
#define MT_ENGINE_MODEL_DESC_FAMILY_H

#include "engine/model/desc/model_desc.h"
#include "scheduler/registry.h"

typedef struct eng_desc_builder eng_desc_builder_t;
typedef struct eng_walk eng_walk_t;

struct eng_family {
    eng_arch_t arch;
    const char *name;           /* "Mixtral" */
    const char *moe_block;      /* module holding router and experts: "block_sparse_moe", "mlp" */
    struct {
        eng_param_role_t role;  /* ENG_P_EXP_GATE / UP / DOWN */
        const char *leaf;       /* "w1", "gate_proj", ... */
    } experts[3];               /* in checkpoint order */
    bool o_bias;                /* o_proj has a bias when attention_bias is set (Qwen3, OLMoE) */
    const char *shared_block;   /* shared expert module: "shared_expert" (Qwen2-MoE), "shared_experts" */
    bool shared_gate;           /* the shared expert has a sigmoid gate (Qwen2-MoE's shared_expert_gate) */
    bool trains;                /* has block code; false: described for inspect and plan only */
    mt_status_t (*describe)(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b,
                            mt_error_t *err);
    mt_status_t (*ops)(const eng_family_t *f, const eng_model_desc_t *d, const eng_model_config_t *cfg,
                       const sched_run_shape_t *shape, sched_program_t *out, mt_error_t *err);
    /* The decoder walk's halves a family replaces (NULL: the decoder's):
     * MLA's attention, gpt-oss's fused experts.  See walk.h. */
    void (*attention_ops)(eng_walk_t *w);
    void (*moe_ops)(eng_walk_t *w, int xn);
};

const eng_family_t *eng_family_of(eng_arch_t arch);

/* out from cfg by family f's `describe`, with the lookups' index
 * (builder.c); on failure out is freed. */
mt_status_t eng_desc_build(const eng_family_t *f, const eng_model_config_t *cfg, eng_model_desc_t *out,
                           mt_error_t *err);

/* Builder calls for `describe`. */
void eng_desc_param(eng_desc_builder_t *b, eng_param_role_t role, int layer, int expert, int64_t d0, int64_t d1,
                    const char *fmt, ...) __attribute__((format(printf, 7, 8)));
/* A 3-D parameter (gpt-oss's experts fused over E). */
void eng_desc_param3(eng_desc_builder_t *b, eng_param_role_t role, int layer, int64_t d0, int64_t d1, int64_t d2,
                     const char *fmt, ...) __attribute__((format(printf, 7, 8)));
void eng_desc_buffer(eng_desc_builder_t *b, eng_param_role_t role, int layer, int64_t d0, int64_t d1,
                     const char *fmt, ...) __attribute__((format(printf, 6, 7)));
void eng_desc_act(eng_desc_builder_t *b, int layer, eng_act_id_t id, const char *name, eng_act_class_t cls,
                  int64_t per_token, int64_t fixed);

/* Mixtral, Qwen2-MoE, Qwen3-MoE, OLMoE, GLM-4.5 (decoder.c, ops.c);
 * eng_decoder_ops also walks DeepSeek and gpt-oss through
 * their hooks. */
mt_status_t eng_decoder_describe(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b,
                                 mt_error_t *err);
/* The decoder's pieces other families' describe functions reuse: a
 * layer's MLP (dense, or router + experts + shared experts) with its saved
 * activations, and the final norm and head. */
void eng_decoder_describe_mlp(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b, int l);
void eng_decoder_attn_acts(const eng_model_config_t *cfg, eng_desc_builder_t *b, int l);
void eng_decoder_mlp_acts(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b, int l);
void eng_decoder_describe_head(const eng_model_config_t *cfg, eng_desc_builder_t *b);
mt_status_t eng_decoder_ops(const eng_family_t *f, const eng_model_desc_t *d, const eng_model_config_t *cfg,
                            const sched_run_shape_t *shape, sched_program_t *out, mt_error_t *err);

/* DeepSeek-V2/V3 (mla.c) and gpt-oss (gpt_oss.c). */
mt_status_t eng_mla_describe(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b,
                             mt_error_t *err);
void eng_mla_attention_ops(eng_walk_t *w);
mt_status_t eng_gpt_oss_describe(const eng_family_t *f, const eng_model_config_t *cfg, eng_desc_builder_t *b,
                                 mt_error_t *err);
void eng_gpt_oss_moe_ops(eng_walk_t *w, int xn);

#endif
