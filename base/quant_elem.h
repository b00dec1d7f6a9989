/* One definition of every quantised format moetune reads: the description
 * of a quantised tensor (mt_quant_view_t) and the value of one element of
 * it (mt_quant_value).  The host dequantiser (base/quant.c), the CPU twin
 * (kernels/cpu/dequant.c) and the CUDA kernel (kernels/cuda/dequant.cu)
 * all call mt_quant_value, so the three agree bit for bit by construction;
 * tests/quant_ref_test.c holds them to values computed independently from
 * each format's definition (tests/reference/make_quant_fixtures.py).
 *
 * Every format dequantises to a row-major (rows, cols) tensor.  Each value
 * is one code times one scale, rounded once to fp32 (NF4 with double
 * quantisation first rebuilds its fp32 absmax, as bitsandbytes does):
 *
 * FP8_BLOCK  DeepSeek-V3 / GLM-4.5 `quant_method: fp8`.  codes: F8_E4M3
 *            (rows, cols); scales: fp32 weight_scale_inv
 *            (ceil(rows/br), ceil(cols/bc)), br = bc = 128 as published;
 *            W[r][c] = e4m3(codes[r][c]) * scales[r/br][c/bc].
 * MXFP4      OCP Microscaling (gpt-oss `quant_method: mxfp4`).  codes: the
 *            `_blocks` bytes (rows, cols/32, 16), two E2M1 values per byte,
 *            the low nibble first (even column); scales_u8: the `_scales`
 *            E8M0 bytes (rows, cols/32); W = e2m1 * 2^(s - 127).
 *            Transposed (tr_rows = K > 0), as gpt-oss holds its experts:
 *            the view (rows, cols) is rows / K matrices (K, cols), each the
 *            transpose of a packed (cols, K) one; element (e*K + k, c) is
 *            packed element (e*cols + c, k), so codes are
 *            (rows/K * cols, K/32, 16) and scales_u8 (rows/K * cols, K/32):
 *            the `_blocks` / `_scales` bytes as stored, kept quantised.
 * NF4, FP4   bitsandbytes 4-bit (`load_in_4bit`, bnb_4bit_quant_type nf4 or
 *            fp4), blockwise over the FLATTENED tensor: element i = r*cols+c
 *            is in block i / block (64 by default); codes: ceil(n/2) bytes,
 *            element 2j in the HIGH nibble of byte j, 2j+1 in the low one
 *            (bnb's kQuantizeBlockwise packs `q(x[2j]) << 4 | q(x[2j+1])`);
 *            W = code_table[q] * absmax[i / block].  absmax is either fp32
 *            (scales, one per block) or double-quantised: scales_u8 holds
 *            one 8-bit code per block, and
 *              absmax[b] = code2[scales_u8[b]] * absmax2[b / block2] + offset
 *            (bnb's dequantize_blockwise of the nested state, then
 *            `absmax += offset`), code2 the 256-entry dynamic map,
 *            block2 = 256.
 * INT4       GPTQ (`quant_method: gptq`, desc_act false, checkpoint_format
 *            gptq), rows = out_features, cols = in_features, group size g
 *            along cols: codes: qweight int32 (cols/8, rows), value i of a
 *            word in bits 4i..4i+3 (the low bits first); zeros: qzeros
 *            int32 (cols/g, rows/8), packed the same way along rows, each
 *            stored as zero - 1 (GPTQ's convention, so the zero point is
 *            the nibble + 1); scales: fp32 (cols/g, rows) (the checkpoint's
 *            fp16, widened exactly);
 *              W[r][c] = scales[c/g][r] * (q - z).
 *
 * The code tables (NF4, FP4, E2M1, E4M3) are computed from the formats'
 * definitions; NF4's are the sixteen fp32 constants bitsandbytes defines
 * (csrc kernels' NF4 lookup table, the same as functional.get_4bit_type).
 * MT_HD functions are the only functions defined in headers (base/hd.h). */
#ifndef MT_BASE_QUANT_ELEM_H
#define MT_BASE_QUANT_ELEM_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "base/hd.h"

typedef enum {
    MT_QUANT_FP8_BLOCK = 0,
    MT_QUANT_MXFP4,
    MT_QUANT_NF4,
    MT_QUANT_FP4,
    MT_QUANT_INT4,
    MT_QUANT_FORMAT_COUNT,
} mt_quant_format_t;

/* A quantised tensor: its format, the dequantised shape and the buffers
 * (host or device pointers, as the caller passes them).  Fields a format
 * does not use are zero / NULL. */
typedef struct {
    mt_quant_format_t format;
    int64_t rows, cols;             /* the dequantised tensor (rows, cols) */
    int64_t block;                  /* MXFP4 32, NF4/FP4 the absmax block, INT4 the group; FP8 block_rows */
    int64_t block_cols;             /* FP8 only: the block's columns */
    const uint8_t *codes;           /* FP8/MXFP4/NF4/FP4: the code bytes; INT4: qweight as bytes */
    const float *scales;            /* FP8 scale_inv, NF4/FP4 absmax (fp32), INT4 scales; NULL when double-quantised */
    const uint8_t *scales_u8;       /* MXFP4 E8M0 scales; NF4/FP4 double-quantised absmax codes */
    const int32_t *zeros;           /* INT4 qzeros */
    const float *absmax2;           /* double quantisation: one fp32 per block2 absmax codes */
    const float *code2;             /* double quantisation: the 256-entry map */
    int64_t block2;                 /* double quantisation: 256 */
    float offset;                   /* double quantisation: added after the nested dequantisation */
    int64_t tr_rows;                /* MXFP4 held transposed (see MXFP4 above); 0: the packed order */
} mt_quant_view_t;

/* A small constant table inside an MT_HD function: static on the host (one
 * copy in read-only data), a plain local in device code (CUDA keeps no
 * static locals there; the compiler folds or places it). */
#ifdef __CUDA_ARCH__
#define MT_HD_TABLE const
#else
#define MT_HD_TABLE static const
#endif

/* An fp32 from its bit pattern (exact; no library call on either side). */
MT_HD float mt_q_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* E4M3 "FN" (no infinities): bias 7, subnormals at exponent 0, S.1111.111
 * NaN.  A normal (1 + m/8) * 2^(e-7) is the fp32 with exponent field
 * e - 7 + 127 and m on top of its mantissa; a subnormal m/8 * 2^(1-7) =
 * m * 2^-9, one exact product. */
MT_HD float mt_q_e4m3(uint8_t b) {
    const uint32_t sign = (uint32_t)(b & 0x80) << 24, e = (b >> 3) & 0xFu, m = b & 0x7u;
    if (e == 0xF && m == 0x7) return mt_q_bits(0x7FC00000u); /* the quiet NaN glibc's NAN is; CUDA's is 0x7FFFFFFF */
    if (e == 0) {
        uint32_t u;
        const float mag = (float)m * 0x1p-9f;
        memcpy(&u, &mag, sizeof u);
        return mt_q_bits(u | sign);
    }
    return mt_q_bits(sign | ((e + 120u) << 23) | (m << 20));
}

/* E2M1 from the low 4 bits: bias 1, no infinities or NaN; the eight
 * magnitudes (1 + m/2) * 2^(e-1) and the subnormal 0.5 * m. */
MT_HD float mt_q_e2m1(uint8_t nibble) {
    MT_HD_TABLE float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    const float v = mag[nibble & 0x7];
    return (nibble & 0x8) ? -v : v;
}

/* E8M0: 2^(s - 127), the fp32 with exponent field s (s = 0: the subnormal
 * 2^-127); 0xFF is NaN (OCP MX). */
MT_HD float mt_q_e8m0(uint8_t s) {
    if (s == 0xFF) return NAN;
    return mt_q_bits(s ? (uint32_t)s << 23 : 0x00400000u);
}

/* NormalFloat4 (QLoRA): bitsandbytes' sixteen fp32 constants, code 7 is 0. */
MT_HD float mt_q_nf4(uint8_t q) {
    MT_HD_TABLE float t[16] = {-1.0f,
                         -0.6961928009986877f,
                         -0.5250730514526367f,
                         -0.39491748809814453f,
                         -0.28444138169288635f,
                         -0.18477343022823334f,
                         -0.09105003625154495f,
                         0.0f,
                         0.07958029955625534f,
                         0.16093020141124725f,
                         0.24611230194568634f,
                         0.33791524171829224f,
                         0.44070982933044434f,
                         0.5626170039176941f,
                         0.7229568362236023f,
                         1.0f};
    return t[q & 0xF];
}

/* bitsandbytes' FP4 (sign, 2 exponent bits, 1 mantissa bit, bias 3 in its
 * own ordering of codes), normalised by its largest value 12: codes 0..7
 * are 0, 0.0625, 8, 12, 4, 6, 2, 3 divided by 12 (fp32, one rounding);
 * 8..15 their negatives. */
MT_HD float mt_q_fp4(uint8_t q) {
    /* each quotient folded by the compiler: one correctly rounded division */
    MT_HD_TABLE float mag[8] = {0.0f / 12.0f, 0.0625f / 12.0f, 8.0f / 12.0f, 12.0f / 12.0f,
                                4.0f / 12.0f, 6.0f / 12.0f,    2.0f / 12.0f, 3.0f / 12.0f};
    const float v = mag[q & 0x7];
    return (q & 0x8) ? -v : v;
}

/* A 4-bit code of element i of a flat bnb tensor: high nibble for even i. */
MT_HD uint8_t mt_q_nibble_hi_first(const uint8_t *codes, int64_t i) {
    const uint8_t b = codes[i >> 1];
    return (i & 1) ? (uint8_t)(b & 0xF) : (uint8_t)(b >> 4);
}

/* bnb 4-bit: the fp32 absmax of block b, direct or double-quantised. */
MT_HD float mt_q_bnb_absmax(const mt_quant_view_t *q, int64_t b) {
    if (q->scales) return q->scales[b];
    return q->code2[q->scales_u8[b]] * q->absmax2[b / q->block2] + q->offset;
}

/* GPTQ INT4: nibble k (0..7) of a little-endian packed int32. */
MT_HD int mt_q_int4_nibble(int32_t word, int64_t k) {
    return (int)(((uint32_t)word >> (4 * k)) & 0xFu);
}

/* The fp32 value of element (r, c) of q, one function per format (the
 * kernels' loops call these directly, the format chosen outside the loop),
 * and mt_quant_value choosing among them. */
MT_HD float mt_quant_fp8_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    const int64_t scols = (q->cols + q->block_cols - 1) / q->block_cols;
    const float code = mt_q_e4m3(q->codes[r * q->cols + c]);
    /* A NaN code is returned as it is: a GPU's product would turn it into its own NaN (0x7FFFFFFF), a CPU's
     * keeps the operand's bits, and the twins must agree bit for bit. */
    if (code != code) return code;
    return code * q->scales[(r / q->block) * scols + c / q->block_cols];
}

MT_HD float mt_quant_mxfp4_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    int64_t pr = r, pc = c, len = q->cols; /* the packed row, column and row length */
    if (q->tr_rows > 0) {
        pr = (r / q->tr_rows) * q->cols + c;
        pc = r % q->tr_rows;
        len = q->tr_rows;
    }
    const uint8_t b = q->codes[pr * (len / 2) + pc / 2];
    const uint8_t nib = (pc & 1) ? (uint8_t)(b >> 4) : (uint8_t)(b & 0xF);
    return mt_q_e2m1(nib) * mt_q_e8m0(q->scales_u8[pr * (len / 32) + pc / 32]);
}

/* NF4 and FP4 (bitsandbytes): the flat element i = r * cols + c. */
MT_HD float mt_quant_bnb4_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    const int64_t i = r * q->cols + c;
    const uint8_t nib = mt_q_nibble_hi_first(q->codes, i);
    const float code = q->format == MT_QUANT_NF4 ? mt_q_nf4(nib) : mt_q_fp4(nib);
    return code * mt_q_bnb_absmax(q, i / q->block);
}

MT_HD float mt_quant_int4_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    const int32_t *qw = (const int32_t *)(const void *)q->codes;
    const int64_t g = c / q->block;
    const int qv = mt_q_int4_nibble(qw[(c / 8) * q->rows + r], c % 8);
    const int z = mt_q_int4_nibble(q->zeros[g * (q->rows / 8) + r / 8], r % 8) + 1;
    return (float)(qv - z) * q->scales[g * q->rows + r];
}

MT_HD float mt_quant_value(const mt_quant_view_t *q, int64_t r, int64_t c) {
    switch (q->format) {
    case MT_QUANT_FP8_BLOCK: return mt_quant_fp8_value(q, r, c);
    case MT_QUANT_MXFP4: return mt_quant_mxfp4_value(q, r, c);
    case MT_QUANT_NF4:
    case MT_QUANT_FP4: return mt_quant_bnb4_value(q, r, c);
    case MT_QUANT_INT4: return mt_quant_int4_value(q, r, c);
    default: return NAN;
    }
}

#endif
