/* SIMD copies of the lighter moment formats' per-block store (see
 * moments_simd.h); the scalar definition is kernels/math/moments_math.h.
 *
 * Why it is shaped this way
 * - bf16: the random bits are splitmix64's finalizer of a 64-bit counter;
 *   the 64-bit multiplies are built from 32x32->64 ones (vpmuludq), which
 *   AVX2 and AVX-512F both have (vpmullq needs AVX-512DQ), so one recipe
 *   serves both paths and the bits are the scalar ones by construction
 *   (integer arithmetic mod 2^64).
 * - 8-bit: bitsandbytes' search is run as written, a lane per element, the
 *   selects as masks.  AVX-512 reads each step's map value with permutes
 *   from tables laid out by the path taken (kern_moments_q8_tables_t):
 *   gathers were measured at three quarters of the whole store on a CPU
 *   with the gather data-sampling fix.  AVX2 (8-entry permutes only) still
 *   gathers from the 1 KB map.  Same comparisons, same float midpoints, so the
 *   same code for every input, NaN included.  The absmax is a vector max
 *   whose NaN rule (the second operand wins) is fmaxf's: a NaN never
 *   becomes the block's scale.
 * - Only the target-attributed functions use the instructions; the build
 *   stays x86-64-v2 and moments.c calls these only where the CPU has them. */
#include "kernels/host/moments_simd.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "base/status.h"

#include "kernels/math/moments_qmap.h"

#define QB 256
#define MIX_C1 0xbf58476d1ce4e5b9ull
#define MIX_C2 0x94d049bb133111ebull

#define MT_AVX2 __attribute__((target("avx2,fma")))
#define MT_AVX512 __attribute__((target("avx512f,avx2,fma")))

/* ---- AVX2: 8 lanes of 32 bits, 4 of 64 ---- */

MT_AVX2 static inline __m256i mul64_avx2(__m256i a, uint64_t c) {
    const __m256i cl = _mm256_set1_epi64x((long long)(c & 0xffffffffu)), ch = _mm256_set1_epi64x((long long)(c >> 32));
    const __m256i t0 = _mm256_mul_epu32(a, cl);
    const __m256i t1 = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), cl), _mm256_mul_epu32(a, ch));
    return _mm256_add_epi64(t0, _mm256_slli_epi64(t1, 32));
}

MT_AVX2 static inline __m256i mix64_avx2(__m256i z) {
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), MIX_C1);
    z = mul64_avx2(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), MIX_C2);
    return _mm256_srli_epi64(_mm256_xor_si256(z, _mm256_srli_epi64(z, 31)), 48);
}

/* The 16 random bits of elements i..i+7 (moment which), as 8 x u32. */
MT_AVX2 static inline __m256i rbits_avx2(uint64_t key, uint64_t i, unsigned which) {
    const __m256i base = _mm256_set1_epi64x((long long)(key + 2 * i + which));
    const __m256i r0 = mix64_avx2(_mm256_add_epi64(base, _mm256_setr_epi64x(0, 2, 4, 6)));
    const __m256i r1 = mix64_avx2(_mm256_add_epi64(base, _mm256_setr_epi64x(8, 10, 12, 14)));
    /* r0's dwords at even places, r1's at odd, then back in element order */
    const __m256i il = _mm256_blend_epi32(r0, _mm256_slli_epi64(r1, 32), 0xAA);
    return _mm256_permutevar8x32_epi32(il, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
}

/* kern_moments_bf16_sr of 8 values: 8 x u32, each < 0x10000. */
MT_AVX2 static inline __m256i sr_avx2(__m256 x, __m256i r) {
    const __m256i u = _mm256_castps_si256(x), ex = _mm256_set1_epi32(0x7f800000);
    const __m256i s = _mm256_add_epi32(u, r), hu = _mm256_srli_epi32(u, 16);
    __m256i res = _mm256_blendv_epi8(_mm256_srli_epi32(s, 16), hu,
                                     _mm256_cmpeq_epi32(_mm256_and_si256(s, ex), ex));
    res = _mm256_blendv_epi8(res, hu, _mm256_cmpeq_epi32(_mm256_and_si256(u, ex), ex));
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), ex);
    return _mm256_blendv_epi8(res, _mm256_or_si256(hu, _mm256_set1_epi32(0x40)), nan);
}

MT_AVX2 static void bf16_one_avx2(uint16_t *out, const float *x, uint64_t key, size_t b, unsigned which) {
    for (size_t k = 0; k < QB; k += 16) {
        const __m256i lo = sr_avx2(_mm256_loadu_ps(x + k), rbits_avx2(key, b + k, which));
        const __m256i hi = sr_avx2(_mm256_loadu_ps(x + k + 8), rbits_avx2(key, b + k + 8, which));
        _mm256_storeu_si256((__m256i *)(out + b + k),
                            _mm256_permute4x64_epi64(_mm256_packus_epi32(lo, hi), 0xD8));
    }
}

MT_AVX2 void kern_moments_bf16_store_avx2(uint16_t *m, uint16_t *v, const float *mf, const float *vf, uint64_t key,
                                          size_t b) {
    bf16_one_avx2(m, mf, key, b, 0);
    bf16_one_avx2(v, vf, key, b, 1);
}

MT_AVX2 static inline __m256 absmax_avx2(const float *x) {
    const __m256 abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 acc = _mm256_setzero_ps();
    /* maxps returns its second operand when either is NaN: fmaxf's rule */
    for (int k = 0; k < QB; k += 8) acc = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + k), abs), acc);
    return acc;
}

MT_AVX2 static inline float hmax_avx2(__m256 a) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
}

/* kern_moments_quantize of 8 values, step for step. */
MT_AVX2 static inline __m256i search_avx2(const float *q, int is_signed, __m256 x) {
    __m256i pivot = _mm256_set1_epi32(127), upper_pivot = _mm256_set1_epi32(255), lower_pivot = _mm256_setzero_si256();
    __m256 lower = _mm256_set1_ps(is_signed ? -1.0f : 0.0f), upper = _mm256_set1_ps(1.0f);
    __m256 val = _mm256_set1_ps(q[127]);
    for (int i = 64; i > 0; i >>= 1) {
        const __m256 up = _mm256_cmp_ps(x, val, _CMP_GT_OQ);
        const __m256i upi = _mm256_castps_si256(up), step = _mm256_set1_epi32(i);
        lower_pivot = _mm256_blendv_epi8(lower_pivot, pivot, upi);
        lower = _mm256_blendv_ps(lower, val, up);
        upper_pivot = _mm256_blendv_epi8(pivot, upper_pivot, upi);
        upper = _mm256_blendv_ps(val, upper, up);
        pivot = _mm256_blendv_epi8(_mm256_sub_epi32(pivot, step), _mm256_add_epi32(pivot, step), upi);
        val = _mm256_i32gather_ps(q, pivot, 4);
    }
    const __m256 half = _mm256_set1_ps(0.5f);
    const __m256 hi = _mm256_cmp_ps(x, _mm256_mul_ps(_mm256_add_ps(upper, val), half), _CMP_GT_OQ);
    const __m256 lo = _mm256_cmp_ps(x, _mm256_mul_ps(_mm256_add_ps(lower, val), half), _CMP_LT_OQ);
    const __m256i c_up = _mm256_blendv_epi8(pivot, upper_pivot, _mm256_castps_si256(hi));
    const __m256i c_lo = _mm256_blendv_epi8(pivot, lower_pivot, _mm256_castps_si256(lo));
    return _mm256_blendv_epi8(c_lo, c_up, _mm256_castps_si256(_mm256_cmp_ps(x, val, _CMP_GT_OQ)));
}

/* kern_moments_quantize_m's sign fix: a code whose value has the other
 * sign than a nonzero m (NaN counts as nonzero) moves one step toward m. */
MT_AVX2 static inline __m256i signfix_avx2(const float *q, __m256i c, __m256 m) {
    const __m256 qc = _mm256_i32gather_ps(q, c, 4), zero = _mm256_setzero_ps();
    const __m256i diff = _mm256_srai_epi32(_mm256_xor_si256(_mm256_castps_si256(qc), _mm256_castps_si256(m)), 31);
    const __m256i nz = _mm256_castps_si256(_mm256_cmp_ps(m, zero, _CMP_NEQ_UQ));
    const __m256i delta = _mm256_blendv_epi8(_mm256_set1_epi32(-1), _mm256_set1_epi32(1),
                                             _mm256_castps_si256(_mm256_cmp_ps(m, zero, _CMP_GT_OQ)));
    return _mm256_add_epi32(c, _mm256_and_si256(delta, _mm256_and_si256(diff, nz)));
}

MT_AVX2 static inline __m256i code8_avx2(const float *x, size_t k, float am, int is_m) {
    const __m256 xv = _mm256_loadu_ps(x + k);
    const __m256 s = am > 0.0f ? _mm256_div_ps(xv, _mm256_set1_ps(am)) : _mm256_setzero_ps();
    if (!is_m) return search_avx2(kern_moments_qmap_unsigned, 0, s);
    return signfix_avx2(kern_moments_qmap_signed, search_avx2(kern_moments_qmap_signed, 1, s), xv);
}

MT_AVX2 static void codes_avx2(uint8_t *out, const float *x, float am, int is_m) {
    const __m256i lowbyte = _mm256_set1_epi32(0xff);
    for (size_t k = 0; k < QB; k += 16) {
        const __m256i c0 = _mm256_and_si256(code8_avx2(x, k, am, is_m), lowbyte);
        const __m256i c1 = _mm256_and_si256(code8_avx2(x, k + 8, am, is_m), lowbyte);
        const __m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
        _mm_storeu_si128((__m128i *)(out + k),
                         _mm_packus_epi16(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1)));
    }
}

MT_AVX2 void kern_moments_8bit_store_avx2(uint8_t *m, uint8_t *v, float *am, float *av, const float *mf,
                                          const float *vf) {
    *am = hmax_avx2(absmax_avx2(mf));
    *av = hmax_avx2(absmax_avx2(vf));
    codes_avx2(m, mf, *am, 1);
    codes_avx2(v, vf, *av, 0);
}

/* ---- AVX-512F: 16 lanes of 32 bits, 8 of 64 ---- */

MT_AVX512 static inline __m512i mul64_avx512(__m512i a, uint64_t c) {
    const __m512i cl = _mm512_set1_epi64((long long)(c & 0xffffffffu)), ch = _mm512_set1_epi64((long long)(c >> 32));
    const __m512i t0 = _mm512_mul_epu32(a, cl);
    const __m512i t1 = _mm512_add_epi64(_mm512_mul_epu32(_mm512_srli_epi64(a, 32), cl), _mm512_mul_epu32(a, ch));
    return _mm512_add_epi64(t0, _mm512_slli_epi64(t1, 32));
}

MT_AVX512 static inline __m256i mix64_avx512(__m512i z) {
    z = mul64_avx512(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)), MIX_C1);
    z = mul64_avx512(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)), MIX_C2);
    return _mm512_cvtepi64_epi32(_mm512_srli_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 31)), 48));
}

MT_AVX512 static inline __m512i rbits_avx512(uint64_t key, uint64_t i, unsigned which) {
    const __m512i base = _mm512_add_epi64(_mm512_set1_epi64((long long)(key + 2 * i + which)),
                                          _mm512_setr_epi64(0, 2, 4, 6, 8, 10, 12, 14));
    const __m256i lo = mix64_avx512(base);
    const __m256i hi = mix64_avx512(_mm512_add_epi64(base, _mm512_set1_epi64(16)));
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

MT_AVX512 static inline __m256i sr_avx512(__m512 x, __m512i r) {
    const __m512i u = _mm512_castps_si512(x), ex = _mm512_set1_epi32(0x7f800000);
    const __m512i s = _mm512_add_epi32(u, r), hu = _mm512_srli_epi32(u, 16);
    __m512i res = _mm512_srli_epi32(s, 16);
    res = _mm512_mask_mov_epi32(res, _mm512_cmpeq_epi32_mask(_mm512_and_si512(s, ex), ex), hu);
    res = _mm512_mask_mov_epi32(res, _mm512_cmpeq_epi32_mask(_mm512_and_si512(u, ex), ex), hu);
    const __mmask16 nan = _mm512_cmpgt_epi32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)), ex);
    res = _mm512_mask_or_epi32(res, nan, hu, _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(res);
}

MT_AVX512 static void bf16_one_avx512(uint16_t *out, const float *x, uint64_t key, size_t b, unsigned which) {
    for (size_t k = 0; k < QB; k += 16)
        _mm256_storeu_si256((__m256i *)(out + b + k),
                            sr_avx512(_mm512_loadu_ps(x + k), rbits_avx512(key, b + k, which)));
}

MT_AVX512 void kern_moments_bf16_store_avx512(uint16_t *m, uint16_t *v, const float *mf, const float *vf,
                                              uint64_t key, size_t b) {
    bf16_one_avx512(m, mf, key, b, 0);
    bf16_one_avx512(v, vf, key, b, 1);
}

MT_AVX512 static inline float absmax_avx512(const float *x) {
    const __m512 abs = _mm512_castsi512_ps(_mm512_set1_epi32(0x7fffffff));
    __m512 acc = _mm512_setzero_ps();
    for (int k = 0; k < QB; k += 16)
        acc = _mm512_max_ps(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(x + k)),
                                                                  _mm512_castps_si512(abs))),
                            acc);
    return _mm512_reduce_max_ps(acc); /* acc holds no NaN: any order is exact */
}

static const int path_off[8] = {0, 0, 16, 32, 48, 64, 96, 160};

void kern_moments_q8_tables_init(kern_moments_q8_tables_t *t) {
    memset(t, 0, sizeof *t);
    for (int c = 0; c < 256; c++)
        MT_CHECK(!!signbit(kern_moments_qmap_signed[c]) == (c < 127),
                 "moments: the signed 8-bit map must be negative exactly below code 127 (code %d)", c);
    for (int map = 0; map < 2; map++) {
        const float *q = map ? kern_moments_qmap_unsigned : kern_moments_qmap_signed;
        for (int k = 1; k <= 7; k++)
            for (int path = 0; path < 1 << k; path++) {
                int pivot = 127;
                for (int s = 1; s <= k; s++) {
                    const int i = 64 >> (s - 1);
                    pivot += (path >> (k - s)) & 1 ? i : -i;
                }
                t->path[map][path_off[k] + path] = q[pivot];
            }
    }
}

/* path_k[t] for t < 2^k: one permute up to 16 values, a two-table permute
 * for 32, and selects on t's higher bits beyond. */
MT_AVX512 __attribute__((always_inline)) static inline __m512 path_val_avx512(const float *tab, int k, __m512i t) {
    const float *p = tab + path_off[k];
    if (k <= 4) return _mm512_permutexvar_ps(t, _mm512_load_ps(p));
    __m512 r[4];
    const int n32 = 1 << (k - 5);
#pragma GCC unroll 4
    for (int h = 0; h < n32; h++)
        r[h] = _mm512_permutex2var_ps(_mm512_load_ps(p + 32 * h), t, _mm512_load_ps(p + 32 * h + 16));
    if (k == 5) return r[0];
    const __mmask16 b5 = _mm512_test_epi32_mask(t, _mm512_set1_epi32(32));
    const __m512 lo = _mm512_mask_mov_ps(r[0], b5, r[1]);
    if (k == 6) return lo;
    const __m512 hi = _mm512_mask_mov_ps(r[2], b5, r[3]);
    return _mm512_mask_mov_ps(lo, _mm512_test_epi32_mask(t, _mm512_set1_epi32(64)), hi);
}

/* kern_moments_quantize of 16 values, step for step; tab: the map's path tables. */
MT_AVX512 __attribute__((always_inline)) static inline __m512i search_avx512(const float *tab, float q127, int is_signed, __m512 x) {
    __m512i pivot = _mm512_set1_epi32(127), upper_pivot = _mm512_set1_epi32(255), lower_pivot = _mm512_setzero_si512();
    __m512i path = _mm512_setzero_si512();
    __m512 lower = _mm512_set1_ps(is_signed ? -1.0f : 0.0f), upper = _mm512_set1_ps(1.0f);
    __m512 val = _mm512_set1_ps(q127);
    const __m512i one = _mm512_set1_epi32(1);
    /* unrolled, so each step's table read is its own fixed permute */
#pragma GCC unroll 7
    for (int k = 1, i = 64; i > 0; k++, i >>= 1) {
        const __mmask16 up = _mm512_cmp_ps_mask(x, val, _CMP_GT_OQ);
        const __m512i step = _mm512_set1_epi32(i);
        lower_pivot = _mm512_mask_mov_epi32(lower_pivot, up, pivot);
        lower = _mm512_mask_mov_ps(lower, up, val);
        upper_pivot = _mm512_mask_mov_epi32(pivot, up, upper_pivot);
        upper = _mm512_mask_mov_ps(val, up, upper);
        pivot = _mm512_mask_add_epi32(_mm512_sub_epi32(pivot, step), up, pivot, step);
        path = _mm512_mask_add_epi32(_mm512_add_epi32(path, path), up, _mm512_add_epi32(path, path), one);
        val = path_val_avx512(tab, k, path);
    }
    const __m512 half = _mm512_set1_ps(0.5f);
    const __mmask16 hi = _mm512_cmp_ps_mask(x, _mm512_mul_ps(_mm512_add_ps(upper, val), half), _CMP_GT_OQ);
    const __mmask16 lo = _mm512_cmp_ps_mask(x, _mm512_mul_ps(_mm512_add_ps(lower, val), half), _CMP_LT_OQ);
    const __m512i c_up = _mm512_mask_mov_epi32(pivot, hi, upper_pivot);
    const __m512i c_lo = _mm512_mask_mov_epi32(pivot, lo, lower_pivot);
    return _mm512_mask_mov_epi32(c_lo, _mm512_cmp_ps_mask(x, val, _CMP_GT_OQ), c_up);
}

/* The sign fix, reading q[c]'s sign as c < 127: the signed map is sorted
 * with q[127] = +0 (kern_moments_q8_tables_init checks it). */
MT_AVX512 static inline __m512i signfix_avx512(__m512i c, __m512 m) {
    const __m512 zero = _mm512_setzero_ps();
    const __mmask16 qneg = _mm512_cmplt_epi32_mask(c, _mm512_set1_epi32(127));
    const __mmask16 mneg = _mm512_cmplt_epi32_mask(_mm512_castps_si512(m), _mm512_setzero_si512());
    const __mmask16 nz = _mm512_cmp_ps_mask(m, zero, _CMP_NEQ_UQ);
    const __m512i delta = _mm512_mask_mov_epi32(_mm512_set1_epi32(-1), _mm512_cmp_ps_mask(m, zero, _CMP_GT_OQ),
                                                _mm512_set1_epi32(1));
    return _mm512_mask_add_epi32(c, (__mmask16)(qneg ^ mneg) & nz, c, delta);
}

/* m's and v's codes of a block together: two independent search chains
 * per iteration keep the core busy while each waits on its permutes. */
MT_AVX512 static void codes_avx512(const kern_moments_q8_tables_t *t, uint8_t *mo, uint8_t *vo, const float *mf,
                                   const float *vf, float am, float av) {
    const float *ts = t->path[0], *tu = t->path[1];
    const float qs127 = kern_moments_qmap_signed[127], qu127 = kern_moments_qmap_unsigned[127];
    const __m512 zero = _mm512_setzero_ps(), amv = _mm512_set1_ps(am), avv = _mm512_set1_ps(av);
    for (size_t k = 0; k < QB; k += 16) {
        const __m512 mv = _mm512_loadu_ps(mf + k), vv = _mm512_loadu_ps(vf + k);
        const __m512 xm = am > 0.0f ? _mm512_div_ps(mv, amv) : zero;
        const __m512 xv = av > 0.0f ? _mm512_div_ps(vv, avv) : zero;
        const __m512i cm = signfix_avx512(search_avx512(ts, qs127, 1, xm), mv);
        const __m512i cv = search_avx512(tu, qu127, 0, xv);
        _mm_storeu_si128((__m128i *)(mo + k), _mm512_cvtepi32_epi8(cm)); /* truncation: (uint8_t)c */
        _mm_storeu_si128((__m128i *)(vo + k), _mm512_cvtepi32_epi8(cv));
    }
}

/* map[code] * absmax for a block's 256 codes: the map's 256 values as
 * eight two-register permutes and selects on the code's top three bits. */
MT_AVX512 void kern_moments_8bit_expand_avx512(const float *q, const uint8_t *codes, float am, float *out) {
    const __m512 amv = _mm512_set1_ps(am);
    for (size_t k = 0; k < QB; k += 16) {
        const __m512i c = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(codes + k)));
        __m512 r[8];
#pragma GCC unroll 8
        for (int h = 0; h < 8; h++) r[h] = _mm512_permutex2var_ps(_mm512_loadu_ps(q + 32 * h), c, _mm512_loadu_ps(q + 32 * h + 16));
        const __mmask16 b5 = _mm512_test_epi32_mask(c, _mm512_set1_epi32(32));
        const __mmask16 b6 = _mm512_test_epi32_mask(c, _mm512_set1_epi32(64));
        const __mmask16 b7 = _mm512_test_epi32_mask(c, _mm512_set1_epi32(128));
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) r[h] = _mm512_mask_mov_ps(r[2 * h], b5, r[2 * h + 1]);
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) r[h] = _mm512_mask_mov_ps(r[2 * h], b6, r[2 * h + 1]);
        _mm512_storeu_ps(out + k, _mm512_mul_ps(_mm512_mask_mov_ps(r[0], b7, r[1]), amv));
    }
}

/* bf16 bits to fp32 (a shift: exact) for a block of 256. */
MT_AVX512 void kern_moments_bf16_expand_avx512(const uint16_t *src, float *out) {
    for (size_t k = 0; k < QB; k += 16)
        _mm512_storeu_si512((void *)(out + k),
                            _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + k))), 16));
}

MT_AVX512 void kern_moments_8bit_store_avx512(const kern_moments_q8_tables_t *t, uint8_t *m, uint8_t *v, float *am,
                                              float *av, const float *mf, const float *vf) {
    *am = absmax_avx512(mf);
    *av = absmax_avx512(vf);
    codes_avx512(t, m, v, mf, vf, *am, *av);
}
