/* One matrix product on the GPU through cuBLASLt (kern_cuda_gemm, declared
 * in backend_cuda_internal.h; gemm.h's row-major semantics).  kern_mm's
 * routing over it is gemm_mm_cuda.c's.
 *
 * Row-major without copies: gemm_plan.h maps C (M, N) = op(A) op(B) onto
 * cuBLASLt's column-major C^T = op(B)^T op(A)^T (tested on the CPU by
 * tests/gpu/gemm_plan_test).
 *
 * Precision: CUBLAS_COMPUTE_32F with fp32 scale.  cuBLASLt has no math mode
 * and uses TF32 only when asked for CUBLAS_COMPUTE_32F_FAST_TF32, so fp32
 * products are true fp32 (what the CPU twin's sgemm computes, up to
 * summation order); bf16 inputs are multiplied exactly and accumulated in
 * fp32.  The default (not PEDANTIC) compute type is enough: it excludes
 * reduced-precision inputs already and keeps every fp32 algorithm.
 *
 * Determinism: cuBLASLt gives bit-identical results for the same algorithm,
 * shapes and workspace on the same GPU (split-K reductions are ordered).
 * The algorithm is a deterministic function of (shape, types, pointer
 * alignment), and it is cached per stream under that key, so the heuristic
 * runs once per distinct product rather than once per call.
 *
 * Alignment: cuBLASLt assumes 256-byte aligned pointers unless told
 * otherwise; expert slices of packed buffers are only 4-byte aligned, so
 * every call states the real alignment of A, B and C in the preference. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

#define GEMM_CACHE_SLOTS 512
#define GEMM_CACHE_PROBE 8

typedef struct {
    int M, N, K;
    uint32_t flags; /* trans_a | trans_b << 1 | ab_dt << 2 | c_dt << 6 */
    uint32_t align; /* log2 alignments of A, B, C packed in 3 bytes */
} gemm_key_t;

typedef struct {
    bool used;
    gemm_key_t key;
    cublasLtMatmulAlgo_t algo;
} gemm_entry_t;

struct kern_cuda_gemm_cache {
    gemm_entry_t slot[GEMM_CACHE_SLOTS];
};

void kern_cuda_gemm_cache_free(kern_cuda_gemm_cache_t *c) { free(c); }

static cudaDataType_t lt_type(mt_dtype_t dt) {
    switch (dt) {
    case MT_F32: return CUDA_R_32F;
    case MT_BF16: return CUDA_R_16BF;
    default: MT_CHECK(0, "matmul: dtype %s is not supported (F32 or BF16)", mt_dtype_name(dt));
    }
    return CUDA_R_32F;
}

/* log2 of the largest power of two (<= 256) dividing the address. */
static uint32_t align_log2(const void *p) {
    uintptr_t u = (uintptr_t)p;
    uint32_t l = 0;
    while (l < 8 && !(u & ((uintptr_t)1 << l))) l++;
    return l;
}

static bool key_eq(const gemm_key_t *a, const gemm_key_t *b) {
    return a->M == b->M && a->N == b->N && a->K == b->K && a->flags == b->flags &&
           a->align == b->align;
}

static uint32_t key_hash(const gemm_key_t *k) {
    uint64_t h = 1469598103934665603ull;
    const uint32_t v[5] = {(uint32_t)k->M, (uint32_t)k->N, (uint32_t)k->K, k->flags, k->align};
    for (int i = 0; i < 5; i++) h = (h ^ v[i]) * 1099511628211ull;
    return (uint32_t)(h ^ (h >> 32));
}

static void set_attr(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t a, int32_t v) {
    MT_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d, a, &v, sizeof v));
}

static void set_pref(cublasLtMatmulPreference_t p, cublasLtMatmulPreferenceAttributes_t a,
                     const void *v, size_t n) {
    MT_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(p, a, v, n));
}

/* One product with M, N, K > 0 (see the file comment for the mapping). */
static void lt_matmul(kern_stream_t *s, void *C, mt_dtype_t c_dt, const void *A, const void *B,
                      mt_dtype_t ab_dt, int M, int N, int K, bool ta, bool tb, float alpha,
                      float beta) {
    cudaStream_t cs = kern_cuda_stream_begin(s);
    const cudaDataType_t abt = lt_type(ab_dt), ct = lt_type(c_dt);

    const kern_cuda_gemm_plan_t pl = kern_cuda_gemm_plan(M, N, K, ta, tb);
    cublasLtMatmulDescOpaque_t desc_mem;
    cublasLtMatmulDesc_t desc = &desc_mem;
    MT_CUBLAS_CHECK(cublasLtMatmulDescInit(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSA, pl.trans_la ? CUBLAS_OP_T : CUBLAS_OP_N);
    set_attr(desc, CUBLASLT_MATMUL_DESC_TRANSB, pl.trans_lb ? CUBLAS_OP_T : CUBLAS_OP_N);
    cublasLtMatrixLayoutOpaque_t la_mem, lb_mem, lc_mem;
    cublasLtMatrixLayout_t la = &la_mem, lb = &lb_mem, lc = &lc_mem;
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(la, abt, pl.la_rows, pl.la_cols, pl.lda));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(lb, abt, pl.lb_rows, pl.lb_cols, pl.ldb));
    MT_CUBLAS_CHECK(cublasLtMatrixLayoutInit(lc, ct, pl.lc_rows, pl.lc_cols, pl.ldc));

    gemm_key_t key = {
        .M = M, .N = N, .K = K,
        .flags = (uint32_t)ta | (uint32_t)tb << 1 | (uint32_t)ab_dt << 2 | (uint32_t)c_dt << 6,
        .align = align_log2(A) | align_log2(B) << 8 | align_log2(C) << 16,
    };
    if (!s->gemm_cache) {
        s->gemm_cache = calloc(1, sizeof *s->gemm_cache);
        MT_CHECK_ALLOC(s->gemm_cache, "cuBLASLt algorithm cache");
    }
    uint32_t h = key_hash(&key);
    gemm_entry_t *hit = NULL, *victim = &s->gemm_cache->slot[h % GEMM_CACHE_SLOTS];
    for (int p = 0; p < GEMM_CACHE_PROBE; p++) {
        gemm_entry_t *e = &s->gemm_cache->slot[(h + (uint32_t)p) % GEMM_CACHE_SLOTS];
        if (e->used && key_eq(&e->key, &key)) { hit = e; break; }
        if (!e->used && victim->used) victim = e;
    }
    if (!hit) {
        cublasLtMatmulPreferenceOpaque_t pref_mem;
        cublasLtMatmulPreference_t pref = &pref_mem;
        MT_CUBLAS_CHECK(cublasLtMatmulPreferenceInit(pref));
        uint64_t ws = s->lt_workspace_bytes;
        set_pref(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws);
        uint32_t al_a = 1u << align_log2(B), al_b = 1u << align_log2(A), al_c = 1u << align_log2(C);
        set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a);
        set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b);
        set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c);
        set_pref(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c);
        cublasLtMatmulHeuristicResult_t res;
        int found = 0;
        cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(s->dev->lt, desc, la, lb, lc, lc, pref,
                                                           1, &res, &found);
        if (hs == CUBLAS_STATUS_NOT_SUPPORTED) found = 0; /* reported below with the shape */
        else MT_CUBLAS_CHECK(hs);
        MT_CHECK(found > 0 && res.state == CUBLAS_STATUS_SUCCESS,
                 "cuBLASLt has no algorithm for C(%d,%d) %s= op(A)(%d,%d) op(B)(%d,%d), trans %d/%d, "
                 "%s inputs, %s output, alignments A %u B %u C %u bytes, on device %d",
                 M, N, beta != 0.0f ? "+" : "", M, K, K, N, (int)ta, (int)tb,
                 mt_dtype_name(ab_dt), mt_dtype_name(c_dt), al_b, al_a, al_c, s->dev->ordinal);
        victim->used = true;
        victim->key = key;
        victim->algo = res.algo;
        hit = victim;
    }
    MT_CUBLAS_CHECK(cublasLtMatmul(s->dev->lt, desc, &alpha, B, la, A, lb, &beta, C, lc, C, lc,
                                   &hit->algo, s->lt_workspace, s->lt_workspace_bytes, cs));
}

/* C = beta * C, the value of a product with an empty sum (K == 0). */
static void scale_only(kern_stream_t *s, void *C, mt_dtype_t c_dt, int M, int N, float beta) {
    size_t n = (size_t)M * (size_t)N;
    if (beta == 1.0f) return;
    if (beta == 0.0f) {
        MT_CUDA_CHECK(cudaMemsetAsync(C, 0, n * mt_dtype_size(c_dt), kern_cuda_stream_begin(s)));
        return;
    }
    MT_CHECK(c_dt == MT_F32, "matmul with K == 0 and beta %g on a %s output is not supported",
             (double)beta, mt_dtype_name(c_dt));
    kern_scale_cuda(s, C, beta, n);
}

void kern_cuda_gemm(kern_stream_t *s, void *C, mt_dtype_t c_dt, const void *A, const void *B, mt_dtype_t ab_dt,
                    int M, int N, int K, bool trans_a, bool trans_b, float alpha, float beta) {
    MT_CHECK(M >= 0 && N >= 0 && K >= 0, "matmul: negative size M=%d N=%d K=%d", M, N, K);
    if (M == 0 || N == 0) return;
    if (K == 0) {
        scale_only(s, C, c_dt, M, N, beta);
        return;
    }
    lt_matmul(s, C, c_dt, A, B, ab_dt, M, N, K, trans_a, trans_b, alpha, beta);
}
