/* What the CUDA backend's files share: the concrete stream, event and
 * device structs behind device.h's opaque types, and the helpers every
 * kernel entry point uses.  C, so backend_cuda.c, gemm_cuda.c and the .cu
 * files (through kern_cuda.cuh) all see one definition.
 *
 * Memory of the backend itself: arena_reserve makes ONE cudaMalloc of
 *   [cuBLASLt workspace | compute scratch | H2D scratch | D2H scratch | arena]
 * so the fixed workspaces are checked against free memory together with the
 * budget and nothing else is allocated on the device behind the arena's
 * back.  Scratch is stream-ordered temporary memory for kernels that need
 * it (column-sum partials, sort buffers): work on one stream runs in order,
 * so consecutive ops may reuse it; an op never keeps it past its return.
 *
 * Threading: a stream's ops are issued by one host thread at a time (the
 * engine's executor); the per-stream GEMM algorithm cache relies on it. */
#ifndef MT_KERNELS_CUDA_BACKEND_CUDA_INTERNAL_H
#define MT_KERNELS_CUDA_BACKEND_CUDA_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "kernels/device.h"

#ifdef __cplusplus
extern "C" {
#endif

/* cuBLASLt's recommended workspace for Hopper; Ampere needs less. */
#define KERN_CUDA_LT_WORKSPACE_BYTES ((size_t)32 << 20)
/* Kernel temporaries on the compute stream: the largest user is the radix
 * sort of moe_plan / embedding_bwd (about 20 bytes per routed slot, so a
 * million slots fit), then column-sum partials (at most 64 x cols floats). */
#define KERN_CUDA_SCRATCH_COMPUTE_BYTES ((size_t)64 << 20)
/* Copy streams only run conversions and small kernels. */
#define KERN_CUDA_SCRATCH_COPY_BYTES ((size_t)1 << 20)
/* Budget when the run config gives none: this fraction of free memory. */
#define KERN_CUDA_DEFAULT_BUDGET_FRACTION 0.90

typedef struct kern_cuda_device kern_cuda_device_t;
typedef struct kern_cuda_gemm_cache kern_cuda_gemm_cache_t;
typedef struct kern_cuda_grouped_state kern_cuda_grouped_state_t;
typedef struct kern_cudnn_attn kern_cudnn_attn_t;

struct kern_stream {
    cudaStream_t cs;
    kern_cuda_device_t *dev;
    kern_stream_role_t role;
    void *lt_workspace; /* NULL/0 except on the compute stream */
    size_t lt_workspace_bytes;
    void *scratch; /* stream-ordered kernel temporaries (see above) */
    size_t scratch_bytes;
    kern_cuda_gemm_cache_t *gemm_cache; /* cuBLASLt algorithms by shape; gemm_cuda.c */
    kern_cuda_grouped_state_t *grouped; /* cuBLAS handle and pinned staging; gemm_cuda.c */
    kern_cudnn_attn_t *cudnn_attn; /* cuDNN handle and SDPA plans by shape; kernels/cudnn */
};

struct kern_event {
    cudaEvent_t ev;
    int ordinal;
};

struct kern_cuda_device {
    kern_device_t base; /* first: device.c sees a kern_device_t */
    int ordinal;
    int cc_major, cc_minor;
    int sm_count;
    int copy_engines; /* cudaDeviceProp.asyncEngineCount */
    size_t max_smem_optin; /* bytes of shared memory a block may opt in to */
    char name[256];
    bool sync_check; /* MOETUNE_CUDA_SYNC=1: synchronise after every launch */
    cublasLtHandle_t lt;
    struct kern_stream streams[KERN_STREAM_COUNT];
    void *region; /* the one cudaMalloc of arena_reserve */
    size_t region_bytes;
};

/* The helpers below are stream_cuda.c's. */

/* Makes `ordinal` the current device (aborts when CUDA refuses). */
void kern_cuda_set_device(int ordinal);

/* Makes the stream's device current and returns its CUDA stream; every
 * kernel entry point starts with it. Aborts on a NULL stream. */
cudaStream_t kern_cuda_stream_begin(kern_stream_t *s);

/* The stream's scratch, at least `bytes` long; aborts naming `what` when the
 * fixed scratch is too small (raise KERN_CUDA_SCRATCH_COMPUTE_BYTES). */
void *kern_cuda_scratch(kern_stream_t *s, size_t bytes, const char *what);
/* How many bytes kern_cuda_scratch can give on s (products that need more
 * are cut into pieces, gemm_mm_cuda.c). */
size_t kern_cuda_scratch_capacity(const kern_stream_t *s);

/* After a kernel launch: reports launch errors naming the kernel; with
 * MOETUNE_CUDA_SYNC=1 also synchronises so asynchronous faults are reported
 * at the kernel that caused them. */
void kern_cuda_after_launch(kern_stream_t *s, const char *file, int line, const char *what);

/* Lets `kernel` (a __global__ function) use `bytes` of dynamic shared
 * memory on the stream's device, opting in beyond 48 KB; aborts naming
 * `what` when the device allows less. */
void kern_cuda_smem_optin(kern_stream_t *s, const void *kernel, size_t bytes, const char *what);

/* C (M, N) = alpha * op(A) @ op(B) + beta * C, row-major as in gemm.h, with
 * A and B stored as ab_dt and C as c_dt (each MT_F32 or MT_BF16), products
 * accumulated in fp32 (CUBLAS_COMPUTE_32F; never TF32): one cuBLASLt call
 * (gemm_cuda.c), M or N == 0 doing nothing and K == 0 scaling C by beta.
 * cuBLASLt takes a BF16 C only with BF16 A and B, and rounds it to nearest
 * even once, after alpha/beta.  kern_mm (gemm_mm_cuda.c) routes every
 * product here. */
void kern_cuda_gemm(kern_stream_t *s, void *C, mt_dtype_t c_dt, const void *A, const void *B, mt_dtype_t ab_dt,
                    int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta);

/* Releases a stream's GEMM algorithm cache (gemm_cuda.c). */
void kern_cuda_gemm_cache_free(kern_cuda_gemm_cache_t *c);

/* Column-major products for cuBLAS's grouped GEMM (cublasGemmGroupedBatchedEx),
 * one problem per group, each D = C = alpha op(LA) op(LB) + beta C with
 * m, n, k > 0, as kern_cuda_gemm_plan maps a row-major product: LA is the
 * row-major B, LB the row-major A.  Host arrays of `count`; A and B of one
 * type ab_dt, C of c_dt, accumulated in fp32 (CUBLAS_COMPUTE_32F). */
typedef struct {
    int count;
    mt_dtype_t ab_dt, c_dt;
    bool *trans_la, *trans_lb;
    int *m, *n, *k, *lda, *ldb, *ldc;
    float *alpha, *beta;
    const void **la, **lb;
    void **c;
} kern_cuda_grouped_t;

/* Every matrix of a grouped call starts, and every row of it starts, at a
 * multiple of this many bytes (the caller routes the rest elsewhere). */
#define KERN_CUDA_GROUPED_ALIGN 16

/* Issues the products of g as one grouped call on s (gemm_cuda.c):
 * the pointer arrays go to the stream's scratch through a pinned staging
 * slot.  Returns true when issued; false, with the reason in why, when
 * cuBLAS refuses the type combination (said once on stderr, and later calls
 * with it are refused without asking cuBLAS), so the caller runs the
 * products one by one.  Any other failure is fatal. */
bool kern_cuda_gemm_grouped(kern_stream_t *s, const kern_cuda_grouped_t *g, char *why, size_t why_len);

/* Releases a stream's grouped-GEMM state (gemm_cuda.c); the stream
 * must be idle. */
void kern_cuda_grouped_free(kern_cuda_grouped_state_t *g);
/* Releases a stream's cuDNN handle and attention plans
 * (kernels/cudnn/attention_cudnn.c); NULL does nothing. */
void kern_cudnn_attn_free(kern_cudnn_attn_t *c);

/* Helpers of the cuDNN attention path (attention.cu): per-row sequence
 * lengths for cuDNN's padding mask (seq_q[b] = T, seq_kv[b] = kv_len[b]
 * clamped to [0, T]); rows that see no key set to out 0, lse -inf
 * (attention.h), out (B, T, nh, hd) in bf16 when out_bf16 else fp32; the
 * backward's stats, lse with -inf replaced by 0. */
void kern_attention_tc_seqlens_cuda(kern_stream_t *s, int32_t *seq_q, int32_t *seq_kv, const int32_t *kv_len,
                                    int B, int T);
void kern_attention_tc_empty_rows_cuda(kern_stream_t *s, void *out, bool out_bf16, float *lse, const int32_t *kv_len,
                                       int B, int T, int nh, int hd, int window);
void kern_attention_tc_bwd_stats_cuda(kern_stream_t *s, float *stats, const float *lse, size_t n);

#ifdef __cplusplus
}
#endif

#endif
