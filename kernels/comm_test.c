/* Collectives over CPU devices of one process (device.h's kern_comm).
 *
 * 2 and 3 CPU devices, one thread per rank as with NCCL; several
 * all-reduces in a row on each (so a barrier reused too early would show),
 * F32 and BF16, counts that do not divide by the rank count, smaller than
 * it, and 0.  Every rank's result must equal, bit for bit, the sequential
 * sum in rank order 0..n-1 (fp32, rounded once for BF16), and so each
 * other.  Also: creation errors (no devices, one device twice).
 *
 * All-to-all (kern_comm_alltoallv): 2 and 3 ranks, several rounds with
 * sizes that differ per pair and round (0 included, a rank's segment to
 * itself included), receive segments laid out in reverse rank order with
 * gaps, F32 and BF16 (a copy: any dtype) and int32; every received segment
 * must equal, byte for byte, what its sender published, and the gaps stay
 * untouched.  Counts that do not agree between a pair are an error on every
 * rank (MT_ERR_CONFIG naming the pair), and the communicator still works
 * afterwards.  A rank that aborts the communicator instead of joining
 * frees its peer, which returns MT_ERR_DEVICE rather than waiting. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* n CPU devices (1 MiB each) and a communicator over them; NULL (a failed
 * expectation) when either cannot be made. */
static kern_comm_t *open_ranks(int n, kern_device_t **devs) {
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 1 << 20, .host_threads = 1};
    for (int q = 0; q < n; q++)
        EXPECT(kern_device_create(KERN_BACKEND_CPU, &o, &devs[q], &err) == MT_OK, "%s", err.msg);
    kern_comm_t *comm = NULL;
    EXPECT(kern_comm_create(devs, n, &comm, &err) == MT_OK, "kern_comm_create(%d): %s", n, err.msg);
    return comm;
}

static void close_ranks(int n, kern_device_t **devs, kern_comm_t *comm) {
    kern_comm_destroy(comm);
    for (int q = 0; q < n; q++) kern_device_destroy(devs[q]);
}

static void run(int n, mt_dtype_t dt) {
    kern_device_t *devs[MAX_RANKS] = {0};
    kern_comm_t *comm = open_ranks(n, devs);
    if (!comm) return;
    mt_error_t err = {0};
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
    close_ranks(n, devs, comm);
}

/* ---- all-to-all ---------------------------------------------------------- */

enum { A2A_ROUNDS = 3, GAP = 3 };

/* Elements rank `from` sends rank `to` in round r: varied, 0 for some pairs. */
static size_t a2a_count(int from, int to, int r) {
    const size_t c = (size_t)((from * 7 + to * 3 + r * 5) % 6) * 37 + (size_t)r;
    return (from + to + r) % 4 == 1 ? 0 : c;
}

static uint32_t a2a_word(int from, int to, int r, size_t i) {
    return 0x9E3779B9u * (uint32_t)(i + 1) ^ ((uint32_t)from << 24 | (uint32_t)to << 16 | (uint32_t)r << 8);
}

typedef struct {
    kern_comm_t *comm;
    int rank, n;
    mt_dtype_t dt;
    bool mismatch; /* rank 0 expects one element too many from rank n-1 in round 1 */
    void *send[A2A_ROUNDS], *recv[A2A_ROUNDS];
    size_t sc[A2A_ROUNDS][MAX_RANKS], so[A2A_ROUNDS][MAX_RANKS];
    size_t rc[A2A_ROUNDS][MAX_RANKS], ro[A2A_ROUNDS][MAX_RANKS], recv_len[A2A_ROUNDS];
    mt_status_t st[A2A_ROUNDS];
    char msg[A2A_ROUNDS][sizeof(((mt_error_t *)0)->msg)];
} a2a_arg_t;

static void *a2a_main(void *p) {
    a2a_arg_t *a = p;
    for (int r = 0; r < A2A_ROUNDS; r++) {
        mt_error_t err = {0};
        a->st[r] = kern_comm_alltoallv(a->comm, a->rank, a->send[r], a->sc[r], a->so[r], a->recv[r], a->rc[r],
                                       a->ro[r], a->dt, &err);
        memcpy(a->msg[r], err.msg, sizeof a->msg[r]);
    }
    return NULL;
}

static void run_a2a(int n, mt_dtype_t dt, bool mismatch) {
    kern_device_t *devs[MAX_RANKS] = {0};
    kern_comm_t *comm = open_ranks(n, devs);
    if (!comm) return;
    mt_error_t err = {0};
    const size_t esz = mt_dtype_size(dt);
    a2a_arg_t *args = calloc((size_t)n, sizeof *args);
    for (int q = 0; q < n; q++) {
        a2a_arg_t *a = &args[q];
        *a = (a2a_arg_t){.comm = comm, .rank = q, .n = n, .dt = dt, .mismatch = mismatch};
        for (int r = 0; r < A2A_ROUNDS; r++) {
            size_t off = 0;
            for (int to = 0; to < n; to++) { /* send segments in rank order, packed */
                a->sc[r][to] = a2a_count(q, to, r);
                a->so[r][to] = off;
                off += a->sc[r][to];
            }
            a->send[r] = kern_alloc(devs[q], off * esz + 16, "a2a send", &err);
            EXPECT(a->send[r], "%s", err.msg);
            for (int to = 0; to < n; to++)
                for (size_t i = 0; i < a->sc[r][to] * esz; i++)
                    ((unsigned char *)a->send[r])[a->so[r][to] * esz + i] = (unsigned char)(a2a_word(q, to, r, i) >> 13);
            off = GAP;
            for (int from = n - 1; from >= 0; from--) { /* receive in reverse order, with gaps */
                a->rc[r][from] = a2a_count(from, q, r);
                a->ro[r][from] = off;
                off += a->rc[r][from] + GAP;
            }
            if (mismatch && r == 1 && q == 0) a->rc[r][n - 1]++;
            a->recv_len[r] = off + 1;
            a->recv[r] = kern_alloc(devs[q], a->recv_len[r] * esz, "a2a recv", &err);
            EXPECT(a->recv[r], "%s", err.msg);
            memset(a->recv[r], 0xA5, a->recv_len[r] * esz);
        }
    }
    pthread_t th[MAX_RANKS];
    for (int q = 0; q < n; q++) pthread_create(&th[q], NULL, a2a_main, &args[q]);
    for (int q = 0; q < n; q++) pthread_join(th[q], NULL);
    for (int q = 0; q < n; q++) {
        const a2a_arg_t *a = &args[q];
        for (int r = 0; r < A2A_ROUNDS; r++) {
            if (mismatch && r == 1) {
                EXPECT(a->st[r] == MT_ERR_CONFIG && strstr(a->msg[r], "expects"),
                       "n=%d rank %d: mismatched counts gave %d '%s'", n, q, (int)a->st[r], a->msg[r]);
                continue;
            }
            EXPECT(a->st[r] == MT_OK, "n=%d rank %d round %d: %s", n, q, r, a->msg[r]);
            /* every segment as sent, every gap untouched */
            unsigned char *want = malloc(a->recv_len[r] * esz);
            memset(want, 0xA5, a->recv_len[r] * esz);
            for (int from = 0; from < n; from++) {
                const a2a_arg_t *s = &args[from];
                memcpy(want + a->ro[r][from] * esz, (const char *)s->send[r] + s->so[r][q] * esz,
                       s->sc[r][q] * esz);
            }
            EXPECT(memcmp(want, a->recv[r], a->recv_len[r] * esz) == 0,
                   "n=%d %s rank %d round %d: received bytes differ from the senders'", n, mt_dtype_name(dt),
                   q, r);
            free(want);
        }
    }
    for (int q = 0; q < n; q++)
        for (int r = 0; r < A2A_ROUNDS; r++) {
            kern_free(devs[q], args[q].send[r]);
            kern_free(devs[q], args[q].recv[r]);
        }
    free(args);
    close_ranks(n, devs, comm);
}

/* Rank 1 fails before the collective and aborts; rank 0 must come back. */
typedef struct {
    kern_comm_t *comm;
    void *buf;
    mt_status_t st;
} abort_arg_t;

static void *abort_rank0(void *p) {
    abort_arg_t *a = p;
    const size_t c[2] = {4, 4}, off[2] = {0, 4};
    mt_error_t err = {0};
    a->st = kern_comm_alltoallv(a->comm, 0, a->buf, c, off, (char *)a->buf + 32, c, off, MT_F32, &err);
    return NULL;
}

static void test_abort(void) {
    kern_device_t *devs[2] = {0};
    mt_error_t err = {0};
    kern_comm_t *comm = open_ranks(2, devs);
    if (!comm) return;
    abort_arg_t a = {.comm = comm, .buf = kern_alloc(devs[0], 64, "abort buf", &err)};
    pthread_t th;
    pthread_create(&th, NULL, abort_rank0, &a);
    /* let rank 0 reach the barrier first (it must be woken, not just refused) */
    struct timespec ts = {0, 20 * 1000 * 1000};
    nanosleep(&ts, NULL);
    EXPECT(!kern_comm_aborted(comm), "aborted before kern_comm_abort");
    kern_comm_abort(comm);
    pthread_join(th, NULL);
    EXPECT(a.st == MT_ERR_DEVICE, "rank 0 after its peer aborted: status %d, want MT_ERR_DEVICE", (int)a.st);
    EXPECT(kern_comm_aborted(comm), "kern_comm_aborted after kern_comm_abort");
    const size_t c[2] = {4, 4}, off[2] = {0, 4};
    EXPECT(kern_comm_alltoallv(comm, 0, a.buf, c, off, (char *)a.buf + 32, c, off, MT_F32, &err) == MT_ERR_DEVICE &&
               strstr(err.msg, "aborted"),
           "a collective after the abort: '%s'", err.msg);
    kern_free(devs[0], a.buf);
    close_ranks(2, devs, comm);
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
    for (int n = 1; n <= MAX_RANKS; n++) {
        run_a2a(n, MT_F32, false);
        run_a2a(n, MT_BF16, false);
        run_a2a(n, MT_I32, false);
    }
    run_a2a(2, MT_F32, true);
    run_a2a(3, MT_BF16, true);
    test_abort();
    test_errors();
    if (failures) {
        fprintf(stderr, "comm_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("comm_test: all checks passed\n");
    return 0;
}
