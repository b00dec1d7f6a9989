/* GPU suite: kern_comm over two CUDA devices (NCCL), one thread per rank.
 *
 * Each rank all-reduces its F32 buffer from its own thread; both ranks must
 * hold, bit for bit, x0 + x1 (the rank-order sum; a + b is one fp32
 * rounding, so NCCL's and the host's agree exactly).  Three CUDA devices
 * must be refused (NCCL's ring order is not rank order).
 *
 * Needs two GPUs: with fewer it prints "SKIPPED: <reason>" and exits 0. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/device.h"

enum { N = 100003 };

typedef struct {
    kern_comm_t *comm;
    kern_device_t *dev;
    int rank;
    float *buf;
} rank_arg_t;

static void *rank_main(void *p) {
    rank_arg_t *a = p;
    kern_comm_allreduce_sum(a->comm, a->rank, a->buf, N, MT_F32);
    kern_stream_sync(a->dev, kern_stream(a->dev, KERN_STREAM_COMPUTE));
    return NULL;
}

int main(void) {
    char why[512];
    if (!kern_cuda_available(why, sizeof why)) {
        printf("SKIPPED: no usable GPU (%s)\n", why);
        return 0;
    }
    kern_device_t *devs[2] = {0};
    mt_error_t err = {0};
    for (int r = 0; r < 2; r++) {
        kern_device_opts_t o = {.device_budget_bytes = 64 << 20, .device_index = r};
        if (kern_device_create(KERN_BACKEND_CUDA, &o, &devs[r], &err) != MT_OK) {
            printf("SKIPPED: needs 2 GPUs, device %d: %s\n", r, err.msg);
            if (devs[0]) kern_device_destroy(devs[0]);
            return 0;
        }
    }
    int failures = 0;
    kern_comm_t *comm = NULL;
    if (kern_comm_create(devs, 2, &comm, &err) != MT_OK) {
        fprintf(stderr, "FAIL: kern_comm_create over 2 GPUs: %s\n", err.msg);
        return 1;
    }
    float *h[2], *back[2];
    rank_arg_t args[2];
    for (int r = 0; r < 2; r++) {
        h[r] = malloc(N * sizeof(float));
        back[r] = malloc(N * sizeof(float));
        for (int i = 0; i < N; i++) h[r][i] = (float)((i * 37 + r * 11) % 1000) * (r ? 1e-3f : 1.7f);
        float *d = kern_alloc(devs[r], N * sizeof(float), "comm buf", &err);
        if (!d) {
            fprintf(stderr, "FAIL: %s\n", err.msg);
            return 1;
        }
        kern_stream_t *s = kern_stream(devs[r], KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(devs[r], s, d, h[r], N * sizeof(float));
        kern_stream_sync(devs[r], s);
        args[r] = (rank_arg_t){.comm = comm, .dev = devs[r], .rank = r, .buf = d};
    }
    pthread_t th[2];
    for (int r = 0; r < 2; r++) pthread_create(&th[r], NULL, rank_main, &args[r]);
    for (int r = 0; r < 2; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < 2; r++) {
        kern_stream_t *s = kern_stream(devs[r], KERN_STREAM_COMPUTE);
        kern_memcpy_d2h(devs[r], s, back[r], args[r].buf, N * sizeof(float));
        kern_stream_sync(devs[r], s);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            const float want = h[0][i] + h[1][i];
            bad += memcmp(&back[r][i], &want, sizeof want) != 0;
        }
        if (bad) {
            fprintf(stderr, "FAIL: rank %d: %d of %d elements are not x0 + x1\n", r, bad, N);
            failures++;
        }
        kern_free(devs[r], args[r].buf);
        free(h[r]);
        free(back[r]);
    }
    kern_comm_destroy(comm);
    kern_device_t *three[3] = {devs[0], devs[1], NULL};
    kern_device_opts_t o = {.device_budget_bytes = 64 << 20, .device_index = 2};
    if (kern_device_create(KERN_BACKEND_CUDA, &o, &three[2], &err) == MT_OK) {
        kern_comm_t *c3 = NULL;
        if (kern_comm_create(three, 3, &c3, &err) != MT_ERR_UNSUPPORTED) {
            fprintf(stderr, "FAIL: a communicator of 3 CUDA devices must be refused\n");
            failures++;
            kern_comm_destroy(c3);
        }
        kern_device_destroy(three[2]);
    }
    for (int r = 0; r < 2; r++) kern_device_destroy(devs[r]);
    printf("comm_test: %s\n", failures ? "FAILED" : "all checks passed");
    return failures ? 1 : 0;
}
