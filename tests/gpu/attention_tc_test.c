/* GPU suite: tensor-core attention (cuDNN's fused SDPA, kernels/cudnn)
 * against its CPU twin (kernels/cpu/attention.c, _tc), and a benchmark of
 * it beside the fp32 kernel.
 *
 * Cases: causal GQA with head dims 64, 128 and 256, T not a multiple of 64,
 * key padding (kv_len inside a tile, 0, > T), sliding windows, forward and
 * backward; each case prints whether cuDNN ran it or why it fell back.
 * Shapes without a window or head dim 256 must run on cuDNN (a fallback
 * there fails the test); the others may fall back, printed as FALLBACK
 * with cuDNN's reason.  Shapes both paths refuse by rule (packed segments,
 * a head dim that is not a multiple of 8) must be refused by both.
 *
 * Tolerances and why.  Both sides round q, k, v (and dout, out) to the same
 * bf16 values (round to nearest even on both), so what differs is:
 * cuDNN rounds P (forward) and P and dS (backward) to bf16 as operands of
 * the second products, sums in another fp32 order, and both round the
 * results to bf16.  Each rounding is at most 2^-9 relative (about 2e-3),
 * so the results agree to well under 1e-2 of their norm; a wrong mask,
 * scale or group sum is off by O(1) of it.
 *  - out, dq, dk, dv: normwise 2e-2 of max(max |cpu|, floor), floor 1e-2
 *    (the gradients' scale with inputs in [-1, 1) is 0.1-1; the floor only
 *    matters where a gradient vanishes mathematically, e.g. window 1);
 *  - lse: from fp32 scores of identical bf16 inputs, atol 1e-3 + rtol 1e-3
 *    (lse is up to ~log T + max score; only the summation order differs);
 *    rows that see no key are -inf on both sides.
 * With bf16 storage (q, k, v and out as a bf16 run saves them, handed to
 * cuDNN without copies) the GPU must give the same bits as with fp32
 * storage of the same values, forward and deterministic backward.
 * Every GPU result is checked for NaN/Inf where the CPU's is finite, and
 * the forward, and a backward whose engine is deterministic, are run twice
 * and must give the same bits.
 *
 * Benchmark (B = 1, T = 4096, head dim 128, causal; heads 32/4 as
 * Qwen3-30B-A3B, 32/8 as Mixtral): forward and backward TFLOP/s of the
 * cuDNN path (including its fp32 <-> bf16 conversions) and of the fp32
 * kernel, cudaEvent timing, median of 10 after 3 warm-up calls.  Causal
 * FLOPs: forward 2 * 2 * B * nh * T^2 * hd / 2, backward 2.5x that. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "base/status.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cudnn/attention_cudnn.h"
#include "tests/gpu/gpu_test.h"

static int g_fallbacks;

static void tag_of(char *tag, size_t len, int B, int T, int nh, int nkv, int hd, int window, const int32_t *kv_len) {
    int n = snprintf(tag, len, "B=%d T=%d heads=%d/%d hd=%d window=%d kv_len=", B, T, nh, nkv, hd, window);
    if (!kv_len) snprintf(tag + n, len - (size_t)n, "NULL");
    for (int b = 0; kv_len && b < B && n < (int)len - 12; b++)
        n += snprintf(tag + n, len - (size_t)n, "%s%d", b ? "," : "", kv_len[b]);
}

/* Whether the GPU handled the last call; prints the path, and fails the
 * test when the shape had to be handled. */
static bool path_of(gt_ctx_t *t, bool handled, bool must, const char *op, const char *tag, bool *det) {
    kern_cudnn_attn_report_t r;
    kern_cudnn_attn_last(t->sg, &r);
    gt_expect(t, handled == r.handled, "%s %s: the entry point and its report disagree", op, tag);
    if (det) *det = r.deterministic;
    if (handled) {
        printf("  %s %s: cuDNN%s\n", op, tag, det ? (r.deterministic ? " (deterministic)" : " (NOT deterministic)") : "");
        return true;
    }
    g_fallbacks++;
    printf("  FALLBACK %s %s: %s\n", op, tag, r.why);
    gt_expect(t, !must, "%s %s must run on cuDNN: %s", op, tag, r.why);
    return false;
}

/* The bits of a bf16 buffer's values against an fp32 one's: how many differ. */
static int bf16_vs_f32_bits(const uint16_t *a, const float *b, size_t n) {
    int bad = 0;
    for (size_t i = 0; i < n; i++) {
        const float x = mt_bf16_to_f32(a[i]);
        bad += memcmp(&x, &b[i], sizeof x) != 0;
    }
    return bad;
}

/* bf16 storage (dt MT_BF16: how a bf16 run saves q, k, v and out): cuDNN
 * reads and writes those buffers as they are, with no conversion copies,
 * and must give the bits fp32 storage of the same values gave (the same
 * bf16 operands, the same plan; out rounded the same way, rows with no key
 * zeroed in bf16).  The forward against o1 / l1 (the fp32-storage GPU
 * forward), the backward, when deterministic, against dq1, dk1, dv1 (the
 * fp32-storage GPU backward from out / lse O, L). */
static void bf16_storage_case(gt_ctx_t *t, const char *tag, gt_buf_t *Q, gt_buf_t *K, gt_buf_t *V, gt_buf_t *DO,
                              gt_buf_t *O, gt_buf_t *L, const float *o1, const float *l1, const float *const g1[3],
                              const int32_t *klg, int B, int T, int nh, int nkv, int hd, int window) {
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    gt_buf_t Q16 = gt_alloc(t, nq * 2, "q bf16"), K16 = gt_alloc(t, nk * 2, "k bf16"), V16 = gt_alloc(t, nk * 2, "v bf16");
    gt_buf_t O16 = gt_alloc(t, nq * 2, "out bf16"), L16 = gt_alloc(t, nl * 4, "lse (bf16 storage)");
    const kern_ops_t *ops = t->gpu->ops;
    ops->f32_to_bf16(t->sg, GT_GU16(Q16), GT_G(*Q), nq);
    ops->f32_to_bf16(t->sg, GT_GU16(K16), GT_G(*K), nk);
    ops->f32_to_bf16(t->sg, GT_GU16(V16), GT_G(*V), nk);
    const bool fwd = ops->attention_fwd_tc(t->sg, GT_GU16(O16), GT_G(L16), GT_GU16(Q16), GT_GU16(K16), GT_GU16(V16),
                                           MT_BF16, klg, NULL, B, T, nh, nkv, hd, window);
    gt_expect(t, fwd, "bf16 storage: the forward of %s fell back where fp32 storage ran", tag);
    uint16_t *h16 = gt_host_bytes(nq * 2);
    float *hl = gt_host_alloc(nl);
    if (fwd) {
        gt_download(t, &O16, NULL, h16);
        gt_download(t, &L16, NULL, hl);
        const int bad = bf16_vs_f32_bits(h16, o1, nq) + (memcmp(hl, l1, nl * sizeof *hl) != 0);
        printf("  bf16 storage forward %s: %s\n", tag, bad ? "DIFFERS" : "the same bits as fp32 storage");
        gt_expect(t, bad == 0, "bf16 storage forward %s: %d values differ from fp32 storage's", tag, bad);
    }
    if (g1) { /* the backward from the same out (rounded: it is bf16-valued) and lse as fp32 storage's */
        gt_buf_t G[3] = {gt_alloc(t, nq * 4, "dq"), gt_alloc(t, nk * 4, "dk"), gt_alloc(t, nk * 4, "dv")};
        ops->f32_to_bf16(t->sg, GT_GU16(O16), GT_G(*O), nq);
        const bool bwd = ops->attention_bwd_tc(t->sg, GT_G(G[0]), GT_G(G[1]), GT_G(G[2]), GT_G(*DO), GT_GU16(Q16),
                                               GT_GU16(K16), GT_GU16(V16), GT_GU16(O16), MT_BF16, GT_G(*L), klg, NULL,
                                               B, T, nh, nkv, hd, window);
        gt_expect(t, bwd, "bf16 storage: the backward of %s fell back where fp32 storage ran", tag);
        int bad = 0;
        for (int i = 0; bwd && i < 3; i++) {
            const size_t n = i == 0 ? nq : nk;
            float *h = gt_host_alloc(n);
            gt_download(t, &G[i], NULL, h);
            bad += memcmp(h, g1[i], n * sizeof *h) != 0;
            free(h);
        }
        if (bwd) printf("  bf16 storage backward %s: %s\n", tag, bad ? "DIFFERS" : "the same bits as fp32 storage");
        gt_expect(t, bad == 0, "bf16 storage backward %s: %d of dq, dk, dv differ from fp32 storage's", tag, bad);
        for (int i = 0; i < 3; i++) gt_free(t, &G[i]);
    }
    gt_buf_t *bufs[] = {&Q16, &K16, &V16, &O16, &L16};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    free(h16), free(hl);
}

static void tc_case(gt_ctx_t *t, int B, int T, int nh, int nkv, int hd, int window, const int32_t *kv_len,
                    bool must) {
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
    char tag[160], what[256];
    tag_of(tag, sizeof tag, B, T, nh, nkv, hd, window, kv_len);

    const bool cpu_fwd = t->cpu->ops->attention_fwd_tc(t->sc, GT_C(O), GT_C(L), GT_C(Q), GT_C(K), GT_C(V), MT_F32, klc,
                                                       NULL, B, T, nh, nkv, hd, window);
    gt_expect(t, cpu_fwd, "CPU twin refused %s", tag);
    const bool gpu_fwd = t->gpu->ops->attention_fwd_tc(t->sg, GT_G(O), GT_G(L), GT_G(Q), GT_G(K), GT_G(V), MT_F32, klg,
                                                       NULL, B, T, nh, nkv, hd, window);
    float *o1 = gt_host_alloc(nq), *l1 = gt_host_alloc(nl);
    if (path_of(t, gpu_fwd, must, "forward", tag, NULL) && cpu_fwd) {
        snprintf(what, sizeof what, "tc forward out %s", tag);
        gt_check_f32_norm(t, what, &O, nq, 2e-2f, 1e-2f);
        snprintf(what, sizeof what, "tc forward lse %s", tag);
        gt_check_f32(t, what, &L, nl, 1e-3f, 1e-3f);
        gt_save_gpu(t, &O, o1);
        gt_save_gpu(t, &L, l1);
        t->gpu->ops->attention_fwd_tc(t->sg, GT_G(O), GT_G(L), GT_G(Q), GT_G(K), GT_G(V), MT_F32, klg, NULL, B, T, nh,
                                      nkv, hd, window);
        snprintf(what, sizeof what, "tc forward repeated %s", tag);
        gt_check_same_gpu(t, what, &O, o1);
        gt_check_same_gpu(t, what, &L, l1);
    }

    /* the backward on both sides from the twin's forward */
    float *hout = gt_host_alloc(nq), *hlse = gt_host_alloc(nl);
    gt_download(t, &O, hout, NULL);
    gt_download(t, &L, hlse, NULL);
    gt_set(t, &O, hout);
    gt_set(t, &L, hlse);
    const bool cpu_bwd = t->cpu->ops->attention_bwd_tc(t->sc, GT_C(DQ), GT_C(DK), GT_C(DV), GT_C(DO), GT_C(Q),
                                                       GT_C(K), GT_C(V), GT_C(O), MT_F32, GT_C(L), klc, NULL, B, T, nh,
                                                       nkv, hd, window);
    gt_expect(t, cpu_bwd, "CPU twin refused the backward of %s", tag);
    const bool gpu_bwd = t->gpu->ops->attention_bwd_tc(t->sg, GT_G(DQ), GT_G(DK), GT_G(DV), GT_G(DO), GT_G(Q),
                                                       GT_G(K), GT_G(V), GT_G(O), MT_F32, GT_G(L), klg, NULL, B, T, nh,
                                                       nkv, hd, window);
    bool det = false;
    float *dq1 = gt_host_alloc(nq), *dk1 = gt_host_alloc(nk), *dv1 = gt_host_alloc(nk);
    if (path_of(t, gpu_bwd, must, "backward", tag, &det) && cpu_bwd) {
        const gt_buf_t *outs[3] = {&DQ, &DK, &DV};
        const size_t ns[3] = {nq, nk, nk};
        const char *names[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3; i++) {
            snprintf(what, sizeof what, "tc backward %s %s", names[i], tag);
            gt_check_f32_norm(t, what, outs[i], ns[i], 2e-2f, 1e-2f);
        }
        if (det) {
            gt_save_gpu(t, &DQ, dq1);
            gt_save_gpu(t, &DK, dk1);
            gt_save_gpu(t, &DV, dv1);
            t->gpu->ops->attention_bwd_tc(t->sg, GT_G(DQ), GT_G(DK), GT_G(DV), GT_G(DO), GT_G(Q), GT_G(K),
                                          GT_G(V), GT_G(O), MT_F32, GT_G(L), klg, NULL, B, T, nh, nkv, hd, window);
            snprintf(what, sizeof what, "tc backward repeated %s", tag);
            gt_check_same_gpu(t, what, &DQ, dq1);
            gt_check_same_gpu(t, what, &DK, dk1);
            gt_check_same_gpu(t, what, &DV, dv1);
        }
    }
    if (gpu_fwd && gpu_bwd) {
        const float *g1[3] = {dq1, dk1, dv1};
        bf16_storage_case(t, tag, &Q, &K, &V, &DO, &O, &L, o1, l1, det ? g1 : NULL, klg, B, T, nh, nkv, hd, window);
    }
    gt_buf_t *bufs[] = {&Q, &K, &V, &DO, &O, &L, &DQ, &DK, &DV};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    if (kv_len) gt_free(t, &KL);
    float *hs[] = {hq, hk, hv, hdo, o1, l1, hout, hlse, dq1, dk1, dv1};
    for (size_t i = 0; i < sizeof hs / sizeof hs[0]; i++) free(hs[i]);
}

/* Shapes both paths refuse by rule: neither may touch the outputs. */
static void refused_case(gt_ctx_t *t, int nh, int nkv, int hd, bool segments) {
    const int B = 1, T = 24;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    float *hq = gt_host_rand(t, nq, 1.0f), *hk = gt_host_rand(t, nk, 1.0f);
    int32_t seg[24];
    for (int i = 0; i < T; i++) seg[i] = i < 10 ? 0 : 10;
    gt_buf_t Q = gt_from_host(t, hq, nq * 4, "q"), K = gt_from_host(t, hk, nk * 4, "k");
    gt_buf_t O = gt_alloc(t, nq * 4, "out"), L = gt_alloc(t, nl * 4, "lse");
    gt_buf_t S = gt_from_host(t, seg, sizeof seg, "seg_start");
    const int32_t *sc = segments ? GT_CI(S) : NULL, *sg = segments ? GT_GI(S) : NULL;
    const bool c = t->cpu->ops->attention_fwd_tc(t->sc, GT_C(O), GT_C(L), GT_C(Q), GT_C(K), GT_C(K), MT_F32, NULL, sc, B,
                                                 T, nh, nkv, hd, 0);
    const bool g = t->gpu->ops->attention_fwd_tc(t->sg, GT_G(O), GT_G(L), GT_G(Q), GT_G(K), GT_G(K), MT_F32, NULL, sg, B,
                                                 T, nh, nkv, hd, 0);
    kern_cudnn_attn_report_t r;
    kern_cudnn_attn_last(t->sg, &r);
    printf("  refused heads=%d/%d hd=%d%s: CPU %s, GPU %s (%s)\n", nh, nkv, hd, segments ? " segments" : "",
           c ? "ran" : "refused", g ? "ran" : "refused", r.why);
    gt_expect(t, !c && !g, "heads %d/%d hd %d%s: both tc paths must refuse (CPU %d, GPU %d)", nh, nkv, hd,
              segments ? " with segments" : "", c, g);
    float *oc = gt_host_alloc(nq), *og = gt_host_alloc(nq);
    gt_download(t, &O, oc, og);
    gt_expect(t, isnan(og[0]) && isnan(oc[0]), "a refused call wrote its output");
    gt_buf_t *bufs[] = {&Q, &K, &O, &L, &S};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) gt_free(t, bufs[i]);
    free(hq), free(hk), free(oc), free(og);
}

/* ---- benchmark ---- */

typedef struct {
    kern_device_t *dev;
    kern_stream_t *s;
    float *q, *k, *v, *o, *l, *dout, *dq, *dk, *dv;
    int T, nh, nkv, hd;
} bench_t;

static int cmp_float(const void *a, const void *b) {
    const float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* Median milliseconds of 10 calls after 3 warm-ups; -1 if not handled. */
static float bench_ms(bench_t *b, int which) {
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    float ms[10];
    for (int it = -3; it < 10; it++) {
        cudaEventRecord(e0, b->s->cs);
        bool ok = true;
        switch (which) {
        case 0: ok = b->dev->ops->attention_fwd_tc(b->s, b->o, b->l, b->q, b->k, b->v, MT_F32, NULL, NULL, 1, b->T, b->nh,
                                                   b->nkv, b->hd, 0); break;
        case 1: b->dev->ops->attention_fwd(b->s, b->o, b->l, b->q, b->k, b->v, NULL, NULL, 1, b->T, b->nh, b->nkv,
                                           b->hd, 0); break;
        case 2: ok = b->dev->ops->attention_bwd_tc(b->s, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v, b->o, MT_F32, b->l,
                                                   NULL, NULL, 1, b->T, b->nh, b->nkv, b->hd, 0); break;
        default: b->dev->ops->attention_bwd(b->s, b->dq, b->dk, b->dv, b->dout, b->q, b->k, b->v, b->o, b->l, NULL,
                                            NULL, 1, b->T, b->nh, b->nkv, b->hd, 0); break;
        }
        cudaEventRecord(e1, b->s->cs);
        cudaEventSynchronize(e1);
        if (!ok) return -1.0f;
        if (it >= 0) cudaEventElapsedTime(&ms[it], e0, e1);
    }
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    qsort(ms, 10, sizeof ms[0], cmp_float);
    return 0.5f * (ms[4] + ms[5]);
}

static void bench_case(gt_ctx_t *t, kern_device_t *dev, int nh, int nkv, const char *model) {
    bench_t b = {.dev = dev, .s = kern_stream(dev, KERN_STREAM_COMPUTE), .T = 4096, .nh = nh, .nkv = nkv, .hd = 128};
    const size_t nq = (size_t)b.T * nh * b.hd, nk = (size_t)b.T * nkv * b.hd, nl = (size_t)nh * b.T;
    float **bufs[] = {&b.q, &b.o, &b.dout, &b.dq, &b.k, &b.v, &b.dk, &b.dv, &b.l};
    const size_t ns[] = {nq, nq, nq, nq, nk, nk, nk, nk, nl};
    mt_error_t err;
    for (int i = 0; i < 9; i++) {
        *bufs[i] = kern_alloc(dev, ns[i] * 4, "bench", &err);
        if (*bufs[i] == NULL) {
            gt_expect(t, false, "bench allocation: %s", err.msg);
            return;
        }
        float *h = gt_host_rand(t, ns[i], 1.0f);
        kern_memcpy_h2d(dev, b.s, *bufs[i], h, ns[i] * 4);
        kern_stream_sync(dev, b.s);
        free(h);
    }
    /* the backward's out and lse from a forward of these inputs */
    dev->ops->attention_fwd(b.s, b.o, b.l, b.q, b.k, b.v, NULL, NULL, 1, b.T, nh, nkv, b.hd, 0);
    kern_stream_sync(dev, b.s);
    const double fwd_flop = 2.0 * 2.0 * nh * (double)b.T * b.T * b.hd / 2.0, bwd_flop = 2.5 * fwd_flop;
    const float f_tc = bench_ms(&b, 0), f_32 = bench_ms(&b, 1), b_tc = bench_ms(&b, 2), b_32 = bench_ms(&b, 3);
    kern_cudnn_attn_report_t r;
    kern_cudnn_attn_last(b.s, &r);
#define TF(flop, ms) ((ms) > 0 ? (flop) / ((double)(ms) * 1e-3) / 1e12 : 0.0)
    printf("bench attention B=1 T=%d hd=%d heads=%d/%d (%s) causal: forward cuDNN bf16 %.1f TFLOP/s (%.2f ms), "
           "fp32 kernel %.1f TFLOP/s (%.2f ms); backward cuDNN bf16 %.1f TFLOP/s (%.2f ms%s), fp32 kernel %.1f "
           "TFLOP/s (%.2f ms)\n",
           b.T, b.hd, nh, nkv, model, TF(fwd_flop, f_tc), f_tc, TF(fwd_flop, f_32), f_32, TF(bwd_flop, b_tc), b_tc,
           b_tc < 0 ? ", not handled" : (r.deterministic ? ", deterministic" : ", NOT deterministic"),
           TF(bwd_flop, b_32), b_32);
#undef TF
    if (f_tc < 0 || b_tc < 0) printf("bench: cuDNN path not handled: %s\n", r.why);
    gt_expect(t, f_tc > 0 && b_tc > 0, "bench %s: the cuDNN path must handle T=4096 hd=128: %s", model, r.why);
    for (int i = 0; i < 9; i++) kern_free(dev, *bufs[i]);
}

/* On a device of its own: the deterministic backward's dP workspace
 * (B * nh * T^2 * 2 bytes, 1 GiB here) outgrows the suite's 1 GiB budget. */
static void bench(gt_ctx_t *t) {
    kern_device_opts_t o = {.device_budget_bytes = (size_t)8 << 30};
    kern_device_t *dev = NULL;
    mt_error_t err;
    if (kern_device_create(KERN_BACKEND_CUDA, &o, &dev, &err) != MT_OK) {
        gt_expect(t, false, "bench device: %s", err.msg);
        return;
    }
    bench_case(t, dev, 32, 4, "Qwen3-30B-A3B");
    bench_case(t, dev, 32, 8, "Mixtral-8x7B");
    kern_device_destroy(dev);
}

int main(void) {
    gt_ctx_t t;
    gt_open(&t, "attention_tc_test", 0x7c0d);
    printf("cuDNN %zu\n", kern_cudnn_version());
    tc_case(&t, 1, 1, 1, 1, 64, 0, NULL, true);
    tc_case(&t, 2, 100, 8, 2, 64, 0, NULL, true);   /* GQA group 4, T not a multiple of 64 */
    tc_case(&t, 1, 257, 8, 1, 128, 0, NULL, true);  /* MQA-like group 8 */
    tc_case(&t, 2, 130, 4, 4, 128, 0, NULL, true);  /* MHA */
    tc_case(&t, 1, 77, 4, 2, 256, 0, NULL, false);  /* largest head dim */
    tc_case(&t, 1, 96, 4, 2, 80, 0, NULL, true);    /* a multiple of 8 that is not of 32 */
    tc_case(&t, 1, 200, 8, 2, 128, 64, NULL, false); /* sliding window */
    tc_case(&t, 2, 100, 4, 2, 64, 1, NULL, false);  /* window 1: each query sees itself */
    const int32_t k1[2] = {37, 100}, k2[2] = {0, 150}, k3[1] = {70}, k4[2] = {40, 90};
    tc_case(&t, 2, 100, 8, 2, 64, 0, k1, true);     /* key padding; a full row */
    tc_case(&t, 2, 100, 4, 1, 128, 0, k2, true);    /* a row with no key; > T (clamped) */
    tc_case(&t, 1, 129, 4, 2, 128, 0, k3, true);
    tc_case(&t, 2, 100, 8, 2, 128, 16, k4, false);  /* window + padding: padded queries see nothing */
    refused_case(&t, 4, 2, 64, true);                /* packed segments */
    refused_case(&t, 4, 2, 36, false);               /* head dim not a multiple of 8 */
    refused_case(&t, 6, 4, 64, false);               /* heads not a multiple of kv heads */
    printf("%d tc calls fell back to the fp32 kernel\n", g_fallbacks);
    bench(&t);
    return gt_close(&t);
}
