/* Collectives across ranks: the transport that carries the job, and the
 * gradient sum built on its gather (see comm_ranks.h).  It names no
 * transport and no backend: both are what the program links and registers
 * (ranks_registry.h). */
#include "kernels/comm_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ranks_registry.h"

struct kern_ranks {
    int rank, size, local_rank;
    const kern_ranks_transport_t *transport; /* NULL with one process */
    void *transport_state;
    kern_device_t *dev;                     /* the bound device, for on-device buffers */
    const kern_ranks_device_sum_t *dev_sum; /* the device's own sum across ranks, else NULL */
    void *dev_sum_state;
};

bool kern_ranks_launched(void) { return kern_ranks_launched_transport() != NULL; }

mt_status_t kern_ranks_create(kern_ranks_t **out, mt_error_t *err) {
    *out = NULL;
    kern_ranks_t *r = calloc(1, sizeof *r);
    MT_CHECK_ALLOC(r, "ranks");
    r->size = 1;
    mt_status_t st = MT_OK;
    r->transport = kern_ranks_launched_transport();
    if (r->transport) st = r->transport->init(&r->transport_state, &r->rank, &r->size, &r->local_rank, err);
    if (st != MT_OK) {
        free(r);
        return st;
    }
    *out = r;
    return MT_OK;
}

void kern_ranks_destroy(kern_ranks_t *r) {
    if (!r) return;
    if (r->dev_sum) r->dev_sum->destroy(r->dev_sum_state);
    if (r->transport) r->transport->destroy(r->transport_state);
    free(r);
}

int kern_ranks_rank(const kern_ranks_t *r) { return r->rank; }
int kern_ranks_size(const kern_ranks_t *r) { return r->size; }
int kern_ranks_local_rank(const kern_ranks_t *r) { return r->local_rank; }

const char *kern_ranks_launcher(const kern_ranks_t *r) { return r->transport ? r->transport->launcher : "one process"; }

mt_status_t kern_ranks_bind_device(kern_ranks_t *r, kern_device_t *dev, mt_error_t *err) {
    r->dev = dev;
    const kern_ranks_device_sum_t *ds = kern_ranks_find_device_sum(dev->kind);
    if (!ds || r->size != ds->ranks) return MT_OK;
    /* What rank 0 hands every rank: a byte saying whether it made the id,
     * then the id. */
    const size_t rec = 1 + ds->id_bytes;
    unsigned char *mine = calloc(1, rec), *all = calloc((size_t)r->size, rec);
    MT_CHECK_ALLOC(mine, "the device sum's id");
    MT_CHECK_ALLOC(all, "the device sum's ids");
    mt_status_t st = MT_OK;
    if (r->rank == 0) {
        st = ds->unique_id(mine + 1, err);
        mine[0] = st == MT_OK;
    }
    /* every rank joins the gather even when rank 0 failed: then all fail */
    kern_ranks_allgather(r, mine, all, rec);
    if (st == MT_OK && !all[0])
        st = mt_error_set(err, MT_ERR_DEVICE, "%s: rank 0 could not create the job's unique id (see its error)",
                          ds->name);
    if (st == MT_OK) st = ds->create(dev, r->rank, r->size, all + 1, &r->dev_sum_state, err);
    if (st == MT_OK) r->dev_sum = ds;
    free(mine);
    free(all);
    return st;
}

/* Floats per rank per gather round: 4 MiB, so the receive buffer of a round
 * stays small next to a gradient while each round is large enough that the
 * per-message latency does not matter. */
enum { SUM_CHUNK = 1 << 20 };

/* The host sum is a gather of fixed-size chunks followed by a sequential
 * add on every rank, not MPI_Allreduce: the standard leaves an allreduce's
 * order of additions to the implementation (Open MPI picks an algorithm by
 * message size and rank count, and may give different ranks differently
 * rounded results), while training needs the rank-order sum, bit for bit,
 * on every rank so that the weights stay identical without being
 * broadcast.  The gather moves R times the bytes of a reduce-scatter; for
 * data parallel fine-tuning on a few ranks that is the price of
 * determinism, and it is the same code over either transport. */
static void sum_host_f32(kern_ranks_t *r, float *buf, size_t count, const bool *contrib) {
    const size_t chunk = count < SUM_CHUNK ? count : SUM_CHUNK;
    float *all = malloc((size_t)r->size * chunk * sizeof *all);
    MT_CHECK_ALLOC(all, "the cross-rank gradient gather");
    for (size_t lo = 0; lo < count; lo += chunk) {
        const size_t n = count - lo < chunk ? count - lo : chunk;
        kern_ranks_allgather(r, buf + lo, all, n * sizeof *buf);
        bool first = true;
        for (int q = 0; q < r->size; q++) {
            if (!contrib[q]) continue;
            const float *src = all + (size_t)q * n;
            if (first) {
                memcpy(buf + lo, src, n * sizeof *src);
            } else {
                for (size_t e = 0; e < n; e++) buf[lo + e] = buf[lo + e] + src[e];
            }
            first = false;
        }
    }
    free(all);
}

/* Floats per round trip through host memory for a device buffer without
 * a device sum: bounds the host copy at 16 MiB whatever the tensor's size. */
enum { STAGE_FLOATS = 1 << 22 };

void kern_ranks_sum_f32(kern_ranks_t *r, float *buf, size_t count, bool on_device, const bool *contrib) {
    if (r->size == 1 || count == 0) return;
    if (!on_device) {
        sum_host_f32(r, buf, count, contrib);
        return;
    }
    MT_CHECK(r->dev, "kern_ranks_sum_f32: a device buffer before kern_ranks_bind_device");
    if (r->dev_sum) {
        r->dev_sum->sum_f32(r->dev_sum_state, buf, count);
        return;
    }
    kern_stream_t *s = kern_stream(r->dev, KERN_STREAM_COMPUTE);
    const size_t chunk = count < STAGE_FLOATS ? count : STAGE_FLOATS;
    float *host = malloc(chunk * sizeof *host);
    MT_CHECK_ALLOC(host, "the cross-rank gradient's host copy");
    for (size_t lo = 0; lo < count; lo += chunk) {
        const size_t n = count - lo < chunk ? count - lo : chunk;
        kern_memcpy_d2h(r->dev, s, host, buf + lo, n * sizeof *host);
        kern_stream_sync(r->dev, s);
        sum_host_f32(r, host, n, contrib);
        kern_memcpy_h2d(r->dev, s, buf + lo, host, n * sizeof *host);
        kern_stream_sync(r->dev, s); /* host is reused by the next chunk */
    }
    free(host);
}

void kern_ranks_allgather(kern_ranks_t *r, const void *send, void *recv, size_t bytes) {
    if (r->size == 1) {
        memmove(recv, send, bytes);
        return;
    }
    r->transport->allgather(r->transport_state, send, recv, bytes);
}

int kern_ranks_max_int(kern_ranks_t *r, int v) {
    if (r->size == 1) return v;
    int *all = malloc((size_t)r->size * sizeof *all);
    MT_CHECK_ALLOC(all, "ranks' max");
    kern_ranks_allgather(r, &v, all, sizeof v);
    int max = all[0];
    for (int q = 1; q < r->size; q++) max = all[q] > max ? all[q] : max;
    free(all);
    return max;
}

void kern_ranks_barrier(kern_ranks_t *r) {
    if (r->transport && r->size > 1) r->transport->barrier(r->transport_state);
}

_Noreturn void kern_ranks_abort(kern_ranks_t *r, int code) {
    if (r->transport && r->size > 1) r->transport->abort(r->transport_state, code);
    exit(code);
}
