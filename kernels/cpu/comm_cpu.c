/* Collectives between CPU devices of one process (device.h's kern_comm).
 *
 * All-reduce, with every rank on its own thread:
 *   1. each rank publishes its buffer and waits at a barrier;
 *   2. rank r sums slice r of the elements (slices are fixed by count and
 *      the rank count) over the ranks' buffers in rank order 0..n-1 and
 *      writes the sum into every rank's buffer; slices are disjoint, so no
 *      element is read by one rank while another writes it;
 *   3. a second barrier, so no rank returns (and touches its buffer) while
 *      another still reads or writes it.
 * Each element's sum is the same sequence of fp32 additions whichever rank
 * forms it, so results are bit-identical on every rank and run to run.
 * BF16 buffers are summed in fp32 and rounded once.
 *
 * All-to-all (alltoallv), likewise between two barriers: each rank
 * publishes its buffers, sizes and offsets; every rank checks that every
 * pair agrees (rank r sends to q what q expects from r), so all ranks fail
 * alike; then each rank *pulls* its segments from the senders' buffers in
 * rank order, writing only its own receive buffer; the closing barrier
 * keeps every send buffer (and the published arrays) alive until all
 * ranks have read them.
 *
 * The CPU backend's compute stream runs each op in the calling thread before
 * it returns, so the collective runs there and is ordered after earlier
 * compute ops.  A rank blocked at the barrier holds its thread, as an NCCL
 * rank's stream would wait for its peers.  The barrier is our own (mutex
 * and condition variable, not pthread_barrier_t) so that kern_comm_abort
 * can wake it: a rank that failed must not leave its peers waiting at a
 * barrier forever. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cpu/backend_cpu.h"

/* What one rank publishes for an all-to-all (sizes in bytes). */
typedef struct {
    const char *send;
    char *recv;
    const size_t *send_bytes, *send_offs, *recv_bytes, *recv_offs;
} cpu_a2a_t;

typedef struct {
    kern_comm_t base; /* first: device.c sees a kern_comm_t */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int waiting;           /* ranks at the barrier in this generation */
    unsigned long gen;     /* barrier generation */
    void **bufs; /* published per rank for the current collective */
    size_t *counts;
    mt_dtype_t *dts;
    cpu_a2a_t *a2a;
} cpu_comm_t;

/* Returns false when the communicator is (or gets) aborted. */
static bool barrier_wait(cpu_comm_t *cc) {
    pthread_mutex_lock(&cc->mu);
    if (__atomic_load_n(&cc->base.aborted, __ATOMIC_SEQ_CST)) {
        pthread_mutex_unlock(&cc->mu);
        return false;
    }
    const unsigned long gen = cc->gen;
    if (++cc->waiting == cc->base.size) {
        cc->waiting = 0;
        cc->gen++;
        pthread_cond_broadcast(&cc->cv);
    } else {
        while (gen == cc->gen && !__atomic_load_n(&cc->base.aborted, __ATOMIC_SEQ_CST)) pthread_cond_wait(&cc->cv, &cc->mu);
    }
    const bool ok = gen != cc->gen; /* released by the last rank, even if aborted since */
    pthread_mutex_unlock(&cc->mu);
    return ok;
}

static void cpu_comm_abort(kern_comm_t *c) {
    cpu_comm_t *cc = (cpu_comm_t *)c;
    pthread_mutex_lock(&cc->mu);
    pthread_cond_broadcast(&cc->cv); /* the flag is set already (device.c) */
    pthread_mutex_unlock(&cc->mu);
}

static void cpu_comm_destroy(kern_comm_t *c) {
    cpu_comm_t *cc = (cpu_comm_t *)c;
    pthread_cond_destroy(&cc->cv);
    pthread_mutex_destroy(&cc->mu);
    free(cc->bufs);
    free(cc->counts);
    free(cc->dts);
    free(cc->a2a);
    free(cc);
}

static float load(const void *b, mt_dtype_t dt, size_t i) {
    return dt == MT_BF16 ? mt_bf16_to_f32(((const uint16_t *)b)[i]) : ((const float *)b)[i];
}

static void cpu_comm_allreduce(kern_comm_t *c, int rank, void *buf, size_t count, mt_dtype_t dt) {
    cpu_comm_t *cc = (cpu_comm_t *)c;
    const int n = c->size;
    cc->bufs[rank] = buf;
    cc->counts[rank] = count;
    cc->dts[rank] = dt;
    if (!barrier_wait(cc)) return; /* aborted: the buffer is unspecified (device.h) */
    for (int q = 0; q < n; q++) /* every rank checks all; all fail alike */
        MT_CHECK(cc->counts[q] == count && cc->dts[q] == dt,
                 "kern_comm_allreduce_sum: rank %d passed %zu %s elements, rank %d %zu %s", rank,
                 count, mt_dtype_name(dt), q, cc->counts[q], mt_dtype_name(cc->dts[q]));
    const size_t per = (count + (size_t)n - 1) / (size_t)n;
    const size_t lo = per * (size_t)rank < count ? per * (size_t)rank : count;
    const size_t hi = lo + per < count ? lo + per : count;
    for (size_t i = lo; i < hi; i++) {
        float s = load(cc->bufs[0], dt, i);
        for (int q = 1; q < n; q++) s += load(cc->bufs[q], dt, i);
        for (int q = 0; q < n; q++) {
            if (dt == MT_BF16) ((uint16_t *)cc->bufs[q])[i] = mt_f32_to_bf16(s);
            else ((float *)cc->bufs[q])[i] = s;
        }
    }
    barrier_wait(cc);
}

static mt_status_t cpu_comm_alltoallv(kern_comm_t *c, int rank, const void *send, const size_t *send_bytes,
                                      const size_t *send_offs, void *recv, const size_t *recv_bytes,
                                      const size_t *recv_offs, mt_error_t *err) {
    cpu_comm_t *cc = (cpu_comm_t *)c;
    const int n = c->size;
    cc->a2a[rank] = (cpu_a2a_t){send, recv, send_bytes, send_offs, recv_bytes, recv_offs};
    if (!barrier_wait(cc))
        return mt_error_set(err, MT_ERR_DEVICE, "kern_comm_alltoallv (rank %d): the communicator was aborted", rank);
    /* every rank checks every pair in the same order: all fail alike, and
     * none returns before the closing barrier (peers still read its arrays) */
    int bad_from = -1, bad_to = -1;
    for (int r = 0; r < n && bad_from < 0; r++)
        for (int q = 0; q < n; q++)
            if (cc->a2a[r].send_bytes[q] != cc->a2a[q].recv_bytes[r]) {
                bad_from = r;
                bad_to = q;
                break;
            }
    if (bad_from < 0)
        for (int q = 0; q < n; q++) {
            const size_t bytes = cc->a2a[rank].recv_bytes[q];
            if (bytes)
                memcpy(cc->a2a[rank].recv + cc->a2a[rank].recv_offs[q],
                       cc->a2a[q].send + cc->a2a[q].send_offs[rank], bytes);
        }
    const size_t sent = bad_from < 0 ? 0 : cc->a2a[bad_from].send_bytes[bad_to];
    const size_t expected = bad_from < 0 ? 0 : cc->a2a[bad_to].recv_bytes[bad_from];
    if (!barrier_wait(cc))
        return mt_error_set(err, MT_ERR_DEVICE, "kern_comm_alltoallv (rank %d): the communicator was aborted", rank);
    if (bad_from >= 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "kern_comm_alltoallv: rank %d sends %zu bytes to rank %d, which expects %zu "
                            "from it (every rank must pass the counts its peers send)",
                            bad_from, sent, bad_to, expected);
    return MT_OK;
}

static const kern_comm_i k_cpu_comm_vtable = {
    .destroy = cpu_comm_destroy,
    .allreduce_sum = cpu_comm_allreduce,
    .alltoallv = cpu_comm_alltoallv,
    .abort = cpu_comm_abort,
};

mt_status_t kern_cpu_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out,
                                 mt_error_t *err) {
    (void)devs; /* CPU devices share the host's memory: nothing per device */
    cpu_comm_t *cc = calloc(1, sizeof *cc);
    if (cc) {
        cc->bufs = calloc((size_t)n, sizeof *cc->bufs);
        cc->counts = calloc((size_t)n, sizeof *cc->counts);
        cc->dts = calloc((size_t)n, sizeof *cc->dts);
        cc->a2a = calloc((size_t)n, sizeof *cc->a2a);
    }
    if (!cc || !cc->bufs || !cc->counts || !cc->dts || !cc->a2a) {
        if (cc) {
            free(cc->bufs);
            free(cc->counts);
            free(cc->dts);
            free(cc->a2a);
        }
        free(cc);
        return mt_error_set(err, MT_ERR_NOMEM, "kern_comm_create: out of host memory for %d ranks", n);
    }
    pthread_mutex_init(&cc->mu, NULL);
    pthread_cond_init(&cc->cv, NULL);
    cc->base.vt = &k_cpu_comm_vtable;
    cc->base.size = n;
    cc->base.aborted = 0;
    *out = &cc->base;
    return MT_OK;
}
