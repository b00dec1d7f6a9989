/* The attention core of every family's attention half (see blocks.h):
 * which kernel computes softmax(q k^T / sqrt(hd)) v, forward and backward.
 *
 * Why it is shaped this way
 * - A bf16 run computes attention as a mixed-precision framework does
 *   (PyTorch autocast + SDPA): on tensor cores from bf16 q, k, v, the
 *   products accumulated in fp32, softmax and lse in fp32, P and dS in bf16
 *   (kernels/attention.h, the _tc entry points).  An fp32 run keeps the
 *   fp32 kernel, so GPU and CPU agree there to fp32 rounding.
 * - The model description saves q, k, v and the output in the compute
 *   dtype where the tc path takes the shape (engine/model/desc/decoder.c),
 *   so a bf16 run hands the tensor cores its bf16 buffers as they are.
 * - The tc path may refuse a call (packed segments, a shape with no cuDNN
 *   engine, no memory for its workspace); the fp32 kernel computes it then,
 *   from fp32 copies of bf16 buffers, its output rounded into the bf16
 *   one.  The backward must pair with the forward that made the saved
 *   output and lse, so the forward records its path in the saved
 *   activations (eng_attn_acts_t.tc).  A refusal depends only on the shape
 *   and the batch's packing (and on memory, which a plan's recompute sees
 *   the same), so a recomputed forward takes the path the first one took.
 * - Both backends compute the same function: the CPU's tc path is the
 *   twin of cuDNN's, so a CPU bf16 run is the reference for a GPU one. */
#include "engine/layers/blocks.h"

static bool attn_tc_wanted(const eng_layer_env_t *env) {
    return env->model->compute == MT_BF16 && env->dev->ops->attention_fwd_tc != NULL;
}

/* fp32 copies of bf16 buffers for the fp32 kernel: dst[i] gets src[i]'s n[i]
 * elements; all or none are allocated. */
static mt_status_t attn_f32_copies(eng_layer_env_t *env, float **dst, const void *const *src, const size_t *n,
                                   int count, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    for (int i = 0; i < count; i++) {
        ALLOC(dst[i], n[i], float, "attention operand (fp32 copy of bf16)");
        if (src[i]) dev->ops->bf16_to_f32(s, dst[i], (const uint16_t *)src[i], n[i]);
    }
    return MT_OK;
fail:
    for (int i = 0; i < count; i++) eng_dfree(dev, &dst[i]);
    return err->code;
}

mt_status_t eng_attn_core_fwd(eng_layer_env_t *env, const eng_shape_t *sh, eng_attn_acts_t *a, mt_dtype_t dt,
                              int nh, int nkv, int hd, int window, mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    a->tc = attn_tc_wanted(env) && ops->attention_fwd_tc(s, a->att, a->lse, a->q, a->k, a->v, dt, sh->kv_len,
                                                         sh->seg_start, sh->B, sh->T, nh, nkv, hd, window);
    if (a->tc) return MT_OK;
    if (dt == MT_F32) {
        ops->attention_fwd(s, a->att, a->lse, a->q, a->k, a->v, sh->kv_len, sh->seg_start, sh->B, sh->T, nh, nkv, hd,
                           window);
        return MT_OK;
    }
    const size_t nq = (size_t)sh->n * nh * hd, nk = (size_t)sh->n * nkv * hd;
    float *f[4] = {0}; /* q, k, v, out */
    const void *src[4] = {a->q, a->k, a->v, NULL};
    const size_t n[4] = {nq, nk, nk, nq};
    TRY(attn_f32_copies(env, f, src, n, 4, err));
    ops->attention_fwd(s, f[3], a->lse, f[0], f[1], f[2], sh->kv_len, sh->seg_start, sh->B, sh->T, nh, nkv, hd,
                       window);
    ops->f32_to_bf16(s, (uint16_t *)a->att, f[3], nq);
    for (int i = 0; i < 4; i++) eng_dfree(dev, &f[i]);
    return MT_OK;
fail:
    return err->code;
}

mt_status_t eng_attn_core_bwd(eng_layer_env_t *env, const eng_shape_t *sh, const eng_attn_acts_t *a, mt_dtype_t dt,
                              float *dq, float *dk, float *dv, const float *datt, int nh, int nkv, int hd, int window,
                              mt_error_t *err) {
    kern_device_t *const dev = env->dev;
    const kern_ops_t *ops = dev->ops;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    /* a tc forward whose backward is refused (a shape with a forward engine
     * and no backward one) falls to the fp32 kernel on the same out and lse */
    if (a->tc && ops->attention_bwd_tc(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, dt, a->lse, sh->kv_len,
                                       sh->seg_start, sh->B, sh->T, nh, nkv, hd, window))
        return MT_OK;
    if (dt == MT_F32) {
        ops->attention_bwd(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, sh->kv_len, sh->seg_start, sh->B,
                           sh->T, nh, nkv, hd, window);
        return MT_OK;
    }
    const size_t nq = (size_t)sh->n * nh * hd, nk = (size_t)sh->n * nkv * hd;
    float *f[4] = {0}; /* q, k, v, out */
    const void *src[4] = {a->q, a->k, a->v, a->att};
    const size_t n[4] = {nq, nk, nk, nq};
    TRY(attn_f32_copies(env, f, src, n, 4, err));
    ops->attention_bwd(s, dq, dk, dv, datt, f[0], f[1], f[2], f[3], a->lse, sh->kv_len, sh->seg_start, sh->B, sh->T,
                       nh, nkv, hd, window);
    for (int i = 0; i < 4; i++) eng_dfree(dev, &f[i]);
    return MT_OK;
fail:
    return err->code;
}
