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
 * exactly one.
 *
 * The moments m and v are kept in one of three formats (kern_moments_t; the
 * master p stays fp32 in all): fp32; bf16, rounded stochastically after
 * each update; or bitsandbytes' block-wise 8-bit state (a code per element
 * and an fp32 absmax per block of 256 per moment).  Every format computes
 * the update above in fp32 on the dequantized moments; only what is stored
 * differs (kernels/math/moments_math.h defines the rounding). */
#ifndef MT_KERNELS_ADAMW_H
#define MT_KERNELS_ADAMW_H

#include <stddef.h>
#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef struct {
    float lr, beta1, beta2, eps, weight_decay;
    float grad_scale;
    int64_t step; /* t, 1-based */
    /* When non-NULL, set to 1 if any master value the call wrote is NaN or
     * Inf, and left as it was otherwise, so the caller zeroes it first.  It
     * lives where p does: host memory for the host kernels and the CPU
     * backend, device memory for the CUDA backend.  Fused into the update
     * so that no second pass over p is made. */
    int *nonfinite;
} kern_adamw_params_t;

typedef enum {
    KERN_MOMENTS_F32 = 0,
    KERN_MOMENTS_BF16,
    KERN_MOMENTS_8BIT,
} kern_moments_fmt_t;

/* Elements per absmax block of the 8-bit format (bitsandbytes' blocksize). */
#define KERN_MOMENTS_QBLOCK 256

/* One tensor's AdamW moments.  All buffers are one allocation of
 * kern_moments_bytes(fmt, n) bytes, laid out m | v | m_absmax | v_absmax
 * (kern_moments_view), so the state moves and is saved as one block. */
typedef struct {
    kern_moments_fmt_t fmt;
    void *m, *v;                /* (n) float, bf16 bits (uint16_t) or 8-bit codes (uint8_t) */
    float *m_absmax, *v_absmax; /* (ceil(n / 256)) 8-bit only, else NULL */
    uint64_t seed;              /* bf16 only: the tensor's stochastic-rounding seed */
} kern_moments_t;

typedef void (*kern_adamw_fn)(kern_stream_t *s, float *p, const kern_moments_t *mom, const float *g,
                              const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                              const kern_adamw_params_t *hp);
void kern_adamw_cpu(kern_stream_t *s, float *p, const kern_moments_t *mom, const float *g,
                    const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                    const kern_adamw_params_t *hp);
void kern_adamw_cuda(kern_stream_t *s, float *p, const kern_moments_t *mom, const float *g,
                     const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                     const kern_adamw_params_t *hp);

/* One tensor's step for kern_adamw_many: kern_adamw's arguments. */
typedef struct {
    float *p;
    kern_moments_t mom;
    const float *g;
    const uint16_t *g_bf16;
    uint16_t *p_bf16;
    size_t n;
    kern_adamw_params_t hp;
} kern_adamw_item_t;

/* kern_adamw on each of `count` items (a host array), with the same bits:
 * the items with fp32 moments go many to a launch, the others one by one.
 * A MoE model has thousands of expert tensors, and a launch each held a
 * GPU step up on its launches. */
typedef void (*kern_adamw_many_fn)(kern_stream_t *s, const kern_adamw_item_t *items, int count);
void kern_adamw_many_cpu(kern_stream_t *s, const kern_adamw_item_t *items, int count);
void kern_adamw_many_cuda(kern_stream_t *s, const kern_adamw_item_t *items, int count);

#endif
