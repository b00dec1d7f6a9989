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
 * every call states the real alignment of A, B and C in the preference.
 *
 * Grouped products (cuBLAS's grouped GEMM) are at the end of the file. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>

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

/* ---- Grouped products ----
 *
 * A group of independent products as one cuBLAS grouped GEMM
 * (kern_cuda_gemm_grouped); which products of kern_mm_grouped go here is
 * gemm_mm_cuda.c's choice.
 *
 * cublasGemmGroupedBatchedEx takes the per-group transposes, sizes, leading
 * dimensions, alpha and beta as host arrays, and the A, B and C pointer
 * arrays in device memory.  Those go to the stream's scratch with one
 * stream-ordered copy from a pinned staging slot; a slot is rewritten only
 * after the copy that last read it has run (an event per slot), so the host
 * does not wait unless it is a ring's worth of calls ahead of the GPU.
 *
 * The cuBLAS handle is the stream's own (cuBLASLt's handle cannot issue the
 * grouped call): bound to the stream once, given the stream's cuBLASLt
 * workspace on every call (the arena may have been released and taken again
 * since), default math (no TF32) and no reduced-precision split-K
 * reductions, so bf16 products accumulate in fp32 as cuBLASLt's do.
 *
 * Types: cuBLAS documents bf16 A/B with bf16 C and fp32 A/B/C for compute
 * 32F.  bf16 A/B with an fp32 C is asked for too; when this cuBLAS answers
 * NOT_SUPPORTED (or INVALID_VALUE) for a combination, that is said once and
 * the combination is refused from then on, and the caller loops.
 *
 * Not usable inside a CUDA graph capture: the slot wait is a host wait. */
#define GROUPED_SLOTS 8

struct kern_cuda_grouped_state {
    cublasHandle_t handle;
    char *pinned; /* GROUPED_SLOTS slots of slot_bytes */
    size_t slot_bytes;
    cudaEvent_t done[GROUPED_SLOTS]; /* the copy that last read each slot */
    bool recorded[GROUPED_SLOTS];
    int next;
    uint32_t refused; /* bit 2 * (A/B BF16) + (C BF16): combinations cuBLAS refused */
};

void kern_cuda_grouped_free(kern_cuda_grouped_state_t *g) {
    if (!g) return;
    for (int i = 0; i < GROUPED_SLOTS; i++)
        if (g->done[i]) MT_CUDA_CHECK(cudaEventDestroy(g->done[i]));
    if (g->pinned) MT_CUDA_CHECK(cudaFreeHost(g->pinned));
    if (g->handle) MT_CUBLAS_CHECK(cublasDestroy(g->handle));
    free(g);
}

static kern_cuda_grouped_state_t *state(kern_stream_t *s, cudaStream_t cs) {
    if (s->grouped) return s->grouped;
    kern_cuda_grouped_state_t *g = calloc(1, sizeof *g);
    MT_CHECK_ALLOC(g, "grouped GEMM state");
    MT_CUBLAS_CHECK(cublasCreate(&g->handle));
    MT_CUBLAS_CHECK(cublasSetStream(g->handle, cs));
    MT_CUBLAS_CHECK(cublasSetMathMode(g->handle, (cublasMath_t)(CUBLAS_DEFAULT_MATH |
                                                                  CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
    for (int i = 0; i < GROUPED_SLOTS; i++)
        MT_CUDA_CHECK(cudaEventCreateWithFlags(&g->done[i], cudaEventDisableTiming));
    s->grouped = g;
    return g;
}

/* A staging slot of at least `bytes`, free to write. */
static char *slot(kern_cuda_grouped_state_t *g, cudaStream_t cs, size_t bytes, int *idx) {
    if (bytes > g->slot_bytes) {
        /* grow: every slot's copy must have run before the old block goes */
        MT_CUDA_CHECK(cudaStreamSynchronize(cs));
        if (g->pinned) MT_CUDA_CHECK(cudaFreeHost(g->pinned));
        g->pinned = NULL;
        size_t n = 4096;
        while (n < bytes) n *= 2;
        MT_CUDA_CHECK(cudaHostAlloc((void **)&g->pinned, n * GROUPED_SLOTS, cudaHostAllocDefault));
        g->slot_bytes = n;
        memset(g->recorded, 0, sizeof g->recorded);
    }
    const int i = g->next;
    g->next = (i + 1) % GROUPED_SLOTS;
    if (g->recorded[i]) MT_CUDA_CHECK(cudaEventSynchronize(g->done[i]));
    *idx = i;
    return g->pinned + (size_t)i * g->slot_bytes;
}

static cudaDataType_t cuda_type(mt_dtype_t dt) { return dt == MT_BF16 ? CUDA_R_16BF : CUDA_R_32F; }

bool kern_cuda_gemm_grouped(kern_stream_t *s, const kern_cuda_grouped_t *g, char *why, size_t why_len) {
    MT_CHECK(g->count > 0, "grouped GEMM of %d products", g->count);
    MT_CHECK((g->ab_dt == MT_F32 || g->ab_dt == MT_BF16) && (g->c_dt == MT_F32 || g->c_dt == MT_BF16),
             "grouped GEMM: %s inputs, %s output (F32 or BF16 each)", mt_dtype_name(g->ab_dt),
             mt_dtype_name(g->c_dt));
    cudaStream_t cs = kern_cuda_stream_begin(s);
    kern_cuda_grouped_state_t *st = state(s, cs);
    const uint32_t bit = 1u << (2 * (g->ab_dt == MT_BF16) + (g->c_dt == MT_BF16));
    if (st->refused & bit) {
        snprintf(why, why_len, "cuBLAS refused %s x %s -> %s grouped products earlier in this run",
                 mt_dtype_name(g->ab_dt), mt_dtype_name(g->ab_dt), mt_dtype_name(g->c_dt));
        return false;
    }
    const size_t n = (size_t)g->count, ptr_bytes = 3 * n * sizeof(void *);
    int idx;
    void **host = (void **)slot(st, cs, ptr_bytes, &idx);
    for (size_t i = 0; i < n; i++) {
        host[i] = (void *)g->la[i];
        host[n + i] = (void *)g->lb[i];
        host[2 * n + i] = g->c[i];
    }
    void **dev = kern_cuda_scratch(s, ptr_bytes, "grouped GEMM pointer arrays");
    MT_CUDA_CHECK(cudaMemcpyAsync(dev, host, ptr_bytes, cudaMemcpyHostToDevice, cs));
    MT_CUDA_CHECK(cudaEventRecord(st->done[idx], cs));
    st->recorded[idx] = true;

    /* host arrays of the call, one malloc: ops, then ints (group sizes of 1) */
    cublasOperation_t *ops = malloc(2 * n * sizeof *ops + n * sizeof(int));
    MT_CHECK_ALLOC(ops, "grouped GEMM host arrays");
    int *ones = (int *)(ops + 2 * n);
    for (size_t i = 0; i < n; i++) {
        ops[i] = g->trans_la[i] ? CUBLAS_OP_T : CUBLAS_OP_N;
        ops[n + i] = g->trans_lb[i] ? CUBLAS_OP_T : CUBLAS_OP_N;
        ones[i] = 1;
    }
    if (s->lt_workspace) MT_CUBLAS_CHECK(cublasSetWorkspace(st->handle, s->lt_workspace, s->lt_workspace_bytes));
    const cudaDataType_t abt = cuda_type(g->ab_dt), ct = cuda_type(g->c_dt);
    cublasStatus_t rc = cublasGemmGroupedBatchedEx(
        st->handle, ops, ops + n, g->m, g->n, g->k, g->alpha, (const void *const *)dev, abt, g->lda,
        (const void *const *)(dev + n), abt, g->ldb, g->beta, dev + 2 * n, ct, g->ldc, g->count, ones,
        CUBLAS_COMPUTE_32F);
    free(ops);
    if (rc == CUBLAS_STATUS_NOT_SUPPORTED || rc == CUBLAS_STATUS_INVALID_VALUE) {
        st->refused |= bit;
        snprintf(why, why_len, "cuBLAS grouped GEMM answered %s for %s x %s -> %s products (compute 32F)",
                 cublasGetStatusName(rc), mt_dtype_name(g->ab_dt), mt_dtype_name(g->ab_dt),
                 mt_dtype_name(g->c_dt));
        fprintf(stderr, "moetune: %s on CUDA device %d; those products run one by one\n", why,
                s->dev->ordinal);
        return false;
    }
    MT_CUBLAS_CHECK(rc);
    kern_cuda_after_launch(s, __FILE__, __LINE__, "cublasGemmGroupedBatchedEx");
    return true;
}
