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

#include "base/dtype.h"
#include "base/quant_elem.h"
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

/* ---- the formats of quant_elem.h, described, checked and dequantised ---- */

/* How many elements each buffer of a quantised tensor holds (as read from
 * the checkpoint's headers), or must hold (mt_quant_expect).  0 where the
 * format has no such buffer. */
typedef struct {
    int64_t codes;     /* bytes (INT4: int32 words) */
    int64_t scales;    /* fp32 scales / absmax */
    int64_t scales_u8; /* E8M0 scales / double-quantised absmax codes */
    int64_t zeros;     /* INT4 qzeros words */
    int64_t absmax2;   /* double quantisation's second-level absmax */
    int64_t code2;     /* double quantisation's map: 256 */
} mt_quant_sizes_t;

/* The format's name as its quantization_config spells it ("fp8", "mxfp4",
 * "nf4", "fp4", "gptq"). */
const char *mt_quant_format_name(mt_quant_format_t f);

/* The sizes q's format and shape require.  Refuses (naming `what`) a shape
 * or block the format cannot have: a non-positive dimension or block, an
 * MXFP4 row not a whole number of 32-value blocks, an INT4 group that does
 * not divide in_features or an in/out_features not a multiple of 8. */
mt_status_t mt_quant_expect(const mt_quant_view_t *q, mt_quant_sizes_t *want, const char *what, mt_error_t *err);

/* mt_quant_expect, then every buffer q needs present and of the size it
 * requires (`have`: the sizes the checkpoint holds), then the scales'
 * values: FP8 and INT4 scales finite and positive, bnb absmax finite and
 * not negative (an all-zero block has absmax 0), the nested map and
 * absmax2 finite.  Host pointers.  Each refusal names `what`, the buffer
 * and what was expected. */
mt_status_t mt_quant_check(const mt_quant_view_t *q, const mt_quant_sizes_t *have, const char *what,
                           mt_error_t *err);

/* Host dequantisation of a checked q: out (rows, cols) of dtype MT_F32 or
 * MT_BF16 (each value rounded once more, to nearest even). */
void mt_dequant(const mt_quant_view_t *q, void *out, mt_dtype_t dt);
/* Rows [r0, r1) of it (out is the whole tensor): the loop the CPU kernel's
 * tasks run too. */
void mt_dequant_rows(const mt_quant_view_t *q, int64_t r0, int64_t r1, void *out, mt_dtype_t dt);

/* Bytes per parameter of a format as stored (codes plus scales), for
 * docs/quantization.md and the planner's counts to come: double_quant
 * only applies to NF4/FP4. */
double mt_quant_bytes_per_param(mt_quant_format_t f, int64_t block, bool double_quant);

/* ---- bitsandbytes 4-bit quantisation (quant_bnb.c) ---- */

/* bnb's create_dynamic_map(signed=True): the 256-entry 8-bit map its
 * double quantisation codes absmax with, computed as bnb computes it
 * (torch.linspace in fp32, midpoints, powers of ten). */
void mt_bnb_dynamic_map(float map[256]);

/* A tensor quantised as bitsandbytes' quantize_4bit: codes (ceil(n/2)),
 * absmax (nblocks) when not double-quantised, else qabsmax (nblocks),
 * absmax2 (ceil(nblocks / 256)), code2 and offset. */
typedef struct {
    mt_quant_format_t format; /* MT_QUANT_NF4 or MT_QUANT_FP4 */
    int64_t n, block, nblocks, nblocks2;
    uint8_t *codes;
    float *absmax;
    uint8_t *qabsmax;
    float *absmax2;
    float code2[256];
    float offset;
} mt_bnb4_t;

/* Quantises x (n fp32 values; a bf16 tensor widened exactly) as
 * bitsandbytes' quantize_4bit does: per block of `block` values absmax =
 * max |x|, each value times 1/absmax mapped by bnb's decision tree (a value
 * exactly on a midpoint takes the lower code; an all-zero block's 0 * inf
 * = NaN takes code 0), packed high nibble first.  double_quant: absmax
 * minus its mean, quantised blockwise (256) to the dynamic map by bnb's
 * 8-bit search (ties to the code nearer zero's side as its pivots say).
 * The mean is summed in double and rounded once; torch sums fp32 in its own
 * order, so `offset` may differ from bnb's in the last bit (both store it,
 * and dequantisation uses the stored one).  Refuses a non-finite value or
 * a block size bnb does not have (64..4096, a power of two). */
mt_status_t mt_bnb4_quantize(const float *x, int64_t n, mt_quant_format_t fmt, int64_t block, bool double_quant,
                             mt_bnb4_t *out, const char *what, mt_error_t *err);
void mt_bnb4_free(mt_bnb4_t *q);
/* q viewed as an (rows, cols) tensor, rows * cols = q->n. */
mt_quant_view_t mt_bnb4_view(const mt_bnb4_t *q, int64_t rows, int64_t cols);

/* bnb's 8-bit blockwise code for x (already divided by its block absmax)
 * on a sorted 256-entry map: the binary search of its kQuantizeBlockwise. */
uint8_t mt_bnb_quantize_8bit(const float map[256], float x);
/* bnb's NF4 / FP4 decision trees for x in [-1, 1]. */
uint8_t mt_bnb_quantize_nf4(float x);
uint8_t mt_bnb_quantize_fp4(float x);

#endif
