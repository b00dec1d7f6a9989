/* Collectives over CPU devices of one process (device.h's kern_comm).
 *
 * 2 and 3 CPU devices, one thread per rank as with NCCL; several
 * all-reduces in a row on each (so a barrier reused too early would show),
 * F32 and BF16, counts that do not divide by the rank count, smaller than
 * it, and 0.  Every rank's result must equal, bit for bit, the sequential
 * sum in rank order 0..n-1 (fp32, rounded once for BF16), and so each
 * other.  Also: creation errors (no devices, one device twice). */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/device.h"

static int failures;
#define EXPECT(c, ...)                                                        \
    do {                                                                      \
        if (!(c)) {                                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);              \
            fprintf(stderr, __VA_ARGS__);                                     \
            fprintf(stderr, "\n");                                            \
            failures++;                                                       \
        }                                                                     \
    } while (0)

enum { MAX_RANKS = 3, ROUNDS = 4 };
static const size_t k_counts[ROUNDS] = {1001, 2, 0, 4096};

typedef struct {
    kern_comm_t *comm;
    int rank;
    mt_dtype_t dt;
    void *bufs[ROUNDS]; /* this rank's buffers, one per round */
} rank_arg_t;

static void *rank_main(void *p) {
    rank_arg_t *a = p;
    for (int r = 0; r < ROUNDS; r++)
        kern_comm_allreduce_sum(a->comm, a->rank, a->bufs[r], k_counts[r], a->dt);
    return NULL;
}

/* value i of rank q in round r: different magnitudes so that the order of
 * the sum matters in fp32 */
static float input(int q, int r, size_t i) {
    const float scale[MAX_RANKS] = {1.0f, 3.0e-4f, 7.0e3f};
    return scale[q] * sinf((float)(i * 7 + (size_t)r * 131 + (size_t)q * 17) * 0.37f);
}

static void run(int n, mt_dtype_t dt) {
    kern_device_t *devs[MAX_RANKS] = {0};
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20, .host_threads = 1};
    for (int q = 0; q < n; q++)
        EXPECT(kern_device_create(KERN_BACKEND_CPU, &o, &devs[q], &err) == MT_OK, "%s", err.msg);
    kern_comm_t *comm = NULL;
    EXPECT(kern_comm_create(devs, n, &comm, &err) == MT_OK, "kern_comm_create(%d): %s", n, err.msg);
    if (!comm) return;
    EXPECT(kern_comm_size(comm) == n, "size %d, want %d", kern_comm_size(comm), n);
    const size_t esz = mt_dtype_size(dt);
    rank_arg_t args[MAX_RANKS];
    for (int q = 0; q < n; q++) {
        args[q] = (rank_arg_t){.comm = comm, .rank = q, .dt = dt};
        for (int r = 0; r < ROUNDS; r++) {
            args[q].bufs[r] = kern_alloc(devs[q], k_counts[r] * esz + 16, "comm buf", &err);
            EXPECT(args[q].bufs[r], "%s", err.msg);
            for (size_t i = 0; i < k_counts[r]; i++) {
                const float x = input(q, r, i);
                if (dt == MT_BF16) ((uint16_t *)args[q].bufs[r])[i] = mt_f32_to_bf16(x);
                else ((float *)args[q].bufs[r])[i] = x;
            }
        }
    }
    pthread_t th[MAX_RANKS];
    for (int q = 0; q < n; q++) pthread_create(&th[q], NULL, rank_main, &args[q]);
    for (int q = 0; q < n; q++) pthread_join(th[q], NULL);
    for (int r = 0; r < ROUNDS; r++) {
        int bad = 0;
        for (size_t i = 0; i < k_counts[r]; i++) {
            float s = 0;
            for (int q = 0; q < n; q++) {
                const float x = dt == MT_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(input(q, r, i)))
                                              : input(q, r, i);
                s = q == 0 ? x : s + x;
            }
            for (int q = 0; q < n; q++) {
                const float got = dt == MT_BF16
                                      ? mt_bf16_to_f32(((uint16_t *)args[q].bufs[r])[i])
                                      : ((float *)args[q].bufs[r])[i];
                const float want = dt == MT_BF16 ? mt_bf16_to_f32(mt_f32_to_bf16(s)) : s;
                if (memcmp(&got, &want, sizeof got) != 0) {
                    if (!bad)
                        fprintf(stderr, "n=%d %s round %d rank %d [%zu]: %.9g, want %.9g\n", n,
                                mt_dtype_name(dt), r, q, i, (double)got, (double)want);
                    bad++;
                }
            }
        }
        EXPECT(bad == 0, "%d ranks, %s, round %d (%zu elements): %d results not the rank-order sum", n,
               mt_dtype_name(dt), r, k_counts[r], bad);
    }
    for (int q = 0; q < n; q++)
        for (int r = 0; r < ROUNDS; r++) kern_free(devs[q], args[q].bufs[r]);
    kern_comm_destroy(comm);
    for (int q = 0; q < n; q++) kern_device_destroy(devs[q]);
}

static void test_errors(void) {
    kern_device_t *d = NULL;
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20, .host_threads = 1};
    EXPECT(kern_device_create(KERN_BACKEND_CPU, &o, &d, &err) == MT_OK, "%s", err.msg);
    kern_comm_t *c = NULL;
    EXPECT(kern_comm_create(&d, 0, &c, &err) == MT_ERR_CONFIG && !c, "0 ranks must be refused");
    kern_device_t *twice[2] = {d, d};
    EXPECT(kern_comm_create(twice, 2, &c, &err) == MT_ERR_CONFIG && !c &&
               strstr(err.msg, "ranks 0 and 1 are the same device"),
           "one device twice: '%s'", err.msg);
    kern_device_destroy(d);
}

int main(void) {
    for (int n = 1; n <= MAX_RANKS; n++) {
        run(n, MT_F32);
        run(n, MT_BF16);
    }
    test_errors();
    if (failures) {
        fprintf(stderr, "comm_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("comm_test: all checks passed\n");
    return 0;
}
