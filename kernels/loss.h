/* Causal-LM cross-entropy on already-shifted targets.
 *   logits (n, V), targets (n) with -100 = ignored.
 *   loss_rows[r] = logsumexp(logits[r]) - logits[r, t]   (0 for ignored rows)
 *   dlogits[r]   = grad_scale * (softmax(logits[r]) - onehot(t))  (0 rows for ignored)
 * A target outside [0, V) other than -100 (the data loader refuses those)
 * gives a NaN loss row and a zero gradient row, never an out-of-bounds read.
 * dlogits may alias logits (the logits are then consumed); pass NULL for a
 * forward-only call.  The engine sums loss_rows in a fixed order and divides
 * by the count of counted tokens (HF's mean); grad_scale carries 1/count and
 * the 1/micro-batches of gradient accumulation. */
#ifndef MT_KERNELS_LOSS_H
#define MT_KERNELS_LOSS_H

#include <stdint.h>

#define KERN_IGNORE_INDEX (-100)

typedef struct kern_stream kern_stream_t;

typedef void (*kern_xent_fn)(kern_stream_t *s, float *loss_rows, float *dlogits,
                             const float *logits, const int32_t *targets, int n, int V,
                             float grad_scale);
void kern_xent_cpu(kern_stream_t *s, float *loss_rows, float *dlogits, const float *logits,
                   const int32_t *targets, int n, int V, float grad_scale);
void kern_xent_cuda(kern_stream_t *s, float *loss_rows, float *dlogits, const float *logits,
                    const int32_t *targets, int n, int V, float grad_scale);

#endif
