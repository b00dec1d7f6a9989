/* Causal scaled-dot-product attention with grouped-query heads (GQA) and
 * HF's key-padding mask.
 *
 *   q (B, T, nh, hd), k, v (B, T, nkv, hd), out (B, T, nh, hd)
 *   query head h reads kv head h / (nh / nkv)  (HF repeat_kv)
 *   kv_len (B) int32, device memory, or NULL (every row has T valid keys):
 *   the keys of row b that may be attended, j < kv_len[b] (right padding:
 *   the number of real tokens, attention_mask's leading run of ones). Values are
 *   clamped to [0, T], so kv_len[b] >= T is the same as NULL for that row.
 *   seg_start (B, T) int32, device memory, or NULL (all 0): the position in
 *   its row where token (b, i)'s example starts, for rows that hold several
 *   packed examples (engine/data/pack.h); values outside [0, i] are clamped
 *   there.
 *   Query i of row b may see key j iff
 *     seg_start[b,i] <= j <= i  and  (window <= 0 || i - j < window)
 *     and  j < kv_len[b]
 *   (HF: the causal mask, the sliding window, and attention_mask's padded
 *   keys; seg_start: each packed example sees only itself, as if alone in a
 *   row of its own, which is what flash-attention's varlen path computes). score[i,j] = (q_i . k_j) / sqrt(hd) over those keys, softmax over
 *   j in fp32.
 *   lse (B, nh, T) = logsumexp of each row's scores, saved for backward so
 *   probabilities are recomputed there (flash-attention style; nothing of
 *   size T*T is kept between forward and backward).
 *
 * A query with no key it may see (kv_len[b] == 0, or a sliding window that
 * lies wholly in the padding: i - window + 1 >= kv_len[b]) gets out = 0 and
 * lse = -inf, and backward gives it dq = 0 and takes nothing from it into
 * dk, dv. HF differs there and only there: its additive mask turns such a
 * row into a uniform average over all T values (eager) or unmasks the row
 * (sdpa). Those queries are padding, so with right padding no real token's
 * output, loss or gradient depends on the choice. A padded query i >=
 * kv_len[b] still sees keys 0..kv_len[b]-1 (when the window allows), as in
 * HF, so its output is defined the same on both sides. With kv_len NULL, or
 * every kv_len[b] >= T, results are bit-identical to plain causal attention;
 * seg_start NULL or all 0 is bit-identical to no segments.
 *
 * Backward (overwrite dq, dk, dv):
 *   P = exp(S - lse), D_i = sum_d dout_i * out_i, dS = P * (dout V^T - D),
 *   dq = dS K / sqrt(hd), dk = dS^T Q / sqrt(hd) (summed over the group), dv = P^T dout.
 *   Keys j >= kv_len[b] get dk = dv = 0 (no query sees them). */
#ifndef MT_KERNELS_ATTENTION_H
#define MT_KERNELS_ATTENTION_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct kern_stream kern_stream_t;

typedef void (*kern_attention_fwd_fn)(kern_stream_t *s, float *out, float *lse, const float *q,
                                      const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start,
                                      int B, int T, int nh, int nkv, int hd, int window);
void kern_attention_fwd_cpu(kern_stream_t *s, float *out, float *lse, const float *q,
                            const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                            int nh, int nkv, int hd, int window);
void kern_attention_fwd_cuda(kern_stream_t *s, float *out, float *lse, const float *q,
                             const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                             int nh, int nkv, int hd, int window);

typedef void (*kern_attention_bwd_fn)(kern_stream_t *s, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse,
                                      const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv, int hd,
                                      int window);
void kern_attention_bwd_cpu(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                            int hd, int window);
void kern_attention_bwd_cuda(kern_stream_t *s, float *dq, float *dk, float *dv,
                             const float *dout, const float *q, const float *k, const float *v,
                             const float *out, const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B,
                             int T, int nh, int nkv, int hd, int window);

/* Tensor-core attention in bf16: the same contract, computed from q, k, v
 * (and dout) rounded to bf16, with products accumulated in fp32, softmax
 * and lse in fp32, and the probabilities P and dS in bf16 as operands of the
 * second products (P V, P^T dout, dS K, dS^T q); out, dq, dk, dv come back
 * rounded to bf16.  dt is the storage of q, k, v and out: MT_BF16 (uint16_t
 * elements, read and written as they are: a bf16 run saves them so) or
 * MT_F32 (rounded on the way in; out holds bf16 values in fp32).  lse,
 * dout, dq, dk, dv are fp32.  Returns false, touching no output, when this
 * path does not handle the call; the caller then runs attention_fwd /
 * attention_bwd.
 *   CUDA: cuDNN's fused SDPA (kernels/cudnn/attention_cudnn.c); it refuses
 *   seg_start != NULL, shapes kern_attention_tc_takes refuses, and any
 *   shape cuDNN has no engine for (logged once per shape with cuDNN's
 *   reason).
 *   CPU: the twin — the same roundings around the fp32 reference, refusing
 *   what the CUDA path refuses by rule (segments, kern_attention_tc_takes),
 *   so both backends compute the same thing.
 * The backward takes the lse of the tc forward and its out (as returned). */
typedef bool (*kern_attention_fwd_tc_fn)(kern_stream_t *s, void *out, float *lse, const void *q, const void *k,
                                         const void *v, mt_dtype_t dt, const int32_t *kv_len,
                                         const int32_t *seg_start, int B, int T, int nh, int nkv, int hd,
                                         int window);
bool kern_attention_fwd_tc_cpu(kern_stream_t *s, void *out, float *lse, const void *q, const void *k, const void *v,
                               mt_dtype_t dt, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh,
                               int nkv, int hd, int window);
bool kern_attention_fwd_tc_cuda(kern_stream_t *s, void *out, float *lse, const void *q, const void *k, const void *v,
                                mt_dtype_t dt, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh,
                                int nkv, int hd, int window);

typedef bool (*kern_attention_bwd_tc_fn)(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                                         const void *q, const void *k, const void *v, const void *out,
                                         mt_dtype_t dt, const float *lse, const int32_t *kv_len,
                                         const int32_t *seg_start, int B, int T, int nh, int nkv, int hd,
                                         int window);
bool kern_attention_bwd_tc_cpu(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout, const void *q,
                               const void *k, const void *v, const void *out, mt_dtype_t dt, const float *lse,
                               const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv, int hd,
                               int window);
bool kern_attention_bwd_tc_cuda(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout, const void *q,
                                const void *k, const void *v, const void *out, mt_dtype_t dt, const float *lse,
                                const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                int hd, int window);

/* Whether the tensor-core path takes this many query heads over kv heads of
 * this head dim, by rule on every backend (cuDNN's SDPA: heads a multiple
 * of kv heads, head dims multiples of 8 up to 256); packed segments are
 * refused besides, and cuDNN may still find no engine for a shape.  The
 * model description reads it to save q, k, v and the output in bf16. */
bool kern_attention_tc_takes(int nh, int nkv, int hd);

#endif
