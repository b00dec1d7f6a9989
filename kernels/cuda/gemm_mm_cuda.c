/* Typed matrix products on the GPU (kern_mm, gemm.h's contract), over
 * kern_cuda_gemm's cuBLASLt calls (gemm_cuda.c).
 *
 * cuBLASLt with CUBLAS_COMPUTE_32F takes A and B of one type (F32 or BF16)
 * and C in F32, or BF16 when A and B are BF16.  What kern_mm allows beyond
 * that is reached through the stream's scratch (stream-ordered, so products
 * issued one after another on the compute stream may reuse it):
 * - bf16 compute with an operand stored F32: the operand is rounded to bf16
 *   (round to nearest even, the f32_to_bf16 kernel, as the CPU twin rounds
 *   it) into scratch first;
 * - a BF16 C that is computed in fp32 (fp32 compute) or added to (beta !=
 *   0): the product is formed in an fp32 copy of C (widened first when
 *   beta != 0) and rounded once into C.  cuBLASLt's own bf16 epilogue with
 *   beta 1 was seen on an H100 to come out up to 2 ulps from the
 *   once-rounded sum for a transposed-A shape, so it is not used.
 * When what a product needs there is larger than the scratch, the product
 * is cut into pieces that fit: along M when A is not transposed (rows of A
 * and C are contiguous), along K when A is transposed and B is not (rows of
 * A and B; the pieces add into C, kept in fp32 until the last).  An
 * lm_head's gradient (4096 tokens x a 32000-word vocabulary of fp32
 * logit gradients, 250 MiB as bf16) needs this.  A product that cannot be
 * cut so is a fatal error naming it: store the operand BF16 or raise
 * KERN_CUDA_SCRATCH_COMPUTE_BYTES.
 * kern_mm_grouped_cuda sends the products it can to cuBLAS's grouped GEMM
 * in one call (kern_cuda_gemm_grouped) and the rest through the above,
 * as MOETUNE_GROUPED_GEMM says (see grouped_mode below).
 * This file makes no CUDA call of its own: the CPU emulator (tests/gpu/emu)
 * builds it unchanged over its stand-ins for the scratch, the conversion
 * kernels and kern_cuda_gemm, so the routing is tested without a GPU. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cuda/gemm_plan.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

/* Scratch is aligned to this for cuBLASLt's fastest kernels. */
#define MM_SCRATCH_ALIGN 256

static size_t round_up(size_t n) { return (n + MM_SCRATCH_ALIGN - 1) / MM_SCRATCH_ALIGN * MM_SCRATCH_ALIGN; }

static size_t mat_elems(const kern_mat_t *m) { return (size_t)m->rows * (size_t)m->cols; }

/* One product, or one piece of one: conv_a / conv_b round an F32 operand to
 * bf16 into scratch, c32 (non-NULL) is C's fp32 copy in scratch. */
typedef struct {
    const void *A, *B;
    mt_dtype_t a_dt, b_dt;
    int M, N, K;
    float beta;
} mm_piece_t;

static void run_piece(kern_stream_t *s, const kern_mm_t *p, const mm_piece_t *q, void *C, mt_dtype_t c_dt,
                      char *scratch) {
    const bool conv_a = p->compute == MT_BF16 && q->a_dt == MT_F32;
    const bool conv_b = p->compute == MT_BF16 && q->b_dt == MT_F32;
    const void *A = q->A, *B = q->B;
    const size_t a_elems = (size_t)q->M * q->K, b_elems = (size_t)q->K * q->N;
    if (conv_a) {
        kern_f32_to_bf16_cuda(s, (uint16_t *)scratch, A, a_elems);
        A = scratch;
        scratch += round_up(a_elems * 2);
    }
    if (conv_b) {
        kern_f32_to_bf16_cuda(s, (uint16_t *)scratch, B, b_elems);
        B = scratch;
    }
    kern_cuda_gemm(s, C, c_dt, A, B, p->compute == MT_BF16 ? MT_BF16 : MT_F32, q->M, q->N, q->K, p->trans_a,
                   p->trans_b, p->alpha, q->beta);
}

static const char *elem_at(const void *base, mt_dtype_t dt, size_t elems) {
    return (const char *)base + elems * (dt == MT_BF16 ? 2 : 4);
}

static void mm_one(kern_stream_t *s, const kern_mm_t *p, int idx) {
    int M, N, K;
    kern_mm_dims(p, idx, &M, &N, &K);
    if (M == 0 || N == 0) return;
    const bool conv_a = p->compute == MT_BF16 && p->A.dtype == MT_F32 && K > 0;
    const bool conv_b = p->compute == MT_BF16 && p->B.dtype == MT_F32 && K > 0;
    /* K == 0 scales C, which the scale kernel (F32 only) cannot do in place */
    const bool c_copy = p->C.dtype == MT_BF16 &&
                        (p->compute == MT_F32 || (p->beta != 0.0f && (K > 0 || p->beta != 1.0f)));
    const size_t a_bytes = conv_a ? round_up(mat_elems(&p->A) * 2) : 0;
    const size_t b_bytes = conv_b ? round_up(mat_elems(&p->B) * 2) : 0;
    const size_t c_bytes = c_copy ? round_up((size_t)M * N * 4) : 0;
    const size_t cap = kern_cuda_scratch_capacity(s);
    mm_piece_t whole = {p->A.data, p->B.data, p->A.dtype, p->B.dtype, M, N, K, p->beta};
    const size_t need = a_bytes + b_bytes + c_bytes;
    if (need == 0) {
        run_piece(s, p, &whole, p->C.data, p->C.dtype, NULL);
        return;
    }
    char what[200]; /* names the product if the scratch is too small */
    snprintf(what, sizeof what, "kern_mm product %d (M=%d N=%d K=%d: A %s%s, B %s%s, C %s%s)", idx, M, N, K,
             mt_dtype_name(p->A.dtype), conv_a ? " rounded to bf16" : "", mt_dtype_name(p->B.dtype),
             conv_b ? " rounded to bf16" : "", mt_dtype_name(p->C.dtype), c_copy ? " formed in fp32" : "");
    if (need <= cap || (p->trans_a && p->trans_b)) {
        char *scratch = kern_cuda_scratch(s, need, what); /* aborts naming the product if it does not fit */
        void *C = p->C.data;
        mt_dtype_t c_dt = p->C.dtype;
        if (c_copy) {
            C = scratch + a_bytes + b_bytes;
            c_dt = MT_F32;
            /* beta == 0 overwrites: C may hold NaN and need not be read */
            if (p->beta != 0.0f) kern_bf16_to_f32_cuda(s, C, p->C.data, (size_t)M * N);
        }
        run_piece(s, p, &whole, C, c_dt, scratch);
        if (c_copy) kern_f32_to_bf16_cuda(s, p->C.data, C, (size_t)M * N);
        return;
    }
    if (!p->trans_a) {
        /* along M: B (rounded once) stays, each piece of rows of A and C */
        const size_t per_row = (conv_a ? (size_t)K * 2 : 0) + (c_copy ? (size_t)N * 4 : 0);
        const size_t spare = cap > b_bytes + 2 * MM_SCRATCH_ALIGN ? cap - b_bytes - 2 * MM_SCRATCH_ALIGN : 0;
        const int rows = (int)(spare / per_row < (size_t)M ? spare / per_row : (size_t)M);
        if (rows < 1) kern_cuda_scratch(s, need, what); /* not one row fits: aborts naming the product */
        char *scratch = kern_cuda_scratch(s, b_bytes + (conv_a ? round_up((size_t)rows * K * 2) : 0) +
                                                 (c_copy ? round_up((size_t)rows * N * 4) : 0),
                                          what);
        if (conv_b) kern_f32_to_bf16_cuda(s, (uint16_t *)scratch, p->B.data, mat_elems(&p->B));
        char *piece_scratch = scratch + b_bytes;
        for (int m0 = 0; m0 < M; m0 += rows) {
            const int mr = M - m0 < rows ? M - m0 : rows;
            mm_piece_t q = {elem_at(p->A.data, p->A.dtype, (size_t)m0 * K), conv_b ? scratch : p->B.data,
                            p->A.dtype, conv_b ? MT_BF16 : p->B.dtype, mr, N, K, p->beta};
            void *C = (void *)elem_at(p->C.data, p->C.dtype, (size_t)m0 * N);
            void *Cw = C;
            mt_dtype_t c_dt = p->C.dtype;
            char *rest = piece_scratch;
            if (c_copy) {
                Cw = piece_scratch;
                c_dt = MT_F32;
                rest += round_up((size_t)mr * N * 4);
                if (p->beta != 0.0f) kern_bf16_to_f32_cuda(s, Cw, C, (size_t)mr * N);
            }
            run_piece(s, p, &q, Cw, c_dt, rest);
            if (c_copy) kern_f32_to_bf16_cuda(s, C, Cw, (size_t)mr * N);
        }
        return;
    }
    /* along K (A transposed, B not): pieces of rows of A and B add into C,
     * a BF16 C in its fp32 copy until the last piece */
    const bool c32 = p->C.dtype == MT_BF16;
    const size_t c32_bytes = c32 ? round_up((size_t)M * N * 4) : 0;
    const size_t per_k = (conv_a ? (size_t)M * 2 : 0) + (conv_b ? (size_t)N * 2 : 0);
    const size_t spare = cap > c32_bytes + 2 * MM_SCRATCH_ALIGN ? cap - c32_bytes - 2 * MM_SCRATCH_ALIGN : 0;
    const int ks = (int)(per_k == 0 ? (size_t)K : (spare / per_k < (size_t)K ? spare / per_k : (size_t)K));
    if (ks < 1 || c32_bytes + 2 * MM_SCRATCH_ALIGN > cap)
        kern_cuda_scratch(s, need, what); /* C's copy and one k do not fit: aborts naming the product */
    char *scratch = kern_cuda_scratch(s,
                                      c32_bytes + (conv_a ? round_up((size_t)M * ks * 2) : 0) +
                                          (conv_b ? round_up((size_t)N * ks * 2) : 0),
                                      what);
    void *C = p->C.data;
    if (c32) {
        C = scratch;
        if (p->beta != 0.0f) kern_bf16_to_f32_cuda(s, C, p->C.data, (size_t)M * N);
    }
    for (int k0 = 0; k0 < K; k0 += ks) {
        const int kr = K - k0 < ks ? K - k0 : ks;
        mm_piece_t q = {elem_at(p->A.data, p->A.dtype, (size_t)k0 * M), elem_at(p->B.data, p->B.dtype, (size_t)k0 * N),
                        p->A.dtype, p->B.dtype, M, N, kr, k0 == 0 ? p->beta : 1.0f};
        run_piece(s, p, &q, C, c32 ? MT_F32 : p->C.dtype, scratch + c32_bytes);
    }
    if (c32) kern_f32_to_bf16_cuda(s, p->C.data, C, (size_t)M * N);
}

void kern_mm_cuda(kern_stream_t *s, const kern_mm_t *p) { mm_one(s, p, 0); }

/* How kern_mm_grouped_cuda issues its products: MOETUNE_GROUPED_GEMM=loop
 * (one cuBLASLt call per product), grouped (cuBLAS's grouped GEMM for every
 * product it can take, even one alone: what tests and benchmarks ask for)
 * or auto, the default: the grouped GEMM where two or more products can go
 * together and they are small (mean M*N*K under GROUPED_AUTO_MAX_MNK), else
 * one cuBLASLt call each.
 *
 * Why the size bound: on an H200 (CUDA 13, `moetune bench gemm --grouped`),
 * bf16 -> bf16 expert products at Qwen3-30B-A3B's geometry (128 experts of
 * ~256 rows, 2048 x 768: mean M*N*K 4e8) ran 1.7-3.2x faster grouped
 * (250-295 TFLOP/s against 67-158 one by one, the loop's rate varying
 * across machines), while Mixtral-8x7B's (8 experts of ~1024 rows, 4096 x
 * 14336: 6e10) ran 2.5x slower grouped (255-300 against 660-760):
 * cuBLASLt's per-shape algorithms win once each product fills the GPU.
 * The bound sits between the two, on a log scale.  Either way each
 * backend call is deterministic (gemm_test repeats the grouped call and
 * compares bits). */
#define GROUPED_AUTO_MAX_MNK 5e9

typedef enum { GROUPED_LOOP, GROUPED_ALWAYS, GROUPED_AUTO } grouped_mode_t;

static grouped_mode_t grouped_mode(void) {
    const char *v = getenv("MOETUNE_GROUPED_GEMM");
    if (!v || !*v || strcmp(v, "auto") == 0) return GROUPED_AUTO;
    if (strcmp(v, "loop") == 0) return GROUPED_LOOP;
    if (strcmp(v, "grouped") == 0) return GROUPED_ALWAYS;
    MT_CHECK(0, "environment MOETUNE_GROUPED_GEMM=%s: expected loop, grouped or auto", v);
    return GROUPED_AUTO;
}

static bool aligned16(const void *ptr, int64_t ld, mt_dtype_t dt) {
    return (uintptr_t)ptr % KERN_CUDA_GROUPED_ALIGN == 0 &&
           (size_t)ld * mt_dtype_size(dt) % KERN_CUDA_GROUPED_ALIGN == 0;
}

/* Whether the grouped GEMM computes product p exactly as mm_one would: A
 * and B stored in the compute dtype (nothing to round first), C written
 * directly (not through an fp32 copy: a BF16 C only with bf16 compute and
 * beta == 0), a non-empty product with a non-empty sum, and every matrix
 * and row 16-byte aligned (cuBLAS's grouped kernels assume it: a bf16
 * expert slice with an odd K faulted with a misaligned address on an H200,
 * where cuBLASLt, told the real alignment, is fine). */
static bool groupable(const kern_mm_t *p, int M, int N, int K) {
    if (M == 0 || N == 0 || K == 0) return false;
    if (p->A.dtype != p->compute || p->B.dtype != p->compute) return false;
    if (!aligned16(p->A.data, p->A.cols, p->A.dtype) || !aligned16(p->B.data, p->B.cols, p->B.dtype) ||
        !aligned16(p->C.data, p->C.cols, p->C.dtype))
        return false;
    return p->C.dtype == MT_F32 || (p->compute == MT_BF16 && p->beta == 0.0f);
}

/* The products that can go together (those groupable with the first
 * groupable one's A/B and C dtypes) as one grouped GEMM, in the
 * column-major mapping mm_one's cuBLASLt calls use (gemm_plan.h); the rest,
 * and all of them when cuBLAS refuses the combination, one by one.  The
 * products are independent, so the order among them does not matter. */
void kern_mm_grouped_cuda(kern_stream_t *s, const kern_mm_t *p, int count) {
    const grouped_mode_t mode = grouped_mode();
    if (mode == GROUPED_LOOP || count < 1) {
        for (int g = 0; g < count; g++) mm_one(s, &p[g], g);
        return;
    }
    const size_t n = (size_t)count;
    /* one block: members, then the descriptor's arrays */
    const size_t bytes = n * (sizeof(bool) * 3 + sizeof(int) * 6 + sizeof(float) * 2 + sizeof(void *) * 3);
    char *blk = malloc(bytes + 8 * sizeof(void *));
    MT_CHECK_ALLOC(blk, "grouped product descriptors");
    void **ptrs = (void **)blk; /* pointers first: the strictest alignment */
    kern_cuda_grouped_t gd = {.la = (const void **)ptrs, .lb = (const void **)(ptrs + n), .c = ptrs + 2 * n};
    int *ints = (int *)(ptrs + 3 * n);
    gd.m = ints, gd.n = ints + n, gd.k = ints + 2 * n, gd.lda = ints + 3 * n, gd.ldb = ints + 4 * n;
    gd.ldc = ints + 5 * n;
    gd.alpha = (float *)(ints + 6 * n), gd.beta = gd.alpha + n;
    bool *member = (bool *)(gd.beta + n);
    gd.trans_la = member + n, gd.trans_lb = member + 2 * n;
    int first = -1;
    double mnk = 0.0; /* summed over the members */
    for (int g = 0; g < count; g++) {
        int M, N, K;
        kern_mm_dims(&p[g], g, &M, &N, &K);
        member[g] = groupable(&p[g], M, N, K);
        if (member[g] && first < 0) {
            first = g;
            gd.ab_dt = p[g].compute;
            gd.c_dt = p[g].C.dtype;
        }
        member[g] = member[g] && p[g].compute == gd.ab_dt && p[g].C.dtype == gd.c_dt;
        if (!member[g]) continue;
        const int i = gd.count++;
        const kern_cuda_gemm_plan_t pl = kern_cuda_gemm_plan(M, N, K, p[g].trans_a, p[g].trans_b);
        gd.m[i] = pl.m, gd.n[i] = pl.n, gd.k[i] = pl.k;
        gd.lda[i] = (int)pl.lda, gd.ldb[i] = (int)pl.ldb, gd.ldc[i] = (int)pl.ldc;
        gd.trans_la[i] = pl.trans_la, gd.trans_lb[i] = pl.trans_lb;
        gd.la[i] = p[g].B.data, gd.lb[i] = p[g].A.data, gd.c[i] = p[g].C.data;
        gd.alpha[i] = p[g].alpha, gd.beta[i] = p[g].beta;
        mnk += (double)M * N * K;
    }
    char why[200];
    const bool wanted = mode == GROUPED_ALWAYS ? gd.count > 0
                                               : gd.count >= 2 && mnk / gd.count < GROUPED_AUTO_MAX_MNK;
    const bool grouped = wanted && kern_cuda_gemm_grouped(s, &gd, why, sizeof why);
    for (int g = 0; g < count; g++)
        if (!grouped || !member[g]) mm_one(s, &p[g], g);
    free(blk);
}
