/* gpt-oss's two ops of its own: attention sinks and the experts' clamped
 * SwiGLU.  CPU twins in kernels/cpu/gpt_oss.c, CUDA in kernels/cuda/gpt_oss.cu;
 * the per-element math both share is math/gpt_oss_math.h.
 *
 * Attention sinks.  transformers' GptOssAttention appends one learned logit
 * s_h per head to every query row's scores, takes the softmax over the
 * T + 1 entries and drops the sink's column.  That is plain attention
 * rescaled: with lse the row's logsumexp over its keys,
 *   lse' = logaddexp(lse, s_h),  out' = out * exp(lse - lse'),
 * and out', lse' are exactly the output and logsumexp of the softmax with
 * the sink.  So the sink is applied after attention_fwd (attn_sink_fwd
 * rewrites out and lse in place), and attention_bwd given out' and lse'
 * computes dq, dk, dv of the sink softmax unchanged: it recomputes
 * P' = exp(S - lse'), and D = dout . out' is the right row term because
 * the sink column carries no value.  The one extra gradient is the sink's:
 *   ds_h = -sum over rows (b, t) of exp(s_h - lse') * (dout . out')
 * (attn_sink_bwd, accumulated).  A row with no visible key (lse = -inf,
 * attention.h) gets out' = 0 and lse' = s_h.
 *
 *   out (B, T, nh, hd), lse (B, nh, T), sinks (nh), dsinks (nh)
 *
 * Clamped SwiGLU (GptOssExperts._apply_gate).  gu (rows, 2I) holds gate and
 * up interleaved: gate = gu[..., 0::2], up = gu[..., 1::2]; h (rows, I):
 *   g = min(gate, limit), u = clamp(up, -limit, limit),
 *   h = (u + 1) * g * sigmoid(alpha * g)
 * Backward overwrites dgu (rows, 2I) (may alias gu); the clamps pass the
 * gradient where torch's clamp does (gate <= limit, -limit <= up <= limit).
 *
 * Expert biases on the permuted rows (moe_ops.h's plan): the rows of expert
 * e are [offsets[e], offsets[e + 1]) (offsets: device, E + 1); forward adds
 * b[e] (C) to each of them, backward accumulates db[e] += the sum of those
 * rows of dy, added in row order into one float per column and then into
 * db (the CUDA twin adds in the same order: bit-identical).  One launch for
 * all experts, instead of one bias op per expert. */
#ifndef MT_KERNELS_GPT_OSS_H
#define MT_KERNELS_GPT_OSS_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef void (*kern_attn_sink_fwd_fn)(kern_stream_t *s, float *out, float *lse, const float *sinks, int B, int T,
                                      int nh, int hd);
void kern_attn_sink_fwd_cpu(kern_stream_t *s, float *out, float *lse, const float *sinks, int B, int T, int nh,
                            int hd);
void kern_attn_sink_fwd_cuda(kern_stream_t *s, float *out, float *lse, const float *sinks, int B, int T, int nh,
                             int hd);

/* dsinks (nh) += the sinks' gradient; out and lse are attn_sink_fwd's. */
typedef void (*kern_attn_sink_bwd_fn)(kern_stream_t *s, float *dsinks, const float *dout, const float *out,
                                      const float *lse, const float *sinks, int B, int T, int nh, int hd);
void kern_attn_sink_bwd_cpu(kern_stream_t *s, float *dsinks, const float *dout, const float *out, const float *lse,
                            const float *sinks, int B, int T, int nh, int hd);
void kern_attn_sink_bwd_cuda(kern_stream_t *s, float *dsinks, const float *dout, const float *out, const float *lse,
                             const float *sinks, int B, int T, int nh, int hd);

typedef void (*kern_swiglu_clamped_fwd_fn)(kern_stream_t *s, float *h, const float *gu, float alpha, float limit,
                                           size_t n);
void kern_swiglu_clamped_fwd_cpu(kern_stream_t *s, float *h, const float *gu, float alpha, float limit, size_t n);
void kern_swiglu_clamped_fwd_cuda(kern_stream_t *s, float *h, const float *gu, float alpha, float limit, size_t n);

/* n = rows * I elements of h; dgu has 2n. */
typedef void (*kern_swiglu_clamped_bwd_fn)(kern_stream_t *s, float *dgu, const float *dh, const float *gu,
                                           float alpha, float limit, size_t n);
void kern_swiglu_clamped_bwd_cpu(kern_stream_t *s, float *dgu, const float *dh, const float *gu, float alpha,
                                 float limit, size_t n);
void kern_swiglu_clamped_bwd_cuda(kern_stream_t *s, float *dgu, const float *dh, const float *gu, float alpha,
                                  float limit, size_t n);

/* y (m, C) += b (E, C) by each row's expert. */
typedef void (*kern_expert_bias_fwd_fn)(kern_stream_t *s, float *y, const float *b, const int32_t *offsets, int E,
                                        int C);
void kern_expert_bias_fwd_cpu(kern_stream_t *s, float *y, const float *b, const int32_t *offsets, int E, int C);
void kern_expert_bias_fwd_cuda(kern_stream_t *s, float *y, const float *b, const int32_t *offsets, int E, int C);

/* db (E, C) += per expert, the column sums of its rows of dy (m, C). */
typedef void (*kern_expert_bias_bwd_fn)(kern_stream_t *s, float *db, const float *dy, const int32_t *offsets, int E,
                                        int C);
void kern_expert_bias_bwd_cpu(kern_stream_t *s, float *db, const float *dy, const int32_t *offsets, int E, int C);
void kern_expert_bias_bwd_cuda(kern_stream_t *s, float *db, const float *dy, const int32_t *offsets, int E, int C);

#endif
