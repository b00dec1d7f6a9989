/* The routed experts' forward and backward in a bf16 run (moe_experts.c),
 * on a CPU device whose grouped-product entry is watched:
 *   - every forward product (gate, up, down) is of the kind cuBLAS's grouped
 *     GEMM takes: A and B stored bf16 (the compute dtype), C written bf16
 *     with beta 0 (kernels/cuda/gemm_mm_cuda.c's rule, alignment aside),
 *     one per expert that has rows, zero-row experts skipped;
 *   - with LoRA on an expert module its products write fp32 instead (the
 *     adapter's term is added before the one rounding);
 *   - g, u and ep agree with a double-precision reference on the same bf16
 *     operands to bf16's rounding: g, u within 2^-8 |g| (half a bf16 ulp
 *     is at most 2^-8 of the value: 8 significant bits) plus 2^-20 sum
 *     |x w| (16 times the fp32 accumulator's rounding, summing 24 terms);
 *     ep, from the kernel's bf16 g and u, within 2^-8 |ep| (its rounding)
 *     plus 2^-8 sum |h d| (h rounded to bf16 before the down product);
 *   - the LoRA run's g differs from the plain run's where the adapter is
 *     non-zero (the adapter is applied);
 *   - backward (check_backward): the data-gradient products (dh, and xp's
 *     gradient as its gate and up parts, together in one call) are of the
 *     grouped kind too, and so are the weight gradients' (written bf16 as
 *     autocast's, then added into the fp32 accumulators: gate's and up's
 *     in one call); dg, the parts and the weight gradients agree with
 *     double to bf16's rounding, a weight gradient added to zero is a bf16
 *     value and an expert without rows keeps its zeros; with LoRA on gate
 *     its input-gradient products go through fp32 and move only the
 *     adapted expert's rows. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "moe/moe_experts.h"

static int failures;
#define EXPECT(c, ...)                                           \
    do {                                                         \
        if (!(c)) {                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            failures++;                                          \
        }                                                        \
    } while (0)

enum { H = 24, I = 16, E = 4, K = 2, ROWS = 9, R = 4 };
static const int32_t k_counts[E] = {3, 0, 5, 1}, k_offsets[E] = {0, 3, 3, 8};

/* what the grouped entry was asked: per call, products and whether all
 * were bf16 x bf16 -> bf16 with beta 0 */
static int calls, products, bf16_out_beta0, f32_out;
static const kern_ops_t *real_ops;

static void watch_grouped(kern_stream_t *s, const kern_mm_t *p, int count) {
    calls++;
    for (int i = 0; i < count; i++) {
        products++;
        if (p[i].A.dtype == MT_BF16 && p[i].B.dtype == MT_BF16 && p[i].C.dtype == MT_BF16 && p[i].beta == 0.0f &&
            p[i].compute == MT_BF16)
            bf16_out_beta0++;
        if (p[i].C.dtype == MT_F32) f32_out++;
    }
    real_ops->mm_grouped(s, p, count);
}

static unsigned long rng = 99;
static float rnd(void) {
    rng = rng * 6364136223846793005ul + 1442695040888963407ul;
    return (float)((rng >> 33) % 2000001) / 1000000.0f - 1.0f;
}

/* n random bf16 values, on the host (h) and the device (returned) */
static void *upload_bf16(kern_device_t *dev, uint16_t *h, size_t n) {
    mt_error_t err = {0};
    for (size_t i = 0; i < n; i++) h[i] = mt_f32_to_bf16(rnd());
    void *p = kern_alloc(dev, n * 2, "test bf16", &err);
    MT_CHECK(p, "%s", err.msg);
    kern_memcpy_h2d(dev, kern_stream(dev, KERN_STREAM_COMPUTE), p, h, n * 2);
    kern_device_sync(dev);
    return p;
}

static float bf(uint16_t v) { return mt_bf16_to_f32(v); }

/* sum x w in double, and sum |x w| into *mag */
static double dot_bf16(const uint16_t *x, const uint16_t *w, int n, double *mag) {
    double s = 0;
    *mag = 0;
    for (int i = 0; i < n; i++) {
        const double t = (double)bf(x[i]) * bf(w[i]);
        s += t;
        *mag += fabs(t);
    }
    return s;
}

typedef struct {
    uint16_t g[ROWS * I], u[ROWS * I], ep[ROWS * H];
} outs_t;

/* the inputs and weights, as uploaded */
static uint16_t hx[ROWS * H], hg[E][I * H], hu[E][I * H], hd[E][H * I], la[R * H], lb[I * R];

/* What the backward returned: dg, du (over g, u), and xp's gradient in
 * its two bf16 parts. */
typedef struct {
    uint16_t dg[ROWS * I], du[ROWS * I], dxg[ROWS * H], dxu[ROWS * H];
    float wg[3 * E * I * H]; /* d(gate), d(up), d(down) per expert, accumulated onto zeros */
} grads_t;

static uint16_t hdep[ROWS * H];

static void run_backward(kern_device_t *dev, const moe_layer_dims_t *d, moe_layer_params_t *p, const void *xp,
                         grads_t *o) {
    mt_error_t err = {0};
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    void *g = kern_alloc(dev, ROWS * I * 2, "g", &err), *u = kern_alloc(dev, ROWS * I * 2, "u", &err);
    void *ep = kern_alloc(dev, ROWS * H * 2, "ep", &err), *dep = kern_alloc(dev, ROWS * H * 2, "dep", &err);
    void *dxu = kern_alloc(dev, ROWS * H * 2, "dxu", &err);
    float *wg = kern_alloc(dev, 3 * (size_t)E * I * H * 4, "weight gradients", &err);
    MT_CHECK(g && u && ep && dep && dxu && wg, "%s", err.msg);
    kern_memset(dev, s, wg, 0, 3 * (size_t)E * I * H * 4);
    void *gg[E], *gu[E], *gd[E];
    for (int e = 0; e < E; e++)
        gg[e] = wg + (size_t)e * I * H, gu[e] = wg + (size_t)(E + e) * I * H, gd[e] = wg + (size_t)(2 * E + e) * I * H;
    moe_layer_params_t gp = {.gate = gg, .up = gu, .down = gd, .dtype = MT_F32};
    EXPECT(moe_experts_forward(dev, d, p, k_counts, k_offsets, ROWS, xp, g, u, ep, &err) == MT_OK, "%s", err.msg);
    kern_memcpy_h2d(dev, s, dep, hdep, sizeof hdep);
    calls = products = bf16_out_beta0 = f32_out = 0;
    EXPECT(moe_experts_backward(dev, d, p, &gp, k_counts, k_offsets, ROWS, xp, g, u, dep, dxu, &err) == MT_OK, "%s",
           err.msg);
    kern_memcpy_d2h(dev, s, o->dg, g, sizeof o->dg);
    kern_memcpy_d2h(dev, s, o->du, u, sizeof o->du);
    kern_memcpy_d2h(dev, s, o->dxg, dep, sizeof o->dxg);
    kern_memcpy_d2h(dev, s, o->dxu, dxu, sizeof o->dxu);
    kern_memcpy_d2h(dev, s, o->wg, wg, sizeof o->wg);
    kern_device_sync(dev);
    void *bufs[] = {g, u, ep, dep, dxu, wg};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) kern_free(dev, bufs[i]);
}

static void run(kern_device_t *dev, const moe_layer_dims_t *d, moe_layer_params_t *p, const void *xp, outs_t *o) {
    mt_error_t err = {0};
    void *g = kern_alloc(dev, ROWS * I * 2, "g", &err), *u = kern_alloc(dev, ROWS * I * 2, "u", &err);
    void *ep = kern_alloc(dev, ROWS * H * 2, "ep", &err);
    MT_CHECK(g && u && ep, "%s", err.msg);
    calls = products = bf16_out_beta0 = f32_out = 0;
    EXPECT(moe_experts_forward(dev, d, p, k_counts, k_offsets, ROWS, xp, g, u, ep, &err) == MT_OK, "%s", err.msg);
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    kern_memcpy_d2h(dev, s, o->g, g, sizeof o->g);
    kern_memcpy_d2h(dev, s, o->u, u, sizeof o->u);
    kern_memcpy_d2h(dev, s, o->ep, ep, sizeof o->ep);
    kern_device_sync(dev);
    kern_free(dev, g);
    kern_free(dev, u);
    kern_free(dev, ep);
}

/* The weight gradients of run_backward against double: d(gate) = dg^T x
 * and d(up) = du^T x from the kernel's own dg, du (one rounding, to bf16,
 * plus the fp32 accumulator's), d(down) = dep^T h with h = silu(g) u
 * rounded to bf16 (a relative 2^-8 per term more).  Added onto zeros, each
 * is exactly a bf16 value; expert 1 has no rows and keeps its zeros.
 * Returns the worst error as a fraction of its bound. */
static double check_weight_grads(const outs_t *fwd, const grads_t *o) {
    double worst = 0;
    int not_bf16 = 0, touched_idle = 0;
    for (int e = 0; e < E; e++) {
        const float *wgate = o->wg + (size_t)e * I * H, *wup = o->wg + (size_t)(E + e) * I * H;
        const float *wdown = o->wg + (size_t)(2 * E + e) * I * H;
        for (int j = 0; j < I * H; j++) {
            const float got[3] = {wgate[j], wup[j], wdown[j]};
            for (int m = 0; m < 3; m++) {
                not_bf16 += bf(mt_f32_to_bf16(got[m])) != got[m];
                touched_idle += k_counts[e] == 0 && got[m] != 0.0f;
            }
        }
        for (int i = 0; i < I; i++)
            for (int c = 0; c < H; c++) {
                double sg = 0, su = 0, sd = 0, mg = 0, mu = 0, md = 0;
                for (int r = k_offsets[e]; r < k_offsets[e] + k_counts[e]; r++) {
                    const double x = bf(hx[r * H + c]);
                    const double tg = bf(o->dg[r * I + i]) * x, tu = bf(o->du[r * I + i]) * x;
                    const double g = bf(fwd->g[r * I + i]), u = bf(fwd->u[r * I + i]);
                    const double td = bf(hdep[r * H + c]) * (g / (1.0 + exp(-g)) * u);
                    sg += tg, su += tu, sd += td, mg += fabs(tg), mu += fabs(tu), md += fabs(td);
                }
                worst = fmax(worst, fabs(wgate[i * H + c] - sg) / (0x1p-8 * fabs(sg) + 0x1p-20 * mg + 1e-30));
                worst = fmax(worst, fabs(wup[i * H + c] - su) / (0x1p-8 * fabs(su) + 0x1p-20 * mu + 1e-30));
                worst = fmax(worst, fabs(wdown[c * I + i] - sd) / (0x1p-8 * fabs(sd) + 0x1p-8 * md + 1e-30));
            }
    }
    EXPECT(not_bf16 == 0, "%d weight-gradient values added onto zeros are not bf16 values", not_bf16);
    EXPECT(touched_idle == 0, "%d weight-gradient values of the expert without rows moved", touched_idle);
    return worst;
}

/* The backward in a bf16 run: its data-gradient products (dh, and xp's
 * two parts) bf16 x bf16 -> bf16 with beta 0, and the weight gradients';
 * dg against double on the bf16 dep and weights (the rounding of dh and
 * then of dg: 2^-8 each, relative, plus dh's fp32 accumulation), and each
 * part of xp's gradient against double on the kernel's own dg/du (one
 * rounding).  Returns the worst errors as fractions of their bounds. */
static void check_backward(kern_device_t *dev, const moe_layer_dims_t *d, moe_layer_params_t *p, const void *x,
                           const outs_t *fwd, grads_t *o, double *worst_dg, double *worst_dx, double *worst_dw) {
    for (size_t i = 0; i < ROWS * H; i++) hdep[i] = mt_f32_to_bf16(rnd());
    run_backward(dev, d, p, x, o);
    EXPECT(calls == 4 && products == 18 && bf16_out_beta0 == 18 && f32_out == 0,
           "backward: %d grouped calls of %d products (want 4 of 18: dh, d(down), d(gate) and d(up) together, "
           "then xp's gate and up parts together), %d bf16 x bf16 -> bf16 beta 0 (want all 18), %d fp32 C "
           "(want none)",
           calls, products, bf16_out_beta0, f32_out);
    *worst_dw = check_weight_grads(fwd, o);
    EXPECT(*worst_dw <= 1.0, "weight gradients: worst error %.3g of the bound against double", *worst_dw);
    *worst_dg = *worst_dx = 0;
    for (int e = 0; e < E; e++)
        for (int r = k_offsets[e]; r < k_offsets[e] + k_counts[e]; r++) {
            for (int i = 0; i < I; i++) {
                double dh = 0, mag = 0;
                for (int c = 0; c < H; c++) {
                    const double t = (double)bf(hdep[r * H + c]) * bf(hd[e][c * I + i]);
                    dh += t;
                    mag += fabs(t);
                }
                const double g = bf(fwd->g[r * I + i]), u = bf(fwd->u[r * I + i]), sig = 1.0 / (1.0 + exp(-g));
                const double f = u * sig * (1.0 + g * (1.0 - sig)), want = dh * f;
                const double bound = 0x1.1p-8 * fabs(want) + fabs(f) * (0x1.1p-8 * fabs(dh) + 0x1p-20 * mag) + 1e-30;
                *worst_dg = fmax(*worst_dg, fabs(bf(o->dg[r * I + i]) - want) / bound);
            }
            for (int c = 0; c < H; c++) {
                double xg = 0, xu = 0, mg = 0, mu = 0;
                for (int i = 0; i < I; i++) {
                    const double tg = (double)bf(o->dg[r * I + i]) * bf(hg[e][i * H + c]);
                    const double tu = (double)bf(o->du[r * I + i]) * bf(hu[e][i * H + c]);
                    xg += tg, xu += tu, mg += fabs(tg), mu += fabs(tu);
                }
                *worst_dx = fmax(*worst_dx, fabs(bf(o->dxg[r * H + c]) - xg) / (0x1p-8 * fabs(xg) + 0x1p-20 * mg));
                *worst_dx = fmax(*worst_dx, fabs(bf(o->dxu[r * H + c]) - xu) / (0x1p-8 * fabs(xu) + 0x1p-20 * mu));
            }
        }
    EXPECT(*worst_dg <= 1.0, "dg: worst error %.3g of the bound against the double reference", *worst_dg);
    EXPECT(*worst_dx <= 1.0, "xp's gradient parts: worst error %.3g of the bound against double", *worst_dx);
}

int main(void) {
    mt_error_t err = {0};
    kern_device_opts_t opts = {.device_budget_bytes = 4 << 20, .host_threads = 1};
    kern_device_t *dev = NULL;
    MT_CHECK(kern_device_create(KERN_BACKEND_CPU, &opts, &dev, &err) == MT_OK, "%s", err.msg);
    kern_ops_t watched = *dev->ops;
    real_ops = dev->ops;
    watched.mm_grouped = watch_grouped;
    dev->ops = &watched;

    moe_layer_dims_t d = {.H = H, .E = E, .k = K, .I = I, .compute = MT_BF16};
    d.acts[MOE_ACT_XP] = (moe_act_size_t){K * H, 0, MT_BF16};
    d.acts[MOE_ACT_G] = d.acts[MOE_ACT_U] = (moe_act_size_t){K * I, 0, MT_BF16};
    d.acts[MOE_ACT_EP] = (moe_act_size_t){K * H, 0, MT_BF16};
    void *x = upload_bf16(dev, hx, ROWS * H), *gate[E], *up[E], *down[E];
    for (int e = 0; e < E; e++) {
        gate[e] = upload_bf16(dev, hg[e], I * H);
        up[e] = upload_bf16(dev, hu[e], I * H);
        down[e] = upload_bf16(dev, hd[e], H * I);
    }
    moe_layer_params_t p = {.gate = gate, .up = up, .down = down, .dtype = MT_BF16};

    outs_t plain;
    run(dev, &d, &p, x, &plain);
    grads_t plain_b;
    double worst_dg, worst_dx, worst_dw;
    check_backward(dev, &d, &p, x, &plain, &plain_b, &worst_dg, &worst_dx, &worst_dw);
    run(dev, &d, &p, x, &plain); /* the forward's counters again, for the checks below */
    EXPECT(calls == 2 && products == 9 && bf16_out_beta0 == 9,
           "plain: %d grouped calls of %d products (want 2 of 9: gate's and up's together, then down's, of the 3 "
           "experts with rows), %d bf16 x bf16 -> bf16 beta 0",
           calls, products, bf16_out_beta0);
    double worst_gu = 0, worst_ep = 0;
    for (int e = 0; e < E; e++)
        for (int r = k_offsets[e]; r < k_offsets[e] + k_counts[e]; r++) {
            for (int i = 0; i < I; i++) {
                double gm, um;
                const double g = dot_bf16(hx + r * H, hg[e] + i * H, H, &gm);
                const double u = dot_bf16(hx + r * H, hu[e] + i * H, H, &um);
                worst_gu = fmax(worst_gu, fabs(bf(plain.g[r * I + i]) - g) / (0x1p-8 * fabs(g) + 0x1p-20 * gm));
                worst_gu = fmax(worst_gu, fabs(bf(plain.u[r * I + i]) - u) / (0x1p-8 * fabs(u) + 0x1p-20 * um));
            }
            for (int c = 0; c < H; c++) {
                double ep = 0, mag = 0;
                for (int i = 0; i < I; i++) {
                    const double g = bf(plain.g[r * I + i]), u = bf(plain.u[r * I + i]);
                    const double t = g / (1.0 + exp(-g)) * u * bf(hd[e][c * I + i]);
                    ep += t;
                    mag += fabs(t);
                }
                worst_ep = fmax(worst_ep, fabs(bf(plain.ep[r * H + c]) - ep) / (0x1p-8 * fabs(ep) + 0x1p-8 * mag));
            }
        }
    EXPECT(worst_gu <= 1.0, "g, u: worst error %.3g of the bound against the double reference", worst_gu);
    EXPECT(worst_ep <= 1.0, "ep: worst error %.3g of the bound against the double reference", worst_ep);

    /* LoRA on gate (expert 2 only): gate's products write fp32, up's and down's stay bf16 */
    kern_lora_t lora[E];
    memset(lora, 0, sizeof lora);
    lora[2] = (kern_lora_t){.a = upload_bf16(dev, la, R * H), .b = upload_bf16(dev, lb, I * R), .dtype = MT_BF16,
                            .r = R, .scale = 2.0f};
    p.lora_gate = lora;
    outs_t adapted;
    run(dev, &d, &p, x, &adapted);
    EXPECT(calls == 3 && bf16_out_beta0 == 6 && f32_out == 3,
           "LoRA on gate: %d grouped calls, %d bf16 x bf16 -> bf16 beta-0 products (want 6: up and down), %d with "
           "an fp32 C (want gate's 3)",
           calls, bf16_out_beta0, f32_out);
    int moved = 0, unmoved_other = 0;
    for (int r = 0; r < ROWS; r++)
        for (int i = 0; i < I; i++) {
            const bool in_e2 = r >= k_offsets[2] && r < k_offsets[2] + k_counts[2];
            const bool same = adapted.g[r * I + i] == plain.g[r * I + i];
            moved += in_e2 && !same;
            unmoved_other += !in_e2 && same;
        }
    EXPECT(moved > k_counts[2] * I / 2, "LoRA on expert 2 moved %d of its %d g values", moved, k_counts[2] * I);
    EXPECT(unmoved_other == (ROWS - k_counts[2]) * I, "LoRA on expert 2 changed other experts' g (%d of %d same)",
           unmoved_other, (ROWS - k_counts[2]) * I);
    EXPECT(memcmp(adapted.u, plain.u, sizeof plain.u) == 0, "LoRA on gate changed u");

    /* its backward: gate's input-gradient products write the fp32 scratch
     * (the adapter's term added before the one rounding), up's stay bf16
     * beta 0; only expert 2's rows of the gate part move */
    grads_t adapted_b;
    run_backward(dev, &d, &p, x, &adapted_b);
    EXPECT(calls == 5 && bf16_out_beta0 == 15 && f32_out == 3,
           "LoRA on gate, backward: %d grouped calls (want 5), %d bf16 x bf16 -> bf16 beta 0 (want dh's, the 9 "
           "weight gradients' and up's part's: 15), %d fp32 C (want gate's part's 3)",
           calls, bf16_out_beta0, f32_out);
    int moved_dx = 0, other_dx = 0;
    for (int r = 0; r < ROWS; r++)
        for (int c = 0; c < H; c++) {
            const bool in_e2 = r >= k_offsets[2] && r < k_offsets[2] + k_counts[2];
            const bool same = adapted_b.dxg[r * H + c] == plain_b.dxg[r * H + c];
            moved_dx += in_e2 && !same;
            other_dx += !in_e2 && !same;
        }
    EXPECT(moved_dx > k_counts[2] * H / 2 && other_dx == 0,
           "LoRA on expert 2's gate moved %d of its %d xp-gradient (gate part) values and %d of other experts'",
           moved_dx, k_counts[2] * H, other_dx);

    printf("bf16 experts: forward products bf16 x bf16 -> bf16 beta 0 (grouped-call kind); g/u at %.3g and ep at "
           "%.3g of their bounds against double; LoRA moved %d of expert 2's g\n",
           worst_gu, worst_ep, moved);
    printf("bf16 experts backward: data- and weight-gradient products bf16 x bf16 -> bf16 beta 0; dg at %.3g, "
           "xp's gradient parts at %.3g and weight gradients at %.3g of their bounds against double; LoRA moved %d "
           "of expert 2's gate-part values\n",
           worst_dg, worst_dx, worst_dw, moved_dx);
    dev->ops = real_ops;
    kern_device_destroy(dev);
    if (failures) fprintf(stderr, "moe_experts_test: %d failure(s)\n", failures);
    else printf("moe_experts_test: all checks passed\n");
    return failures ? 1 : 0;
}
