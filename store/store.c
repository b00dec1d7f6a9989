/* The store (see store.h): its run directory, files and extents.  An
 * extent's disk span is its data rounded up to MT_SIO_ALIGN and one aligned
 * trailer block.  Batches, trailers and checks are store_batch.c's. */
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

#include "store/rundir.h"
#include "store/store_internal.h"

#define HEADER_MAGIC "MTSTOREF"

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
    mt_sio_close(s->io); /* first: it finishes the batches still in flight, which use the files */
    for (int i = 0; i < s->nfiles; i++) {
        close(s->files[i]->fd);
        free(s->files[i]);
    }
    if (s->lock_fd >= 0) {
        store_rundir_remove(s->dir); /* the lock goes with it, still held until the close below */
        close(s->lock_fd);
    }
    free(s->files);
    free(s->ext);
    for (int k = 0; k < MT_STORE_MAX_BATCHES; k++) {
        store_batch_t *b = &s->batch[k];
        free(b->ops);
        free(b->reqs);
        free(b->req_op);
        free(b->left);
    }
    free(s);
}

const char *mt_store_io_name(const mt_store_t *s) { return mt_sio_name(s->io); }
const char *mt_store_run_dir(const mt_store_t *s) { return s->dir; }
uint64_t mt_store_run_id(const mt_store_t *s) { return s->id; }
int mt_store_leftovers_removed(const mt_store_t *s) { return s->leftovers; }
uint64_t mt_store_reserved_bytes(const mt_store_t *s) { return s->reserved; }
uint64_t mt_store_extent_bytes(const mt_store_t *s, int extent) { return s->ext[extent].bytes; }
bool mt_store_extent_written(const mt_store_t *s, int extent) { return s->ext[extent].gen > 0; }
const char *mt_store_file_path(const mt_store_t *s, int file) { return s->files[file]->path; }

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
    store_file_t **nf = realloc(s->files, (size_t)(s->nfiles + 1) * sizeof *nf);
    MT_CHECK_ALLOC(nf, "store file table");
    s->files = nf;
    store_file_t *f = calloc(1, sizeof *f);
    MT_CHECK_ALLOC(f, "store file");
    snprintf(f->path, sizeof f->path, "%s/%s", s->dir, name);
    f->fd = open(f->path, O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (f->fd < 0) {
        const int e = errno;
        char path[sizeof f->path];
        memcpy(path, f->path, sizeof path);
        free(f);
        if (e == EINVAL)
            return mt_error_set(err, MT_ERR_UNSUPPORTED,
                                "%s: the filesystem does not support O_DIRECT (tmpfs?); the store needs a directory "
                                "on a disk",
                                path);
        return mt_error_set(err, MT_ERR_IO, "%s: cannot create: %s", path, strerror(e));
    }
    s->files[s->nfiles++] = f;
    *file = s->nfiles - 1;
    return write_header(s, f, name, err);
}

mt_status_t mt_store_reserve(mt_store_t *s, int file, uint64_t bytes, int *extent, mt_error_t *err) {
    MT_CHECK(file >= 0 && file < s->nfiles, "store file %d of %d", file, s->nfiles);
    store_file_t *f = s->files[file];
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

