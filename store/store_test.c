/* The store on a real directory (the test's TMPDIR): CRC32C's known value
 * and its two paths agreeing; extents of odd sizes written and read back
 * through io_uring and through pread/pwrite, split into many requests; a
 * flipped byte, a stale extent and another run's extent each refused with
 * the file and offset named; a killed run's subdirectory removed by the
 * next run and a live run's left alone, a lockless one only once it is a
 * minute old; planned bytes over the budget or
 * the free space refused naming the directory and both sizes; a write
 * past the file size limit refused naming the file; close removing it all. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "store/crc32c.h"
#include "store/store.h"

static int failures;

static void expect(int ok, const char *what) {
    if (!ok) {
        fprintf(stderr, "FAIL: %s\n", what);
        failures++;
    }
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

static void test_crc(void) {
    expect(mt_crc32c(0, "123456789", 9) == 0xE3069283u, "CRC32C of '123456789' is not e3069283");
    unsigned char buf[1000];
    fill(buf, sizeof buf, 7);
    for (size_t n = 0; n + 3 <= sizeof buf; n += 37)
        expect(mt_crc32c(0, buf + 3, n) == mt_crc32c_table(0, buf + 3, n), "hardware and table CRC32C differ");
    expect(mt_crc32c(mt_crc32c(0, buf, 100), buf + 100, 200) == mt_crc32c(0, buf, 300), "CRC32C does not continue");
}

static mt_store_t *open_store(mt_sio_kind_t io, size_t req, uint64_t planned) {
    mt_error_t err = {0};
    mt_store_t *s = NULL;
    mt_store_opts_t o = {.dir = root, .planned_bytes = planned, .queue_depth = 4, .request_bytes = req, .io = io};
    if (mt_store_open(&s, &o, &err) != MT_OK) {
        fprintf(stderr, "FAIL: open: %s\n", err.msg);
        failures++;
        return NULL;
    }
    return s;
}

static void test_roundtrip(mt_sio_kind_t io) {
    mt_store_t *s = open_store(io, 64 << 10, 0);
    if (!s) return;
    printf("store I/O: %s\n", mt_store_io_name(s));
    mt_error_t err = {0};
    int f = -1;
    expect(mt_store_file_add(s, "t.bin", &f, &err) == MT_OK, "file_add failed");
    const uint64_t sizes[] = {1, 4096, 4097, 3u << 20, (3u << 20) + 12345};
    enum { N = 5 };
    int ext[N];
    void *w[N], *r[N];
    mt_store_op_t wo[N], ro[N];
    for (int i = 0; i < N; i++) {
        expect(mt_store_reserve(s, f, sizes[i], &ext[i], &err) == MT_OK, "reserve failed");
        w[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(sizes[i]));
        r[i] = mt_sio_buffer_alloc(mt_store_buffer_bytes(sizes[i]));
        fill(w[i], sizes[i], (unsigned)i + 1);
        wo[i] = (mt_store_op_t){ext[i], w[i]};
        ro[i] = (mt_store_op_t){ext[i], r[i]};
    }
    mt_status_t st = mt_store_write(s, wo, N, &err);
    if (st != MT_OK) fprintf(stderr, "  %s\n", err.msg);
    expect(st == MT_OK, "batch write failed");
    /* read back in reverse order, as a backward pass would */
    mt_store_op_t rev[N];
    for (int i = 0; i < N; i++) rev[i] = ro[N - 1 - i];
    st = mt_store_read(s, rev, N, &err);
    if (st != MT_OK) fprintf(stderr, "  %s\n", err.msg);
    expect(st == MT_OK, "batch read failed");
    for (int i = 0; i < N; i++) expect(memcmp(w[i], r[i], sizes[i]) == 0, "read data differs from written");

    /* a flipped byte inside extent 3, through an ordinary descriptor */
    const char *path = mt_store_file_path(s, f);
    int fd = open(path, O_RDWR);
    const off_t at3 = (off_t)(4096 + mt_store_span_bytes(1) + mt_store_span_bytes(4096) + mt_store_span_bytes(4097));
    unsigned char b;
    expect(pread(fd, &b, 1, at3 + 1000) == 1, "raw read");
    b ^= 0x10;
    expect(pwrite(fd, &b, 1, at3 + 1000) == 1, "raw write");
    fsync(fd);
    char off[64];
    snprintf(off, sizeof off, "offset %lld ", (long long)at3);
    expect_msg(mt_store_read(s, &ro[3], 1, &err), &err, path, off, "a flipped byte is not reported with its offset");
    expect(strstr(err.msg, "checksum") != NULL, "a flipped byte is not called a checksum failure");
    b ^= 0x10;
    expect(pwrite(fd, &b, 1, at3 + 1000) == 1, "raw write");
    fsync(fd);
    expect(mt_store_read(s, &ro[3], 1, &err) == MT_OK, "restored extent not read back");

    /* stale: the first write's bytes put back after a second write */
    const size_t span1 = mt_store_span_bytes(sizes[1]);
    const off_t at1 = (off_t)(4096 + mt_store_span_bytes(1));
    char *old = malloc(span1);
    expect(pread(fd, old, span1, at1) == (ssize_t)span1, "raw read of extent 1");
    fill(w[1], sizes[1], 99);
    expect(mt_store_write(s, &wo[1], 1, &err) == MT_OK, "rewrite failed");
    expect(pwrite(fd, old, span1, at1) == (ssize_t)span1, "raw write of the old extent");
    fsync(fd);
    expect_msg(mt_store_read(s, &ro[1], 1, &err), &err, path, "stale", "a stale extent is not reported");

    /* another run's extent at the same place of a file of the same shape */
    mt_store_t *s2 = open_store(io, 64 << 10, 0);
    if (s2) {
        int f2, e2, e2b;
        expect(mt_store_file_add(s2, "t.bin", &f2, &err) == MT_OK, "second store's file");
        expect(mt_store_reserve(s2, f2, sizes[0], &e2, &err) == MT_OK, "second store's reserve");
        expect(mt_store_reserve(s2, f2, sizes[1], &e2b, &err) == MT_OK, "second store's reserve");
        mt_store_op_t o2 = {e2b, w[1]};
        expect(mt_store_write(s2, &o2, 1, &err) == MT_OK, "second store's write");
        int fd2 = open(mt_store_file_path(s2, f2), O_RDONLY);
        expect(pread(fd2, old, span1, at1) == (ssize_t)span1, "raw read of the other run's extent");
        expect(pwrite(fd, old, span1, at1) == (ssize_t)span1, "raw write of the other run's extent");
        fsync(fd);
        close(fd2);
        expect_msg(mt_store_read(s, &ro[1], 1, &err), &err, path, "another run", "a foreign extent is not reported");
        mt_store_close(s2);
    }
    free(old);
    close(fd);
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", mt_store_run_dir(s));
    for (int i = 0; i < N; i++) {
        mt_sio_buffer_free(w[i]);
        mt_sio_buffer_free(r[i]);
    }
    mt_store_close(s);
    struct stat stt;
    expect(stat(dir, &stt) != 0 && errno == ENOENT, "close left the run's directory");
}

static void test_leftovers(void) {
    /* a live run (this process's store) is left alone */
    mt_store_t *live = open_store(MT_SIO_AUTO, 0, 0);
    /* a killed run: a child opens a store, writes, and is killed with SIGKILL */
    int pfd[2];
    expect(pipe(pfd) == 0, "pipe");
    const pid_t pid = fork();
    if (pid == 0) {
        mt_store_t *c = open_store(MT_SIO_AUTO, 0, 0);
        int f, e;
        mt_error_t err = {0};
        if (c && mt_store_file_add(c, "x.bin", &f, &err) == MT_OK && mt_store_reserve(c, f, 10000, &e, &err) == MT_OK) {
            void *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(10000));
            mt_store_op_t op = {e, buf};
            (void)mt_store_write(c, &op, 1, &err);
        }
        const char *d = c ? mt_store_run_dir(c) : "";
        (void)!write(pfd[1], d, strlen(d) + 1);
        raise(SIGKILL);
    }
    close(pfd[1]);
    char killed[4096] = {0};
    (void)!read(pfd[0], killed, sizeof killed - 1);
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    struct stat st;
    expect(killed[0] && stat(killed, &st) == 0, "the killed run left no directory to find");
    /* a subdirectory without its lock: a run making it right now (left
     * alone) or one killed while making it over a minute ago (removed) */
    char young[4200], old[4200];
    snprintf(young, sizeof young, "%s/moetune-00000000000000aa", root);
    snprintf(old, sizeof old, "%s/moetune-00000000000000bb", root);
    expect(mkdir(young, 0700) == 0 && mkdir(old, 0700) == 0, "mkdir of lockless run directories");
    struct timeval past[2] = {{time(NULL) - 120, 0}, {time(NULL) - 120, 0}};
    expect(utimes(old, past) == 0, "utimes");
    mt_store_t *next = open_store(MT_SIO_AUTO, 0, 0);
    if (next) expect(mt_store_leftovers_removed(next) == 2, "the next run did not remove exactly the killed runs'");
    expect(stat(young, &st) == 0, "a young lockless run directory was removed");
    expect(stat(old, &st) != 0, "an old lockless run directory was left");
    rmdir(young);
    expect(stat(killed, &st) != 0, "the killed run's directory is still there");
    if (live) expect(stat(mt_store_run_dir(live), &st) == 0, "a live run's directory was removed");
    expect(!next || strcmp(mt_store_run_dir(next), killed) != 0, "the next run took the killed run's directory");
    mt_store_close(next);
    mt_store_close(live);
}

static void test_space(void) {
    mt_error_t err = {0};
    mt_store_t *s = NULL;
    mt_store_opts_t o = {.dir = root, .planned_bytes = (uint64_t)1 << 62};
    expect_msg(mt_store_open(&s, &o, &err), &err, root, "free", "planned bytes past the disk not refused");
    expect(strstr(err.msg, "4611686018427387904 bytes") != NULL, "the planned size is not named");
    mt_store_opts_t ob = {.dir = root, .planned_bytes = 10u << 20, .budget = 1u << 20};
    expect_msg(mt_store_open(&s, &ob, &err), &err, root, "budget is 1048576 bytes", "over budget not refused");
    mt_store_opts_t bad = {.dir = "/nonexistent/moetune-store-dir"};
    expect_msg(mt_store_open(&s, &bad, &err), &err, "/nonexistent/moetune-store-dir", NULL, "missing dir not named");
    /* a reservation the file size limit refuses (standing in for a full disk) */
    const pid_t pid = fork();
    if (pid == 0) {
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {1u << 20, 1u << 20};
        setrlimit(RLIMIT_FSIZE, &rl);
        mt_store_t *c = open_store(MT_SIO_AUTO, 0, 0);
        int f, e;
        mt_error_t e2 = {0};
        int ok = c && mt_store_file_add(c, "big.bin", &f, &e2) == MT_OK;
        mt_status_t st = ok ? mt_store_reserve(c, f, 8u << 20, &e, &e2) : MT_OK;
        ok = ok && st != MT_OK && strstr(e2.msg, "big.bin") && strstr(e2.msg, "cannot allocate");
        if (!ok) fprintf(stderr, "  message: %s\n", e2.msg);
        mt_store_close(c);
        _exit(ok ? 0 : 1);
    }
    int wst = 0;
    waitpid(pid, &wst, 0);
    expect(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "a reservation past the file size limit not refused naming the file");
}

int main(void) {
    const char *t = getenv("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/store_test.XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(root)) return 2;
    test_crc();
    test_roundtrip(MT_SIO_AUTO);
    test_roundtrip(MT_SIO_PSYNC);
    test_leftovers();
    test_space();
    rmdir(root);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("store_test: all passed\n");
    return failures != 0;
}
