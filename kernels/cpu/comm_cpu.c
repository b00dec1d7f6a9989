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
 * The CPU backend's compute stream runs each op in the calling thread before
 * it returns, so the collective runs there and is ordered after earlier
 * compute ops.  A rank blocked at the barrier holds its thread, as an NCCL
 * rank's stream would wait for its peers. */
#include <pthread.h>
#include <stdlib.h>

#include "base/dtype.h"
#include "base/status.h"
#include "kernels/cpu/backend_cpu.h"

typedef struct {
    kern_comm_t base; /* first: device.c sees a kern_comm_t */
    pthread_barrier_t barrier;
    void **bufs; /* published per rank for the current collective */
    size_t *counts;
    mt_dtype_t *dts;
} cpu_comm_t;

static void cpu_comm_destroy(kern_comm_t *c) {
    cpu_comm_t *cc = (cpu_comm_t *)c;
    pthread_barrier_destroy(&cc->barrier);
    free(cc->bufs);
    free(cc->counts);
    free(cc->dts);
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
    pthread_barrier_wait(&cc->barrier);
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
    pthread_barrier_wait(&cc->barrier);
}

static const kern_comm_i k_cpu_comm_vtable = {
    .destroy = cpu_comm_destroy,
    .allreduce_sum = cpu_comm_allreduce,
};

mt_status_t kern_cpu_comm_create(kern_device_t *const *devs, int n, kern_comm_t **out,
                                 mt_error_t *err) {
    (void)devs; /* CPU devices share the host's memory: nothing per device */
    cpu_comm_t *cc = calloc(1, sizeof *cc);
    if (cc) {
        cc->bufs = calloc((size_t)n, sizeof *cc->bufs);
        cc->counts = calloc((size_t)n, sizeof *cc->counts);
        cc->dts = calloc((size_t)n, sizeof *cc->dts);
    }
    if (!cc || !cc->bufs || !cc->counts || !cc->dts) {
        if (cc) {
            free(cc->bufs);
            free(cc->counts);
            free(cc->dts);
        }
        free(cc);
        return mt_error_set(err, MT_ERR_NOMEM, "kern_comm_create: out of host memory for %d ranks", n);
    }
    if (pthread_barrier_init(&cc->barrier, NULL, (unsigned)n) != 0) {
        free(cc->bufs);
        free(cc->counts);
        free(cc->dts);
        free(cc);
        return mt_error_set(err, MT_ERR_INTERNAL, "kern_comm_create: cannot make a barrier of %d ranks", n);
    }
    cc->base = (kern_comm_t){.vt = &k_cpu_comm_vtable, .size = n};
    *out = &cc->base;
    return MT_OK;
}
