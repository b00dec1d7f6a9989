/* Host AdamW: one fused, multithreaded pass over p, m, v and the gradient.
 *
 * Why it is shaped this way
 * - It is bound by memory bandwidth, not arithmetic: each element reads
 *   p, m, v, g and writes p, m, v (28 bytes; 26 with a bf16 gradient, +2
 *   for the bf16 working copy). One pass touches each byte once; torch's
 *   per-op AdamW makes ~10 passes over the same arrays.
 * - The arithmetic must still fit under the memory time, and only just
 *   does on a machine with few cores: one sqrt and two divides per element
 *   (the divider is the busiest unit) take ~0.85 ns per element per core
 *   with data in cache (AVX-512 or AVX2), against ~1.5 ns per element per
 *   core to stream 28 bytes when 2 cores share ~38 GB/s. Software prefetch
 *   (below) keeps loads in flight while the core waits on the divider.
 * - Every path (scalar, AVX2+FMA, AVX-512) rounds exactly like the others
 *   (see adamw_host.h for the op order): the only fused op is the lerp's FMA,
 *   which the scalar path gets from fmaf(). So results are bit-identical
 *   across paths, thread counts and machines, which keeps the engine's
 *   "plan changes where, not what" invariant testable. This file is built
 *   with -ffp-contract=off so the compiler never fuses anything else.
 * - Paths are chosen at run time (__builtin_cpu_supports); only the SIMD
 *   functions carry target attributes, so the build stays -march=x86-64-v2.
 * - Work is split into tasks of a few hundred KB to ~2 MB of traffic (see
 *   kern_adamw_chunk_elems), with task boundaries on p's cache lines so two
 *   threads never write the same line.
 * - Out of place (the speculative optimizer's spare, engine/optim/
 *   speculate.h) the destinations are lines the pass never read: a normal
 *   store first reads each one in (write-allocate), 12 more bytes per
 *   element. Where p, m and v sit on the same 64-byte phase (the spares are
 *   allocated 64-byte aligned) the vector loops stream their stores past
 *   the cache instead (_mm*_stream_ps, then one sfence), which writes whole
 *   lines without reading them. The values are the same bits. */
#include "kernels/host/adamw_host.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "kernels/math/adamw_math.h"
#include "base/dtype.h"
#include "base/status.h"

typedef struct adamw_job adamw_job_t;
/* returns 1 when a master value it wrote is NaN or Inf */
typedef int (*adamw_range_fn)(const adamw_job_t *j, size_t b, size_t e);

struct adamw_job {
    kern_adamw_coef_t c;
    float *p, *m, *v;    /* (n) written */
    const float *ps, *ms, *vs; /* (n) read: p, m, v in place, else buffers apart from them */
    const float *g;      /* (n) or NULL */
    const uint16_t *gb;  /* (n) bf16 gradient, or NULL */
    uint16_t *pb;        /* (n) bf16 copy of p, or NULL */
    size_t n;
    size_t chunk;        /* elements per task */
    size_t mis;          /* p's offset in elements past its previous 64-byte line */
    int *bad;            /* kern_adamw_params_t.nonfinite */
    int nt;              /* out of place, p, m and v on the same 64-byte phase: streaming stores */
    adamw_range_fn fn;
};

/* ---- scalar: the definition every SIMD path reproduces bit for bit ----
 * The per-call constants (kern_adamw_coef: each rounded to float once, as
 * torch rounds its Python-double scalars when it applies them to an fp32
 * tensor) and the per-element arithmetic (kern_adamw_elem) come from
 * kernels/math/adamw_math.h, which the CUDA twin compiles too: one definition
 * for the scalar path and the device, and the tests hold the SIMD paths
 * to it bit for bit. */

static inline int adamw_elem_at(const adamw_job_t *j, size_t i) {
    const float g = j->g ? j->g[i] : mt_bf16_to_f32(j->gb[i]);
    float m = j->ms[i], v = j->vs[i]; /* every read before any write: src may be dst */
    const float p = kern_adamw_elem(&j->c, j->ps[i], &m, &v, g);
    j->p[i] = p;
    j->m[i] = m;
    j->v[i] = v;
    if (j->pb) j->pb[i] = mt_f32_to_bf16(p);
    return !isfinite(p);
}

static int adamw_range_scalar(const adamw_job_t *j, size_t b, size_t e) {
    int bad = 0;
    for (size_t i = b; i < e; i++) bad |= adamw_elem_at(j, i);
    return bad;
}

/* The finite check rides along in the vector loops: p * 0 is +-0 for a
 * finite p and NaN otherwise, and OR-ing those bits keeps an all-ones
 * exponent once one lane had it (one multiply and one OR per vector, on
 * data already in registers). */

/* Elements to do one at a time before p + i is 64-byte aligned (so the
 * vector loop's loads and stores of p never split a cache line). */
static inline size_t adamw_peel(const adamw_job_t *j, size_t b, size_t e) {
    const size_t off = ((uintptr_t)(j->p + b) & 63u) / sizeof(float);
    size_t k = ((uintptr_t)(j->p + b) & 3u) ? 0 : (16 - off) & 15;
    return k < e - b ? k : e - b;
}

/* Software prefetch distance. The hardware prefetchers stop at every 4 KB
 * page and ramp up again, and while the core sits on the divider chain it
 * issues loads late; asking for each stream's line 512 bytes ahead keeps
 * enough misses in flight. Measured on the 2-core AVX-512 machine this was
 * written on: +5..10% of the in-place ceiling (256..1024 B all alike). */
#define ADAMW_PF_FLOATS (512 / sizeof(float))

/* ---- AVX2 + FMA: 8 lanes ---- */

#define MT_AVX2 __attribute__((target("avx2,fma")))

MT_AVX2 static inline __m256i bf16_round_avx2(__m256 x) {
    const __m256i u = _mm256_castps_si256(x);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    const __m256i r = _mm256_srli_epi32(
        _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    const __m256i absu = _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff));
    const __m256i nan = _mm256_cmpgt_epi32(absu, _mm256_set1_epi32(0x7f800000));
    const __m256i qnan = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));
    return _mm256_blendv_epi8(r, qnan, nan); /* 8 x u32, each < 0x10000 */
}

typedef struct {
    __m256 gs, dec, lc, b2, omb2, bc2, eps, nstep;
    int lbase_m;
} adamw_avx2_k_t;

/* 8 elements at i: reads ps, ms, vs, writes p, m, v and returns the new p.
 * No restrict here: in place the sources are the destinations (every load
 * comes before the stores); the callers' locals carry the no-alias facts. */
MT_AVX2 __attribute__((always_inline)) static inline __m256 adamw_avx2_8(
    const adamw_avx2_k_t *k, const float *ps, const float *ms, const float *vs, float *p, float *m, float *v,
    const float *g, const uint16_t *gb, size_t i, const int gbf16, const int nt) {
    __m256 gv;
    if (gbf16)
        gv = _mm256_castsi256_ps(_mm256_slli_epi32(
            _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(gb + i))), 16));
    else
        gv = _mm256_loadu_ps(g + i);
    gv = _mm256_mul_ps(gv, k->gs);
    __m256 pv = _mm256_mul_ps(_mm256_loadu_ps(ps + i), k->dec);
    __m256 mv = _mm256_loadu_ps(ms + i);
    const __m256 dv = _mm256_sub_ps(gv, mv);
    mv = _mm256_fmadd_ps(k->lc, dv, k->lbase_m ? mv : gv);
    const __m256 gg = _mm256_mul_ps(_mm256_mul_ps(k->omb2, gv), gv);
    const __m256 vv = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(vs + i), k->b2), gg);
    const __m256 den = _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(vv), k->bc2), k->eps);
    pv = _mm256_add_ps(pv, _mm256_div_ps(_mm256_mul_ps(k->nstep, mv), den));
    if (nt) { /* 32-byte aligned: p + i is (adamw_peel), m and v share its phase (adamw_job_t.nt) */
        _mm256_stream_ps(p + i, pv);
        _mm256_stream_ps(m + i, mv);
        _mm256_stream_ps(v + i, vv);
    } else {
        _mm256_storeu_ps(p + i, pv);
        _mm256_storeu_ps(m + i, mv);
        _mm256_storeu_ps(v + i, vv);
    }
    return pv;
}

/* 16 elements per iteration (two halves of 8), so that one prefetch per
 * stream covers one 64-byte line and the bf16 packing of both halves
 * costs one pack and one permute. The arrays are distinct by contract
 * (restrict) and held in locals so the compiler need not reload them from
 * the job after every store.  oop (a constant): the sources are buffers of
 * their own, read through ps, ms, vs; in place those stay NULL and unused
 * (a restrict pointer aliasing p would be undefined), and p, m, v are read
 * as they were before the out-of-place form existed. */
MT_AVX2 __attribute__((always_inline)) static inline int adamw_avx2_body(
    const adamw_job_t *j, size_t b, size_t e, const int gbf16, const int pbf16, const int oop) {
    const kern_adamw_coef_t *c = &j->c;
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict ps = oop ? j->ps : NULL, *restrict ms = oop ? j->ms : NULL,
                          *restrict vs = oop ? j->vs : NULL;
    const float *const lp = oop ? ps : p, *const lm = oop ? ms : m, *const lv = oop ? vs : v;
    const float *restrict g = j->g;
    const uint16_t *restrict gb = j->gb;
    uint16_t *restrict pb = j->pb;
    const adamw_avx2_k_t k = {
        .gs = _mm256_set1_ps(c->gscale), .dec = _mm256_set1_ps(c->decay),
        .lc = _mm256_set1_ps(c->lcoef), .b2 = _mm256_set1_ps(c->beta2),
        .omb2 = _mm256_set1_ps(c->omb2), .bc2 = _mm256_set1_ps(c->bc2_sqrt),
        .eps = _mm256_set1_ps(c->eps), .nstep = _mm256_set1_ps(c->neg_step),
        .lbase_m = c->lbase_m,
    };
    const size_t d = ADAMW_PF_FLOATS;
    size_t i = b;
    int bad = 0;
    __m256 nf = _mm256_setzero_ps();
    const __m256 zero = _mm256_setzero_ps();
    const int nt = oop && j->nt;
    for (const size_t pe = b + adamw_peel(j, b, e); i < pe; i++) bad |= adamw_elem_at(j, i);
    for (; i + 16 <= e; i += 16) {
        _mm_prefetch((const char *)(lp + i + d), _MM_HINT_T0);
        _mm_prefetch((const char *)(lm + i + d), _MM_HINT_T0);
        _mm_prefetch((const char *)(lv + i + d), _MM_HINT_T0);
        _mm_prefetch(gbf16 ? (const char *)(gb + i + d) : (const char *)(g + i + d), _MM_HINT_T0);
        const __m256 lo = adamw_avx2_8(&k, lp, lm, lv, p, m, v, g, gb, i, gbf16, nt);
        const __m256 hi = adamw_avx2_8(&k, lp, lm, lv, p, m, v, g, gb, i + 8, gbf16, nt);
        nf = _mm256_or_ps(nf, _mm256_or_ps(_mm256_mul_ps(lo, zero), _mm256_mul_ps(hi, zero)));
        if (pbf16) {
            /* packus interleaves per 128-bit lane (lo0 hi0 lo1 hi1 in
             * quadwords); the permute puts them back in order */
            const __m256i pk = _mm256_packus_epi32(bf16_round_avx2(lo), bf16_round_avx2(hi));
            _mm256_storeu_si256((__m256i *)(pb + i), _mm256_permute4x64_epi64(pk, 0xD8));
        }
    }
    for (; i < e; i++) bad |= adamw_elem_at(j, i);
    if (nt) _mm_sfence(); /* the streamed lines reach memory before the task is reported done */
    const __m256i ex = _mm256_set1_epi32(0x7f800000);
    return bad | (_mm256_movemask_epi8(_mm256_cmpeq_epi32(_mm256_and_si256(_mm256_castps_si256(nf), ex), ex)) != 0);
}

MT_AVX2 static int adamw_range_avx2(const adamw_job_t *j, size_t b, size_t e) {
    const int gbf16 = j->g == NULL, pbf16 = j->pb != NULL;
    if (gbf16 && pbf16) return adamw_avx2_body(j, b, e, 1, 1, 0);
    if (gbf16) return adamw_avx2_body(j, b, e, 1, 0, 0);
    if (pbf16) return adamw_avx2_body(j, b, e, 0, 1, 0);
    return adamw_avx2_body(j, b, e, 0, 0, 0);
}

MT_AVX2 static int adamw_range_avx2_oop(const adamw_job_t *j, size_t b, size_t e) {
    const int gbf16 = j->g == NULL, pbf16 = j->pb != NULL;
    if (gbf16 && pbf16) return adamw_avx2_body(j, b, e, 1, 1, 1);
    if (gbf16) return adamw_avx2_body(j, b, e, 1, 0, 1);
    if (pbf16) return adamw_avx2_body(j, b, e, 0, 1, 1);
    return adamw_avx2_body(j, b, e, 0, 0, 1);
}

/* ---- AVX-512F: 16 lanes ---- */

#define MT_AVX512 __attribute__((target("avx512f,avx2,fma")))

MT_AVX512 static inline __m256i bf16_round_avx512(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(
        _mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    const __m512i absu = _mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff));
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(absu, _mm512_set1_epi32(0x7f800000));
    r = _mm512_mask_or_epi32(r, nan, _mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(r); /* values < 0x10000: truncation is exact */
}

/* oop: as adamw_avx2_body's */
MT_AVX512 __attribute__((always_inline)) static inline int adamw_avx512_body(
    const adamw_job_t *j, size_t b, size_t e, const int gbf16, const int pbf16, const int oop) {
    const kern_adamw_coef_t *c = &j->c;
    float *restrict p = j->p, *restrict m = j->m, *restrict v = j->v;
    const float *restrict ps = oop ? j->ps : NULL, *restrict ms = oop ? j->ms : NULL,
                          *restrict vs = oop ? j->vs : NULL;
    const float *const lp = oop ? ps : p, *const lm = oop ? ms : m, *const lv = oop ? vs : v;
    const float *restrict g = j->g;
    const uint16_t *restrict gb = j->gb;
    uint16_t *restrict pb = j->pb;
    const __m512 gs = _mm512_set1_ps(c->gscale), dec = _mm512_set1_ps(c->decay);
    const __m512 lc = _mm512_set1_ps(c->lcoef), b2 = _mm512_set1_ps(c->beta2);
    const __m512 omb2 = _mm512_set1_ps(c->omb2), bc2 = _mm512_set1_ps(c->bc2_sqrt);
    const __m512 eps = _mm512_set1_ps(c->eps), nstep = _mm512_set1_ps(c->neg_step);
    const int lbase_m = c->lbase_m;
    const size_t d = ADAMW_PF_FLOATS;
    size_t i = b;
    int bad = 0;
    __m512i nf = _mm512_setzero_si512();
    const __m512 zero = _mm512_setzero_ps();
    const int nt = oop && j->nt;
    for (const size_t pe = b + adamw_peel(j, b, e); i < pe; i++) bad |= adamw_elem_at(j, i);
    for (; i + 16 <= e; i += 16) {
        _mm_prefetch((const char *)(lp + i + d), _MM_HINT_T0);
        _mm_prefetch((const char *)(lm + i + d), _MM_HINT_T0);
        _mm_prefetch((const char *)(lv + i + d), _MM_HINT_T0);
        _mm_prefetch(gbf16 ? (const char *)(gb + i + d) : (const char *)(g + i + d), _MM_HINT_T0);
        __m512 gv;
        if (gbf16)
            gv = _mm512_castsi512_ps(_mm512_slli_epi32(
                _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(gb + i))), 16));
        else
            gv = _mm512_loadu_ps(g + i);
        gv = _mm512_mul_ps(gv, gs);
        __m512 pv = _mm512_mul_ps(_mm512_loadu_ps(lp + i), dec);
        __m512 mv = _mm512_loadu_ps(lm + i);
        const __m512 dv = _mm512_sub_ps(gv, mv);
        mv = _mm512_fmadd_ps(lc, dv, lbase_m ? mv : gv);
        const __m512 gg = _mm512_mul_ps(_mm512_mul_ps(omb2, gv), gv);
        const __m512 vv = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(lv + i), b2), gg);
        const __m512 den = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vv), bc2), eps);
        pv = _mm512_add_ps(pv, _mm512_div_ps(_mm512_mul_ps(nstep, mv), den));
        if (nt) { /* 64-byte aligned: p + i is (adamw_peel), m and v share its phase */
            _mm512_stream_ps(p + i, pv);
            _mm512_stream_ps(m + i, mv);
            _mm512_stream_ps(v + i, vv);
        } else {
            _mm512_storeu_ps(p + i, pv);
            _mm512_storeu_ps(m + i, mv);
            _mm512_storeu_ps(v + i, vv);
        }
        nf = _mm512_or_si512(nf, _mm512_castps_si512(_mm512_mul_ps(pv, zero)));
        if (pbf16) _mm256_storeu_si256((__m256i *)(pb + i), bf16_round_avx512(pv));
    }
    for (; i < e; i++) bad |= adamw_elem_at(j, i);
    if (nt) _mm_sfence();
    const __m512i ex = _mm512_set1_epi32(0x7f800000);
    return bad | (_mm512_cmpeq_epi32_mask(_mm512_and_si512(nf, ex), ex) != 0);
}

MT_AVX512 static int adamw_range_avx512(const adamw_job_t *j, size_t b, size_t e) {
    const int gbf16 = j->g == NULL, pbf16 = j->pb != NULL;
    if (gbf16 && pbf16) return adamw_avx512_body(j, b, e, 1, 1, 0);
    if (gbf16) return adamw_avx512_body(j, b, e, 1, 0, 0);
    if (pbf16) return adamw_avx512_body(j, b, e, 0, 1, 0);
    return adamw_avx512_body(j, b, e, 0, 0, 0);
}

MT_AVX512 static int adamw_range_avx512_oop(const adamw_job_t *j, size_t b, size_t e) {
    const int gbf16 = j->g == NULL, pbf16 = j->pb != NULL;
    if (gbf16 && pbf16) return adamw_avx512_body(j, b, e, 1, 1, 1);
    if (gbf16) return adamw_avx512_body(j, b, e, 1, 0, 1);
    if (pbf16) return adamw_avx512_body(j, b, e, 0, 1, 1);
    return adamw_avx512_body(j, b, e, 0, 0, 1);
}

/* ---- dispatch ---- */

kern_cpu_isa_t kern_cpu_isa_best(void) {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma"))
        return KERN_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return KERN_ISA_AVX2;
    return KERN_ISA_SCALAR;
}

int kern_cpu_isa_supported(kern_cpu_isa_t isa) {
    switch (isa) {
    case KERN_ISA_AUTO:
    case KERN_ISA_SCALAR: return 1;
    case KERN_ISA_AVX2: return kern_cpu_isa_best() >= KERN_ISA_AVX2;
    case KERN_ISA_AVX512: return kern_cpu_isa_best() >= KERN_ISA_AVX512;
    }
    return 0;
}

const char *kern_cpu_isa_name(kern_cpu_isa_t isa) {
    switch (isa) {
    case KERN_ISA_AUTO: return "auto";
    case KERN_ISA_SCALAR: return "scalar";
    case KERN_ISA_AVX2: return "avx2";
    case KERN_ISA_AVX512: return "avx512";
    }
    return "?";
}

/* Why these sizes: a task should stream enough that handing it out (an
 * atomic add, a cold start of the hardware prefetchers) costs well under 1%
 * (>= 8K elements = 224 KB), and little enough that a layer's or an
 * expert's tensor still splits into several tasks per thread for balance,
 * and the pass can start as soon as one layer's gradients land (<= 64K
 * elements = 1.75 MB, about 60 us on this kind of machine). A multiple of 16
 * keeps task boundaries on cache lines. */
size_t kern_adamw_chunk_elems(size_t n, int nthreads) {
    const size_t lo = 8192, hi = 65536;
    size_t per = n / (4 * (size_t)(nthreads > 0 ? nthreads : 1));
    per = (per + 15) & ~(size_t)15;
    return per < lo ? lo : per > hi ? hi : per;
}

/* Below this many elements one thread does the whole tensor: waking the
 * pool's workers costs about as much as streaming half a megabyte.
 * Measured (2 cores, 64M params as tensors of n): n = 16K ran at 19.8 GB/s
 * inline and 17.4 GB/s on the pool; n = 24K at 20 inline, 25.6 pooled;
 * n = 64K at 28.7 pooled; n >= 1M at the ceiling (~38). */
#define ADAMW_INLINE_BELOW 24576

static void adamw_task(void *ctx, size_t task) {
    const adamw_job_t *j = ctx;
    /* Task k covers [k*chunk, (k+1)*chunk) of p's line-aligned index space. */
    const size_t vb = task * j->chunk, ve = vb + j->chunk;
    const size_t b = vb > j->mis ? vb - j->mis : 0;
    const size_t e = ve - j->mis < j->n ? ve - j->mis : j->n;
    /* a relaxed store: tasks only ever set it, the pool's join orders it */
    if (b < e && j->fn(j, b, e) && j->bad) __atomic_store_n(j->bad, 1, __ATOMIC_RELAXED);
}

static adamw_range_fn adamw_range_for(kern_cpu_isa_t isa, int oop) {
    if (isa == KERN_ISA_AVX512) return oop ? adamw_range_avx512_oop : adamw_range_avx512;
    if (isa == KERN_ISA_AVX2) return oop ? adamw_range_avx2_oop : adamw_range_avx2;
    return adamw_range_scalar; /* reads each element before writing it: one loop serves both */
}

int kern_adamw_block_isa(kern_cpu_isa_t isa, const kern_adamw_coef_t *c, float *p, float *m, float *v,
                         const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n) {
    adamw_job_t j = {.c = *c, .p = p, .m = m, .v = v, .ps = p, .ms = m, .vs = v,
                     .g = g, .gb = g_bf16, .pb = p_bf16, .n = n};
    j.fn = adamw_range_for(isa, 0);
    return j.fn(&j, 0, n);
}

/* [a, a + bytes) and [b, b + bytes) share no byte (compared as integers:
 * relational operators on pointers into different objects are undefined). */
static int apart(const void *a, const void *b, size_t bytes) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x + bytes <= y || y + bytes <= x;
}

void kern_adamw_cpu_isa(kern_threadpool_t *pool, kern_cpu_isa_t isa, float *p, float *m, float *v,
                        const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                        const kern_adamw_params_t *hp) {
    kern_adamw_cpu_isa_from(pool, isa, p, m, v, p, m, v, g, g_bf16, p_bf16, n, hp);
}

void kern_adamw_cpu_isa_from(kern_threadpool_t *pool, kern_cpu_isa_t isa, const float *p_src, const float *m_src,
                             const float *v_src, float *p, float *m, float *v, const float *g,
                             const uint16_t *g_bf16, uint16_t *p_bf16, size_t n, const kern_adamw_params_t *hp) {
    MT_CHECK(hp != NULL, "kern_adamw_cpu: hyperparameters are NULL");
    MT_CHECK((g == NULL) != (g_bf16 == NULL),
             "kern_adamw_cpu: pass exactly one of g (fp32) and g_bf16 (got %s)",
             g ? "both" : "neither");
    MT_CHECK(hp->step >= 1, "kern_adamw_cpu: step must be >= 1 (got %lld)", (long long)hp->step);
    if (n == 0) return;
    MT_CHECK(p && m && v, "kern_adamw_cpu: p, m and v must be non-NULL for n = %zu", n);
    MT_CHECK(p_src && m_src && v_src, "kern_adamw_cpu: the source p, m and v must be non-NULL for n = %zu", n);
    const int oop = p_src != p;
    MT_CHECK(oop ? m_src != m && v_src != v : m_src == m && v_src == v,
             "kern_adamw_cpu: p, m and v must all be updated in place or all out of place");
    const size_t nb = n * sizeof(float);
    MT_CHECK(!oop || (apart(p_src, p, nb) && apart(p_src, m, nb) && apart(p_src, v, nb) && apart(m_src, p, nb) &&
                      apart(m_src, m, nb) && apart(m_src, v, nb) && apart(v_src, p, nb) && apart(v_src, m, nb) &&
                      apart(v_src, v, nb)),
             "kern_adamw_cpu: an out-of-place update's sources overlap its destinations (n = %zu)", n);
    if (isa == KERN_ISA_AUTO) isa = kern_cpu_isa_best();
    MT_CHECK(kern_cpu_isa_supported(isa), "kern_adamw_cpu: this CPU cannot run the %s path",
             kern_cpu_isa_name(isa));

    adamw_job_t j = {.c = kern_adamw_coef(hp), .p = p, .m = m, .v = v, .ps = p_src, .ms = m_src, .vs = v_src,
                     .g = g, .gb = g_bf16, .pb = p_bf16, .n = n, .bad = hp->nonfinite};
    j.fn = adamw_range_for(isa, oop);
    const uintptr_t phase = (uintptr_t)p & 63u;
    j.nt = oop && ((uintptr_t)p & 3u) == 0 && ((uintptr_t)m & 63u) == phase && ((uintptr_t)v & 63u) == phase;
    const int nthreads = kern_threadpool_size(pool);
    j.chunk = kern_adamw_chunk_elems(n, nthreads);
    j.mis = ((uintptr_t)p & 3u) ? 0 : ((uintptr_t)p & 63u) / sizeof(float);
    const size_t ntasks = (j.mis + n + j.chunk - 1) / j.chunk;
    if (ntasks == 1 || nthreads == 1 || n < ADAMW_INLINE_BELOW) {
        if (j.fn(&j, 0, n) && j.bad) *j.bad = 1;
        return;
    }
    kern_threadpool_parallel_for(pool, ntasks, adamw_task, &j);
}
