/* The attention core of every family's attention half (see blocks.h):
 * which kernel computes softmax(q k^T / sqrt(hd)) v, forward and backward.
 *
 * Why it is shaped this way
 * - A bf16 run computes attention as a mixed-precision framework does
 *   (PyTorch autocast + SDPA): on tensor cores from bf16 q, k, v, the
 *   products accumulated in fp32, softmax and lse in fp32
 *   (kernels/attention.h, the _tc entry points).  An fp32 run keeps the
 *   fp32 kernel, so GPU and CPU agree there to fp32 rounding.
 * - The tc path may refuse a call (packed segments, head dims cuDNN does not
 *   take, a shape with no cuDNN engine, no memory for its workspace); the
 *   fp32 kernel computes it then.  The backward must pair with the forward
 *   that made the saved output and lse, so the forward records its path in
 *   the saved activations (eng_attn_acts_t.tc).  A refusal depends only on
 *   the shape (and on memory, which a plan's recompute sees the same), so
 *   a recomputed forward takes the path the first one took.
 * - Both backends compute the same function: the CPU's tc path is the
 *   twin of cuDNN's, so a CPU bf16 run is the reference for a GPU one. */
#include "engine/layers/blocks.h"

static bool attn_tc_wanted(const eng_layer_env_t *env) {
    return env->model->compute == MT_BF16 && env->dev->ops->attention_fwd_tc != NULL;
}

mt_status_t eng_attn_core_fwd(eng_layer_env_t *env, const eng_shape_t *sh, eng_attn_acts_t *a, int nh, int nkv,
                              int hd, int window, mt_error_t *err) {
    (void)err;
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    a->tc = attn_tc_wanted(env) && ops->attention_fwd_tc(s, a->att, a->lse, a->q, a->k, a->v, sh->kv_len,
                                                         sh->seg_start, sh->B, sh->T, nh, nkv, hd, window);
    if (!a->tc)
        ops->attention_fwd(s, a->att, a->lse, a->q, a->k, a->v, sh->kv_len, sh->seg_start, sh->B, sh->T, nh, nkv, hd,
                           window);
    return MT_OK;
}

mt_status_t eng_attn_core_bwd(eng_layer_env_t *env, const eng_shape_t *sh, const eng_attn_acts_t *a, float *dq,
                              float *dk, float *dv, const float *datt, int nh, int nkv, int hd, int window,
                              mt_error_t *err) {
    (void)err;
    const kern_ops_t *ops = env->dev->ops;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    /* a tc forward's backward refused (a shape with a forward engine and no
     * backward one): the fp32 kernel differentiates the same out and lse */
    if (a->tc && ops->attention_bwd_tc(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, sh->kv_len,
                                       sh->seg_start, sh->B, sh->T, nh, nkv, hd, window))
        return MT_OK;
    ops->attention_bwd(s, dq, dk, dv, datt, a->q, a->k, a->v, a->att, a->lse, sh->kv_len, sh->seg_start, sh->B, sh->T,
                       nh, nkv, hd, window);
    return MT_OK;
}
