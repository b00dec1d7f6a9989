/* The grouped sigmoid router on the CPU (see kernels/router_group.h).
 * Rows are independent: split into fixed blocks over the backend's pool,
 * each row computed by router_group_math.h exactly as the CUDA kernel
 * computes it, so results do not depend on the thread count. */
#include <math.h>

#include "base/status.h"
#include "kernels/cpu/par.h"
#include "kernels/router_group.h"
#include "kernels/math/router_group_math.h"

typedef struct {
    float *weights, *scores, *dlogits;
    int32_t *idx;
    const float *logits, *bias, *dweights, *scores_in;
    const int32_t *idx_in;
    int n, E, k, per;
    const kern_router_group_t *g;
} group_job_t;

static int rows_per_task(int E) {
    const int r = 4096 / (E > 0 ? E : 1);
    return r > 0 ? r : 1;
}

static void fwd_task(void *ctx, size_t t) {
    const group_job_t *J = ctx;
    const int E = J->E, k = J->k;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    for (int r = r0; r < r1; r++) {
        const float *lr = J->logits + (size_t)r * E;
        float *sr = J->scores + (size_t)r * E;
        kern_router_group_scores(sr, lr, E, J->g);
        kern_router_group_row(J->weights + (size_t)r * k, J->idx + (size_t)r * k, sr, J->bias, E, k, J->g);
    }
}

static void bwd_task(void *ctx, size_t t) {
    const group_job_t *J = ctx;
    const int E = J->E, k = J->k;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    for (int r = r0; r < r1; r++)
        kern_router_group_row_bwd(J->dlogits + (size_t)r * E, J->dweights + (size_t)r * k,
                                  J->scores_in + (size_t)r * E, J->idx_in + (size_t)r * k, E, k, J->g);
}

void kern_router_group_fwd_cpu(kern_stream_t *s, float *weights, int32_t *idx, float *scores, const float *logits,
                               const float *bias, int n, int E, int k, const kern_router_group_t *g) {
    MT_CHECK(kern_router_group_valid(E, k, g),
             "router_group_fwd: top-%d of %d experts in %d groups (keep %d) is outside the router's limits", k, E,
             g->n_group, g->topk_group);
    if (n <= 0) return;
    group_job_t J = {.weights = weights, .idx = idx, .scores = scores, .logits = logits, .bias = bias,
                     .n = n, .E = E, .k = k, .per = rows_per_task(E), .g = g};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), fwd_task, &J);
}

void kern_router_group_bwd_cpu(kern_stream_t *s, float *dlogits, const float *dweights, const float *scores,
                               const int32_t *idx, int n, int E, int k, const kern_router_group_t *g) {
    MT_CHECK(kern_router_group_valid(E, k, g),
             "router_group_bwd: top-%d of %d experts in %d groups (keep %d) is outside the router's limits", k, E,
             g->n_group, g->topk_group);
    if (n <= 0) return;
    group_job_t J = {.dlogits = dlogits, .dweights = dweights, .scores_in = scores, .idx_in = idx,
                     .n = n, .E = E, .k = k, .per = rows_per_task(E), .g = g};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), bwd_task, &J);
}
