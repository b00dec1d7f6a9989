/* gpt-oss's pieces of the decoder layer (see blocks.h): the attention
 * window per layer type, and the MoE half over experts fused over E, which
 * hands the layer's tensors to moe/moe_fused.h as they are.  The sinks are
 * two kernel calls in blocks.c's attention half (kernels/gpt_oss.h). */
#include "engine/layers/blocks.h"
#include "moe/moe_fused.h"

int eng_layer_window(const eng_model_config_t *c, int layer) {
    return c->layer_full_attention[layer] ? 0 : c->sliding_window;
}

/* The layer's weights as moe_fused.h wants them. */
static mt_status_t fused_params(eng_layer_env_t *env, int layer, moe_fused_params_t *p, mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int ids[] = {L->router, L->router_b, L->gate_up, L->gate_up_b, L->down, L->down_b};
    for (size_t i = 0; i < sizeof ids / sizeof ids[0]; i++) {
        MT_CHECK(ids[i] >= 0, "layer %d: a fused MoE tensor is missing from the model description", layer);
        /* moe_fused.h has no LoRA path: refuse rather than drop the adapter */
        if (m->params[ids[i]].lora_a >= 0)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: LoRA on gpt-oss's router and fused experts is not supported; target the "
                                "attention projections (q_proj, k_proj, v_proj, o_proj)",
                                m->params[ids[i]].spec->name);
    }
    const eng_param_t *P = m->params;
    const eng_dparam_t *D = env->dp;
    MT_CHECK(P[L->router].w_dtype == MT_F32 && P[L->router_b].w_dtype == MT_F32 && P[L->gate_up_b].w_dtype == MT_F32 &&
                 P[L->down_b].w_dtype == MT_F32,
             "layer %d: gpt-oss's router and biases must be fp32 on the device", layer);
    MT_CHECK(P[L->gate_up].w_dtype == P[L->down].w_dtype, "layer %d: fused experts in two working dtypes", layer);
    *p = (moe_fused_params_t){
        .router = D[L->router].w,
        .router_b = D[L->router_b].w,
        .gate_up = D[L->gate_up].w,
        .down = D[L->down].w,
        .gate_up_b = D[L->gate_up_b].w,
        .down_b = D[L->down_b].w,
        .dtype = P[L->gate_up].w_dtype,
        .alpha = m->cfg.swiglu_alpha,
        .limit = m->cfg.swiglu_limit,
    };
    return MT_OK;
}

mt_status_t eng_gpt_oss_moe_forward(eng_layer_env_t *env, int layer, int n, eng_mlp_acts_t *a, float *y, mt_error_t *err) {
    eng_model_t *m = env->model;
    moe_fused_params_t p;
    mt_status_t st = fused_params(env, layer, &p, err);
    if (st != MT_OK) return st;
    const moe_layer_dims_t d = eng_moe_dims(m, layer);
    return moe_fused_forward(env->dev, &d, &p, a->xn, n, y, &a->moe, err);
}

mt_status_t eng_gpt_oss_moe_backward(eng_layer_env_t *env, int layer, const float *dy, const float *aux_dp,
                                     const float *tok_w, eng_mlp_acts_t *a, float *dxn, mt_error_t *err) {
    eng_model_t *m = env->model;
    moe_fused_params_t p;
    mt_status_t st = fused_params(env, layer, &p, err);
    if (st != MT_OK) return st;
    const eng_layer_index_t *L = &m->layers[layer];
    const eng_dparam_t *D = env->dp;
    const moe_fused_grads_t g = {D[L->router].g, D[L->router_b].g, D[L->gate_up].g,
                                 D[L->gate_up_b].g, D[L->down].g, D[L->down_b].g};
    const moe_layer_dims_t d = eng_moe_dims(m, layer);
    return moe_fused_backward(env->dev, &d, &p, &g, a->xn, dy, aux_dp, tok_w, &a->moe, dxn, err);
}
