/* Quantised homes of frozen base matrices (see quant_home.h). */
#include "engine/model/quant_home.h"

#include <stdlib.h>
#include <string.h>

#include "base/status.h"

bool eng_quant_home_role_ok(eng_param_role_t role) {
    switch (role) {
    case ENG_P_Q:
    case ENG_P_K:
    case ENG_P_V:
    case ENG_P_O:
    case ENG_P_Q_A:
    case ENG_P_Q_B:
    case ENG_P_KV_A:
    case ENG_P_KV_B:
    case ENG_P_EXP_GATE:
    case ENG_P_EXP_UP:
    case ENG_P_EXP_DOWN:
    case ENG_P_SHARED_GATE:
    case ENG_P_SHARED_UP:
    case ENG_P_SHARED_DOWN:
    case ENG_P_DENSE_GATE:
    case ENG_P_DENSE_UP:
    case ENG_P_DENSE_DOWN:
    case ENG_P_EXP_GATE_UP_FUSED:
    case ENG_P_EXP_DOWN_FUSED: return true;
    default: return false;
    }
}

bool eng_quant_home_skipped(const char *name, const char (*skip)[128], int n) {
    size_t len = strlen(name);
    if (len > 7 && strcmp(name + len - 7, ".weight") == 0) len -= 7;
    for (int k = 0; k < n; k++) {
        const size_t kl = strlen(skip[k]);
        if (kl == 0 || kl > len) continue;
        for (size_t at = 0; at + kl <= len; at++) {
            const bool starts = at == 0 || name[at - 1] == '.';
            const bool ends = at + kl == len || name[at + kl] == '.';
            if (starts && ends && memcmp(name + at, skip[k], kl) == 0) return true;
        }
    }
    return false;
}

/* 16 bytes: every buffer's type (bytes, fp32, int32) is aligned at it,
 * on the host and at the same offsets in a device copy of the block. */
static size_t place(size_t *total, size_t bytes) {
    const size_t at = (*total + 15) & ~(size_t)15;
    *total = at + bytes;
    return at;
}

void eng_quant_home_pack(eng_quant_home_t *h, const mt_quant_view_t *q, const mt_quant_sizes_t *have) {
    memset(h, 0, sizeof *h);
    h->view = *q;
    const size_t code_bytes = (size_t)have->codes * (q->format == MT_QUANT_INT4 ? sizeof(int32_t) : 1);
    struct {
        const void *src;
        size_t bytes;
        size_t *off;
    } parts[] = {
        {q->codes, code_bytes, &h->off_codes},
        {q->scales, (size_t)have->scales * sizeof(float), &h->off_scales},
        {q->scales_u8, (size_t)have->scales_u8, &h->off_scales_u8},
        {q->zeros, (size_t)have->zeros * sizeof(int32_t), &h->off_zeros},
        {q->absmax2, (size_t)have->absmax2 * sizeof(float), &h->off_absmax2},
        {q->code2, (size_t)have->code2 * sizeof(float), &h->off_code2},
    };
    const int np = (int)(sizeof parts / sizeof parts[0]);
    size_t total = 0;
    for (int k = 0; k < np; k++) *parts[k].off = parts[k].src ? place(&total, parts[k].bytes) : SIZE_MAX;
    h->nbytes = total;
    h->bytes = malloc(total > 0 ? total : 1);
    MT_CHECK_ALLOC(h->bytes, "quantised home");
    for (int k = 0; k < np; k++)
        if (parts[k].src) memcpy(h->bytes + *parts[k].off, parts[k].src, parts[k].bytes);
    h->view = eng_quant_home_view_at(h, h->bytes);
}

mt_status_t eng_quant_home_bnb4(eng_quant_home_t *h, const float *x, int64_t rows, int64_t cols,
                                mt_quant_format_t fmt, bool double_quant, const char *what, mt_error_t *err) {
    mt_bnb4_t q;
    /* 64: bitsandbytes' default blocksize, the one Linear4bit uses */
    mt_status_t st = mt_bnb4_quantize(x, rows * cols, fmt, 64, double_quant, &q, what, err);
    if (st != MT_OK) return st;
    const mt_quant_view_t v = mt_bnb4_view(&q, rows, cols);
    mt_quant_sizes_t have = {.codes = (rows * cols + 1) / 2};
    if (double_quant) {
        have.scales_u8 = q.nblocks;
        have.absmax2 = q.nblocks2;
        have.code2 = 256;
    } else {
        have.scales = q.nblocks;
    }
    st = mt_quant_check(&v, &have, what, err); /* the one gate every quantised home passes */
    if (st == MT_OK) eng_quant_home_pack(h, &v, &have);
    mt_bnb4_free(&q);
    return st;
}

mt_quant_view_t eng_quant_home_view_at(const eng_quant_home_t *h, const void *base) {
    const uint8_t *b = base;
    mt_quant_view_t v = h->view;
#define AT(off, type) ((off) == SIZE_MAX ? NULL : (type)(const void *)(b + (off)))
    v.codes = AT(h->off_codes, const uint8_t *);
    v.scales = AT(h->off_scales, const float *);
    v.scales_u8 = AT(h->off_scales_u8, const uint8_t *);
    v.zeros = AT(h->off_zeros, const int32_t *);
    v.absmax2 = AT(h->off_absmax2, const float *);
    v.code2 = AT(h->off_code2, const float *);
#undef AT
    return v;
}

void eng_quant_home_drop_bytes(eng_quant_home_t *h) {
    free(h->bytes);
    h->bytes = NULL;
    h->view.codes = h->view.scales_u8 = NULL;
    h->view.scales = h->view.absmax2 = h->view.code2 = NULL;
    h->view.zeros = NULL;
}

void eng_quant_home_free(eng_quant_home_t *h) {
    if (!h) return;
    free(h->bytes);
    memset(h, 0, sizeof *h);
}
