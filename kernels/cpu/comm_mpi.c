/* MPI underneath kernels/comm_ranks.h (see comm_mpi.h).
 *
 * The gradient sum is an allgather of fixed-size chunks followed by a
 * sequential add on every rank, not MPI_Allreduce: the standard leaves an
 * allreduce's order of additions to the implementation (Open MPI picks an
 * algorithm by message size and rank count, and may give different ranks
 * differently rounded results), while training needs the rank-order sum,
 * bit for bit, on every rank so that the weights stay identical without
 * being broadcast.  The gather moves R times the bytes of a reduce-scatter;
 * for data parallel fine-tuning on a few ranks that is the price of
 * determinism. */
#include "kernels/cpu/comm_mpi.h"

#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Floats per rank per gather round: 4 MiB, so the receive buffer of a round
 * stays small next to a gradient while each round is large enough that the
 * per-message latency does not matter. */
enum { SUM_CHUNK = 1 << 20 };

mt_status_t kern_mpi_init(int *rank, int *size, int *local_rank, bool *initialised, mt_error_t *err) {
    *initialised = false;
    int inited = 0, finalized = 0;
    MPI_Initialized(&inited);
    MPI_Finalized(&finalized);
    if (finalized)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "MPI was already finalized in this process: a process started by mpirun runs one "
                            "training run");
    if (!inited) {
        int provided = 0;
        if (MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
            return mt_error_set(err, MT_ERR_DEVICE, "MPI_Init_thread failed: is this process started by mpirun?");
        *initialised = true;
    }
    /* errors abort the job (the default) rather than return: a rank that
     * failed inside a collective cannot tell the others */
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, size);
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, local_rank);
    MPI_Comm_free(&node);
    return MT_OK;
}

void kern_mpi_finalize(void) {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
}

void kern_mpi_allgather(const void *send, void *recv, size_t bytes) {
    MT_CHECK(bytes <= INT_MAX, "kern_mpi_allgather: %zu bytes per rank (at most %d)", bytes, INT_MAX);
    MPI_Allgather(send, (int)bytes, MPI_BYTE, recv, (int)bytes, MPI_BYTE, MPI_COMM_WORLD);
}

void kern_mpi_sum_f32(float *buf, size_t count, const bool *contrib) {
    int size = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const size_t chunk = count < SUM_CHUNK ? count : SUM_CHUNK;
    if (chunk == 0) return;
    float *all = malloc((size_t)size * chunk * sizeof *all);
    MT_CHECK_ALLOC(all, "the cross-rank gradient gather");
    for (size_t lo = 0; lo < count; lo += chunk) {
        const size_t n = count - lo < chunk ? count - lo : chunk;
        MPI_Allgather(buf + lo, (int)n, MPI_FLOAT, all, (int)n, MPI_FLOAT, MPI_COMM_WORLD);
        bool first = true;
        for (int r = 0; r < size; r++) {
            if (!contrib[r]) continue;
            const float *src = all + (size_t)r * n;
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

int kern_mpi_max_int(int v) {
    int out = v;
    /* max is exact in any order */
    MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

void kern_mpi_bcast(void *buf, size_t bytes, int root) {
    MT_CHECK(bytes <= INT_MAX, "kern_mpi_bcast: %zu bytes (at most %d)", bytes, INT_MAX);
    MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
}

void kern_mpi_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

_Noreturn void kern_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    abort(); /* MPI_Abort does not return; this satisfies _Noreturn */
}
