/* MPI underneath kernels/comm_ranks.h (see comm_mpi.h), and the transport
 * entry through which comm_ranks.c reaches it: registered when this library
 * is linked (kernels/ranks_registry.h). */
#include "kernels/cpu/comm_mpi.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/ranks_registry.h"

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

void kern_mpi_barrier(void) { MPI_Barrier(MPI_COMM_WORLD); }

_Noreturn void kern_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, code);
    abort(); /* MPI_Abort does not return; this satisfies _Noreturn */
}

/* ---- the transport entry (ranks_registry.h) -------------------------------- */

static bool set(const char *name) {
    const char *v = getenv(name);
    return v && v[0];
}

/* Open MPI's mpirun, or a PMI/PMIx launcher (srun, mpiexec.hydra). */
static bool mpi_launched(void) { return set("OMPI_COMM_WORLD_SIZE") || set("PMI_SIZE") || set("PMIX_RANK"); }

/* Whether this process's kern_mpi_init started MPI, and so finalizes it. */
typedef struct {
    bool initialised;
} mpi_state_t;

static mt_status_t mpi_init(void **state, int *rank, int *size, int *local_rank, mt_error_t *err) {
    bool initialised = false;
    const mt_status_t st = kern_mpi_init(rank, size, local_rank, &initialised, err);
    if (st != MT_OK) return st;
    mpi_state_t *m = malloc(sizeof *m);
    MT_CHECK_ALLOC(m, "the MPI transport's state");
    m->initialised = initialised;
    *state = m;
    return MT_OK;
}

static void mpi_destroy(void *state) {
    mpi_state_t *m = state;
    if (m && m->initialised) kern_mpi_finalize();
    free(m);
}

static void mpi_allgather(void *state, const void *send, void *recv, size_t bytes) {
    (void)state;
    kern_mpi_allgather(send, recv, bytes);
}

static void mpi_barrier(void *state) {
    (void)state;
    kern_mpi_barrier();
}

static void mpi_abort(void *state, int code) {
    (void)state;
    kern_mpi_abort(code);
}

static const kern_ranks_transport_t k_mpi_transport = {
    .name = "mpi",
    .launcher = "mpirun",
    .order = 0, /* before TCP: mpirun may also export torchrun-style variables */
    .launched = mpi_launched,
    .init = mpi_init,
    .destroy = mpi_destroy,
    .allgather = mpi_allgather,
    .barrier = mpi_barrier,
    .abort = mpi_abort,
};

__attribute__((constructor)) static void register_mpi_transport(void) {
    kern_ranks_register_transport(&k_mpi_transport);
}
