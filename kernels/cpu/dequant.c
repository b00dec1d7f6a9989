/* CPU twin of kern_dequant (kernels/dequant.h): rows split into tasks of a
 * fixed size (par.h), each running base/quant.h's row loop, which computes
 * every element with the format's function of base/quant_elem.h. */
#include "base/quant.h"
#include "kernels/cpu/par.h"
#include "kernels/dequant.h"

typedef struct {
    void *dst;
    mt_dtype_t dt;
    const mt_quant_view_t *q;
    int64_t rows_per_task;
} dequant_task_t;

static void dequant_rows(void *ctx, size_t t) {
    const dequant_task_t *k = ctx;
    const int64_t r0 = (int64_t)t * k->rows_per_task;
    const int64_t r1 = r0 + k->rows_per_task < k->q->rows ? r0 + k->rows_per_task : k->q->rows;
    mt_dequant_rows(k->q, r0, r1, k->dst, k->dt);
}

void kern_dequant_cpu(kern_stream_t *s, void *dst, mt_dtype_t dt, const mt_quant_view_t *q) {
    if (q->rows <= 0 || q->cols <= 0) return;
    /* about 64K elements a task: the task count depends on the shape only */
    int64_t per = (int64_t)65536 / q->cols;
    if (per < 1) per = 1;
    dequant_task_t k = {.dst = dst, .dt = dt, .q = q, .rows_per_task = per};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)q->rows, (size_t)per), dequant_rows, &k);
}
