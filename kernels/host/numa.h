/* The host's NUMA nodes, memory placed on a node, and a team of per-node
 * runner threads.
 *
 * On a two-socket host, host AdamW is bound by memory bandwidth: a core
 * reading state homed on the other socket gets a fraction of what it gets
 * from its own.  So the optimizer's state is shared out between the nodes
 * (kern_numa_assign), each share is asked to live on its node
 * (kern_numa_place), and each node's cores update only their own share
 * (kern_numa_team_run, one runner thread and pool per node).
 *
 * NUMA is an optimisation here, never a requirement: when the topology cannot
 * be read, the host is treated as one node, and a placement the kernel
 * refuses leaves the memory where it was.  No libnuma (it is not on every
 * host we build on): the topology comes from sysfs and placement from the
 * mbind system call.
 *
 * Needs _GNU_SOURCE for cpu_set_t (the build defines it everywhere). */
#ifndef MT_KERNELS_HOST_NUMA_H
#define MT_KERNELS_HOST_NUMA_H

#include <sched.h>
#include <stdbool.h>
#include <stddef.h>

#include "kernels/host/threadpool.h"

/* More nodes than this with usable CPUs: treated as one node (no host we
 * target has more than 8). */
enum { KERN_NUMA_MAX_NODES = 16 };

typedef struct {
    int nodes;    /* >= 1 */
    bool pretend; /* split by MOETUNE_NUMA_NODES (tests): memory is not placed */
    /* The kernel's node number (sysfs nodeN); -1 when pretend, or when the
     * topology could not be read and one node holds every CPU. */
    int node_id[KERN_NUMA_MAX_NODES];
    cpu_set_t cpus[KERN_NUMA_MAX_NODES]; /* each node's CPUs, within the affinity mask */
    int ncpus[KERN_NUMA_MAX_NODES];      /* CPU_COUNT(&cpus[k]) >= 1 */
} kern_numa_t;

/* Reads the nodes that have CPUs in the calling thread's sched_getaffinity
 * mask (the process's, until something pins threads) from sysfs_root (NULL:
 * "/sys/devices/system/node"; each nodeN/cpulist, a list like "0-27,56-83"),
 * in order of N.  Nodes without allowed CPUs are left out, and so are
 * allowed CPUs that no node lists.  No directory, nothing readable, a
 * malformed cpulist, two nodes claiming one CPU, or more than
 * KERN_NUMA_MAX_NODES nodes: one node holding every allowed CPU (never an
 * error).  If env MOETUNE_NUMA_NODES=K (1 <= K <= 16, and K <= allowed CPUs)
 * is set, the allowed CPUs are instead split into K pretend nodes of
 * consecutive CPUs as even as possible, pretend = true (so tests on a
 * one-node machine exercise the multi-node paths); a bad value is ignored
 * with a one-line warning on stderr naming the variable and what was
 * expected. */
void kern_numa_probe(kern_numa_t *t, const char *sysfs_root);
/* The host's topology, probed once (thread-safe) on the first call. */
const kern_numa_t *kern_numa_host(void);
/* Asks the kernel to keep the whole pages inside [p, p + bytes) on node k,
 * moving those already touched (mbind, MPOL_PREFERRED, MPOL_MF_MOVE).  A
 * preference, not a requirement: returns false and does nothing with one
 * node, pretend nodes, no whole page in the range, or when the call fails
 * (e.g. EPERM in a container); true when placed.  k must be in [0, nodes). */
bool kern_numa_place(const kern_numa_t *t, void *p, size_t bytes, int k);

/* Assigns n items of sizes bytes[i] to nodes so each node gets a near-equal
 * share, in item order, deterministically: item i goes to the node with the
 * fewest bytes so far (lowest node index on ties).  node_of[i] receives the
 * node.  1 <= nodes <= KERN_NUMA_MAX_NODES; n may be 0. */
void kern_numa_assign(const size_t *bytes, int n, int nodes, int *node_of);

/* A team: one runner thread per node of t, each pinned to its node's CPUs
 * and owning a kern_threadpool_t of threads_per_node threads (<= 0: the
 * node's CPU count) that it created itself, so the pool's workers inherit
 * the runner's CPUs and the pool's memory is first touched on the node. */
typedef struct kern_numa_team kern_numa_team_t;
kern_numa_team_t *kern_numa_team_create(const kern_numa_t *t, int threads_per_node);
void kern_numa_team_destroy(kern_numa_team_t *team); /* NULL: no-op */
int kern_numa_team_nodes(const kern_numa_team_t *team);
/* Calls fn(ctx, k, pool_k) on every node k's runner, all at once, and
 * returns when all have returned.  Not reentrant: one run at a time (callers
 * on other threads wait their turn); fn must not call kern_numa_team_run on
 * the same team. */
typedef void (*kern_numa_fn)(void *ctx, int node, kern_threadpool_t *pool);
void kern_numa_team_run(kern_numa_team_t *team, kern_numa_fn fn, void *ctx);
/* Node k's pool (for work that runs on one node only).  Its workers run on
 * node k's CPUs; a caller that is not node k's runner takes part in a
 * parallel_for on its own CPUs. */
kern_threadpool_t *kern_numa_team_pool(kern_numa_team_t *team, int k);

#endif
