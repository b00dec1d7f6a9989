/* Tensor-core attention (kernels/attention.h, the _tc entry points) through
 * cuDNN's fused scaled-dot-product attention, built with the backend C API.
 *
 * The graphs, and the choice of an engine for them, are in
 * attention_cudnn_graph.c; this file keeps the plans per stream and shape,
 * and runs them.
 *
 * Layout: q (B, T, nh, hd) is the BSHD layout cuDNN reads through strides,
 * dims [B, H, S, D] with strides [T*H*D, D, H*D, 1]; K^T and V^T are the same
 * memory with the last two dims and strides swapped.  lse (B, nh, T) is
 * cuDNN's Stats [B, H, S, 1] as is.
 *
 * Failures: every cuDNN call is checked; a shape cuDNN refuses (graph,
 * heuristics, plan) is remembered with cuDNN's message and the call returns
 * false so the caller runs the fp32 kernel.  Nothing here aborts on a cuDNN
 * error. */
#include "kernels/cudnn/attention_cudnn.h"

#include <math.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cudnn.h>

#include "base/status.h"
#include "kernels/attention.h"
#include "kernels/cuda/backend_cuda_internal.h"
#include "kernels/cudnn/attention_cudnn_graph.h"
#include "kernels/elementwise.h"

struct kern_cudnn_attn {
    cudnnHandle_t handle; /* bound to the stream */
    bool handle_failed;
    char handle_why[384];
    tc_plan_t *plans;
    kern_cudnn_attn_report_t last;
};

/* ---- the per-stream cache ---- */

void kern_cudnn_attn_free(kern_cudnn_attn_t *c) {
    if (c == NULL) return;
    for (tc_plan_t *p = c->plans, *next; p; p = next) {
        next = p->next;
        kern_cudnn_plan_clear(p);
        free(p);
    }
    if (c->handle) cudnnDestroy(c->handle);
    free(c);
}

size_t kern_cudnn_version(void) { return cudnnGetVersion(); }

static kern_cudnn_attn_t *tc_cache(kern_stream_t *s) {
    if (s->cudnn_attn) return s->cudnn_attn;
    kern_cudnn_attn_t *c = calloc(1, sizeof *c);
    MT_CHECK_ALLOC(c, "cuDNN attention cache");
    cudnnStatus_t st = cudnnCreate(&c->handle);
    if (st == CUDNN_STATUS_SUCCESS) {
        st = cudnnSetStream(c->handle, s->cs);
        if (st != CUDNN_STATUS_SUCCESS) kern_cudnn_status_text(st, "cudnnSetStream", c->handle_why, sizeof c->handle_why);
    } else {
        c->handle = NULL;
        kern_cudnn_status_text(st, "cudnnCreate", c->handle_why, sizeof c->handle_why);
    }
    c->handle_failed = st != CUDNN_STATUS_SUCCESS;
    s->cudnn_attn = c;
    return c;
}

static bool tc_report(kern_cudnn_attn_t *c, bool handled, bool det, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static bool tc_report(kern_cudnn_attn_t *c, bool handled, bool det, const char *fmt, ...) {
    c->last.handled = handled;
    c->last.deterministic = det;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last.why, sizeof c->last.why, fmt, ap);
    va_end(ap);
    return handled;
}

void kern_cudnn_attn_last(kern_stream_t *s, kern_cudnn_attn_report_t *out) {
    memset(out, 0, sizeof *out);
    if (s == NULL || s->cudnn_attn == NULL) {
        snprintf(out->why, sizeof out->why, "no tensor-core attention call on this stream yet");
        return;
    }
    *out = s->cudnn_attn->last;
}

static bool tc_key_eq(const tc_key_t *a, const tc_key_t *b) {
    return a->B == b->B && a->T == b->T && a->nh == b->nh && a->nkv == b->nkv && a->hd == b->hd &&
           a->window == b->window && a->pad == b->pad && a->seg == b->seg && a->bwd == b->bwd;
}

static tc_key_t tc_key(int B, int T, int nh, int nkv, int hd, int window, bool pad, bool seg, bool bwd) {
    tc_key_t k;
    k.B = B, k.T = T, k.nh = nh, k.nkv = nkv, k.hd = hd;
    k.window = window > 0 && window < T ? window : 0;
    k.pad = pad, k.seg = seg, k.bwd = bwd;
    return k;
}

/* The plan for key, built (and its outcome logged) on first use. */
static tc_plan_t *tc_plan_get(kern_cudnn_attn_t *c, const tc_key_t *key) {
    for (tc_plan_t *p = c->plans; p; p = p->next)
        if (tc_key_eq(&p->key, key)) return p;
    tc_plan_t *p = calloc(1, sizeof *p);
    MT_CHECK_ALLOC(p, "cuDNN attention plan");
    p->key = *key;
    const tc_key_t *k = key;
    if (k->seg)
        snprintf(p->why, sizeof p->why, "packed segments (seg_start) are not expressed in the cuDNN graph");
    else if (!kern_attention_tc_takes(k->nh, k->nkv, k->hd) && (k->nkv <= 0 || k->nh % k->nkv != 0))
        snprintf(p->why, sizeof p->why, "%d query heads are not a multiple of %d kv heads", k->nh, k->nkv);
    else if (!kern_attention_tc_takes(k->nh, k->nkv, k->hd))
        snprintf(p->why, sizeof p->why, "head dim %d: cuDNN's SDPA takes multiples of 8 up to 256", k->hd);
    else if (c->handle_failed)
        snprintf(p->why, sizeof p->why, "%s", c->handle_why);
    else
        kern_cudnn_plan_build(c->handle, p);
    fprintf(stderr,
            "moetune: attention %s B %d T %d heads %d/%d head dim %d window %d%s: %s%s%s\n",
            k->bwd ? "backward" : "forward", k->B, k->T, k->nh, k->nkv, k->hd, k->window,
            k->pad ? " key padding" : "", p->ok ? "cuDNN SDPA" : "fp32 kernel, ",
            p->ok ? (p->deterministic ? " (deterministic)" : " (NOT deterministic: dQ accumulated with atomics)") : "",
            p->ok ? "" : p->why);
    p->next = c->plans;
    c->plans = p;
    return p;
}

/* ---- execution ---- */

static bool tc_execute(kern_cudnn_attn_t *c, tc_plan_t *p, const int64_t *uids, void *const *ptrs, int n,
                       void *workspace, char *why, size_t why_len) {
    cudnnBackendDescriptor_t vp = NULL;
    cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &vp);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
    if (st == CUDNN_STATUS_SUCCESS)
        st = cudnnBackendSetAttribute(vp, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &workspace);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(vp);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(c->handle, p->plan, vp);
    if (vp) cudnnBackendDestroyDescriptor(vp);
    if (st != CUDNN_STATUS_SUCCESS) kern_cudnn_status_text(st, "execute", why, why_len);
    return st == CUDNN_STATUS_SUCCESS;
}

/* Carves one arena block into aligned pieces. */
typedef struct {
    size_t off;
} tc_carve_t;

static size_t tc_take(tc_carve_t *cv, size_t bytes) {
    const size_t at = cv->off;
    cv->off += (bytes + TC_ALIGN - 1) / TC_ALIGN * TC_ALIGN;
    return at;
}

/* What the tc entry points share: the stream's cache and the plan for the
 * call, or false (reported) when the call is not handled. */
static bool tc_begin(kern_stream_t *s, const tc_key_t *key, kern_cudnn_attn_t **c, tc_plan_t **p) {
    kern_cuda_stream_begin(s);
    *c = tc_cache(s);
    *p = tc_plan_get(*c, key);
    if (!(*p)->ok) return tc_report(*c, false, false, "%s", (*p)->why);
    return true;
}

static void *tc_alloc(kern_stream_t *s, kern_cudnn_attn_t *c, tc_plan_t *p, size_t bytes) {
    mt_error_t err;
    memset(&err, 0, sizeof err);
    void *mem = kern_alloc(&s->dev->base, bytes, "cuDNN attention (bf16 copies and workspace)", &err);
    if (mem != NULL) return mem;
    tc_report(c, false, false, "no device memory for cuDNN attention's %zu bytes: %s", bytes, err.msg);
    if (!p->mem_logged)
        fprintf(stderr, "moetune: attention %s B %d T %d heads %d/%d head dim %d: fp32 kernel, %s\n",
                p->key.bwd ? "backward" : "forward", p->key.B, p->key.T, p->key.nh, p->key.nkv, p->key.hd,
                c->last.why);
    p->mem_logged = true;
    return NULL;
}

/* A bf16 operand of the graph: src itself when the caller stores bf16, else
 * its rounding into dst (arena memory the caller carved). */
static const uint16_t *tc_operand(kern_stream_t *s, uint16_t *dst, const void *src, mt_dtype_t dt, size_t n) {
    if (dt == MT_BF16) return (const uint16_t *)src;
    kern_f32_to_bf16_cuda(s, dst, (const float *)src, n);
    return dst;
}

bool kern_attention_fwd_tc_cuda(kern_stream_t *s, void *out, float *lse, const void *q, const void *k, const void *v,
                                mt_dtype_t dt, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh,
                                int nkv, int hd, int window) {
    const tc_key_t key = tc_key(B, T, nh, nkv, hd, window, kv_len != NULL, seg_start != NULL, false);
    kern_cudnn_attn_t *c = NULL;
    tc_plan_t *p = NULL;
    MT_CHECK(dt == MT_F32 || dt == MT_BF16, "tensor-core attention: q, k, v, out stored as %s (F32 or BF16 only)",
             mt_dtype_name(dt));
    if (B <= 0 || T <= 0) return true; /* nothing to compute */
    if (!tc_begin(s, &key, &c, &p)) return false;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    const size_t copy = dt == MT_BF16 ? 0 : 2; /* bytes per element of the bf16 copies, none for bf16 storage */
    tc_carve_t cv = {0};
    const size_t oq = tc_take(&cv, nq * copy), ok = tc_take(&cv, nk * copy), ov = tc_take(&cv, nk * copy);
    const size_t oo = tc_take(&cv, nq * copy), osq = tc_take(&cv, (size_t)B * 4), oskv = tc_take(&cv, (size_t)B * 4);
    const size_t ows = tc_take(&cv, (size_t)p->workspace);
    char *mem = tc_alloc(s, c, p, cv.off);
    if (mem == NULL) return false;
    const uint16_t *q16 = tc_operand(s, (uint16_t *)(mem + oq), q, dt, nq);
    const uint16_t *k16 = tc_operand(s, (uint16_t *)(mem + ok), k, dt, nk);
    const uint16_t *v16 = tc_operand(s, (uint16_t *)(mem + ov), v, dt, nk);
    uint16_t *o16 = dt == MT_BF16 ? (uint16_t *)out : (uint16_t *)(mem + oo);
    int32_t *seq_q = (int32_t *)(mem + osq), *seq_kv = (int32_t *)(mem + oskv);
    if (key.pad) kern_attention_tc_seqlens_cuda(s, seq_q, seq_kv, kv_len, B, T);
    int64_t uids[12] = {U_Q, U_K, U_V, U_O, U_STATS, U_SCALE, U_NEG_INF};
    void *ptrs[12] = {(void *)q16, (void *)k16, (void *)v16, o16, lse, &p->scale, &p->neg_inf};
    int n = 7;
    if (key.window) uids[n] = U_WINDOW, ptrs[n++] = &p->window;
    if (key.pad) uids[n] = U_SEQ_Q, ptrs[n++] = seq_q, uids[n] = U_SEQ_KV, ptrs[n++] = seq_kv;
    char why[512];
    const bool done = tc_execute(c, p, uids, ptrs, n, mem + ows, why, sizeof why);
    if (done) {
        if (dt == MT_F32) kern_bf16_to_f32_cuda(s, (float *)out, o16, nq);
        if (key.pad) kern_attention_tc_empty_rows_cuda(s, out, dt == MT_BF16, lse, kv_len, B, T, nh, hd, key.window);
    }
    kern_free(&s->dev->base, mem);
    return done ? tc_report(c, true, true, "cudnn") : tc_report(c, false, false, "%s", why);
}

bool kern_attention_bwd_tc_cuda(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout, const void *q,
                                const void *k, const void *v, const void *out, mt_dtype_t dt, const float *lse,
                                const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                int hd, int window) {
    const tc_key_t key = tc_key(B, T, nh, nkv, hd, window, kv_len != NULL, seg_start != NULL, true);
    kern_cudnn_attn_t *c = NULL;
    tc_plan_t *p = NULL;
    MT_CHECK(dt == MT_F32 || dt == MT_BF16, "tensor-core attention: q, k, v, out stored as %s (F32 or BF16 only)",
             mt_dtype_name(dt));
    if (B <= 0 || T <= 0) return true;
    if (!tc_begin(s, &key, &c, &p)) return false;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nr = (size_t)B * nh * T;
    const size_t copy = dt == MT_BF16 ? 0 : 2;
    tc_carve_t cv = {0};
    const size_t oq = tc_take(&cv, nq * copy), ok = tc_take(&cv, nk * copy), ov = tc_take(&cv, nk * copy);
    const size_t oo = tc_take(&cv, nq * copy), odo = tc_take(&cv, nq * 2), odq = tc_take(&cv, nq * 2);
    const size_t odk = tc_take(&cv, nk * 2), odv = tc_take(&cv, nk * 2), ost = tc_take(&cv, nr * 4);
    const size_t osum = tc_take(&cv, nr * 4), oacc = tc_take(&cv, p->dq_accum ? nq * 4 : 0);
    const size_t osq = tc_take(&cv, (size_t)B * 4), oskv = tc_take(&cv, (size_t)B * 4);
    const size_t ows = tc_take(&cv, (size_t)p->workspace);
    char *mem = tc_alloc(s, c, p, cv.off);
    if (mem == NULL) return false;
    const uint16_t *q16 = tc_operand(s, (uint16_t *)(mem + oq), q, dt, nq);
    const uint16_t *k16 = tc_operand(s, (uint16_t *)(mem + ok), k, dt, nk);
    const uint16_t *v16 = tc_operand(s, (uint16_t *)(mem + ov), v, dt, nk);
    const uint16_t *o16 = tc_operand(s, (uint16_t *)(mem + oo), out, dt, nq);
    const uint16_t *do16 = tc_operand(s, (uint16_t *)(mem + odo), dout, MT_F32, nq);
    uint16_t *dq16 = (uint16_t *)(mem + odq), *dk16 = (uint16_t *)(mem + odk), *dv16 = (uint16_t *)(mem + odv);
    float *stats = key.pad ? (float *)(mem + ost) : (float *)lse; /* cuDNN only reads it */
    int32_t *seq_q = (int32_t *)(mem + osq), *seq_kv = (int32_t *)(mem + oskv);
    if (key.pad) {
        kern_attention_tc_seqlens_cuda(s, seq_q, seq_kv, kv_len, B, T);
        kern_attention_tc_bwd_stats_cuda(s, stats, lse, nr);
    }
    int64_t uids[20] = {U_Q, U_K, U_V, U_O, U_DO, U_STATS, U_DQ, U_DK, U_DV, U_SCALE, U_NEG_INF, U_ONE, U_SOFTMAX_SUM};
    void *ptrs[20] = {(void *)q16, (void *)k16, (void *)v16, (void *)o16, (void *)do16, stats, dq16, dk16, dv16,
                      &p->scale, &p->neg_inf, &p->one, mem + osum};
    int n = 13;
    if (p->dq_accum) uids[n] = U_DQ_ACCUM, ptrs[n++] = mem + oacc;
    if (key.window) uids[n] = U_WINDOW, ptrs[n++] = &p->window;
    if (key.pad) uids[n] = U_SEQ_Q, ptrs[n++] = seq_q, uids[n] = U_SEQ_KV, ptrs[n++] = seq_kv;
    char why[512];
    const bool done = tc_execute(c, p, uids, ptrs, n, mem + ows, why, sizeof why);
    if (done) {
        kern_bf16_to_f32_cuda(s, dq, dq16, nq);
        kern_bf16_to_f32_cuda(s, dk, dk16, nk);
        kern_bf16_to_f32_cuda(s, dv, dv16, nk);
    }
    kern_free(&s->dev->base, mem);
    return done ? tc_report(c, true, p->deterministic, "cudnn") : tc_report(c, false, false, "%s", why);
}
