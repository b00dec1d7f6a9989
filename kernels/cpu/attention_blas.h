/* The sgemm-based attention (attention_blas.c), private to kernels/cpu:
 * kern_attention_{fwd,bwd}_cpu run it on CPUs without AVX-512, where the
 * 16-lane code of attention.c compiles to slower code than OpenBLAS.
 * Same contract as kernels/attention.h; exposed so tests check both. */
#ifndef MT_KERNELS_CPU_ATTENTION_BLAS_H
#define MT_KERNELS_CPU_ATTENTION_BLAS_H

#include <stdbool.h>
#include <stdint.h>

typedef struct kern_stream kern_stream_t;

void kern_attention_fwd_cpu_blas(kern_stream_t *s, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B,
                                 int T, int nh, int nkv, int hd, int window);
void kern_attention_bwd_cpu_blas(kern_stream_t *s, float *dq, float *dk, float *dv,
                                 const float *dout, const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B,
                                 int T, int nh, int nkv, int hd, int window);
/* The vector path (AVX-512 machines only: callers check kern_cpu_has_avx512). */
void kern_attention_fwd_cpu_vec(kern_stream_t *s, float *out, float *lse, const float *q,
                                const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B,
                                int T, int nh, int nkv, int hd, int window);
void kern_attention_bwd_cpu_vec(kern_stream_t *s, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B,
                                int T, int nh, int nkv, int hd, int window);
/* The same with bf16_p: the tensor-core twin's inner attention (attention.c,
 * kern_attention_*_tc_cpu), which rounds the probabilities P to bf16 before
 * P V and P^T dout, and dS before dS K and dS^T q, where cuDNN's fused SDPA
 * (kernels/cudnn/attention_cudnn_graph.c) holds them in bf16 for its tensor-core
 * products; false is the functions above, bit for bit. */
void kern_attention_fwd_cpu_blas_p(kern_stream_t *s, float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                                   int nh, int nkv, int hd, int window, bool bf16_p);
void kern_attention_bwd_cpu_blas_p(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out, const float *lse,
                                   const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                   int hd, int window, bool bf16_p);
void kern_attention_fwd_cpu_vec_p(kern_stream_t *s, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                                  int nh, int nkv, int hd, int window, bool bf16_p);
void kern_attention_bwd_cpu_vec_p(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v, const float *out, const float *lse,
                                  const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                  int hd, int window, bool bf16_p);

#endif
