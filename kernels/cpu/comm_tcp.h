/* TCP underneath kernels/comm_ranks.h (which reaches it through the
 * transport entry comm_tcp.c registers, kernels/ranks_registry.h), for
 * ranks started the way torchrun starts them: each process is told RANK,
 * WORLD_SIZE and where rank 0 listens (MASTER_ADDR, MASTER_PORT), and
 * nothing else.  There is no MPI runtime to ask, so the ranks meet over
 * TCP: rank 0 listens, every other rank connects to it, and each
 * collective is a star through rank 0.
 *
 * This carries the few collectives of a data-parallel step (comm_ranks.h:
 * gradient sums as gathers, a max, a barrier) and, on CUDA, rank 0's NCCL
 * id; NCCL then carries the device sums itself.  A star moves every byte
 * through rank 0, which is fine for the few ranks of a fine-tuning job and
 * keeps the order of every reduction fixed.
 *
 * A rank that stops (an error, a kill) closes its connections; whoever next
 * waits on it reads the end of the stream and ends the process naming that
 * rank, so no rank waits forever for one that is gone.  Every call is
 * collective and from the thread that called kern_tcp_init. */
#ifndef MT_KERNELS_CPU_COMM_TCP_H
#define MT_KERNELS_CPU_COMM_TCP_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

typedef struct kern_tcp kern_tcp_t;

/* Whether the environment names this process a rank of a torchrun-style
 * launch: WORLD_SIZE above 1. */
bool kern_tcp_launched(void);

/* Reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (and LOCAL_RANK when
 * set) and meets the other ranks: rank 0 listens on MASTER_PORT and waits
 * for every other rank; the others connect, retrying while rank 0 is not
 * up yet.  Both give up after MOETUNE_RENDEZVOUS_TIMEOUT_S seconds (300
 * when unset).  Errors name the variable or the rank at fault: a missing or
 * malformed variable, a port in use, ranks that disagree on WORLD_SIZE, two
 * processes claiming one rank, a rank that never came.  *local_rank is
 * LOCAL_RANK when set, else this rank's index among the ranks on its host. */
mt_status_t kern_tcp_init(kern_tcp_t **out, int *rank, int *size, int *local_rank, mt_error_t *err);
void kern_tcp_destroy(kern_tcp_t *t);

/* recv (size * bytes) = every rank's send (bytes), in rank order.  Ranks
 * that pass different byte counts end the job naming the call. */
void kern_tcp_allgather(kern_tcp_t *t, const void *send, void *recv, size_t bytes);
void kern_tcp_barrier(kern_tcp_t *t);
/* Exits with `code`; the closed connections stop the other ranks. */
_Noreturn void kern_tcp_abort(kern_tcp_t *t, int code);

#endif
