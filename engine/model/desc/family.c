/* The families (see family.h): the one place a family is named.  A new
 * family is a row of k_families: its HF names and the functions that list
 * its tensors and its ops (the decoder's when its layers are built like
 * these); its config reader (engine/model/hf) and its block code
 * (engine/layers) are the rest of it.
 *
 * The table is the top of the description: building one looks its family
 * up here and runs the family's `describe` (builder.c); the families call
 * the builder and the lookups (model_desc.c) below them, never this file. */
#include <string.h>

#include "engine/model/desc/family.h"

#define HF_EXPERTS {{ENG_P_EXP_GATE, "gate_proj"}, {ENG_P_EXP_UP, "up_proj"}, {ENG_P_EXP_DOWN, "down_proj"}}
static const eng_family_t k_families[] = {
    {ENG_ARCH_MIXTRAL, "Mixtral", "block_sparse_moe",
     {{ENG_P_EXP_GATE, "w1"}, {ENG_P_EXP_DOWN, "w2"}, {ENG_P_EXP_UP, "w3"}},
     false, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_QWEN2_MOE, "Qwen2-MoE", "mlp", HF_EXPERTS,
     false, "shared_expert", true, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_QWEN3_MOE, "Qwen3-MoE", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_OLMOE, "OLMoE", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    /* MLA (engine/layers/mla.c) and the grouped router (kernels/router_group.h:
     * softmax for V2, sigmoid for V3); what they cannot train yet (FP8
     * configs, ...) is refused by engine/model/trainable.c */
    {ENG_ARCH_DEEPSEEK_V2, "DeepSeek-V2", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_mla_describe, eng_decoder_ops, eng_mla_attention_ops, NULL},
    {ENG_ARCH_DEEPSEEK_V3, "DeepSeek-V3", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_mla_describe, eng_decoder_ops, eng_mla_attention_ops, NULL},
    /* GLM-4.5: the decoder's layers (partial RoPE, engine/layers/rope_partial.c) with DeepSeek-V3's router and
     * shared experts; o_proj never has a bias */
    {ENG_ARCH_GLM4_MOE, "GLM-4.5", "mlp", HF_EXPERTS,
     false, "shared_experts", false, true, eng_decoder_describe, eng_decoder_ops, NULL, NULL},
    {ENG_ARCH_GPT_OSS, "gpt-oss", "mlp", HF_EXPERTS,
     true, "shared_expert", false, true, eng_gpt_oss_describe, eng_decoder_ops, NULL, eng_gpt_oss_moe_ops},
};
#undef HF_EXPERTS

const eng_family_t *eng_family_of(eng_arch_t arch) {
    for (size_t i = 0; i < sizeof k_families / sizeof k_families[0]; i++)
        if (k_families[i].arch == arch) return &k_families[i];
    return NULL;
}

const char *eng_model_desc_family_name(const eng_model_desc_t *d) {
    return d->family ? d->family->name : "?";
}

bool eng_model_desc_trains(const eng_model_desc_t *d) {
    return d->family && d->family->trains;
}

mt_status_t eng_model_desc_build(const eng_model_config_t *cfg, eng_model_desc_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (cfg->num_hidden_layers > ENG_MAX_LAYERS)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "num_hidden_layers %d exceeds moetune's limit %d",
                            cfg->num_hidden_layers, ENG_MAX_LAYERS);
    const eng_family_t *f = eng_family_of(cfg->arch);
    if (!f)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "model_type %s: no model description for this family",
                            cfg->model_type);
    return eng_desc_build(f, cfg, out, err);
}
