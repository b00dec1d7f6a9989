/* eng_lr_at against values derived by hand from transformers'
 * optimization.py formulas (derivations beside each case).  The peak lr is
 * 2.0 so every expected value is 2 x the multiplier. */
#include <math.h>
#include <stdio.h>

#include "engine/config/config.h"

static int failures;

/* Rational cases are exact in binary (k/2, k/4, k/8 of 2.0) and must match
 * bit for bit.  Cosine values go through libm's cos and M_PI; 1e-12 covers
 * the last-bit rounding of cos and of the 13-digit decimals written below. */
#define EXACT 0.0
#define COS_TOL 1e-12

static void check(eng_lr_sched_t sched, int warmup, int step, int total, double want, double tol, int line) {
    eng_run_config_t cfg;
    eng_run_config_defaults(&cfg);
    cfg.learning_rate = 2.0;
    cfg.lr_scheduler = sched;
    cfg.warmup_steps = warmup;
    double got = eng_lr_at(&cfg, step, total);
    if (!(fabs(got - want) <= tol)) {
        fprintf(stderr, "lr_schedule_test.c:%d: sched %d warmup %d step %d total %d: got %.17g, want %.17g\n", line,
                (int)sched, warmup, step, total, got, want);
        failures++;
    }
}
#define CHECK(s, w, step, total, want, tol) check(s, w, step, total, want, tol, __LINE__)

int main(void) {
    /* constant: lambda = 1 always; HF's get_constant_schedule ignores warmup */
    CHECK(ENG_LR_CONSTANT, 5, 0, 10, 2.0, EXACT);
    CHECK(ENG_LR_CONSTANT, 5, 9, 10, 2.0, EXACT);
    CHECK(ENG_LR_CONSTANT, 0, 50, 10, 2.0, EXACT);

    /* constant_with_warmup, w = 4: s < 4 -> s / max(1.0, 4) = s/4; else 1 */
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 4, 0, 10, 0.0, EXACT); /* 0/4 */
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 4, 1, 10, 0.5, EXACT); /* 1/4 * 2 */
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 4, 3, 10, 1.5, EXACT); /* 3/4 * 2 */
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 4, 4, 10, 2.0, EXACT);
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 4, 100, 10, 2.0, EXACT);
    CHECK(ENG_LR_CONSTANT_WITH_WARMUP, 0, 0, 10, 2.0, EXACT); /* 0 < 0 false -> 1 */

    /* linear, w = 2, N = 10: s < 2 -> s/2; else max(0, (10 - s) / max(1, 8)) */
    CHECK(ENG_LR_LINEAR, 2, 0, 10, 0.0, EXACT);
    CHECK(ENG_LR_LINEAR, 2, 1, 10, 1.0, EXACT);   /* 1/2 * 2 */
    CHECK(ENG_LR_LINEAR, 2, 2, 10, 2.0, EXACT);   /* 8/8 */
    CHECK(ENG_LR_LINEAR, 2, 6, 10, 1.0, EXACT);   /* 4/8 = 0.5 */
    CHECK(ENG_LR_LINEAR, 2, 9, 10, 0.25, EXACT);  /* 1/8 */
    CHECK(ENG_LR_LINEAR, 2, 10, 10, 0.0, EXACT);  /* 0/8 */
    CHECK(ENG_LR_LINEAR, 2, 12, 10, 0.0, EXACT);  /* max(0, -2/8) */
    /* max(1, ...) guards: w = N = 5 -> (5 - 5)/max(1, 0) = 0; w = 0, N = 0 -> 0/1 */
    CHECK(ENG_LR_LINEAR, 5, 5, 5, 0.0, EXACT);
    CHECK(ENG_LR_LINEAR, 5, 4, 5, 1.6, EXACT);    /* warmup 4/5 * 2 = 1.6 (both round the same way) */
    CHECK(ENG_LR_LINEAR, 0, 0, 0, 0.0, EXACT);
    CHECK(ENG_LR_LINEAR, 0, 0, 1, 2.0, EXACT);    /* (1 - 0)/max(1, 1) */

    /* cosine, w = 2, N = 10: s < 2 -> s/2; else p = (s - 2)/8,
     * lambda = max(0, 0.5 * (1 + cos(pi * 0.5 * 2 * p))) = 0.5 * (1 + cos(pi p)) */
    CHECK(ENG_LR_COSINE, 2, 1, 10, 1.0, EXACT);  /* warmup 1/2 */
    CHECK(ENG_LR_COSINE, 2, 2, 10, 2.0, EXACT);  /* p = 0: cos 0 = 1 -> 1 */
    /* p = 2/8 = 1/4: 0.5 (1 + cos(pi/4)) = 0.5 (1 + sqrt(2)/2) = 0.8535533905933 -> x2 = 1.7071067811865 */
    CHECK(ENG_LR_COSINE, 2, 4, 10, 1.7071067811865, COS_TOL);
    /* p = 4/8 = 1/2: cos(pi/2) = 0 -> 0.5 -> x2 = 1 */
    CHECK(ENG_LR_COSINE, 2, 6, 10, 1.0, COS_TOL);
    /* p = 6/8 = 3/4: 0.5 (1 - sqrt(2)/2) = 0.1464466094067 -> x2 = 0.2928932188135 */
    CHECK(ENG_LR_COSINE, 2, 8, 10, 0.2928932188135, COS_TOL);
    /* p = 1: 0.5 (1 + cos pi) = 0 */
    CHECK(ENG_LR_COSINE, 2, 10, 10, 0.0, COS_TOL);
    /* p = 12/8 = 3/2: cos(3pi/2) = 0 -> 0.5 -> x2 = 1: HF's half-cosine rises again past N */
    CHECK(ENG_LR_COSINE, 2, 14, 10, 1.0, COS_TOL);
    /* w = 0, N = 3, s = 1: p = 1/3, cos(pi/3) = 1/2 -> 0.75 -> x2 = 1.5 */
    CHECK(ENG_LR_COSINE, 0, 1, 3, 1.5, COS_TOL);
    /* w = 0, N = 0 (max(1, 0) guard): p = 0 -> 1 */
    CHECK(ENG_LR_COSINE, 0, 0, 0, 2.0, EXACT);

    /* the actual lr, not the multiplier: learning_rate 3e-4, cosine, p = 1/2 */
    eng_run_config_t cfg;
    eng_run_config_defaults(&cfg);
    cfg.learning_rate = 3e-4;
    cfg.lr_scheduler = ENG_LR_COSINE;
    cfg.warmup_steps = 0;
    double got = eng_lr_at(&cfg, 5, 10);
    if (fabs(got - 1.5e-4) > 1e-16) { /* cos(pi/2) is 6e-17, not 0, in double: relative 1e-12 */
        fprintf(stderr, "lr_schedule_test: lr 3e-4 cosine mid-way: got %.17g, want 1.5e-4\n", got);
        failures++;
    }

    if (failures) fprintf(stderr, "lr_schedule_test: %d failure(s)\n", failures);
    else printf("lr_schedule_test: all passed\n");
    return failures != 0;
}
