/* A strided 4-D copy: how MLA (engine/layers/mla.c) splits its projections
 * into heads, lays the rotary parts out for RoPE (including DeepSeek's
 * interleaved pairs) and broadcasts the one rotary key to every head.
 *
 *   dst[i*ds0 + j*ds1 + k*ds2 + l*ds3]  =  (or += when accumulate)
 *   src[i*ss0 + j*ss1 + k*ss2 + l*ss3]      for (i, j, k, l) < (d0, d1, d2, d3)
 *
 * Strides are in elements; a source stride may be 0 (broadcast).  The
 * destination positions must be distinct (no two index tuples write one
 * element), so the result does not depend on the order elements are
 * visited: a copy is exact and += is one float addition per element, the
 * same on both backends. */
#ifndef MT_KERNELS_COPY4D_H
#define MT_KERNELS_COPY4D_H

#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef struct {
    int64_t d[4];  /* extents */
    int64_t ss[4]; /* source strides */
    int64_t ds[4]; /* destination strides */
} kern_copy4d_t;

typedef void (*kern_copy4d_fn)(kern_stream_t *s, float *dst, const float *src, const kern_copy4d_t *c,
                               int accumulate);
void kern_copy4d_cpu(kern_stream_t *s, float *dst, const float *src, const kern_copy4d_t *c, int accumulate);
void kern_copy4d_cuda(kern_stream_t *s, float *dst, const float *src, const kern_copy4d_t *c, int accumulate);

#endif
