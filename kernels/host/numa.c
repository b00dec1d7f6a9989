/* NUMA topology, placement and per-node teams (see numa.h).
 *
 * Probing keeps all or nothing: anything unexpected in sysfs makes the host
 * one node rather than a half-read topology, because a wrong split (runners
 * of two "nodes" sharing cores, state homed on the wrong socket) costs more
 * than no split.
 *
 * The team works like the thread pool one level up: runners sleep on a
 * condition variable between runs, a run is published by bumping a
 * generation counter (so a runner never runs the same one twice), and
 * `pending` counts the runners still inside it.  A second mutex serialises
 * callers. */
#include "kernels/host/numa.h"

#include <dirent.h>
#include <errno.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

#include "base/status.h"

/* Linux's MAX_NUMNODES at its largest (CONFIG_NODES_SHIFT = 10): sysfs never
 * names a node above it, and mbind's mask is sized for it. */
enum { NUMA_MAX_NODE_ID = 1023 };

static const char k_default_sysfs_root[] = "/sys/devices/system/node";
static const char k_pretend_env[] = "MOETUNE_NUMA_NODES";

/* ---- probing ---- */

static void allowed_cpus(cpu_set_t *out) {
    CPU_ZERO(out);
    if (sched_getaffinity(0, sizeof *out, out) == 0 && CPU_COUNT(out) > 0) return;
    /* A kernel built for more CPUs than a cpu_set_t holds refuses the call:
     * fall back to the online CPUs a cpu_set_t can name. */
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (online < 1) online = 1;
    if (online > CPU_SETSIZE) online = CPU_SETSIZE;
    CPU_ZERO(out);
    for (int c = 0; c < online; c++) CPU_SET(c, out);
}

/* A decimal CPU number below CPU_SETSIZE at *s; advances *s past it. */
static bool parse_cpu(const char **s, int *cpu) {
    const char *q = *s;
    if (*q < '0' || *q > '9') return false;
    int v = 0;
    for (; *q >= '0' && *q <= '9'; q++) {
        v = v * 10 + (*q - '0');
        if (v >= CPU_SETSIZE) return false;
    }
    *cpu = v;
    *s = q;
    return true;
}

static bool at_list_end(const char *s) { return s[0] == '\0' || (s[0] == '\n' && s[1] == '\0'); }

/* The kernel's cpulist format: ranges "a" or "a-b" joined by commas, one
 * trailing newline; an empty list is a node with memory and no CPUs. */
static bool parse_cpulist(const char *s, cpu_set_t *out) {
    CPU_ZERO(out);
    if (at_list_end(s)) return true;
    for (;;) {
        int first, last;
        if (!parse_cpu(&s, &first)) return false;
        last = first;
        if (*s == '-') {
            s++;
            if (!parse_cpu(&s, &last) || last < first) return false;
        }
        for (int c = first; c <= last; c++) CPU_SET(c, out);
        if (at_list_end(s)) return true;
        if (*s++ != ',') return false;
    }
}

/* Node id's CPUs from root/node<id>/cpulist; false when unreadable or malformed. */
static bool read_node_cpus(const char *root, int id, cpu_set_t *out) {
    char path[4096];
    const int len = snprintf(path, sizeof path, "%s/node%d/cpulist", root, id);
    if (len < 0 || (size_t)len >= sizeof path) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    /* getline: the list of an interleaved many-core node outgrows a fixed buffer. */
    char *line = NULL;
    size_t cap = 0;
    const bool ok = getline(&line, &cap, f) >= 0 && getc(f) == EOF && parse_cpulist(line, out);
    free(line);
    fclose(f);
    return ok;
}

/* The number N of a directory entry "nodeN" as sysfs writes it (no leading
 * zeros, at most NUMA_MAX_NODE_ID); -1 for any other entry. */
static int node_number(const char *name) {
    if (strncmp(name, "node", 4) != 0) return -1;
    const char *s = name + 4;
    if (*s == '\0' || (s[0] == '0' && s[1] != '\0')) return -1;
    int v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        v = v * 10 + (*s - '0');
        if (v > NUMA_MAX_NODE_ID) return -1;
    }
    return v;
}

/* t from the nodes under root that have allowed CPUs, in order of node
 * number; false when the topology cannot be trusted. */
static bool probe_sysfs(kern_numa_t *t, const char *root, const cpu_set_t *allowed) {
    DIR *dir = opendir(root);
    if (!dir) return false;
    /* Indexed by node number, so the walk below is in node order whatever
     * order readdir returns. */
    bool listed[NUMA_MAX_NODE_ID + 1] = {false};
    bool any = false;
    for (const struct dirent *e; (e = readdir(dir)) != NULL;) {
        const int id = node_number(e->d_name);
        if (id >= 0) listed[id] = any = true;
    }
    closedir(dir);
    if (!any) return false;

    cpu_set_t claimed;
    CPU_ZERO(&claimed);
    t->nodes = 0;
    for (int id = 0; id <= NUMA_MAX_NODE_ID; id++) {
        if (!listed[id]) continue;
        cpu_set_t cpus, shared, usable;
        if (!read_node_cpus(root, id, &cpus)) return false;
        CPU_AND(&shared, &cpus, &claimed);
        if (CPU_COUNT(&shared) > 0) return false; /* a CPU belongs to one node */
        CPU_OR(&claimed, &claimed, &cpus);
        CPU_AND(&usable, &cpus, allowed);
        if (CPU_COUNT(&usable) == 0) continue;
        if (t->nodes == KERN_NUMA_MAX_NODES) return false;
        t->node_id[t->nodes] = id;
        t->cpus[t->nodes] = usable;
        t->ncpus[t->nodes] = CPU_COUNT(&usable);
        t->nodes++;
    }
    return t->nodes > 0;
}

/* K from MOETUNE_NUMA_NODES; 0 when unset or bad (bad: warned). */
static int pretend_nodes_from_env(int allowed_count) {
    const char *value = getenv(k_pretend_env);
    if (!value) return 0;
    const int most = allowed_count < KERN_NUMA_MAX_NODES ? allowed_count : KERN_NUMA_MAX_NODES;
    char *end = NULL;
    errno = 0;
    const long k = strtol(value, &end, 10);
    if (end != value && *end == '\0' && errno == 0 && k >= 1 && k <= most) return (int)k;
    fprintf(stderr,
            "moetune: ignoring %s=\"%s\": expected a number of pretend NUMA nodes from 1 to %d "
            "(at most %d, and at most the %d CPUs this process may run on)\n",
            k_pretend_env, value, most, KERN_NUMA_MAX_NODES, allowed_count);
    return 0;
}

/* The allowed CPUs in order, CPU i of n to node floor(i * k / n): k runs of
 * consecutive CPUs whose sizes differ by at most one. */
static void split_pretend(kern_numa_t *t, const cpu_set_t *allowed, int k) {
    const long n = CPU_COUNT(allowed);
    t->nodes = k;
    t->pretend = true;
    for (int node = 0; node < k; node++) {
        t->node_id[node] = -1;
        CPU_ZERO(&t->cpus[node]);
        t->ncpus[node] = 0;
    }
    long i = 0;
    for (int c = 0; c < CPU_SETSIZE; c++) {
        if (!CPU_ISSET(c, allowed)) continue;
        const int node = (int)(i++ * k / n);
        CPU_SET(c, &t->cpus[node]);
        t->ncpus[node]++;
    }
}

void kern_numa_probe(kern_numa_t *t, const char *sysfs_root) {
    MT_CHECK(t != NULL, "kern_numa_probe: expected a kern_numa_t to fill, got NULL");
    memset(t, 0, sizeof *t);
    cpu_set_t allowed;
    allowed_cpus(&allowed);
    const int pretend = pretend_nodes_from_env(CPU_COUNT(&allowed));
    if (pretend > 0) {
        split_pretend(t, &allowed, pretend);
        return;
    }
    if (probe_sysfs(t, sysfs_root ? sysfs_root : k_default_sysfs_root, &allowed)) return;
    memset(t, 0, sizeof *t);
    t->nodes = 1;
    t->node_id[0] = -1;
    t->cpus[0] = allowed;
    t->ncpus[0] = CPU_COUNT(&allowed);
}

/* The one process-wide value here: every caller (the planner's summary, the
 * optimizer's homes, its team) must see the same split, and the probe
 * reads files. */
static kern_numa_t g_host;
static pthread_once_t g_host_once = PTHREAD_ONCE_INIT;

static void probe_host(void) { kern_numa_probe(&g_host, NULL); }

const kern_numa_t *kern_numa_host(void) {
    pthread_once(&g_host_once, probe_host);
    return &g_host;
}

/* Probed as the program loads, before anything pins a thread: the probe
 * reads the calling thread's CPU mask, and the CPU backend later narrows
 * the thread that opens it to its compute cores. */
__attribute__((constructor)) static void probe_at_load(void) { (void)kern_numa_host(); }

/* ---- placement ---- */

bool kern_numa_place(const kern_numa_t *t, void *p, size_t bytes, int k) {
    MT_CHECK(t != NULL && k >= 0 && k < t->nodes,
             "kern_numa_place: node %d of a topology of %d node(s): expected 0 <= node < nodes", k,
             t ? t->nodes : 0);
    if (t->nodes <= 1 || t->pretend || p == NULL) return false;
    const int id = t->node_id[k];
    if (id < 0 || id > NUMA_MAX_NODE_ID) return false;
    const long page_size = sysconf(_SC_PAGESIZE);
    if (page_size <= 0 || bytes > UINTPTR_MAX - (uintptr_t)p) return false;
    const uintptr_t page = (uintptr_t)page_size;
    /* Only whole pages: a page straddling the range's ends holds someone
     * else's data too, and moving it could take theirs off their node. */
    const uintptr_t start = ((uintptr_t)p + page - 1) & ~(page - 1);
    const uintptr_t end = ((uintptr_t)p + bytes) & ~(page - 1);
    if (end <= start) return false;

    enum { BITS_PER_LONG = 8 * sizeof(unsigned long) };
    unsigned long mask[(NUMA_MAX_NODE_ID + 1) / BITS_PER_LONG] = {0};
    mask[id / BITS_PER_LONG] |= 1UL << (id % BITS_PER_LONG);
    /* The kernel reads maxnode - 1 bits of the mask (an off-by-one kept for
     * compatibility; libnuma passes one more bit too). */
    const unsigned long maxnode = (unsigned long)(id / BITS_PER_LONG + 1) * BITS_PER_LONG + 1;
    return syscall(SYS_mbind, (void *)start, (unsigned long)(end - start), (long)MPOL_PREFERRED, mask,
                   maxnode, (unsigned long)MPOL_MF_MOVE) == 0;
}

/* ---- splitting work ---- */

void kern_numa_assign(const size_t *bytes, int n, int nodes, int *node_of) {
    MT_CHECK(nodes >= 1 && nodes <= KERN_NUMA_MAX_NODES,
             "kern_numa_assign: %d nodes: expected 1 to %d", nodes, KERN_NUMA_MAX_NODES);
    MT_CHECK(n >= 0 && (n == 0 || (bytes != NULL && node_of != NULL)),
             "kern_numa_assign: %d items: expected n >= 0 and the arrays of sizes and nodes", n);
    size_t load[KERN_NUMA_MAX_NODES] = {0};
    for (int i = 0; i < n; i++) {
        int least = 0;
        for (int k = 1; k < nodes; k++)
            if (load[k] < load[least]) least = k;
        node_of[i] = least;
        load[least] += bytes[i];
    }
}

/* ---- the team ---- */

typedef struct {
    kern_numa_team_t *team;
    int node;
    cpu_set_t cpus;
    int pool_threads;
    kern_threadpool_t *pool; /* created and destroyed by the runner itself */
    pthread_t thread;
} numa_runner_t;

struct kern_numa_team {
    int nodes;
    numa_runner_t runners[KERN_NUMA_MAX_NODES];
    pthread_mutex_t call_lock; /* one run at a time */
    pthread_mutex_t lock;      /* guards the fields below */
    pthread_cond_t wake, done;
    unsigned long generation; /* bumped to publish a run */
    bool stopping;
    int pending; /* runners not done with the current run (at creation: not yet started) */
    kern_numa_fn fn;
    void *ctx;
};

/* A refusal (the cpuset shrank since the probe) leaves the runner unpinned:
 * slower, still correct. */
static void pin_runner(const numa_runner_t *r) {
    const int rc = pthread_setaffinity_np(pthread_self(), sizeof r->cpus, &r->cpus);
    if (rc != 0)
        fprintf(stderr, "moetune: could not pin the runner of NUMA node %d to its %d CPUs (%s); it runs unpinned\n",
                r->node, CPU_COUNT(&r->cpus), strerror(rc));
}

/* With team->lock held: one more runner has finished the run (or started up). */
static void runner_finished(kern_numa_team_t *team) {
    if (--team->pending == 0) pthread_cond_signal(&team->done);
}

static void *runner_main(void *arg) {
    numa_runner_t *r = arg;
    kern_numa_team_t *team = r->team;
    pin_runner(r);
    /* After pinning: kern_threadpool_create starts the workers from this
     * thread with default attributes, so they inherit its CPUs; and the
     * pool's memory is first touched here, on the node. */
    r->pool = kern_threadpool_create(r->pool_threads);
    unsigned long seen = 0;
    pthread_mutex_lock(&team->lock);
    runner_finished(team);
    for (;;) {
        while (!team->stopping && team->generation == seen) pthread_cond_wait(&team->wake, &team->lock);
        if (team->stopping) break;
        seen = team->generation;
        const kern_numa_fn fn = team->fn;
        void *ctx = team->ctx;
        pthread_mutex_unlock(&team->lock);
        fn(ctx, r->node, r->pool);
        pthread_mutex_lock(&team->lock);
        runner_finished(team);
    }
    pthread_mutex_unlock(&team->lock);
    kern_threadpool_destroy(r->pool);
    return NULL;
}

kern_numa_team_t *kern_numa_team_create(const kern_numa_t *t, int threads_per_node) {
    MT_CHECK(t != NULL && t->nodes >= 1 && t->nodes <= KERN_NUMA_MAX_NODES,
             "kern_numa_team_create: a topology of %d node(s): expected 1 to %d", t ? t->nodes : 0,
             KERN_NUMA_MAX_NODES);
    kern_numa_team_t *team = calloc(1, sizeof *team);
    MT_CHECK_ALLOC(team, "NUMA team");
    team->nodes = t->nodes;
    pthread_mutex_init(&team->call_lock, NULL);
    pthread_mutex_init(&team->lock, NULL);
    pthread_cond_init(&team->wake, NULL);
    pthread_cond_init(&team->done, NULL);
    team->pending = t->nodes;
    for (int k = 0; k < t->nodes; k++) {
        numa_runner_t *r = &team->runners[k];
        r->team = team;
        r->node = k;
        r->cpus = t->cpus[k];
        /* ncpus is at least 1 from a probe; a hand-made topology may say 0 */
        r->pool_threads = threads_per_node > 0 ? threads_per_node : (t->ncpus[k] > 0 ? t->ncpus[k] : 1);
        MT_CHECK(pthread_create(&r->thread, NULL, runner_main, r) == 0,
                 "pthread_create failed for the runner of NUMA node %d", k);
    }
    /* Every pool exists before the team is handed out (kern_numa_team_pool). */
    pthread_mutex_lock(&team->lock);
    while (team->pending > 0) pthread_cond_wait(&team->done, &team->lock);
    pthread_mutex_unlock(&team->lock);
    return team;
}

void kern_numa_team_destroy(kern_numa_team_t *team) {
    if (!team) return;
    pthread_mutex_lock(&team->lock);
    team->stopping = true;
    pthread_cond_broadcast(&team->wake);
    pthread_mutex_unlock(&team->lock);
    for (int k = 0; k < team->nodes; k++) pthread_join(team->runners[k].thread, NULL);
    pthread_cond_destroy(&team->wake);
    pthread_cond_destroy(&team->done);
    pthread_mutex_destroy(&team->lock);
    pthread_mutex_destroy(&team->call_lock);
    free(team);
}

int kern_numa_team_nodes(const kern_numa_team_t *team) {
    MT_CHECK(team != NULL, "kern_numa_team_nodes: expected a team, got NULL");
    return team->nodes;
}

void kern_numa_team_run(kern_numa_team_t *team, kern_numa_fn fn, void *ctx) {
    MT_CHECK(team != NULL && fn != NULL, "kern_numa_team_run: expected a team and a function");
    pthread_mutex_lock(&team->call_lock);
    pthread_mutex_lock(&team->lock);
    team->fn = fn;
    team->ctx = ctx;
    team->pending = team->nodes;
    team->generation++;
    pthread_cond_broadcast(&team->wake);
    while (team->pending > 0) pthread_cond_wait(&team->done, &team->lock);
    pthread_mutex_unlock(&team->lock);
    pthread_mutex_unlock(&team->call_lock);
}

kern_threadpool_t *kern_numa_team_pool(kern_numa_team_t *team, int k) {
    MT_CHECK(team != NULL && k >= 0 && k < team->nodes,
             "kern_numa_team_pool: node %d of a team of %d: expected 0 <= node < nodes", k,
             team ? team->nodes : 0);
    return team->runners[k].pool;
}
