/* Matrix products.  Row-major:
 *   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
 * where A is stored (M, K), or (K, M) when trans_a; B is stored (K, N), or
 * (N, K) when trans_b.  beta = 0 overwrites C (C may hold garbage/NaN),
 * beta = 1 accumulates (how weight gradients are summed over micro-batches).
 *
 * A linear layer y = x W^T (W is HF's [out, in]) is
 *   matmul(y, x, W, M=rows, N=out, K=in, false, true, 1, 0),
 * its input gradient dx = dy W is matmul(dx, dy, W, rows, in, out, false, false, 1, 0),
 * its weight gradient dW += dy^T x is matmul(dW, dy, x, out, in, rows, true, false, 1, 1).
 *
 * CPU: OpenBLAS sgemm.  CUDA: cuBLASLt, fp32 (TF32 off) or bf16 in/out with
 * fp32 accumulation. */
#ifndef MT_KERNELS_GEMM_H
#define MT_KERNELS_GEMM_H

#include <stdbool.h>

typedef struct kern_stream kern_stream_t;

typedef void (*kern_matmul_fn)(kern_stream_t *s, float *C, const float *A, const float *B, int M,
                               int N, int K, bool trans_a, bool trans_b, float alpha, float beta);
void kern_matmul_cpu(kern_stream_t *s, float *C, const float *A, const float *B, int M, int N,
                     int K, bool trans_a, bool trans_b, float alpha, float beta);
void kern_matmul_cuda(kern_stream_t *s, float *C, const float *A, const float *B, int M, int N,
                      int K, bool trans_a, bool trans_b, float alpha, float beta);

/* One product of a group (e.g. one expert). Groups with M or N == 0 are
 * skipped; K == 0 is an empty sum: C = beta * C (zeroes C when beta == 0). */
typedef struct {
    float *C;
    const float *A;
    const float *B;
    int M, N, K;
} kern_gemm_desc_t;

/* The experts of a layer as one grouped product over the packed buffers;
 * trans/alpha/beta are shared by every group.  `descs` is host memory. */
typedef void (*kern_matmul_grouped_fn)(kern_stream_t *s, const kern_gemm_desc_t *descs, int count,
                                       bool trans_a, bool trans_b, float alpha, float beta);
void kern_matmul_grouped_cpu(kern_stream_t *s, const kern_gemm_desc_t *descs, int count,
                             bool trans_a, bool trans_b, float alpha, float beta);
void kern_matmul_grouped_cuda(kern_stream_t *s, const kern_gemm_desc_t *descs, int count,
                              bool trans_a, bool trans_b, float alpha, float beta);

#endif
