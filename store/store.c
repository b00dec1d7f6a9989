/* The store (see store.h): files, extents and their checks.  An extent's
 * disk span is its data rounded up to MT_SIO_ALIGN and one aligned trailer
 * block; a read or write of it is split into requests of at most
 * request_bytes, and a batch of extents goes to the I/O engine as one list,
 * so many tensors of a few MB keep the queue full. */
#include "store/store.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "store/crc32c.h"
#include "store/rundir.h"

#define TRAILER_MAGIC "MTSTORE1"
#define HEADER_MAGIC "MTSTOREF"

typedef struct {
    int fd;
    char path[4200];
    uint64_t end; /* next free offset */
} store_file_t;

typedef struct {
    int file;
    uint64_t offset, bytes;
    uint64_t gen;  /* writes so far; the trailer must carry the latest */
    uint32_t crc;  /* CRC32C of the latest write's data */
} store_extent_t;

/* The first bytes of an extent's trailer block (the rest is zero). */
typedef struct {
    char magic[8];
    uint64_t run_id;
    uint32_t file, extent;
    uint64_t offset, bytes, gen;
    uint32_t data_crc;
    uint32_t self_crc; /* of the fields above */
} store_trailer_t;

struct mt_store {
    mt_sio_t *io;
    uint64_t id;
    char dir[4096];
    int lock_fd;
    int leftovers;
    uint64_t budget, reserved;
    size_t req_bytes;
    store_file_t *files;
    int nfiles;
    store_extent_t *ext;
    int next, cap_ext;
    mt_sio_req_t *reqs; /* the running batch's requests */
    int *req_op;        /* per request: its op */
    int req_cap;
};

uint64_t mt_store_span_bytes(uint64_t bytes) {
    return (bytes + MT_SIO_ALIGN - 1) / MT_SIO_ALIGN * MT_SIO_ALIGN + MT_SIO_ALIGN;
}

size_t mt_store_buffer_bytes(uint64_t bytes) { return (size_t)mt_store_span_bytes(bytes); }

static uint64_t new_run_id(void) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof id, 0) != (ssize_t)sizeof id || id == 0) {
        /* no entropy source: time and pid still differ between runs on one host */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        id = ((uint64_t)ts.tv_sec * 1000000007u) ^ (uint64_t)ts.tv_nsec ^ ((uint64_t)getpid() << 40);
    }
    return id | 1;
}

mt_status_t mt_store_open(mt_store_t **out, const mt_store_opts_t *o, mt_error_t *err) {
    *out = NULL;
    if (!o->dir || !o->dir[0]) return mt_error_set(err, MT_ERR_CONFIG, "the store needs a directory");
    mt_store_t *s = calloc(1, sizeof *s);
    if (!s) return mt_error_set(err, MT_ERR_NOMEM, "out of memory for the store");
    s->lock_fd = -1;
    s->budget = o->budget;
    s->req_bytes = o->request_bytes ? o->request_bytes : (size_t)1 << 20;
    s->req_bytes = s->req_bytes / MT_SIO_ALIGN * MT_SIO_ALIGN;
    if (!s->req_bytes) s->req_bytes = MT_SIO_ALIGN;
    s->id = new_run_id();
    mt_status_t st = store_rundir_sweep(o->dir, &s->leftovers, err);
    if (st == MT_OK) st = store_space_check(o->dir, o->planned_bytes, o->budget, err);
    if (st == MT_OK) st = mt_sio_open(&s->io, o->io, o->queue_depth ? o->queue_depth : 8, err);
    if (st == MT_OK) st = store_rundir_make(o->dir, s->id, s->dir, sizeof s->dir, &s->lock_fd, err);
    if (st != MT_OK) {
        mt_store_close(s);
        return st;
    }
    *out = s;
    return MT_OK;
}

void mt_store_close(mt_store_t *s) {
    if (!s) return;
    for (int i = 0; i < s->nfiles; i++) close(s->files[i].fd);
    if (s->lock_fd >= 0) {
        store_rundir_remove(s->dir); /* the lock goes with it, still held until the close below */
        close(s->lock_fd);
    }
    mt_sio_close(s->io);
    free(s->files);
    free(s->ext);
    free(s->reqs);
    free(s->req_op);
    free(s);
}

const char *mt_store_io_name(const mt_store_t *s) { return mt_sio_name(s->io); }
const char *mt_store_run_dir(const mt_store_t *s) { return s->dir; }
uint64_t mt_store_run_id(const mt_store_t *s) { return s->id; }
int mt_store_leftovers_removed(const mt_store_t *s) { return s->leftovers; }
uint64_t mt_store_reserved_bytes(const mt_store_t *s) { return s->reserved; }
uint64_t mt_store_extent_bytes(const mt_store_t *s, int extent) { return s->ext[extent].bytes; }
bool mt_store_extent_written(const mt_store_t *s, int extent) { return s->ext[extent].gen > 0; }
const char *mt_store_file_path(const mt_store_t *s, int file) { return s->files[file].path; }

static int name_ok(const char *name) {
    if (!name[0] || name[0] == '.' || strlen(name) > 100 || strncmp(name, STORE_LOCK_NAME, strlen(STORE_LOCK_NAME)) == 0) return 0;
    for (const char *c = name; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '-' ||
              *c == '_' || *c == '.'))
            return 0;
    return 1;
}

/* The file's first block: magic, run id, pid, name (for people and for a
 * check that a file is this run's). */
static mt_status_t write_header(mt_store_t *s, store_file_t *f, const char *name, mt_error_t *err) {
    char *blk = mt_sio_buffer_alloc(MT_SIO_ALIGN);
    if (!blk) return mt_error_set(err, MT_ERR_NOMEM, "out of memory for a store header");
    memcpy(blk, HEADER_MAGIC, 8);
    memcpy(blk + 8, &s->id, 8);
    snprintf(blk + 16, MT_SIO_ALIGN - 16, "moetune store file %s of run %016" PRIx64 ", pid %ld\n", name, s->id,
             (long)getpid());
    mt_sio_req_t r = {.fd = f->fd, .write = true, .offset = 0, .bytes = MT_SIO_ALIGN, .buf = blk};
    const int bad = mt_sio_run(s->io, &r, 1);
    mt_sio_buffer_free(blk);
    if (bad >= 0)
        return mt_error_set(err, MT_ERR_IO, "%s: cannot write the store header: %s", f->path, strerror((int)-r.result));
    f->end = MT_SIO_ALIGN;
    return MT_OK;
}

mt_status_t mt_store_file_add(mt_store_t *s, const char *name, int *file, mt_error_t *err) {
    if (!name_ok(name)) return mt_error_set(err, MT_ERR_INTERNAL, "store file name '%s' is not a plain name", name);
    store_file_t *nf = realloc(s->files, (size_t)(s->nfiles + 1) * sizeof *nf);
    MT_CHECK_ALLOC(nf, "store file table");
    s->files = nf;
    store_file_t *f = &s->files[s->nfiles];
    memset(f, 0, sizeof *f);
    snprintf(f->path, sizeof f->path, "%s/%s", s->dir, name);
    f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (f->fd < 0) {
        const int e = errno;
        if (e == EINVAL)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: the filesystem does not support O_DIRECT (tmpfs?); the store needs a directory "
                                "on a disk",
                                f->path);
        return mt_error_set(err, MT_ERR_IO, "%s: cannot create: %s", f->path, strerror(e));
    }
    s->nfiles++;
    *file = s->nfiles - 1;
    return write_header(s, f, name, err);
}

mt_status_t mt_store_reserve(mt_store_t *s, int file, uint64_t bytes, int *extent, mt_error_t *err) {
    MT_CHECK(file >= 0 && file < s->nfiles, "store file %d of %d", file, s->nfiles);
    store_file_t *f = &s->files[file];
    const uint64_t span = mt_store_span_bytes(bytes);
    if (s->budget && s->reserved + span > s->budget)
        return mt_error_set(err, MT_ERR_BUDGET,
                            "%s: %" PRIu64 " more bytes would pass the store's budget of %" PRIu64 " bytes (%" PRIu64
                            " reserved)",
                            f->path, span, s->budget, s->reserved);
    const int rc = posix_fallocate(f->fd, (off_t)f->end, (off_t)span);
    if (rc != 0 && rc != EOPNOTSUPP && rc != EINVAL)
        return mt_error_set(err, MT_ERR_IO, "%s: cannot allocate %" PRIu64 " bytes at offset %" PRIu64 ": %s",
                            f->path, span, f->end, strerror(rc));
    if (s->next == s->cap_ext) {
        s->cap_ext = s->cap_ext ? 2 * s->cap_ext : 64;
        store_extent_t *ne = realloc(s->ext, (size_t)s->cap_ext * sizeof *ne);
        MT_CHECK_ALLOC(ne, "store extent table");
        s->ext = ne;
    }
    s->ext[s->next] = (store_extent_t){.file = file, .offset = f->end, .bytes = bytes};
    *extent = s->next++;
    f->end += span;
    s->reserved += span;
    return MT_OK;
}

/* The requests of every op's span, split at request_bytes. */
static int make_requests(mt_store_t *s, const mt_store_op_t *ops, int n, bool write) {
    int count = 0;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1 && count > s->req_cap) {
            free(s->reqs);
            free(s->req_op);
            s->reqs = malloc((size_t)count * sizeof *s->reqs);
            s->req_op = malloc((size_t)count * sizeof *s->req_op);
            MT_CHECK(s->reqs && s->req_op, "out of memory for a store batch of %d requests", count);
            s->req_cap = count;
        }
        int k = 0;
        for (int i = 0; i < n; i++) {
            const store_extent_t *e = &s->ext[ops[i].extent];
            const uint64_t span = mt_store_span_bytes(e->bytes);
            for (uint64_t at = 0; at < span; at += s->req_bytes, k++) {
                if (pass == 0) continue;
                const uint64_t len = span - at < s->req_bytes ? span - at : s->req_bytes;
                s->reqs[k] = (mt_sio_req_t){.fd = s->files[e->file].fd, .write = write, .offset = e->offset + at,
                                            .bytes = (size_t)len, .buf = (char *)ops[i].buf + at};
                s->req_op[k] = i;
            }
        }
        count = k;
    }
    return count;
}

static mt_status_t io_failed(mt_store_t *s, const mt_sio_req_t *r, const mt_store_op_t *op, bool write,
                             mt_error_t *err) {
    const store_extent_t *e = &s->ext[op->extent];
    return mt_error_set(err, MT_ERR_IO, "%s: %s of %zu bytes at offset %" PRIu64 " failed: %s",
                        s->files[e->file].path, write ? "write" : "read", r->bytes, r->offset,
                        strerror((int)-r->result));
}

static store_trailer_t make_trailer(const mt_store_t *s, int extent, uint64_t gen, uint32_t crc) {
    const store_extent_t *e = &s->ext[extent];
    store_trailer_t t;
    memset(&t, 0, sizeof t);
    memcpy(t.magic, TRAILER_MAGIC, 8);
    t.run_id = s->id;
    t.file = (uint32_t)e->file;
    t.extent = (uint32_t)extent;
    t.offset = e->offset;
    t.bytes = e->bytes;
    t.gen = gen;
    t.data_crc = crc;
    t.self_crc = mt_crc32c(0, &t, offsetof(store_trailer_t, self_crc));
    return t;
}

static char *trailer_at(const mt_store_t *s, const mt_store_op_t *op) {
    return (char *)op->buf + mt_store_span_bytes(s->ext[op->extent].bytes) - MT_SIO_ALIGN;
}

/* A batch in flight: per op its requests left, and the first failure of
 * the work the hooks do while other requests are in flight. */
typedef struct {
    mt_store_t *s;
    const mt_store_op_t *ops;
    int *left;      /* per op: requests not completed yet */
    uint32_t *crc;  /* per op: the CRC32C written */
    mt_status_t st;
    mt_error_t *err;
} batch_t;

static mt_status_t check_extent(const mt_store_t *s, const mt_store_op_t *op, mt_error_t *err);

/* Before an op's first request goes out: its checksum and trailer. */
static void write_before(void *ctx, int req) {
    batch_t *b = ctx;
    mt_store_t *s = b->s;
    const int i = s->req_op[req];
    if (req > 0 && s->req_op[req - 1] == i) return;
    const store_extent_t *e = &s->ext[b->ops[i].extent];
    b->crc[i] = mt_crc32c(0, b->ops[i].buf, e->bytes);
    const store_trailer_t t = make_trailer(s, b->ops[i].extent, e->gen + 1, b->crc[i]);
    char *tb = trailer_at(s, &b->ops[i]);
    memset(tb, 0, MT_SIO_ALIGN);
    memcpy(tb, &t, sizeof t);
}

/* After an op's last request has landed: its check. */
static void read_after(void *ctx, int req) {
    batch_t *b = ctx;
    const int i = b->s->req_op[req];
    if (--b->left[i] > 0 || b->st != MT_OK) return;
    b->st = check_extent(b->s, &b->ops[i], b->err);
}

static mt_status_t run_batch(mt_store_t *s, const mt_store_op_t *ops, int n, bool write, mt_error_t *err) {
    const int count = make_requests(s, ops, n, write);
    batch_t b = {.s = s, .ops = ops, .st = MT_OK, .err = err};
    b.left = calloc((size_t)(n > 0 ? n : 1), sizeof *b.left);
    b.crc = calloc((size_t)(n > 0 ? n : 1), sizeof *b.crc);
    MT_CHECK(b.left && b.crc, "out of memory for a store batch");
    for (int k = 0; k < count; k++) b.left[s->req_op[k]]++;
    const mt_sio_hooks_t hooks = {&b, write ? write_before : NULL, write ? NULL : read_after};
    const int bad = mt_sio_run_hooked(s->io, s->reqs, count, &hooks);
    mt_status_t st = b.st;
    if (bad >= 0) {
        st = io_failed(s, &s->reqs[bad], &ops[s->req_op[bad]], write, err);
    } else if (write) {
        for (int i = 0; i < n; i++) {
            s->ext[ops[i].extent].gen++;
            s->ext[ops[i].extent].crc = b.crc[i];
        }
    }
    free(b.left);
    free(b.crc);
    return st;
}

mt_status_t mt_store_write(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err) {
    return run_batch(s, ops, n, true, err);
}

/* What op's buffer holds, against what this run last wrote there. */
static mt_status_t check_extent(const mt_store_t *s, const mt_store_op_t *op, mt_error_t *err) {
    const store_extent_t *e = &s->ext[op->extent];
    const char *path = s->files[e->file].path;
    store_trailer_t t;
    memcpy(&t, trailer_at(s, op), sizeof t);
    const uint64_t at = e->offset;
    if (memcmp(t.magic, TRAILER_MAGIC, 8) != 0 || t.self_crc != mt_crc32c(0, &t, offsetof(store_trailer_t, self_crc)))
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " (%" PRIu64 " bytes) has no valid trailer: the "
                            "file was corrupted or overwritten",
                            path, at, e->bytes);
    if (t.run_id != s->id)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " was written by another run (id %016" PRIx64
                            "), not this one (id %016" PRIx64 ")",
                            path, at, t.run_id, s->id);
    if (t.offset != at || t.bytes != e->bytes || t.extent != (uint32_t)op->extent || t.file != (uint32_t)e->file)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " holds the data of offset %" PRIu64 " (%" PRIu64
                            " bytes); expected %" PRIu64 " bytes",
                            path, at, t.offset, t.bytes, e->bytes);
    if (t.gen != e->gen)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " is stale: write %" PRIu64 " of it, expected %" PRIu64,
                            path, at, t.gen, e->gen);
    const uint32_t crc = mt_crc32c(0, op->buf, e->bytes);
    if (crc != t.data_crc || crc != e->crc)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " (%" PRIu64 " bytes) fails its checksum: CRC32C "
                            "%08x read, %08x written",
                            path, at, e->bytes, crc, e->crc);
    return MT_OK;
}

mt_status_t mt_store_read(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err) {
    for (int i = 0; i < n; i++)
        if (s->ext[ops[i].extent].gen == 0)
            return mt_error_set(err, MT_ERR_INTERNAL, "%s: the extent at offset %" PRIu64 " is read before any write",
                                s->files[s->ext[ops[i].extent].file].path, s->ext[ops[i].extent].offset);
    return run_batch(s, ops, n, false, err);
}
