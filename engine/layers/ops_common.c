/* The helpers every family's block code shares (see ops_common.h): one
 * file below blocks.c, mla.c, gpt_oss.c and moe.c, calling none of them. */
#include "engine/layers/ops_common.h"

mt_dtype_t eng_act_storage_dtype(const eng_model_t *m) { return m->compute; }

size_t eng_layer_act_bytes(const eng_model_t *m, int layer, eng_act_id_t id, int n) {
    const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, id);
    MT_CHECK(a, "layer %d allocates activation id %d, which its model description does not list", layer, (int)id);
    return eng_act_numel(a, n) * mt_dtype_size(eng_act_dtype(a->cls, eng_act_storage_dtype(m)));
}

mt_dtype_t eng_layer_act_dtype(const eng_model_t *m, int layer, eng_act_id_t id) {
    const eng_act_desc_t *a = eng_model_desc_act(&m->spec, layer, id);
    MT_CHECK(a, "layer %d uses activation id %d, which its model description does not list", layer, (int)id);
    return eng_act_dtype(a->cls, eng_act_storage_dtype(m));
}

eng_operand_t eng_f32(const float *p) { return (eng_operand_t){p, MT_F32}; }

void eng_mm(eng_layer_env_t *env, float *C, eng_operand_t A, eng_operand_t B, int M, int N, int K, bool trans_a,
            bool trans_b, float alpha, float beta) {
    eng_model_t *m = env->model;
    const kern_mm_t p = kern_mm_make(C, A.data, A.dtype, B.data, B.dtype, M, N, K, trans_a, trans_b, alpha, beta,
                                     m->compute);
    env->dev->ops->mm(kern_stream(env->dev, KERN_STREAM_COMPUTE), &p);
}

eng_operand_t eng_weight(eng_layer_env_t *env, int i) {
    eng_model_t *m = env->model;
    return i >= 0 ? (eng_operand_t){env->dp[i].w, m->params[i].w_dtype} : (eng_operand_t){NULL, MT_F32};
}

float *eng_weight_f32(eng_layer_env_t *env, int i) {
    eng_model_t *m = env->model;
    if (i < 0) return NULL;
    MT_CHECK(m->params[i].w_dtype == MT_F32, "%s: an fp32 kernel was given its bf16 working copy",
             m->params[i].spec->name);
    return env->dp[i].w;
}

float *eng_grad(eng_layer_env_t *env, int i) { return i >= 0 ? env->dp[i].g : NULL; }

void eng_mm_grad(eng_layer_env_t *env, int i, eng_operand_t A, eng_operand_t B, int M, int N, int K) {
    float *g = eng_grad(env, i);
    if (g) eng_mm(env, g, A, B, M, N, K, true, false, 1.0f, 1.0f);
}

kern_lora_t eng_lora_of(const eng_layer_env_t *env, int i) {
    const eng_model_t *m = env->model;
    kern_lora_t l = {0};
    if (i < 0 || m->params[i].lora_a < 0) return l;
    const int ia = m->params[i].lora_a, ib = m->params[i].lora_b;
    l.a = env->dp[ia].w;
    l.b = env->dp[ib].w;
    l.dtype = m->params[ia].w_dtype;
    l.ga = env->dp[ia].g;
    l.gb = env->dp[ib].g;
    l.r = (int)m->params[ia].spec->shape[0]; /* the module's own rank and s (rank_pattern, alpha_pattern) */
    l.scale = m->params[i].lora_scale;
    l.dropout = m->lora.dropout;
    /* a mask per run seed, micro-batch and module (PEFT draws one per
     * module call); the forward, its recomputation and the backward agree */
    uint64_t h = m->lora.seed ^ 0x6c6f7261ull;
    const uint64_t parts[2] = {m->lora.batch_serial, (uint64_t)m->params[i].lora_a};
    for (int k = 0; k < 2; k++) h = (h ^ parts[k]) * 0x100000001b3ull + 0x9e3779b97f4a7c15ull;
    l.dropout_seed = h;
    return l;
}

mt_status_t eng_lora_fwd(eng_layer_env_t *env, int i, float *y, eng_operand_t x, int n, int in, int out,
                         mt_error_t *err) {
    eng_model_t *m = env->model;
    const kern_lora_t l = eng_lora_of(env, i);
    return kern_lora_fwd(env->dev, m->compute, &l, y, x.data, x.dtype, n, in, out, err);
}

mt_status_t eng_lora_bwd(eng_layer_env_t *env, int i, const float *dy, eng_operand_t x, float *dx, int n, int in,
                         int out, mt_error_t *err) {
    eng_model_t *m = env->model;
    const kern_lora_t l = eng_lora_of(env, i);
    return kern_lora_bwd(env->dev, m->compute, &l, dy, x.data, x.dtype, dx, n, in, out, err);
}

float *eng_grad_or_scratch(eng_layer_env_t *env, int i, float **scratch, mt_error_t *err) {
    eng_model_t *m = env->model;
    float *g = eng_grad(env, i);
    if (g || i < 0) return g;
    const size_t bytes = m->params[i].spec->numel * sizeof(float);
    *scratch = kern_alloc(env->dev, bytes, "gradient of a frozen parameter (discarded)", err);
    if (*scratch) kern_memset(env->dev, kern_stream(env->dev, KERN_STREAM_COMPUTE), *scratch, 0, bytes);
    return *scratch;
}

mt_status_t eng_norm_bwd_into_residual(eng_layer_env_t *env, int norm, float *dx, const float *dxn, const float *x,
                                       const float *rstd, int n, const char *tag, mt_error_t *err) {
    eng_model_t *m = env->model;
    const int H = m->cfg.hidden_size;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    float *tmp = kern_alloc(env->dev, (size_t)n * H * sizeof(float), tag, err);
    if (!tmp) return err->code;
    float *scratch = NULL, *gw = eng_grad_or_scratch(env, norm, &scratch, err);
    if (!gw) {
        kern_free(env->dev, tmp);
        return err->code;
    }
    env->dev->ops->rmsnorm_bwd(s, tmp, gw, dxn, x, eng_weight_f32(env, norm), rstd, n, H);
    env->dev->ops->add(s, dx, dx, tmp, (size_t)n * H);
    kern_free(env->dev, tmp);
    if (scratch) kern_free(env->dev, scratch);
    return MT_OK;
}

void eng_dfree(kern_device_t *dev, float **p) {
    if (*p) kern_free(dev, *p);
    *p = NULL;
}
