/* Token embedding lookup.  table (V, H), ids (n), out (n, H).
 * Backward: dtable[ids[i]] += dout[i] (accumulate), applied in index order
 * so the result is deterministic. Ids are validated by the data loader. */
#ifndef MT_KERNELS_EMBEDDING_H
#define MT_KERNELS_EMBEDDING_H

#include <stdint.h>

typedef struct kern_stream kern_stream_t;

typedef void (*kern_embedding_fwd_fn)(kern_stream_t *s, float *out, const float *table,
                                      const int32_t *ids, int n, int H);
void kern_embedding_fwd_cpu(kern_stream_t *s, float *out, const float *table, const int32_t *ids,
                            int n, int H);
void kern_embedding_fwd_cuda(kern_stream_t *s, float *out, const float *table,
                             const int32_t *ids, int n, int H);

typedef void (*kern_embedding_bwd_fn)(kern_stream_t *s, float *dtable, const float *dout,
                                      const int32_t *ids, int n, int H);
void kern_embedding_bwd_cpu(kern_stream_t *s, float *dtable, const float *dout,
                            const int32_t *ids, int n, int H);
void kern_embedding_bwd_cuda(kern_stream_t *s, float *dtable, const float *dout,
                             const int32_t *ids, int n, int H);

#endif
