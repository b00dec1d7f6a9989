/* Causal GQA attention with the key-padding mask on the CPU (see attention.h).
 *
 * Why it is shaped this way
 * - One task per (batch, kv head) over the backend's pool; a task runs the
 *   kv head's query heads in order and owns everything it writes (their
 *   out/lse/dq rows, and the kv head's dk/dv rows), so results do not
 *   depend on the number of threads. No BLAS inside tasks: OpenBLAS runs
 *   its own threads, and calling it from two of ours at once would fight
 *   them.
 * - Query rows go in blocks of AR = 4; a block only visits key columns up
 *   to its last row (and from its first row's window start), in 16-wide
 *   vectors: the causal upper triangle is skipped, not computed and
 *   discarded. Scores are q.k summed over the head dimension in order
 *   (c = 0..hd-1), times 1/sqrt(hd); K is transposed once per task into
 *   (hd, T) so a vector holds 16 keys.
 * - Softmax in fp32 with vec.h's exp (<= 1 ulp); row sums in double, in 16
 *   lane partials indexed by key (j mod 16), folded in a fixed tree. Masked
 *   lanes are -inf and contribute exact zeros, so what a row computes does
 *   not depend on which block it is in. Only the row logsumexp is saved;
 *   backward recomputes P (flash-attention style, nothing O(T^2) is kept).
 * - Backward accumulates dk, dv of a kv head over its query heads (in head
 *   order) and rows (in row order) in (hd, T) transposed scratch, so the
 *   updates run over 16 keys per vector with the q / dout values broadcast
 *   once per row block; dk is scaled by 1/sqrt(hd) once at the end.
 * - Packed examples (seg_start): a query's keys start at its example's
 *   first position; the block's range starts at the least of its rows'
 *   starts and mask_row masks each row from its own, like the window.
 * - Padding: a row's keys stop at kv_len[b]. The block's key range ends at
 *   min(last row, kv_len[b] - 1) and mask_row clamps each row there too,
 *   so padded keys are skipped like the upper triangle. A row left with no
 *   key has max -inf: its exps are taken against 0 instead (all zero), its
 *   output is 0 and its lse -inf; backward takes exps against 0 for an lse
 *   of -inf, so its P row is 0. Rows that have keys compute exactly what
 *   they did without kv_len (kv_len NULL or >= T is bit-identical).
 * - This is the AVX-512 path (about 2-3x attention_blas.c's sgemm path on
 *   one core at T = 128, hd = 16, and it runs on every core); other CPUs run
 *   attention_blas.c, see kern_attention_fwd_cpu at the end. */
#include "kernels/attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/cpu/attention_blas.h"
#include "kernels/cpu/par.h"
#include "kernels/cpu/vec.h"
#include "base/status.h"

#define AR 4 /* query rows per block */

typedef struct {
    const float *q, *k, *v, *dout, *out, *lse_in;
    const int32_t *kv_len; /* (B) or NULL */
    const int32_t *seg_start; /* (B, T) or NULL */
    float *o, *lse, *dq, *dk, *dv;
    int B, T, nh, nkv, hd, window;
    float scale;
    bool bf16_p; /* the tensor-core twin: P and dS rounded to bf16 before their products */
} attn_job_t;

static int round16(int x) { return (x + KERN_VL - 1) / KERN_VL * KERN_VL; }

/* x[j] for j in [j0, j1) rounded to bf16 (the twin's P and dS). */
static void round_bf16_range(float *x, int j0, int j1) {
    for (int j = j0; j < j1; j++) x[j] = mt_bf16_to_f32(mt_f32_to_bf16(x[j]));
}

/* Row b's valid keys, kv_len clamped to [0, T] (attention.h). */
static int row_kv_len(const attn_job_t *J, int b) {
    const int T = J->T;
    return !J->kv_len || J->kv_len[b] >= T ? T : J->kv_len[b] < 0 ? 0 : J->kv_len[b];
}

/* The first key query (b, i) may see: the window's start and its example's
 * (seg_start, clamped to [0, i]), whichever is later. */
static int row_lo(const attn_job_t *J, int b, int i) {
    int lo = J->window > 0 && i - J->window + 1 > 0 ? i - J->window + 1 : 0;
    if (J->seg_start) {
        const int s = J->seg_start[(size_t)b * J->T + i];
        const int sc = s < 0 ? 0 : s > i ? i : s;
        if (sc > lo) lo = sc;
    }
    return lo;
}

/* (T, ld) strided rows of width hd -> (hd, Tp) transposed, zero padded. */
static void transpose_pad(float *dst, const float *src, int T, int Tp, int hd, int ld) {
    for (int c = 0; c < hd; c++) {
        float *d = dst + (size_t)c * Tp;
        for (int j = 0; j < T; j++) d[j] = src[(size_t)j * ld + c];
        for (int j = T; j < Tp; j++) d[j] = 0.0f;
    }
}

/* (T, ld) strided rows of width hd -> (T, hdp) contiguous, zero padded. */
static void copy_pad(float *dst, const float *src, int T, int hdp, int hd, int ld) {
    for (int j = 0; j < T; j++) {
        memcpy(dst + (size_t)j * hdp, src + (size_t)j * ld, (size_t)hd * sizeof *dst);
        for (int c = hd; c < hdp; c++) dst[(size_t)j * hdp + c] = 0.0f;
    }
}

/* qs[c * AR + r] = rows[r][c] broadcast, once per row block (a broadcast
 * costs two instructions here; see kern_vf_splat). */
KERN_VINLINE void splat_rows(kern_vf_t *qs, const float *const rows[AR], int hd) {
    for (int c = 0; c < hd; c++)
        for (int r = 0; r < AR; r++) qs[c * AR + r] = kern_vf_splat(rows[r][c]);
}

/* S[r][j] = alpha * sum_c a_r[c] * bT[c][j] for j in [jb0, jb1) (multiples
 * of 16), r < AR, summed over c in order; qs holds the a_r[c] broadcast
 * (splat_rows). Two key vectors at a time when there are two (8
 * independent sums). */
KERN_VINLINE void dot_block(float *S, int Tp, const kern_vf_t *qs, const float *bT, int hd, int jb0,
                            int jb1, float alpha) {
    const kern_vf_t va = kern_vf_splat(alpha);
    int jb = jb0;
    for (; jb + KERN_VL < jb1; jb += 2 * KERN_VL) {
        kern_vf_t s0 = kern_vf_splat(0.0f), s1 = s0, s2 = s0, s3 = s0;
        kern_vf_t t0 = s0, t1 = s0, t2 = s0, t3 = s0;
        for (int c = 0; c < hd; c++) {
            const float *kc = bT + (size_t)c * Tp + jb;
            const kern_vf_t k0 = kern_vf_load(kc), k1 = kern_vf_load(kc + KERN_VL);
            const kern_vf_t *q = qs + c * AR;
            s0 += q[0] * k0, t0 += q[0] * k1;
            s1 += q[1] * k0, t1 += q[1] * k1;
            s2 += q[2] * k0, t2 += q[2] * k1;
            s3 += q[3] * k0, t3 += q[3] * k1;
        }
        kern_vf_store(S + jb, s0 * va);
        kern_vf_store(S + Tp + jb, s1 * va);
        kern_vf_store(S + 2 * (size_t)Tp + jb, s2 * va);
        kern_vf_store(S + 3 * (size_t)Tp + jb, s3 * va);
        kern_vf_store(S + jb + KERN_VL, t0 * va);
        kern_vf_store(S + Tp + jb + KERN_VL, t1 * va);
        kern_vf_store(S + 2 * (size_t)Tp + jb + KERN_VL, t2 * va);
        kern_vf_store(S + 3 * (size_t)Tp + jb + KERN_VL, t3 * va);
    }
    if (jb < jb1) {
        kern_vf_t s0 = kern_vf_splat(0.0f), s1 = s0, s2 = s0, s3 = s0;
        for (int c = 0; c < hd; c++) {
            const kern_vf_t k0 = kern_vf_load(bT + (size_t)c * Tp + jb);
            const kern_vf_t *q = qs + c * AR;
            s0 += q[0] * k0;
            s1 += q[1] * k0;
            s2 += q[2] * k0;
            s3 += q[3] * k0;
        }
        kern_vf_store(S + jb, s0 * va);
        kern_vf_store(S + Tp + jb, s1 * va);
        kern_vf_store(S + 2 * (size_t)Tp + jb, s2 * va);
        kern_vf_store(S + 3 * (size_t)Tp + jb, s3 * va);
    }
}

/* Masking without lane compares (GCC lowers integer-vector compares used
 * as select masks lane by lane): adding keep_first[k] (0 in lanes < k,
 * -inf in the others) keeps the first k lanes of a block and sets the rest
 * to -inf (scores are finite); keep_from[k] keeps lanes >= k. */
typedef struct {
    float keep_first[KERN_VL + 1][KERN_VL];
    float keep_from[KERN_VL + 1][KERN_VL];
} mask_tab_t;

static void mask_tab_init(mask_tab_t *t) {
    for (int k = 0; k <= KERN_VL; k++)
        for (int l = 0; l < KERN_VL; l++) {
            t->keep_first[k][l] = l < k ? 0.0f : -INFINITY;
            t->keep_from[k][l] = l >= k ? 0.0f : -INFINITY;
        }
}

/* Masks row i's scores S[j], j in [jb0, jb1), to the keys it may see
 * (lo <= j <= hi, lo = row_lo, hi = min(i, kvl - 1); the others become
 * -inf) and returns their max (-inf when there are none). */
KERN_VINLINE float mask_row(float *S, const mask_tab_t *mt, int i, int lo, int kvl, int jb0, int jb1) {
    const int hi = i < kvl - 1 ? i : kvl - 1;
    kern_vf_t vmx = kern_vf_splat(-INFINITY);
    for (int jb = jb0; jb < jb1; jb += KERN_VL) {
        kern_vf_t s = kern_vf_load(S + jb);
        if (jb + KERN_VL - 1 > hi) { /* keep lanes j <= hi */
            const int k = hi - jb + 1;
            s = s + kern_vf_load(mt->keep_first[k < 0 ? 0 : k]);
        }
        if (jb < lo) { /* keep lanes j >= lo */
            const int k = lo - jb;
            s = s + kern_vf_load(mt->keep_from[k > KERN_VL ? KERN_VL : k]);
        }
        kern_vf_store(S + jb, s);
        vmx = kern_vf_max(vmx, s);
    }
    return kern_vf_hmax(vmx);
}

/* S[r][j] = exp(S[r][j] - sub[r]) for j in [jb0, jb1), the AR rows side by
 * side (four independent exps in flight); masked keys (-inf) give 0. With
 * sums != NULL, sums[r] = the row's sum in double (16 lane partials by key,
 * fixed fold). */
KERN_VINLINE void exp_rows(float *S, int Tp, const float sub[AR], int jb0, int jb1, double *sums) {
    const kern_vf_t v0 = kern_vf_splat(sub[0]), v1 = kern_vf_splat(sub[1]);
    const kern_vf_t v2 = kern_vf_splat(sub[2]), v3 = kern_vf_splat(sub[3]);
    float *S0 = S, *S1 = S + Tp, *S2 = S + 2 * (size_t)Tp, *S3 = S + 3 * (size_t)Tp;
    kern_vdacc_t a0 = kern_vdacc_zero(), a1 = a0, a2 = a0, a3 = a0;
    for (int jb = jb0; jb < jb1; jb += KERN_VL) {
        const kern_vf_t p0 = kern_vf_exp(kern_vf_load(S0 + jb) - v0);
        const kern_vf_t p1 = kern_vf_exp(kern_vf_load(S1 + jb) - v1);
        const kern_vf_t p2 = kern_vf_exp(kern_vf_load(S2 + jb) - v2);
        const kern_vf_t p3 = kern_vf_exp(kern_vf_load(S3 + jb) - v3);
        kern_vf_store(S0 + jb, p0);
        kern_vf_store(S1 + jb, p1);
        kern_vf_store(S2 + jb, p2);
        kern_vf_store(S3 + jb, p3);
        if (sums) {
            kern_vdacc_add(&a0, p0);
            kern_vdacc_add(&a1, p1);
            kern_vdacc_add(&a2, p2);
            kern_vdacc_add(&a3, p3);
        }
    }
    if (sums) {
        sums[0] = kern_vdacc_hsum(a0);
        sums[1] = kern_vdacc_hsum(a1);
        sums[2] = kern_vdacc_hsum(a2);
        sums[3] = kern_vdacc_hsum(a3);
    }
}

/* acc_r[0..hdp) = sum_{j in [j0, j1]} P[r][j] * X[j][0..hdp) for r < AR; X is
 * (T, hdp). Even and odd j are summed apart (8 independent sums), then
 * added: a fixed order. */
KERN_VINLINE void pv_block(float *acc, int hdp, const float *P, int Tp, const float *X, int j0, int j1) {
    const float *P0 = P, *P1 = P + Tp, *P2 = P + 2 * (size_t)Tp, *P3 = P + 3 * (size_t)Tp;
    for (int cv = 0; cv < hdp; cv += KERN_VL) {
        kern_vf_t a0 = kern_vf_splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
        kern_vf_t b0 = a0, b1 = a0, b2 = a0, b3 = a0;
        int j = j0;
        for (; j < j1; j += 2) {
            const kern_vf_t x = kern_vf_load(X + (size_t)j * hdp + cv);
            const kern_vf_t y = kern_vf_load(X + (size_t)(j + 1) * hdp + cv);
            a0 += kern_vf_splat(P0[j]) * x, b0 += kern_vf_splat(P0[j + 1]) * y;
            a1 += kern_vf_splat(P1[j]) * x, b1 += kern_vf_splat(P1[j + 1]) * y;
            a2 += kern_vf_splat(P2[j]) * x, b2 += kern_vf_splat(P2[j + 1]) * y;
            a3 += kern_vf_splat(P3[j]) * x, b3 += kern_vf_splat(P3[j + 1]) * y;
        }
        if (j == j1) {
            const kern_vf_t x = kern_vf_load(X + (size_t)j * hdp + cv);
            a0 += kern_vf_splat(P0[j]) * x;
            a1 += kern_vf_splat(P1[j]) * x;
            a2 += kern_vf_splat(P2[j]) * x;
            a3 += kern_vf_splat(P3[j]) * x;
        }
        kern_vf_store(acc + cv, a0 + b0);
        kern_vf_store(acc + hdp + cv, a1 + b1);
        kern_vf_store(acc + 2 * (size_t)hdp + cv, a2 + b2);
        kern_vf_store(acc + 3 * (size_t)hdp + cv, a3 + b3);
    }
}

/* dT[c][j] += sum_r W[r][j] * x_r[c] for j in [jb0, jb1), c < hd, r in
 * order; dT is (hd, Tp), W is (AR, Tp) and qs holds the x_r[c] broadcast.
 * Rows of W past the last query row must be zero. */
KERN_VINLINE void rank_update(float *dT, int Tp, const float *W, const kern_vf_t *qs, int hd,
                              int jb0, int jb1) {
    for (int jb = jb0; jb < jb1; jb += KERN_VL) {
        const kern_vf_t w0 = kern_vf_load(W + jb), w1 = kern_vf_load(W + Tp + jb);
        const kern_vf_t w2 = kern_vf_load(W + 2 * (size_t)Tp + jb);
        const kern_vf_t w3 = kern_vf_load(W + 3 * (size_t)Tp + jb);
        for (int c = 0; c < hd; c++) {
            float *d = dT + (size_t)c * Tp + jb;
            const kern_vf_t *q = qs + c * AR;
            kern_vf_store(d, kern_vf_load(d) + w0 * q[0] + w1 * q[1] + w2 * q[2] + w3 * q[3]);
        }
    }
}

/* Block-aligned key range [jb0, jb1) and last key j1 of query rows
 * [i0, i0 + AR) of row b with kvl valid keys, lo[r] = row_lo of each
 * (clamped to the last row); empty (jb1 == jb0, j1 < jb0) when no row of
 * the block has a key. */
static void key_range(const attn_job_t *J, int b, int i0, int kvl, int lo_r[AR], int *jb0, int *jb1,
                      int *j1) {
    const int T = J->T;
    const int ilast = i0 + AR - 1 < T - 1 ? i0 + AR - 1 : T - 1;
    int lo = T;
    for (int r = 0; r < AR; r++) {
        lo_r[r] = row_lo(J, b, i0 + r < T ? i0 + r : T - 1);
        if (lo_r[r] < lo) lo = lo_r[r];
    }
    *jb0 = lo / KERN_VL * KERN_VL;
    *j1 = ilast < kvl - 1 ? ilast : kvl - 1;
    *jb1 = round16(*j1 + 1) > *jb0 ? round16(*j1 + 1) : *jb0;
}

KERN_CPU_CLONES static void fwd_task_body(const attn_job_t *J, int b, int hk, kern_vf_t *qs) {
    const int T = J->T, hd = J->hd, Tp = round16(T), hdp = round16(hd);
    const int group = J->nh / J->nkv, ldq = J->nh * hd, ldk = J->nkv * hd, kvl = row_kv_len(J, b);
    float *kT = (float *)(qs + (size_t)hd * AR), *vP = kT + (size_t)hd * Tp;
    float *S = vP + (size_t)T * hdp, *acc = S + (size_t)AR * Tp;
    mask_tab_t mt;
    mask_tab_init(&mt);
    transpose_pad(kT, J->k + (size_t)b * T * ldk + (size_t)hk * hd, T, Tp, hd, ldk);
    copy_pad(vP, J->v + (size_t)b * T * ldk + (size_t)hk * hd, T, hdp, hd, ldk);
    for (int g = 0; g < group; g++) {
        const int h = hk * group + g;
        const float *qb = J->q + (size_t)b * T * ldq + (size_t)h * hd;
        float *ob = J->o + (size_t)b * T * ldq + (size_t)h * hd;
        float *lb = J->lse + ((size_t)b * J->nh + h) * T;
        for (int i0 = 0; i0 < T; i0 += AR) {
            int jb0, jb1, j1, lo[AR];
            key_range(J, b, i0, kvl, lo, &jb0, &jb1, &j1);
            const float *qr[AR];
            for (int r = 0; r < AR; r++) qr[r] = qb + (size_t)(i0 + r < T ? i0 + r : T - 1) * ldq;
            splat_rows(qs, qr, hd);
            dot_block(S, Tp, qs, kT, hd, jb0, jb1, J->scale);
            float mx[AR], sub[AR];
            double sum[AR];
            for (int r = 0; r < AR; r++) {
                mx[r] = mask_row(S + (size_t)r * Tp, &mt, i0 + r < T ? i0 + r : T - 1, lo[r], kvl, jb0, jb1);
                sub[r] = mx[r] == -INFINITY ? 0.0f : mx[r]; /* no key: exps of -inf, all 0 */
            }
            exp_rows(S, Tp, sub, jb0, jb1, sum);
            for (int r = 0; r < AR; r++) { /* a row with a key has sum >= 1 (its max gives exp 0) */
                const kern_vf_t inv = kern_vf_splat(sum[r] > 0 ? (float)(1.0 / sum[r]) : 0.0f);
                float *sr = S + (size_t)r * Tp;
                for (int jj = jb0; jj < jb1; jj += KERN_VL) kern_vf_store(sr + jj, kern_vf_load(sr + jj) * inv);
                if (J->bf16_p) round_bf16_range(sr, jb0, jb1);
                if (i0 + r < T) lb[i0 + r] = sum[r] > 0 ? mx[r] + (float)log(sum[r]) : -INFINITY;
            }
            pv_block(acc, hdp, S, Tp, vP, jb0, j1);
            for (int r = 0; r < AR && i0 + r < T; r++)
                memcpy(ob + (size_t)(i0 + r) * ldq, acc + (size_t)r * hdp, (size_t)hd * sizeof *ob);
        }
    }
}

/* One task's scratch: 2 * hd * AR broadcast vectors (64-byte aligned, as
 * kern_vf_t requires), then `floats` floats. */
static kern_vf_t *scratch_alloc(int hd, size_t floats) {
    const size_t vbytes = sizeof(kern_vf_t);
    const size_t bytes = 2 * (size_t)hd * AR * vbytes + floats * sizeof(float);
    kern_vf_t *p = aligned_alloc(vbytes, (bytes + vbytes - 1) / vbytes * vbytes);
    MT_CHECK_ALLOC(p, "attention scratch");
    return p;
}

static void fwd_task(void *ctx, size_t t) {
    const attn_job_t *J = ctx;
    const int T = J->T, Tp = round16(T), hdp = round16(J->hd);
    const size_t n = (size_t)J->hd * Tp + (size_t)T * hdp + (size_t)AR * Tp + (size_t)AR * hdp;
    kern_vf_t *scratch = scratch_alloc(J->hd, n);
    fwd_task_body(J, (int)(t / (size_t)J->nkv), (int)(t % (size_t)J->nkv), scratch);
    free(scratch);
}

void kern_attention_fwd_cpu_vec(kern_stream_t *s, float *out, float *lse, const float *q,
                                const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B,
                                int T, int nh, int nkv, int hd, int window) {
    kern_attention_fwd_cpu_vec_p(s, out, lse, q, k, v, kv_len, seg_start, B, T, nh, nkv, hd, window, false);
}

void kern_attention_fwd_cpu_vec_p(kern_stream_t *s, float *out, float *lse, const float *q, const float *k,
                                  const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                                  int nh, int nkv, int hd, int window, bool bf16_p) {
    if (B <= 0 || T <= 0) return;
    attn_job_t J = {.q = q, .k = k, .v = v, .kv_len = kv_len, .seg_start = seg_start, .o = out, .lse = lse, .B = B,
                    .T = T, .nh = nh, .nkv = nkv, .hd = hd, .window = window,
                    .scale = 1.0f / sqrtf((float)hd), .bf16_p = bf16_p};
    kern_cpu_parallel_for(s, (size_t)B * nkv, fwd_task, &J);
}

KERN_CPU_CLONES static void bwd_task_body(const attn_job_t *J, int b, int hk, kern_vf_t *qs) {
    const int T = J->T, hd = J->hd, Tp = round16(T), hdp = round16(hd);
    const int group = J->nh / J->nkv, ldq = J->nh * hd, ldk = J->nkv * hd, kvl = row_kv_len(J, b);
    const size_t koff = (size_t)b * T * ldk + (size_t)hk * hd;
    kern_vf_t *ds = qs + (size_t)hd * AR; /* dout rows broadcast; qs: q rows */
    float *kT = (float *)(ds + (size_t)hd * AR), *vT = kT + (size_t)hd * Tp;
    float *kP = vT + (size_t)hd * Tp;
    float *dkT = kP + (size_t)T * hdp, *dvT = dkT + (size_t)hd * Tp; /* (hd, Tp) */
    float *P = dvT + (size_t)hd * Tp, *dS = P + (size_t)AR * Tp, *acc = dS + (size_t)AR * Tp;
    mask_tab_t mt;
    mask_tab_init(&mt);
    transpose_pad(kT, J->k + koff, T, Tp, hd, ldk);
    transpose_pad(vT, J->v + koff, T, Tp, hd, ldk);
    copy_pad(kP, J->k + koff, T, hdp, hd, ldk);
    memset(dkT, 0, 2 * (size_t)hd * Tp * sizeof *dkT);
    const kern_vf_t vsc = kern_vf_splat(J->scale);
    for (int g = 0; g < group; g++) {
        const int h = hk * group + g;
        const size_t qoff = (size_t)b * T * ldq + (size_t)h * hd;
        const float *lb = J->lse_in + ((size_t)b * J->nh + h) * T;
        for (int i0 = 0; i0 < T; i0 += AR) {
            int jb0, jb1, j1, lo[AR];
            key_range(J, b, i0, kvl, lo, &jb0, &jb1, &j1);
            const int nr = T - i0 < AR ? T - i0 : AR;
            const float *qr[AR], *gr[AR];
            float sub[AR];
            for (int r = 0; r < AR; r++) {
                const int i = i0 + r < T ? i0 + r : T - 1;
                qr[r] = J->q + qoff + (size_t)i * ldq;
                gr[r] = J->dout + qoff + (size_t)i * ldq;
                sub[r] = lb[i] == -INFINITY ? 0.0f : lb[i]; /* a row with no key: P = 0 */
            }
            splat_rows(qs, qr, hd);
            splat_rows(ds, gr, hd);
            dot_block(P, Tp, qs, kT, hd, jb0, jb1, J->scale); /* S */
            dot_block(dS, Tp, ds, vT, hd, jb0, jb1, 1.0f);    /* dP = dout V^T */
            for (int r = 0; r < AR; r++)
                mask_row(P + (size_t)r * Tp, &mt, i0 + r < T ? i0 + r : T - 1, lo[r], kvl, jb0, jb1);
            exp_rows(P, Tp, sub, jb0, jb1, NULL); /* P = exp(S - lse) */
            for (int r = 0; r < AR; r++) {
                float *pr = P + (size_t)r * Tp, *sr = dS + (size_t)r * Tp;
                if (r >= nr) { /* past the last row: contributes nothing to dk, dv */
                    memset(pr + jb0, 0, (size_t)(jb1 - jb0) * sizeof *pr);
                    memset(sr + jb0, 0, (size_t)(jb1 - jb0) * sizeof *sr);
                    continue;
                }
                const float *o = J->out + qoff + (size_t)(i0 + r) * ldq;
                kern_vdacc_t dd = kern_vdacc_zero(); /* D = dout . out in double */
                for (int c = 0; c < hd; c += KERN_VL) {
                    const size_t m = hd - c < KERN_VL ? (size_t)(hd - c) : KERN_VL;
                    kern_vdacc_add_prod(&dd, kern_vf_load_n(o + c, m, 0.0f), kern_vf_load_n(gr[r] + c, m, 0.0f));
                }
                const kern_vf_t D = kern_vf_splat((float)kern_vdacc_hsum(dd));
                for (int jj = jb0; jj < jb1; jj += KERN_VL) /* dS = P * (dP - D) */
                    kern_vf_store(sr + jj, kern_vf_load(pr + jj) * (kern_vf_load(sr + jj) - D));
                if (J->bf16_p) { /* from the fp32 P above; then both enter their products in bf16 */
                    round_bf16_range(pr, jb0, jb1);
                    round_bf16_range(sr, jb0, jb1);
                }
            }
            pv_block(acc, hdp, dS, Tp, kP, jb0, j1); /* dq = dS K / sqrt(hd) */
            for (int r = 0; r < nr; r++) {
                float *ar = acc + (size_t)r * hdp;
                for (int cv = 0; cv < hdp; cv += KERN_VL) kern_vf_store(ar + cv, kern_vf_load(ar + cv) * vsc);
                memcpy(J->dq + qoff + (size_t)(i0 + r) * ldq, ar, (size_t)hd * sizeof *ar);
            }
            rank_update(dvT, Tp, P, ds, hd, jb0, jb1);  /* dv += P^T dout */
            rank_update(dkT, Tp, dS, qs, hd, jb0, jb1); /* dk += dS^T q (scaled below) */
        }
    }
    for (int j = 0; j < T; j++) {
        float *dkr = J->dk + koff + (size_t)j * ldk, *dvr = J->dv + koff + (size_t)j * ldk;
        for (int c = 0; c < hd; c++) {
            dkr[c] = J->scale * dkT[(size_t)c * Tp + j];
            dvr[c] = dvT[(size_t)c * Tp + j];
        }
    }
}

static void bwd_task(void *ctx, size_t t) {
    const attn_job_t *J = ctx;
    const int T = J->T, Tp = round16(T), hdp = round16(J->hd);
    const size_t n = 4 * (size_t)J->hd * Tp + (size_t)T * hdp + 2 * (size_t)AR * Tp +
                     (size_t)AR * hdp;
    kern_vf_t *scratch = scratch_alloc(J->hd, n);
    bwd_task_body(J, (int)(t / (size_t)J->nkv), (int)(t % (size_t)J->nkv), scratch);
    free(scratch);
}

void kern_attention_bwd_cpu_vec(kern_stream_t *s, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k, const float *v,
                                const float *out, const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B,
                                int T, int nh, int nkv, int hd, int window) {
    kern_attention_bwd_cpu_vec_p(s, dq, dk, dv, dout, q, k, v, out, lse, kv_len, seg_start, B, T, nh, nkv, hd, window,
                                 false);
}

void kern_attention_bwd_cpu_vec_p(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                                  const float *q, const float *k, const float *v, const float *out, const float *lse,
                                  const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                                  int hd, int window, bool bf16_p) {
    if (B <= 0 || T <= 0) return;
    attn_job_t J = {.q = q, .k = k, .v = v, .kv_len = kv_len, .seg_start = seg_start, .dout = dout, .out = out,
                    .lse_in = lse, .dq = dq, .dk = dk, .dv = dv, .B = B, .T = T, .nh = nh,
                    .nkv = nkv, .hd = hd, .window = window, .scale = 1.0f / sqrtf((float)hd), .bf16_p = bf16_p};
    kern_cpu_parallel_for(s, (size_t)B * nkv, bwd_task, &J);
}

/* The 16-lane loops above keep 8-16 vectors live; without AVX-512's 32
 * registers GCC spills them and the result is slower than OpenBLAS, so
 * other CPUs take the sgemm path (attention_blas.c). */
void kern_attention_fwd_cpu(kern_stream_t *s, float *out, float *lse, const float *q,
                            const float *k, const float *v, const int32_t *kv_len, const int32_t *seg_start, int B, int T,
                            int nh, int nkv, int hd, int window) {
    if (__builtin_cpu_supports("avx512f"))
        kern_attention_fwd_cpu_vec(s, out, lse, q, k, v, kv_len, seg_start, B, T, nh, nkv, hd, window);
    else
        kern_attention_fwd_cpu_blas(s, out, lse, q, k, v, kv_len, seg_start, B, T, nh, nkv, hd, window);
}

void kern_attention_bwd_cpu(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv,
                            int hd, int window) {
    if (__builtin_cpu_supports("avx512f"))
        kern_attention_bwd_cpu_vec(s, dq, dk, dv, dout, q, k, v, out, lse, kv_len, seg_start, B, T, nh, nkv, hd,
                                   window);
    else
        kern_attention_bwd_cpu_blas(s, dq, dk, dv, dout, q, k, v, out, lse, kv_len, seg_start, B, T, nh, nkv, hd,
                                    window);
}

/* ---- The twin of the CUDA tensor-core path (attention.h, _tc) ----
 *
 * cuDNN's SDPA (its graphs: kernels/cudnn/attention_cudnn_graph.c) reads bf16 q, k, v (and
 * dout, out in the backward), accumulates its products in fp32, keeps
 * scores, softmax, lse and rowsum(dout * out) in fp32, holds P in bf16 for
 * P V and P^T dout and dS in bf16 for dS K and dS^T q (the tensor-core
 * products' operands), and writes bf16 results.  The twin rounds the same
 * tensors at the same places around the fp32 reference above (bf16_p), so a
 * bf16 run computes the same function on both backends; what is left
 * between them is the order of fp32 sums, where the softmax is normalised
 * (cuDNN's online softmax), and dS rounded before its 1/sqrt(hd) scale here,
 * after it there (the same value when hd is a power of 4); tolerances in
 * tests/gpu/attention_tc_test.c.  It refuses what the CUDA path refuses by
 * rule, so both fall back alike. */

static bool attn_tc_shape_ok(const int32_t *seg_start, int nh, int nkv, int hd) {
    return seg_start == NULL && kern_attention_tc_takes(nh, nkv, hd);
}

/* An operand as the tensor cores read it: src's n elements in bf16 (dt
 * MT_BF16: as stored; MT_F32: rounded), in a new fp32 buffer. */
static float *attn_bf16_operand(const void *src, mt_dtype_t dt, size_t n) {
    float *d = malloc((n ? n : 1) * sizeof *d);
    MT_CHECK_ALLOC(d, "bf16 attention operand");
    if (dt == MT_BF16) {
        for (size_t i = 0; i < n; i++) d[i] = mt_bf16_to_f32(((const uint16_t *)src)[i]);
    } else {
        for (size_t i = 0; i < n; i++) d[i] = mt_bf16_to_f32(mt_f32_to_bf16(((const float *)src)[i]));
    }
    return d;
}

/* A result rounded to bf16 into dst: dt MT_BF16 stores the bf16 elements,
 * MT_F32 their fp32 values; src may be dst when dt is MT_F32. */
static void attn_bf16_result(void *dst, mt_dtype_t dt, const float *src, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const uint16_t h = mt_f32_to_bf16(src[i]);
        if (dt == MT_BF16)
            ((uint16_t *)dst)[i] = h;
        else
            ((float *)dst)[i] = mt_bf16_to_f32(h);
    }
}

static bool attn_tc_dt_ok(mt_dtype_t dt) {
    MT_CHECK(dt == MT_F32 || dt == MT_BF16, "tensor-core attention: q, k, v, out stored as %s (F32 or BF16 only)",
             mt_dtype_name(dt));
    return true;
}

bool kern_attention_fwd_tc_cpu(kern_stream_t *s, void *out, float *lse, const void *q, const void *k, const void *v,
                               mt_dtype_t dt, const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh,
                               int nkv, int hd, int window) {
    if (!attn_tc_dt_ok(dt) || !attn_tc_shape_ok(seg_start, nh, nkv, hd)) return false;
    if (B <= 0 || T <= 0) return true;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    float *q16 = attn_bf16_operand(q, dt, nq), *k16 = attn_bf16_operand(k, dt, nk), *v16 = attn_bf16_operand(v, dt, nk);
    float *o32 = dt == MT_F32 ? out : malloc(nq * sizeof *o32);
    MT_CHECK_ALLOC(o32, "attention output (fp32)");
    if (__builtin_cpu_supports("avx512f"))
        kern_attention_fwd_cpu_vec_p(s, o32, lse, q16, k16, v16, kv_len, NULL, B, T, nh, nkv, hd, window, true);
    else
        kern_attention_fwd_cpu_blas_p(s, o32, lse, q16, k16, v16, kv_len, NULL, B, T, nh, nkv, hd, window, true);
    attn_bf16_result(out, dt, o32, nq);
    if (o32 != out) free(o32);
    free(q16), free(k16), free(v16);
    return true;
}

bool kern_attention_bwd_tc_cpu(kern_stream_t *s, float *dq, float *dk, float *dv, const float *dout, const void *q,
                               const void *k, const void *v, const void *out, mt_dtype_t dt, const float *lse,
                               const int32_t *kv_len, const int32_t *seg_start, int B, int T, int nh, int nkv, int hd,
                               int window) {
    if (!attn_tc_dt_ok(dt) || !attn_tc_shape_ok(seg_start, nh, nkv, hd)) return false;
    if (B <= 0 || T <= 0) return true;
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
    float *q16 = attn_bf16_operand(q, dt, nq), *k16 = attn_bf16_operand(k, dt, nk), *v16 = attn_bf16_operand(v, dt, nk);
    float *o16 = attn_bf16_operand(out, dt, nq), *do16 = attn_bf16_operand(dout, MT_F32, nq);
    if (__builtin_cpu_supports("avx512f"))
        kern_attention_bwd_cpu_vec_p(s, dq, dk, dv, do16, q16, k16, v16, o16, lse, kv_len, NULL, B, T, nh, nkv, hd,
                                     window, true);
    else
        kern_attention_bwd_cpu_blas_p(s, dq, dk, dv, do16, q16, k16, v16, o16, lse, kv_len, NULL, B, T, nh, nkv, hd,
                                      window, true);
    attn_bf16_result(dq, MT_F32, dq, nq);
    attn_bf16_result(dk, MT_F32, dk, nk);
    attn_bf16_result(dv, MT_F32, dv, nk);
    free(q16), free(k16), free(v16), free(o16), free(do16);
    return true;
}
