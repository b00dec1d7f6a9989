/* RoPE (kernels/rope.h): the cos/sin table against HF's inv_freq formula,
 * the forward against the rotate_half formula written out in double, the
 * backward as the inverse rotation (bwd(fwd(x)) == x), and the backward
 * against finite differences of L = sum(rope(x) * R); with per-token
 * positions (packed rows), each token as if alone at its position. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/tests/testutil.h"
#include "kernels/rope.h"

typedef struct {
    tu_env_t *env;
    float *x, *tmp, *R, *cos_t, *sin_t;
    int B, T, heads, hd;
} ctx_t;

static double loss(void *p) {
    ctx_t *c = p;
    const size_t n = (size_t)c->B * c->T * c->heads * c->hd;
    for (size_t i = 0; i < n; i++) c->tmp[i] = c->x[i];
    kern_rope_fwd_cpu(c->env->s, c->tmp, c->cos_t, c->sin_t, NULL, c->B, c->T, c->heads, c->hd);
    return tu_dot(c->tmp, c->R, n);
}

/* HF (LlamaRotaryEmbedding / default rope init), all in fp32:
 *   inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))
 *   freqs = inv_freq (x) positions (an fp32 product per element), cos/sin in fp32.
 * Reference: the same fp32 steps with the pow and cos/sin done in double
 * then rounded; torch's powf/cosf may differ from that by an ulp or so.
 * An ulp of inv_freq moves the angle by ~1.2e-7 * angle, so the tolerance is
 * 1e-6 + 4e-7 * angle (3 ulp of the angle plus a few ulp of cos/sin). */
static void check_table(int T, int hd, float theta) {
    const int half = hd / 2;
    float *ct = tu_alloc((size_t)T * half), *st = tu_alloc((size_t)T * half);
    kern_rope_table(ct, st, T, hd, theta);
    int bad = 0;
    double worst = 0;
    for (int i = 0; i < half; i++) {
        const float expo = (float)(2 * i) / (float)hd;
        const float powv = (float)pow((double)theta, (double)expo);
        const float inv_freq = 1.0f / powv;
        /* the exact (double) formula, for a looser second check */
        const double inv_freq_exact = 1.0 / pow((double)theta, 2.0 * i / hd);
        for (int t = 0; t < T; t++) {
            const float angle = (float)t * inv_freq;
            const double tol = 1e-6 + 4e-7 * fabs((double)angle);
            const double ec = fabs(ct[(size_t)t * half + i] - cos((double)angle));
            const double es = fabs(st[(size_t)t * half + i] - sin((double)angle));
            /* vs the exact angle: fp32 rounding of the exponent, pow, divide
             * and product, each <= 0.5 ulp, scaled by ln(theta) for the
             * exponent: ~(4 + ln theta) * 6e-8 * angle; 2e-6 * angle covers
             * theta up to 1e6 with margin. */
            const double angle_exact = t * inv_freq_exact;
            const double tol_exact = 1e-6 + 2e-6 * angle_exact;
            const double ecx = fabs(ct[(size_t)t * half + i] - cos(angle_exact));
            const double esx = fabs(st[(size_t)t * half + i] - sin(angle_exact));
            if (ec > tol || es > tol || ecx > tol_exact || esx > tol_exact) {
                if (!bad)
                    fprintf(stderr,
                            "FAIL: rope table T=%d hd=%d theta=%g at t=%d i=%d: cos %.9g sin %.9g, "
                            "HF-fp32 ref cos %.9g sin %.9g (angle %.9g)\n",
                            T, hd, (double)theta, t, i, (double)ct[(size_t)t * half + i],
                            (double)st[(size_t)t * half + i], cos((double)angle),
                            sin((double)angle), (double)angle);
                bad++;
            }
            if (ec / tol > worst) worst = ec / tol;
            if (es / tol > worst) worst = es / tol;
        }
    }
    printf("  rope table T=%d hd=%d theta=%g: worst at %.2f of tol\n", T, hd, (double)theta, worst);
    tu_expect(bad == 0, "rope table T=%d hd=%d theta=%g: %d mismatches", T, hd, (double)theta, bad);
    free(ct);
    free(st);
}

static void run_case(tu_env_t *env, int B, int T, int heads, int hd, float theta, uint64_t seed) {
    printf("case B=%d T=%d heads=%d hd=%d theta=%g\n", B, T, heads, hd, (double)theta);
    tu_rng_t rng;
    tu_rng_seed(&rng, seed);
    const int half = hd / 2;
    const size_t n = (size_t)B * T * heads * hd;
    ctx_t c = {.env = env, .B = B, .T = T, .heads = heads, .hd = hd};
    c.cos_t = tu_alloc((size_t)T * half);
    c.sin_t = tu_alloc((size_t)T * half);
    kern_rope_table(c.cos_t, c.sin_t, T, hd, theta);
    c.x = tu_rand(&rng, n, 1.0f);
    c.R = tu_rand(&rng, n, 1.0f);
    c.tmp = tu_alloc(n);

    /* forward vs the formula in rope.h, position = index within the sequence */
    double *ref = tu_alloc_d(n);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < heads; h++) {
                const size_t base = (((size_t)b * T + t) * heads + h) * hd;
                for (int i = 0; i < half; i++) {
                    const double co = c.cos_t[(size_t)t * half + i], si = c.sin_t[(size_t)t * half + i];
                    const double x1 = c.x[base + i], x2 = c.x[base + i + half];
                    ref[base + i] = x1 * co - x2 * si;
                    ref[base + i + half] = x2 * co + x1 * si;
                }
            }
    float *y = tu_copy(c.x, n);
    kern_rope_fwd_cpu(env->s, y, c.cos_t, c.sin_t, NULL, B, T, heads, hd);
    /* two fp32 products and a sum of O(1) values: a few ulp; 1e-6 absolute */
    tu_check_close("rope forward vs formula", y, ref, n, 1e-6, 1e-6);

    /* the inverse rotation restores x: cos^2 + sin^2 = 1 up to a few ulp */
    kern_rope_bwd_cpu(env->s, y, c.cos_t, c.sin_t, NULL, B, T, heads, hd);
    tu_check_close_f("rope bwd(fwd(x)) == x", y, c.x, n, 0, 2e-6);

    /* backward against FD: the rotation is linear, so FD truncation error is
     * zero and only rounding noise (~hd ulp of O(1) / 2h ~ 1e-4) remains */
    float *g = tu_copy(c.R, n);
    kern_rope_bwd_cpu(env->s, g, c.cos_t, c.sin_t, NULL, B, T, heads, hd);
    double *fd = tu_alloc_d(n);
    tu_fd_grad(loss, &c, c.x, n, 1e-3, 1.0, fd);
    tu_check_grad("rope dx (bwd applied to R)", g, fd, n, 1e-3, 1e-2, 0.05);

    free(c.cos_t); free(c.sin_t); free(c.x); free(c.R); free(c.tmp);
    free(ref); free(y); free(g); free(fd);
}

/* Packed rows (pos given): each token is rotated by its own position, the
 * same bits as that token placed at that index of an unpacked row; the
 * backward with pos undoes the forward with pos. */
static void packed_case(tu_env_t *env, int hd) {
    const int B = 2, T = 19, heads = 3, half = hd / 2, w = heads * hd;
    const size_t n = (size_t)B * T * w;
    tu_rng_t rng;
    tu_rng_seed(&rng, (uint64_t)hd);
    float *x = tu_rand(&rng, n, 1.0f), *ct = tu_alloc((size_t)T * half), *st = tu_alloc((size_t)T * half);
    kern_rope_table(ct, st, T, hd, 10000.0f);
    int32_t pos[2 * 19];
    const int starts[2][3] = {{0, 5, 6}, {0, 13, 19}}; /* examples of 5, 1, 13 and 13, 6 tokens */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            int s0 = 0;
            for (int e = 0; e < 3; e++)
                if (starts[b][e] <= t) s0 = starts[b][e];
            pos[b * T + t] = t - s0;
        }
    float *y = tu_copy(x, n), *one = tu_alloc((size_t)T * w);
    kern_rope_fwd_cpu(env->s, y, ct, st, pos, B, T, heads, hd);
    for (int r = 0; r < B * T; r++) { /* row r alone at index pos[r] of a row */
        memset(one, 0, (size_t)T * w * sizeof *one);
        memcpy(one + (size_t)pos[r] * w, x + (size_t)r * w, (size_t)w * sizeof *one);
        kern_rope_fwd_cpu(env->s, one, ct, st, NULL, 1, T, heads, hd);
        char what[96];
        snprintf(what, sizeof what, "rope hd=%d packed: token %d at position %d", hd, r, pos[r]);
        tu_check_bitwise(what, y + (size_t)r * w, one + (size_t)pos[r] * w, (size_t)w);
    }
    kern_rope_bwd_cpu(env->s, y, ct, st, pos, B, T, heads, hd);
    tu_check_close_f("rope packed bwd(fwd(x)) == x", y, x, n, 0, 2e-6);
    free(x), free(ct), free(st), free(y), free(one);
}

int main(void) {
    check_table(64, 16, 10000.0f);
    check_table(4096, 128, 10000.0f);   /* Mixtral / Qwen2-MoE head_dim, long context */
    check_table(4096, 128, 1000000.0f); /* Qwen3-MoE rope_theta */
    check_table(3, 2, 10000.0f);
    tu_env_t env = tu_env_open();
    run_case(&env, 2, 5, 3, 8, 10000.0f, 11);
    run_case(&env, 1, 17, 2, 16, 1000000.0f, 12);
    run_case(&env, 3, 1, 4, 4, 10000.0f, 13);
    packed_case(&env, 16);
    packed_case(&env, 64);
    packed_case(&env, 12);
    tu_env_close(&env);
    return tu_finish("rope_test");
}
