/* The sparse MoE half of a decoder layer (see blocks.h): the layer's
 * router, per-expert and shared-expert tensors handed to moe/moe_layer.h,
 * with their LoRA factors, the saved activations' sizes from the model
 * description, the grouped router's bias, and the executor's fetch of
 * streamed experts once routing is known.
 *
 * Its own file beside gpt_oss.c's fused experts: blocks.c's MLP half picks
 * one of them, and both read the layer's dimensions (eng_moe_dims) here. */
#include <stdlib.h>
#include <string.h>

#include "engine/layers/blocks.h"

/* moe/'s saved activations as the description names them */
static const eng_act_id_t k_moe_acts[MOE_ACT_COUNT] = {
    [MOE_ACT_LOGITS] = ENG_A_ROUTER_LOGITS, [MOE_ACT_PROBS] = ENG_A_ROUTER_PROBS,
    [MOE_ACT_TOPW] = ENG_A_TOPW,            [MOE_ACT_IDX] = ENG_A_TOPK_IDX,
    [MOE_ACT_COUNTS] = ENG_A_EXPERT_COUNTS, [MOE_ACT_OFFSETS] = ENG_A_EXPERT_OFFSETS,
    [MOE_ACT_PERM] = ENG_A_PERM,            [MOE_ACT_INV] = ENG_A_INV_PERM,
    [MOE_ACT_XP] = ENG_A_EXPERT_X,          [MOE_ACT_G] = ENG_A_EXPERT_G,
    [MOE_ACT_U] = ENG_A_EXPERT_U,           [MOE_ACT_EP] = ENG_A_EXPERT_OUT,
    [MOE_ACT_SG] = ENG_A_SHARED_G,          [MOE_ACT_SU] = ENG_A_SHARED_U,
    [MOE_ACT_SO] = ENG_A_SHARED_OUT,        [MOE_ACT_SGL] = ENG_A_SHARED_GATE_LOGIT,
};

moe_layer_dims_t eng_moe_dims(const eng_model_t *m, int layer) {
    const eng_model_config_t *c = &m->cfg;
    kern_router_group_t d_group;
    moe_layer_dims_t d = {
        .H = c->hidden_size,
        .E = c->num_experts,
        .k = c->num_experts_per_tok,
        .I = c->moe_intermediate_size,
        .Is = c->shared_expert_intermediate_size,
        .router_mode = c->norm_topk_prob ? KERN_ROUTER_SOFTMAX_TOPK_RENORM : KERN_ROUTER_SOFTMAX_TOPK,
        .router_grouped = eng_router_group_of(c, &d_group),
        .compute = m->compute,
    };
    d.router_group = d_group;
    /* sizes of the saved activations from the description (moe/ cannot read it) */
    for (int i = 0; i < MOE_ACT_COUNT; i++) {
        const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, k_moe_acts[i]);
        if (a)
            d.acts[i] = (moe_act_size_t){a->per_token, a->fixed,
                                          eng_act_dtype(a->cls, eng_act_storage_dtype(m))};
    }
    return d;
}

/* Parameter i's working copy (or its gradient target); -1 gives NULL. */
static void *param_ptr(eng_layer_env_t *env, int i, bool gradient) {
    if (i < 0) return NULL;
    return gradient ? (void *)env->dp[i].g : env->dp[i].w;
}

void eng_moe_params(eng_layer_env_t *env, int layer, bool gradients, moe_layer_params_t *out,
                    void **scratch) {
    eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int E = m->cfg.num_experts;
    memset(out, 0, sizeof *out); /* no LoRA factors unless moe_lora adds them */
    /* every expert matrix of a MoE layer has the same working dtype (see
     * eng_param_t); the router's is always fp32 (moe/moe_layer.c) */
    out->dtype = gradients ? MT_F32 : m->params[L->exp_gate[0]].w_dtype;
    out->router = param_ptr(env, L->router, gradients);
    out->gate = scratch;
    out->up = scratch + E;
    out->down = scratch + 2 * E;
    for (int e = 0; e < E; e++) {
        const int ig = L->exp_gate[e], iu = L->exp_up[e], id = L->exp_down[e];
        out->gate[e] = gradients ? env->dp[ig].g : env->dp[ig].w;
        out->up[e] = gradients ? env->dp[iu].g : env->dp[iu].w;
        out->down[e] = gradients ? env->dp[id].g : env->dp[id].w;
    }
    out->sh_gate = param_ptr(env, L->sh_gate, gradients);
    out->sh_up = param_ptr(env, L->sh_up, gradients);
    out->sh_down = param_ptr(env, L->sh_down, gradients);
    out->sh_expert_gate = param_ptr(env, L->sh_expert_gate, gradients);
    out->fetch_experts = NULL;
    out->fetch_ctx = NULL;
    out->ep = eng_layer_ep(env, layer); /* NULL unless the layer's experts are split between devices */
}

/* The layer's LoRA factors into p (router, shared expert, and per expert
 * when any expert module is adapted: a table of 3E entries, returned for
 * the caller to free; NULL without one). */
static kern_lora_t *moe_lora(eng_layer_env_t *env, int layer, moe_layer_params_t *p) {
    eng_model_t *m = env->model;
    const eng_layer_index_t *L = &m->layers[layer];
    const int E = m->cfg.num_experts;
    p->lora_router = eng_lora_of(env, L->router);
    p->lora_sh_gate = eng_lora_of(env, L->sh_gate);
    p->lora_sh_up = eng_lora_of(env, L->sh_up);
    p->lora_sh_down = eng_lora_of(env, L->sh_down);
    p->lora_sh_expert_gate = eng_lora_of(env, L->sh_expert_gate);
    bool any = false;
    for (int e = 0; e < E && !any; e++)
        any = m->params[L->exp_gate[e]].lora_a >= 0 || m->params[L->exp_up[e]].lora_a >= 0 ||
              m->params[L->exp_down[e]].lora_a >= 0;
    if (!any) return NULL;
    kern_lora_t *t = calloc((size_t)3 * E, sizeof *t);
    MT_CHECK_ALLOC(t, "expert LoRA table");
    for (int e = 0; e < E; e++) {
        t[e] = eng_lora_of(env, L->exp_gate[e]);
        t[E + e] = eng_lora_of(env, L->exp_up[e]);
        t[2 * E + e] = eng_lora_of(env, L->exp_down[e]);
    }
    p->lora_gate = t;
    p->lora_up = t + E;
    p->lora_down = t + 2 * E;
    return t;
}

typedef struct {
    eng_layer_env_t *env;
    int layer;
    eng_fetch_experts_fn fetch;
    void *fetch_ctx;
    moe_layer_params_t *p; /* its LoRA table follows the fetched experts too */
} fetch_ctx_t;

/* Adapts the engine's fetch to moe/'s hook and refreshes the pointers. */
static mt_status_t fetch_trampoline(void *ctx, const int32_t *counts, void **gate, void **up,
                                    void **down, mt_error_t *err) {
    fetch_ctx_t *c = ctx;
    mt_status_t st = c->fetch(c->fetch_ctx, c->layer, counts, err);
    if (st != MT_OK) return st;
    const eng_model_t *m = c->env->model;
    const eng_layer_index_t *L = &m->layers[c->layer];
    for (int e = 0; e < m->cfg.num_experts; e++) {
        gate[e] = c->env->dp[L->exp_gate[e]].w;
        up[e] = c->env->dp[L->exp_up[e]].w;
        down[e] = c->env->dp[L->exp_down[e]].w;
        if (c->p->lora_gate) {
            c->p->lora_gate[e] = eng_lora_of(c->env, L->exp_gate[e]);
            c->p->lora_up[e] = eng_lora_of(c->env, L->exp_up[e]);
            c->p->lora_down[e] = eng_lora_of(c->env, L->exp_down[e]);
        }
    }
    return MT_OK;
}


mt_status_t eng_moe_forward(eng_layer_env_t *env, int layer, int n, eng_fetch_experts_fn fetch, void *fetch_ctx,
                            eng_mlp_acts_t *a, float *y, mt_error_t *err) {
    eng_model_t *m = env->model;
    const int E = m->cfg.num_experts;
    void **scratch = malloc((size_t)3 * E * sizeof *scratch);
    MT_CHECK_ALLOC(scratch, "expert pointer table");
    moe_layer_params_t p;
    eng_moe_params(env, layer, false, &p, scratch);
    kern_lora_t *lora = moe_lora(env, layer, &p);
    fetch_ctx_t fc = {env, layer, fetch, fetch_ctx, &p};
    if (fetch) {
        p.fetch_experts = fetch_trampoline;
        p.fetch_ctx = &fc;
    }
    moe_layer_dims_t d = eng_moe_dims(m, layer);
    float *rbias = NULL;
    mt_status_t st = eng_router_bias_upload(env, layer, &rbias, err);
    p.router_bias = rbias;
    if (st == MT_OK) st = moe_layer_forward(env->dev, &d, &p, a->xn, n, y, &a->moe, err);
    if (rbias) kern_free(env->dev, rbias);
    free(scratch);
    free(lora);
    return st;
}

mt_status_t eng_moe_backward(eng_layer_env_t *env, int layer, const float *dy, const float *aux_dp,
                             const float *tok_w, eng_mlp_acts_t *a, float *dxn, mt_error_t *err) {
    eng_model_t *m = env->model;
    const int E = m->cfg.num_experts;
    void **scratch = malloc((size_t)6 * E * sizeof *scratch);
    MT_CHECK_ALLOC(scratch, "expert pointer table");
    moe_layer_params_t p, gp;
    eng_moe_params(env, layer, false, &p, scratch);
    eng_moe_params(env, layer, true, &gp, scratch + 3 * E);
    kern_lora_t *lora = moe_lora(env, layer, &p);
    moe_layer_dims_t d = eng_moe_dims(m, layer);
    mt_status_t st = moe_layer_backward(env->dev, &d, &p, &gp, a->xn, dy, aux_dp, tok_w, &a->moe, dxn, err);
    free(scratch);
    free(lora);
    return st;
}
