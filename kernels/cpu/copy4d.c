/* Strided 4-D copy on the CPU (see kernels/copy4d.h): the outermost index
 * is split into fixed blocks over the backend's pool. */
#include "kernels/copy4d.h"

#include "kernels/cpu/par.h"

typedef struct {
    float *dst;
    const float *src;
    const kern_copy4d_t *c;
    int accumulate;
    int64_t per; /* outer rows per task */
} copy_job_t;

static void copy_task(void *ctx, size_t t) {
    const copy_job_t *J = ctx;
    const kern_copy4d_t *c = J->c;
    const int64_t i0 = (int64_t)t * J->per, i1 = i0 + J->per < c->d[0] ? i0 + J->per : c->d[0];
    for (int64_t i = i0; i < i1; i++)
        for (int64_t j = 0; j < c->d[1]; j++)
            for (int64_t k = 0; k < c->d[2]; k++) {
                const float *s = J->src + i * c->ss[0] + j * c->ss[1] + k * c->ss[2];
                float *d = J->dst + i * c->ds[0] + j * c->ds[1] + k * c->ds[2];
                if (J->accumulate)
                    for (int64_t l = 0; l < c->d[3]; l++) d[l * c->ds[3]] += s[l * c->ss[3]];
                else
                    for (int64_t l = 0; l < c->d[3]; l++) d[l * c->ds[3]] = s[l * c->ss[3]];
            }
}

void kern_copy4d_cpu(kern_stream_t *s, float *dst, const float *src, const kern_copy4d_t *c, int accumulate) {
    const int64_t inner = c->d[1] * c->d[2] * c->d[3];
    if (c->d[0] <= 0 || inner <= 0) return;
    int64_t per = 16384 / inner;
    if (per < 1) per = 1;
    copy_job_t J = {dst, src, c, accumulate, per};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)c->d[0], (size_t)per), copy_task, &J);
}
