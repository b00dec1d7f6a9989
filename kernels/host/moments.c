/* AdamW on bf16 or 8-bit moments (kernels/adamw.h) on the host, and the
 * moments' layout.
 *
 * Why it is shaped this way
 * - The work goes in blocks of 256 elements (the 8-bit format's absmax
 *   block, and a fine unit for bf16 too): a block's moments are expanded to
 *   fp32 in two small stack arrays, updated with adamw_math.h's element
 *   function (the fp32 path's definition, so the update is the same
 *   arithmetic), and stored back in the format (moments_math.h).
 * - Tasks of the thread pool are whole multiples of 256 elements, so no two
 *   threads share an absmax block; the stochastic rounding's random bits
 *   depend on the element index only, so the result is the same for any
 *   thread count and on the CUDA twin.
 * - The fp32 format is the SIMD kernel of adamw.c, unchanged.
 * - Speed: a block's update is adamw.c's SIMD update (kern_adamw_block_isa)
 *   on the expanded fp32 moments, and its store (the stochastic rounding's
 *   random bits, the 8-bit absmax and quantizer search) has AVX2 and
 *   AVX-512 copies in moments_simd.c; the path is chosen at run time from
 *   the CPU (the fp32 kernel's choice) and every path gives the scalar
 *   definition's bits (moments_test.c compares them).
 * - Out of place (the speculative optimizer's spare) a block's master is
 *   updated in a stack array and streamed to its destination past the
 *   cache (_mm_stream_ps, one sfence per task), which writes whole lines
 *   without first reading them (write-allocate: 4 bytes per element). */
#include <immintrin.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/host/adamw_host.h"
#include "kernels/host/moments_simd.h"
#include "kernels/math/adamw_math.h"
#include "kernels/math/moments_math.h"
#include "kernels/math/moments_qmap.h"

#define QB KERN_MOMENTS_QBLOCK

static size_t align64(size_t b) { return (b + 63) & ~(size_t)63; }

static size_t elem_bytes(kern_moments_fmt_t fmt) {
    return fmt == KERN_MOMENTS_F32 ? 4 : fmt == KERN_MOMENTS_BF16 ? 2 : 1;
}

size_t kern_moments_blocks(size_t n) { return (n + QB - 1) / QB; }

size_t kern_moments_bytes(kern_moments_fmt_t fmt, size_t n) {
    size_t b = 2 * align64(n * elem_bytes(fmt));
    if (fmt == KERN_MOMENTS_8BIT) b += 2 * align64(kern_moments_blocks(n) * sizeof(float));
    return b;
}

kern_moments_t kern_moments_view(kern_moments_fmt_t fmt, void *base, size_t n, uint64_t seed) {
    char *c = base;
    const size_t one = align64(n * elem_bytes(fmt));
    kern_moments_t v = {.fmt = fmt, .m = c, .v = c + one, .seed = seed};
    if (fmt == KERN_MOMENTS_8BIT) {
        const size_t sb = align64(kern_moments_blocks(n) * sizeof(float));
        v.m_absmax = (float *)(c + 2 * one);
        v.v_absmax = (float *)(c + 2 * one + sb);
    }
    return v;
}

const char *kern_moments_fmt_name(kern_moments_fmt_t fmt) {
    switch (fmt) {
    case KERN_MOMENTS_F32: return "fp32";
    case KERN_MOMENTS_BF16: return "bf16";
    case KERN_MOMENTS_8BIT: return "8bit";
    }
    return "?";
}

/* Elements [b, e) of one moment as fp32 (e - b <= 256 inside one block for 8-bit). */
static void expand(const kern_moments_t *mo, int which, size_t b, size_t e, float *out) {
    const void *src = which ? mo->v : mo->m;
    switch (mo->fmt) {
    case KERN_MOMENTS_F32: memcpy(out, (const float *)src + b, (e - b) * sizeof(float)); break;
    case KERN_MOMENTS_BF16:
        for (size_t i = b; i < e; i++) out[i - b] = mt_bf16_to_f32(((const uint16_t *)src)[i]);
        break;
    case KERN_MOMENTS_8BIT: {
        const float *q = which ? kern_moments_qmap_unsigned : kern_moments_qmap_signed;
        const float am = (which ? mo->v_absmax : mo->m_absmax)[b / QB];
        for (size_t i = b; i < e; i++) out[i - b] = q[((const uint8_t *)src)[i]] * am;
        break;
    }
    }
}

void kern_moments_to_f32(const kern_moments_t *mo, size_t n, float *m, float *v) {
    for (size_t b = 0; b < n; b += QB) {
        const size_t e = b + QB < n ? b + QB : n;
        if (m) expand(mo, 0, b, e, m + b);
        if (v) expand(mo, 1, b, e, v + b);
    }
}

void kern_moments_from_f32(const kern_moments_t *mo, size_t n, const float *m, const float *v) {
    for (size_t b = 0; b < n; b += QB) {
        const size_t e = b + QB < n ? b + QB : n;
        if (mo->fmt == KERN_MOMENTS_F32) {
            memcpy((float *)mo->m + b, m + b, (e - b) * sizeof(float));
            memcpy((float *)mo->v + b, v + b, (e - b) * sizeof(float));
        } else if (mo->fmt == KERN_MOMENTS_BF16) {
            const uint64_t key = kern_moments_sr_key(mo->seed, 0);
            for (size_t i = b; i < e; i++) {
                ((uint16_t *)mo->m)[i] = kern_moments_bf16_sr(m[i], key, i, 0);
                ((uint16_t *)mo->v)[i] = kern_moments_bf16_sr(v[i], key, i, 1);
            }
        } else {
            float am = 0.0f, av = 0.0f;
            for (size_t i = b; i < e; i++) {
                am = fmaxf(am, fabsf(m[i]));
                av = fmaxf(av, fabsf(v[i]));
            }
            mo->m_absmax[b / QB] = am;
            mo->v_absmax[b / QB] = av;
            for (size_t i = b; i < e; i++) {
                ((uint8_t *)mo->m)[i] = kern_moments_quantize_m(kern_moments_qmap_signed, m[i], am);
                ((uint8_t *)mo->v)[i] = kern_moments_quantize_v(kern_moments_qmap_unsigned, v[i], av);
            }
        }
    }
}

typedef struct {
    kern_adamw_coef_t c;
    float *p;
    kern_moments_t mom;
    const float *ps;      /* read: p in place, else a buffer apart from it */
    kern_moments_t msrc;  /* read: mom in place, else buffers apart from it */
    const float *g;
    const uint16_t *gb;
    uint16_t *pb;
    size_t n;
    size_t chunk; /* elements per task, a multiple of 256 */
    uint64_t key; /* bf16: the stochastic rounding's key for this step */
    int *bad;     /* kern_adamw_params_t.nonfinite */
    kern_cpu_isa_t isa; /* SCALAR, AVX2 or AVX512: the update's and the store's copies */
    kern_moments_q8_tables_t q8; /* 8-bit on AVX-512: the search's tables */
} lite_job_t;

/* One block [b, e) of at most 256 elements, b a multiple of 256: the
 * moments are expanded from the sources and stored to the destinations
 * (the same buffers in place); out of place, p's block is first copied to
 * its destination, where the in-place update runs on it (1 KB, in L1: the
 * fp32 kernel stays one in-place loop for these formats). */
static int lite_block(const lite_job_t *j, size_t b, size_t e) {
    float mf[QB] __attribute__((aligned(64))), vf[QB] __attribute__((aligned(64)));
    const kern_moments_t *src = &j->msrc;
    if (src->fmt == KERN_MOMENTS_BF16 && j->isa == KERN_ISA_AVX512 && e - b == QB) {
        kern_moments_bf16_expand_avx512((const uint16_t *)src->m + b, mf);
        kern_moments_bf16_expand_avx512((const uint16_t *)src->v + b, vf);
    } else if (src->fmt == KERN_MOMENTS_8BIT && j->isa == KERN_ISA_AVX512 && e - b == QB) {
        kern_moments_8bit_expand_avx512(kern_moments_qmap_signed, (const uint8_t *)src->m + b,
                                        src->m_absmax[b / QB], mf);
        kern_moments_8bit_expand_avx512(kern_moments_qmap_unsigned, (const uint8_t *)src->v + b,
                                        src->v_absmax[b / QB], vf);
    } else {
        expand(src, 0, b, e, mf);
        expand(src, 1, b, e, vf);
    }
    /* out of place, a whole 16-byte aligned block: updated here, streamed out */
    const bool stream = j->ps != j->p && e - b == QB && ((uintptr_t)(j->p + b) & 15u) == 0;
    float pf[QB] __attribute__((aligned(64)));
    float *const pu = stream ? pf : j->p + b;
    if (j->ps != j->p) memcpy(pu, j->ps + b, (e - b) * sizeof(float));
    const int bad = kern_adamw_block_isa(j->isa, &j->c, pu, mf, vf, j->g ? j->g + b : NULL,
                                         j->gb ? j->gb + b : NULL, j->pb ? j->pb + b : NULL, e - b);
    if (stream)
        for (size_t k = 0; k < QB; k += 4) _mm_stream_ps(j->p + b + k, _mm_load_ps(pf + k));
    if (e - b == QB && j->isa >= KERN_ISA_AVX2) {
        /* a whole block on the SIMD store (the same bits as below) */
        const int wide = j->isa == KERN_ISA_AVX512;
        if (j->mom.fmt == KERN_MOMENTS_BF16)
            (wide ? kern_moments_bf16_store_avx512 : kern_moments_bf16_store_avx2)(j->mom.m, j->mom.v, mf, vf,
                                                                                   j->key, b);
        else if (wide)
            kern_moments_8bit_store_avx512(&j->q8, (uint8_t *)j->mom.m + b, (uint8_t *)j->mom.v + b,
                                           &j->mom.m_absmax[b / QB], &j->mom.v_absmax[b / QB], mf, vf);
        else
            kern_moments_8bit_store_avx2((uint8_t *)j->mom.m + b, (uint8_t *)j->mom.v + b, &j->mom.m_absmax[b / QB],
                                         &j->mom.v_absmax[b / QB], mf, vf);
        return bad;
    }
    if (j->mom.fmt == KERN_MOMENTS_BF16) {
        uint16_t *m = j->mom.m, *v = j->mom.v;
        for (size_t i = b; i < e; i++) {
            m[i] = kern_moments_bf16_sr(mf[i - b], j->key, i, 0);
            v[i] = kern_moments_bf16_sr(vf[i - b], j->key, i, 1);
        }
        return bad;
    }
    /* bitsandbytes starts its absmax at -FLT_MAX; 0 is the same for |x| and
     * keeps an all-zero block's scale 0 */
    float am = 0.0f, av = 0.0f;
    for (size_t k = 0; k < e - b; k++) {
        am = fmaxf(am, fabsf(mf[k]));
        av = fmaxf(av, fabsf(vf[k]));
    }
    j->mom.m_absmax[b / QB] = am;
    j->mom.v_absmax[b / QB] = av;
    uint8_t *m = j->mom.m, *v = j->mom.v;
    for (size_t i = b; i < e; i++) {
        m[i] = kern_moments_quantize_m(kern_moments_qmap_signed, mf[i - b], am);
        v[i] = kern_moments_quantize_v(kern_moments_qmap_unsigned, vf[i - b], av);
    }
    return bad;
}

static int lite_range(const lite_job_t *j, size_t b, size_t e) {
    int bad = 0;
    for (size_t k = b; k < e; k += QB) bad |= lite_block(j, k, k + QB < e ? k + QB : e);
    if (j->ps != j->p) _mm_sfence(); /* streamed lines reach memory before the task is reported done */
    return bad;
}

static void lite_task(void *ctx, size_t task) {
    const lite_job_t *j = ctx;
    const size_t b = task * j->chunk, e = b + j->chunk < j->n ? b + j->chunk : j->n;
    if (lite_range(j, b, e) && j->bad) __atomic_store_n(j->bad, 1, __ATOMIC_RELAXED);
}

void kern_adamw_cpu_pool(kern_threadpool_t *pool, float *p, const kern_moments_t *mom, const float *g,
                         const uint16_t *g_bf16, uint16_t *p_bf16, size_t n, const kern_adamw_params_t *hp) {
    kern_adamw_moments_isa_from(pool, KERN_ISA_AUTO, p, mom, p, mom, g, g_bf16, p_bf16, n, hp);
}

void kern_adamw_cpu_pool_from(kern_threadpool_t *pool, const float *p_src, const kern_moments_t *mom_src, float *p,
                              const kern_moments_t *mom, const float *g, const uint16_t *g_bf16, uint16_t *p_bf16,
                              size_t n, const kern_adamw_params_t *hp) {
    kern_adamw_moments_isa_from(pool, KERN_ISA_AUTO, p_src, mom_src, p, mom, g, g_bf16, p_bf16, n, hp);
}

void kern_adamw_moments_isa(kern_threadpool_t *pool, kern_cpu_isa_t isa, float *p, const kern_moments_t *mom,
                            const float *g, const uint16_t *g_bf16, uint16_t *p_bf16, size_t n,
                            const kern_adamw_params_t *hp) {
    kern_adamw_moments_isa_from(pool, isa, p, mom, p, mom, g, g_bf16, p_bf16, n, hp);
}

/* The bytes of each part of the moments' one allocation (kern_moments_view's layout). */
static size_t moments_part_bytes(kern_moments_fmt_t fmt, size_t n, int absmax) {
    return absmax ? kern_moments_blocks(n) * sizeof(float) : n * elem_bytes(fmt);
}

/* [a, a + an) and [b, b + bn) share no byte (as integers: relational
 * operators on pointers into different objects are undefined). */
static bool apart(const void *a, size_t an, const void *b, size_t bn) {
    const uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return x + an <= y || y + bn <= x;
}

/* Out of place: no source part (p, m, v, absmaxes) overlaps a destination part. */
static bool lite_apart(const float *ps, const kern_moments_t *src, const float *p, const kern_moments_t *dst,
                       size_t n) {
    const void *s[4] = {src->m, src->v, src->m_absmax, src->v_absmax}, *d[4] = {dst->m, dst->v, dst->m_absmax,
                                                                                   dst->v_absmax};
    const size_t pb = n * sizeof(float);
    for (int a = 0; a < 4; a++) {
        const size_t ab = moments_part_bytes(dst->fmt, n, a >= 2);
        if (!s[a] && !d[a]) continue;
        if (!apart(ps, pb, d[a], ab) || !apart(s[a], ab, p, pb)) return false;
        for (int k = 0; k < 4; k++)
            if (d[k] && !apart(s[a], ab, d[k], moments_part_bytes(dst->fmt, n, k >= 2))) return false;
    }
    return apart(ps, pb, p, pb);
}

void kern_adamw_moments_isa_from(kern_threadpool_t *pool, kern_cpu_isa_t isa, const float *p_src,
                                 const kern_moments_t *mom_src, float *p, const kern_moments_t *mom, const float *g,
                                 const uint16_t *g_bf16, uint16_t *p_bf16, size_t n, const kern_adamw_params_t *hp) {
    MT_CHECK(mom != NULL && mom_src != NULL, "kern_adamw_cpu: moments are NULL");
    MT_CHECK(mom_src->fmt == mom->fmt, "kern_adamw_cpu: source moments in %s, destination in %s",
             kern_moments_fmt_name(mom_src->fmt), kern_moments_fmt_name(mom->fmt));
    if (mom->fmt == KERN_MOMENTS_F32) {
        kern_adamw_cpu_isa_from(pool, isa, p_src, mom_src->m, mom_src->v, p, mom->m, mom->v, g, g_bf16, p_bf16, n,
                                hp);
        return;
    }
    if (isa == KERN_ISA_AUTO) isa = kern_cpu_isa_best();
    MT_CHECK(kern_cpu_isa_supported(isa), "kern_adamw_cpu: this CPU cannot run the %s path", kern_cpu_isa_name(isa));
    MT_CHECK(hp != NULL, "kern_adamw_cpu: hyperparameters are NULL");
    MT_CHECK((g == NULL) != (g_bf16 == NULL), "kern_adamw_cpu: pass exactly one of g (fp32) and g_bf16 (got %s)",
             g ? "both" : "neither");
    MT_CHECK(hp->step >= 1, "kern_adamw_cpu: step must be >= 1 (got %lld)", (long long)hp->step);
    if (n == 0) return;
    MT_CHECK(p && mom->m && mom->v, "kern_adamw_cpu: p and the moments must be non-NULL for n = %zu", n);
    MT_CHECK(mom->fmt != KERN_MOMENTS_8BIT || (mom->m_absmax && mom->v_absmax && mom_src->m_absmax &&
                                               mom_src->v_absmax),
             "kern_adamw_cpu: 8-bit moments without their absmax arrays");
    const bool oop = p_src != p;
    MT_CHECK(p_src && mom_src->m && mom_src->v, "kern_adamw_cpu: the source p and moments must be non-NULL");
    MT_CHECK(oop ? mom_src->m != mom->m && mom_src->v != mom->v : mom_src->m == mom->m && mom_src->v == mom->v,
             "kern_adamw_cpu: p and the moments must both be updated in place or both out of place");
    MT_CHECK(!oop || lite_apart(p_src, mom_src, p, mom, n),
             "kern_adamw_cpu: an out-of-place update's sources overlap its destinations (n = %zu)", n);
    lite_job_t j = {.c = kern_adamw_coef(hp), .p = p, .mom = *mom, .ps = p_src, .msrc = *mom_src,
                    .g = g, .gb = g_bf16, .pb = p_bf16, .n = n,
                    .key = kern_moments_sr_key(mom->seed, hp->step), .isa = isa, .bad = hp->nonfinite};
    if (mom->fmt == KERN_MOMENTS_8BIT && isa == KERN_ISA_AVX512) kern_moments_q8_tables_init(&j.q8);
    const int nthreads = kern_threadpool_size(pool);
    /* the fp32 kernel's task size, rounded to whole absmax blocks */
    j.chunk = (kern_adamw_chunk_elems(n, nthreads) + QB - 1) / QB * QB;
    const size_t ntasks = (n + j.chunk - 1) / j.chunk;
    if (ntasks == 1 || nthreads <= 1) {
        if (lite_range(&j, 0, n) && j.bad) *j.bad = 1;
        return;
    }
    kern_threadpool_parallel_for(pool, ntasks, lite_task, &j);
}
