/* The DeepSeek-V3 / GLM-4.5 router (transformers' DeepseekV3TopkRouter,
 * Glm4MoeTopkRouter): sigmoid scores, a bias that steers only the choice,
 * group-limited top-k.  With `softmax` set, DeepSeek-V2's
 * (DeepseekV2TopkRouter): softmax scores over all experts, a group's score
 * its best expert's (group_limited_greedy; one group is plain greedy
 * top-k), no bias; the rest is the same.
 *
 * Forward, per token row r of logits (n, E), fp32:
 *   scores[r] = sigmoid(logits[r])                          (n, E), saved
 *   choice[e] = scores[r, e] + bias[e]       (bias (E): e_score_correction_bias,
 *                                             not trained; NULL = zeros)
 *   the E experts form n_group contiguous groups of E / n_group; a group's
 *   score is the sum of its two largest choices; the topk_group groups of
 *   largest score are kept (ties to the lower group);
 *   idx[r]    = the k experts of largest choice within the kept groups,
 *               descending (ties to the lower index)        (n, k)
 *   weights[r, s] = scores[r, idx[r, s]]  -- the UNbiased score
 *               / (sum_s' of them + 1e-20)   when renorm (norm_topk_prob)
 *               * scale                      (routed_scaling_factor)
 * The order of the k slots does not change the layer's output (the experts'
 * outputs are summed); it is fixed so both backends agree bit for bit.
 *
 * Backward (overwrite dlogits (n, E)): the weights' gradient through the
 * scaling and the renormalisation onto the k chosen scores, then the
 * sigmoid's: dlogit = dscore * (1 - score) * score (torch's order), or the
 * softmax's: dlogit = p * (dp - sum_s p_s dp_s) over every expert (the sum
 * over the k chosen in slot order, in double).  The
 * choice (bias, group and top-k masks) is discrete and has no gradient;
 * unchosen experts get 0.
 *
 * Limits (checked; the engine's config reader refuses such models first):
 * E % n_group == 0 with E / n_group >= 2 (the group score takes a top-2),
 * 1 <= topk_group <= n_group <= 64, 1 <= k <= min(32, topk_group * E / n_group). */
#ifndef MT_KERNELS_ROUTER_GROUP_H
#define MT_KERNELS_ROUTER_GROUP_H

#include <stdint.h>

typedef struct kern_stream kern_stream_t;

#define KERN_ROUTER_GROUP_MAX_GROUPS 64
#define KERN_ROUTER_GROUP_MAX_K 32

typedef struct {
    int n_group, topk_group;
    int renorm;  /* norm_topk_prob */
    float scale; /* routed_scaling_factor */
    int softmax; /* DeepSeek-V2: softmax scores, group score = its best (0: sigmoid, top-2 sum) */
} kern_router_group_t;

typedef void (*kern_router_group_fwd_fn)(kern_stream_t *s, float *weights, int32_t *idx, float *scores,
                                         const float *logits, const float *bias, int n, int E, int k,
                                         const kern_router_group_t *g);
void kern_router_group_fwd_cpu(kern_stream_t *s, float *weights, int32_t *idx, float *scores, const float *logits,
                               const float *bias, int n, int E, int k, const kern_router_group_t *g);
void kern_router_group_fwd_cuda(kern_stream_t *s, float *weights, int32_t *idx, float *scores, const float *logits,
                                const float *bias, int n, int E, int k, const kern_router_group_t *g);

typedef void (*kern_router_group_bwd_fn)(kern_stream_t *s, float *dlogits, const float *dweights,
                                         const float *scores, const int32_t *idx, int n, int E, int k,
                                         const kern_router_group_t *g);
void kern_router_group_bwd_cpu(kern_stream_t *s, float *dlogits, const float *dweights, const float *scores,
                               const int32_t *idx, int n, int E, int k, const kern_router_group_t *g);
void kern_router_group_bwd_cuda(kern_stream_t *s, float *dlogits, const float *dweights, const float *scores,
                                const int32_t *idx, int n, int E, int k, const kern_router_group_t *g);

#endif
