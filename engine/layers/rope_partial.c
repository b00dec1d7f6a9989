/* RoPE over the whole head or its first part (see blocks.h).
 *
 * GLM-4.5 rotates only the first int(head_dim * partial_rotary_factor)
 * dims of each head (transformers' apply_rotary_pos_emb splits q and k at
 * the table's width, rotate_half on the first part, the rest passes).  The
 * RoPE kernels rotate whole rows, so the rotary parts of every head are
 * gathered into one (n, heads, rd) tensor with copy4d, rotated, and put
 * back: the same arithmetic as on a head of width rd.  With the whole head
 * rotated this is the plain kernel call, bit for bit as before. */
#include "engine/layers/blocks.h"

int eng_rope_dim(const eng_model_config_t *c) {
    return c->partial_rotary_factor > 0 && c->partial_rotary_factor < 1
               ? (int)((double)c->head_dim * (double)c->partial_rotary_factor)
               : c->head_dim;
}

static mt_status_t rope_part(eng_layer_env_t *env, const eng_shape_t *sh, float *x, int heads, int rd, bool backward,
                             mt_error_t *err) {
    eng_model_t *m = env->model;
    const int hd = m->cfg.head_dim, n = sh->n;
    kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
    float *r = kern_alloc(env->dev, (size_t)n * heads * rd * sizeof(float), "rotary part of the heads", err);
    if (!r) return err->code;
    const kern_copy4d_t in = {{n, heads, 1, rd}, {(int64_t)heads * hd, hd, 0, 1}, {(int64_t)heads * rd, rd, 0, 1}};
    const kern_copy4d_t out = {{n, heads, 1, rd}, {(int64_t)heads * rd, rd, 0, 1}, {(int64_t)heads * hd, hd, 0, 1}};
    env->dev->ops->copy4d(s, r, x, &in, 0);
    (backward ? env->dev->ops->rope_bwd : env->dev->ops->rope_fwd)(s, r, env->rope_cos, env->rope_sin, sh->pos, sh->B, sh->T, heads, rd);
    env->dev->ops->copy4d(s, x, r, &out, 0);
    kern_free(env->dev, r);
    return MT_OK;
}

mt_status_t eng_rope_qk(eng_layer_env_t *env, const eng_shape_t *sh, float *q, float *k, bool backward, mt_error_t *err) {
    eng_model_t *m = env->model;
    const eng_model_config_t *c = &m->cfg;
    const int rd = eng_rope_dim(c), hd = c->head_dim;
    if (rd == hd) {
        kern_rope_fn f = backward ? env->dev->ops->rope_bwd : env->dev->ops->rope_fwd;
        kern_stream_t *s = kern_stream(env->dev, KERN_STREAM_COMPUTE);
        f(s, q, env->rope_cos, env->rope_sin, sh->pos, sh->B, sh->T, c->num_attention_heads, hd);
        f(s, k, env->rope_cos, env->rope_sin, sh->pos, sh->B, sh->T, c->num_key_value_heads, hd);
        return MT_OK;
    }
    mt_status_t st = rope_part(env, sh, q, c->num_attention_heads, rd, backward, err);
    return st == MT_OK ? rope_part(env, sh, k, c->num_key_value_heads, rd, backward, err) : st;
}
