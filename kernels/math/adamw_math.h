/* AdamW's per-element arithmetic (adamw.h semantics) in the exact op order
 * of the host kernel (kernels/host/adamw_host.h, torch's fp32 AdamW op by op):
 *   g   = g * grad_scale
 *   p   = p * decay                          decay = (float)(1 - lr*wd)
 *   m   = fma(w, g - m, m)                   torch lerp_, w = (float)(1-beta1)
 *         (fma(w - 1, g - m, g) when w >= 0.5, lerp's other branch)
 *   v   = v*beta2 + ((1-beta2)*g)*g          no fusion
 *   den = sqrt(v) / bc2_sqrt + eps
 *   p   = p + ((-step_size) * m) / den
 * with the bias corrections computed in double and rounded to float once.
 *
 * The CUDA kernel uses these functions in a file built with --fmad=false,
 * where sqrtf and '/' are IEEE round-to-nearest, so a device update is bit
 * for bit the host one: the optimizer's placement (host or device) changes
 * where, never what.  The host SIMD paths reproduce the same bits. */
#ifndef MT_KERNELS_MATH_ADAMW_MATH_H
#define MT_KERNELS_MATH_ADAMW_MATH_H

#include <math.h>

#include "kernels/adamw.h"
#include "base/hd.h"

typedef struct {
    float gscale;   /* grad_scale */
    float decay;    /* 1 - lr*wd */
    float lcoef;    /* lerp coefficient: w, or w - 1 on lerp's large-weight branch */
    int lbase_m;    /* lerp base: m (w < 0.5) or g */
    float beta2;
    float omb2;     /* 1 - beta2 */
    float bc2_sqrt; /* sqrt(1 - beta2^t) */
    float eps;
    float neg_step; /* -(lr / (1 - beta1^t)) */
} kern_adamw_coef_t;

/* Per-call constants (host side in practice; double math as Python does). */
MT_HD kern_adamw_coef_t kern_adamw_coef(const kern_adamw_params_t *hp) {
    kern_adamw_coef_t c;
    const double lr = hp->lr, b1 = hp->beta1, b2 = hp->beta2, t = (double)hp->step;
    c.gscale = hp->grad_scale;
    c.decay = (float)(1.0 - lr * (double)hp->weight_decay);
    const float w = (float)(1.0 - b1);
    c.lbase_m = fabsf(w) < 0.5f;
    c.lcoef = c.lbase_m ? w : w - 1.0f;
    c.beta2 = hp->beta2;
    c.omb2 = (float)(1.0 - b2);
    c.bc2_sqrt = (float)sqrt(1.0 - pow(b2, t));
    c.eps = hp->eps;
    c.neg_step = (float)(-(lr / (1.0 - pow(b1, t))));
    return c;
}

/* One element: updates *m and *v and returns the new p; g is the raw
 * gradient (before grad_scale). */
MT_HD float kern_adamw_elem(const kern_adamw_coef_t *c, float p, float *m, float *v, float g) {
    g = g * c->gscale;
    float pi = p * c->decay;
    float mi = *m;
    const float d = g - mi;
    mi = fmaf(c->lcoef, d, c->lbase_m ? mi : g);
    float vi = *v * c->beta2;
    const float gg = (c->omb2 * g) * g;
    vi = vi + gg;
    const float den = sqrtf(vi) / c->bc2_sqrt + c->eps;
    const float upd = (c->neg_step * mi) / den;
    pi = pi + upd;
    *m = mi;
    *v = vi;
    return pi;
}

#endif
