/* Causal GQA attention on the CPU through OpenBLAS: the path for CPUs
 * without AVX-512 (attention.c picks it; see there why).
 *
 * Keys at or past a row's kv_len, and keys before a query's example start
 * (seg_start), are masked like the causal upper triangle; a query with no
 * key left gets out = 0, lse = -inf and a zero
 * probability row in backward (so dq = 0 and it adds nothing to dk, dv).
 *
 * Per (batch, query head) the scores are one sgemm over the strided q and k
 * rows, masked and soft-maxed row by row, then one sgemm with v.  Only the
 * row logsumexp is saved; backward recomputes the probabilities (the same
 * trade as flash attention, so saved activations stay O(T), not O(T^2)).
 * The upper triangle is computed and discarded: at the sequence lengths the
 * CPU backend runs, one full sgemm beats a blocked triangular product. */
#include "kernels/cpu/attention_blas.h"

#include "base/dtype.h"

#include <cblas.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static inline int key_allowed(int i, int j, int window, int kvl, int seg) {
    return j <= i && (window <= 0 || i - j < window) && j < kvl && j >= seg;
}

/* The first key of query (b, i)'s example (attention.h): 0 without segments. */
static inline int row_seg(const int32_t *seg_start, int b, int i, int T) {
    if (!seg_start) return 0;
    const int s = seg_start[(size_t)b * T + i];
    return s < 0 ? 0 : s > i ? i : s;
}

/* Row b's valid keys, kv_len clamped to [0, T] (attention.h). */
static inline int row_kv_len(const int32_t *kv_len, int b, int T) {
    return !kv_len || kv_len[b] >= T ? T : kv_len[b] < 0 ? 0 : kv_len[b];
}

/* The tensor-core twin's bf16 rounding of a probability or dS element. */
static inline float round_bf16(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }

void kern_attention_fwd_cpu_blas(kern_stream_t *s, float *out, float *lse, const float *q,
                                 const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                                 int nh, int nkv, int hd, int window) {
    kern_attention_fwd_cpu_blas_p(s, out, lse, q, k, v, kv_len, seg_start, B, T, nh, nkv, hd, window, false);
}

void kern_attention_fwd_cpu_blas_p(kern_stream_t *s, float *out, float *lse, const float *q, const float *k,
                                   const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                                   int nh, int nkv, int hd, int window, bool bf16_p) {
    (void)s;
    const int group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const int ldq = nh * hd, ldk = nkv * hd;
    float *S = malloc((size_t)T * T * sizeof *S);
    MT_CHECK_ALLOC(S, "attention scores");
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int hk = h / group, kvl = row_kv_len(kv_len, b, T);
            const float *qb = q + (size_t)b * T * ldq + (size_t)h * hd;
            const float *kb = k + (size_t)b * T * ldk + (size_t)hk * hd;
            const float *vb = v + (size_t)b * T * ldk + (size_t)hk * hd;
            float *ob = out + (size_t)b * T * ldq + (size_t)h * hd;
            float *lb = lse + ((size_t)b * nh + h) * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, qb, ldq, kb, ldk,
                        0.0f, S, T);
            for (int i = 0; i < T; i++) {
                float *row = S + (size_t)i * T;
                const int seg = row_seg(seg_start, b, i, T);
                float mx = -INFINITY;
                for (int j = 0; j < T; j++)
                    if (key_allowed(i, j, window, kvl, seg) && row[j] > mx) mx = row[j];
                if (mx == -INFINITY) { /* no key to see: out = 0, lse = -inf (attention.h) */
                    memset(row, 0, (size_t)T * sizeof *row);
                    lb[i] = -INFINITY;
                    continue;
                }
                double sum = 0.0;
                for (int j = 0; j < T; j++) {
                    float p = key_allowed(i, j, window, kvl, seg) ? expf(row[j] - mx) : 0.0f;
                    row[j] = p;
                    sum += p;
                }
                const float inv = (float)(1.0 / sum);
                for (int j = 0; j < T; j++) row[j] *= inv;
                if (bf16_p)
                    for (int j = 0; j < T; j++) row[j] = round_bf16(row[j]);
                lb[i] = mx + (float)log(sum);
            }
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, 1.0f, S, T, vb, ldk,
                        0.0f, ob, ldq);
        }
    free(S);
}

void kern_attention_bwd_cpu_blas(kern_stream_t *s, float *dq, float *dk, float *dv,
                                 const float *dout, const float *q, const float *k, const float *v,
                                 const float *out, const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B,
                                 int T, int nh, int nkv, int hd, int window) {
    kern_attention_bwd_cpu_blas_p(s, dq, dk, dv, dout, q, k, v, out, lse, kv_len, seg_start, B, T, nh, nkv, hd, window,
                                  false);
}

void kern_attention_bwd_cpu_blas_p(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                                   const float *q, const float *k, const float *v, const float *out, const float *lse,
                                   const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                   int hd, int window, bool bf16_p) {
    (void)s;
    const int group = nh / nkv;
    const float scale = 1.0f / sqrtf((float)hd);
    const int ldq = nh * hd, ldk = nkv * hd;
    float *P = malloc((size_t)T * T * sizeof *P);
    float *dP = malloc((size_t)T * T * sizeof *dP);
    float *D = malloc((size_t)T * sizeof *D);
    MT_CHECK(P && dP && D, "out of host memory allocating attention backward scratch");
    memset(dk, 0, (size_t)B * T * ldk * sizeof *dk);
    memset(dv, 0, (size_t)B * T * ldk * sizeof *dv);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int hk = h / group, kvl = row_kv_len(kv_len, b, T);
            const size_t qoff = (size_t)b * T * ldq + (size_t)h * hd;
            const size_t koff = (size_t)b * T * ldk + (size_t)hk * hd;
            const float *lb = lse + ((size_t)b * nh + h) * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, scale, q + qoff, ldq,
                        k + koff, ldk, 0.0f, P, T);
            for (int i = 0; i < T; i++) {
                float *row = P + (size_t)i * T;
                const int seg = row_seg(seg_start, b, i, T);
                for (int j = 0; j < T; j++)
                    row[j] = key_allowed(i, j, window, kvl, seg) ? expf(row[j] - lb[i]) : 0.0f;
                const float *o = out + qoff + (size_t)i * ldq, *d = dout + qoff + (size_t)i * ldq;
                double acc = 0.0;
                for (int c = 0; c < hd; c++) acc += (double)o[c] * d[c];
                D[i] = (float)acc;
            }
            /* dP = dout v^T, then dS = P * (dP - D) in place (from the fp32 P) */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hd, 1.0f, dout + qoff, ldq,
                        v + koff, ldk, 0.0f, dP, T);
            for (int i = 0; i < T; i++) {
                float *pr = P + (size_t)i * T, *dr = dP + (size_t)i * T;
                for (int j = 0; j < T; j++) dr[j] = pr[j] * (dr[j] - D[i]);
                if (bf16_p) /* the twin: P and dS enter their products in bf16 */
                    for (int j = 0; j < T; j++) pr[j] = round_bf16(pr[j]), dr[j] = round_bf16(dr[j]);
            }
            /* dv += P^T dout */
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, 1.0f, P, T, dout + qoff,
                        ldq, 1.0f, dv + koff, ldk);
            /* dq = dS k * scale (overwrite), dk += dS^T q * scale */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hd, T, scale, dP, T, k + koff,
                        ldk, 0.0f, dq + qoff, ldq);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hd, T, scale, dP, T, q + qoff,
                        ldq, 1.0f, dk + koff, ldk);
        }
    free(P);
    free(dP);
    free(D);
}
