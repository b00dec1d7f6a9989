/* Matrix products.  Row-major:
 *   C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C
 * where A is stored (M, K), or (K, M) when trans_a; B is stored (K, N), or
 * (N, K) when trans_b.  beta = 0 overwrites C (C may hold garbage/NaN),
 * beta = 1 accumulates (how weight gradients are summed over micro-batches).
 *
 * A linear layer y = x W^T (W is HF's [out, in]) is, in kern_mm_make's
 * argument order (C, A, B, M, N, K, trans_a, trans_b, alpha, beta),
 *   (y, x, W, M=rows, N=out, K=in, false, true, 1, 0),
 * its input gradient dx = dy W is (dx, dy, W, rows, in, out, false, false, 1, 0),
 * its weight gradient dW += dy^T x is (dW, dy, x, out, in, rows, true, false, 1, 1).
 *
 * CPU: OpenBLAS sgemm for fp32; bf16 on AVX512-BF16 vdpbf16ps where the CPU
 * has it, else bf16-rounded operands through sgemm (kernels/cpu/gemm_typed.c).
 * CUDA: cuBLASLt, fp32 (TF32 off) or bf16 in/out with fp32 accumulation. */
#ifndef MT_KERNELS_GEMM_H
#define MT_KERNELS_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#include "base/dtype.h"

typedef struct kern_stream kern_stream_t;

/* A view of a row-major, contiguous matrix on the device: `rows` x `cols`
 * elements of `dtype` (MT_F32 or MT_BF16) at `data`. */
typedef struct {
    void *data;
    mt_dtype_t dtype;
    int64_t rows, cols;
} kern_mat_t;

/* One product C = alpha * op(A) @ op(B) + beta * C, with op(A) (M, K),
 * op(B) (K, N), C (M, N) taken from the views' shapes and the trans flags
 * (a mismatch is a fatal error naming the three shapes).
 *
 * `compute` says how the products are formed, whatever the operands'
 * storage:
 *   MT_F32:  A and B must be stored F32; fp32 products (no TF32);
 *   MT_BF16: each operand is rounded to bf16 (round to nearest even) if it
 *            is stored F32, so an fp32 activation times a bf16 weight works
 *            as torch.autocast does; the products of two bf16 values are
 *            exact in fp32 and are accumulated in fp32, as cuBLASLt's
 *            CUBLAS_COMPUTE_32F does.
 * The result alpha * acc + beta * C is written in C's dtype (rounded to
 * nearest even once when C is BF16).  Sums over K may be ordered
 * differently on CPU and CUDA (so results agree to a tolerance, not
 * bitwise), but each backend is deterministic. */
typedef struct {
    kern_mat_t C, A, B;
    bool trans_a, trans_b;
    float alpha, beta;
    mt_dtype_t compute;
} kern_mm_t;

/* Checks product `idx` of a call (dtypes, shapes, int range; fatal errors
 * naming the product and its shapes) and returns its M, N, K.  Both twins
 * call it first (//kernels:gemm_check). */
void kern_mm_dims(const kern_mm_t *p, int idx, int *M, int *N, int *K);

typedef void (*kern_mm_fn)(kern_stream_t *s, const kern_mm_t *p);
void kern_mm_cpu(kern_stream_t *s, const kern_mm_t *p);
void kern_mm_cuda(kern_stream_t *s, const kern_mm_t *p);

/* Several independent products (e.g. the experts of a layer) in one call;
 * `p` is host memory.  Products with M or N == 0 are skipped; K == 0 is an
 * empty sum (C = beta * C). */
typedef void (*kern_mm_grouped_fn)(kern_stream_t *s, const kern_mm_t *p, int count);
void kern_mm_grouped_cpu(kern_stream_t *s, const kern_mm_t *p, int count);
void kern_mm_grouped_cuda(kern_stream_t *s, const kern_mm_t *p, int count);

/* The product the fp32 argument list describes (row-major, C (M, N) =
 * alpha * op(A) op(B) + beta * C; A stored (M, K) or (K, M) when trans_a, B
 * stored (K, N) or (N, K) when trans_b), with each operand's storage dtype
 * and the compute dtype: the views' shapes follow from M, N, K and the
 * flags.  C is F32. */
kern_mm_t kern_mm_make(float *C, const void *A, mt_dtype_t a_dt, const void *B, mt_dtype_t b_dt, int M, int N,
                       int K, bool trans_a, bool trans_b, float alpha, float beta, mt_dtype_t compute);

#endif
