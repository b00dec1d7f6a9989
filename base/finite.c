/* Non-finite scan (see finite.h).  A float is NaN or Inf exactly when its
 * exponent bits are all ones; OR-ing the lane-wise compares over a block
 * needs no branch per element and compiles to plain vector and/compare/or
 * instructions. */
#include "base/finite.h"

#include <stdio.h>
#include <string.h>

#define FIN_LANES 8
#define FIN_BLOCK 256 /* floats per block: 1 KiB, a whole number of lane vectors */

typedef int32_t fin_vi_t __attribute__((vector_size(FIN_LANES * sizeof(int32_t))));

static int block_has_nonfinite(const float *x) {
    const fin_vi_t ex = {0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000,
                         0x7f800000, 0x7f800000, 0x7f800000, 0x7f800000};
    fin_vi_t hit = {0};
    for (int i = 0; i < FIN_BLOCK; i += FIN_LANES) {
        fin_vi_t v;
        memcpy(&v, x + i, sizeof v); /* x may be only 4-byte aligned */
        hit |= (v & ex) == ex;       /* lanes of -1 where the exponent is all ones */
    }
    int32_t any = 0;
    for (int l = 0; l < FIN_LANES; l++) any |= hit[l];
    return any != 0;
}

static int is_nonfinite(float v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return (u & 0x7fffffffu) >= 0x7f800000u;
}

size_t mt_first_nonfinite_f32(const float *x, size_t n) {
    size_t i = 0;
    for (; i + FIN_BLOCK <= n; i += FIN_BLOCK)
        if (block_has_nonfinite(x + i)) break;
    for (; i < n; i++)
        if (is_nonfinite(x[i])) return i;
    return MT_ALL_FINITE;
}

const char *mt_nonfinite_name(float v) {
    if (!is_nonfinite(v)) return "finite";
    if (v != v) return "NaN";
    return v > 0 ? "+Inf" : "-Inf";
}

void mt_index_to_str(char *buf, size_t cap, size_t i, int ndim, const int64_t *shape) {
    size_t coord[8];
    int nd = ndim > 8 ? 8 : ndim;
    for (int d = nd - 1; d >= 0; d--) {
        const size_t s = shape[d] > 0 ? (size_t)shape[d] : 1;
        coord[d] = d > 0 ? i % s : i;
        i /= s;
    }
    size_t n = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < nd && n < cap; d++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%zu", d ? ", " : "", coord[d]);
    if (n < cap) snprintf(buf + n, cap - n, "]");
}
