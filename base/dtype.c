/* Bulk dtype conversions on the host (checkpoint load/save, bf16 rounding). */
#include "base/dtype.h"

#include "base/status.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

size_t mt_dtype_size(mt_dtype_t dt) {
    switch (dt) {
    case MT_F32: return 4;
    case MT_BF16: return 2;
    case MT_F16: return 2;
    case MT_I32: return 4;
    case MT_I64: return 8;
    default: return 0;
    }
}

const char *mt_dtype_name(mt_dtype_t dt) {
    switch (dt) {
    case MT_F32: return "F32";
    case MT_BF16: return "BF16";
    case MT_F16: return "F16";
    case MT_I32: return "I32";
    case MT_I64: return "I64";
    default: return "?";
    }
}

void mt_convert_to_f32(float *dst, const void *src, mt_dtype_t src_dt, size_t n) {
    switch (src_dt) {
    case MT_F32: memcpy(dst, src, n * sizeof(float)); return;
    case MT_BF16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = mt_bf16_to_f32(s[i]);
        return;
    }
    case MT_F16: {
        const uint16_t *s = src;
        for (size_t i = 0; i < n; i++) dst[i] = mt_f16_to_f32(s[i]);
        return;
    }
    default: MT_CHECK(0, "mt_convert_to_f32: unsupported source dtype %s", mt_dtype_name(src_dt));
    }
}

/* fp32 -> bf16 by mt_f32_to_bf16's rule, eight at a time where the CPU has
 * AVX2: the staging pool converts every streamed layer's masters this way
 * before its copy.  One element at a time, eight pack threads of a 16-core
 * H200 host made 10 GB/s of bf16 (3.8 GB/s of memory traffic per thread,
 * under half of what AdamW streams per thread there); a 2-vCPU development
 * VM, memory-bound on one thread, went from 1.6 to 1.8 GB/s. */
#if defined(__x86_64__)
__attribute__((target("avx2"))) static void to_bf16_avx2(uint16_t *d, const float *src, size_t n) {
    const __m256i one = _mm256_set1_epi32(1), bias = _mm256_set1_epi32(0x7fff);
    const __m256i abs_mask = _mm256_set1_epi32(0x7fffffff), inf = _mm256_set1_epi32(0x7f800000);
    const __m256i quiet = _mm256_set1_epi32(0x40);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256i u = _mm256_loadu_si256((const __m256i *)(src + i));
        const __m256i hi = _mm256_srli_epi32(u, 16);
        const __m256i rounded =
            _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(bias, _mm256_and_si256(hi, one))), 16);
        const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, abs_mask), inf);
        const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, quiet), nan); /* 8 x u32 < 0x10000 */
        /* the 8 low halves in order: packus works within each 128-bit lane, so gather its two results */
        const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
        _mm_storeu_si128((__m128i *)(d + i), _mm256_castsi256_si128(packed));
    }
    for (; i < n; i++) d[i] = mt_f32_to_bf16(src[i]);
}
#endif

static void to_bf16(uint16_t *d, const float *src, size_t n) {
#if defined(__x86_64__)
    if (__builtin_cpu_supports("avx2")) {
        to_bf16_avx2(d, src, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++) d[i] = mt_f32_to_bf16(src[i]);
}

void mt_convert_from_f32(void *dst, mt_dtype_t dst_dt, const float *src, size_t n) {
    switch (dst_dt) {
    case MT_F32: memcpy(dst, src, n * sizeof(float)); return;
    case MT_BF16: to_bf16(dst, src, n); return;
    case MT_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = mt_f32_to_f16(src[i]);
        return;
    }
    default: MT_CHECK(0, "mt_convert_from_f32: unsupported destination dtype %s", mt_dtype_name(dst_dt));
    }
}
