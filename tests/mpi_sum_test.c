/* kernels/comm_ranks.h across real processes (started by mpi_sum_test.sh
 * as 3 ranks, under mpirun and over TCP): the gradient sum must be the rank-order fp32 sum over
 * the contributing ranks, the same bits on every rank.
 *
 * Every rank can compute every rank's input (a seeded generator), so each
 * rank checks its result against the sequential sum it computes itself, and
 * a hash of the results gathered from all ranks checks they agree.  The
 * inputs mix magnitudes 2^-20 .. 2^20 so that the order of the adds shows:
 * the test also requires that the reverse order gives other bits for some
 * elements, or it could not tell the orders apart.  Counts: 0, 1, 1001, and
 * one past two gather chunks (1 << 21 + 7); contributors: all, none of
 * rank 0, rank 1 only, none at all.  Host buffers and, on a CPU device,
 * device buffers (through the host staging path).  Also allgather and max. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/comm_ranks.h"
#include "kernels/device.h"

static int failures;
#define EXPECT(c, ...)                                                        \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "FAIL rank %d %s:%d: ", g_rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            failures++;                                                       \
        }                                                                     \
    } while (0)
static int g_rank;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

/* rank r's element e of case c */
static float input(int c, int r, size_t e) {
    const uint64_t h = mix(((uint64_t)c << 48) ^ ((uint64_t)r << 40) ^ e);
    const float mant = (float)(h & 0xffffff) / (float)0x1000000 + 0.5f;
    const int ex = (int)((h >> 24) % 41) - 20;
    return ((h >> 40) & 1 ? -1.0f : 1.0f) * ldexpf(mant, ex);
}

static uint64_t hash_floats(const float *a, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t e = 0; e < n; e++) {
        uint32_t u;
        memcpy(&u, &a[e], sizeof u);
        h = (h ^ u) * 1099511628211ull;
    }
    return h;
}

static void check_case(kern_ranks_t *rk, kern_device_t *dev, int c, size_t n, const bool *contrib, bool on_device) {
    const int R = kern_ranks_size(rk), me = kern_ranks_rank(rk);
    float *buf = malloc((n ? n : 1) * sizeof *buf), *want = malloc((n ? n : 1) * sizeof *want);
    if (!buf || !want) abort();
    for (size_t e = 0; e < n; e++) buf[e] = contrib[me] || !on_device ? input(c, me, e) : 0.0f;
    bool any = false;
    for (int r = 0; r < R; r++) any |= contrib[r];
    size_t order_shows = 0;
    for (size_t e = 0; e < n; e++) {
        float s = 0, rev = 0;
        bool first = true;
        for (int r = 0; r < R; r++) {
            if (!contrib[r]) continue;
            s = first ? input(c, r, e) : s + input(c, r, e);
            first = false;
        }
        first = true;
        for (int r = R - 1; r >= 0; r--) {
            if (!contrib[r]) continue;
            rev = first ? input(c, r, e) : rev + input(c, r, e);
            first = false;
        }
        want[e] = any ? s : buf[e]; /* nobody contributed: the caller skips such a buffer; it stays */
        order_shows += memcmp(&s, &rev, sizeof s) != 0;
    }
    int ncontrib = 0;
    for (int r = 0; r < R; r++) ncontrib += contrib[r];
    if (ncontrib >= 3 && n > 1000)
        EXPECT(order_shows > 0, "case %d: the reverse order gives the same bits everywhere: the test cannot tell", c);
    if (on_device) {
        mt_error_t err = {0};
        float *d = kern_alloc(dev, (n ? n : 1) * sizeof *d, "sum test", &err);
        EXPECT(d != NULL, "kern_alloc: %s", err.msg);
        kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(dev, s, d, buf, n * sizeof *d);
        kern_stream_sync(dev, s);
        if (any) kern_ranks_sum_f32(rk, d, n, true, contrib);
        kern_memcpy_d2h(dev, s, buf, d, n * sizeof *d);
        kern_stream_sync(dev, s);
        kern_free(dev, d);
    } else if (any) {
        kern_ranks_sum_f32(rk, buf, n, false, contrib);
    }
    size_t bad = 0;
    for (size_t e = 0; e < n; e++) bad += memcmp(&buf[e], &want[e], sizeof *buf) != 0;
    EXPECT(bad == 0, "case %d (%zu floats, %s): %zu elements differ from the rank-order sum", c, n,
           on_device ? "device" : "host", bad);
    uint64_t h = hash_floats(buf, n), hs[16];
    kern_ranks_allgather(rk, &h, hs, sizeof h);
    /* (with no contributor each rank keeps its own buffer: nothing to agree on) */
    for (int r = 0; r < R && any; r++) EXPECT(hs[r] == h, "case %d: rank %d's result differs from rank %d's", c, r, me);
    free(buf);
    free(want);
}

int main(void) {
    kern_ranks_t *rk = NULL;
    mt_error_t err = {0};
    if (kern_ranks_create(&rk, &err) != MT_OK) {
        fprintf(stderr, "kern_ranks_create: %s\n", err.msg);
        return 1;
    }
    const int R = kern_ranks_size(rk);
    g_rank = kern_ranks_rank(rk);
    if (R < 2 || R > 16) {
        fprintf(stderr, "FAIL run this as 2..16 ranks (mpirun or WORLD_SIZE) (got %d)\n", R);
        kern_ranks_destroy(rk);
        return 1;
    }
    kern_device_t *dev = NULL;
    kern_device_opts_t o = {0};
    o.device_budget_bytes = (size_t)64 << 20;
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK || kern_ranks_bind_device(rk, dev, &err) != MT_OK) {
        fprintf(stderr, "device: %s\n", err.msg);
        kern_ranks_abort(rk, 1);
    }
    const size_t counts[] = {0, 1, 1001, ((size_t)1 << 21) + 7};
    bool all[16], not0[16], only1[16], none[16];
    for (int r = 0; r < R; r++) {
        all[r] = true;
        not0[r] = r != 0;
        only1[r] = r == 1;
        none[r] = false;
    }
    const bool *patterns[] = {all, not0, only1, none};
    int c = 0;
    for (int dv = 0; dv < 2; dv++)
        for (size_t i = 0; i < sizeof counts / sizeof *counts; i++)
            for (size_t p = 0; p < sizeof patterns / sizeof *patterns; p++)
                check_case(rk, dev, c++, counts[i], patterns[p], dv == 1);

    int mx = kern_ranks_max_int(rk, 10 * g_rank + 3);
    EXPECT(mx == 10 * (R - 1) + 3, "max_int: %d, want %d", mx, 10 * (R - 1) + 3);
    int rs[16];
    kern_ranks_allgather(rk, &g_rank, rs, sizeof g_rank);
    for (int r = 0; r < R; r++) EXPECT(rs[r] == r, "allgather: slot %d holds %d", r, rs[r]);

    /* every rank's verdict, so that rank 0 reports the job's */
    int fails[16];
    kern_ranks_allgather(rk, &failures, fails, sizeof failures);
    int total = 0;
    for (int r = 0; r < R; r++) total += fails[r];
    if (g_rank == 0) printf("%d ranks, %d cases: %s\n", R, c, total ? "FAILED" : "all passed");
    kern_device_destroy(dev);
    kern_ranks_destroy(rk);
    return total ? 1 : 0;
}
