/* Dequantisation of the block-scaled formats MoE checkpoints ship in.
 *
 * FP8 E4M3 with block scales (DeepSeek-V3, `quant_method: fp8`): each
 * weight W (rows, cols) is stored as F8_E4M3 with a sibling
 * `weight_scale_inv` (ceil(rows/br), ceil(cols/bc)) of fp32, br = bc = 128
 * (quantization_config.weight_block_size); the value is
 * fp8(W[r][c]) * scale_inv[r / br][c / bc].  Edge blocks are partial: the
 * last block row / column covers what is left.
 *
 * MXFP4 (OCP Microscaling, gpt-oss's `quant_method: mxfp4`): 32 values per
 * block share one E8M0 scale (an exponent: 2^(s - 127)); each value is FP4
 * E2M1 (sign, 2 exponent bits with bias 1, 1 mantissa bit: 0, 0.5, 1, 1.5,
 * 2, 3, 4, 6 and their negatives), two per byte, the low nibble first.
 * gpt-oss stores `<name>_blocks` (E, R, G, 16) uint8 and `<name>_scales`
 * (E, R, G) uint8: row r of expert e holds G * 32 values.  transformers'
 * convert_moe_packed_tensors dequantises that to (E, R, G*32) and then
 * transposes the last two dimensions, which is how GptOssExperts holds
 * gate_up_proj (E, H, 2I) and down_proj (E, I, H).
 *
 * Everything here is computed from the formats' definitions (no tables
 * copied from elsewhere) and is exact: every FP8 / FP4 value times a power
 * of two or an fp32 scale is one fp32 rounding at most. */
#ifndef MT_BASE_QUANT_H
#define MT_BASE_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

/* E4M3 "FN" (no infinities): bias 7, subnormals at exponent 0,
 * S.1111.111 is NaN, largest finite 448. */
float mt_fp8_e4m3_to_f32(uint8_t b);
/* E5M2: IEEE-like (bias 15, infinities and NaNs): the top byte of an fp16. */
float mt_fp8_e5m2_to_f32(uint8_t b);
/* E2M1 from the low 4 bits of `nibble`: bias 1, no infinities or NaN. */
float mt_fp4_e2m1_to_f32(uint8_t nibble);
/* E8M0 scale: 2^(s - 127); 0xFF is NaN (OCP MX). */
float mt_e8m0_to_f32(uint8_t s);

/* FP8 E4M3 weight (rows, cols) with its block scales (srows, scols) of
 * block (br, bc) -> fp32 out (rows, cols).  `what` names the tensor in
 * messages; a scale grid that does not cover the weight exactly is an
 * error saying which shape was expected. */
mt_status_t mt_dequant_fp8_e4m3_block(const uint8_t *w, int64_t rows, int64_t cols, const float *scale_inv,
                                      int64_t srows, int64_t scols, int64_t br, int64_t bc, float *out,
                                      const char *what, mt_error_t *err);

/* Index of the first scale in x[0..n) that is not finite and positive (a
 * NaN, an Inf, 0 or a negative one), or SIZE_MAX when all are. */
size_t mt_first_bad_scale(const float *x, size_t n);

/* MXFP4: blocks (batch, rows, groups, 16) and scales (batch, rows, groups)
 * -> out.  transpose false: out (batch, rows, groups*32), the packed order;
 * true: out (batch, groups*32, rows), as transformers holds gpt-oss's
 * experts. */
void mt_dequant_mxfp4(const uint8_t *blocks, const uint8_t *scales, int64_t batch, int64_t rows, int64_t groups,
                      bool transpose, float *out);

#endif
