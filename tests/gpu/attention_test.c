/* GPU suite: causal GQA attention forward and backward, with and without a
 * sliding window, packed examples (seg_start: edges inside and on blocks
 * and tiles), head sizes that are and are not multiples of 32, sequence
 * lengths that do not fill a tile, key padding (kv_len inside a tile, on a
 * tile edge, 0, > T, and with windows that leave padded queries no key:
 * out 0 and lse -inf on both sides), and determinism of repeated runs.
 *
 * The backward on both devices takes the CPU forward's out and lse, so it is
 * compared on identical inputs.  Tolerances and why:
 *  - out: fp32 with different summation orders and exponentials (the GPU's
 *    online softmax rescales as it goes, the CPU normalises once; device
 *    expf is within 2 ulp): atol 1e-5 + rtol 1e-4 on values |out| < 1;
 *  - lse (values up to ~6): atol 1e-5 + rtol 1e-5;
 *  - dq, dk, dv: dS = P * (dP - D) cancels, so elementwise relative error
 *    is meaningless near zero; normwise 1e-4 of max(max |cpu|, 1) (fp32
 *    reorderings stay near 1e-6; a wrong mask or scale is off by O(1)).
 *    The floor of 1 is these gradients' scale (inputs in [-1, 1)): where
 *    they vanish mathematically (T = 1 or window = 1 make dS = 0 exactly)
 *    both sides hold rounding noise of ~1e-8 that no relative test fits. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/backend_cuda_internal.h"
#include "tests/gpu/gpu_test.h"

/* kv_len: B entries, or NULL; seg: seg_start (B, T) of packed rows, or NULL. */
static void attention_case_seg(gt_ctx_t *t, int B, int T, int nh, int nkv, int hd, int window,
                               const int32_t *kv_len, const int32_t *seg) {
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    float *hq = gt_host_rand(t, nq, 1.0f), *hk = gt_host_rand(t, nk, 1.0f);
    float *hv = gt_host_rand(t, nk, 1.0f), *hdo = gt_host_rand(t, nq, 1.0f);
    gt_buf_t Q = gt_from_host(t, hq, nq * 4, "q"), K = gt_from_host(t, hk, nk * 4, "k");
    gt_buf_t V = gt_from_host(t, hv, nk * 4, "v"), DO = gt_from_host(t, hdo, nq * 4, "dout");
    gt_buf_t O = gt_alloc(t, nq * 4, "out"), L = gt_alloc(t, nl * 4, "lse");
    gt_buf_t DQ = gt_alloc(t, nq * 4, "dq"), DK = gt_alloc(t, nk * 4, "dk"), DV = gt_alloc(t, nk * 4, "dv");
    gt_buf_t KL = {0};
    if (kv_len) KL = gt_from_host(t, kv_len, (size_t)B * 4, "kv_len");
    const int32_t *klc = kv_len ? GT_CI(KL) : NULL, *klg = kv_len ? GT_GI(KL) : NULL;
    gt_buf_t SG = {0};
    if (seg) SG = gt_from_host(t, seg, (size_t)B * T * 4, "seg_start");
    const int32_t *sgc = seg ? GT_CI(SG) : NULL, *sgg = seg ? GT_GI(SG) : NULL;
    char what[192], tag[128];
    int n = snprintf(tag, sizeof tag, "B=%d T=%d nh=%d nkv=%d hd=%d window=%d kv_len=", B, T, nh, nkv,
                     hd, window);
    if (!kv_len) snprintf(tag + n, sizeof tag - (size_t)n, "NULL");
    for (int b = 0; kv_len && b < B && n < (int)sizeof tag - 12; b++)
        n += snprintf(tag + n, sizeof tag - (size_t)n, "%s%d", b ? "," : "", kv_len[b]);
    if (seg) snprintf(tag + n, sizeof tag - (size_t)n, " packed");

    t->cpu->ops->attention_fwd(t->sc, GT_C(O), GT_C(L), GT_C(Q), GT_C(K), GT_C(V), klc, sgc, B, T, nh, nkv, hd, window);
    t->gpu->ops->attention_fwd(t->sg, GT_G(O), GT_G(L), GT_G(Q), GT_G(K), GT_G(V), klg, sgg, B, T, nh, nkv, hd, window);
    snprintf(what, sizeof what, "attention_fwd out %s", tag);
    gt_check_f32(t, what, &O, nq, 1e-5f, 1e-4f);
    snprintf(what, sizeof what, "attention_fwd lse %s", tag);
    gt_check_f32(t, what, &L, nl, 1e-5f, 1e-5f);
    float *o1 = gt_host_alloc(nq), *l1 = gt_host_alloc(nl);
    gt_save_gpu(t, &O, o1);
    gt_save_gpu(t, &L, l1);
    t->gpu->ops->attention_fwd(t->sg, GT_G(O), GT_G(L), GT_G(Q), GT_G(K), GT_G(V), klg, sgg, B, T, nh, nkv, hd, window);
    snprintf(what, sizeof what, "attention_fwd out %s", tag);
    gt_check_same_gpu(t, what, &O, o1);
    snprintf(what, sizeof what, "attention_fwd lse %s", tag);
    gt_check_same_gpu(t, what, &L, l1);

    /* Backward from the CPU's forward on both sides. */
    float *hout = gt_host_alloc(nq), *hlse = gt_host_alloc(nl);
    gt_download(t, &O, hout, NULL);
    gt_download(t, &L, hlse, NULL);
    gt_set(t, &O, hout);
    gt_set(t, &L, hlse);
    t->cpu->ops->attention_bwd(t->sc, GT_C(DQ), GT_C(DK), GT_C(DV), GT_C(DO), GT_C(Q), GT_C(K), GT_C(V),
                               GT_C(O), GT_C(L), klc, sgc, B, T, nh, nkv, hd, window);
    t->gpu->ops->attention_bwd(t->sg, GT_G(DQ), GT_G(DK), GT_G(DV), GT_G(DO), GT_G(Q), GT_G(K), GT_G(V),
                               GT_G(O), GT_G(L), klg, sgg, B, T, nh, nkv, hd, window);
    snprintf(what, sizeof what, "attention_bwd dq %s", tag);
    gt_check_f32_norm(t, what, &DQ, nq, 1e-4f, 1.0f);
    snprintf(what, sizeof what, "attention_bwd dk %s", tag);
    gt_check_f32_norm(t, what, &DK, nk, 1e-4f, 1.0f);
    snprintf(what, sizeof what, "attention_bwd dv %s", tag);
    gt_check_f32_norm(t, what, &DV, nk, 1e-4f, 1.0f);
    float *dq1 = gt_host_alloc(nq), *dk1 = gt_host_alloc(nk), *dv1 = gt_host_alloc(nk);
    gt_save_gpu(t, &DQ, dq1);
    gt_save_gpu(t, &DK, dk1);
    gt_save_gpu(t, &DV, dv1);
    t->gpu->ops->attention_bwd(t->sg, GT_G(DQ), GT_G(DK), GT_G(DV), GT_G(DO), GT_G(Q), GT_G(K), GT_G(V),
                               GT_G(O), GT_G(L), klg, sgg, B, T, nh, nkv, hd, window);
    snprintf(what, sizeof what, "attention_bwd dq/dk/dv %s", tag);
    gt_check_same_gpu(t, what, &DQ, dq1);
    gt_check_same_gpu(t, what, &DK, dk1);
    gt_check_same_gpu(t, what, &DV, dv1);

    gt_buf_t *bufs[] = {&Q, &K, &V, &DO, &O, &L, &DQ, &DK, &DV};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    if (kv_len) gt_free(t, &KL);
    if (seg) gt_free(t, &SG);
    float *hs[] = {hq, hk, hv, hdo, o1, l1, hout, hlse, dq1, dk1, dv1};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
}

static void attention_case(gt_ctx_t *t, int B, int T, int nh, int nkv, int hd, int window,
                           const int32_t *kv_len) {
    attention_case_seg(t, B, T, nh, nkv, hd, window, kv_len, NULL);
}

/* Packed rows: examples of the given lengths (0 ends a row's list) one after
 * another, the rest padding (its own segment, past kv_len). */
static void packed_case(gt_ctx_t *t, int T, int nh, int nkv, int hd, int window, const int lens[2][6]) {
    int32_t *seg = malloc((size_t)2 * T * sizeof *seg), kvl[2];
    for (int b = 0; b < 2; b++) {
        int at = 0;
        for (int e = 0; e < 6 && lens[b][e]; at += lens[b][e], e++)
            for (int i = 0; i < lens[b][e]; i++) seg[b * T + at + i] = at;
        kvl[b] = at;
        for (int i = at; i < T; i++) seg[b * T + i] = at;
    }
    attention_case_seg(t, 2, T, nh, nkv, hd, window, kvl, seg);
    free(seg);
}

/* The cuDNN path's helper kernels (attention.cu, kernels/cudnn): sequence
 * lengths for its padding mask, rows that see no key set to out 0 and lse
 * -inf (attention.h), and the backward's stats; against the rule computed
 * here. */
static void tc_helpers_case(gt_ctx_t *t) {
    const int B = 3, T = 50, nh = 3, hd = 8, window = 4;
    const int32_t kvl[3] = {10, 0, 400};
    gt_buf_t KL = gt_from_host(t, kvl, sizeof kvl, "kv_len");
    gt_buf_t SQ = gt_alloc(t, B * 4, "seq_q"), SKV = gt_alloc(t, B * 4, "seq_kv");
    kern_attention_tc_seqlens_cuda(t->sg, GT_GI(SQ), GT_GI(SKV), GT_GI(KL), B, T);
    int32_t sq[3], skv[3];
    gt_download(t, &SQ, NULL, sq);
    gt_download(t, &SKV, NULL, skv);
    for (int b = 0; b < B; b++) {
        const int want = kvl[b] < 0 ? 0 : kvl[b] > T ? T : kvl[b];
        gt_expect(t, sq[b] == T && skv[b] == want, "tc seqlens row %d: seq_q %d seq_kv %d, want %d and %d", b,
                  sq[b], skv[b], T, want);
    }
    const size_t no = (size_t)B * T * nh * hd, nl = (size_t)B * nh * T;
    float *ho = gt_host_alloc(no), *hl = gt_host_alloc(nl);
    for (size_t i = 0; i < no; i++) ho[i] = 1.0f + (float)(i % 7);
    for (size_t i = 0; i < nl; i++) hl[i] = (i % 5 == 0) ? -INFINITY : 0.5f + (float)(i % 3);
    gt_buf_t O = gt_from_host(t, ho, no * 4, "out"), L = gt_from_host(t, hl, nl * 4, "lse");
    gt_buf_t ST = gt_alloc(t, nl * 4, "stats");
    kern_attention_tc_bwd_stats_cuda(t->sg, GT_G(ST), GT_G(L), nl);
    kern_attention_tc_empty_rows_cuda(t->sg, GT_G(O), false, GT_G(L), GT_GI(KL), B, T, nh, hd, window);
    float *go = gt_host_alloc(no), *gl = gt_host_alloc(nl), *gs = gt_host_alloc(nl);
    gt_download(t, &O, NULL, go);
    gt_download(t, &L, NULL, gl);
    gt_download(t, &ST, NULL, gs);
    int bad = 0;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < T; i++)
            for (int h = 0; h < nh; h++) {
                const int kv = kvl[b] > T ? T : kvl[b], hi = i < kv - 1 ? i : kv - 1;
                const int lo = i - window + 1 > 0 ? i - window + 1 : 0;
                const bool empty = hi < lo;
                const size_t r = ((size_t)b * T + i) * nh + h, li = ((size_t)b * nh + h) * T + i;
                for (int d = 0; d < hd; d++) bad += go[r * hd + d] != (empty ? 0.0f : ho[r * hd + d]);
                bad += empty ? !(isinf(gl[li]) && gl[li] < 0) : memcmp(&gl[li], &hl[li], 4) != 0;
            }
    for (size_t i = 0; i < nl; i++) bad += gs[i] != (isinf(hl[i]) ? 0.0f : hl[i]);
    gt_expect(t, bad == 0, "tc empty rows / stats: %d wrong elements", bad);
    gt_buf_t *bufs[] = {&KL, &SQ, &SKV, &O, &L, &ST};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    free(ho), free(hl), free(go), free(gl), free(gs);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "attention_test", 0xa77e);
    tc_helpers_case(&t);
    /* packed examples: edges inside and on 16-row blocks and 32-key tiles */
    const int p1[2][6] = {{3, 29, 1, 16, 20, 0}, {32, 33, 5, 0, 0, 0}};
    packed_case(&t, 70, 4, 2, 64, 0, p1);
    packed_case(&t, 70, 8, 2, 128, 16, p1);
    packed_case(&t, 70, 2, 2, 80, 0, p1);
    attention_case(&t, 1, 1, 1, 1, 16, 0, NULL);
    attention_case(&t, 2, 37, 4, 2, 64, 0, NULL);   /* GQA group 2, T not a tile multiple */
    attention_case(&t, 1, 70, 8, 2, 128, 16, NULL); /* sliding window, group 4 */
    attention_case(&t, 2, 100, 6, 3, 32, 1, NULL);  /* window 1: each query sees itself */
    attention_case(&t, 1, 33, 2, 1, 80, 0, NULL);   /* head_dim not a multiple of 32 */
    attention_case(&t, 1, 40, 2, 2, 256, 0, NULL);  /* largest head_dim, > 48 KB shared memory */
    attention_case(&t, 1, 300, 4, 1, 128, 0, NULL); /* many key tiles, group 4 (MQA-like) */
    attention_case(&t, 1, 300, 4, 4, 128, 64, NULL);
    /* key padding (kv_len per row) */
    const int32_t k1[1] = {0}, k2[2] = {20, 0}, k3[2] = {5, 33}, k4[2] = {51, 99};
    const int32_t k5[2] = {40, 16}, k6[1] = {83}, k7[2] = {37, 37};
    attention_case(&t, 1, 1, 1, 1, 16, 0, k1);      /* the only query has no key */
    attention_case(&t, 2, 37, 4, 2, 64, 0, k2);     /* inside a tile; a padding-only row */
    attention_case(&t, 2, 70, 8, 2, 128, 16, k3);   /* window: queries i >= kv_len + 15 see nothing */
    attention_case(&t, 2, 100, 6, 3, 32, 1, k4);    /* window 1: every padded query is empty */
    attention_case(&t, 2, 33, 2, 1, 80, 0, k5);     /* > T (clamped); on a 16-row block edge */
    attention_case(&t, 1, 100, 4, 1, 128, 64, k6);  /* inside the third key tile, window 64 */
    attention_case(&t, 2, 37, 4, 2, 64, 0, k7);     /* == T: as NULL */
    return gt_close(&t);
}
