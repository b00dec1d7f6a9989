/* Router and token permutation primitives.  Which router each model family
 * uses, and what the engine does with these, lives in moe/.
 *
 * Router forward (per token row r of logits (n, E), fp32):
 *   probs[r] = softmax(logits[r])                      (n, E), saved
 *   idx[r]   = the k experts of largest prob, descending (ties: lower index)
 *   weights[r, s] = probs[r, idx[r, s]]                 (n, k)
 *   KERN_ROUTER_SOFTMAX_TOPK_RENORM divides the k weights by their sum
 *   (Mixtral always; Qwen/OLMoE when norm_topk_prob).
 * Router backward (overwrite dlogits):
 *   dprobs from dweights through the top-k (and renormalisation), plus the
 *   aux-loss term aux_dp[e] * tok_w[r] when aux_dp != NULL (the
 *   load-balancing loss is linear in the mean probabilities), then the
 *   softmax backward dlogit = p * (dp - sum(p * dp)).
 *
 * Permutation: the k slots of every token are grouped by expert,
 * ascending expert, tokens in ascending order inside an expert (stable,
 * deterministic).  m = n * k permuted rows.
 *   counts (E), offsets (E + 1): rows of expert e are [offsets[e], offsets[e+1])
 *   perm_tok (m): token of permuted row j;  inv (n * k): permuted row of (r, s). */
#ifndef MT_KERNELS_MOE_OPS_H
#define MT_KERNELS_MOE_OPS_H

#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef enum {
    KERN_ROUTER_SOFTMAX_TOPK = 0,
    KERN_ROUTER_SOFTMAX_TOPK_RENORM = 1,
} kern_router_mode_t;

typedef void (*kern_router_fwd_fn)(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                                   const float *logits, int n, int E, int k,
                                   kern_router_mode_t mode);
void kern_router_fwd_cpu(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                         const float *logits, int n, int E, int k, kern_router_mode_t mode);
void kern_router_fwd_cuda(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                          const float *logits, int n, int E, int k, kern_router_mode_t mode);

typedef void (*kern_router_bwd_fn)(kern_stream_t *s, float *dlogits, const float *dweights,
                                   const float *probs, const int32_t *idx, const float *aux_dp,
                                   const float *tok_w, int n, int E, int k,
                                   kern_router_mode_t mode);
void kern_router_bwd_cpu(kern_stream_t *s, float *dlogits, const float *dweights,
                         const float *probs, const int32_t *idx, const float *aux_dp,
                         const float *tok_w, int n, int E, int k, kern_router_mode_t mode);
void kern_router_bwd_cuda(kern_stream_t *s, float *dlogits, const float *dweights,
                          const float *probs, const int32_t *idx, const float *aux_dp,
                          const float *tok_w, int n, int E, int k, kern_router_mode_t mode);

typedef void (*kern_moe_plan_fn)(kern_stream_t *s, int32_t *counts, int32_t *offsets,
                                 int32_t *perm_tok, int32_t *inv, const int32_t *idx, int n,
                                 int k, int E);
void kern_moe_plan_cpu(kern_stream_t *s, int32_t *counts, int32_t *offsets, int32_t *perm_tok,
                       int32_t *inv, const int32_t *idx, int n, int k, int E);
void kern_moe_plan_cuda(kern_stream_t *s, int32_t *counts, int32_t *offsets, int32_t *perm_tok,
                        int32_t *inv, const int32_t *idx, int n, int k, int E);

/* dst (m, H) = src[perm_tok[j]] for j < m. */
typedef void (*kern_moe_gather_fn)(kern_stream_t *s, float *dst, const float *src,
                                   const int32_t *perm_tok, int m, int H);
void kern_moe_gather_cpu(kern_stream_t *s, float *dst, const float *src, const int32_t *perm_tok,
                         int m, int H);
void kern_moe_gather_cuda(kern_stream_t *s, float *dst, const float *src,
                          const int32_t *perm_tok, int m, int H);

/* y (n, H) (+)= sum_s w[r, s] * src[inv[r, s]]  (w == NULL means weight 1).
 * accumulate != 0 adds into y, else overwrites. Combine forward (with w) and
 * the gather's backward (without). Summation order is s = 0..k-1. */
typedef void (*kern_moe_unpermute_sum_fn)(kern_stream_t *s, float *y, const float *src,
                                          const float *w, const int32_t *inv, int n, int k, int H,
                                          int accumulate);
void kern_moe_unpermute_sum_cpu(kern_stream_t *s, float *y, const float *src, const float *w,
                                const int32_t *inv, int n, int k, int H, int accumulate);
void kern_moe_unpermute_sum_cuda(kern_stream_t *s, float *y, const float *src, const float *w,
                                 const int32_t *inv, int n, int k, int H, int accumulate);

/* Combine backward (overwrite): dsrc[inv[r,s]] = w[r,s] * dy[r];
 * dw[r, s] = dot(src[inv[r,s]], dy[r]). */
typedef void (*kern_moe_combine_bwd_fn)(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                                        const float *src, const float *w, const int32_t *inv,
                                        int n, int k, int H);
void kern_moe_combine_bwd_cpu(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                              const float *src, const float *w, const int32_t *inv, int n, int k,
                              int H);
void kern_moe_combine_bwd_cuda(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                               const float *src, const float *w, const int32_t *inv, int n, int k,
                               int H);

/* The same two with src stored bf16 (a bf16 run's expert outputs): the
 * values widened exactly, then the fp32 ops' formulas and order, so the
 * results are theirs on the widened src.  The combine's backward writes
 * dsrc in bf16 too, each w * dy product (fp32) rounded to nearest even
 * once, as autocast gives a bf16 tensor's gradient its dtype: the experts'
 * backward products read it as a bf16 operand (they would round it so
 * anyway), which lets them write bf16 with beta 0 (kernels/gemm.h). */
typedef void (*kern_moe_unpermute_sum_bf16_fn)(kern_stream_t *s, float *y, const uint16_t *src, const float *w,
                                               const int32_t *inv, int n, int k, int H, int accumulate);
void kern_moe_unpermute_sum_bf16_cpu(kern_stream_t *s, float *y, const uint16_t *src, const float *w,
                                     const int32_t *inv, int n, int k, int H, int accumulate);
void kern_moe_unpermute_sum_bf16_cuda(kern_stream_t *s, float *y, const uint16_t *src, const float *w,
                                      const int32_t *inv, int n, int k, int H, int accumulate);
typedef void (*kern_moe_combine_bwd_bf16_fn)(kern_stream_t *s, uint16_t *dsrc, float *dw, const float *dy,
                                             const uint16_t *src, const float *w, const int32_t *inv, int n, int k,
                                             int H);
void kern_moe_combine_bwd_bf16_cpu(kern_stream_t *s, uint16_t *dsrc, float *dw, const float *dy, const uint16_t *src,
                                   const float *w, const int32_t *inv, int n, int k, int H);
void kern_moe_combine_bwd_bf16_cuda(kern_stream_t *s, uint16_t *dsrc, float *dw, const float *dy, const uint16_t *src,
                                    const float *w, const int32_t *inv, int n, int k, int H);

/* Qwen2-MoE shared expert gate: y (n, H) += sigmoid(glogit[r]) * x[r]. */
typedef void (*kern_gate_scale_fwd_fn)(kern_stream_t *s, float *y, const float *x,
                                       const float *glogit, int n, int H);
void kern_gate_scale_fwd_cpu(kern_stream_t *s, float *y, const float *x, const float *glogit,
                             int n, int H);
void kern_gate_scale_fwd_cuda(kern_stream_t *s, float *y, const float *x, const float *glogit,
                              int n, int H);
/* Overwrite: dx[r] = sigmoid(g[r]) * dy[r];
 * dglogit[r] = sig * (1 - sig) * dot(dy[r], x[r]). */
typedef void (*kern_gate_scale_bwd_fn)(kern_stream_t *s, float *dx, float *dglogit,
                                       const float *dy, const float *x, const float *glogit,
                                       int n, int H);
void kern_gate_scale_bwd_cpu(kern_stream_t *s, float *dx, float *dglogit, const float *dy,
                             const float *x, const float *glogit, int n, int H);
void kern_gate_scale_bwd_cuda(kern_stream_t *s, float *dx, float *dglogit, const float *dy,
                              const float *x, const float *glogit, int n, int H);

#endif
