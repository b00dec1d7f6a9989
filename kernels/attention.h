/* Causal scaled-dot-product attention with grouped-query heads (GQA).
 *
 *   q (B, T, nh, hd), k, v (B, T, nkv, hd), out (B, T, nh, hd)
 *   query head h reads kv head h / (nh / nkv)  (HF repeat_kv)
 *   score[i,j] = (q_i . k_j) / sqrt(hd) for j <= i (and i - j < window when
 *   window > 0, HF's sliding window), softmax over j in fp32.
 *   lse (B, nh, T) = logsumexp of each row's scores, saved for backward so
 *   probabilities are recomputed there (flash-attention style; nothing of
 *   size T*T is kept between forward and backward).
 *
 * Backward (overwrite dq, dk, dv):
 *   P = exp(S - lse), D_i = sum_d dout_i * out_i, dS = P * (dout V^T - D),
 *   dq = dS K / sqrt(hd), dk = dS^T Q / sqrt(hd) (summed over the group), dv = P^T dout. */
#ifndef MT_KERNELS_ATTENTION_H
#define MT_KERNELS_ATTENTION_H

typedef struct kern_stream kern_stream_t;

typedef void (*kern_attention_fwd_fn)(kern_stream_t *s, float *out, float *lse, const float *q,
                                      const float *k, const float *v, int B, int T, int nh,
                                      int nkv, int hd, int window);
void kern_attention_fwd_cpu(kern_stream_t *s, float *out, float *lse, const float *q,
                            const float *k, const float *v, int B, int T, int nh, int nkv, int hd,
                            int window);
void kern_attention_fwd_cuda(kern_stream_t *s, float *out, float *lse, const float *q,
                             const float *k, const float *v, int B, int T, int nh, int nkv,
                             int hd, int window);

typedef void (*kern_attention_bwd_fn)(kern_stream_t *s, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse, int B,
                                      int T, int nh, int nkv, int hd, int window);
void kern_attention_bwd_cpu(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, int B, int T, int nh, int nkv, int hd, int window);
void kern_attention_bwd_cuda(kern_stream_t *s, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, int B, int T, int nh, int nkv,
                             int hd, int window);

#endif
