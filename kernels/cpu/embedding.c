/* Embedding lookup and its scatter-add backward on the CPU (see embedding.h). */
#include "kernels/embedding.h"

#include <string.h>

void kern_embedding_fwd_cpu(kern_stream_t *s, float *out, const float *table, const int32_t *ids,
                            int n, int H) {
    (void)s;
    for (int i = 0; i < n; i++)
        memcpy(out + (size_t)i * H, table + (size_t)ids[i] * H, (size_t)H * sizeof *out);
}

void kern_embedding_bwd_cpu(kern_stream_t *s, float *dtable, const float *dout,
                            const int32_t *ids, int n, int H) {
    (void)s;
    for (int i = 0; i < n; i++) {
        float *dst = dtable + (size_t)ids[i] * H;
        const float *src = dout + (size_t)i * H;
        for (int j = 0; j < H; j++) dst[j] += src[j];
    }
}
