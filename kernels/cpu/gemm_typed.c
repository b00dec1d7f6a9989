/* Typed matrix products on the CPU (kern_mm, gemm.h's contract).
 *
 * Three routes, chosen per product:
 * - compute MT_F32 with A, B, C all F32: straight to gemm.c's sgemm pieces
 *   with no conversion or copy, so an fp32 product is exactly the sgemm
 *   calls kern_cpu_sgemm_batch makes (mm_test checks it bit for bit);
 * - compute MT_BF16 on the DPBF16 path: gemm_dpbf16.c packs the operands
 *   into bf16 panels and runs vdpbf16ps;
 * - everything else (bf16 compute on the SGEMM path, or a BF16 C): the
 *   operands that need it are converted into fp32 scratch (bf16 storage
 *   widened exactly; F32 storage under bf16 compute rounded to a bf16 value
 *   held in fp32), the products run as sgemm pieces, and a BF16 C is
 *   rounded once from the fp32 result.  A product of two bf16 values has
 *   at most 16 significant bits, so sgemm forms it exactly and this is
 *   "bf16 inputs, fp32 accumulation" up to the order of the sum.
 *
 * Scratch is host memory taken per call: the CPU backend's kernels run
 * synchronously, so it is freed before the call returns.  Conversions are
 * cut into fixed-size chunks over the backend's pool (chunking depends on
 * sizes only, and each element is converted alone, so results do not
 * depend on the thread count). */
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/par.h"
#include "kernels/gemm.h"

/* Elements per conversion task: big enough that a task outweighs the
 * pool's hand-out cost, small enough to balance a few threads. */
#define CONV_CHUNK ((size_t)1 << 16)

/* ---- conversions into and out of fp32 scratch ---------------------------- */

typedef enum {
    CONV_WIDEN,  /* f[i] = bf16 x[i], exact */
    CONV_ROUND,  /* f[i] = bf16(F32 x[i]) held in fp32 */
    CONV_NARROW, /* bf16 x[i] = round(f[i]) */
} conv_op_t;

typedef struct {
    float *f;
    void *x;
    size_t n;
    conv_op_t op;
} conv_t;

typedef struct {
    conv_t *v;
    size_t n, cap;
} conv_list_t;

/* Appends a conversion of n elements, cut into CONV_CHUNK pieces. */
static void conv_add(conv_list_t *l, float *f, void *x, size_t n, conv_op_t op) {
    for (size_t o = 0; o < n; o += CONV_CHUNK) {
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 16;
            l->v = realloc(l->v, l->cap * sizeof *l->v);
            MT_CHECK(l->v, "kern_mm: out of host memory for %zu conversion tasks", l->cap);
        }
        const size_t w = n - o < CONV_CHUNK ? n - o : CONV_CHUNK;
        const size_t xs = op == CONV_ROUND ? sizeof(float) : sizeof(uint16_t);
        l->v[l->n++] = (conv_t){.f = f + o, .x = (char *)x + o * xs, .n = w, .op = op};
    }
}

static void conv_task(void *ctx, size_t t) {
    const conv_t *c = &((const conv_t *)ctx)[t];
    switch (c->op) {
    case CONV_WIDEN: {
        const uint16_t *x = c->x;
        for (size_t i = 0; i < c->n; i++) c->f[i] = mt_bf16_to_f32(x[i]);
        break;
    }
    case CONV_ROUND: {
        const float *x = c->x;
        for (size_t i = 0; i < c->n; i++) c->f[i] = mt_bf16_to_f32(mt_f32_to_bf16(x[i]));
        break;
    }
    case CONV_NARROW: {
        uint16_t *x = c->x;
        for (size_t i = 0; i < c->n; i++) x[i] = mt_f32_to_bf16(c->f[i]);
        break;
    }
    }
}

static void conv_run(kern_stream_t *s, conv_list_t *l) {
    kern_cpu_parallel_for(s, l->n, conv_task, l->v);
    l->n = 0;
}

/* The fp32 operand sgemm reads for a stored operand under `compute`:
 * the data itself when no conversion is needed, else scratch at *next. */
static const float *operand(conv_list_t *l, const kern_mat_t *m, mt_dtype_t compute, float **next) {
    const size_t n = (size_t)m->rows * (size_t)m->cols;
    if (m->dtype == MT_F32 && compute == MT_F32) return m->data;
    float *f = *next;
    *next += n;
    conv_add(l, f, m->data, n, m->dtype == MT_BF16 ? CONV_WIDEN : CONV_ROUND);
    return f;
}

static size_t scratch_floats(const kern_mm_t *p, int M, int N) {
    size_t n = 0;
    if (p->compute == MT_BF16 || p->A.dtype != MT_F32) n += (size_t)p->A.rows * (size_t)p->A.cols;
    if (p->compute == MT_BF16 || p->B.dtype != MT_F32) n += (size_t)p->B.rows * (size_t)p->B.cols;
    if (p->C.dtype == MT_BF16) n += (size_t)M * (size_t)N;
    return n;
}

/* ---- the products -------------------------------------------------------- */

void kern_mm_grouped_cpu_path(kern_stream_t *s, const kern_mm_t *p, int count,
                              kern_cpu_bf16_path_t path) {
    if (count <= 0) return;
    MT_CHECK(kern_cpu_bf16_path_available(path), "kern_mm: bf16 path '%s' is not available on this CPU",
             kern_cpu_bf16_path_name(path));
    for (int g = 0; g < count; g++) { /* every check before any allocation */
        int M, N, K;
        kern_mm_dims(&p[g], g, &M, &N, &K);
    }
    kern_cpu_sgemm_t *sg = malloc((size_t)count * sizeof *sg);
    kern_mm_t *dp = malloc((size_t)count * sizeof *dp);
    int *idx = malloc((size_t)count * sizeof *idx); /* sgemm product -> its kern_mm_t */
    MT_CHECK(sg && dp && idx, "kern_mm: out of host memory for %d products", count);
    int nsg = 0, ndp = 0;
    size_t scratch_n = 0;
    for (int g = 0; g < count; g++) {
        int M, N, K;
        kern_mm_dims(&p[g], g, &M, &N, &K);
        if (M == 0 || N == 0) continue;
        /* K == 0 (C = beta C) needs no kernel: the sgemm route does it */
        if (p[g].compute == MT_BF16 && path == KERN_CPU_BF16_DPBF16 && K > 0) {
            dp[ndp++] = p[g];
            continue;
        }
        scratch_n += scratch_floats(&p[g], M, N);
        idx[nsg] = g;
        sg[nsg++] = (kern_cpu_sgemm_t){.M = M, .N = N, .K = K, .ta = p[g].trans_a,
                                       .tb = p[g].trans_b, .alpha = p[g].alpha, .beta = p[g].beta};
    }
    if (ndp) kern_cpu_dpbf16_batch(s, dp, ndp);
    if (nsg) {
        float *scratch = scratch_n ? malloc(scratch_n * sizeof *scratch) : NULL;
        MT_CHECK(scratch || !scratch_n, "kern_mm: out of host memory for %zu floats of scratch",
                 scratch_n);
        float *next = scratch;
        conv_list_t in = {0}, out = {0};
        for (int i = 0; i < nsg; i++) {
            const kern_mm_t *q = &p[idx[i]];
            sg[i].A = operand(&in, &q->A, q->compute, &next);
            sg[i].B = operand(&in, &q->B, q->compute, &next);
            if (q->C.dtype == MT_F32) {
                sg[i].C = q->C.data;
                continue;
            }
            const size_t cn = (size_t)sg[i].M * (size_t)sg[i].N;
            sg[i].C = next;
            next += cn;
            /* beta == 0 overwrites: C may hold NaN and need not be read */
            if (q->beta != 0.0f) conv_add(&in, sg[i].C, q->C.data, cn, CONV_WIDEN);
            conv_add(&out, sg[i].C, q->C.data, cn, CONV_NARROW);
        }
        conv_run(s, &in);
        kern_cpu_sgemm_batch(s, sg, nsg);
        conv_run(s, &out);
        free(in.v);
        free(out.v);
        free(scratch);
    }
    free(sg);
    free(dp);
    free(idx);
}

void kern_mm_grouped_cpu(kern_stream_t *s, const kern_mm_t *p, int count) {
    kern_mm_grouped_cpu_path(s, p, count, kern_cpu_bf16_path_default());
}

void kern_mm_cpu(kern_stream_t *s, const kern_mm_t *p) {
    kern_mm_grouped_cpu_path(s, p, 1, kern_cpu_bf16_path_default());
}
