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

/* The view's buffers in packing order, each with its offset field. */
typedef struct {
    const void *src;
    size_t *off;
} home_part_t;

enum { HOME_PARTS = 6 };

static void home_parts(eng_quant_home_t *h, const mt_quant_view_t *q, home_part_t parts[HOME_PARTS]) {
    parts[0] = (home_part_t){q->codes, &h->off_codes};
    parts[1] = (home_part_t){q->scales, &h->off_scales};
    parts[2] = (home_part_t){q->scales_u8, &h->off_scales_u8};
    parts[3] = (home_part_t){q->zeros, &h->off_zeros};
    parts[4] = (home_part_t){q->absmax2, &h->off_absmax2};
    parts[5] = (home_part_t){q->code2, &h->off_code2};
}

void eng_quant_home_defer(eng_quant_home_t *h, const mt_quant_view_t *q, const mt_quant_sizes_t *have, void *owned) {
    memset(h, 0, sizeof *h);
    h->view = *q;
    const size_t bytes[HOME_PARTS] = {
        (size_t)have->codes * (q->format == MT_QUANT_INT4 ? sizeof(int32_t) : 1),
        (size_t)have->scales * sizeof(float),
        (size_t)have->scales_u8,
        (size_t)have->zeros * sizeof(int32_t),
        (size_t)have->absmax2 * sizeof(float),
        (size_t)have->code2 * sizeof(float),
    };
    home_part_t parts[HOME_PARTS];
    home_parts(h, q, parts);
    size_t total = 0;
    for (int k = 0; k < HOME_PARTS; k++) {
        h->part_bytes[k] = parts[k].src ? bytes[k] : 0;
        *parts[k].off = parts[k].src ? place(&total, bytes[k]) : SIZE_MAX;
    }
    h->nbytes = total;
    h->pending = true;
    h->owned = owned;
}

void eng_quant_home_fill(const eng_quant_home_t *h, void *dst) {
    if (!h->pending) {
        memcpy(dst, h->bytes, h->nbytes);
        return;
    }
    memset(dst, 0, h->nbytes); /* the alignment gaps: the same bytes every time */
    eng_quant_home_t layout = *h;
    home_part_t parts[HOME_PARTS];
    home_parts(&layout, &h->view, parts);
    for (int k = 0; k < HOME_PARTS; k++)
        if (parts[k].src) memcpy((uint8_t *)dst + *parts[k].off, parts[k].src, h->part_bytes[k]);
}

void eng_quant_home_materialize(eng_quant_home_t *h) {
    if (!h->pending) return;
    uint8_t *bytes = malloc(h->nbytes > 0 ? h->nbytes : 1);
    MT_CHECK_ALLOC(bytes, "quantised home");
    eng_quant_home_fill(h, bytes);
    free(h->owned);
    h->owned = NULL;
    h->pending = false;
    h->bytes = bytes;
    h->view = eng_quant_home_view_at(h, h->bytes);
}

void eng_quant_home_pack(eng_quant_home_t *h, const mt_quant_view_t *q, const mt_quant_sizes_t *have) {
    eng_quant_home_defer(h, q, have, NULL);
    eng_quant_home_materialize(h);
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
    free(h->owned);
    h->owned = NULL;
    h->pending = false;
    h->view.codes = h->view.scales_u8 = NULL;
    h->view.scales = h->view.absmax2 = h->view.code2 = NULL;
    h->view.zeros = NULL;
}

void eng_quant_home_free(eng_quant_home_t *h) {
    if (!h) return;
    free(h->bytes);
    free(h->owned);
    memset(h, 0, sizeof *h);
}
