/* Non-finite scan (see finite.h).  A float is NaN or Inf exactly when its
 * exponent bits are all ones, i.e. when (bits & 0x7fffffff) >= 0x7f800000:
 * blocks are tested by the maximum of the masked bits, and only a block
 * with a hit is walked element by element for the first one. */
#include "base/finite.h"

#include <stdio.h>
#include <string.h>

#define FIN_BLOCK 1024 /* floats per block: 4 KiB, a page */

/* The largest |bits| of a block: one unsigned max per element, a reduction
 * GCC vectorizes at -O2 (pmaxud), so the test runs at memory speed.  (A
 * hand-written 8-lane compare-and-or with GCC's generic vectors ran at a
 * tenth of that on an SSE-only target: it was split and spilled.) */
static int block_has_nonfinite(const float *x) {
    uint32_t m = 0;
    for (int i = 0; i < FIN_BLOCK; i++) {
        uint32_t u;
        memcpy(&u, x + i, sizeof u); /* not *(uint32_t *): strict aliasing */
        u &= 0x7fffffffu;
        m = u > m ? u : m;
    }
    return m >= 0x7f800000u;
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
