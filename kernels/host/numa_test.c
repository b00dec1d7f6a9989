/* Tests of the NUMA module (numa.c).
 *
 * What must hold:
 * 1. probe reads fake sysfs trees: each node's CPUs cut to the affinity
 *    mask, nodes in node-number order, nodes without allowed CPUs left out;
 *    anything it cannot trust (no directory, no nodes, a malformed or
 *    missing cpulist, two nodes sharing a CPU) gives one node holding every
 *    allowed CPU.  Expectations come from this process's own mask, so the
 *    test holds on any machine.
 * 2. MOETUNE_NUMA_NODES=K splits the allowed CPUs into K pretend nodes of
 *    consecutive CPUs, disjoint, covering them all, sizes within one; a bad
 *    value changes nothing but one warning line naming the variable.
 * 3. place refuses pretend nodes, one node and ranges without a whole page,
 *    and never changes the memory's contents.
 * 4. assign gives each item to the least-loaded node, lowest on ties.
 * 5. A team runs fn on every node at once, each runner pinned to its node,
 *    each node's pool workers inheriting those CPUs, every task of a
 *    parallel_for run once; runs from two threads never overlap. */
#include "kernels/host/numa.h"

#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kernels/host/threadpool.h"

static int g_failures;

#define EXPECT(cond, ...)                                        \
    do {                                                         \
        if (!(cond)) {                                           \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            g_failures++;                                        \
        }                                                        \
    } while (0)

/* The test cannot go on without its fixtures: stop, naming what failed. */
static void die(const char *what) {
    perror(what);
    exit(2);
}

static cpu_set_t g_allowed; /* this process's affinity mask at start */
static char g_tmp[4096];    /* a fresh directory for this run's fake sysfs trees */

static cpu_set_t mask_of_self(void) {
    cpu_set_t s;
    CPU_ZERO(&s);
    if (pthread_getaffinity_np(pthread_self(), sizeof s, &s) != 0) die("pthread_getaffinity_np");
    return s;
}

static cpu_set_t range_set(int first, int last) {
    cpu_set_t s;
    CPU_ZERO(&s);
    for (int c = first; c <= last; c++) CPU_SET(c, &s);
    return s;
}

/* Whether *count reaches want within 5 s: bounded so that a broken team
 * fails the test instead of hanging it. */
static bool wait_for_count(atomic_int *count, int want) {
    const struct timespec nap = {0, 100 * 1000};
    for (int i = 0; i < 50000; i++) {
        if (atomic_load(count) >= want) return true;
        nanosleep(&nap, NULL);
    }
    return atomic_load(count) >= want;
}

/* ---- fake sysfs trees ---- */

typedef struct {
    int id;
    const char *cpulist; /* NULL: the node directory has no cpulist file */
} fake_node_t;

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (!f || fputs(text, f) < 0 || fclose(f) != 0) die(path);
}

/* Writes g_tmp/name/nodeN/cpulist for each node, plus the other entries a
 * real node directory has beside them (probe must skip those). */
static const char *make_tree(const char *name, const fake_node_t *nodes, int n) {
    static char root[4096 + 64];
    char path[sizeof root + 64];
    snprintf(root, sizeof root, "%s/%s", g_tmp, name);
    if (mkdir(root, 0755) != 0) die(root);
    snprintf(path, sizeof path, "%s/possible", root);
    write_file(path, "0-1\n");
    snprintf(path, sizeof path, "%s/power", root);
    if (mkdir(path, 0755) != 0) die(path);
    for (int i = 0; i < n; i++) {
        snprintf(path, sizeof path, "%s/node%d", root, nodes[i].id);
        if (mkdir(path, 0755) != 0) die(path);
        if (!nodes[i].cpulist) continue;
        snprintf(path, sizeof path, "%s/node%d/cpulist", root, nodes[i].id);
        write_file(path, nodes[i].cpulist);
    }
    return root;
}

/* What probe should make of nodes whose CPUs the test states as sets:
 * each cut to the allowed mask, the empty ones left out, in the given order
 * (the test lists them in node-number order). */
static kern_numa_t expected_topology(const int *ids, const cpu_set_t *cpus, int n) {
    kern_numa_t t;
    memset(&t, 0, sizeof t);
    for (int i = 0; i < n; i++) {
        cpu_set_t usable;
        CPU_AND(&usable, &cpus[i], &g_allowed);
        if (CPU_COUNT(&usable) == 0) continue;
        t.node_id[t.nodes] = ids[i];
        t.cpus[t.nodes] = usable;
        t.ncpus[t.nodes] = CPU_COUNT(&usable);
        t.nodes++;
    }
    return t;
}

static kern_numa_t one_node_of_everything(void) {
    kern_numa_t t;
    memset(&t, 0, sizeof t);
    t.nodes = 1;
    t.node_id[0] = -1;
    t.cpus[0] = g_allowed;
    t.ncpus[0] = CPU_COUNT(&g_allowed);
    return t;
}

static void expect_same_topology(const char *what, const kern_numa_t *got, const kern_numa_t *want) {
    EXPECT(got->nodes == want->nodes, "%s: %d nodes, expected %d", what, got->nodes, want->nodes);
    EXPECT(got->pretend == want->pretend, "%s: pretend = %d, expected %d", what, got->pretend, want->pretend);
    const int n = got->nodes < want->nodes ? got->nodes : want->nodes;
    for (int k = 0; k < n; k++) {
        EXPECT(got->node_id[k] == want->node_id[k], "%s: node %d has id %d, expected %d", what, k,
               got->node_id[k], want->node_id[k]);
        EXPECT(CPU_EQUAL(&got->cpus[k], &want->cpus[k]), "%s: node %d's CPUs differ from those expected",
               what, k);
        EXPECT(got->ncpus[k] == want->ncpus[k], "%s: node %d has ncpus %d, expected %d", what, k,
               got->ncpus[k], want->ncpus[k]);
    }
}

/* probe with stderr caught into text (what it warned, "" if nothing). */
static void probe_catching_stderr(kern_numa_t *t, const char *root, char *text, size_t cap) {
    char path[sizeof g_tmp + 32];
    snprintf(path, sizeof path, "%s/stderr.txt", g_tmp);
    const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) die(path);
    fflush(stderr);
    const int saved = dup(2);
    if (saved < 0 || dup2(fd, 2) < 0) die("dup2");
    kern_numa_probe(t, root);
    fflush(stderr);
    if (dup2(saved, 2) < 0) die("dup2");
    close(saved);
    const ssize_t got = pread(fd, text, cap - 1, 0);
    text[got > 0 ? got : 0] = '\0';
    close(fd);
}

static int count_char(const char *s, char c) {
    int n = 0;
    for (; *s; s++) n += *s == c;
    return n;
}

/* ---- 1. probing sysfs ---- */

static void test_probe_sysfs(void) {
    {
        const fake_node_t nodes[] = {{0, "0-1\n"}, {1, "2-3\n"}};
        const char *root = make_tree("two", nodes, 2);
        const int ids[] = {0, 1};
        const cpu_set_t cpus[] = {range_set(0, 1), range_set(2, 3)};
        const kern_numa_t want = expected_topology(ids, cpus, 2);
        kern_numa_t got;
        kern_numa_probe(&got, root);
        expect_same_topology("nodes 0-1 / 2-3", &got, &want);
    }
    {
        /* One CPU a node (two real nodes on a two-CPU box); node numbers that
         * sort differently as text than as numbers; a list of several
         * ranges partly outside any mask; no trailing newline. */
        const fake_node_t nodes[] = {{10, "1\n"}, {2, "0,1000-1001"}};
        const char *root = make_tree("order", nodes, 2);
        const int ids[] = {2, 10};
        cpu_set_t node2 = range_set(1000, 1001);
        CPU_SET(0, &node2);
        const cpu_set_t cpus[] = {node2, range_set(1, 1)};
        const kern_numa_t want = expected_topology(ids, cpus, 2);
        kern_numa_t got;
        kern_numa_probe(&got, root);
        expect_same_topology("nodes 2 (0,1000-1001) / 10 (1)", &got, &want);
    }
    {
        /* A node whose CPUs are all outside the mask and a node with memory
         * only are left out. */
        const fake_node_t nodes[] = {{0, "0-1\n"}, {1, "1010-1023\n"}, {3, "\n"}};
        const char *root = make_tree("outside", nodes, 3);
        const int ids[] = {0, 1};
        const cpu_set_t cpus[] = {range_set(0, 1), range_set(1010, 1023)};
        kern_numa_t want = expected_topology(ids, cpus, 2);
        if (want.nodes == 0) want = one_node_of_everything(); /* a mask without CPUs 0 and 1 */
        kern_numa_t got;
        kern_numa_probe(&got, root);
        expect_same_topology("a node outside the mask, a node without CPUs", &got, &want);
        EXPECT(got.nodes >= 1 && got.node_id[got.nodes - 1] != 1 && got.node_id[got.nodes - 1] != 3,
               "nodes 1 (CPUs 1010-1023) and 3 (no CPUs) must be left out");
    }

    const kern_numa_t fallback = one_node_of_everything();
    static const struct {
        const char *name, *node0, *node1;
    } broken[] = {
        {"open_range", "0-\n", "1\n"},
        {"letters", "abc\n", "1\n"},
        {"backwards", "3-1\n", "1\n"},
        {"double_comma", "0,,1\n", "2\n"},
        {"past_cpu_setsize", "0-5000\n", "1\n"},
        {"two_lines", "0\n1\n", "2\n"},
        {"shared_cpu", "0-1\n", "1-2\n"},
        {"no_cpulist", "0\n", NULL},
    };
    for (size_t i = 0; i < sizeof broken / sizeof broken[0]; i++) {
        /* node1 is written without a cpulist when none is given */
        const fake_node_t nodes[] = {{0, broken[i].node0}, {1, broken[i].node1}};
        const char *root = make_tree(broken[i].name, nodes, 2);
        kern_numa_t got;
        kern_numa_probe(&got, root);
        char what[128];
        snprintf(what, sizeof what, "malformed tree '%s'", broken[i].name);
        expect_same_topology(what, &got, &fallback);
    }
    {
        char missing[sizeof g_tmp + 32];
        snprintf(missing, sizeof missing, "%s/no_such_dir", g_tmp);
        kern_numa_t got;
        kern_numa_probe(&got, missing);
        expect_same_topology("a missing directory", &got, &fallback);
        const char *empty = make_tree("no_nodes", NULL, 0);
        kern_numa_probe(&got, empty);
        expect_same_topology("a directory without nodes", &got, &fallback);
    }
}

/* ---- 2. pretend nodes ---- */

static void expect_pretend_split(const char *what, const kern_numa_t *t, int k) {
    EXPECT(t->nodes == k && t->pretend, "%s: %d nodes (pretend %d), expected %d pretend nodes", what,
           t->nodes, t->pretend, k);
    if (t->nodes != k) return;
    cpu_set_t all;
    CPU_ZERO(&all);
    int total = 0, least = CPU_SETSIZE, most = 0, last_cpu = -1;
    for (int n = 0; n < k; n++) {
        cpu_set_t shared;
        CPU_AND(&shared, &all, &t->cpus[n]);
        EXPECT(CPU_COUNT(&shared) == 0, "%s: node %d shares CPUs with an earlier node", what, n);
        CPU_OR(&all, &all, &t->cpus[n]);
        EXPECT(t->node_id[n] == -1, "%s: node %d has id %d, expected -1 (pretend)", what, n, t->node_id[n]);
        EXPECT(t->ncpus[n] == CPU_COUNT(&t->cpus[n]), "%s: node %d's ncpus %d != its %d CPUs", what, n,
               t->ncpus[n], CPU_COUNT(&t->cpus[n]));
        total += t->ncpus[n];
        least = t->ncpus[n] < least ? t->ncpus[n] : least;
        most = t->ncpus[n] > most ? t->ncpus[n] : most;
        /* consecutive: every CPU of node n comes after every CPU of node n-1 */
        for (int c = 0; c < CPU_SETSIZE; c++) {
            if (!CPU_ISSET(c, &t->cpus[n])) continue;
            EXPECT(c > last_cpu, "%s: CPU %d of node %d is not after node %d's CPUs", what, c, n, n - 1);
            last_cpu = c;
        }
    }
    EXPECT(CPU_EQUAL(&all, &g_allowed), "%s: the nodes' CPUs are not exactly the allowed CPUs", what);
    EXPECT(total == CPU_COUNT(&g_allowed), "%s: %d CPUs in all, expected %d", what, total, CPU_COUNT(&g_allowed));
    EXPECT(least >= 1 && most - least <= 1, "%s: nodes of %d to %d CPUs, expected sizes within one", what,
           least, most);
}

static void test_pretend(void) {
    const int allowed = CPU_COUNT(&g_allowed);
    const fake_node_t nodes[] = {{0, "0-1\n"}, {1, "2-3\n"}};
    const char *root = make_tree("pretend", nodes, 2);
    kern_numa_t sysfs_view;
    kern_numa_probe(&sysfs_view, root);
    char warned[1024];
    kern_numa_t t;

    setenv("MOETUNE_NUMA_NODES", "2", 1);
    probe_catching_stderr(&t, root, warned, sizeof warned);
    if (allowed >= 2) {
        expect_pretend_split("MOETUNE_NUMA_NODES=2", &t, 2);
        EXPECT(warned[0] == '\0', "MOETUNE_NUMA_NODES=2 is valid, yet probe warned: %s", warned);
    } else {
        printf("note: one allowed CPU: MOETUNE_NUMA_NODES=2 must be refused\n");
        expect_same_topology("MOETUNE_NUMA_NODES=2 on one CPU", &t, &sysfs_view);
        EXPECT(strstr(warned, "MOETUNE_NUMA_NODES") != NULL, "no warning for 2 nodes on one CPU: '%s'", warned);
    }

    setenv("MOETUNE_NUMA_NODES", "1", 1);
    kern_numa_probe(&t, root);
    expect_pretend_split("MOETUNE_NUMA_NODES=1", &t, 1);
    if (allowed <= KERN_NUMA_MAX_NODES) {
        char value[16];
        snprintf(value, sizeof value, "%d", allowed);
        setenv("MOETUNE_NUMA_NODES", value, 1);
        kern_numa_probe(&t, root);
        expect_pretend_split("MOETUNE_NUMA_NODES = the allowed CPUs", &t, allowed);
    }

    char too_many[16]; /* one node more than CPUs, where that is still <= 16 */
    snprintf(too_many, sizeof too_many, "%d", allowed + 1);
    const char *bad[] = {"0", "17", "x", "", "2x", "-1", allowed + 1 <= KERN_NUMA_MAX_NODES ? too_many : "99"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        setenv("MOETUNE_NUMA_NODES", bad[i], 1);
        probe_catching_stderr(&t, root, warned, sizeof warned);
        char what[64];
        snprintf(what, sizeof what, "MOETUNE_NUMA_NODES=\"%s\"", bad[i]);
        expect_same_topology(what, &t, &sysfs_view);
        EXPECT(strstr(warned, "MOETUNE_NUMA_NODES") && strstr(warned, "expected") && count_char(warned, '\n') == 1 &&
                   warned[strlen(warned) - 1] == '\n',
               "%s: expected one warning line naming the variable and what it expects, got '%s'", what, warned);
    }
    unsetenv("MOETUNE_NUMA_NODES");
}

/* ---- 3. placement ---- */

static void test_place(void) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t bytes = 4 * page;
    unsigned char *buf = aligned_alloc(page, bytes);
    if (!buf) die("aligned_alloc");
    for (size_t i = 0; i < bytes; i++) buf[i] = (unsigned char)(i * 7 + 3);

    kern_numa_t t;
    if (CPU_COUNT(&g_allowed) >= 2) {
        setenv("MOETUNE_NUMA_NODES", "2", 1);
        kern_numa_probe(&t, NULL);
        unsetenv("MOETUNE_NUMA_NODES");
        EXPECT(!kern_numa_place(&t, buf, bytes, 0) && !kern_numa_place(&t, buf, bytes, 1),
               "place must refuse pretend nodes");
    }
    const kern_numa_t one = one_node_of_everything();
    EXPECT(!kern_numa_place(&one, buf, bytes, 0), "place must refuse a one-node topology");

    /* Two real-looking nodes, both the kernel's node 0 (every Linux host has
     * one), so only the range decides. */
    kern_numa_t two = one;
    two.nodes = 2;
    two.node_id[0] = two.node_id[1] = 0;
    two.cpus[1] = two.cpus[0];
    two.ncpus[1] = two.ncpus[0];
    EXPECT(!kern_numa_place(&two, buf + 1, page, 0), "place must refuse a range holding no whole page");
    EXPECT(!kern_numa_place(&two, buf, 0, 0), "place must refuse an empty range");
    const bool placed = kern_numa_place(&two, buf + 1, bytes - 1, 1);
    printf("note: mbind of 3 whole pages to node 0 %s here\n",
           placed ? "succeeded" : "was refused (no NUMA or no permission)");
    bool intact = true;
    for (size_t i = 0; i < bytes; i++) intact &= buf[i] == (unsigned char)(i * 7 + 3);
    EXPECT(intact, "placement changed the memory's contents");
    free(buf);

    const kern_numa_t *host = kern_numa_host();
    EXPECT(host == kern_numa_host(), "kern_numa_host must return the same topology every time");
    EXPECT(host->nodes >= 1 && host->nodes <= KERN_NUMA_MAX_NODES && !host->pretend,
           "host topology: %d nodes (pretend %d), expected 1 to %d real nodes", host->nodes, host->pretend,
           KERN_NUMA_MAX_NODES);
    cpu_set_t all;
    CPU_ZERO(&all);
    for (int k = 0; k < host->nodes; k++) {
        cpu_set_t shared, outside;
        CPU_AND(&shared, &all, &host->cpus[k]);
        CPU_XOR(&outside, &host->cpus[k], &g_allowed);
        CPU_AND(&outside, &outside, &host->cpus[k]);
        EXPECT(host->ncpus[k] >= 1 && CPU_COUNT(&shared) == 0 && CPU_COUNT(&outside) == 0,
               "host node %d: expected allowed CPUs of its own, at least one", k);
        CPU_OR(&all, &all, &host->cpus[k]);
    }
    printf("note: this host: %d NUMA node(s) over %d allowed CPUs\n", host->nodes, CPU_COUNT(&g_allowed));
}

/* ---- 4. assignment ---- */

static void expect_assignment(const char *what, const size_t *bytes, int n, int nodes, const int *want) {
    int got[16];
    for (int i = 0; i < 16; i++) got[i] = -7;
    kern_numa_assign(bytes, n, nodes, got);
    for (int i = 0; i < n; i++)
        EXPECT(got[i] == want[i], "%s: item %d went to node %d, expected %d", what, i, got[i], want[i]);
    for (int i = n; i < 16; i++) EXPECT(got[i] == -7, "%s: wrote past item %d", what, n);
}

static void test_assign(void) {
    const size_t equal[] = {10, 10, 10, 10};
    expect_assignment("four equal, two nodes", equal, 4, 2, (const int[]){0, 1, 0, 1});
    const size_t big_first[] = {100, 1, 1, 1, 1};
    expect_assignment("one big then small", big_first, 5, 2, (const int[]){0, 1, 1, 1, 1});
    const size_t mixed[] = {5, 3, 3, 2};
    expect_assignment("5,3,3,2 on two nodes", mixed, 4, 2, (const int[]){0, 1, 1, 0});
    const size_t three[] = {4, 4, 1, 1, 2, 9};
    /* loads after each: (4,0,0) (4,4,0) (4,4,1) (4,4,2) (4,4,4) (13,4,4) */
    expect_assignment("three nodes", three, 6, 3, (const int[]){0, 1, 2, 2, 2, 0});
    expect_assignment("one node", three, 6, 1, (const int[]){0, 0, 0, 0, 0, 0});
    const size_t zeros[] = {0, 0, 0};
    expect_assignment("empty items tie on node 0", zeros, 3, 3, (const int[]){0, 0, 0});
    expect_assignment("no items", NULL, 0, 2, NULL);

    /* Many items: the rule, step by step, and the balance it gives (the
     * nodes' loads end within the largest item of each other). */
    enum { N = 1000, NODES = 4 };
    static size_t sizes[N];
    static int first[N], second[N];
    uint64_t s = 0x9e3779b97f4a7c15u;
    size_t largest = 0;
    for (int i = 0; i < N; i++) {
        s ^= s << 13, s ^= s >> 7, s ^= s << 17;
        sizes[i] = (size_t)(s % 100000) + 1;
        largest = sizes[i] > largest ? sizes[i] : largest;
    }
    kern_numa_assign(sizes, N, NODES, first);
    kern_numa_assign(sizes, N, NODES, second);
    EXPECT(memcmp(first, second, sizeof first) == 0, "assign must give the same nodes on the same input");
    size_t load[NODES] = {0};
    bool rule_held = true;
    for (int i = 0; i < N; i++) {
        int least = 0;
        for (int k = 1; k < NODES; k++)
            if (load[k] < load[least]) least = k;
        rule_held &= first[i] == least;
        load[first[i] >= 0 && first[i] < NODES ? first[i] : 0] += sizes[i];
    }
    EXPECT(rule_held, "some item did not go to the least-loaded node (lowest on ties)");
    size_t lo = load[0], hi = load[0];
    for (int k = 1; k < NODES; k++) {
        if (load[k] < lo) lo = load[k];
        if (load[k] > hi) hi = load[k];
    }
    EXPECT(hi - lo <= largest, "loads %zu to %zu differ by more than the largest item %zu", lo, hi, largest);
}

/* ---- 5. teams ---- */

enum { COVER_TASKS = 1000 };

typedef struct {
    const kern_numa_t *t;
    kern_numa_team_t *team;
    atomic_int arrived;                      /* runners inside fn this run */
    int calls[KERN_NUMA_MAX_NODES];          /* written by node k's runner only */
    bool met[KERN_NUMA_MAX_NODES];           /* node k's runner saw all runners inside at once */
    bool runner_pinned[KERN_NUMA_MAX_NODES]; /* its mask is the node's CPUs */
    bool right_pool[KERN_NUMA_MAX_NODES];
    int pool_size[KERN_NUMA_MAX_NODES];
    /* per node, filled by its pool's threads */
    atomic_int meet_arrived[KERN_NUMA_MAX_NODES];
    atomic_int meet_strays[KERN_NUMA_MAX_NODES]; /* tasks on a thread not on the node's CPUs */
    atomic_int meet_timeouts[KERN_NUMA_MAX_NODES];
    atomic_int hits[KERN_NUMA_MAX_NODES][COVER_TASKS];
} team_probe_t;

typedef struct {
    team_probe_t *probe;
    int node;
} node_job_t;

/* One task per pool thread, each waiting until all have started: the tasks
 * then run on distinct threads, so every worker's mask is seen. */
static void meet_task(void *arg, size_t task) {
    (void)task;
    const node_job_t *j = arg;
    team_probe_t *p = j->probe;
    const cpu_set_t mask = mask_of_self();
    if (!CPU_EQUAL(&mask, &p->t->cpus[j->node])) atomic_fetch_add(&p->meet_strays[j->node], 1);
    atomic_fetch_add(&p->meet_arrived[j->node], 1);
    if (!wait_for_count(&p->meet_arrived[j->node], p->pool_size[j->node]))
        atomic_fetch_add(&p->meet_timeouts[j->node], 1);
}

static void cover_task(void *arg, size_t task) {
    const node_job_t *j = arg;
    atomic_fetch_add(&j->probe->hits[j->node][task], 1);
}

static void on_node(void *arg, int node, kern_threadpool_t *pool) {
    team_probe_t *p = arg;
    p->calls[node]++;
    const cpu_set_t mask = mask_of_self();
    p->runner_pinned[node] = CPU_EQUAL(&mask, &p->t->cpus[node]);
    p->right_pool[node] = pool == kern_numa_team_pool(p->team, node);
    p->pool_size[node] = kern_threadpool_size(pool);
    /* Runs one after another would never all be inside at once. */
    atomic_fetch_add(&p->arrived, 1);
    p->met[node] = wait_for_count(&p->arrived, p->t->nodes);

    node_job_t job = {p, node};
    atomic_store(&p->meet_arrived[node], 0);
    kern_threadpool_parallel_for(pool, (size_t)p->pool_size[node], meet_task, &job);
    kern_threadpool_parallel_for(pool, COVER_TASKS, cover_task, &job);
}

static void check_team(const char *what, const kern_numa_t *t, int threads_per_node) {
    kern_numa_team_t *team = kern_numa_team_create(t, threads_per_node);
    EXPECT(kern_numa_team_nodes(team) == t->nodes, "%s: team of %d nodes, expected %d", what,
           kern_numa_team_nodes(team), t->nodes);
    team_probe_t *p = calloc(1, sizeof *p);
    if (!p) die("calloc");
    p->t = t;
    p->team = team;
    for (int run = 1; run <= 2; run++) {
        atomic_store(&p->arrived, 0);
        kern_numa_team_run(team, on_node, p);
        for (int k = 0; k < t->nodes; k++) {
            const int want_size = threads_per_node > 0 ? threads_per_node : t->ncpus[k];
            EXPECT(p->calls[k] == run, "%s: run %d: node %d's fn called %d times in all, expected %d", what, run,
                   k, p->calls[k], run);
            EXPECT(p->met[k], "%s: run %d: node %d's runner never saw all %d runners inside fn at once", what, run,
                   k, t->nodes);
            EXPECT(p->runner_pinned[k], "%s: run %d: node %d's runner is not pinned to the node's CPUs", what, run,
                   k);
            EXPECT(p->right_pool[k], "%s: node %d's fn got a pool other than kern_numa_team_pool's", what, k);
            EXPECT(p->pool_size[k] == want_size, "%s: node %d's pool has %d threads, expected %d", what, k,
                   p->pool_size[k], want_size);
            EXPECT(atomic_load(&p->meet_timeouts[k]) == 0,
                   "%s: node %d's %d pool threads never all took a task at once", what, k, p->pool_size[k]);
            EXPECT(atomic_load(&p->meet_strays[k]) == 0,
                   "%s: %d task(s) of node %d ran on a thread not pinned to its CPUs (workers must inherit)",
                   what, atomic_load(&p->meet_strays[k]), k);
            int wrong = 0;
            for (int i = 0; i < COVER_TASKS; i++) wrong += atomic_load(&p->hits[k][i]) != run;
            EXPECT(wrong == 0, "%s: run %d: %d of node %d's tasks did not run exactly once", what, run, wrong, k);
        }
    }
    free(p);
    kern_numa_team_destroy(team);
}

/* Two threads running the same team: runs take turns, none lost. */
enum { RUNS_PER_CALLER = 20 };

typedef struct {
    kern_numa_team_t *team;
    int nodes;
    atomic_int inside;  /* runners inside fn now */
    atomic_int overlaps;
    atomic_int calls[KERN_NUMA_MAX_NODES];
} turns_t;

static void count_turn(void *arg, int node, kern_threadpool_t *pool) {
    (void)pool;
    turns_t *t = arg;
    if (atomic_fetch_add(&t->inside, 1) + 1 > t->nodes) atomic_fetch_add(&t->overlaps, 1);
    const struct timespec nap = {0, 500 * 1000};
    nanosleep(&nap, NULL);
    atomic_fetch_add(&t->calls[node], 1);
    atomic_fetch_sub(&t->inside, 1);
}

static void *caller_main(void *arg) {
    turns_t *t = arg;
    for (int i = 0; i < RUNS_PER_CALLER; i++) kern_numa_team_run(t->team, count_turn, t);
    return NULL;
}

static void test_team(void) {
    kern_numa_t two;
    if (CPU_COUNT(&g_allowed) >= 2) {
        setenv("MOETUNE_NUMA_NODES", "2", 1);
        kern_numa_probe(&two, NULL);
        unsetenv("MOETUNE_NUMA_NODES");
        EXPECT(two.nodes == 2, "MOETUNE_NUMA_NODES=2 gave %d nodes", two.nodes);
    } else {
        printf("note: one allowed CPU: the team is tested on one node only\n");
        two = one_node_of_everything();
    }
    check_team("pretend nodes, a thread per CPU", &two, 0);
    check_team("pretend nodes, 3 threads each", &two, 3);
    const kern_numa_t one = one_node_of_everything();
    check_team("one node, 2 threads", &one, 2);

    turns_t turns = {.team = kern_numa_team_create(&two, 1), .nodes = two.nodes};
    pthread_t callers[2];
    for (int i = 0; i < 2; i++)
        if (pthread_create(&callers[i], NULL, caller_main, &turns) != 0) die("pthread_create");
    for (int i = 0; i < 2; i++) pthread_join(callers[i], NULL);
    EXPECT(atomic_load(&turns.overlaps) == 0, "runs from two callers overlapped %d time(s)",
           atomic_load(&turns.overlaps));
    for (int k = 0; k < two.nodes; k++)
        EXPECT(atomic_load(&turns.calls[k]) == 2 * RUNS_PER_CALLER, "node %d ran %d times, expected %d", k,
               atomic_load(&turns.calls[k]), 2 * RUNS_PER_CALLER);
    kern_numa_team_destroy(turns.team);
    kern_numa_team_destroy(NULL);
}

int main(void) {
    /* The test sets the variable itself where it means to. */
    unsetenv("MOETUNE_NUMA_NODES");
    if (sched_getaffinity(0, sizeof g_allowed, &g_allowed) != 0) die("sched_getaffinity");
    const char *base = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/numa_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(g_tmp)) die(g_tmp);
    printf("allowed CPUs: %d\n", CPU_COUNT(&g_allowed));

    test_probe_sysfs();
    test_pretend();
    test_place();
    test_assign();
    test_team();
    if (g_failures) {
        fprintf(stderr, "%d check(s) failed\n", g_failures);
        return 1;
    }
    printf("all NUMA checks passed\n");
    return 0;
}
