/* Embedding lookup and its scatter-add backward on the CPU (see embedding.h).
 *
 * Forward copies rows: fixed row blocks over the backend's pool. Backward
 * must add the rows in index order (ids repeat): tasks own fixed column
 * blocks of the table and each walks all ids in order, so every element
 * is summed in exactly the sequential order, whatever the thread count. */
#include "kernels/embedding.h"

#include <string.h>

#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"

#define EMB_ROWS_CHUNK 16384 /* floats per forward task */
#define EMB_COLS 256         /* table columns per backward task */

typedef struct {
    float *out;
    const float *in;
    const int32_t *ids;
    int n, H, per;
} emb_job_t;

static void fwd_task(void *ctx, size_t t) {
    const emb_job_t *j = ctx;
    const int r0 = (int)t * j->per, r1 = r0 + j->per < j->n ? r0 + j->per : j->n;
    for (int i = r0; i < r1; i++)
        memcpy(j->out + (size_t)i * j->H, j->in + (size_t)j->ids[i] * j->H, (size_t)j->H * sizeof(float));
}

void kern_embedding_fwd_cpu(kern_stream_t *s, float *out, const float *table, const int32_t *ids,
                            int n, int H) {
    if (n <= 0 || H <= 0) return;
    const int per = H < EMB_ROWS_CHUNK ? EMB_ROWS_CHUNK / H : 1;
    emb_job_t j = {.out = out, .in = table, .ids = ids, .n = n, .H = H, .per = per};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)per), fwd_task, &j);
}

KERN_CPU_CLONES static void bwd_cols(float *dtable, const float *dout, const int32_t *ids, int n,
                                     int H, int c0, int c1) {
    for (int i = 0; i < n; i++) {
        float *dst = dtable + (size_t)ids[i] * H;
        const float *src = dout + (size_t)i * H;
        int c = c0;
        for (; c + KERN_VL <= c1; c += KERN_VL)
            kern_vf_store(dst + c, kern_vf_load(dst + c) + kern_vf_load(src + c));
        for (; c < c1; c++) dst[c] += src[c];
    }
}

static void bwd_task(void *ctx, size_t t) {
    const emb_job_t *j = ctx;
    const int c0 = (int)t * EMB_COLS, c1 = c0 + EMB_COLS < j->H ? c0 + EMB_COLS : j->H;
    bwd_cols(j->out, j->in, j->ids, j->n, j->H, c0, c1);
}

void kern_embedding_bwd_cpu(kern_stream_t *s, float *dtable, const float *dout,
                            const int32_t *ids, int n, int H) {
    if (n <= 0 || H <= 0) return;
    emb_job_t j = {.out = dtable, .in = dout, .ids = ids, .n = n, .H = H};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)H, EMB_COLS), bwd_task, &j);
}
