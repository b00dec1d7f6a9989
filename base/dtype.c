/* Bulk dtype conversions on the host (checkpoint load/save, bf16 rounding). */
#include "base/dtype.h"

#include "base/status.h"

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

void mt_convert_from_f32(void *dst, mt_dtype_t dst_dt, const float *src, size_t n) {
    switch (dst_dt) {
    case MT_F32: memcpy(dst, src, n * sizeof(float)); return;
    case MT_BF16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = mt_f32_to_bf16(src[i]);
        return;
    }
    case MT_F16: {
        uint16_t *d = dst;
        for (size_t i = 0; i < n; i++) d[i] = mt_f32_to_f16(src[i]);
        return;
    }
    default: MT_CHECK(0, "mt_convert_from_f32: unsupported destination dtype %s", mt_dtype_name(dst_dt));
    }
}
