/* Router and token-permutation primitives on the CPU (see moe_ops.h).
 *
 * - Every op here is independent per token row (or per permuted row), so
 *   rows are split into fixed blocks over the backend's pool; each row is
 *   computed by one task the same way whatever the split, so results do
 *   not depend on the number of threads. moe_plan stays sequential (a
 *   counting sort over n * k ints: cheap, and its order is the contract).
 * - Row loops run on vec.h's 16 lanes. Per-element arithmetic keeps the
 *   order of the formulas in moe_ops.h (unpermute_sum adds the k slots in
 *   slot order). Dot products (combine_bwd's dw, gate_scale_bwd) sum in
 *   double in 16 lane partials folded in a fixed tree.
 * - Router softmax: vec.h's exp (<= 1 ulp), the sum in expert order in
 *   fp32 as before; top-k by repeated selection (k is 1..8).
 * - Non-finite rows: the max ignores NaN (as CUDA's fmaxf), so a NaN or Inf
 *   logit gives NaN probabilities, and kern_router_before's total order
 *   (NaN lowest, ties by index) still picks k distinct experts; the plan
 *   refuses an expert index outside [0, E) rather than write through it. */
#include "kernels/moe_ops.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"
#include "kernels/elementwise.h"
#include "kernels/math/router_math.h"
#include "base/status.h"

#define MOE_CHUNK 16384 /* floats of a row block per task */

static int rows_per_task(int width) {
    const int r = MOE_CHUNK / (width > 0 ? width : 1);
    return r > 0 ? r : 1;
}

/* ---- router ---- */

typedef struct {
    float *weights, *probs, *dlogits;
    int32_t *idx;
    const float *logits, *dweights, *probs_in, *aux_dp, *tok_w;
    const int32_t *idx_in;
    int n, E, k, per;
    kern_router_mode_t mode;
} router_job_t;

KERN_CPU_CLONES static void router_fwd_rows(const router_job_t *J, int r0, int r1) {
    const int E = J->E, k = J->k;
    for (int r = r0; r < r1; r++) {
        const float *lr = J->logits + (size_t)r * E;
        float *pr = J->probs + (size_t)r * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = lr[e] > mx ? lr[e] : mx;
        const kern_vf_t vm = kern_vf_splat(mx);
        for (int e = 0; e < E; e += KERN_VL) {
            const size_t m = (size_t)(E - e) < KERN_VL ? (size_t)(E - e) : KERN_VL;
            const kern_vf_t l = m == KERN_VL ? kern_vf_load(lr + e) : kern_vf_load_n(lr + e, m, -INFINITY);
            const kern_vf_t p = kern_vf_exp(l - vm);
            if (m == KERN_VL) kern_vf_store(pr + e, p);
            else kern_vf_store_n(pr + e, p, m);
        }
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += pr[e];
        for (int e = 0; e < E; e++) pr[e] /= sum;
        int32_t *ir = J->idx + (size_t)r * k;
        float *wr = J->weights + (size_t)r * k;
        for (int j = 0; j < k; j++) { /* j-th largest: after slot j-1's, before all others */
            int best = -1;
            for (int e = 0; e < E; e++) {
                if (j > 0 && !kern_router_before(pr[ir[j - 1]], ir[j - 1], pr[e], e)) continue;
                if (best < 0 || kern_router_before(pr[e], e, pr[best], best)) best = e;
            }
            ir[j] = best;
            wr[j] = pr[best];
        }
        if (J->mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM) kern_router_renorm(wr, k);
    }
}

static void router_fwd_task(void *ctx, size_t t) {
    const router_job_t *J = ctx;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    router_fwd_rows(J, r0, r1);
}

void kern_router_fwd_cpu(kern_stream_t *s, float *weights, int32_t *idx, float *probs,
                         const float *logits, int n, int E, int k, kern_router_mode_t mode) {
    if (n <= 0) return;
    router_job_t J = {.weights = weights, .idx = idx, .probs = probs, .logits = logits, .n = n,
                      .E = E, .k = k, .per = rows_per_task(E * 4), .mode = mode};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), router_fwd_task, &J);
}

static void router_bwd_task(void *ctx, size_t t) {
    const router_job_t *J = ctx;
    const int E = J->E, k = J->k;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    float *dp = malloc((size_t)E * sizeof *dp);
    MT_CHECK_ALLOC(dp, "router backward scratch");
    for (int r = r0; r < r1; r++) {
        const float *pr = J->probs_in + (size_t)r * E;
        const int32_t *ir = J->idx_in + (size_t)r * k;
        const float *dwr = J->dweights + (size_t)r * k;
        float *dl = J->dlogits + (size_t)r * E;
        memset(dp, 0, (size_t)E * sizeof *dp);
        if (J->mode == KERN_ROUTER_SOFTMAX_TOPK_RENORM) {
            /* w_j = p_j / S:  dL/dp_j = (dw_j - sum_i dw_i w_i) / S */
            float S = 0.0f;
            for (int j = 0; j < k; j++) S += pr[ir[j]];
            float dot = 0.0f;
            for (int j = 0; j < k; j++) dot += dwr[j] * (pr[ir[j]] / S);
            for (int j = 0; j < k; j++) dp[ir[j]] += (dwr[j] - dot) / S;
        } else {
            for (int j = 0; j < k; j++) dp[ir[j]] += dwr[j];
        }
        if (J->aux_dp) {
            const float tw = J->tok_w ? J->tok_w[r] : 1.0f;
            for (int e = 0; e < E; e++) dp[e] += J->aux_dp[e] * tw;
        }
        double pdp = 0.0;
        for (int e = 0; e < E; e++) pdp += (double)pr[e] * dp[e];
        for (int e = 0; e < E; e++) dl[e] = pr[e] * (dp[e] - (float)pdp);
    }
    free(dp);
}

void kern_router_bwd_cpu(kern_stream_t *s, float *dlogits, const float *dweights,
                         const float *probs, const int32_t *idx, const float *aux_dp,
                         const float *tok_w, int n, int E, int k, kern_router_mode_t mode) {
    if (n <= 0) return;
    router_job_t J = {.dlogits = dlogits, .dweights = dweights, .probs_in = probs, .idx_in = idx,
                      .aux_dp = aux_dp, .tok_w = tok_w, .n = n, .E = E, .k = k,
                      .per = rows_per_task(E * 4), .mode = mode};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), router_bwd_task, &J);
}

/* ---- permutation ---- */

void kern_moe_plan_cpu(kern_stream_t *s, int32_t *counts, int32_t *offsets, int32_t *perm_tok,
                       int32_t *inv, const int32_t *idx, int n, int k, int E) {
    (void)s;
    memset(counts, 0, (size_t)E * sizeof *counts);
    for (size_t i = 0; i < (size_t)n * (size_t)k; i++) {
        /* The router never yields such an index (see router_math.h); one
         * here is a caller's bug, and counting it would write out of bounds. */
        MT_CHECK(idx[i] >= 0 && idx[i] < E, "moe_plan: slot %zu routes to expert %d, outside [0, %d)",
                 i, (int)idx[i], E);
        counts[idx[i]]++;
    }
    offsets[0] = 0;
    for (int e = 0; e < E; e++) offsets[e + 1] = offsets[e] + counts[e];
    int32_t *cursor = malloc((size_t)E * sizeof *cursor);
    MT_CHECK_ALLOC(cursor, "moe plan cursor");
    memcpy(cursor, offsets, (size_t)E * sizeof *cursor);
    for (int r = 0; r < n; r++)
        for (int j = 0; j < k; j++) {
            const int e = idx[(size_t)r * k + j];
            const int pos = cursor[e]++;
            perm_tok[pos] = r;
            inv[(size_t)r * k + j] = pos;
        }
    free(cursor);
}

typedef struct {
    float *y, *dsrc, *dw, *dx, *dglogit;
    const float *src, *w, *dy, *x, *glogit;
    const uint16_t *src16; /* non-NULL: src is bf16 (widened a row at a time) */
    uint16_t *dsrc16;      /* non-NULL: dsrc is bf16 (each row formed in fp32, then rounded) */
    const int32_t *perm_tok, *inv;
    int n, k, H, per, accumulate;
} perm_job_t;

/* src's row `row`: itself, or widened from bf16 into buf (H floats, exact) */
static const float *src_row(const perm_job_t *J, size_t row, float *buf) {
    if (!J->src16) return J->src + row * J->H;
    const uint16_t *h = J->src16 + row * J->H;
    for (int c = 0; c < J->H; c++) buf[c] = mt_bf16_to_f32(h[c]);
    return buf;
}

static float *row_buf(const perm_job_t *J) {
    if (!J->src16) return NULL;
    float *b = malloc((size_t)J->H * sizeof *b);
    MT_CHECK_ALLOC(b, "moe combine row (bf16 widened)");
    return b;
}

static void gather_task(void *ctx, size_t t) {
    const perm_job_t *J = ctx;
    const int j0 = (int)t * J->per, j1 = j0 + J->per < J->n ? j0 + J->per : J->n;
    for (int j = j0; j < j1; j++)
        memcpy(J->y + (size_t)j * J->H, J->src + (size_t)J->perm_tok[j] * J->H, (size_t)J->H * sizeof(float));
}

void kern_moe_gather_cpu(kern_stream_t *s, float *dst, const float *src, const int32_t *perm_tok,
                         int m, int H) {
    if (m <= 0) return;
    perm_job_t J = {.y = dst, .src = src, .perm_tok = perm_tok, .n = m, .H = H, .per = rows_per_task(H)};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)m, (size_t)J.per), gather_task, &J);
}

KERN_CPU_CLONES static void unpermute_rows(const perm_job_t *J, int r0, int r1, float *buf) {
    const int H = J->H, k = J->k;
    for (int r = r0; r < r1; r++) {
        float *yr = J->y + (size_t)r * H;
        if (!J->accumulate) memset(yr, 0, (size_t)H * sizeof *yr);
        for (int j = 0; j < k; j++) {
            const float *sr = src_row(J, (size_t)J->inv[(size_t)r * k + j], buf);
            const float wj = J->w ? J->w[(size_t)r * k + j] : 1.0f;
            const kern_vf_t vw = kern_vf_splat(wj);
            int c = 0;
            for (; c + KERN_VL <= H; c += KERN_VL)
                kern_vf_store(yr + c, kern_vf_load(yr + c) + vw * kern_vf_load(sr + c));
            for (; c < H; c++) yr[c] += wj * sr[c];
        }
    }
}

static void unpermute_task(void *ctx, size_t t) {
    const perm_job_t *J = ctx;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    float *buf = row_buf(J);
    unpermute_rows(J, r0, r1, buf);
    free(buf);
}

void kern_moe_unpermute_sum_cpu(kern_stream_t *s, float *y, const float *src, const float *w,
                                const int32_t *inv, int n, int k, int H, int accumulate) {
    if (n <= 0) return;
    perm_job_t J = {.y = y, .src = src, .w = w, .inv = inv, .n = n, .k = k, .H = H,
                    .per = rows_per_task(H * k), .accumulate = accumulate};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), unpermute_task, &J);
}

/* Sum a[c] * b[c] in double, 16 lane partials, fixed fold; also out[c] = s * b[c]. */
KERN_VINLINE double dot_and_scale(float *out, float s, const float *a, const float *b, int H) {
    kern_vdacc_t acc = kern_vdacc_zero();
    const kern_vf_t vs = kern_vf_splat(s);
    int c = 0;
    for (; c + KERN_VL <= H; c += KERN_VL) {
        const kern_vf_t vb = kern_vf_load(b + c);
        kern_vdacc_add_prod(&acc, kern_vf_load(a + c), vb);
        kern_vf_store(out + c, vs * vb);
    }
    if (c < H) {
        const size_t m = (size_t)(H - c);
        const kern_vf_t vb = kern_vf_load_n(b + c, m, 0.0f);
        kern_vdacc_add_prod(&acc, kern_vf_load_n(a + c, m, 0.0f), vb);
        kern_vf_store_n(out + c, vs * vb, m);
    }
    return kern_vdacc_hsum(acc);
}

/* out: the fp32 row scratch (H floats) when dsrc is bf16, rounded from it
 * per element as the CUDA twin stores (the w * dy products are the same
 * fp32 multiplies on both) */
KERN_CPU_CLONES static void combine_bwd_rows(const perm_job_t *J, int r0, int r1, float *buf, float *out) {
    const int H = J->H, k = J->k;
    for (int r = r0; r < r1; r++) {
        const float *dyr = J->dy + (size_t)r * H;
        for (int j = 0; j < k; j++) {
            const size_t row = (size_t)J->inv[(size_t)r * k + j];
            const float wj = J->w[(size_t)r * k + j];
            float *dst = out ? out : J->dsrc + row * H;
            J->dw[(size_t)r * k + j] = (float)dot_and_scale(dst, wj, src_row(J, row, buf), dyr, H);
            if (out) mt_convert_from_f32(J->dsrc16 + row * H, MT_BF16, out, (size_t)H);
        }
    }
}

static void combine_bwd_task(void *ctx, size_t t) {
    const perm_job_t *J = ctx;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    float *buf = row_buf(J), *out = NULL;
    if (J->dsrc16) {
        out = malloc((size_t)J->H * sizeof *out);
        MT_CHECK_ALLOC(out, "moe combine backward row (before bf16 rounding)");
    }
    combine_bwd_rows(J, r0, r1, buf, out);
    free(buf);
    free(out);
}

void kern_moe_combine_bwd_cpu(kern_stream_t *s, float *dsrc, float *dw, const float *dy,
                              const float *src, const float *w, const int32_t *inv, int n, int k,
                              int H) {
    if (n <= 0) return;
    perm_job_t J = {.dsrc = dsrc, .dw = dw, .dy = dy, .src = src, .w = w, .inv = inv, .n = n,
                    .k = k, .H = H, .per = rows_per_task(H * k)};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), combine_bwd_task, &J);
}

void kern_moe_unpermute_sum_bf16_cpu(kern_stream_t *s, float *y, const uint16_t *src, const float *w,
                                     const int32_t *inv, int n, int k, int H, int accumulate) {
    if (n <= 0) return;
    perm_job_t J = {.y = y, .src16 = src, .w = w, .inv = inv, .n = n, .k = k, .H = H,
                    .per = rows_per_task(H * k), .accumulate = accumulate};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), unpermute_task, &J);
}

void kern_moe_combine_bwd_bf16_cpu(kern_stream_t *s, uint16_t *dsrc, float *dw, const float *dy, const uint16_t *src,
                                   const float *w, const int32_t *inv, int n, int k, int H) {
    if (n <= 0) return;
    perm_job_t J = {.dsrc16 = dsrc, .dw = dw, .dy = dy, .src16 = src, .w = w, .inv = inv, .n = n,
                    .k = k, .H = H, .per = rows_per_task(H * k)};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), combine_bwd_task, &J);
}

/* ---- Qwen2-MoE shared-expert gate ---- */

KERN_CPU_CLONES static void gate_fwd_rows(const perm_job_t *J, int r0, int r1) {
    const int H = J->H;
    for (int r = r0; r < r1; r++) {
        const float g = kern_sigmoid(J->glogit[r]);
        const kern_vf_t vg = kern_vf_splat(g);
        float *yr = J->y + (size_t)r * H;
        const float *xr = J->x + (size_t)r * H;
        int c = 0;
        for (; c + KERN_VL <= H; c += KERN_VL)
            kern_vf_store(yr + c, kern_vf_load(yr + c) + vg * kern_vf_load(xr + c));
        for (; c < H; c++) yr[c] += g * xr[c];
    }
}

static void gate_fwd_task(void *ctx, size_t t) {
    const perm_job_t *J = ctx;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    gate_fwd_rows(J, r0, r1);
}

void kern_gate_scale_fwd_cpu(kern_stream_t *s, float *y, const float *x, const float *glogit,
                             int n, int H) {
    if (n <= 0) return;
    perm_job_t J = {.y = y, .x = x, .glogit = glogit, .n = n, .H = H, .per = rows_per_task(H)};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), gate_fwd_task, &J);
}

KERN_CPU_CLONES static void gate_bwd_rows(const perm_job_t *J, int r0, int r1) {
    const int H = J->H;
    for (int r = r0; r < r1; r++) {
        const float g = kern_sigmoid(J->glogit[r]);
        const double dot = dot_and_scale(J->dx + (size_t)r * H, g, J->x + (size_t)r * H,
                                         J->dy + (size_t)r * H, H);
        J->dglogit[r] = (float)dot * g * (1.0f - g);
    }
}

static void gate_bwd_task(void *ctx, size_t t) {
    const perm_job_t *J = ctx;
    const int r0 = (int)t * J->per, r1 = r0 + J->per < J->n ? r0 + J->per : J->n;
    gate_bwd_rows(J, r0, r1);
}

void kern_gate_scale_bwd_cpu(kern_stream_t *s, float *dx, float *dglogit, const float *dy,
                             const float *x, const float *glogit, int n, int H) {
    if (n <= 0) return;
    perm_job_t J = {.dx = dx, .dglogit = dglogit, .dy = dy, .x = x, .glogit = glogit, .n = n,
                    .H = H, .per = rows_per_task(H)};
    kern_cpu_parallel_for(s, kern_cpu_tasks((size_t)n, (size_t)J.per), gate_bwd_task, &J);
}
