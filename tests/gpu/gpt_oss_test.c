/* GPU suite: gpt-oss's kernels (kernels/gpt_oss.h) against their CPU twins.
 *
 * Tolerances and why:
 *  - attn_sink_fwd: one expf and one log1pf per row, device within 2 ulp of
 *    glibc's, then one product per element: rtol 4e-6 on out and lse (atol
 *    1e-6 for lse near 0); rows with lse = -inf must give 0 and the sink;
 *  - attn_sink_bwd: per head a double sum of the rows' terms on both sides,
 *    in another order, each term with a device expf (2 ulp): rtol 1e-5 +
 *    atol 1e-6 on the accumulated float; run twice on the GPU, same bits;
 *  - clamped SwiGLU: expf inside the sigmoid (2 ulp): rtol 4e-6, atol 1e-6
 *    where the derivative's terms cancel; the clamps are exact comparisons;
 *  - expert biases: the same adds in the same order on both sides: bit-identical. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "tests/gpu/gpu_test.h"

static void sink_case(gt_ctx_t *t, int B, int T, int nh, int hd) {
    const size_t no = (size_t)B * T * nh * hd, nl = (size_t)B * nh * T;
    float *ho = gt_host_rand(t, no, 1.0f), *hl = gt_host_rand(t, nl, 3.0f), *hs = gt_host_rand(t, (size_t)nh, 2.0f);
    float *hd_out = gt_host_rand(t, no, 1.0f), *hds = gt_host_rand(t, (size_t)nh, 1.0f);
    for (size_t i = 0; i < nl; i += 7) hl[i] = -INFINITY; /* rows with no visible key */
    gt_buf_t O = gt_from_host(t, ho, no * 4, "out"), L = gt_from_host(t, hl, nl * 4, "lse");
    gt_buf_t S = gt_from_host(t, hs, (size_t)nh * 4, "sinks"), DO = gt_from_host(t, hd_out, no * 4, "dout");
    gt_buf_t DS = gt_from_host(t, hds, (size_t)nh * 4, "dsinks");
    char what[96];
    t->cpu->ops->attn_sink_fwd(t->sc, GT_C(O), GT_C(L), GT_C(S), B, T, nh, hd);
    t->gpu->ops->attn_sink_fwd(t->sg, GT_G(O), GT_G(L), GT_G(S), B, T, nh, hd);
    snprintf(what, sizeof what, "attn_sink_fwd out B=%d T=%d nh=%d hd=%d", B, T, nh, hd);
    gt_check_f32(t, what, &O, no, 1e-7f, 4e-6f);
    snprintf(what, sizeof what, "attn_sink_fwd lse B=%d T=%d nh=%d hd=%d", B, T, nh, hd);
    gt_check_f32(t, what, &L, nl, 1e-6f, 4e-6f);
    /* backward from the CPU's forward results on both sides */
    float *o_cpu = gt_host_alloc(no), *o_gpu = gt_host_alloc(no), *l_cpu = gt_host_alloc(nl), *l_gpu = gt_host_alloc(nl);
    gt_download(t, &O, o_cpu, o_gpu);
    gt_download(t, &L, l_cpu, l_gpu);
    gt_set(t, &O, o_cpu);
    gt_set(t, &L, l_cpu);
    t->cpu->ops->attn_sink_bwd(t->sc, GT_C(DS), GT_C(DO), GT_C(O), GT_C(L), GT_C(S), B, T, nh, hd);
    t->gpu->ops->attn_sink_bwd(t->sg, GT_G(DS), GT_G(DO), GT_G(O), GT_G(L), GT_G(S), B, T, nh, hd);
    snprintf(what, sizeof what, "attn_sink_bwd (accumulate) B=%d T=%d nh=%d", B, T, nh);
    gt_check_f32(t, what, &DS, (size_t)nh, 1e-6f, 1e-5f);
    float *first = gt_host_alloc((size_t)nh);
    gt_save_gpu(t, &DS, first);
    gt_set(t, &DS, hds);
    t->gpu->ops->attn_sink_bwd(t->sg, GT_G(DS), GT_G(DO), GT_G(O), GT_G(L), GT_G(S), B, T, nh, hd);
    gt_check_same_gpu(t, what, &DS, first);
    gt_free(t, &O);
    gt_free(t, &L);
    gt_free(t, &S);
    gt_free(t, &DO);
    gt_free(t, &DS);
    free(ho); free(hl); free(hs); free(hd_out); free(hds);
    free(o_cpu); free(o_gpu); free(l_cpu); free(l_gpu); free(first);
}

static void swiglu_case(gt_ctx_t *t, size_t n, float limit) {
    float *hgu = gt_host_rand(t, 2 * n, 2.0f * limit), *hdh = gt_host_rand(t, n, 1.0f);
    gt_buf_t GU = gt_from_host(t, hgu, 2 * n * 4, "gu"), DH = gt_from_host(t, hdh, n * 4, "dh");
    gt_buf_t H = gt_alloc(t, n * 4, "h"), DGU = gt_alloc(t, 2 * n * 4, "dgu");
    char what[96];
    t->cpu->ops->swiglu_clamped_fwd(t->sc, GT_C(H), GT_C(GU), 1.702f, limit, n);
    t->gpu->ops->swiglu_clamped_fwd(t->sg, GT_G(H), GT_G(GU), 1.702f, limit, n);
    snprintf(what, sizeof what, "swiglu_clamped_fwd n=%zu limit=%g", n, (double)limit);
    gt_check_f32(t, what, &H, n, 1e-6f, 4e-6f);
    t->cpu->ops->swiglu_clamped_bwd(t->sc, GT_C(DGU), GT_C(DH), GT_C(GU), 1.702f, limit, n);
    t->gpu->ops->swiglu_clamped_bwd(t->sg, GT_G(DGU), GT_G(DH), GT_G(GU), 1.702f, limit, n);
    snprintf(what, sizeof what, "swiglu_clamped_bwd n=%zu limit=%g", n, (double)limit);
    gt_check_f32(t, what, &DGU, 2 * n, 1e-6f, 4e-6f);
    /* in place, as moe/moe_fused.c calls it */
    t->cpu->ops->swiglu_clamped_bwd(t->sc, GT_C(GU), GT_C(DH), GT_C(GU), 1.702f, limit, n);
    t->gpu->ops->swiglu_clamped_bwd(t->sg, GT_G(GU), GT_G(DH), GT_G(GU), 1.702f, limit, n);
    snprintf(what, sizeof what, "swiglu_clamped_bwd in place n=%zu", n);
    gt_check_f32(t, what, &GU, 2 * n, 1e-6f, 4e-6f);
    gt_free(t, &GU);
    gt_free(t, &DH);
    gt_free(t, &H);
    gt_free(t, &DGU);
    free(hgu);
    free(hdh);
}

static void expert_bias_case(gt_ctx_t *t, int E, int C) {
    int32_t *off = malloc((size_t)(E + 1) * sizeof *off);
    off[0] = 0;
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + (e % 5 == 3 ? 0 : 1 + gt_int(t, 40)); /* some experts idle */
    const size_t m = (size_t)off[E];
    float *hy = gt_host_rand(t, m * C, 1.0f), *hb = gt_host_rand(t, (size_t)E * C, 1.0f);
    float *hdb = gt_host_rand(t, (size_t)E * C, 1.0f);
    gt_buf_t Y = gt_from_host(t, hy, m * C * 4, "y"), Bb = gt_from_host(t, hb, (size_t)E * C * 4, "b");
    gt_buf_t DB = gt_from_host(t, hdb, (size_t)E * C * 4, "db"), O = gt_from_host(t, off, (size_t)(E + 1) * 4, "off");
    char what[96];
    t->cpu->ops->expert_bias_bwd(t->sc, GT_C(DB), GT_C(Y), GT_CI(O), E, C);
    t->gpu->ops->expert_bias_bwd(t->sg, GT_G(DB), GT_G(Y), GT_GI(O), E, C);
    snprintf(what, sizeof what, "expert_bias_bwd (accumulate) E=%d C=%d", E, C);
    gt_check_exact(t, what, &DB, DB.bytes);
    t->cpu->ops->expert_bias_fwd(t->sc, GT_C(Y), GT_C(Bb), GT_CI(O), E, C);
    t->gpu->ops->expert_bias_fwd(t->sg, GT_G(Y), GT_G(Bb), GT_GI(O), E, C);
    snprintf(what, sizeof what, "expert_bias_fwd E=%d C=%d", E, C);
    gt_check_exact(t, what, &Y, Y.bytes);
    gt_free(t, &Y);
    gt_free(t, &Bb);
    gt_free(t, &DB);
    gt_free(t, &O);
    free(off); free(hy); free(hb); free(hdb);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "gpt_oss_test", 0x9055);
    sink_case(&t, 1, 1, 1, 8);
    sink_case(&t, 2, 33, 4, 64);
    sink_case(&t, 3, 300, 8, 64); /* more rows than the block's threads */
    static const size_t sizes[] = {0, 1, 1000, 65537};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        swiglu_case(&t, sizes[i], 7.0f);
        swiglu_case(&t, sizes[i], 1.0f);
    }
    expert_bias_case(&t, 4, 48);
    expert_bias_case(&t, 32, 600); /* more columns than a block's threads */
    return gt_close(&t);
}
