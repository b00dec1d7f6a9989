/* GPU suite: kern_comm over two CUDA devices (NCCL), one thread per rank.
 *
 * Each rank all-reduces its F32 buffer from its own thread; both ranks must
 * hold, bit for bit, x0 + x1 (the rank-order sum; a + b is one fp32
 * rounding, so NCCL's and the host's agree exactly).  Three CUDA devices
 * must be refused (NCCL's ring order is not rank order).
 *
 * All-to-all (kern_comm_alltoallv, NCCL grouped send/recv): first over one
 * GPU (a rank exchanging with itself, which every GPU machine can run),
 * then over two; sizes differ per pair (one of them 0), and every received
 * segment must equal, byte for byte, what its sender sent.
 *
 * The two-GPU part needs two GPUs: with fewer it prints "SKIPPED: <reason>"
 * and exits 0. */
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

/* ---- all-to-all -------------------------------------------------------- */

enum { A2A_MAX = 2 };

/* Elements rank `from` sends rank `to` (rank 1 sends rank 0 nothing). */
static size_t a2a_count(int from, int to) { return from == 1 && to == 0 ? 0 : 1000 + 37 * (size_t)from + 11 * (size_t)to; }

typedef struct {
    kern_comm_t *comm;
    kern_device_t *dev;
    int rank, n;
    float *send, *recv;
    size_t sc[A2A_MAX], so[A2A_MAX], rc[A2A_MAX], ro[A2A_MAX];
    mt_status_t st;
    mt_error_t err;
} a2a_arg_t;

static void *a2a_main(void *p) {
    a2a_arg_t *a = p;
    a->st = kern_comm_alltoallv(a->comm, a->rank, a->send, a->sc, a->so, a->recv, a->rc, a->ro, MT_F32, &a->err);
    kern_stream_sync(a->dev, kern_stream(a->dev, KERN_STREAM_COMPUTE));
    return NULL;
}

static float a2a_value(int from, int to, size_t i) { return (float)(from * 100000 + to * 10000) + (float)i * 0.5f; }

static int a2a_check(kern_device_t **devs, int n) {
    mt_error_t err = {0};
    kern_comm_t *comm = NULL;
    if (kern_comm_create(devs, n, &comm, &err) != MT_OK) {
        fprintf(stderr, "FAIL: kern_comm_create over %d GPU(s): %s\n", n, err.msg);
        return 1;
    }
    a2a_arg_t a[A2A_MAX];
    size_t recv_len[A2A_MAX];
    for (int r = 0; r < n; r++) {
        a[r] = (a2a_arg_t){.comm = comm, .dev = devs[r], .rank = r, .n = n};
        size_t off = 0, roff = 0;
        for (int q = 0; q < n; q++) {
            a[r].sc[q] = a2a_count(r, q);
            a[r].so[q] = off;
            off += a[r].sc[q];
            a[r].rc[q] = a2a_count(q, r);
            a[r].ro[q] = roff;
            roff += a[r].rc[q];
        }
        recv_len[r] = roff;
        float *h = malloc((off + 1) * sizeof *h);
        for (int q = 0; q < n; q++)
            for (size_t i = 0; i < a[r].sc[q]; i++) h[a[r].so[q] + i] = a2a_value(r, q, i);
        a[r].send = kern_alloc(devs[r], (off + 1) * sizeof(float), "a2a send", &err);
        a[r].recv = kern_alloc(devs[r], (roff + 1) * sizeof(float), "a2a recv", &err);
        if (!a[r].send || !a[r].recv) {
            fprintf(stderr, "FAIL: %s\n", err.msg);
            return 1;
        }
        kern_stream_t *s = kern_stream(devs[r], KERN_STREAM_COMPUTE);
        kern_memcpy_h2d(devs[r], s, a[r].send, h, off * sizeof(float));
        kern_stream_sync(devs[r], s);
        free(h);
    }
    pthread_t th[A2A_MAX];
    for (int r = 0; r < n; r++) pthread_create(&th[r], NULL, a2a_main, &a[r]);
    for (int r = 0; r < n; r++) pthread_join(th[r], NULL);
    int failures = 0;
    for (int r = 0; r < n; r++) {
        if (a[r].st != MT_OK) {
            fprintf(stderr, "FAIL: alltoallv over %d GPU(s), rank %d: %s\n", n, r, a[r].err.msg);
            failures++;
        } else {
            float *back = malloc((recv_len[r] + 1) * sizeof *back);
            kern_stream_t *s = kern_stream(devs[r], KERN_STREAM_COMPUTE);
            kern_memcpy_d2h(devs[r], s, back, a[r].recv, recv_len[r] * sizeof(float));
            kern_stream_sync(devs[r], s);
            int bad = 0;
            for (int q = 0; q < n; q++)
                for (size_t i = 0; i < a[r].rc[q]; i++) {
                    const float want = a2a_value(q, r, i);
                    bad += memcmp(&back[a[r].ro[q] + i], &want, sizeof want) != 0;
                }
            if (bad) {
                fprintf(stderr, "FAIL: alltoallv over %d GPU(s), rank %d: %d elements not as sent\n", n, r, bad);
                failures++;
            }
            free(back);
        }
        kern_free(devs[r], a[r].send);
        kern_free(devs[r], a[r].recv);
    }
    kern_comm_destroy(comm);
    printf("alltoallv over %d GPU(s): %s\n", n, failures ? "FAILED" : "as sent");
    return failures;
}

int main(void) {
    char why[512];
    if (!kern_cuda_available(why, sizeof why)) {
        printf("SKIPPED: no usable GPU (%s)\n", why);
        return 0;
    }
    kern_device_t *devs[2] = {0};
    mt_error_t err = {0};
    int a2a_failures = 0;
    {
        kern_device_opts_t o = {.device_budget_bytes = 64 << 20, .device_index = 0};
        kern_device_t *one = NULL;
        if (kern_device_create(KERN_BACKEND_CUDA, &o, &one, &err) != MT_OK) {
            fprintf(stderr, "FAIL: device 0: %s\n", err.msg);
            return 1;
        }
        a2a_failures += a2a_check(&one, 1);
        kern_device_destroy(one);
    }
    for (int r = 0; r < 2; r++) {
        kern_device_opts_t o = {.device_budget_bytes = 64 << 20, .device_index = r};
        if (kern_device_create(KERN_BACKEND_CUDA, &o, &devs[r], &err) != MT_OK) {
            printf("SKIPPED: needs 2 GPUs, device %d: %s\n", r, err.msg);
            if (devs[0]) kern_device_destroy(devs[0]);
            return a2a_failures ? 1 : 0;
        }
    }
    int failures = a2a_failures + a2a_check(devs, 2);
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
