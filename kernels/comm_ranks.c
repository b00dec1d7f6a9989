/* Collectives across ranks: launch detection and the choice between MPI and
 * NCCL (see comm_ranks.h). */
#include "kernels/comm_ranks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/comm_mpi.h"
#include "kernels/cuda/comm_nccl_ranks.h"

struct kern_ranks {
    int rank, size, local_rank;
    bool mpi_initialised;     /* this object started MPI and finalises it */
    kern_device_t *dev;       /* the bound device, for on-device buffers */
    kern_nccl_ranks_t *nccl;  /* two ranks on CUDA devices, else NULL */
};

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

bool kern_ranks_launched(void) { return env("OMPI_COMM_WORLD_SIZE") || env("PMI_SIZE") || env("PMIX_RANK"); }

mt_status_t kern_ranks_create(kern_ranks_t **out, mt_error_t *err) {
    *out = NULL;
    const bool by_mpi = kern_ranks_launched();
    const char *ws = env("WORLD_SIZE");
    if (!by_mpi && ws && strcmp(ws, "1") != 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "WORLD_SIZE=%s is set (torchrun's launch) but this process was not started by "
                            "mpirun; moetune runs across processes only under MPI: launch with "
                            "`mpirun -np %s moetune train RUN.yaml` (or unset WORLD_SIZE for one process)",
                            ws, ws);
    kern_ranks_t *r = calloc(1, sizeof *r);
    MT_CHECK_ALLOC(r, "ranks");
    r->size = 1;
    if (by_mpi) {
        const mt_status_t st = kern_mpi_init(&r->rank, &r->size, &r->local_rank, &r->mpi_initialised, err);
        if (st != MT_OK) {
            free(r);
            return st;
        }
    }
    *out = r;
    return MT_OK;
}

void kern_ranks_destroy(kern_ranks_t *r) {
    if (!r) return;
    if (r->nccl) kern_nccl_ranks_destroy(r->nccl);
    if (r->mpi_initialised) kern_mpi_finalize();
    free(r);
}

int kern_ranks_rank(const kern_ranks_t *r) { return r->rank; }
int kern_ranks_size(const kern_ranks_t *r) { return r->size; }
int kern_ranks_local_rank(const kern_ranks_t *r) { return r->local_rank; }

mt_status_t kern_ranks_bind_device(kern_ranks_t *r, kern_device_t *dev, mt_error_t *err) {
    r->dev = dev;
    if (r->size != 2 || dev->kind != KERN_BACKEND_CUDA) return MT_OK;
    return kern_nccl_ranks_create(dev, r->rank, r->size, &r->nccl, err);
}

/* Floats per round trip through host memory for a device buffer without
 * NCCL: bounds the host copy at 16 MiB whatever the tensor's size. */
enum { STAGE_FLOATS = 1 << 22 };

void kern_ranks_sum_f32(kern_ranks_t *r, float *buf, size_t count, bool on_device, const bool *contrib) {
    if (r->size == 1 || count == 0) return;
    if (!on_device) {
        kern_mpi_sum_f32(buf, count, contrib);
        return;
    }
    MT_CHECK(r->dev, "kern_ranks_sum_f32: a device buffer before kern_ranks_bind_device");
    if (r->nccl) {
        kern_nccl_ranks_sum_f32(r->nccl, buf, count);
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
        kern_mpi_sum_f32(host, n, contrib);
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
    kern_mpi_allgather(send, recv, bytes);
}

int kern_ranks_max_int(kern_ranks_t *r, int v) { return r->size == 1 ? v : kern_mpi_max_int(v); }

void kern_ranks_barrier(kern_ranks_t *r) {
    if (r->size > 1) kern_mpi_barrier();
}

_Noreturn void kern_ranks_abort(kern_ranks_t *r, int code) {
    if (r->size > 1) kern_mpi_abort(code);
    exit(code);
}
