/* Cross-entropy with ignored targets on the CPU (see loss.h).
 *
 * Per row: the max, e_j = exp(l_j - max) on vec.h's lanes (<= 1 ulp), their
 * sum in double (16 lane partials, fixed fold), lse = max + log(sum) in
 * double, loss = lse - l_t. The gradient reuses e_j:
 *   dlogits_j = grad_scale * (e_j * (1 / sum)),  minus grad_scale at t,
 * so each logit costs one exp, not one for the loss and another for the
 * gradient. When dlogits aliases logits, l_t is read before the row is
 * overwritten, and e_j is written over l_j only after l_j was read.
 * Rows are independent: fixed blocks of rows over the backend's pool. */
#include "kernels/loss.h"

#include <math.h>
#include <string.h>

#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"

#define XENT_CHUNK 32768 /* logits per task */

KERN_CPU_CLONES static void xent_rows(float *loss_rows, float *dlogits, const float *logits,
                                      const int32_t *targets, int r0, int r1, int V,
                                      float grad_scale) {
    for (int r = r0; r < r1; r++) {
        const float *lr = logits + (size_t)r * V;
        float *dr = dlogits ? dlogits + (size_t)r * V : NULL;
        const int32_t t = targets[r];
        if (t == KERN_IGNORE_INDEX) {
            loss_rows[r] = 0.0f;
            if (dr) memset(dr, 0, (size_t)V * sizeof *dr);
            continue;
        }
        if (t < 0 || t >= V) { /* as the CUDA twin: a NaN loss says so, nothing read out of bounds */
            loss_rows[r] = NAN;
            if (dr) memset(dr, 0, (size_t)V * sizeof *dr);
            continue;
        }
        const float target_logit = lr[t];
        kern_vf_t vmx = kern_vf_splat(-INFINITY);
        int j = 0;
        for (; j + KERN_VL <= V; j += KERN_VL) vmx = kern_vf_max(vmx, kern_vf_load(lr + j));
        float mx = kern_vf_hmax(vmx);
        for (; j < V; j++) mx = lr[j] > mx ? lr[j] : mx;
        const kern_vf_t vm = kern_vf_splat(mx);
        kern_vdacc_t acc = kern_vdacc_zero();
        for (j = 0; j < V; j += KERN_VL) {
            const size_t m = (size_t)(V - j) < KERN_VL ? (size_t)(V - j) : KERN_VL;
            /* padding lanes: exp(-inf) = 0 adds nothing */
            const kern_vf_t l = m == KERN_VL ? kern_vf_load(lr + j) : kern_vf_load_n(lr + j, m, -INFINITY);
            const kern_vf_t e = kern_vf_exp(l - vm);
            kern_vdacc_add(&acc, e);
            if (dr) {
                if (m == KERN_VL) kern_vf_store(dr + j, e);
                else kern_vf_store_n(dr + j, e, m);
            }
        }
        const double sum = kern_vdacc_hsum(acc);
        const double lse = mx + log(sum);
        loss_rows[r] = (float)(lse - target_logit);
        if (dr) {
            const kern_vf_t f = kern_vf_splat((float)(1.0 / sum)), gs = kern_vf_splat(grad_scale);
            j = 0;
            for (; j + KERN_VL <= V; j += KERN_VL) kern_vf_store(dr + j, gs * (kern_vf_load(dr + j) * f));
            for (; j < V; j++) dr[j] = grad_scale * (dr[j] * f[0]);
            dr[t] -= grad_scale;
        }
    }
}

typedef struct {
    float *loss_rows, *dlogits;
    const float *logits;
    const int32_t *targets;
    int n, V, per;
    float grad_scale;
} xent_job_t;

static void xent_task(void *ctx, size_t t) {
    const xent_job_t *j = ctx;
    const int r0 = (int)t * j->per, r1 = r0 + j->per < j->n ? r0 + j->per : j->n;
    xent_rows(j->loss_rows, j->dlogits, j->logits, j->targets, r0, r1, j->V, j->grad_scale);
}

void kern_xent_cpu(kern_stream_t *s, float *loss_rows, float *dlogits, const float *logits,
                   const int32_t *targets, int n, int V, float grad_scale) {
    if (n <= 0) return;
    const int per = V > 0 && V < XENT_CHUNK ? XENT_CHUNK / V : 1;
    xent_job_t j = {.loss_rows = loss_rows, .dlogits = dlogits, .logits = logits, .targets = targets,
                    .n = n, .V = V, .per = per, .grad_scale = grad_scale};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)per), xent_task, &j);
}
