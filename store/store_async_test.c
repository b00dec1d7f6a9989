/* The store's batches in the background, through io_uring and through
 * pread/pwrite, on the test's TMPDIR: the host optimizer's pattern (read
 * block b+1 and write block b-1 back while block b is updated) with the
 * data checked after every read; batches waited for out of order; a
 * flipped byte found by an async read while another batch is in flight,
 * naming the file and offset; a write past the file size limit (standing
 * in for a full disk: a short write, then EFBIG) reported by its wait while
 * the batches beside it succeed, every ticket waited for; refusals (a fifth
 * batch, an extent in flight, a ticket waited twice) that leave the
 * batches in flight intact; close with batches never waited for; reads
 * started before queued writes, a write passed by one read at most, and a
 * read of an extent whose write is queued refused (the I/O thread held
 * while the batches queue, the order read from its own count of events). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "store/store.h"
#include "store/store_testing.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
}

static void expect_ok(mt_status_t st, const mt_error_t *err, const char *what) {
    if (st != MT_OK) fprintf(stderr, "  message: %s\n", err->msg);
    expect(st == MT_OK, what);
}

static void expect_msg(mt_status_t st, const mt_error_t *err, const char *a, const char *b, const char *what) {
    const int ok = st != MT_OK && strstr(err->msg, a) && (!b || strstr(err->msg, b));
    if (!ok) fprintf(stderr, "  message: %s\n", st == MT_OK ? "(none: it succeeded)" : err->msg);
    expect(ok, what);
}

static char root[4096];

static void fill(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        p[i] = (unsigned char)(seed >> 16);
    }
}

/* Whether p holds what fill(seed) wrote. */
static int holds(const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1103515245u + 12345u;
        if (p[i] != (unsigned char)(seed >> 16)) return 0;
    }
    return 1;
}

static mt_store_t *open_store(mt_sio_kind_t io, size_t req) {
    mt_error_t err = {0};
    mt_store_t *s = NULL;
    mt_store_opts_t o = {.dir = root, .queue_depth = 4, .request_bytes = req, .io = io};
    if (mt_store_open(&s, &o, &err) != MT_OK) {
        fprintf(stderr, "FAIL: open: %s\n", err.msg);
        failures++;
        return NULL;
    }
    return s;
}

enum { BLOCKS = 6, PER = 3, SETS = 3 };

static uint64_t ext_bytes(int b, int k) { return 100000u + 77777u * (uint64_t)k + 4093u * (uint64_t)b; }
static unsigned seed_of(int b, int k, int round) { return 1000u * (unsigned)round + 10u * (unsigned)b + (unsigned)k + 1; }

typedef struct {
    mt_store_t *s;
    int ext[BLOCKS][PER];
    void *buf[SETS][PER]; /* buffer set b % SETS serves block b */
} blocks_t;

static void ops_of(const blocks_t *t, int b, mt_store_op_t *ops) {
    for (int k = 0; k < PER; k++) ops[k] = (mt_store_op_t){t->ext[b][k], t->buf[b % SETS][k]};
}

static mt_status_t submit_block(blocks_t *t, int b, bool write, mt_store_ticket_t *tk, mt_error_t *err) {
    mt_store_op_t ops[PER];
    ops_of(t, b, ops);
    return write ? mt_store_submit_write(t->s, ops, PER, tk, err) : mt_store_submit_read(t->s, ops, PER, tk, err);
}

static void fill_block(blocks_t *t, int b, int round) {
    for (int k = 0; k < PER; k++) fill(t->buf[b % SETS][k], ext_bytes(b, k), seed_of(b, k, round));
}

static int block_holds(const blocks_t *t, int b, int round) {
    int ok = 1;
    for (int k = 0; k < PER; k++) ok &= holds(t->buf[b % SETS][k], ext_bytes(b, k), seed_of(b, k, round));
    return ok;
}

/* Round 0 written with every block's batch in flight at once (as many as
 * the store takes), waited for newest first. */
static void write_round0(blocks_t *t) {
    mt_error_t err = {0};
    for (int b0 = 0; b0 < BLOCKS; b0 += SETS) {
        mt_store_ticket_t tk[SETS] = {0};
        for (int b = b0; b < b0 + SETS && b < BLOCKS; b++) {
            fill_block(t, b, 0);
            expect_ok(submit_block(t, b, true, &tk[b - b0], &err), &err, "round 0 submit");
        }
        expect(mt_store_in_flight(t->s) == SETS, "batches in flight not counted");
        for (int j = SETS - 1; j >= 0; j--) expect_ok(mt_store_wait(t->s, tk[j], &err), &err, "round 0 wait");
        expect(mt_store_in_flight(t->s) == 0, "waited batches still counted");
    }
}

/* The host optimizer's loop: read b+1 ahead, update b, write b back, wait
 * for b-1's write. */
static void optimizer_round(blocks_t *t, int round) {
    mt_error_t err = {0};
    mt_store_ticket_t rd[BLOCKS] = {0}, wr[BLOCKS] = {0};
    expect_ok(submit_block(t, 0, false, &rd[0], &err), &err, "first prefetch");
    for (int b = 0; b < BLOCKS; b++) {
        if (b + 1 < BLOCKS) expect_ok(submit_block(t, b + 1, false, &rd[b + 1], &err), &err, "prefetch of b+1");
        expect_ok(mt_store_wait(t->s, rd[b], &err), &err, "wait of the read of b");
        expect(block_holds(t, b, round - 1), "a prefetched block does not hold what was written");
        fill_block(t, b, round);
        expect_ok(submit_block(t, b, true, &wr[b], &err), &err, "write-back of b");
        if (b > 0) expect_ok(mt_store_wait(t->s, wr[b - 1], &err), &err, "wait of the write of b-1");
    }
    expect_ok(mt_store_wait(t->s, wr[BLOCKS - 1], &err), &err, "wait of the last write");
    expect(mt_store_in_flight(t->s) == 0, "a batch left in flight");
}

static void test_pipeline(mt_sio_kind_t io) {
    blocks_t t = {.s = open_store(io, 32 << 10)};
    if (!t.s) return;
    printf("async store I/O: %s\n", mt_store_io_name(t.s));
    mt_error_t err = {0};
    int f = -1;
    expect_ok(mt_store_file_add(t.s, "p.bin", &f, &err), &err, "file_add");
    for (int b = 0; b < BLOCKS; b++)
        for (int k = 0; k < PER; k++) expect_ok(mt_store_reserve(t.s, f, ext_bytes(b, k), &t.ext[b][k], &err), &err, "reserve");
    for (int j = 0; j < SETS; j++)
        for (int k = 0; k < PER; k++) t.buf[j][k] = mt_sio_buffer_alloc(mt_store_buffer_bytes(ext_bytes(BLOCKS, k)));
    write_round0(&t);
    optimizer_round(&t, 1);
    optimizer_round(&t, 2);
    /* and once more synchronously, every block, out of the loop */
    for (int b = BLOCKS - 1; b >= 0; b--) {
        mt_store_op_t ops[PER];
        ops_of(&t, b, ops);
        memset(t.buf[b % SETS][0], 0, ext_bytes(b, 0));
        expect_ok(mt_store_read(t.s, ops, PER, &err), &err, "sync read after the rounds");
        expect(block_holds(&t, b, 2), "a block does not hold the last round");
    }
    for (int j = 0; j < SETS; j++)
        for (int k = 0; k < PER; k++) mt_sio_buffer_free(t.buf[j][k]);
    mt_store_close(t.s);
}

/* Refusals, each leaving the batches in flight to finish normally. */
static void test_refusals(mt_sio_kind_t io) {
    mt_store_t *s = open_store(io, 0);
    if (!s) return;
    mt_error_t err = {0};
    int f = -1, e[6];
    void *buf[6];
    expect_ok(mt_store_file_add(s, "r.bin", &f, &err), &err, "file_add");
    for (int i = 0; i < 6; i++) {
        expect_ok(mt_store_reserve(s, f, 300000, &e[i], &err), &err, "reserve");
        buf[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(300000));
        fill(buf[i], 300000, (unsigned)i + 50);
    }
    const char *path = mt_store_file_path(s, f);
    char off0[64];
    snprintf(off0, sizeof off0, "offset %" PRIu64 " ", (uint64_t)4096);
    mt_store_op_t o[6];
    for (int i = 0; i < 6; i++) o[i] = (mt_store_op_t){e[i], buf[i]};
    mt_store_ticket_t t[6] = {0}, bad = 99;
    expect_msg(mt_store_submit_read(s, &o[0], 1, &bad, &err), &err, path, "before any write",
               "a read before any write not refused");
    expect(bad == 0, "a refused submit left a ticket");
    for (int i = 0; i < 4; i++) expect_ok(mt_store_submit_write(s, &o[i], 1, &t[i], &err), &err, "submit");
    expect_msg(mt_store_submit_write(s, &o[4], 1, &bad, &err), &err, "4 store batches are in flight", NULL,
               "a fifth batch not refused");
    expect_ok(mt_store_wait(s, t[1], &err), &err, "wait of the second");
    mt_store_op_t two[2] = {o[1], o[0]};
    expect_msg(mt_store_submit_read(s, two, 2, &bad, &err), &err, path, off0,
               "a read of an extent being written not refused with its file and offset");
    expect(strstr(err.msg, "written by a batch in flight") != NULL, "the refusal does not say why");
    /* the refused batch's first op claimed extent 1 for a moment: released */
    expect_ok(mt_store_write(s, &o[1], 1, &err), &err, "a write of an extent a refused read named");
    for (int i = 2; i < 4; i++) expect_ok(mt_store_wait(s, t[i], &err), &err, "wait after the refusals");
    mt_store_op_t dup[2] = {o[4], o[4]};
    expect_msg(mt_store_submit_write(s, dup, 2, &bad, &err), &err, path, "twice in this one",
               "an extent written twice in one batch not refused");
    expect_ok(mt_store_submit_read(s, &o[1], 1, &t[1], &err), &err, "read of a written extent");
    mt_store_ticket_t t2 = 0;
    expect_ok(mt_store_submit_read(s, &o[1], 1, &t2, &err), &err, "two reads of one extent at once");
    expect_ok(mt_store_wait(s, t2, &err), &err, "wait of the second read");
    expect_msg(mt_store_submit_write(s, &o[1], 1, &bad, &err), &err, path, "read by a batch in flight",
               "a write of an extent being read not refused");
    for (int i = 0; i < 2; i++) expect_ok(mt_store_wait(s, t[i], &err), &err, "wait after the refusals");
    expect_msg(mt_store_wait(s, t[0], &err), &err, "not in flight", NULL, "a second wait of a ticket not refused");
    expect_msg(mt_store_wait(s, 0, &err), &err, "not in flight", NULL, "a wait of ticket 0 not refused");
    /* extent 4 (never written) and 0 can be written now */
    mt_store_op_t w2[2] = {o[4], o[0]};
    expect_ok(mt_store_write(s, w2, 2, &err), &err, "write after the refusals");
    expect_ok(mt_store_read(s, o, 5, &err), &err, "read of all after the refusals");
    for (int i = 0; i < 5; i++) expect(holds(buf[i], 300000, (unsigned)i + 50), "data after the refusals");
    /* batches never waited for: close finishes them (ASan: nothing leaks) */
    expect_ok(mt_store_submit_write(s, &o[5], 1, &t[5], &err), &err, "submit before close");
    expect_ok(mt_store_submit_read(s, o, 2, &t[0], &err), &err, "submit before close");
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", mt_store_run_dir(s));
    mt_store_close(s);
    struct stat st;
    expect(stat(dir, &st) != 0 && errno == ENOENT, "close with batches in flight left the run's directory");
    for (int i = 0; i < 6; i++) mt_sio_buffer_free(buf[i]);
}

typedef struct {
    uint64_t started, finished;
} ran_t;

static ran_t wait_ran(mt_store_t *s, mt_store_ticket_t t, const char *what) {
    mt_error_t err = {0};
    ran_t r = {0, 0};
    expect_ok(mt_store_wait_traced(s, t, &r.started, &r.finished, &err), &err, what);
    return r;
}

/* With writes queued behind a held I/O thread, a later read starts first
 * (and, one request at a time, ends before they start); a second read
 * does not pass a write already passed once; a read of an extent whose
 * write is queued is refused, and the read after that write's wait gets
 * the written data. */
static void test_reads_ahead(mt_sio_kind_t io) {
    mt_store_t *s = open_store(io, 64 << 10);
    if (!s) return;
    const bool one_at_a_time = strcmp(mt_store_io_name(s), "pread/pwrite") == 0;
    mt_error_t err = {0};
    int f = -1, e[4];
    const uint64_t n = 200001; /* 4 requests of 64 KiB: a read fills the queue of 4 alone */
    void *buf[4];
    mt_store_op_t o[4];
    expect_ok(mt_store_file_add(s, "a.bin", &f, &err), &err, "file_add");
    for (int i = 0; i < 4; i++) {
        expect_ok(mt_store_reserve(s, f, n, &e[i], &err), &err, "reserve");
        buf[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(n));
        fill(buf[i], n, (unsigned)i + 20);
        o[i] = (mt_store_op_t){e[i], buf[i]};
    }
    expect_ok(mt_store_write(s, o, 4, &err), &err, "first write");
    mt_store_ticket_t w0 = 0, w1 = 0, r2 = 0, r3 = 0, bad = 99;

    mt_store_hold_io(s, true);
    fill(buf[0], n, 30);
    fill(buf[1], n, 31);
    expect_ok(mt_store_submit_write(s, &o[0], 1, &w0, &err), &err, "queued write");
    expect_ok(mt_store_submit_write(s, &o[1], 1, &w1, &err), &err, "queued write");
    expect_ok(mt_store_submit_read(s, &o[2], 1, &r2, &err), &err, "read behind queued writes");
    mt_store_hold_io(s, false);
    const ran_t a = wait_ran(s, r2, "read ahead"), b = wait_ran(s, w0, "passed write");
    const ran_t c = wait_ran(s, w1, "passed write");
    expect(a.started < b.started && b.started < c.started, "a read did not start before the writes queued before it");
    expect(!one_at_a_time || a.finished < b.started, "one request at a time, a read did not end before queued writes");
    expect(holds(buf[2], n, 22), "the read ahead's data");

    mt_store_hold_io(s, true);
    expect_ok(mt_store_submit_write(s, &o[0], 1, &w0, &err), &err, "queued write");
    expect_ok(mt_store_submit_read(s, &o[2], 1, &r2, &err), &err, "first read behind it");
    expect_ok(mt_store_submit_read(s, &o[3], 1, &r3, &err), &err, "second read behind it");
    mt_store_hold_io(s, false);
    const ran_t w = wait_ran(s, w0, "write"), x = wait_ran(s, r2, "first read"), y = wait_ran(s, r3, "second read");
    expect(x.started < w.started, "the first read did not pass the queued write");
    expect(w.started < y.started, "a write was passed by two reads");

    mt_store_hold_io(s, true);
    fill(buf[0], n, 40);
    expect_ok(mt_store_submit_write(s, &o[0], 1, &w0, &err), &err, "queued write");
    expect_msg(mt_store_submit_read(s, &o[0], 1, &bad, &err), &err, mt_store_file_path(s, f),
               "written by a batch in flight", "a read of an extent whose write is queued not refused");
    expect(bad == 0, "a refused read left a ticket");
    expect_ok(mt_store_submit_read(s, &o[3], 1, &r3, &err), &err, "a read of another extent");
    mt_store_hold_io(s, false);
    const ran_t p = wait_ran(s, r3, "read of another extent"), q = wait_ran(s, w0, "write");
    expect(p.started < q.started, "a read of another extent did not pass the queued write");
    memset(buf[0], 0, n);
    expect_ok(mt_store_read(s, &o[0], 1, &err), &err, "read after the write's wait");
    expect(holds(buf[0], n, 40), "the read after a queued write does not hold that write's data");
    for (int i = 0; i < 4; i++) mt_sio_buffer_free(buf[i]);
    mt_store_close(s);
}

/* A flipped byte on disk, found by an async read while another read is in
 * flight; the other one unaffected. */
static void test_corrupt(mt_sio_kind_t io) {
    mt_store_t *s = open_store(io, 64 << 10);
    if (!s) return;
    mt_error_t err = {0};
    int f = -1, e[2];
    const uint64_t n = 500001;
    void *buf[2];
    expect_ok(mt_store_file_add(s, "c.bin", &f, &err), &err, "file_add");
    mt_store_op_t o[2];
    for (int i = 0; i < 2; i++) {
        expect_ok(mt_store_reserve(s, f, n, &e[i], &err), &err, "reserve");
        buf[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(n));
        fill(buf[i], n, (unsigned)i + 7);
        o[i] = (mt_store_op_t){e[i], buf[i]};
    }
    expect_ok(mt_store_write(s, o, 2, &err), &err, "write");
    const char *path = mt_store_file_path(s, f);
    const off_t at1 = (off_t)(4096 + mt_store_span_bytes(n));
    int fd = open(path, O_RDWR);
    unsigned char b = 0;
    expect(pread(fd, &b, 1, at1 + 300000) == 1, "raw read");
    b ^= 0x01;
    expect(pwrite(fd, &b, 1, at1 + 300000) == 1, "raw write");
    fsync(fd);
    close(fd);
    memset(buf[0], 0, n);
    mt_store_ticket_t t1 = 0, t0 = 0;
    expect_ok(mt_store_submit_read(s, &o[1], 1, &t1, &err), &err, "submit of the corrupted extent's read");
    expect_ok(mt_store_submit_read(s, &o[0], 1, &t0, &err), &err, "submit of the good extent's read");
    expect_ok(mt_store_wait(s, t0, &err), &err, "the good extent's read");
    expect(holds(buf[0], n, 7), "the good extent's data");
    char off[64];
    snprintf(off, sizeof off, "offset %lld ", (long long)at1);
    expect_msg(mt_store_wait(s, t1, &err), &err, path, off, "a flipped byte is not reported through wait");
    expect(strstr(err.msg, "checksum") != NULL, "a flipped byte is not called a checksum failure");
    for (int i = 0; i < 2; i++) mt_sio_buffer_free(buf[i]);
    mt_store_close(s);
}

/* In a child (the file size limit is the process's): extents past the
 * limit fail their write through wait, the batches beside them succeed,
 * every ticket is waited for, and the failed extents count as unwritten. */
static int write_failure_child(mt_sio_kind_t io) {
    failures = 0; /* the parent's, copied by fork: this child reports its own */
    signal(SIGXFSZ, SIG_IGN);
    mt_store_t *s = open_store(io, 0);
    if (!s) return 1;
    mt_error_t err = {0};
    int f = -1, e[4];
    const uint64_t n = 1500000;
    void *buf[4];
    mt_store_op_t o[4];
    expect_ok(mt_store_file_add(s, "w.bin", &f, &err), &err, "file_add");
    for (int i = 0; i < 4; i++) {
        expect_ok(mt_store_reserve(s, f, n, &e[i], &err), &err, "reserve");
        buf[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(n));
        fill(buf[i], n, (unsigned)i + 3);
        o[i] = (mt_store_op_t){e[i], buf[i]};
    }
    /* the limit 100 KiB into extent 2: its first request is cut short there */
    const uint64_t at2 = 4096 + 2 * mt_store_span_bytes(n);
    struct rlimit rl = {at2 + (100u << 10), at2 + (100u << 10)};
    expect(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    mt_store_ticket_t ta = 0, tb = 0, tc = 0;
    expect_ok(mt_store_submit_write(s, &o[2], 2, &ta, &err), &err, "submit past the limit");
    expect_ok(mt_store_submit_write(s, &o[0], 1, &tb, &err), &err, "submit below the limit");
    expect_ok(mt_store_submit_write(s, &o[1], 1, &tc, &err), &err, "submit below the limit");
    char off[64];
    snprintf(off, sizeof off, "write of 1048576 bytes at offset %" PRIu64 " failed", at2);
    expect_msg(mt_store_wait(s, ta, &err), &err, mt_store_file_path(s, f), off, "a failed write not reported by wait");
    expect(strstr(err.msg, strerror(EFBIG)) != NULL, "the failed write's reason not named");
    expect_ok(mt_store_wait(s, tb, &err), &err, "a batch after a failed one");
    expect_ok(mt_store_wait(s, tc, &err), &err, "a batch after a failed one");
    for (int i = 0; i < 2; i++) memset(buf[i], 0, n);
    expect_ok(mt_store_read(s, o, 2, &err), &err, "read of the written extents");
    for (int i = 0; i < 2; i++) expect(holds(buf[i], n, (unsigned)i + 3), "the written extents' data");
    expect_msg(mt_store_read(s, &o[2], 1, &err), &err, "before any write", NULL,
               "an extent whose write failed counts as written");
    for (int i = 0; i < 4; i++) mt_sio_buffer_free(buf[i]);
    mt_store_close(s);
    return failures != 0;
}

static void test_write_failure(mt_sio_kind_t io) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) _exit(write_failure_child(io));
    int wst = 0;
    waitpid(pid, &wst, 0);
    expect(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "a write failure through wait (see above)");
}

int main(void) {
    const char *t = getenv("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/store_async_test.XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(root)) return 2;
    const mt_sio_kind_t kinds[2] = {MT_SIO_AUTO, MT_SIO_PSYNC};
    for (int k = 0; k < 2; k++) {
        test_pipeline(kinds[k]);
        test_refusals(kinds[k]);
        test_reads_ahead(kinds[k]);
        test_corrupt(kinds[k]);
        test_write_failure(kinds[k]);
    }
    rmdir(root);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("store_async_test: all passed\n");
    return failures != 0;
}
