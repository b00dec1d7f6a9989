/* TCP underneath kernels/comm_ranks.h for torchrun-style launches (see
 * comm_tcp.h), and the transport entry through which comm_ranks.c reaches
 * it: registered when this library is linked (kernels/ranks_registry.h).
 *
 * The wire: after the handshake every collective is one message from each
 * rank to rank 0 and one back, each prefixed with a header (a sequence
 * number and the byte count) so that ranks making different calls are
 * caught instead of reading each other's bytes as data.  Every process is
 * the same binary on the same kind of machine, so integers travel in host
 * order. */
#include "kernels/cpu/comm_tcp.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "kernels/ranks_registry.h"

enum {
    HOST_CHARS = 64,
    RUN_ID_CHARS = 64,
    REASON_CHARS = 256,
    DEFAULT_TIMEOUT_S = 300,
    /* a connection that sends no hello within this is not a moetune rank */
    HELLO_TIMEOUT_MS = 10000,
    RETRY_MS = 200,
};

static const char HELLO_MAGIC[8] = {'m', 'o', 'e', 't', 'u', 'n', 'e', '1'};

/* What a rank tells rank 0 when it connects. */
typedef struct {
    char magic[8];
    int32_t rank, size;
    char host[HOST_CHARS];
    char run_id[RUN_ID_CHARS]; /* TORCHELASTIC_RUN_ID: one launch's ranks share it */
} hello_t;

/* Rank 0's answer. */
typedef struct {
    int32_t accepted;
    int32_t local_rank; /* among the ranks on the same host */
    char reason[REASON_CHARS];
} welcome_t;

/* Precedes every collective's message. */
typedef struct {
    uint64_t seq;
    uint64_t bytes;
} frame_t;

struct kern_tcp {
    int rank, size;
    int *peer;     /* rank 0: peer[r] the connection to rank r (peer[0] unused); others: peer[0] */
    uint64_t seq;  /* collectives so far */
};

static const char *env(const char *name) {
    const char *v = getenv(name);
    return v && v[0] ? v : NULL;
}

static bool parse_int(const char *s, long lo, long hi, long *out) {
    char *end = NULL;
    errno = 0;
    const long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static mt_status_t not_set(const char *name, mt_error_t *err) {
    return mt_error_set(err, MT_ERR_CONFIG,
                        "%s is not set: a torchrun-style launch (WORLD_SIZE=%s) gives every process RANK, "
                        "WORLD_SIZE, MASTER_ADDR and MASTER_PORT (or start moetune with mpirun, or unset "
                        "WORLD_SIZE for one process)",
                        name, env("WORLD_SIZE") ? env("WORLD_SIZE") : "?");
}

static mt_status_t int_env(const char *name, long lo, long hi, long dflt, bool required, long *out,
                           mt_error_t *err) {
    const char *v = env(name);
    if (!v) {
        if (required) return not_set(name, err);
        *out = dflt;
        return MT_OK;
    }
    if (!parse_int(v, lo, hi, out))
        return mt_error_set(err, MT_ERR_CONFIG, "%s=%s: expected an integer from %ld to %ld", name, v, lo, hi);
    return MT_OK;
}

bool kern_tcp_launched(void) {
    const char *v = env("WORLD_SIZE");
    long ws = 0;
    /* a malformed WORLD_SIZE counts as a launch, so that kern_tcp_init names it */
    return v && (!parse_int(v, 1, 1 << 16, &ws) || ws > 1);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* All of buf, or false when the peer closed the connection or failed. */
static bool send_all(int fd, const void *buf, size_t n) {
    const char *p = buf;
    while (n > 0) {
        const ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

static bool recv_all(int fd, void *buf, size_t n) {
    char *p = buf;
    while (n > 0) {
        const ssize_t k = recv(fd, p, n, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k;
        n -= (size_t)k;
    }
    return true;
}

/* Waits up to ms for fd to be readable; false on timeout. */
static bool wait_readable(int fd, int ms) {
    struct pollfd p = {.fd = fd, .events = POLLIN};
    for (;;) {
        const int k = poll(&p, 1, ms);
        if (k < 0 && errno == EINTR) continue;
        return k > 0;
    }
}

static void no_delay(int fd) {
    const int one = 1;
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A failure of the job's connections: the other end stopped (its own error
 * is on its stderr) or the network failed.  Ends this process: the ranks
 * still waiting on it read the end of its streams and stop in turn. */
_Noreturn static void lost(const kern_tcp_t *t, int other, const char *what) {
    fprintf(stderr, "moetune: rank %d of %d: error: lost the connection to rank %d %s: that rank stopped "
            "(see its output) or the network failed; ending this rank too\n",
            t->rank, t->size, other, what);
    fflush(stderr);
    _exit(1);
}

_Noreturn static void mismatch(const kern_tcp_t *t, int other, const frame_t *mine, const frame_t *theirs) {
    fprintf(stderr, "moetune: rank %d of %d: error: rank %d made a different collective call (its call %llu "
            "with %llu bytes, this rank's call %llu with %llu bytes): the ranks run different configs or "
            "binaries; ending the job\n",
            t->rank, t->size, other, (unsigned long long)theirs->seq, (unsigned long long)theirs->bytes,
            (unsigned long long)mine->seq, (unsigned long long)mine->bytes);
    fflush(stderr);
    _exit(1);
}

/* Where a connection goes, for messages: "MASTER_ADDR=a MASTER_PORT=p"
 * or rank 0's address as torchrun's store gave it. */
typedef struct {
    char host[256], port[16];
    char what[400];
} endpoint_t;

static mt_status_t resolve(const char *host, const char *port, int family, bool passive, struct addrinfo **out,
                           const char *what, mt_error_t *err) {
    struct addrinfo hints = {.ai_family = family, .ai_socktype = SOCK_STREAM};
    if (passive) hints.ai_flags = AI_PASSIVE;
    const int rc = getaddrinfo(host, port, &hints, out);
    if (rc != 0)
        return mt_error_set(err, MT_ERR_CONFIG, "%s: cannot resolve the address: %s", what, gai_strerror(rc));
    return MT_OK;
}

/* On every interface of `family` (AF_UNSPEC: any), as torchrun's store
 * does: MASTER_ADDR is how the other ranks reach rank 0, and the name may
 * resolve here to a loopback address (Debian maps the host name to
 * 127.0.1.1) that they cannot reach.  Port "0": one the system picks. */
static mt_status_t listen_on(const char *port, int family, const char *what, int *fd_out, mt_error_t *err) {
    struct addrinfo *ai = NULL;
    mt_status_t st = resolve(NULL, port, family, true, &ai, what, err);
    if (st != MT_OK) return st;
    int fd = -1, last_errno = 0;
    for (const struct addrinfo *a = ai; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            last_errno = errno;
            continue;
        }
        const int one = 1;
        (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 64) != 0) {
            last_errno = errno;
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(ai);
    if (fd < 0)
        return mt_error_set(err, MT_ERR_CONFIG, "rank 0 cannot listen on %s: %s%s", what, strerror(last_errno),
                            last_errno == EADDRINUSE ? " (another job or program uses that port: give this "
                                                       "job another MASTER_PORT)"
                                                     : "");
    *fd_out = fd;
    return MT_OK;
}

/* Connects to `to`, retrying while nobody listens there yet. */
static mt_status_t connect_to(const endpoint_t *to, double deadline, int timeout_s, int rank, int *fd_out,
                              mt_error_t *err) {
    int last_errno = 0;
    for (;;) {
        struct addrinfo *ai = NULL;
        mt_status_t st = resolve(to->host, to->port, AF_UNSPEC, false, &ai, to->what, err);
        if (st != MT_OK) return st;
        for (const struct addrinfo *a = ai; a; a = a->ai_next) {
            const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
            if (fd < 0) {
                last_errno = errno;
                continue;
            }
            if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
                freeaddrinfo(ai);
                *fd_out = fd;
                return MT_OK;
            }
            last_errno = errno;
            close(fd);
        }
        freeaddrinfo(ai);
        if (now_s() >= deadline)
            return mt_error_set(err, MT_ERR_DEVICE,
                                "rank %d could not reach %s within %d s (%s): is it running, with the same "
                                "MASTER_ADDR and MASTER_PORT? (MOETUNE_RENDEZVOUS_TIMEOUT_S sets the wait)",
                                rank, to->what, timeout_s, strerror(last_errno));
        usleep(RETRY_MS * 1000);
    }
}


static void run_id(char out[RUN_ID_CHARS]) {
    memset(out, 0, RUN_ID_CHARS);
    const char *id = env("TORCHELASTIC_RUN_ID");
    if (id) snprintf(out, RUN_ID_CHARS, "%s", id);
}

/* torchrun (PyTorch 2.4 and later) runs an agent per node, and node 0's
 * agent already listens on MASTER_PORT with PyTorch's TCPStore; it says so
 * with TORCHELASTIC_USE_AGENT_STORE=True.  Then rank 0 listens on a port
 * the system picks and publishes its address in that store, and the other
 * ranks read it there.  Four store commands, in PyTorch's wire format (a
 * command byte; integers in host order; strings and values as a u64 length
 * and the bytes): VALIDATE with its magic number, SET, WAIT until a key
 * exists (answered by one byte, 0), GET (answered by a value). */
enum { STORE_VALIDATE = 0, STORE_SET = 1, STORE_GET = 3, STORE_WAIT = 6 };
static const uint32_t STORE_MAGIC = 0x3C85F7CEu;
enum { STORE_VALUE_MAX = 300 };

static bool agent_store(void) {
    const char *v = env("TORCHELASTIC_USE_AGENT_STORE");
    return v && strcmp(v, "True") == 0;
}

/* One command in one send: the store treats a connection's first bytes
 * specially (they must be VALIDATE), and a VALIDATE that arrives split
 * over two reads makes it close the connection. */
static bool store_send(int fd, uint8_t cmd, const char *key, const char *value) {
    char buf[1 + 3 * sizeof(uint64_t) + 2 * STORE_VALUE_MAX];
    size_t n = 0;
    buf[n++] = (char)cmd;
    if (cmd == STORE_VALIDATE) {
        memcpy(buf + n, &STORE_MAGIC, sizeof STORE_MAGIC);
        return send_all(fd, buf, n + sizeof STORE_MAGIC);
    }
    if (cmd == STORE_WAIT) {
        const uint64_t keys = 1;
        memcpy(buf + n, &keys, sizeof keys);
        n += sizeof keys;
    }
    const char *parts[2] = {key, value};
    for (int i = 0; i < 2 && parts[i]; i++) {
        const uint64_t len = strlen(parts[i]);
        MT_CHECK(len < STORE_VALUE_MAX, "store_send: %llu bytes (at most %d)", (unsigned long long)len,
                 STORE_VALUE_MAX - 1);
        memcpy(buf + n, &len, sizeof len);
        memcpy(buf + n + sizeof len, parts[i], len);
        n += sizeof len + len;
    }
    return send_all(fd, buf, n);
}

/* The key rank 0 publishes under: one per launch and restart, so a
 * restarted group never reads an address of the group before it. */
static void store_key(char *key, size_t cap) {
    char id[RUN_ID_CHARS];
    run_id(id);
    const char *restarts = env("TORCHELASTIC_RESTART_COUNT");
    snprintf(key, cap, "moetune/rendezvous/%s/%s", id, restarts ? restarts : "0");
}

static mt_status_t store_open(const endpoint_t *store, double deadline, int timeout_s, int rank, int *fd,
                              mt_error_t *err) {
    mt_status_t st = connect_to(store, deadline, timeout_s, rank, fd, err);
    if (st != MT_OK) return st;
    if (!store_send(*fd, STORE_VALIDATE, NULL, NULL)) {
        close(*fd);
        return mt_error_set(err, MT_ERR_DEVICE, "rank %d: %s closed the connection (%s)", rank, store->what,
                            strerror(errno));
    }
    return MT_OK;
}

/* Rank 0 under torchrun's agent store: listens on a port the system picks,
 * on the address family and interface that reach the store, and publishes
 * "host port" there. */
static mt_status_t listen_published(const endpoint_t *store, double deadline, int timeout_s, int *listen_fd,
                                    mt_error_t *err) {
    int fd = -1;
    mt_status_t st = store_open(store, deadline, timeout_s, 0, &fd, err);
    if (st != MT_OK) return st;
    struct sockaddr_storage here;
    socklen_t len = sizeof here;
    char host[128] = "", value[STORE_VALUE_MAX], key[200]; /* a numeric address: at most 46 characters and a scope */
    if (getsockname(fd, (struct sockaddr *)&here, &len) != 0 ||
        getnameinfo((struct sockaddr *)&here, len, host, sizeof host, NULL, 0, NI_NUMERICHOST) != 0)
        st = mt_error_set(err, MT_ERR_DEVICE, "rank 0: cannot tell its own address on the connection to %s: %s",
                          store->what, strerror(errno));
    if (st == MT_OK) st = listen_on("0", here.ss_family, "a port the system picks", listen_fd, err);
    if (st == MT_OK) {
        len = sizeof here;
        char port[16] = "";
        if (getsockname(*listen_fd, (struct sockaddr *)&here, &len) != 0 ||
            getnameinfo((struct sockaddr *)&here, len, NULL, 0, port, sizeof port, NI_NUMERICSERV) != 0) {
            st = mt_error_set(err, MT_ERR_DEVICE, "rank 0: cannot tell the port it listens on: %s", strerror(errno));
        } else {
            snprintf(value, sizeof value, "%s %s", host, port);
            store_key(key, sizeof key);
            if (!store_send(fd, STORE_SET, key, value))
                st = mt_error_set(err, MT_ERR_DEVICE, "rank 0: %s closed the connection (%s)", store->what,
                                  strerror(errno));
        }
        if (st != MT_OK) close(*listen_fd);
    }
    close(fd);
    return st;
}

/* Any other rank under torchrun's agent store: rank 0's address, waiting
 * until rank 0 has published it. */
static mt_status_t store_lookup(const endpoint_t *store, double deadline, int timeout_s, int rank,
                                endpoint_t *rank0, mt_error_t *err) {
    int fd = -1;
    mt_status_t st = store_open(store, deadline, timeout_s, rank, &fd, err);
    if (st != MT_OK) return st;
    char key[200], value[STORE_VALUE_MAX] = "";
    store_key(key, sizeof key);
    uint8_t waited = 1;
    uint64_t n = 0;
    const double left = deadline - now_s();
    if (!store_send(fd, STORE_WAIT, key, NULL) || !wait_readable(fd, left > 0 ? (int)(left * 1000) + 1 : 1) ||
        !recv_all(fd, &waited, 1) || waited != 0) {
        st = mt_error_set(err, MT_ERR_DEVICE,
                          "rank %d: rank 0 did not publish its address in %s within %d s (did rank 0 start? "
                          "MOETUNE_RENDEZVOUS_TIMEOUT_S sets the wait)",
                          rank, store->what, timeout_s);
    } else if (!store_send(fd, STORE_GET, key, NULL) || !recv_all(fd, &n, sizeof n) || n >= sizeof value ||
               !recv_all(fd, value, (size_t)n) ||
               sscanf(value, "%255s %15s", rank0->host, rank0->port) != 2) {
        st = mt_error_set(err, MT_ERR_DEVICE, "rank %d: %s gave no usable address for rank 0 under %s", rank,
                          store->what, key);
    } else {
        snprintf(rank0->what, sizeof rank0->what, "rank 0 at %s port %s (as torchrun's store gave it)",
                 rank0->host, rank0->port);
    }
    close(fd);
    return st;
}

static void host_name(char out[HOST_CHARS]) {
    memset(out, 0, HOST_CHARS);
    if (gethostname(out, HOST_CHARS - 1) != 0) snprintf(out, HOST_CHARS, "?");
}

/* Rank 0: accept until every rank has joined.  Connections that are not
 * moetune ranks are dropped; a rank from another launch, a second claim to
 * a rank or a different WORLD_SIZE fails the job, since training with it
 * would be wrong and waiting for the right one might be forever. */
static mt_status_t gather_ranks(kern_tcp_t *t, int listen_fd, double deadline, int timeout_s, mt_error_t *err) {
    hello_t *hello = calloc((size_t)t->size, sizeof *hello);
    MT_CHECK_ALLOC(hello, "rendezvous");
    host_name(hello[0].host);
    run_id(hello[0].run_id);
    int joined = 1;
    mt_status_t st = MT_OK;
    while (st == MT_OK && joined < t->size) {
        const double left = deadline - now_s();
        if (left <= 0 || !wait_readable(listen_fd, (int)(left * 1000) + 1)) {
            char missing[256] = "";
            size_t len = 0;
            for (int r = 1; r < t->size && len + 16 < sizeof missing; r++)
                if (t->peer[r] < 0) len += (size_t)snprintf(missing + len, sizeof missing - len, "%s%d",
                                                            len ? ", " : "", r);
            st = mt_error_set(err, MT_ERR_DEVICE,
                              "rank 0: %d of %d ranks joined within %d s; missing: rank %s (started with "
                              "WORLD_SIZE=%d and this MASTER_ADDR/MASTER_PORT?  "
                              "MOETUNE_RENDEZVOUS_TIMEOUT_S sets the wait)",
                              joined, t->size, timeout_s, missing, t->size);
            break;
        }
        const int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0) continue;
        hello_t h;
        if (!wait_readable(fd, HELLO_TIMEOUT_MS) || !recv_all(fd, &h, sizeof h) ||
            memcmp(h.magic, HELLO_MAGIC, sizeof HELLO_MAGIC) != 0) {
            close(fd); /* not a moetune rank */
            continue;
        }
        h.host[HOST_CHARS - 1] = h.run_id[RUN_ID_CHARS - 1] = '\0';
        welcome_t w = {0};
        if (h.size != t->size) {
            snprintf(w.reason, sizeof w.reason, "rank %d has WORLD_SIZE=%d, rank 0 has WORLD_SIZE=%d", h.rank,
                     h.size, t->size);
        } else if (strcmp(h.run_id, hello[0].run_id) != 0) {
            snprintf(w.reason, sizeof w.reason,
                     "rank %d is from another launch (TORCHELASTIC_RUN_ID '%s', rank 0's '%s'): two jobs share "
                     "MASTER_PORT",
                     h.rank, h.run_id, hello[0].run_id);
        } else if (h.rank < 1 || h.rank >= t->size || t->peer[h.rank] >= 0) {
            snprintf(w.reason, sizeof w.reason,
                     "two processes claim RANK=%d (of WORLD_SIZE=%d; one from host %s): two jobs share "
                     "MASTER_PORT, or RANK is set wrong",
                     h.rank, t->size, h.host);
        }
        if (w.reason[0]) {
            (void)send_all(fd, &w, sizeof w);
            close(fd);
            st = mt_error_set(err, MT_ERR_CONFIG, "rank 0: %s", w.reason);
            break;
        }
        no_delay(fd);
        t->peer[h.rank] = fd;
        hello[h.rank] = h;
        joined++;
    }
    for (int r = 1; r < t->size; r++) {
        if (t->peer[r] < 0) continue;
        welcome_t w = {.accepted = st == MT_OK};
        /* the local rank from the host names: the index among the ranks on r's host */
        for (int q = 0; q < r && st == MT_OK; q++) w.local_rank += strcmp(hello[q].host, hello[r].host) == 0;
        if (st != MT_OK) {
            const size_t n = strnlen(err->msg, sizeof w.reason - 1);
            memcpy(w.reason, err->msg, n); /* the start of the message: a welcome has a fixed size */
        }
        (void)send_all(t->peer[r], &w, sizeof w);
    }
    free(hello);
    return st;
}

mt_status_t kern_tcp_init(kern_tcp_t **out, int *rank, int *size, int *local_rank, mt_error_t *err) {
    *out = NULL;
    long world = 0, me = 0, timeout_s = 0, local = -1;
    mt_status_t st = int_env("WORLD_SIZE", 1, 1 << 16, 1, true, &world, err);
    if (st == MT_OK) st = int_env("RANK", 0, world - 1, 0, true, &me, err);
    if (st == MT_OK) st = int_env("LOCAL_RANK", 0, world - 1, -1, false, &local, err);
    if (st == MT_OK) st = int_env("MOETUNE_RENDEZVOUS_TIMEOUT_S", 1, 86400, DEFAULT_TIMEOUT_S, false, &timeout_s, err);
    if (st != MT_OK) return st;
    const char *addr = env("MASTER_ADDR"), *port = env("MASTER_PORT");
    if (!addr || !port) return not_set(!addr ? "MASTER_ADDR" : "MASTER_PORT", err);
    long port_no = 0;
    if (!parse_int(port, 1, 65535, &port_no))
        return mt_error_set(err, MT_ERR_CONFIG, "MASTER_PORT=%s: expected a TCP port from 1 to 65535", port);

    kern_tcp_t *t = calloc(1, sizeof *t);
    MT_CHECK_ALLOC(t, "ranks over TCP");
    t->rank = (int)me;
    t->size = (int)world;
    t->peer = malloc((size_t)world * sizeof *t->peer);
    MT_CHECK_ALLOC(t->peer, "ranks over TCP");
    for (long r = 0; r < world; r++) t->peer[r] = -1;
    const double deadline = now_s() + (double)timeout_s;

    endpoint_t master = {0};
    snprintf(master.host, sizeof master.host, "%s", addr);
    snprintf(master.port, sizeof master.port, "%s", port);
    const bool via_store = agent_store();
    snprintf(master.what, sizeof master.what, "%sMASTER_ADDR=%s MASTER_PORT=%s",
             via_store ? "torchrun's store at " : "", master.host, master.port);

    if (me == 0) {
        int listen_fd = -1;
        st = via_store ? listen_published(&master, deadline, (int)timeout_s, &listen_fd, err)
                       : listen_on(port, AF_UNSPEC, master.what, &listen_fd, err);
        if (st == MT_OK) {
            st = gather_ranks(t, listen_fd, deadline, (int)timeout_s, err);
            /* no later connection can join this job */
            close(listen_fd);
            *local_rank = local >= 0 ? (int)local : 0; /* the first rank on its host */
        }
    } else {
        int fd = -1;
        endpoint_t rank0 = master;
        if (via_store) st = store_lookup(&master, deadline, (int)timeout_s, (int)me, &rank0, err);
        if (st == MT_OK) st = connect_to(&rank0, deadline, (int)timeout_s, (int)me, &fd, err);
        if (st == MT_OK) {
            t->peer[0] = fd;
            no_delay(fd);
            hello_t h = {.rank = (int32_t)me, .size = (int32_t)world};
            memcpy(h.magic, HELLO_MAGIC, sizeof h.magic);
            host_name(h.host);
            run_id(h.run_id);
            welcome_t w;
            const double left = deadline - now_s();
            if (!send_all(fd, &h, sizeof h) || !wait_readable(fd, left > 0 ? (int)(left * 1000) + 1 : 1) ||
                !recv_all(fd, &w, sizeof w)) {
                st = mt_error_set(err, MT_ERR_DEVICE,
                                  "rank %ld: %s closed the connection or did not answer within %ld s while "
                                  "the ranks met",
                                  me, rank0.what, timeout_s);
            } else if (!w.accepted) {
                w.reason[REASON_CHARS - 1] = '\0';
                st = mt_error_set(err, MT_ERR_CONFIG, "rank %ld was refused by rank 0: %s", me, w.reason);
            } else {
                *local_rank = local >= 0 ? (int)local : w.local_rank;
            }
        }
    }
    if (st != MT_OK) {
        kern_tcp_destroy(t);
        return st;
    }
    *rank = t->rank;
    *size = t->size;
    *out = t;
    return MT_OK;
}

void kern_tcp_destroy(kern_tcp_t *t) {
    if (!t) return;
    for (int r = 0; r < t->size; r++)
        if (t->peer[r] >= 0) close(t->peer[r]);
    free(t->peer);
    free(t);
}

void kern_tcp_allgather(kern_tcp_t *t, const void *send, void *recv, size_t bytes) {
    const frame_t mine = {.seq = t->seq++, .bytes = bytes};
    char *all = recv;
    if (t->rank == 0) {
        memmove(all, send, bytes);
        /* in rank order: the star is the only order there is */
        for (int r = 1; r < t->size; r++) {
            frame_t theirs;
            if (!recv_all(t->peer[r], &theirs, sizeof theirs)) lost(t, r, "while gathering");
            if (theirs.seq != mine.seq || theirs.bytes != mine.bytes) mismatch(t, r, &mine, &theirs);
            if (!recv_all(t->peer[r], all + (size_t)r * bytes, bytes)) lost(t, r, "while gathering");
        }
        for (int r = 1; r < t->size; r++)
            if (!send_all(t->peer[r], &mine, sizeof mine) ||
                !send_all(t->peer[r], all, (size_t)t->size * bytes))
                lost(t, r, "while sending the gathered data");
        return;
    }
    if (!send_all(t->peer[0], &mine, sizeof mine) || !send_all(t->peer[0], send, bytes))
        lost(t, 0, "while gathering");
    frame_t back;
    if (!recv_all(t->peer[0], &back, sizeof back)) lost(t, 0, "while gathering");
    if (back.seq != mine.seq || back.bytes != mine.bytes) mismatch(t, 0, &mine, &back);
    if (!recv_all(t->peer[0], all, (size_t)t->size * bytes)) lost(t, 0, "while gathering");
}

void kern_tcp_barrier(kern_tcp_t *t) {
    char one = 0;
    char *all = malloc((size_t)t->size);
    MT_CHECK_ALLOC(all, "barrier");
    kern_tcp_allgather(t, &one, all, 1);
    free(all);
}

_Noreturn void kern_tcp_abort(kern_tcp_t *t, int code) {
    fflush(stdout);
    fflush(stderr);
    /* closing (by exiting) is the message: every peer's next read ends */
    (void)t;
    _exit(code);
}

/* ---- the transport entry (ranks_registry.h) -------------------------------- */

static mt_status_t tcp_init(void **state, int *rank, int *size, int *local_rank, mt_error_t *err) {
    kern_tcp_t *t = NULL;
    const mt_status_t st = kern_tcp_init(&t, rank, size, local_rank, err);
    if (st == MT_OK) *state = t;
    return st;
}

static void tcp_destroy(void *state) { kern_tcp_destroy(state); }

static void tcp_allgather(void *state, const void *send, void *recv, size_t bytes) {
    kern_tcp_allgather(state, send, recv, bytes);
}

static void tcp_barrier(void *state) { kern_tcp_barrier(state); }

static void tcp_abort(void *state, int code) { kern_tcp_abort(state, code); }

static const kern_ranks_transport_t k_tcp_transport = {
    .name = "tcp",
    .launcher = "a torchrun-style launch",
    .order = 1, /* after MPI: mpirun may also export torchrun-style variables */
    .launched = kern_tcp_launched,
    .init = tcp_init,
    .destroy = tcp_destroy,
    .allgather = tcp_allgather,
    .barrier = tcp_barrier,
    .abort = tcp_abort,
};

__attribute__((constructor)) static void register_tcp_transport(void) {
    kern_ranks_register_transport(&k_tcp_transport);
}
