/* Element-wise ops and reductions on the CPU (see elementwise.h).
 *
 * Why it is shaped this way
 * - SwiGLU was the hot spot (a libm expf call per element, forward,
 *   backward and the backward's recomputed forward): the loops run on
 *   vec.h's 16-lane vectors with its polynomial exp, in the order of
 *   operations of kern_silu / kern_swiglu_bwd_elem (act_math.h), so only
 *   the exp differs from the CUDA twin (<= 1 ulp vs libm's).
 * - Work is split into fixed chunks of ELEM_CHUNK elements over the
 *   backend's pool. Element-wise results do not depend on the split at all;
 *   the two reductions keep a fixed split:
 *     bias_bwd: tasks own column blocks and add rows in row order, exactly
 *       the sequential order;
 *     sumsq: one double partial per chunk (16 lane partials folded in a
 *       fixed tree), partials added in chunk order.
 *   So results are the same for any number of threads.
 * - Small calls (one chunk) run inline: waking the pool costs ~10-30 us. */
#include "kernels/elementwise.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/math/act_math.h"
#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"
#include "base/dtype.h"
#include "base/status.h"

/* 16 K elements: 64 KB per operand, a few microseconds of work per task. */
#define ELEM_CHUNK ((size_t)16384)

typedef enum { EW_ADD, EW_ADD_BF16, EW_AXPY, EW_SCALE, EW_SWIGLU_FWD, EW_SWIGLU_BWD, EW_SUMSQ } ew_kind_t;

typedef struct {
    ew_kind_t kind;
    float *y, *y2;            /* outputs (y2: du of swiglu_bwd) */
    const float *a, *b, *c;   /* inputs */
    const uint16_t *a16;      /* add_bf16's input */
    float alpha;
    size_t n;
    double *partials;         /* sumsq: one per task */
} ew_job_t;

KERN_CPU_CLONES static void add_range(float *y, const float *a, const float *b, size_t n) {
    size_t i = 0;
    for (; i + KERN_VL <= n; i += KERN_VL)
        kern_vf_store(y + i, kern_vf_load(a + i) + kern_vf_load(b + i));
    for (; i < n; i++) y[i] = a[i] + b[i];
}

KERN_CPU_CLONES static void add_bf16_range(float *y, const uint16_t *a, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] += mt_bf16_to_f32(a[i]);
}

KERN_CPU_CLONES static void axpy_range(float *y, float alpha, const float *x, size_t n) {
    const kern_vf_t va = kern_vf_splat(alpha);
    size_t i = 0;
    for (; i + KERN_VL <= n; i += KERN_VL)
        kern_vf_store(y + i, kern_vf_load(y + i) + va * kern_vf_load(x + i));
    for (; i < n; i++) y[i] += alpha * x[i];
}

KERN_CPU_CLONES static void scale_range(float *x, float alpha, size_t n) {
    const kern_vf_t va = kern_vf_splat(alpha);
    size_t i = 0;
    for (; i + KERN_VL <= n; i += KERN_VL) kern_vf_store(x + i, kern_vf_load(x + i) * va);
    for (; i < n; i++) x[i] *= alpha;
}

/* h = silu(g) * u with silu(g) = g / (1 + exp(-g)) (kern_silu's order). */
KERN_CPU_CLONES static void swiglu_fwd_range(float *h, const float *g, const float *u, size_t n) {
    const kern_vf_t one = kern_vf_splat(1.0f);
    for (size_t i = 0; i < n; i += KERN_VL) {
        const size_t m = n - i < KERN_VL ? n - i : KERN_VL;
        const kern_vf_t vg = m == KERN_VL ? kern_vf_load(g + i) : kern_vf_load_n(g + i, m, 0.0f);
        const kern_vf_t vu = m == KERN_VL ? kern_vf_load(u + i) : kern_vf_load_n(u + i, m, 0.0f);
        const kern_vf_t r = vg / (one + kern_vf_exp(-vg)) * vu;
        if (m == KERN_VL) kern_vf_store(h + i, r);
        else kern_vf_store_n(h + i, r, m);
    }
}

/* kern_swiglu_bwd_elem's order: sig = 1 / (1 + exp(-g)); du = dh * (g * sig);
 * dg = dh * u * (sig * (1 + g * (1 - sig))). dg/du may alias g/u: every
 * lane is loaded before any is stored. */
KERN_CPU_CLONES static void swiglu_bwd_range(float *dg, float *du, const float *dh, const float *g,
                                             const float *u, size_t n) {
    const kern_vf_t one = kern_vf_splat(1.0f);
    for (size_t i = 0; i < n; i += KERN_VL) {
        const size_t m = n - i < KERN_VL ? n - i : KERN_VL;
        kern_vf_t vd, vg, vu;
        if (m == KERN_VL) {
            vd = kern_vf_load(dh + i), vg = kern_vf_load(g + i), vu = kern_vf_load(u + i);
        } else {
            vd = kern_vf_load_n(dh + i, m, 0.0f), vg = kern_vf_load_n(g + i, m, 0.0f);
            vu = kern_vf_load_n(u + i, m, 0.0f);
        }
        const kern_vf_t sig = one / (one + kern_vf_exp(-vg));
        const kern_vf_t rdu = vd * (vg * sig);
        const kern_vf_t rdg = vd * vu * (sig * (one + vg * (one - sig)));
        if (m == KERN_VL) {
            kern_vf_store(du + i, rdu);
            kern_vf_store(dg + i, rdg);
        } else {
            kern_vf_store_n(du + i, rdu, m);
            kern_vf_store_n(dg + i, rdg, m);
        }
    }
}

/* sum x^2 in double: 16 lane partials (two interleaved sets of them, for
 * latency), folded in a fixed order. */
KERN_CPU_CLONES static double sumsq_range(const float *x, size_t n) {
    kern_vdacc_t a0 = kern_vdacc_zero(), a1 = kern_vdacc_zero();
    size_t i = 0;
    for (; i + 2 * KERN_VL <= n; i += 2 * KERN_VL) {
        const kern_vf_t x0 = kern_vf_load(x + i), x1 = kern_vf_load(x + i + KERN_VL);
        kern_vdacc_add_prod(&a0, x0, x0);
        kern_vdacc_add_prod(&a1, x1, x1);
    }
    for (int h = 0; i < n; h++, i += KERN_VL) { /* zero-padded tail: adds exact zeros */
        const size_t m = n - i < KERN_VL ? n - i : KERN_VL;
        const kern_vf_t xt = kern_vf_load_n(x + i, m, 0.0f);
        kern_vdacc_add_prod(h == 0 ? &a0 : &a1, xt, xt);
    }
    a0.lo += a1.lo;
    a0.hi += a1.hi;
    return kern_vdacc_hsum(a0);
}

static void ew_task(void *ctx, size_t t) {
    const ew_job_t *j = ctx;
    const size_t b = t * ELEM_CHUNK, e = b + ELEM_CHUNK < j->n ? b + ELEM_CHUNK : j->n, n = e - b;
    switch (j->kind) {
    case EW_ADD: add_range(j->y + b, j->a + b, j->b + b, n); break;
    case EW_ADD_BF16: add_bf16_range(j->y + b, j->a16 + b, n); break;
    case EW_AXPY: axpy_range(j->y + b, j->alpha, j->a + b, n); break;
    case EW_SCALE: scale_range(j->y + b, j->alpha, n); break;
    case EW_SWIGLU_FWD: swiglu_fwd_range(j->y + b, j->a + b, j->b + b, n); break;
    case EW_SWIGLU_BWD: swiglu_bwd_range(j->y + b, j->y2 + b, j->a + b, j->b + b, j->c + b, n); break;
    case EW_SUMSQ: j->partials[t] = sumsq_range(j->a + b, n); break;
    }
}

static void ew_run(kern_stream_t *s, ew_job_t *j) {
    kern_cpu_parallel_for(s, kern_cpu_tasks(j->n, ELEM_CHUNK), ew_task, j);
}

void kern_add_cpu(kern_stream_t *s, float *y, const float *a, const float *b, size_t n) {
    ew_job_t j = {.kind = EW_ADD, .y = y, .a = a, .b = b, .n = n};
    ew_run(s, &j);
}

void kern_add_bf16_many_cpu(kern_stream_t *s, float *const *dst, const uint16_t *const *src, const size_t *n,
                            int count) {
    for (int i = 0; i < count; i++) {
        ew_job_t j = {.kind = EW_ADD_BF16, .y = dst[i], .a16 = src[i], .n = n[i]};
        ew_run(s, &j);
    }
}

void kern_zero_many_cpu(kern_stream_t *s, float *const *dst, const size_t *n, int count) {
    (void)s;
    for (int i = 0; i < count; i++)
        if (n[i]) memset(dst[i], 0, n[i] * sizeof(float));
}

void kern_axpy_cpu(kern_stream_t *s, float *y, float alpha, const float *x, size_t n) {
    ew_job_t j = {.kind = EW_AXPY, .y = y, .a = x, .alpha = alpha, .n = n};
    ew_run(s, &j);
}

void kern_scale_cpu(kern_stream_t *s, float *x, float alpha, size_t n) {
    ew_job_t j = {.kind = EW_SCALE, .y = x, .alpha = alpha, .n = n};
    ew_run(s, &j);
}

void kern_bias_fwd_cpu(kern_stream_t *s, float *y, const float *b, int rows, int cols) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        float *yr = y + (size_t)r * cols;
        for (int c = 0; c < cols; c++) yr[c] += b[c];
    }
}

void kern_bias_bwd_cpu(kern_stream_t *s, float *db, const float *dy, int rows, int cols) {
    (void)s;
    for (int r = 0; r < rows; r++) {
        const float *dr = dy + (size_t)r * cols;
        for (int c = 0; c < cols; c++) db[c] += dr[c];
    }
}

/* clip_qkv's tensors are (n, nh*hd): small next to the products around
 * them, so one pass on the calling thread. */
void kern_clamp_fwd_cpu(kern_stream_t *s, float *y, const float *x, float c, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) y[i] = kern_clamp_elem(x[i], c);
}

void kern_clamp_bwd_cpu(kern_stream_t *s, float *dx, const float *dy, const float *x, float c, size_t n) {
    (void)s;
    for (size_t i = 0; i < n; i++) dx[i] = kern_clamp_grad_elem(dy[i], x[i], c);
}

void kern_swiglu_fwd_cpu(kern_stream_t *s, float *h, const float *g, const float *u, size_t n) {
    ew_job_t j = {.kind = EW_SWIGLU_FWD, .y = h, .a = g, .b = u, .n = n};
    ew_run(s, &j);
}

void kern_swiglu_bwd_cpu(kern_stream_t *s, float *dg, float *du, const float *dh, const float *g,
                         const float *u, size_t n) {
    ew_job_t j = {.kind = EW_SWIGLU_BWD, .y = dg, .y2 = du, .a = dh, .b = g, .c = u, .n = n};
    ew_run(s, &j);
}

/* The sum of squares on s's pool, or on `pool` when s is NULL: the same
 * tasks and the same in-order sum of their partials either way. */
static void sumsq_run(kern_stream_t *s, kern_threadpool_t *pool, float *out, const float *x, size_t n) {
    const size_t tasks = kern_cpu_tasks(n, ELEM_CHUNK);
    double one = 0.0;
    double *partials = tasks > 1 ? malloc(tasks * sizeof *partials) : &one;
    MT_CHECK_ALLOC(partials, "sumsq partial sums");
    ew_job_t j = {.kind = EW_SUMSQ, .a = x, .n = n, .partials = partials};
    if (s) ew_run(s, &j);
    else kern_threadpool_parallel_for(pool, tasks, ew_task, &j);
    double acc = 0.0;
    for (size_t t = 0; t < tasks; t++) acc += partials[t];
    *out = (float)acc;
    if (partials != &one) free(partials);
}

void kern_sumsq_cpu(kern_stream_t *s, float *out, const float *x, size_t n) { sumsq_run(s, NULL, out, x, n); }

void kern_sumsq_many_cpu(kern_stream_t *s, float *const *out, const float *const *x, const size_t *n, int count) {
    for (int i = 0; i < count; i++) sumsq_run(s, NULL, out[i], x[i], n[i]);
}

void kern_sumsq_host(kern_threadpool_t *pool, float *out, const float *x, size_t n) {
    sumsq_run(NULL, pool, out, x, n);
}

void kern_f32_to_bf16_cpu(kern_stream_t *s, uint16_t *dst, const float *src, size_t n) {
    (void)s;
    mt_convert_from_f32(dst, MT_BF16, src, n);
}

void kern_bf16_to_f32_cpu(kern_stream_t *s, float *dst, const uint16_t *src, size_t n) {
    (void)s;
    mt_convert_to_f32(dst, src, MT_BF16, n);
}

void kern_dropout_cpu(kern_stream_t *s, float *dst, const float *src, size_t n, float p, uint64_t seed) {
    (void)s;
    const float scale = 1.0f / (1.0f - p);
    for (size_t i = 0; i < n; i++) dst[i] = kern_dropout_keep(seed, i, p) ? src[i] * scale : 0.0f;
}

/* SwiGLU over bf16 storage.  The rule is act_math.h's scalar one (the CUDA
 * kernel's), here on 16 lanes: the inputs widened exactly, kern_vf_exp
 * (kern_exp_cw's bits on every input, vec_exp_test), the same operations
 * in the same order, rounded to nearest even once; the tail runs the scalar
 * rule itself.  So the twins agree bit for bit.  Chunks on the pool as
 * above (element-wise, so independent of the split). */
typedef uint16_t kern_vh_t __attribute__((vector_size(32)));  /* 16 x bf16 bits */
typedef uint32_t kern_vu_t __attribute__((vector_size(64)));  /* 16 x u32 */

KERN_VINLINE kern_vf_t bf16_load(const uint16_t *p) {
    kern_vh_t h;
    memcpy(&h, p, sizeof h);
    return (kern_vf_t)(__builtin_convertvector(h, kern_vu_t) << 16);
}

/* mt_f32_to_bf16 on 16 lanes: NaN quieted, else round to nearest even */
KERN_VINLINE void bf16_store(uint16_t *p, kern_vf_t x) {
    const kern_vu_t u = (kern_vu_t)x;
    const kern_vu_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    const kern_vu_t quiet = (u >> 16) | 0x40u;
    const kern_vu_t nan = (kern_vu_t)((u & 0x7fffffffu) > 0x7f800000u); /* all ones where NaN */
    const kern_vu_t r = (quiet & nan) | (rounded & ~nan);
    const kern_vh_t h = __builtin_convertvector(r, kern_vh_t);
    memcpy(p, &h, sizeof h);
}

KERN_CPU_CLONES static void swiglu_fwd_bf16_range(uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n) {
    const kern_vf_t one = kern_vf_splat(1.0f);
    size_t i = 0;
    for (; i + KERN_VL <= n; i += KERN_VL) {
        const kern_vf_t vg = bf16_load(g + i);
        bf16_store(h + i, vg / (one + kern_vf_exp(-vg)) * bf16_load(u + i));
    }
    for (; i < n; i++) h[i] = kern_swiglu_bf16_elem(g[i], u[i]);
}

/* dg/du may alias g/u: each block of lanes is loaded before it is stored */
KERN_CPU_CLONES static void swiglu_bwd_bf16_range(uint16_t *dg, uint16_t *du, const uint16_t *dh,
                                                  const uint16_t *g, const uint16_t *u, size_t n) {
    const kern_vf_t one = kern_vf_splat(1.0f);
    size_t i = 0;
    for (; i + KERN_VL <= n; i += KERN_VL) {
        const kern_vf_t vd = bf16_load(dh + i), vg = bf16_load(g + i), vu = bf16_load(u + i);
        const kern_vf_t sig = one / (one + kern_vf_exp(-vg));
        bf16_store(du + i, vd * (vg * sig));
        bf16_store(dg + i, vd * vu * (sig * (one + vg * (one - sig))));
    }
    for (; i < n; i++) {
        uint16_t a, c;
        kern_swiglu_bwd_bf16_elem(dh[i], g[i], u[i], &a, &c); /* reads before the (aliased) writes */
        dg[i] = a;
        du[i] = c;
    }
}

typedef struct {
    uint16_t *h, *dg, *du;
    const uint16_t *g, *u;
    const uint16_t *dh; /* NULL: forward */
    size_t n;
} swiglu_bf16_job_t;

static void swiglu_bf16_task(void *ctx, size_t t) {
    const swiglu_bf16_job_t *j = ctx;
    const size_t b = t * ELEM_CHUNK, e = b + ELEM_CHUNK < j->n ? b + ELEM_CHUNK : j->n;
    if (!j->dh) swiglu_fwd_bf16_range(j->h + b, j->g + b, j->u + b, e - b);
    else swiglu_bwd_bf16_range(j->dg + b, j->du + b, j->dh + b, j->g + b, j->u + b, e - b);
}

void kern_swiglu_fwd_bf16_cpu(kern_stream_t *s, uint16_t *h, const uint16_t *g, const uint16_t *u, size_t n) {
    swiglu_bf16_job_t j = {.h = h, .g = g, .u = u, .n = n};
    kern_cpu_parallel_for(s, kern_cpu_tasks(n, ELEM_CHUNK), swiglu_bf16_task, &j);
}

void kern_swiglu_bwd_bf16_cpu(kern_stream_t *s, uint16_t *dg, uint16_t *du, const uint16_t *dh, const uint16_t *g,
                              const uint16_t *u, size_t n) {
    swiglu_bf16_job_t j = {.dg = dg, .du = du, .dh = dh, .g = g, .u = u, .n = n};
    kern_cpu_parallel_for(s, kern_cpu_tasks(n, ELEM_CHUNK), swiglu_bf16_task, &j);
}
