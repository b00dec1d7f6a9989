/* Cross-entropy with ignored targets on the CPU (see loss.h). */
#include "kernels/loss.h"

#include <math.h>
#include <string.h>

void kern_xent_cpu(kern_stream_t *s, float *loss_rows, float *dlogits, const float *logits,
                   const int32_t *targets, int n, int V, float grad_scale) {
    (void)s;
    for (int r = 0; r < n; r++) {
        const float *lr = logits + (size_t)r * V;
        float *dr = dlogits ? dlogits + (size_t)r * V : NULL;
        const int32_t t = targets[r];
        if (t == KERN_IGNORE_INDEX) {
            loss_rows[r] = 0.0f;
            if (dr) memset(dr, 0, (size_t)V * sizeof *dr);
            continue;
        }
        float mx = -INFINITY;
        for (int j = 0; j < V; j++) mx = lr[j] > mx ? lr[j] : mx;
        double sum = 0.0;
        for (int j = 0; j < V; j++) sum += exp((double)lr[j] - mx);
        const double lse = mx + log(sum);
        const float target_logit = lr[t];
        loss_rows[r] = (float)(lse - target_logit);
        if (dr) { /* may alias lr: read each logit before writing it */
            for (int j = 0; j < V; j++) dr[j] = grad_scale * (float)exp((double)lr[j] - lse);
            dr[t] -= grad_scale;
        }
    }
}
