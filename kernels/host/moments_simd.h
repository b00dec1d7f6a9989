/* SIMD copies of the lighter moment formats' per-block store
 * (kernels/math/moments_math.h): the bf16 stochastic rounding and the 8-bit
 * absmax and quantizer over one full block of 256 elements, for AVX2 and
 * AVX-512F.  Each gives exactly the bits of the scalar definition (the
 * tests compare them on every path); moments.c chooses one at run time. */
#ifndef MT_KERNELS_HOST_MOMENTS_SIMD_H
#define MT_KERNELS_HOST_MOMENTS_SIMD_H

#include <stddef.h>
#include <stdint.h>

/* bitsandbytes' search with its table reads laid out by the path taken
 * so far: after step k (1..7) the value compared next is path_k[t], t the
 * k bits of the up/down decisions; AVX-512 reads them with permutes
 * instead of gathers (slow on CPUs with the gather data-sampling fix).
 * Made once per call from the maps (kern_moments_q8_tables_init). */
typedef struct {
    /* [signed, unsigned]: steps 1..4 at 0, 16, 32, 48 (each padded to 16),
     * step 5 at 64 (32 values), 6 at 96 (64), 7 at 160 (128) */
    float path[2][288] __attribute__((aligned(64)));
} kern_moments_q8_tables_t;
void kern_moments_q8_tables_init(kern_moments_q8_tables_t *t);

/* mf, vf: (256) the block's updated fp32 moments; b: the block's first
 * element index (the random bits' counter); key: kern_moments_sr_key. */
void kern_moments_bf16_store_avx2(uint16_t *m, uint16_t *v, const float *mf, const float *vf, uint64_t key,
                                  size_t b);
void kern_moments_bf16_store_avx512(uint16_t *m, uint16_t *v, const float *mf, const float *vf, uint64_t key,
                                    size_t b);
/* Codes of the block into m, v (256 each) and its absmax into *am, *av. */
void kern_moments_8bit_store_avx2(uint8_t *m, uint8_t *v, float *am, float *av, const float *mf,
                                  const float *vf);
void kern_moments_8bit_store_avx512(const kern_moments_q8_tables_t *t, uint8_t *m, uint8_t *v, float *am,
                                    float *av, const float *mf, const float *vf);
/* The dequantized block (map[code] * absmax) of 256 codes: the scalar
 * expansion's product, so the same bits. */
void kern_moments_8bit_expand_avx512(const float *q, const uint8_t *codes, float am, float *out);
void kern_moments_bf16_expand_avx512(const uint16_t *src, float *out);

#endif
