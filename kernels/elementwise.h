/* Element-wise ops and small reductions.  n counts elements (size_t). */
#ifndef MT_KERNELS_ELEMENTWISE_H
#define MT_KERNELS_ELEMENTWISE_H

#include <stddef.h>
#include <stdint.h>

#include "base/hd.h"

typedef struct kern_stream kern_stream_t;

/* SiLU-gated product of the expert FFN, down(silu(gate(x)) * up(x)). */
MT_HD float kern_silu(float x) { return x / (1.0f + __builtin_expf(-x)); }
MT_HD float kern_sigmoid(float x) { return 1.0f / (1.0f + __builtin_expf(-x)); }

/* y = a + b (y may alias a or b). */
typedef void (*kern_add_fn)(kern_stream_t *s, float *y, const float *a, const float *b, size_t n);
void kern_add_cpu(kern_stream_t *s, float *y, const float *a, const float *b, size_t n);
void kern_add_cuda(kern_stream_t *s, float *y, const float *a, const float *b, size_t n);

/* y += alpha * x. */
typedef void (*kern_axpy_fn)(kern_stream_t *s, float *y, float alpha, const float *x, size_t n);
void kern_axpy_cpu(kern_stream_t *s, float *y, float alpha, const float *x, size_t n);
void kern_axpy_cuda(kern_stream_t *s, float *y, float alpha, const float *x, size_t n);

/* x *= alpha. */
typedef void (*kern_scale_fn)(kern_stream_t *s, float *x, float alpha, size_t n);
void kern_scale_cpu(kern_stream_t *s, float *x, float alpha, size_t n);
void kern_scale_cuda(kern_stream_t *s, float *x, float alpha, size_t n);

/* y (rows, cols) += b (cols). */
typedef void (*kern_bias_fwd_fn)(kern_stream_t *s, float *y, const float *b, int rows, int cols);
void kern_bias_fwd_cpu(kern_stream_t *s, float *y, const float *b, int rows, int cols);
void kern_bias_fwd_cuda(kern_stream_t *s, float *y, const float *b, int rows, int cols);

/* db (cols) += sum over rows of dy (rows, cols)   (accumulate). */
typedef void (*kern_bias_bwd_fn)(kern_stream_t *s, float *db, const float *dy, int rows, int cols);
void kern_bias_bwd_cpu(kern_stream_t *s, float *db, const float *dy, int rows, int cols);
void kern_bias_bwd_cuda(kern_stream_t *s, float *db, const float *dy, int rows, int cols);

/* h = silu(g) * u. */
typedef void (*kern_swiglu_fwd_fn)(kern_stream_t *s, float *h, const float *g, const float *u,
                                   size_t n);
void kern_swiglu_fwd_cpu(kern_stream_t *s, float *h, const float *g, const float *u, size_t n);
void kern_swiglu_fwd_cuda(kern_stream_t *s, float *h, const float *g, const float *u, size_t n);

/* dg = dh * u * silu'(g), du = dh * silu(g)   (overwrite; dg/du may alias g/u). */
typedef void (*kern_swiglu_bwd_fn)(kern_stream_t *s, float *dg, float *du, const float *dh,
                                   const float *g, const float *u, size_t n);
void kern_swiglu_bwd_cpu(kern_stream_t *s, float *dg, float *du, const float *dh, const float *g,
                         const float *u, size_t n);
void kern_swiglu_bwd_cuda(kern_stream_t *s, float *dg, float *du, const float *dh,
                          const float *g, const float *u, size_t n);

/* The same with bf16 storage (a bf16 run's routed experts, whose products
 * write g and u in bf16 and read h in bf16, and whose backward products
 * write dh in bf16): h = bf16(silu(g) * u) from bf16 g, u, and
 * dg = bf16(dh * u * silu'(g)), du = bf16(dh * silu(g)) from a bf16 dh
 * (overwrite; dg/du may alias g/u).  Computed in fp32 from the
 * exact widened inputs and rounded once (act_math.h), with one exp on both
 * backends, so the twins are bit-identical. */
typedef void (*kern_swiglu_fwd_bf16_fn)(kern_stream_t *s, uint16_t *h, const uint16_t *g, const uint16_t *u,
                                        size_t n);
void kern_swiglu_fwd_bf16_cpu(kern_stream_t *s, uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n);
void kern_swiglu_fwd_bf16_cuda(kern_stream_t *s, uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n);
typedef void (*kern_swiglu_bwd_bf16_fn)(kern_stream_t *s, uint16_t *dg, uint16_t *du, const uint16_t *dh,
                                        const uint16_t *g, const uint16_t *u, size_t n);
void kern_swiglu_bwd_bf16_cpu(kern_stream_t *s, uint16_t *dg, uint16_t *du, const uint16_t *dh, const uint16_t *g,
                              const uint16_t *u, size_t n);
void kern_swiglu_bwd_bf16_cuda(kern_stream_t *s, uint16_t *dg, uint16_t *du, const uint16_t *dh, const uint16_t *g,
                               const uint16_t *u, size_t n);

/* OLMoE's clip_qkv, as torch's clamp: y = min(max(x, -c), c) (y may alias
 * x; NaN stays NaN), and backward dx = dy where -c <= x <= c, else 0, with x
 * the input of the forward (dx may alias dy: overwrite). */
typedef void (*kern_clamp_fwd_fn)(kern_stream_t *s, float *y, const float *x, float c, size_t n);
void kern_clamp_fwd_cpu(kern_stream_t *s, float *y, const float *x, float c, size_t n);
void kern_clamp_fwd_cuda(kern_stream_t *s, float *y, const float *x, float c, size_t n);
typedef void (*kern_clamp_bwd_fn)(kern_stream_t *s, float *dx, const float *dy, const float *x, float c, size_t n);
void kern_clamp_bwd_cpu(kern_stream_t *s, float *dx, const float *dy, const float *x, float c, size_t n);
void kern_clamp_bwd_cuda(kern_stream_t *s, float *dx, const float *dy, const float *x, float c, size_t n);

/* Element-wise rules both twins share, so they agree bit for bit. */
MT_HD float kern_clamp_elem(float x, float c) { return x < -c ? -c : x > c ? c : x; }
MT_HD float kern_clamp_grad_elem(float dy, float x, float c) { return x >= -c && x <= c ? dy : 0.0f; }

/* *out (one device float) = sum x^2, accumulated in double, for the global
 * gradient norm. Overwrites *out. */
typedef void (*kern_sumsq_fn)(kern_stream_t *s, float *out, const float *x, size_t n);
void kern_sumsq_cpu(kern_stream_t *s, float *out, const float *x, size_t n);
/* The same sum over host memory on a thread pool (NULL: the calling
 * thread), bit for bit kern_sumsq_cpu's whatever the pool's size: a
 * streamed layer's host gradients are gigabytes, one thread read them at
 * about 8 GB/s on the host optimizer's critical path. */
typedef struct kern_threadpool kern_threadpool_t;
void kern_sumsq_host(kern_threadpool_t *pool, float *out, const float *x, size_t n);
void kern_sumsq_cuda(kern_stream_t *s, float *out, const float *x, size_t n);
/* kern_sumsq for `count` tensors in one call: *out[i] = sum x[i]^2 over
 * n[i] elements, each the very value kern_sumsq gives for that tensor
 * alone.  out, x and n are host arrays (of device pointers, for out and x).
 * The gradient norm takes every device gradient's sum this way: a MoE
 * model has thousands of expert tensors, and one launch pair each held a
 * GPU step up on its launches. */
typedef void (*kern_sumsq_many_fn)(kern_stream_t *s, float *const *out, const float *const *x, const size_t *n,
                                   int count);
void kern_sumsq_many_cpu(kern_stream_t *s, float *const *out, const float *const *x, const size_t *n, int count);
void kern_sumsq_many_cuda(kern_stream_t *s, float *const *out, const float *const *x, const size_t *n, int count);

/* dst[i][j] += src[i][j] widened to fp32, for j < n[i], i < count: one
 * exact widening and one fp32 add per element.  dst, src and n are host
 * arrays (of device pointers, for dst and src).  A bf16 run's expert
 * weight gradients, written bf16 by one grouped product, go into their
 * fp32 accumulators this way, many experts per launch. */
typedef void (*kern_add_bf16_many_fn)(kern_stream_t *s, float *const *dst, const uint16_t *const *src,
                                      const size_t *n, int count);
void kern_add_bf16_many_cpu(kern_stream_t *s, float *const *dst, const uint16_t *const *src, const size_t *n,
                            int count);
void kern_add_bf16_many_cuda(kern_stream_t *s, float *const *dst, const uint16_t *const *src, const size_t *n,
                             int count);

/* dst[i][j] = 0 for j < n[i], i < count (host arrays; dst of device
 * pointers): the step's gradient accumulators zeroed, many to a launch. */
typedef void (*kern_zero_many_fn)(kern_stream_t *s, float *const *dst, const size_t *n, int count);
void kern_zero_many_cpu(kern_stream_t *s, float *const *dst, const size_t *n, int count);
void kern_zero_many_cuda(kern_stream_t *s, float *const *dst, const size_t *n, int count);

/* Round-to-nearest-even conversions (dtype.h's formulas). */
typedef void (*kern_f32_to_bf16_fn)(kern_stream_t *s, uint16_t *dst, const float *src, size_t n);
void kern_f32_to_bf16_cpu(kern_stream_t *s, uint16_t *dst, const float *src, size_t n);
void kern_f32_to_bf16_cuda(kern_stream_t *s, uint16_t *dst, const float *src, size_t n);
typedef void (*kern_bf16_to_f32_fn)(kern_stream_t *s, float *dst, const uint16_t *src, size_t n);
void kern_bf16_to_f32_cpu(kern_stream_t *s, float *dst, const uint16_t *src, size_t n);
void kern_bf16_to_f32_cuda(kern_stream_t *s, float *dst, const uint16_t *src, size_t n);

/* Inverted dropout with a mask drawn from (seed, i) alone, so a forward, its
 * recomputation and its backward see the same mask on any backend, in any
 * order: dst[i] = keep(seed, i) ? src[i] * (1 / (1 - p)) : 0, keeping an
 * element when splitmix64(seed + i)'s top 24 bits, as a fraction, are >= p
 * (kern_dropout_keep in math/act_math.h).  dst may be src. */
typedef void (*kern_dropout_fn)(kern_stream_t *s, float *dst, const float *src, size_t n, float p, uint64_t seed);
void kern_dropout_cpu(kern_stream_t *s, float *dst, const float *src, size_t n, float p, uint64_t seed);
void kern_dropout_cuda(kern_stream_t *s, float *dst, const float *src, size_t n, float p, uint64_t seed);

#endif
