/* Typed matrix products (kern_mm, kern_mm_grouped; kernels/gemm.h) on the CPU.
 *
 * - bf16 compute, on every bf16 path this CPU has (the convert + sgemm
 *   reference path always, vdpbf16ps where avx512_bf16 exists): all four
 *   (trans_a, trans_b), odd shapes and shapes that cross the vdpbf16ps
 *   kernel's row, column and K blocks, beta 0 (C preset to NaN) and beta 1,
 *   C in F32 and BF16, operands stored F32 and BF16, against a double
 *   reference on the bf16-rounded operands;
 * - K = 0: beta 0 zeroes C, beta 1 leaves it bit for bit;
 * - fp32 compute is bit-identical to the sgemm pieces it is made of
 *   (kern_cpu_sgemm_batch, single and grouped), also with OpenBLAS on one
 *   thread so products are cut into pieces;
 *   fp32 compute into a BF16 C is the fp32 result rounded once;
 * - grouped products (mixed trans, dtypes, empty groups) equal the same
 *   products made one by one, bit for bit;
 * - vdpbf16ps results are the same for 1, 2 and 3 threads and run to run;
 * - a shape mismatch is a fatal error naming the three shapes. */
#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"
#include "kernels/cpu/backend_cpu.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/tests/testutil.h"
#include "kernels/gemm.h"

void openblas_set_num_threads(int n);

/* Tolerance against the double reference on bf16-rounded operands.  Each
 * product of two bf16 values is exact in fp32, so the only errors are the
 * fp32 sum's (|err| <= gamma_K sum|a b|, gamma_K ~ K 2^-24; use 2 (K + 2)
 * FLT_EPSILON, which also covers alpha and the beta C addition, plus 2 ulp
 * of |beta C|), vdpbf16ps's flushing of denormal steps (K * 2^-126 at most)
 * and, for a BF16 C, one final rounding to bf16 (half an ulp, 2^-8
 * relative; use 2^-8 |ref|). */
static double mm_tol(int K, double sum_abs, double beta_c, double ref, mt_dtype_t c_dt) {
    double t = 2.0 * (K + 2) * FLT_EPSILON * sum_abs + 2.0 * FLT_EPSILON * fabs(beta_c) +
               K * 0x1p-126;
    if (c_dt == MT_BF16) t += 0x1p-8 * fabs(ref) + 0x1p-8 * t;
    return t;
}

static float round_bf16(float x) { return mt_bf16_to_f32(mt_f32_to_bf16(x)); }

/* A test matrix: values kept in fp32 (`f`) and, when stored BF16, their
 * bf16 bits (`h`); `view` points at whichever is the storage. */
typedef struct {
    float *f;
    uint16_t *h;
    kern_mat_t view;
} mat_t;

static mat_t mat_make(tu_rng_t *r, int rows, int cols, mt_dtype_t dt, float scale) {
    mat_t m = {.f = tu_rand(r, (size_t)rows * cols + 1, scale)};
    const size_t n = (size_t)rows * cols;
    if (dt == MT_BF16) {
        m.h = malloc((n + 1) * sizeof *m.h);
        MT_CHECK(m.h, "out of memory");
        for (size_t i = 0; i < n; i++) {
            m.h[i] = mt_f32_to_bf16(m.f[i]);
            m.f[i] = mt_bf16_to_f32(m.h[i]);
        }
    }
    m.view = (kern_mat_t){.data = dt == MT_BF16 ? (void *)m.h : (void *)m.f, .dtype = dt,
                          .rows = rows, .cols = cols};
    return m;
}

static void mat_free(mat_t *m) {
    free(m->f);
    free(m->h);
}

/* C's value i as a float, whatever its storage */
static float mat_get(const mat_t *m, size_t i) {
    return m->view.dtype == MT_BF16 ? mt_bf16_to_f32(m->h[i]) : m->f[i];
}

static void mat_fill_nan(mat_t *m, size_t n) {
    for (size_t i = 0; i < n; i++) {
        m->f[i] = NAN;
        if (m->h) m->h[i] = 0x7fc0;
    }
}

static void mat_copy_from(mat_t *dst, const mat_t *src, size_t n) {
    memcpy(dst->f, src->f, n * sizeof *dst->f);
    if (dst->h) memcpy(dst->h, src->h, n * sizeof *dst->h);
}

/* Checks C = alpha op(A) op(B) + beta C0 on the operands as the compute
 * type sees them (rounded to bf16 when compute is BF16). */
static void check_mm(const char *tag, const kern_mm_t *p, const mat_t *C, const mat_t *C0,
                     const mat_t *A, const mat_t *B) {
    const int M = (int)C->view.rows, N = (int)C->view.cols;
    const int K = (int)(p->trans_a ? A->view.rows : A->view.cols);
    const bool rb = p->compute == MT_BF16;
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                float a = p->trans_a ? A->f[(size_t)k * M + i] : A->f[(size_t)i * K + k];
                float b = p->trans_b ? B->f[(size_t)j * K + k] : B->f[(size_t)k * N + j];
                if (rb) {
                    a = round_bf16(a);
                    b = round_bf16(b);
                }
                s += (double)a * b;
                sa += fabs((double)a * b);
            }
            const size_t o = (size_t)i * N + j;
            const double bc = p->beta == 0.0f ? 0.0 : (double)p->beta * mat_get(C0, o);
            const double ref = p->alpha * s + bc;
            const double tol = mm_tol(K, fabs(p->alpha) * sa, bc, ref, C->view.dtype) + 1e-30;
            const double got = mat_get(C, o);
            if (!(fabs(got - ref) <= tol)) {
                if (!bad)
                    fprintf(stderr, "FAIL: %s: C[%d,%d] = %.9g, want %.9g (tol %.3g)\n", tag, i, j,
                            got, ref, tol);
                bad++;
            }
        }
    if (bad) tu_expect(false, "%s: %d of %d elements wrong", tag, bad, M * N);
}

static int g_npaths;
static kern_cpu_bf16_path_t g_paths[KERN_CPU_BF16_PATHS];

static void test_bf16(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 71);
    /* odd shapes; 70 x 300 x 601 crosses the vdpbf16ps kernel's 64-row and
     * 256-column tasks, its 8 x 32 tiles and its 512-element K blocks, with
     * an odd K (a padded pair) */
    static const int shapes[][3] = {{5, 7, 3}, {1, 1, 1}, {33, 17, 64}, {9, 40, 1}, {70, 300, 601}};
    static const mt_dtype_t ab_dts[][2] = {{MT_F32, MT_F32}, {MT_BF16, MT_BF16}, {MT_F32, MT_BF16}};
    for (int pi = 0; pi < g_npaths; pi++)
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (int t = 0; t < 4; t++)
                for (int bi = 0; bi < 2; bi++)
                    for (int ci = 0; ci < 2; ci++)
                        for (int di = 0; di < 3; di++) {
                            const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                            /* the big shape with one dtype mix per C dtype is enough */
                            if (si == 4 && di != (t + ci) % 3) continue;
                            const bool ta = t & 1, tb = t >> 1;
                            const mt_dtype_t c_dt = ci ? MT_BF16 : MT_F32;
                            mat_t A = mat_make(&rng, ta ? K : M, ta ? M : K, ab_dts[di][0], 1.0f);
                            mat_t B = mat_make(&rng, tb ? N : K, tb ? K : N, ab_dts[di][1], 1.0f);
                            mat_t C0 = mat_make(&rng, M, N, c_dt, 1.0f);
                            mat_t C = mat_make(&rng, M, N, c_dt, 1.0f);
                            const float beta = (float)bi;
                            if (beta == 0.0f) mat_fill_nan(&C, (size_t)M * N);
                            else mat_copy_from(&C, &C0, (size_t)M * N);
                            const kern_mm_t p = {.C = C.view, .A = A.view, .B = B.view,
                                                 .trans_a = ta, .trans_b = tb, .alpha = 0.75f,
                                                 .beta = beta, .compute = MT_BF16};
                            kern_mm_grouped_cpu_path(env->s, &p, 1, g_paths[pi]);
                            char tag[200];
                            snprintf(tag, sizeof tag,
                                     "bf16 [%s] M=%d N=%d K=%d ta=%d tb=%d beta=%g C %s A %s B %s",
                                     kern_cpu_bf16_path_name(g_paths[pi]), M, N, K, ta, tb,
                                     (double)beta, mt_dtype_name(c_dt),
                                     mt_dtype_name(ab_dts[di][0]), mt_dtype_name(ab_dts[di][1]));
                            check_mm(tag, &p, &C, &C0, &A, &B);
                            mat_free(&A);
                            mat_free(&B);
                            mat_free(&C0);
                            mat_free(&C);
                        }
}

/* K = 0 is an empty sum: beta 0 zeroes C (from NaN), beta 1 keeps it. */
static void test_k0(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 72);
    for (int pi = 0; pi < g_npaths; pi++)
        for (int ci = 0; ci < 2; ci++)
            for (int bi = 0; bi < 2; bi++) {
                const int M = 6, N = 37;
                const mt_dtype_t c_dt = ci ? MT_BF16 : MT_F32;
                mat_t C0 = mat_make(&rng, M, N, c_dt, 1.0f), C = mat_make(&rng, M, N, c_dt, 1.0f);
                if (bi) mat_copy_from(&C, &C0, (size_t)M * N);
                else mat_fill_nan(&C, (size_t)M * N);
                float a = 1.0f, b = 1.0f;
                const kern_mm_t p = {.C = C.view, .A = {&a, MT_F32, M, 0}, .B = {&b, MT_F32, 0, N},
                                     .alpha = 1.0f, .beta = (float)bi, .compute = MT_BF16};
                kern_mm_grouped_cpu_path(env->s, &p, 1, g_paths[pi]);
                int bad = 0;
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    const float want = bi ? mat_get(&C0, i) : 0.0f;
                    const float got = mat_get(&C, i);
                    bad += memcmp(&got, &want, sizeof got) != 0;
                }
                tu_expect(bad == 0, "K=0 [%s] C %s beta %d: %d elements not beta * C",
                          kern_cpu_bf16_path_name(g_paths[pi]), mt_dtype_name(c_dt), bi, bad);
                mat_free(&C0);
                mat_free(&C);
            }
}

/* One fp32 product straight through gemm.c's sgemm pieces. */
static void sgemm_f32(tu_env_t *env, float *C, const float *A, const float *B, int M, int N, int K, bool ta,
                      bool tb, float alpha, float beta) {
    const kern_cpu_sgemm_t g = {.C = C, .A = A, .B = B, .M = M, .N = N, .K = K, .ta = ta, .tb = tb,
                                .alpha = alpha, .beta = beta};
    kern_cpu_sgemm_batch(env->s, &g, 1);
}

/* fp32 compute must be the very sgemm calls of kern_cpu_sgemm_batch, with
 * no conversion or copy in between. */
static void test_f32_bitwise(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 73);
    static const int shapes[][3] = {{5, 7, 3}, {33, 17, 64}, {200, 96, 150}, {64, 260, 33}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int t = 0; t < 4; t++)
            for (int bi = 0; bi < 2; bi++) {
                const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                const bool ta = t & 1, tb = t >> 1;
                const float beta = (float)bi, alpha = 0.5f;
                float *A = tu_rand(&rng, (size_t)M * K, 1.0f), *B = tu_rand(&rng, (size_t)K * N, 1.0f);
                float *C1 = tu_rand(&rng, (size_t)M * N, 1.0f), *C2 = tu_copy(C1, (size_t)M * N);
                sgemm_f32(env, C1, A, B, M, N, K, ta, tb, alpha, beta);
                const kern_mm_t p = {.C = {C2, MT_F32, M, N}, .A = {A, MT_F32, ta ? K : M, ta ? M : K},
                                     .B = {B, MT_F32, tb ? N : K, tb ? K : N}, .trans_a = ta,
                                     .trans_b = tb, .alpha = alpha, .beta = beta, .compute = MT_F32};
                kern_mm_cpu(env->s, &p);
                char tag[128];
                snprintf(tag, sizeof tag, "f32 kern_mm == sgemm M=%d N=%d K=%d ta=%d tb=%d beta=%g",
                         M, N, K, ta, tb, (double)beta);
                tu_check_bitwise(tag, C2, C1, (size_t)M * N);
                /* and into a BF16 C: the fp32 result rounded once */
                uint16_t *Ch = malloc((size_t)M * N * sizeof *Ch);
                float *C3 = tu_copy(C2, (size_t)M * N), *Cw = tu_alloc((size_t)M * N);
                MT_CHECK(Ch, "out of memory");
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    Ch[i] = mt_f32_to_bf16(C2[i]);
                    C3[i] = mt_bf16_to_f32(Ch[i]);
                }
                sgemm_f32(env, C3, A, B, M, N, K, ta, tb, alpha, beta);
                kern_mm_t q = p;
                q.C = (kern_mat_t){Ch, MT_BF16, M, N};
                kern_mm_cpu(env->s, &q);
                for (size_t i = 0; i < (size_t)M * N; i++) {
                    Cw[i] = mt_bf16_to_f32(Ch[i]);
                    C3[i] = round_bf16(C3[i]);
                }
                snprintf(tag, sizeof tag, "f32 compute into BF16 C M=%d N=%d K=%d ta=%d tb=%d beta=%g",
                         M, N, K, ta, tb, (double)beta);
                tu_check_bitwise(tag, Cw, C3, (size_t)M * N);
                free(A);
                free(B);
                free(C1);
                free(C2);
                free(C3);
                free(Cw);
                free(Ch);
            }
    /* grouped: kern_mm_grouped == one sgemm batch */
    enum { G = 5 };
    const int Ms[G] = {40, 0, 17, 130, 3}, N = 48, K = 72;
    kern_cpu_sgemm_t d[G];
    kern_mm_t p[G];
    float *bufs[3 * G + G];
    for (int g = 0; g < G; g++) {
        float *A = tu_rand(&rng, (size_t)Ms[g] * K + 1, 1.0f), *B = tu_rand(&rng, (size_t)N * K, 1.0f);
        float *C1 = tu_rand(&rng, (size_t)Ms[g] * N + 1, 1.0f), *C2 = tu_copy(C1, (size_t)Ms[g] * N + 1);
        bufs[4 * g] = A, bufs[4 * g + 1] = B, bufs[4 * g + 2] = C1, bufs[4 * g + 3] = C2;
        d[g] = (kern_cpu_sgemm_t){.C = C1, .A = A, .B = B, .M = Ms[g], .N = N, .K = K, .tb = true,
                                  .alpha = 1.0f, .beta = 1.0f};
        p[g] = (kern_mm_t){.C = {C2, MT_F32, Ms[g], N}, .A = {A, MT_F32, Ms[g], K},
                           .B = {B, MT_F32, N, K}, .trans_b = true, .alpha = 1.0f, .beta = 1.0f,
                           .compute = MT_F32};
    }
    kern_cpu_sgemm_batch(env->s, d, G);
    kern_mm_grouped_cpu(env->s, p, G);
    for (int g = 0; g < G; g++) {
        char tag[96];
        snprintf(tag, sizeof tag, "f32 grouped group %d (M=%d)", g, Ms[g]);
        tu_check_bitwise(tag, bufs[4 * g + 3], bufs[4 * g + 2], (size_t)Ms[g] * N);
    }
    for (int i = 0; i < 4 * G; i++) free(bufs[i]);
}

/* A grouped call equals the same products made one at a time. */
static void test_grouped(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 74);
    enum { G = 6 };
    const int Ms[G] = {19, 0, 40, 7, 33, 12}, Ks[G] = {50, 30, 0, 65, 8, 128}, N = 45;
    for (int pi = 0; pi < g_npaths; pi++) {
        mat_t A[G], B[G], C1[G], C2[G];
        kern_mm_t p[G];
        for (int g = 0; g < G; g++) {
            const bool ta = g & 1, tb = (g >> 1) & 1;
            const mt_dtype_t ab = g % 3 ? MT_BF16 : MT_F32, c_dt = g % 2 ? MT_BF16 : MT_F32;
            A[g] = mat_make(&rng, ta ? Ks[g] : Ms[g], ta ? Ms[g] : Ks[g], ab, 1.0f);
            B[g] = mat_make(&rng, tb ? N : Ks[g], tb ? Ks[g] : N, MT_F32, 1.0f);
            C1[g] = mat_make(&rng, Ms[g], N, c_dt, 1.0f);
            C2[g] = mat_make(&rng, Ms[g], N, c_dt, 1.0f);
            mat_copy_from(&C2[g], &C1[g], (size_t)Ms[g] * N);
            p[g] = (kern_mm_t){.C = C1[g].view, .A = A[g].view, .B = B[g].view, .trans_a = ta,
                               .trans_b = tb, .alpha = 1.5f, .beta = (float)(g % 2),
                               .compute = MT_BF16};
        }
        kern_mm_grouped_cpu_path(env->s, p, G, g_paths[pi]);
        for (int g = 0; g < G; g++) {
            kern_mm_t q = p[g];
            q.C = C2[g].view;
            kern_mm_grouped_cpu_path(env->s, &q, 1, g_paths[pi]);
            const size_t n = (size_t)Ms[g] * N;
            int bad = 0;
            for (size_t i = 0; i < n; i++) {
                const float x = mat_get(&C1[g], i), y = mat_get(&C2[g], i);
                bad += memcmp(&x, &y, sizeof x) != 0;
            }
            tu_expect(bad == 0, "grouped [%s] group %d (M=%d K=%d): %d elements differ from a single call",
                      kern_cpu_bf16_path_name(g_paths[pi]), g, Ms[g], Ks[g], bad);
        }
        for (int g = 0; g < G; g++) {
            mat_free(&A[g]);
            mat_free(&B[g]);
            mat_free(&C1[g]);
            mat_free(&C2[g]);
        }
    }
}

static tu_env_t env_threads(int threads) {
    tu_env_t env = {0};
    kern_device_opts_t opts = {.device_budget_bytes = 1 << 20, .host_threads = threads};
    mt_error_t err = {0};
    MT_CHECK(kern_cpu_device_create(&opts, &env.dev, &err) == MT_OK, "CPU device: %s", err.msg);
    env.s = env.dev->streams[KERN_STREAM_COMPUTE];
    return env;
}

/* The same bf16 product on 1, 2 and 3 threads, twice each: bit-identical. */
static void test_threads(void) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 75);
    const int M = 150, N = 530, K = 300;
    mat_t A = mat_make(&rng, M, K, MT_F32, 1.0f), B = mat_make(&rng, N, K, MT_BF16, 1.0f);
    for (int pi = 0; pi < g_npaths; pi++) {
        float *first = NULL;
        for (int threads = 1; threads <= 3; threads++) {
            tu_env_t env = env_threads(threads);
            for (int rep = 0; rep < 2; rep++) {
                float *C = tu_alloc((size_t)M * N);
                tu_fill_nan(C, (size_t)M * N);
                const kern_mm_t p = {.C = {C, MT_F32, M, N}, .A = A.view, .B = B.view,
                                     .trans_b = true, .alpha = 1.0f, .compute = MT_BF16};
                kern_mm_grouped_cpu_path(env.s, &p, 1, g_paths[pi]);
                if (!first) {
                    first = C;
                    continue;
                }
                char tag[96];
                snprintf(tag, sizeof tag, "[%s] %d threads, run %d vs 1 thread",
                         kern_cpu_bf16_path_name(g_paths[pi]), threads, rep);
                tu_check_bitwise(tag, C, first, (size_t)M * N);
                free(C);
            }
            tu_env_close(&env);
        }
        free(first);
    }
    mat_free(&A);
    mat_free(&B);
}

static jmp_buf g_jmp;
static char g_fatal_msg[512];
static void fatal_to_longjmp(const char *msg) {
    snprintf(g_fatal_msg, sizeof g_fatal_msg, "%s", msg);
    longjmp(g_jmp, 1);
}

static void test_shape_mismatch(tu_env_t *env) {
    float a[12] = {0}, b[12] = {0}, c[12] = {0};
    const kern_mm_t p = {.C = {c, MT_F32, 3, 4}, .A = {a, MT_F32, 3, 2}, .B = {b, MT_F32, 3, 4},
                         .alpha = 1.0f, .compute = MT_F32};
    volatile int fatal = 0;
    g_fatal_msg[0] = 0;
    mt_set_fatal_hook(fatal_to_longjmp);
    if (setjmp(g_jmp) == 0) kern_mm_cpu(env->s, &p);
    else fatal = 1;
    mt_set_fatal_hook(NULL);
    tu_expect(fatal == 1, "kern_mm with K 2 vs 3 did not fail");
    tu_expect(strstr(g_fatal_msg, "C (3, 4)") && strstr(g_fatal_msg, "A (3, 2)") &&
                  strstr(g_fatal_msg, "B (3, 4)"),
              "shape mismatch message does not name the three shapes: '%s'", g_fatal_msg);
}

int main(void) {
    for (int i = 0; i < KERN_CPU_BF16_PATHS; i++)
        if (kern_cpu_bf16_path_available((kern_cpu_bf16_path_t)i))
            g_paths[g_npaths++] = (kern_cpu_bf16_path_t)i;
    printf("bf16 paths on this CPU:");
    for (int i = 0; i < g_npaths; i++) printf(" [%s]", kern_cpu_bf16_path_name(g_paths[i]));
    printf("; default [%s]\n", kern_cpu_bf16_path_name(kern_cpu_bf16_path_default()));
    tu_env_t env = tu_env_open();
    test_bf16(&env);
    test_k0(&env);
    test_f32_bitwise(&env);
    test_grouped(&env);
    test_shape_mismatch(&env);
    tu_env_close(&env);
    test_threads();
    /* with OpenBLAS on one thread, sgemm products are cut into pieces */
    openblas_set_num_threads(1);
    tu_env_t env1 = env_threads(2);
    test_f32_bitwise(&env1);
    test_bf16(&env1);
    tu_env_close(&env1);
    return tu_finish("mm_test");
}
