/* AdamW with PyTorch semantics (torch.optim.AdamW, single-tensor path), on
 * fp32 master weights p, moments m and v, for one tensor:
 *   g      = grad * grad_scale          (clipping and accumulation folded in)
 *   p     *= 1 - lr * weight_decay      (decoupled decay, first)
 *   m      = beta1 * m + (1 - beta1) * g
 *   v      = beta2 * v + (1 - beta2) * g * g
 *   denom  = sqrt(v) / sqrt(1 - beta2^t) + eps
 *   p     -= (lr / (1 - beta1^t)) * m / denom
 * t is this tensor's own step count (1 on its first update): a tensor that
 * got no gradient in an optimizer step is not updated and does not count.
 * When p_bf16 != NULL the updated p is also written rounded to bf16 (the
 * device working copy).  Gradients come as fp32 (g) or bf16 (g_bf16): pass
 * exactly one. */
#ifndef MT_KERNELS_ADAMW_H
#define MT_KERNELS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;
    int64_t step; /* t, 1-based */
} kern_adamw_params_t;

typedef void (*kern_adamw_fn)(kern_stream_t *s, float *p, float *m, float *v, const float *g,
                              const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                              const kern_adamw_params_t *hp);
void kern_adamw_cpu(kern_stream_t *s, float *p, float *m, float *v, const float *g,
                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                    const kern_adamw_params_t *hp);
void kern_adamw_cuda(kern_stream_t *s, float *p, float *m, float *v, const float *g,
                     const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                     const kern_adamw_params_t *hp);

#endif
