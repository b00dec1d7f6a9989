/* Element types of stored tensors and their conversions.
 *
 * Compute is fp32 everywhere on the CPU backend; bf16/f16 appear in
 * checkpoints (converted on load) and as the device working copy on CUDA.
 * Conversions round to nearest even, as torch's .to(torch.bfloat16) does. */
#ifndef MT_BASE_DTYPE_H
#define MT_BASE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "base/hd.h"

typedef enum {
    MT_F32 = 0,
    MT_BF16,
    MT_F16,
    MT_I32,
    MT_I64,
    MT_DTYPE_COUNT,
} mt_dtype_t;

size_t mt_dtype_size(mt_dtype_t dt);
const char *mt_dtype_name(mt_dtype_t dt); /* safetensors spelling: "F32", "BF16", ... */

MT_HD float mt_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

MT_HD uint16_t mt_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)((u + rounding) >> 16);
}

/* IEEE half <-> float, exact for every half value (subnormals included). */
MT_HD float mt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while ((man & 0x400u) == 0);
            man &= 0x3ffu;
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | (man << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

MT_HD uint16_t mt_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t sign = (u >> 16) & 0x8000u;
    uint32_t absu = u & 0x7fffffffu;
    if (absu > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (absu >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* overflow -> inf */
    if (absu < 0x38800000u) { /* result is subnormal or zero */
        if (absu < 0x33000000u) return (uint16_t)sign;
        uint32_t man = (absu & 0x7fffffu) | 0x800000u;
        int shift = 126 - (int)(absu >> 23); /* 14..24 */
        uint32_t half = man >> shift;
        uint32_t rem = man & ((1u << shift) - 1u);
        uint32_t mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = absu + 0xfffu + ((absu >> 13) & 1u) - (112u << 23);
    return (uint16_t)(sign | (r >> 13));
}

/* Converts n elements of src (dtype src_dt) to fp32. */
void mt_convert_to_f32(float *dst, const void *src, mt_dtype_t src_dt, size_t n);
/* Converts n fp32 elements to dst_dt (F32, BF16 or F16). */
void mt_convert_from_f32(void *dst, mt_dtype_t dst_dt, const float *src, size_t n);

#endif
