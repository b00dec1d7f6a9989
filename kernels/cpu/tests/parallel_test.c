/* The CPU kernels that split work over the backend's thread pool give
 * bit-identical results for any pool size, and run to run.
 *
 * Every op is run on inputs big enough to be cut into several tasks (and
 * with sizes that leave vector tails), on CPU devices with host_threads =
 * 1, 2 and 3, twice on each; all outputs must match the 1-thread run bit
 * for bit. With OpenBLAS set to one thread (as the CPU backend may run it),
 * fp32 products and grouped products (kern_mm) are cut into pieces over the
 * pool: those runs are also checked against a double-precision reference,
 * since mm_f32_test runs them uncut.
 *
 * Both attention paths (the 16-lane one, and the sgemm one that CPUs
 * without AVX-512 use) are checked against a double reference here on
 * bigger shapes than attention_test's: T = 70 and 150 (several 16-key
 * blocks and a 4-row tail), head_dim 24 (a vector tail), windows, and key
 * padding (kv_len inside a 16-key block, on a block edge, 0, > T). RoPE's
 * vector paths must equal its scalar formula bit for bit. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/attention_blas.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/tests/testutil.h"
#include "kernels/ops.h"

void openblas_set_num_threads(int n);

/* Attention against the double reference: as attention_test (fp32 sums of
 * hd products, expf within 1 ulp; rows of up to 150 keys): 2e-5 relative +
 * 2e-6 absolute on out and lse. Backward: dq, dk, dv against a double
 * backward of the same formulas, 1e-4 relative + 1e-5 absolute (sums of
 * up to T * group terms of O(1) values with fp32 rounding each). */
#define ATT_FWD_RTOL 2e-5
#define ATT_FWD_ATOL 2e-6
#define ATT_BWD_RTOL 1e-4
#define ATT_BWD_ATOL 1e-5
/* GEMM pieces against double: K <= 300 fp32 products of O(1) values:
 * 1e-5 relative + 1e-5 * sqrt(K) absolute. */
#define GEMM_RTOL 1e-5

typedef struct {
    const char *name;
    float *p;
    size_t n;
} out_t;

typedef struct {
    out_t o[64];
    int n;
} outs_t;

static float *keep(outs_t *O, const char *name, size_t n) {
    float *p = tu_alloc(n);
    O->o[O->n++] = (out_t){name, p, n};
    return p;
}

static tu_env_t env_open(int threads) {
    tu_env_t env = {0};
    kern_device_opts_t opts = {.device_budget_bytes = 1 << 20, .host_threads = threads};
    mt_error_t err = {0};
    MT_CHECK(kern_cpu_device_create(&opts, &env.dev, &err) == MT_OK, "CPU device: %s", err.msg);
    env.s = env.dev->streams[KERN_STREAM_COMPUTE];
    return env;
}

static int32_t *rand_ids(tu_rng_t *r, int n, int range) {
    int32_t *v = malloc((size_t)n * sizeof *v);
    MT_CHECK_ALLOC(v, "ids");
    for (int i = 0; i < n; i++) v[i] = tu_rng_int(r, range);
    return v;
}

/* Runs every pooled op once on fixed inputs (seeded), filling O. */
static void run_all(kern_stream_t *s, outs_t *O) {
    const kern_ops_t *ops = &kern_ops_cpu;
    tu_rng_t r;
    tu_rng_seed(&r, 42);
    O->n = 0;
    { /* element-wise: 100003 elements = 7 tasks, tail of 3 */
        const size_t n = 100003;
        float *a = tu_rand(&r, n, 3.0f), *b = tu_rand(&r, n, 3.0f), *d = tu_rand(&r, n, 1.0f);
        float *y = keep(O, "add", n);
        ops->add(s, y, a, b, n);
        float *z = keep(O, "axpy", n);
        memcpy(z, a, n * sizeof *z);
        ops->axpy(s, z, -0.37f, b, n);
        ops->scale(s, z, 1.7f, n);
        float *h = keep(O, "swiglu_fwd", n);
        ops->swiglu_fwd(s, h, a, b, n);
        float *dg = keep(O, "swiglu_bwd dg", n), *du = keep(O, "swiglu_bwd du", n);
        ops->swiglu_bwd(s, dg, du, d, a, b, n);
        float *ss = keep(O, "sumsq", 1);
        ops->sumsq(s, ss, a, n);
        free(a), free(b), free(d);
    }
    { /* rmsnorm: 1000 rows of 72 (tail of 8), dw accumulates */
        const int rows = 1000, dim = 72;
        float *x = tu_rand(&r, (size_t)rows * dim, 2.0f), *w = tu_rand(&r, dim, 1.0f);
        float *dy = tu_rand(&r, (size_t)rows * dim, 1.0f);
        float *y = keep(O, "rmsnorm y", (size_t)rows * dim), *rs = keep(O, "rmsnorm rstd", rows);
        ops->rmsnorm_fwd(s, y, rs, x, w, rows, dim, 1e-5f);
        float *dx = keep(O, "rmsnorm dx", (size_t)rows * dim), *dw = keep(O, "rmsnorm dw", dim);
        for (int j = 0; j < dim; j++) dw[j] = 0.25f;
        ops->rmsnorm_bwd(s, dx, dw, dy, x, w, rs, rows, dim);
        free(x), free(w), free(dy);
    }
    { /* cross-entropy: 700 rows of 333 logits, every 5th row ignored, in place */
        const int n = 700, V = 333;
        float *lg = keep(O, "xent dlogits (in place)", (size_t)n * V);
        tu_fill(&r, lg, (size_t)n * V, 4.0f);
        int32_t *t = rand_ids(&r, n, V);
        for (int i = 0; i < n; i += 5) t[i] = KERN_IGNORE_INDEX;
        float *loss = keep(O, "xent loss", n);
        ops->xent(s, loss, lg, lg, t, n, V, 1.0f / 560);
        free(t);
    }
    { /* attention: B 3, T 70, 6 heads on 2 kv heads, hd 24; windows 0 and 17, without and
       * with key padding (kv_len 41, 0, 70) */
        const int B = 3, T = 70, nh = 6, nkv = 2, hd = 24;
        const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
        float *q = tu_rand(&r, nq, 1.5f), *k = tu_rand(&r, nk, 1.5f), *v = tu_rand(&r, nk, 1.0f);
        float *dout = tu_rand(&r, nq, 1.0f);
        const int32_t kv_len[3] = {41, 0, 70};
        for (int wi = 0; wi < 4; wi++) {
            const int window = wi & 1 ? 17 : 0;
            const int32_t *kl = wi & 2 ? kv_len : NULL;
            float *o = keep(O, "attention out", nq), *l = keep(O, "attention lse", (size_t)B * nh * T);
            ops->attention_fwd(s, o, l, q, k, v, kl, NULL, B, T, nh, nkv, hd, window);
            float *dq = keep(O, "attention dq", nq), *dk = keep(O, "attention dk", nk);
            float *dv = keep(O, "attention dv", nk);
            ops->attention_bwd(s, dq, dk, dv, dout, q, k, v, o, l, kl, NULL, B, T, nh, nkv, hd, window);
        }
        free(q), free(k), free(v), free(dout);
    }
    { /* router: 3000 tokens, 12 experts, top-3, both modes, aux term */
        const int n = 3000, E = 12, k = 3;
        float *logits = tu_rand(&r, (size_t)n * E, 2.0f), *aux = tu_rand(&r, E, 0.1f);
        float *tw = tu_rand(&r, n, 1.0f), *dwt = tu_rand(&r, (size_t)n * k, 1.0f);
        for (int mode = 0; mode < 2; mode++) {
            float *w = keep(O, "router weights", (size_t)n * k), *p = keep(O, "router probs", (size_t)n * E);
            float *idxf = keep(O, "router idx", (size_t)n * k);
            ops->router_fwd(s, w, (int32_t *)idxf, p, logits, n, E, k, (kern_router_mode_t)mode);
            float *dl = keep(O, "router dlogits", (size_t)n * E);
            ops->router_bwd(s, dl, dwt, p, (const int32_t *)idxf, aux, tw, n, E, k, (kern_router_mode_t)mode);
        }
        free(logits), free(aux), free(tw), free(dwt);
    }
    { /* permutation: 1500 tokens, top-2 of 8, H 200 (tail of 8) */
        const int n = 1500, k = 2, E = 8, H = 200, m = n * k;
        int32_t *idx = malloc((size_t)m * sizeof *idx);
        MT_CHECK_ALLOC(idx, "idx");
        for (int i = 0; i < n; i++) {
            idx[i * k] = tu_rng_int(&r, E);
            idx[i * k + 1] = (idx[i * k] + 1 + tu_rng_int(&r, E - 1)) % E;
        }
        int32_t counts[8], offsets[9];
        int32_t *perm = malloc((size_t)m * sizeof *perm), *inv = malloc((size_t)m * sizeof *inv);
        MT_CHECK(perm && inv, "perm");
        ops->moe_plan(s, counts, offsets, perm, inv, idx, n, k, E);
        float *x = tu_rand(&r, (size_t)n * H, 1.0f), *w = tu_rand(&r, (size_t)m, 1.0f);
        float *dy = tu_rand(&r, (size_t)n * H, 1.0f), *gl = tu_rand(&r, n, 2.0f);
        float *xp = keep(O, "gather", (size_t)m * H);
        ops->moe_gather(s, xp, x, perm, m, H);
        float *y = keep(O, "unpermute_sum", (size_t)n * H);
        ops->moe_unpermute_sum(s, y, xp, w, inv, n, k, H, 0);
        ops->moe_unpermute_sum(s, y, xp, NULL, inv, n, k, H, 1);
        float *dsrc = keep(O, "combine_bwd dsrc", (size_t)m * H), *dw = keep(O, "combine_bwd dw", m);
        ops->moe_combine_bwd(s, dsrc, dw, dy, xp, w, inv, n, k, H);
        float *gy = keep(O, "gate_scale_fwd", (size_t)n * H);
        memcpy(gy, dy, (size_t)n * H * sizeof *gy);
        ops->gate_scale_fwd(s, gy, x, gl, n, H);
        float *gdx = keep(O, "gate_scale_bwd dx", (size_t)n * H), *gdg = keep(O, "gate_scale_bwd dg", n);
        ops->gate_scale_bwd(s, gdx, gdg, dy, x, gl, n, H);
        free(idx), free(perm), free(inv), free(x), free(w), free(dy), free(gl);
    }
    { /* rope (hd 32: vector path) and embedding (H 300: 2 column blocks, repeated ids) */
        const int B = 3, T = 50, heads = 4, hd = 32;
        float *ct = tu_rand(&r, (size_t)T * hd / 2, 1.0f), *st = tu_rand(&r, (size_t)T * hd / 2, 1.0f);
        float *x = keep(O, "rope", (size_t)B * T * heads * hd);
        tu_fill(&r, x, (size_t)B * T * heads * hd, 1.0f);
        ops->rope_fwd(s, x, ct, st, NULL, B, T, heads, hd);
        ops->rope_bwd(s, x, ct, st, NULL, B, T, heads, 8 * 2); /* hd 16 view: scalar path */
        const int n = 2000, V = 50, H = 300;
        int32_t *ids = rand_ids(&r, n, V);
        float *table = tu_rand(&r, (size_t)V * H, 1.0f), *dout = tu_rand(&r, (size_t)n * H, 1.0f);
        float *e = keep(O, "embedding fwd", (size_t)n * H);
        ops->embedding_fwd(s, e, table, ids, n, H);
        float *dt = keep(O, "embedding bwd", (size_t)V * H);
        ops->embedding_bwd(s, dt, dout, ids, n, H);
        free(ct), free(st), free(ids), free(table), free(dout);
    }
    { /* fp32 products: all transposes, beta 0 and 1; grouped with ragged and empty groups */
        const int M = 300, N = 130, K = 200;
        float *A = tu_rand(&r, (size_t)M * K, 1.0f), *Bm = tu_rand(&r, (size_t)K * N, 1.0f);
        for (int t = 0; t < 4; t++) {
            float *C = keep(O, "mm f32", (size_t)M * N);
            tu_fill(&r, C, (size_t)M * N, 1.0f);
            const kern_mm_t p = kern_mm_make(C, A, MT_F32, Bm, MT_F32, M, N, K, t & 1, t >> 1, 0.5f,
                                             (float)(t & 1), MT_F32);
            ops->mm(s, &p);
        }
        float *Cw = keep(O, "mm f32 wide", (size_t)40 * 600);
        float *Aw = tu_rand(&r, (size_t)40 * 100, 1.0f), *Bw = tu_rand(&r, (size_t)100 * 600, 1.0f);
        const kern_mm_t pw = kern_mm_make(Cw, Aw, MT_F32, Bw, MT_F32, 40, 600, 100, false, false, 1.0f, 0.0f, MT_F32);
        ops->mm(s, &pw);
        kern_mm_t d[5];
        const int Ms[5] = {0, 37, 140, 1, 122}; /* 300 rows of A in all */
        size_t off = 0;
        float *Cg = keep(O, "mm f32 grouped", (size_t)M * N);
        for (int g = 0; g < 5; g++) {
            d[g] = kern_mm_make(Cg + off * N, A + off * K, MT_F32, Bm, MT_F32, Ms[g], N, K, false, false, 1.0f, 0.0f,
                                MT_F32);
            off += (size_t)Ms[g];
        }
        ops->mm_grouped(s, d, 5);
        free(A), free(Bm), free(Aw), free(Bw);
    }
}

static void free_outs(outs_t *O) {
    for (int i = 0; i < O->n; i++) free(O->o[i].p);
    O->n = 0;
}

static void compare_runs(const outs_t *ref, const outs_t *got, const char *what) {
    tu_expect(ref->n == got->n, "%s: %d outputs, want %d", what, got->n, ref->n);
    for (int i = 0; i < ref->n && i < got->n; i++) {
        char tag[160];
        snprintf(tag, sizeof tag, "%s: %s (output %d)", what, ref->o[i].name, i);
        tu_check_bitwise(tag, got->o[i].p, ref->o[i].p, ref->o[i].n);
    }
}

/* ---- attention against a double reference (both paths) ---- */

static int allowed(int i, int j, int window, int kvl, int seg) {
    return j <= i && (window <= 0 || i - j < window) && j < kvl && j >= seg;
}

/* out, lse and, given dout, dq/dk/dv in double; a query with no key gets
 * out 0, lse -inf and dq 0 (attention.h). */
static void attn_ref(double *out, double *lse, double *dq, double *dk, double *dv, const float *q,
                     const float *k, const float *v, const float *dout, const int32_t *kv_len,
                     const int32_t *seg_start, int B, int T, int nh, int nkv, int hd, int window) {
    const int group = nh / nkv;
    const double sc = 1.0 / sqrt((double)hd);
    double *p = tu_alloc_d((size_t)T), *dp = tu_alloc_d((size_t)T);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < nh; h++) {
            const int hk = h / group;
            const int kvl = !kv_len || kv_len[b] > T ? T : kv_len[b] < 0 ? 0 : kv_len[b];
            for (int i = 0; i < T; i++) {
                const int seg = seg_start ? seg_start[(size_t)b * T + i] : 0;
                const float *qi = q + (((size_t)b * T + i) * nh + h) * hd;
                const float *gi = dout + (((size_t)b * T + i) * nh + h) * hd;
                double mx = -INFINITY;
                for (int j = 0; j < T; j++) {
                    p[j] = -INFINITY;
                    if (!allowed(i, j, window, kvl, seg)) continue;
                    const float *kj = k + (((size_t)b * T + j) * nkv + hk) * hd;
                    double s = 0;
                    for (int c = 0; c < hd; c++) s += (double)qi[c] * kj[c];
                    p[j] = s * sc;
                    mx = p[j] > mx ? p[j] : mx;
                }
                double sum = 0;
                for (int j = 0; j < T; j++) sum += allowed(i, j, window, kvl, seg) ? exp(p[j] - mx) : 0.0;
                lse[((size_t)b * nh + h) * T + i] = mx == -INFINITY ? -INFINITY : mx + log(sum);
                for (int j = 0; j < T; j++) p[j] = allowed(i, j, window, kvl, seg) ? exp(p[j] - mx) / sum : 0.0;
                double *oi = out + (((size_t)b * T + i) * nh + h) * hd;
                double D = 0;
                for (int c = 0; c < hd; c++) {
                    oi[c] = 0;
                    for (int j = 0; j < T; j++)
                        oi[c] += p[j] * v[(((size_t)b * T + j) * nkv + hk) * hd + c];
                    D += oi[c] * gi[c];
                }
                for (int j = 0; j < T; j++) {
                    dp[j] = 0;
                    if (!allowed(i, j, window, kvl, seg)) continue;
                    const float *vj = v + (((size_t)b * T + j) * nkv + hk) * hd;
                    double t = 0;
                    for (int c = 0; c < hd; c++) t += (double)gi[c] * vj[c];
                    dp[j] = p[j] * (t - D); /* dS */
                }
                double *dqi = dq + (((size_t)b * T + i) * nh + h) * hd;
                for (int c = 0; c < hd; c++) dqi[c] = 0;
                for (int j = 0; j < T; j++) {
                    if (!allowed(i, j, window, kvl, seg)) continue;
                    const size_t kr = (((size_t)b * T + j) * nkv + hk) * hd;
                    for (int c = 0; c < hd; c++) {
                        dqi[c] += dp[j] * k[kr + c] * sc;
                        dk[kr + c] += dp[j] * qi[c] * sc;
                        dv[kr + c] += p[j] * gi[c];
                    }
                }
            }
        }
    free(p);
    free(dp);
}

typedef void (*att_fwd_fn)(kern_stream_t *, float *, float *, const float *, const float *,
                           const float *, const int32_t *, const int32_t *, int, int, int, int, int, int);
typedef void (*att_bwd_fn)(kern_stream_t *, float *, float *, float *, const float *, const float *,
                           const float *, const float *, const float *, const float *,
                           const int32_t *, const int32_t *, int, int, int, int, int, int);

static void attention_paths(kern_stream_t *s, int B, int T, int nh, int nkv, int hd, int window,
                            const int32_t *kv_len, const int32_t *seg) {
    tu_rng_t r;
    tu_rng_seed(&r, (uint64_t)(T * 131 + hd * 7 + window + (kv_len ? 1000 : 0)));
    const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd, nl = (size_t)B * nh * T;
    float *q = tu_rand(&r, nq, 1.5f), *k = tu_rand(&r, nk, 1.5f), *v = tu_rand(&r, nk, 1.0f);
    float *dout = tu_rand(&r, nq, 1.0f);
    double *ro = tu_alloc_d(nq), *rl = tu_alloc_d(nl), *rq = tu_alloc_d(nq), *rk = tu_alloc_d(nk),
           *rv = tu_alloc_d(nk);
    attn_ref(ro, rl, rq, rk, rv, q, k, v, dout, kv_len, seg, B, T, nh, nkv, hd, window);
    const att_fwd_fn fwd[2] = {kern_attention_fwd_cpu_vec, kern_attention_fwd_cpu_blas};
    const att_bwd_fn bwd[2] = {kern_attention_bwd_cpu_vec, kern_attention_bwd_cpu_blas};
    const char *name[2] = {"vector", "sgemm"};
    for (int p = 0; p < 2; p++) {
        char tag[160];
        float *o = tu_alloc(nq), *l = tu_alloc(nl), *dq = tu_alloc(nq), *dk = tu_alloc(nk), *dv = tu_alloc(nk);
        tu_fill_nan(o, nq), tu_fill_nan(l, nl), tu_fill_nan(dq, nq), tu_fill_nan(dk, nk), tu_fill_nan(dv, nk);
        fwd[p](s, o, l, q, k, v, kv_len, seg, B, T, nh, nkv, hd, window);
        bwd[p](s, dq, dk, dv, dout, q, k, v, o, l, kv_len, seg, B, T, nh, nkv, hd, window);
#define CHK(what, got, ref, n, rt, at)                                                             \
    snprintf(tag, sizeof tag, "attention %s path T=%d hd=%d nh=%d nkv=%d window=%d kv_len[0]=%d%s: %s", \
             name[p], T, hd, nh, nkv, window, kv_len ? kv_len[0] : -1, seg ? " packed" : "", what);                      \
    tu_check_close(tag, got, ref, n, rt, at)
        CHK("out", o, ro, nq, ATT_FWD_RTOL, ATT_FWD_ATOL);
        CHK("lse", l, rl, nl, ATT_FWD_RTOL, ATT_FWD_ATOL);
        CHK("dq", dq, rq, nq, ATT_BWD_RTOL, ATT_BWD_ATOL);
        CHK("dk", dk, rk, nk, ATT_BWD_RTOL, ATT_BWD_ATOL);
        CHK("dv", dv, rv, nk, ATT_BWD_RTOL, ATT_BWD_ATOL);
#undef CHK
        free(o), free(l), free(dq), free(dk), free(dv);
    }
    free(q), free(k), free(v), free(dout), free(ro), free(rl), free(rq), free(rk), free(rv);
}

/* Packed rows: examples of lengths that straddle 4-row and 16-key blocks
 * (3, 17, 1, 30, ...), seg_start = each example's first position, the
 * tail padding a segment of its own after kv_len (as engine/data packs). */
static void packed_paths(kern_stream_t *s) {
    const int T = 70, B = 2;
    const int lens[2][6] = {{3, 17, 1, 30, 19, 0}, {33, 5, 16, 0, 0, 0}};
    int32_t seg[2 * 70], kvl[2];
    for (int b = 0; b < B; b++) {
        int at = 0;
        for (int e = 0; e < 6 && lens[b][e]; e++) {
            for (int t = 0; t < lens[b][e]; t++) seg[b * T + at + t] = at;
            at += lens[b][e];
        }
        kvl[b] = at;
        for (int t = at; t < T; t++) seg[b * T + t] = at;
    }
    attention_paths(s, B, T, 4, 2, 24, 0, kvl, seg);
    attention_paths(s, B, T, 4, 2, 24, 7, kvl, seg);
    attention_paths(s, B, T, 4, 2, 24, 0, NULL, seg);
}

/* ---- GEMM pieces against double (OpenBLAS single-threaded) ---- */

static void gemm_ref_check(kern_stream_t *s) {
    tu_rng_t r;
    tu_rng_seed(&r, 7);
    const int shapes[][3] = {{300, 130, 200}, {40, 600, 100}, {1024, 64, 96}, {17, 5, 3}, {64, 512, 300}};
    for (size_t sh = 0; sh < sizeof shapes / sizeof shapes[0]; sh++) {
        const int M = shapes[sh][0], N = shapes[sh][1], K = shapes[sh][2];
        float *A = tu_rand(&r, (size_t)M * K, 1.0f), *Bm = tu_rand(&r, (size_t)K * N, 1.0f);
        float *C0 = tu_rand(&r, (size_t)M * N, 1.0f), *C = tu_alloc((size_t)M * N);
        double *ref = tu_alloc_d((size_t)M * N);
        for (int t = 0; t < 8; t++) {
            const bool ta = t & 1, tb = (t >> 1) & 1;
            const float alpha = 0.75f, beta = (t >> 2) ? 1.0f : 0.0f;
            for (int i = 0; i < M; i++)
                for (int j = 0; j < N; j++) {
                    double acc = 0;
                    for (int c = 0; c < K; c++) {
                        const double a = ta ? A[(size_t)c * M + i] : A[(size_t)i * K + c];
                        const double b = tb ? Bm[(size_t)j * K + c] : Bm[(size_t)c * N + j];
                        acc += a * b;
                    }
                    ref[(size_t)i * N + j] = alpha * acc + (beta != 0.0f ? beta * C0[(size_t)i * N + j] : 0.0);
                }
            if (beta == 0.0f) tu_fill_nan(C, (size_t)M * N); /* beta 0 overwrites garbage */
            else memcpy(C, C0, (size_t)M * N * sizeof *C);
            const kern_mm_t p = kern_mm_make(C, A, MT_F32, Bm, MT_F32, M, N, K, ta, tb, alpha, beta, MT_F32);
            kern_ops_cpu.mm(s, &p);
            char tag[128];
            snprintf(tag, sizeof tag, "mm f32 pieces M=%d N=%d K=%d ta=%d tb=%d beta=%g", M, N, K, ta, tb,
                     (double)beta);
            tu_check_close(tag, C, ref, (size_t)M * N, GEMM_RTOL, 1e-5 * sqrt((double)K));
        }
        free(A), free(Bm), free(C0), free(C), free(ref);
    }
}

/* RoPE's vector paths (hd 16 by a half swap, hd 64 by halves) do the
 * header's per-element float operations exactly: bit-identical to them. */
static void rope_exact(kern_stream_t *s, int hd) {
    tu_rng_t r;
    tu_rng_seed(&r, 99);
    const int B = 2, T = 9, heads = 3, half = hd / 2;
    const size_t n = (size_t)B * T * heads * hd;
    float *x = tu_rand(&r, n, 2.0f), *want = tu_copy(x, n);
    float *ct = tu_rand(&r, (size_t)T * half, 1.0f), *st = tu_rand(&r, (size_t)T * half, 1.0f);
    for (int dir = 0; dir < 2; dir++) {
        const float sign = dir ? -1.0f : 1.0f;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int h = 0; h < heads; h++) {
                    float *v = want + (((size_t)b * T + t) * heads + h) * hd;
                    for (int i = 0; i < half; i++) {
                        const float x1 = v[i], x2 = v[i + half], si = sign * st[(size_t)t * half + i];
                        const float c = ct[(size_t)t * half + i];
                        v[i] = x1 * c - x2 * si;
                        v[i + half] = x2 * c + x1 * si;
                    }
                }
        if (dir == 0) kern_ops_cpu.rope_fwd(s, x, ct, st, NULL, B, T, heads, hd);
        else kern_ops_cpu.rope_bwd(s, x, ct, st, NULL, B, T, heads, hd);
        char tag[64];
        snprintf(tag, sizeof tag, "rope %s hd=%d vs the scalar formula", dir ? "bwd" : "fwd", hd);
        tu_check_bitwise(tag, x, want, n);
    }
    free(x), free(want), free(ct), free(st);
}

int main(void) {
    /* The backend may run OpenBLAS on one thread and split products itself:
     * exercise that path (the uncut one is mm_f32_test's). */
    openblas_set_num_threads(1);
    outs_t ref = {0}, got = {0};
    tu_env_t e1 = env_open(1);
    run_all(e1.s, &ref);
    gemm_ref_check(e1.s);
    const int T[2] = {70, 150}, W[2] = {0, 33};
    for (int a = 0; a < 2; a++)
        for (int w = 0; w < 2; w++) attention_paths(e1.s, 2, T[a], 4, 2, 24, W[w], NULL, NULL);
    attention_paths(e1.s, 1, 37, 3, 3, 8, 0, NULL, NULL);
    attention_paths(e1.s, 2, 33, 8, 1, 64, 5, NULL, NULL);
    /* key padding: inside a 16-key block and on a block edge; 0 and > T; a window 33
     * that leaves padded queries i >= kv_len + 32 with no key */
    const int32_t kl1[2] = {53, 64}, kl2[2] = {0, 200}, kl3[2] = {21, 150}, kl4[2] = {9, 34};
    attention_paths(e1.s, 2, 70, 4, 2, 24, 0, kl1, NULL);
    attention_paths(e1.s, 2, 150, 4, 2, 24, 0, kl2, NULL);
    attention_paths(e1.s, 2, 150, 4, 2, 24, 33, kl3, NULL);
    attention_paths(e1.s, 2, 33, 8, 1, 64, 5, kl4, NULL);
    packed_paths(e1.s);
    rope_exact(e1.s, 16);
    rope_exact(e1.s, 64);
    rope_exact(e1.s, 12);
    tu_env_close(&e1);
    for (int threads = 1; threads <= 3; threads++) {
        tu_env_t e = env_open(threads);
        for (int rep = 0; rep < 2; rep++) {
            char what[64];
            snprintf(what, sizeof what, "%d thread(s), run %d", threads, rep + 1);
            run_all(e.s, &got);
            compare_runs(&ref, &got, what);
            free_outs(&got);
        }
        tu_env_close(&e);
    }
    free_outs(&ref);
    return tu_finish("parallel_test");
}
