/* How the pieces under the collectives across ranks (comm_ranks.h) join
 * them without comm_ranks.c naming any: a transport between processes
 * (MPI under mpirun, TCP under a torchrun-style launch) and a backend's own
 * sum of device buffers across ranks (NCCL between CUDA devices) each
 * register an entry here, and comm_ranks.c uses whichever the program links.
 *
 * Registration happens on link, as for device backends and for the same
 * reason (backend_registry.h): each piece's Bazel library is
 * `alwayslink = 1` and registers from a constructor function, so linking it
 * (//kernels/backends:ranks, :nccl_ranks) is the whole choice and the
 * engine, which creates the ranks, names none of them.
 *
 * A program that links no transport runs as one process even when a
 * launcher started several: only a linked transport knows its launcher's
 * environment. */
#ifndef MT_KERNELS_RANKS_REGISTRY_H
#define MT_KERNELS_RANKS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "kernels/device.h"

/* A transport: how the processes of one launch find each other and the
 * collectives every cross-rank operation is built on.  `state` is what init
 * made, passed back to every other call.  Every call is collective. */
typedef struct {
    const char *name;     /* for messages: "mpi", "tcp" */
    const char *launcher; /* what kern_ranks_launcher says: "mpirun" */
    /* Transports are asked in increasing order; the first that sees its
     * launcher's environment carries the job. */
    int order;
    /* Whether this process was started by the transport's launcher; reads
     * the environment only. */
    bool (*launched)(void);
    /* Joins the other ranks: this rank, their number, this rank's index
     * among the ranks of its node.  On failure nothing is left to destroy. */
    mt_status_t (*init)(void **state, int *rank, int *size, int *local_rank, mt_error_t *err);
    void (*destroy)(void *state);
    /* recv (size * bytes) = every rank's send (bytes), in rank order. */
    void (*allgather)(void *state, const void *send, void *recv, size_t bytes);
    void (*barrier)(void *state);
    /* Ends every rank of the job with exit code `code`; does not return. */
    void (*abort)(void *state, int code);
} kern_ranks_transport_t;

/* A backend's own sum of device buffers across ranks, used instead of a
 * round trip through host memory where it gives the rank-order sum's bits. */
typedef struct {
    const char *name;         /* for messages: "NCCL" */
    kern_backend_kind_t kind; /* the devices it sums on */
    int ranks;                /* the one rank count whose sum it forms in rank order */
    size_t id_bytes;          /* what rank 0 hands every rank to join */
    /* Rank 0's part: a fresh id for the job, id_bytes long. */
    mt_status_t (*unique_id)(void *id, mt_error_t *err);
    /* Collective over every rank, each with rank 0's id; dev is this rank's
     * device, of `kind`. */
    mt_status_t (*create)(kern_device_t *dev, int rank, int size, const void *id, void **state, mt_error_t *err);
    void (*destroy)(void *state);
    /* buf (count floats on dev) = the sum over the ranks, in place; dev's
     * work on buf has finished before and after. */
    void (*sum_f32)(void *state, float *buf, size_t count);
} kern_ranks_device_sum_t;

/* Called from a piece's constructor; the entry must outlive the program
 * (a static const).  Registering an entry twice is ignored; a second
 * device sum for one kind is a fatal error naming both. */
void kern_ranks_register_transport(const kern_ranks_transport_t *t);
void kern_ranks_register_device_sum(const kern_ranks_device_sum_t *d);

/* The first registered transport, in order, whose launcher started this
 * process; NULL when none did (or none is linked). */
const kern_ranks_transport_t *kern_ranks_launched_transport(void);

/* The device sum registered for devices of `kind`; NULL when none. */
const kern_ranks_device_sum_t *kern_ranks_find_device_sum(kern_backend_kind_t kind);

#endif
