/* `moetune bench nvme` (see nvme_bench.h).  The raw file lives beside the
 * store's run directory and is removed at the end; the store removes its
 * own.  Rates are bytes moved over wall time (GB/s = 1e9 B/s). */
#include "tools/bench/nvme_bench.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "base/clock.h"
#include "base/status.h"
#include "store/sio_rate.h"
#include "store/store.h"
#include "tools/build_info.h"

enum {
    RAW_REQ = MT_SIO_RATE_REQ,
    BLOCK_TENSORS = 16,
    MAX_TENSOR = (6 << 20) + 1024, /* tensor_bytes' largest */
    PIPE = 3,                      /* batches in flight in the pipelined passes */
    PASSES = 7,
};

typedef struct {
    const char *dir;
    double gib;
    int qd;
    mt_sio_kind_t io;
} bench_opts_t;

/* Tensor i's length: 1.5, 3, 4 or 6 MiB plus an odd tail, as expert
 * matrices of a few shapes are. */
static uint64_t tensor_bytes(int i) {
    static const uint64_t mib15[4] = {3, 6, 8, 12}; /* in half MiB */
    return mib15[i % 4] * (512u << 10) + 4u * (uint64_t)(i % 7) * 37u;
}

/* Passes 0-3 run one batch at a time (as mt_store_write / mt_store_read);
 * 4-6 keep PIPE batches in flight, as the host optimizer's prefetch and
 * write-back do. */
enum { P_FIRST, P_REWRITE, P_READ, P_RECORDED, P_PIPE_REWRITE, P_PIPE_READ, P_PIPE_RECORDED };

typedef struct {
    double rate[PASSES]; /* GB/s */
    const char *io;
} store_rates_t;

/* The recorded order of a block's n tensors: a fixed shuffle (Fisher-Yates
 * over a linear congruential sequence seeded by the block). */
static void recorded_order(int *idx, int lo, int n, int b) {
    for (int k = 0; k < n; k++) idx[k] = lo + k;
    uint32_t x = 2463534242u + (uint32_t)b;
    for (int k = n - 1; k > 0; k--) {
        x = x * 1664525u + 1013904223u;
        const int j = (int)((x >> 8) % (uint32_t)(k + 1));
        const int t = idx[k];
        idx[k] = idx[j];
        idx[j] = t;
    }
}

/* One pass over every block: the blocks in order (the recorded passes:
 * backward, each block's tensors shuffled), a batch per block, up to
 * `depth` batches in flight, each in its own buffer set.  Every ticket is
 * waited for, also after a failure; the first error is kept. */
static mt_status_t store_pass(mt_store_t *s, const int *ext, int nt, int pass, void *bufs[PIPE][BLOCK_TENSORS],
                              mt_error_t *err) {
    const bool write = pass == P_FIRST || pass == P_REWRITE || pass == P_PIPE_REWRITE;
    const bool recorded = pass == P_RECORDED || pass == P_PIPE_RECORDED;
    const int depth = pass >= P_PIPE_REWRITE ? PIPE : 1;
    const int nb = (nt + BLOCK_TENSORS - 1) / BLOCK_TENSORS;
    mt_store_ticket_t tk[PIPE] = {0};
    mt_status_t st = MT_OK;
    mt_error_t e2 = {0};
    for (int bi = 0; bi < nb && st == MT_OK; bi++) {
        const int slot = bi % depth;
        if (tk[slot]) st = mt_store_wait(s, tk[slot], err);
        tk[slot] = 0;
        if (st != MT_OK) break;
        const int b = recorded ? nb - 1 - bi : bi;
        const int lo = b * BLOCK_TENSORS, n = nt - lo < BLOCK_TENSORS ? nt - lo : BLOCK_TENSORS;
        int idx[BLOCK_TENSORS];
        if (recorded) recorded_order(idx, lo, n, b);
        else
            for (int k = 0; k < n; k++) idx[k] = lo + k;
        mt_store_op_t ops[BLOCK_TENSORS];
        for (int k = 0; k < n; k++) ops[k] = (mt_store_op_t){ext[idx[k]], bufs[slot][k]};
        st = write ? mt_store_submit_write(s, ops, n, &tk[slot], err) : mt_store_submit_read(s, ops, n, &tk[slot], err);
    }
    for (int k = 0; k < PIPE; k++) {
        if (!tk[k]) continue;
        const mt_status_t w = mt_store_wait(s, tk[k], st == MT_OK ? err : &e2); /* the first error is the one told */
        if (st == MT_OK) st = w;
    }
    return st;
}

static mt_status_t store_measure(const bench_opts_t *o, uint64_t bytes, store_rates_t *out, mt_error_t *err) {
    int nt = 0;
    uint64_t total = 0, planned = 0;
    while (total < bytes) {
        total += tensor_bytes(nt);
        planned += mt_store_span_bytes(tensor_bytes(nt++));
    }
    mt_store_t *s = NULL;
    mt_store_opts_t so = {.dir = o->dir, .planned_bytes = planned, .queue_depth = o->qd, .io = o->io};
    mt_status_t st = mt_store_open(&s, &so, err);
    if (st != MT_OK) return st;
    out->io = mt_store_io_name(s);
    int f = -1;
    int *ext = malloc((size_t)nt * sizeof *ext);
    MT_CHECK_ALLOC(ext, "the bench's extents");
    void *bufs[PIPE][BLOCK_TENSORS];
    for (int j = 0; j < PIPE; j++)
        for (int k = 0; k < BLOCK_TENSORS; k++) {
            bufs[j][k] = mt_sio_buffer_alloc(mt_store_buffer_bytes(MAX_TENSOR));
            MT_CHECK_ALLOC(bufs[j][k], "bench buffers");
            memset(bufs[j][k], 0x33 + k, mt_store_buffer_bytes(MAX_TENSOR));
        }
    st = mt_store_file_add(s, "bench.bin", &f, err);
    for (int i = 0; i < nt && st == MT_OK; i++) st = mt_store_reserve(s, f, tensor_bytes(i), &ext[i], err);
    /* the first write (into freshly allocated space), a rewrite (an
     * optimizer step's steady state), a read in order, a read in the
     * recorded order; the last three also with batches in flight */
    /* This disk's rate drifts within a run (a host-side write cache filling
     * and draining): each pass of a kind runs twice, the pipelined and the
     * one-at-a-time pass in the order A B B A, and its rate is over both. */
    static const int order[] = {P_FIRST,
                                P_PIPE_REWRITE,  P_REWRITE,   P_REWRITE,   P_PIPE_REWRITE,
                                P_PIPE_READ,     P_READ,      P_READ,      P_PIPE_READ,
                                P_PIPE_RECORDED, P_RECORDED,  P_RECORDED,  P_PIPE_RECORDED};
    double secs[PASSES] = {0};
    int runs[PASSES] = {0};
    for (size_t at = 0; at < sizeof order / sizeof order[0] && st == MT_OK; at++) {
        const double t0 = mt_now_s();
        st = store_pass(s, ext, nt, order[at], bufs, err);
        secs[order[at]] += mt_now_s() - t0;
        runs[order[at]]++;
    }
    for (int p = 0; p < PASSES; p++) out->rate[p] = runs[p] ? (double)total * runs[p] / secs[p] / 1e9 : 0;
    for (int j = 0; j < PIPE; j++)
        for (int k = 0; k < BLOCK_TENSORS; k++) mt_sio_buffer_free(bufs[j][k]);
    free(ext);
    mt_store_close(s);
    return st;
}

/* The directory's filesystem and block device, as far as /sys tells. */
static void describe_disk(const char *dir, char *buf, size_t cap) {
    struct stat st;
    struct statfs fs;
    if (stat(dir, &st) != 0 || statfs(dir, &fs) != 0) {
        snprintf(buf, cap, "unknown");
        return;
    }
    const char *type = fs.f_type == 0xEF53 ? "ext4" : fs.f_type == 0x58465342 ? "xfs" : fs.f_type == 0x9123683E ? "btrfs"
                       : fs.f_type == 0x01021994 ? "tmpfs" : "other";
    char path[128], name[64] = "?", model[128] = "";
    snprintf(path, sizeof path, "/sys/dev/block/%u:%u/uevent", major(st.st_dev), minor(st.st_dev));
    FILE *f = fopen(path, "r");
    char line[256];
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, "DEVNAME=", 8) == 0) snprintf(name, sizeof name, "%.*s", (int)strcspn(line + 8, "\n"), line + 8);
    if (f) fclose(f);
    snprintf(path, sizeof path, "/sys/dev/block/%u:%u/device/model", major(st.st_dev), minor(st.st_dev));
    f = fopen(path, "r");
    if (f && fgets(model, sizeof model, f)) model[strcspn(model, "\n")] = '\0';
    if (f) fclose(f);
    snprintf(buf, cap, "%s on /dev/%s%s%s", type, name, model[0] ? ", " : "", model);
}

static int parse(int argc, char **argv, bench_opts_t *o) {
    *o = (bench_opts_t){.gib = 1, .qd = 16, .io = MT_SIO_AUTO};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v) return 0;
        if (strcmp(a, "--dir") == 0) o->dir = v;
        else if (strcmp(a, "--gib") == 0) o->gib = atof(v);
        else if (strcmp(a, "--qd") == 0) o->qd = atoi(v);
        else if (strcmp(a, "--io") == 0 && strcmp(v, "auto") == 0) o->io = MT_SIO_AUTO;
        else if (strcmp(a, "--io") == 0 && strcmp(v, "uring") == 0) o->io = MT_SIO_URING;
        else if (strcmp(a, "--io") == 0 && strcmp(v, "psync") == 0) o->io = MT_SIO_PSYNC;
        else return 0;
        i++;
    }
    return o->dir && o->gib > 0 && o->gib <= 4096 && o->qd >= 1 && o->qd <= 256;
}

int mt_bench_nvme_main(int argc, char **argv) {
    bench_opts_t o;
    if (!parse(argc, argv, &o)) {
        fprintf(stderr, "usage: moetune bench nvme --dir DIR [--gib N (0 < N <= 4096)] [--qd 1..256] "
                        "[--io auto|uring|psync]\n");
        return 2;
    }
    mt_build_info_print(stdout);
    char disk[256];
    describe_disk(o.dir, disk, sizeof disk);
    const uint64_t bytes = ((uint64_t)(o.gib * 1073741824.0) + RAW_REQ - 1) / RAW_REQ * RAW_REQ;
    printf("nvme bench: %s (%s), %.3f GiB, 1 MiB raw requests, queue depth 1 and %d\n", o.dir, disk,
           bytes / 1073741824.0, o.qd);
    mt_error_t err = {0};
    mt_sio_rates_t raw = {0};
    store_rates_t sto = {0};
    mt_status_t st = mt_sio_measure_dir(o.dir, bytes, o.qd, o.io, &raw, &err);
    if (st == MT_OK) st = store_measure(&o, bytes, &sto, &err);
    if (st != MT_OK) {
        fprintf(stderr, "moetune: error: %s\n", err.msg);
        return 1;
    }
    const double wq = raw.write_q / 1e9, rq = raw.read_q / 1e9; /* GB/s, as the store's rates */
    const double *r = sto.rate;
    printf("raw O_DIRECT     write qd1 %7.3f GB/s   qd%-3d %7.3f GB/s\n", raw.write_1 / 1e9, o.qd, wq);
    printf("raw O_DIRECT     read  qd1 %7.3f GB/s   qd%-3d %7.3f GB/s\n", raw.read_1 / 1e9, o.qd, rq);
    printf("store (%s, tensors of 1.5-6 MiB, %d per batch, CRC32C checked):\n", sto.io, BLOCK_TENSORS);
    printf("  first write             %7.3f GB/s\n", r[P_FIRST]);
    double low[2] = {1e30, 1e30}; /* one batch at a time, PIPE in flight */
    static const char *names[3] = {"rewrite               ", "read in order         ", "read in recorded order"};
    for (int pipe = 0; pipe < 2; pipe++) {
        if (pipe) printf("store, %d batches in flight (submit/wait, as prefetch and write-back run):\n", PIPE);
        for (int k = 0; k < 3; k++) {
            const double v = r[(pipe ? P_PIPE_REWRITE : P_REWRITE) + k], ratio = v / (k == 0 ? wq : rq);
            printf("  %s  %7.3f GB/s   store/raw %.2f\n", names[k], v, ratio);
            if (ratio < low[pipe]) low[pipe] = ratio;
        }
    }
    printf("lowest store/raw ratio %.2f (goal >= 0.80)\n", low[0]);
    printf("lowest store/raw ratio with %d batches in flight %.2f (goal >= 0.80)\n", PIPE, low[1]);
    return 0;
}
