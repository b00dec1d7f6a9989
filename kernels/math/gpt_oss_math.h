/* Per-element math of gpt_oss.h's ops, shared by the CPU twin and the CUDA
 * kernels so both round alike. */
#ifndef MT_KERNELS_MATH_GPT_OSS_MATH_H
#define MT_KERNELS_MATH_GPT_OSS_MATH_H

#include <math.h>

#include "base/hd.h"
#include "kernels/elementwise.h"

/* h = (clamp(up, ±limit) + 1) * g * sigmoid(alpha g), g = min(gate, limit). */
MT_HD float kern_swiglu_clamped_elem(float gate, float up, float alpha, float limit) {
    const float g = gate > limit ? limit : gate;
    const float u = kern_clamp_elem(up, limit);
    return (u + 1.0f) * (g * kern_sigmoid(g * alpha));
}

/* Its gradients: d(gate) and d(up) from dh. */
MT_HD void kern_swiglu_clamped_bwd_elem(float dh, float gate, float up, float alpha, float limit, float *dgate,
                                        float *dup) {
    const float g = gate > limit ? limit : gate;
    const float u = kern_clamp_elem(up, limit);
    const float sig = kern_sigmoid(g * alpha);
    const float glu = g * sig;
    *dup = up >= -limit && up <= limit ? dh * glu : 0.0f;
    /* d(g sig(alpha g))/dg = sig + alpha g sig (1 - sig) */
    *dgate = gate <= limit ? dh * (u + 1.0f) * (sig + alpha * g * sig * (1.0f - sig)) : 0.0f;
}

/* A row's logsumexp with the sink joined: logaddexp(lse, s); lse = -inf
 * (no visible key) gives s. */
MT_HD float kern_sink_lse(float lse, float s) {
    if (lse == -INFINITY) return s;
    const float hi = lse > s ? lse : s, lo = lse > s ? s : lse;
    return hi + log1pf(expf(lo - hi));
}

#endif
