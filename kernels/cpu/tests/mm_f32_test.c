/* fp32 matrix products through kern_mm (kernels/gemm.h): F32 operands,
 * F32 compute, F32 C, the products every fp32 run makes.
 *
 * - All four (trans_a, trans_b) combinations, beta 0 (C preset to NaN: it
 *   must be overwritten, not scaled) and beta 1 (accumulate), alpha != 1,
 *   against a double reference.
 * - K = 0: beta 0 zeroes C (from NaN), beta 1 leaves it unchanged.
 * - The linear layer of gemm.h's comment: y = x W^T, dx = dy W,
 *   dW += dy^T x, checked against finite differences of L = sum(y * R).
 * - Grouped products as the MoE experts use them (packed token rows, one
 *   weight per expert) with experts of zero tokens: forward groups with
 *   M = 0 are skipped, weight-gradient groups with K = 0 leave dW unchanged
 *   under beta 1 and zero it under beta 0. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/gemm.h"

/* C = alpha op(A) op(B) + beta C, all fp32, through kern_mm_cpu. */
static void mm_f32(tu_env_t *env, float *C, const float *A, const float *B, int M, int N, int K, bool ta,
                   bool tb, float alpha, float beta) {
    const kern_mm_t p = kern_mm_make(C, A, MT_F32, B, MT_F32, M, N, K, ta, tb, alpha, beta, MT_F32);
    kern_mm_cpu(env->s, &p);
}

/* Tolerance of a K-term fp32 dot product: the classic bound
 * |err| <= gamma_K * sum_k |a_k b_k| with gamma_K ~ K * 2^-24; blocked and
 * FMA summation only do better. Use 2 * K * FLT_EPSILON * sum|a b| (4x the
 * bound, for alpha and the beta * C addition) plus 2 ulp of |beta C|. */
static double dot_tol(int K, double sum_abs, double beta_c) {
    return 2.0 * (K + 2) * FLT_EPSILON * sum_abs + 2.0 * FLT_EPSILON * fabs(beta_c);
}

/* op(A)[i,p], op(B)[p,j] for the row-major storage of gemm.h */
static float at(const float *A, int M, int K, bool ta, int i, int p) {
    return ta ? A[(size_t)p * M + i] : A[(size_t)i * K + p];
}
static float bt(const float *B, int K, int N, bool tb, int p, int j) {
    return tb ? B[(size_t)j * K + p] : B[(size_t)p * N + j];
}

/* Checks C against alpha op(A) op(B) + beta C0, element-wise with dot_tol. */
static void check_product(const char *tag, const float *C, const float *C0, const float *A,
                          const float *B, int M, int N, int K, bool ta, bool tb, float alpha,
                          float beta) {
    int bad = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0, sa = 0;
            for (int p = 0; p < K; p++) {
                const double t = (double)at(A, M, K, ta, i, p) * bt(B, K, N, tb, p, j);
                s += t;
                sa += fabs(t);
            }
            const double bc = beta == 0.0f ? 0.0 : (double)beta * C0[(size_t)i * N + j];
            const double ref = alpha * s + bc;
            const double tol = dot_tol(K, fabs(alpha) * sa, bc) + 1e-30;
            const double d = fabs((double)C[(size_t)i * N + j] - ref);
            if (!(d <= tol)) {
                if (!bad)
                    fprintf(stderr, "FAIL: %s: C[%d,%d] = %.9g, want %.9g (tol %.3g)\n", tag, i, j,
                            (double)C[(size_t)i * N + j], ref, tol);
                bad++;
            }
        }
    if (bad) tu_expect(false, "%s: %d of %d elements wrong", tag, bad, M * N);
}

static void test_plain(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 51);
    static const int shapes[][3] = {{5, 7, 3}, {1, 1, 1}, {33, 17, 64}, {8, 1, 40}, {1, 9, 2}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int ta = 0; ta < 2; ta++)
            for (int tb = 0; tb < 2; tb++)
                for (int bi = 0; bi < 2; bi++) {
                    const int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
                    const float beta = (float)bi, alpha = 0.75f;
                    char tag[128];
                    snprintf(tag, sizeof tag, "mm f32 M=%d N=%d K=%d ta=%d tb=%d beta=%g", M, N, K,
                             ta, tb, (double)beta);
                    float *A = tu_rand(&rng, (size_t)M * K, 1.0f);
                    float *B = tu_rand(&rng, (size_t)K * N, 1.0f);
                    float *C0 = tu_rand(&rng, (size_t)M * N, 1.0f);
                    float *C = tu_copy(C0, (size_t)M * N);
                    if (beta == 0.0f) tu_fill_nan(C, (size_t)M * N); /* "C may hold garbage/NaN" */
                    mm_f32(env, C, A, B, M, N, K, ta, tb, alpha, beta);
                    check_product(tag, C, C0, A, B, M, N, K, ta, tb, alpha, beta);
                    free(A); free(B); free(C0); free(C);
                }
    printf("plain products: 5 shapes x 4 transpositions x beta {0, 1} checked\n");
}

static void test_k0(tu_env_t *env) {
    float C[6], keep[6] = {1, 2, 3, 4, 5, 6};
    float dummy = 0.0f;
    tu_fill_nan(C, 6);
    mm_f32(env, C, &dummy, &dummy, 2, 3, 0, false, false, 1.0f, 0.0f);
    int bad = 0;
    for (int i = 0; i < 6; i++) bad += C[i] != 0.0f;
    tu_expect(bad == 0, "mm f32 K=0 beta=0 must zero C (an empty sum), %d elements not 0", bad);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            memcpy(C, keep, sizeof C);
            mm_f32(env, C, &dummy, &dummy, 2, 3, 0, ta, tb, 1.0f, 1.0f);
            tu_check_bitwise("mm f32 K=0 beta=1 leaves C unchanged", C, keep, 6);
            tu_fill_nan(C, 6);
            mm_f32(env, C, &dummy, &dummy, 2, 3, 0, ta, tb, 0.5f, 0.0f);
            bad = 0;
            for (int i = 0; i < 6; i++) bad += C[i] != 0.0f;
            tu_expect(bad == 0, "mm f32 K=0 beta=0 ta=%d tb=%d: %d elements not zeroed", ta, tb, bad);
        }
    /* M = 0 or N = 0: nothing to do, nothing touched */
    memcpy(C, keep, sizeof C);
    mm_f32(env, C, &dummy, &dummy, 0, 3, 4, false, false, 1.0f, 0.0f);
    mm_f32(env, C, &dummy, &dummy, 2, 0, 4, true, true, 1.0f, 0.0f);
    tu_check_bitwise("mm f32 M=0 / N=0 touch nothing", C, keep, 6);
}

/* ---- linear layer gradients against FD ---- */
typedef struct {
    tu_env_t *env;
    float *x, *W, *y, *R;
    int rows, in, out;
} lin_t;

static double lin_loss(void *p) {
    lin_t *c = p;
    mm_f32(c->env, c->y, c->x, c->W, c->rows, c->out, c->in, false, true, 1.0f, 0.0f);
    return tu_dot(c->y, c->R, (size_t)c->rows * c->out);
}

static void test_linear_grads(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 52);
    lin_t c = {.env = env, .rows = 6, .in = 9, .out = 5};
    c.x = tu_rand(&rng, (size_t)c.rows * c.in, 1.0f);
    c.W = tu_rand(&rng, (size_t)c.out * c.in, 1.0f);
    c.y = tu_alloc((size_t)c.rows * c.out);
    c.R = tu_rand(&rng, (size_t)c.rows * c.out, 1.0f);
    float *dx = tu_alloc((size_t)c.rows * c.in), *dW = tu_alloc((size_t)c.out * c.in);
    tu_fill_nan(dx, (size_t)c.rows * c.in);
    for (int i = 0; i < c.out * c.in; i++) dW[i] = 1.0f; /* accumulates onto 1 */
    mm_f32(env, dx, c.R, c.W, c.rows, c.in, c.out, false, false, 1.0f, 0.0f);
    mm_f32(env, dW, c.R, c.x, c.out, c.in, c.rows, true, false, 1.0f, 1.0f);
    for (int i = 0; i < c.out * c.in; i++) dW[i] -= 1.0f;
    double *fx = tu_alloc_d((size_t)c.rows * c.in), *fW = tu_alloc_d((size_t)c.out * c.in);
    /* linear in each input: no truncation error; noise ~sqrt(out) ulp of
     * O(1) outputs over 2h ~ 1e-4; the -1 after accumulation adds 1 ulp of 1
     * (6e-8). 1e-3 norm-wise, 1e-2 per element above 5% of the max. */
    tu_fd_grad(lin_loss, &c, c.x, (size_t)c.rows * c.in, 1e-3, 1.0, fx);
    tu_fd_grad(lin_loss, &c, c.W, (size_t)c.out * c.in, 1e-3, 1.0, fW);
    tu_check_grad("linear dx = dy W", dx, fx, (size_t)c.rows * c.in, 1e-3, 1e-2, 0.05);
    tu_check_grad("linear dW += dy^T x", dW, fW, (size_t)c.out * c.in, 1e-3, 1e-2, 0.05);
    free(c.x); free(c.W); free(c.y); free(c.R); free(dx); free(dW); free(fx); free(fW);
}

/* ---- grouped products: experts over packed token rows ---- */
static void test_grouped(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 53);
    enum { E = 5, H = 6, I = 4 };
    static const int counts[E] = {3, 0, 5, 0, 1}; /* experts 1 and 3 got no token */
    int off[E + 1] = {0};
    for (int e = 0; e < E; e++) off[e + 1] = off[e] + counts[e];
    const int m = off[E];
    float *X = tu_rand(&rng, (size_t)m * H, 1.0f);     /* packed tokens (m, H) */
    float *W = tu_rand(&rng, (size_t)E * I * H, 1.0f); /* per expert (I, H) */
    float *Y = tu_alloc((size_t)m * I);
    tu_fill_nan(Y, (size_t)m * I);
    kern_mm_t d[E];
    for (int e = 0; e < E; e++)
        d[e] = kern_mm_make(Y + (size_t)off[e] * I, X + (size_t)off[e] * H, MT_F32, W + (size_t)e * I * H, MT_F32,
                            counts[e], I, H, false, true, 1.0f, 0.0f, MT_F32);
    /* y_e = x_e W_e^T */
    kern_mm_grouped_cpu(env->s, d, E);
    for (int e = 0; e < E; e++) {
        char tag[64];
        snprintf(tag, sizeof tag, "grouped forward expert %d (M=%d)", e, counts[e]);
        check_product(tag, Y + (size_t)off[e] * I, NULL, X + (size_t)off[e] * H,
                      W + (size_t)e * I * H, counts[e], I, H, false, true, 1.0f, 0.0f);
    }

    /* dW_e (I, H) += dY_e^T X_e: K = count, so empty experts have K = 0 */
    float *dY = tu_rand(&rng, (size_t)m * I, 1.0f);
    for (int b = 0; b < 2; b++) {
        const float beta = (float)b;
        float *dW = tu_rand(&rng, (size_t)E * I * H, 1.0f), *dW0 = tu_copy(dW, (size_t)E * I * H);
        if (beta == 0.0f) tu_fill_nan(dW, (size_t)E * I * H);
        for (int e = 0; e < E; e++)
            d[e] = kern_mm_make(dW + (size_t)e * I * H, dY + (size_t)off[e] * I, MT_F32, X + (size_t)off[e] * H,
                                MT_F32, I, H, counts[e], true, false, 1.0f, beta, MT_F32);
        kern_mm_grouped_cpu(env->s, d, E);
        for (int e = 0; e < E; e++) {
            char tag[96];
            snprintf(tag, sizeof tag, "grouped weight grad expert %d (K=%d) beta=%g", e, counts[e],
                     (double)beta);
            check_product(tag, dW + (size_t)e * I * H, dW0 + (size_t)e * I * H,
                          dY + (size_t)off[e] * I, X + (size_t)off[e] * H, I, H, counts[e], true,
                          false, 1.0f, beta);
        }
        free(dW);
        free(dW0);
    }
    /* zero groups, and a group list that is empty */
    kern_mm_grouped_cpu(env->s, d, 0);
    printf("grouped products: %d experts, %d without tokens, checked\n", E, 2);
    free(X); free(W); free(Y); free(dY);
}

/* ops.h: the same inputs give bit-identical outputs run to run (OpenBLAS
 * splits M and N over its threads, never K, so this must hold). */
static void test_deterministic(tu_env_t *env) {
    tu_rng_t rng;
    tu_rng_seed(&rng, 54);
    const int M = 192, N = 160, K = 320;
    float *A = tu_rand(&rng, (size_t)M * K, 1.0f), *B = tu_rand(&rng, (size_t)K * N, 1.0f);
    float *C1 = tu_alloc((size_t)M * N), *C2 = tu_alloc((size_t)M * N);
    for (int rep = 0; rep < 3; rep++) {
        mm_f32(env, C1, A, B, M, N, K, false, false, 1.0f, 0.0f);
        mm_f32(env, C2, A, B, M, N, K, false, false, 1.0f, 0.0f);
        tu_check_bitwise("mm f32 192x160x320 run twice", C2, C1, (size_t)M * N);
    }
    free(A); free(B); free(C1); free(C2);
}

int main(void) {
    tu_env_t env = tu_env_open();
    test_plain(&env);
    test_deterministic(&env);
    test_k0(&env);
    test_linear_grads(&env);
    test_grouped(&env);
    tu_env_close(&env);
    return tu_finish("mm_f32_test");
}
