/* GPU suite: embedding lookup and its scatter-add, and cross-entropy.
 *
 * Tolerances and why:
 *  - embedding forward is a copy and the backward adds each id's rows into
 *    the table in index order on both sides (the GPU sorts ids stably and
 *    sums each run in order): bit-identical, ids repeated many times
 *    included;
 *  - xent loss rows (values ~ log V): both sum exp in double, the GPU's
 *    exponentials are fp32: atol 1e-5 + rtol 1e-5;
 *  - dlogits = grad_scale (p - onehot): p from fp32 expf against the lse
 *    rounded to float (an lse of ~10 carries ~1e-6 absolute error):
 *    rtol 4e-6, and atol 1e-6 * grad_scale for the target's p - 1. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels/loss.h"
#include "tests/gpu/gpu_test.h"

static void embedding_case(gt_ctx_t *t, int V, int n, int H, int hot) {
    float *htab = gt_host_rand(t, (size_t)V * H, 1.0f), *hdout = gt_host_rand(t, (size_t)n * H, 1.0f);
    int32_t *hids = gt_host_bytes((size_t)n * 4);
    for (int i = 0; i < n; i++) hids[i] = (hot && gt_int(t, 3) == 0) ? 7 % V : gt_int(t, V);
    gt_buf_t TAB = gt_from_host(t, htab, (size_t)V * H * 4, "table");
    gt_buf_t IDS = gt_from_host(t, hids, (size_t)n * 4, "ids");
    gt_buf_t OUT = gt_alloc(t, (size_t)n * H * 4, "out");
    gt_buf_t DOUT = gt_from_host(t, hdout, (size_t)n * H * 4, "dout");
    char what[128];
    t->cpu->ops->embedding_fwd(t->sc, GT_C(OUT), GT_C(TAB), GT_CI(IDS), n, H);
    t->gpu->ops->embedding_fwd(t->sg, GT_G(OUT), GT_G(TAB), GT_GI(IDS), n, H);
    snprintf(what, sizeof what, "embedding_fwd V=%d n=%d H=%d", V, n, H);
    gt_check_exact(t, what, &OUT, OUT.bytes);
    t->cpu->ops->embedding_bwd(t->sc, GT_C(TAB), GT_C(DOUT), GT_CI(IDS), n, H);
    t->gpu->ops->embedding_bwd(t->sg, GT_G(TAB), GT_G(DOUT), GT_GI(IDS), n, H);
    snprintf(what, sizeof what, "embedding_bwd (accumulate) V=%d n=%d H=%d%s", V, n, H,
             hot ? ", one id a third of the tokens" : "");
    gt_check_exact(t, what, &TAB, TAB.bytes);
    gt_free(t, &TAB);
    gt_free(t, &IDS);
    gt_free(t, &OUT);
    gt_free(t, &DOUT);
    free(htab);
    free(hdout);
    free(hids);
}

static void xent_case(gt_ctx_t *t, int n, int V, float grad_scale, int ignore_every) {
    const size_t nl = (size_t)n * V;
    float *hl = gt_host_rand(t, nl, 8.0f);
    int32_t *ht = gt_host_bytes((size_t)n * 4);
    for (int r = 0; r < n; r++)
        ht[r] = (ignore_every && r % ignore_every == 1) ? KERN_IGNORE_INDEX : gt_int(t, V);
    gt_buf_t L = gt_from_host(t, hl, nl * 4, "logits"), TG = gt_from_host(t, ht, (size_t)n * 4, "targets");
    gt_buf_t LR = gt_alloc(t, (size_t)n * 4, "loss_rows"), D = gt_alloc(t, nl * 4, "dlogits");
    char what[128];
    t->cpu->ops->xent(t->sc, GT_C(LR), GT_C(D), GT_C(L), GT_CI(TG), n, V, grad_scale);
    t->gpu->ops->xent(t->sg, GT_G(LR), GT_G(D), GT_G(L), GT_GI(TG), n, V, grad_scale);
    snprintf(what, sizeof what, "xent loss n=%d V=%d", n, V);
    gt_check_f32(t, what, &LR, (size_t)n, 1e-5f, 1e-5f);
    snprintf(what, sizeof what, "xent dlogits n=%d V=%d grad_scale=%g", n, V, (double)grad_scale);
    gt_check_f32(t, what, &D, nl, 1e-6f * grad_scale, 4e-6f);
    float *first = gt_host_alloc(nl);
    gt_save_gpu(t, &D, first);
    t->gpu->ops->xent(t->sg, GT_G(LR), GT_G(D), GT_G(L), GT_GI(TG), n, V, grad_scale);
    gt_check_same_gpu(t, what, &D, first);

    /* Forward only. */
    gt_poison(t, &LR);
    t->cpu->ops->xent(t->sc, GT_C(LR), NULL, GT_C(L), GT_CI(TG), n, V, grad_scale);
    t->gpu->ops->xent(t->sg, GT_G(LR), NULL, GT_G(L), GT_GI(TG), n, V, grad_scale);
    snprintf(what, sizeof what, "xent forward-only loss n=%d V=%d", n, V);
    gt_check_f32(t, what, &LR, (size_t)n, 1e-5f, 1e-5f);

    /* dlogits over logits (allowed by loss.h). */
    t->cpu->ops->xent(t->sc, GT_C(LR), GT_C(L), GT_C(L), GT_CI(TG), n, V, grad_scale);
    t->gpu->ops->xent(t->sg, GT_G(LR), GT_G(L), GT_G(L), GT_GI(TG), n, V, grad_scale);
    snprintf(what, sizeof what, "xent in place dlogits n=%d V=%d", n, V);
    gt_check_f32(t, what, &L, nl, 1e-6f * grad_scale, 4e-6f);
    snprintf(what, sizeof what, "xent in place loss n=%d V=%d", n, V);
    gt_check_f32(t, what, &LR, (size_t)n, 1e-5f, 1e-5f);
    gt_free(t, &L);
    gt_free(t, &TG);
    gt_free(t, &LR);
    gt_free(t, &D);
    free(hl);
    free(ht);
    free(first);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "embedding_loss_test", 0xe3b);
    embedding_case(&t, 1, 1, 1, 0);
    embedding_case(&t, 50, 200, 64, 0);
    embedding_case(&t, 1000, 3000, 96, 1);
    embedding_case(&t, 32000, 4096, 128, 1);
    xent_case(&t, 1, 2, 1.0f, 0);
    xent_case(&t, 13, 1000, 1.0f / 11.0f, 3);
    xent_case(&t, 8, 50000, 0.125f, 4);
    xent_case(&t, 3, 151936, 1.0f, 0); /* Qwen vocabulary */
    return gt_close(&t);
}
