/* Finding non-finite values (NaN, +-Inf) in fp32 buffers.
 *
 * Used wherever values enter or leave training (a checkpoint being loaded,
 * gradients before the optimizer) so that a NaN is reported with its
 * origin instead of surfacing later as "loss is nan".  The scan is a
 * bandwidth-bound pass: it tests blocks of floats with vector compares on
 * their exponent bits and only walks a block element by element when the
 * block holds a hit, so it costs about one read of the buffer. */
#ifndef MT_BASE_FINITE_H
#define MT_BASE_FINITE_H

#include <stddef.h>
#include <stdint.h>

#define MT_ALL_FINITE SIZE_MAX

/* Index of the first NaN or Inf in x[0..n), or MT_ALL_FINITE. */
size_t mt_first_nonfinite_f32(const float *x, size_t n);

/* "NaN", "+Inf" or "-Inf" for a non-finite value (else "finite"). */
const char *mt_nonfinite_name(float v);

/* Writes the coordinate of flat index i in a row-major tensor of shape
 * (ndim dims) as "[a, b, c]" into buf. */
void mt_index_to_str(char *buf, size_t cap, size_t i, int ndim, const int64_t *shape);

#endif
