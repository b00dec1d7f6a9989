/* bf16 products on AVX512-BF16's vdpbf16ps (the DPBF16 path of kern_mm).
 *
 * vdpbf16ps acc, a, b adds, in each of 16 fp32 lanes, the two products of
 * the lane's pair of bf16 values: acc += a[2i+1] b[2i+1], then += a[2i] b[2i]
 * (Intel's pseudocode; each step one fp32 rounding, to nearest even).  So:
 * - operands are packed by pairs along K: A (op(A)) in row blocks of MR
 *   rows, one 32-bit (a[i,2p], a[i,2p+1]) per row and pair, broadcast to
 *   all lanes; B (op(B)) in column panels of NR = 32 columns, two zmm of
 *   (b[2p,j], b[2p+1,j]) per pair.  An odd K is padded with a zero, M and N
 *   with zero rows/columns whose results are dropped;
 * - the micro-kernel keeps an MR x NR tile of C (8 x 2 zmm) in registers;
 *   the sum over K runs in K blocks of KC_PAIRS pairs, the tile parked in
 *   an fp32 buffer between blocks, so every element is still summed in one
 *   fixed order (k ascending by pairs) whatever the blocking and threads;
 * - work is cut into tasks of MC rows x NC columns of C, a fixed function of
 *   the shape; each task owns its part of C, so results are bit-identical
 *   for any number of threads and run to run.
 *
 * Rounding and tolerance: a product of two bf16 values is exact in fp32, so
 * apart from the order of the sum this is the same arithmetic as the SGEMM
 * path, and the error bound is that of an fp32 sum of K terms,
 * |err| <= ~K * 2^-24 * sum_k |a_k b_k|.  The difference: vdpbf16ps treats
 * denormal inputs as zero and flushes denormal results (it ignores MXCSR),
 * so each step may also lose up to 2^-126 in absolute terms: K * 2^-126 at
 * most, far below the relative bound for any data that is not itself at
 * the bottom of fp32's range.  Operands are rounded to bf16 in software
 * (mt_f32_to_bf16), exactly as the SGEMM path rounds them, so a denormal
 * operand is only flushed inside the instruction.
 *
 * Why not AMX: AMX tiles need OS permission (arch_prctl) and a different
 * packing; vdpbf16ps runs on every CPU with AMX too (Sapphire Rapids+). */
#include <immintrin.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/par.h"

#define MR 8
#define NR 32
#define MC 64        /* rows of C per task (8 row blocks) */
#define NC 256       /* columns of C per task (8 panels) */
#define KC_PAIRS 256 /* K pairs per block: B block 8 panels x 32 KB, A 8 x 8 KB */
/* Elements of an operand packed per packing task. */
#define PACK_ROWS 64

#define TARGET __attribute__((target("avx512f,avx512bf16")))

/* One product, packed. */
typedef struct {
    const kern_mm_t *p;
    int M, N, K, KP; /* KP = pairs along K */
    int mb, nb;      /* row blocks (of MR), column panels (of NR) */
    uint32_t *ap;    /* (mb, KP, MR) pairs */
    uint32_t *bp;    /* (nb, KP, NR) pairs */
    int mt, nt;      /* tasks along M (of MC rows) and N (of NC columns) */
} prod_t;

typedef struct {
    prod_t *prods;
    int nprod;
    size_t *first; /* first task of each product, nprod + 1 entries */
} job_t;

static inline uint16_t ld_bf16(const void *x, mt_dtype_t dt, size_t i) {
    return dt == MT_BF16 ? ((const uint16_t *)x)[i] : mt_f32_to_bf16(((const float *)x)[i]);
}

/* op(A)[i, k] and op(B)[k, j] as bf16 bits; 0 outside K. */
static inline uint32_t a_pair(const prod_t *q, int i, int k) {
    const kern_mm_t *p = q->p;
    const size_t ld = (size_t)p->A.cols;
    uint32_t lo = 0, hi = 0;
    if (p->trans_a) {
        lo = ld_bf16(p->A.data, p->A.dtype, (size_t)k * ld + i);
        if (k + 1 < q->K) hi = ld_bf16(p->A.data, p->A.dtype, (size_t)(k + 1) * ld + i);
    } else {
        lo = ld_bf16(p->A.data, p->A.dtype, (size_t)i * ld + k);
        if (k + 1 < q->K) hi = ld_bf16(p->A.data, p->A.dtype, (size_t)i * ld + k + 1);
    }
    return lo | hi << 16;
}

static inline uint32_t b_pair(const prod_t *q, int k, int j) {
    const kern_mm_t *p = q->p;
    const size_t ld = (size_t)p->B.cols;
    uint32_t lo = 0, hi = 0;
    if (p->trans_b) {
        lo = ld_bf16(p->B.data, p->B.dtype, (size_t)j * ld + k);
        if (k + 1 < q->K) hi = ld_bf16(p->B.data, p->B.dtype, (size_t)j * ld + k + 1);
    } else {
        lo = ld_bf16(p->B.data, p->B.dtype, (size_t)k * ld + j);
        if (k + 1 < q->K) hi = ld_bf16(p->B.data, p->B.dtype, (size_t)(k + 1) * ld + j);
    }
    return lo | hi << 16;
}

/* Packing tasks: per product, ceil(mb / (PACK_ROWS/MR)) A tasks then
 * ceil(nb / (PACK_ROWS/NR)) B tasks. */
static size_t pack_tasks_a(const prod_t *q) {
    return kern_cpu_tasks((size_t)q->mb, PACK_ROWS / MR);
}
static size_t pack_tasks_b(const prod_t *q) {
    return kern_cpu_tasks((size_t)q->nb, PACK_ROWS / NR);
}

/* `pairs` pairs of a stored row whose K elements are contiguous (A not
 * transposed, B transposed: the layout of x W^T), into dst with a stride:
 * a BF16 pair is one 32-bit word as it lies in memory (little endian: the
 * lower k in the low half, as vdpbf16ps pairs them). */
static void pack_row(uint32_t *dst, size_t stride, const void *row, mt_dtype_t dt, int K) {
    const int full = K / 2;
    if (dt == MT_BF16) {
        const uint16_t *x = row;
        for (int kp = 0; kp < full; kp++) {
            uint32_t w;
            memcpy(&w, x + 2 * kp, sizeof w);
            dst[(size_t)kp * stride] = w;
        }
        if (K & 1) dst[(size_t)full * stride] = x[K - 1];
    } else {
        const float *x = row;
        for (int kp = 0; kp < full; kp++)
            dst[(size_t)kp * stride] =
                mt_f32_to_bf16(x[2 * kp]) | (uint32_t)mt_f32_to_bf16(x[2 * kp + 1]) << 16;
        if (K & 1) dst[(size_t)full * stride] = mt_f32_to_bf16(x[K - 1]);
    }
}

static const void *row_at(const kern_mat_t *m, int r) {
    return (const char *)m->data + (size_t)r * (size_t)m->cols * mt_dtype_size(m->dtype);
}

/* k outer, the block's rows inner: with trans_a those rows are adjacent in
 * one stored row of A, so each cache line of A is read once. */
static void pack_a(const prod_t *q, int b0, int b1) {
    if (!q->p->trans_a) { /* rows of op(A) are stored rows */
        for (int b = b0; b < b1; b++)
            for (int r = 0; r < MR; r++) {
                const int i = b * MR + r;
                uint32_t *dst = q->ap + (size_t)b * q->KP * MR + r;
                if (i < q->M) pack_row(dst, MR, row_at(&q->p->A, i), q->p->A.dtype, q->K);
                else
                    for (int kp = 0; kp < q->KP; kp++) dst[(size_t)kp * MR] = 0;
            }
        return;
    }
    for (int b = b0; b < b1; b++) {
        uint32_t *dst = q->ap + (size_t)b * q->KP * MR;
        for (int kp = 0; kp < q->KP; kp++)
            for (int r = 0; r < MR; r++) {
                const int i = b * MR + r;
                dst[(size_t)kp * MR + r] = i < q->M ? a_pair(q, i, 2 * kp) : 0;
            }
    }
}

static void pack_b(const prod_t *q, int b0, int b1) {
    if (q->p->trans_b) { /* columns of op(B) are stored rows */
        for (int b = b0; b < b1; b++)
            for (int c = 0; c < NR; c++) {
                const int j = b * NR + c;
                uint32_t *dst = q->bp + (size_t)b * q->KP * NR + c;
                if (j < q->N) pack_row(dst, NR, row_at(&q->p->B, j), q->p->B.dtype, q->K);
                else
                    for (int kp = 0; kp < q->KP; kp++) dst[(size_t)kp * NR] = 0;
            }
        return;
    }
    for (int b = b0; b < b1; b++) {
        uint32_t *dst = q->bp + (size_t)b * q->KP * NR;
        for (int kp = 0; kp < q->KP; kp++)
            for (int c = 0; c < NR; c++) {
                const int j = b * NR + c;
                dst[(size_t)kp * NR + c] = j < q->N ? b_pair(q, 2 * kp, j) : 0;
            }
    }
}

static void pack_task(void *ctx, size_t t) {
    const job_t *j = ctx;
    int g = 0;
    while (t >= j->first[g + 1]) g++;
    const prod_t *q = &j->prods[g];
    size_t u = t - j->first[g];
    const size_t na = pack_tasks_a(q);
    if (u < na) {
        const int b0 = (int)u * (PACK_ROWS / MR), b1 = b0 + PACK_ROWS / MR;
        pack_a(q, b0, b1 < q->mb ? b1 : q->mb);
    } else {
        u -= na;
        const int b0 = (int)u * (PACK_ROWS / NR), b1 = b0 + PACK_ROWS / NR;
        pack_b(q, b0, b1 < q->nb ? b1 : q->nb);
    }
}

/* tile (MR, NR) fp32 += A block (kp pairs) @ B panel; `first` starts from 0. */
TARGET static void micro(const uint32_t *ap, const uint32_t *bp, int kp, float *tile, bool first) {
    __m512 c0[MR], c1[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        c0[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(tile + r * NR);
        c1[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(tile + r * NR + 16);
    }
    for (int k = 0; k < kp; k++) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp);
        const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + 16);
        bp += NR;
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            const __m512bh a = (__m512bh)_mm512_set1_epi32((int)ap[r]);
            c0[r] = _mm512_dpbf16_ps(c0[r], a, b0);
            c1[r] = _mm512_dpbf16_ps(c1[r], a, b1);
        }
        ap += MR;
    }
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        _mm512_storeu_ps(tile + r * NR, c0[r]);
        _mm512_storeu_ps(tile + r * NR + 16, c1[r]);
    }
}

/* C[i, j] = alpha acc + beta C (beta == 0: C is not read), in C's dtype. */
static void store_tile(const prod_t *q, const float *tile, int i0, int j0) {
    const kern_mm_t *p = q->p;
    const int rows = q->M - i0 < MR ? q->M - i0 : MR, cols = q->N - j0 < NR ? q->N - j0 : NR;
    for (int r = 0; r < rows; r++) {
        const size_t o = (size_t)(i0 + r) * q->N + j0;
        if (p->C.dtype == MT_F32) {
            float *c = (float *)p->C.data + o;
            for (int j = 0; j < cols; j++) {
                float v = p->alpha * tile[r * NR + j];
                if (p->beta != 0.0f) v += p->beta * c[j];
                c[j] = v;
            }
        } else {
            uint16_t *c = (uint16_t *)p->C.data + o;
            for (int j = 0; j < cols; j++) {
                float v = p->alpha * tile[r * NR + j];
                if (p->beta != 0.0f) v += p->beta * mt_bf16_to_f32(c[j]);
                c[j] = mt_f32_to_bf16(v);
            }
        }
    }
}

static void compute_task(void *ctx, size_t t) {
    const job_t *j = ctx;
    int g = 0;
    while (t >= j->first[g + 1]) g++;
    const prod_t *q = &j->prods[g];
    const size_t u = t - j->first[g];
    const int ti = (int)(u / (size_t)q->nt), tj = (int)(u % (size_t)q->nt);
    const int rb0 = ti * (MC / MR), rb1 = rb0 + MC / MR < q->mb ? rb0 + MC / MR : q->mb;
    const int cb0 = tj * (NC / NR), cb1 = cb0 + NC / NR < q->nb ? cb0 + NC / NR : q->nb;
    /* the task's C block, (row block, panel, MR, NR) */
    float acc[(MC / MR) * (NC / NR) * MR * NR]; /* 64 KB */
    for (int k0 = 0; k0 < q->KP; k0 += KC_PAIRS) {
        const int kp = q->KP - k0 < KC_PAIRS ? q->KP - k0 : KC_PAIRS;
        for (int cb = cb0; cb < cb1; cb++)
            for (int rb = rb0; rb < rb1; rb++) {
                float *tile = acc + ((size_t)(rb - rb0) * (NC / NR) + (cb - cb0)) * MR * NR;
                micro(q->ap + ((size_t)rb * q->KP + k0) * MR, q->bp + ((size_t)cb * q->KP + k0) * NR,
                      kp, tile, k0 == 0);
            }
    }
    for (int rb = rb0; rb < rb1; rb++)
        for (int cb = cb0; cb < cb1; cb++)
            store_tile(q, acc + ((size_t)(rb - rb0) * (NC / NR) + (cb - cb0)) * MR * NR, rb * MR,
                       cb * NR);
}

void kern_cpu_dpbf16_batch(kern_stream_t *s, const kern_mm_t *p, int count) {
    MT_CHECK(kern_cpu_bf16_path_available(KERN_CPU_BF16_DPBF16),
             "kern_mm: the vdpbf16ps path needs a CPU with avx512_bf16");
    prod_t *q = calloc((size_t)count, sizeof *q);
    size_t *first = malloc(((size_t)count + 1) * sizeof *first);
    MT_CHECK(q && first, "kern_mm: out of host memory for %d products", count);
    size_t ap_n = 0, bp_n = 0;
    for (int g = 0; g < count; g++) {
        q[g].p = &p[g];
        q[g].M = (int)(p[g].trans_a ? p[g].A.cols : p[g].A.rows);
        q[g].K = (int)(p[g].trans_a ? p[g].A.rows : p[g].A.cols);
        q[g].N = (int)(p[g].trans_b ? p[g].B.rows : p[g].B.cols);
        q[g].KP = (q[g].K + 1) / 2;
        q[g].mb = (q[g].M + MR - 1) / MR;
        q[g].nb = (q[g].N + NR - 1) / NR;
        q[g].mt = (q[g].M + MC - 1) / MC;
        q[g].nt = (q[g].N + NC - 1) / NC;
        ap_n += (size_t)q[g].mb * q[g].KP * MR;
        bp_n += (size_t)q[g].nb * q[g].KP * NR;
    }
    uint32_t *buf = malloc((ap_n + bp_n + 1) * sizeof *buf);
    MT_CHECK(buf, "kern_mm: out of host memory for %zu bytes of packed bf16 operands",
             (ap_n + bp_n) * sizeof *buf);
    uint32_t *next = buf;
    for (int g = 0; g < count; g++) {
        q[g].ap = next;
        next += (size_t)q[g].mb * q[g].KP * MR;
        q[g].bp = next;
        next += (size_t)q[g].nb * q[g].KP * NR;
    }
    job_t j = {.prods = q, .nprod = count, .first = first};
    first[0] = 0;
    for (int g = 0; g < count; g++) first[g + 1] = first[g] + pack_tasks_a(&q[g]) + pack_tasks_b(&q[g]);
    kern_cpu_parallel_for(s, first[count], pack_task, &j);
    for (int g = 0; g < count; g++) first[g + 1] = first[g] + (size_t)q[g].mt * q[g].nt;
    kern_cpu_parallel_for(s, first[count], compute_task, &j);
    free(buf);
    free(q);
    free(first);
}
