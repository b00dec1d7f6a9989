/* bitsandbytes' 4-bit quantisation (quant.h), written from its
 * definitions: functional.quantize_4bit / quantize_blockwise /
 * create_dynamic_map and the CUDA kernel kQuantizeBlockwise with its
 * dQuantizeNF4, dQuantizeFP4 and dQuantize<0> searches.  The order of the
 * fp32 operations is bnb's, so the codes come out the same: each value is
 * multiplied by 1/absmax (not divided by absmax), and comparisons against
 * the trees' fp32 pivots are strict (`x > pivot` takes the upper code). */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/quant.h"

uint8_t mt_bnb_quantize_nf4(float x) {
    /* the midpoints between adjacent NF4 codes, as bnb's tree holds them */
    if (x > 0.03979014977812767f) {
        if (x > 0.3893125355243683f) {
            if (x > 0.6427869200706482f) return x > 0.8614784181118011f ? 15 : 14;
            return x > 0.5016634166240692f ? 13 : 12;
        }
        if (x > 0.2035212516784668f) return x > 0.2920137718319893f ? 11 : 10;
        return x > 0.1202552504837513f ? 9 : 8;
    }
    if (x > -0.33967943489551544f) {
        if (x > -0.13791173323988914f) return x > -0.045525018125772476f ? 7 : 6;
        return x > -0.23460740596055984f ? 5 : 4;
    }
    if (x > -0.6106329262256622f) return x > -0.4599952697753906f ? 3 : 2;
    return x > -0.8480964004993439f ? 1 : 0;
}

uint8_t mt_bnb_quantize_fp4(float x) {
    const uint8_t sign = x < 0 ? 8 : 0;
    x = fabsf(x);
    if (x > 0.29166667f) {
        if (x > 0.583333f) return (uint8_t)((x > 0.8333333f ? 3 : 2) + sign);
        return (uint8_t)((x > 0.4166667f ? 5 : 4) + sign);
    }
    if (x > 0.0859375f) return (uint8_t)((x > 0.20833333f ? 7 : 6) + sign);
    return (uint8_t)((x > 0.00260417f ? 1 : 0) + sign);
}

uint8_t mt_bnb_quantize_8bit(const float map[256], float x) {
    int pivot = 127, upper_pivot = 255, lower_pivot = 0;
    float lower = -1.0f, upper = 1.0f, val = map[pivot];
    for (int i = 64; i > 0; i >>= 1) {
        if (x > val) {
            lower_pivot = pivot;
            lower = val;
            pivot += i;
        } else {
            upper_pivot = pivot;
            upper = val;
            pivot -= i;
        }
        val = map[pivot];
    }
    if (upper_pivot == 255) upper = map[upper_pivot];
    if (lower_pivot == 0) lower = map[lower_pivot];
    if (x > val) return (uint8_t)(x > (upper + val) * 0.5f ? upper_pivot : pivot);
    return (uint8_t)(x < (lower + val) * 0.5f ? lower_pivot : pivot);
}

/* torch.linspace(start, end, steps) in fp32 as torch's CPU kernel computes
 * it: the first half from start, the second half back from end, each
 * `start + step * i` one fused multiply-add (torch's kernels are built with
 * FMA contraction; the reference script's map from torch matches this). */
static void linspace_f32(float start, float end, int steps, float *out) {
    const float step = (end - start) / (float)(steps - 1);
    for (int i = 0; i < steps; i++)
        out[i] = i < steps / 2 ? fmaf(step, (float)i, start) : fmaf(-step, (float)(steps - i - 1), end);
}

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

void mt_bnb_dynamic_map(float map[256]) {
    /* signed, max_exponent_bits 7, total_bits 8: for exponent i the
     * midpoints of 2^i + 1 points in [0.1, 1], times 10^(i - 6), both signs;
     * then 0 and 1, sorted */
    static const float k_pow10[7] = {1e-6f, 1e-5f, 1e-4f, 1e-3f, 1e-2f, 1e-1f, 1.0f};
    int n = 0;
    for (int i = 0; i < 7; i++) {
        const int items = (1 << i) + 1;
        float b[65];
        linspace_f32(0.1f, 1.0f, items, b);
        for (int k = 0; k + 1 < items; k++) {
            const float mean = (b[k] + b[k + 1]) / 2.0f;
            map[n++] = k_pow10[i] * mean;
            map[n++] = -(k_pow10[i] * mean);
        }
    }
    map[n++] = 0.0f;
    map[n++] = 1.0f;
    qsort(map, (size_t)n, sizeof *map, cmp_float);
}

/* absmax per block of a flat x, as kQuantizeBlockwise reduces it. */
static float block_absmax(const float *x, int64_t n) {
    float m = -FLT_MAX;
    for (int64_t i = 0; i < n; i++) m = fmaxf(m, fabsf(x[i]));
    return m;
}

static void quantize_4bit_blocks(const float *x, mt_bnb4_t *q) {
    memset(q->codes, 0, (size_t)((q->n + 1) / 2));
    for (int64_t b = 0; b < q->nblocks; b++) {
        const int64_t lo = b * q->block, cnt = q->n - lo < q->block ? q->n - lo : q->block;
        const float amax = block_absmax(x + lo, cnt), inv = 1.0f / amax;
        q->absmax[b] = amax;
        /* a partial last block is padded with zeros, as bnb's block load pads it */
        const int64_t padded = cnt + (cnt & 1);
        for (int64_t j = 0; j < padded; j++) {
            const float v = j < cnt ? x[lo + j] : 0.0f;
            const uint8_t c = q->format == MT_QUANT_NF4 ? mt_bnb_quantize_nf4(v * inv) : mt_bnb_quantize_fp4(v * inv);
            const int64_t i = lo + j;
            q->codes[i >> 1] |= (uint8_t)((i & 1) ? c : c << 4);
        }
    }
}

/* quantize_blockwise(absmax - offset, blocksize=256) on the dynamic map. */
static void double_quantize(mt_bnb4_t *q) {
    mt_bnb_dynamic_map(q->code2);
    double sum = 0.0;
    for (int64_t b = 0; b < q->nblocks; b++) sum += q->absmax[b];
    q->offset = (float)(sum / (double)q->nblocks);
    q->nblocks2 = (q->nblocks + 255) / 256;
    for (int64_t b = 0; b < q->nblocks; b++) q->absmax[b] -= q->offset;
    for (int64_t b2 = 0; b2 < q->nblocks2; b2++) {
        const int64_t lo = b2 * 256, cnt = q->nblocks - lo < 256 ? q->nblocks - lo : 256;
        const float amax = block_absmax(q->absmax + lo, cnt), inv = 1.0f / amax;
        q->absmax2[b2] = amax;
        for (int64_t j = 0; j < cnt; j++) q->qabsmax[lo + j] = mt_bnb_quantize_8bit(q->code2, q->absmax[lo + j] * inv);
    }
    free(q->absmax);
    q->absmax = NULL;
}

mt_status_t mt_bnb4_quantize(const float *x, int64_t n, mt_quant_format_t fmt, int64_t block, bool double_quant,
                             mt_bnb4_t *out, const char *what, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (fmt != MT_QUANT_NF4 && fmt != MT_QUANT_FP4)
        return mt_error_set(err, MT_ERR_UNSUPPORTED, "%s: 4-bit quantisation to %s; expected nf4 or fp4", what,
                            mt_quant_format_name(fmt));
    if (block < 32 || block > 4096 || (block & (block - 1)) || n < 1)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: 4-bit block size %lld for %lld values; expected a power of two "
                            "from 32 to 4096 (bitsandbytes uses 64)",
                            what, (long long)block, (long long)n);
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(x[i]))
            return mt_error_set(err, MT_ERR_FORMAT, "%s: value %g at [%lld] cannot be quantised; expected finite "
                                "weights",
                                what, (double)x[i], (long long)i);
    out->format = fmt;
    out->n = n;
    out->block = block;
    out->nblocks = (n + block - 1) / block;
    out->codes = malloc((size_t)((n + 1) / 2));
    out->absmax = malloc((size_t)out->nblocks * sizeof *out->absmax);
    MT_CHECK_ALLOC(out->codes, what);
    MT_CHECK_ALLOC(out->absmax, what);
    quantize_4bit_blocks(x, out);
    if (double_quant) {
        out->qabsmax = malloc((size_t)out->nblocks);
        out->absmax2 = malloc((size_t)((out->nblocks + 255) / 256) * sizeof *out->absmax2);
        MT_CHECK_ALLOC(out->qabsmax, what);
        MT_CHECK_ALLOC(out->absmax2, what);
        double_quantize(out);
    }
    return MT_OK;
}

void mt_bnb4_free(mt_bnb4_t *q) {
    if (!q) return;
    free(q->codes);
    free(q->absmax);
    free(q->qabsmax);
    free(q->absmax2);
    memset(q, 0, sizeof *q);
}

mt_quant_view_t mt_bnb4_view(const mt_bnb4_t *q, int64_t rows, int64_t cols) {
    mt_quant_view_t v = {.format = q->format, .rows = rows, .cols = cols, .block = q->block, .codes = q->codes,
                         .scales = q->absmax};
    if (q->qabsmax) {
        v.scales_u8 = q->qabsmax;
        v.absmax2 = q->absmax2;
        v.code2 = q->code2;
        v.block2 = 256;
        v.offset = q->offset;
    }
    return v;
}
