/* The store's I/O engine (see sio.h).  With io_uring, the batch is fed to
 * the ring as slots free up: at most queue_depth submissions are
 * outstanding, each completion carries its request's index in user_data,
 * and a short transfer is resubmitted for its remainder.  Without it,
 * pread/pwrite in a loop. */
#include "store/sio.h"

#include <errno.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct mt_sio {
    mt_sio_kind_t kind; /* URING or PSYNC: what runs */
    int qd;
    struct io_uring ring;
    size_t *done; /* per request of the running batch: bytes transferred so far */
    int done_cap;
};

mt_status_t mt_sio_open(mt_sio_t **out, mt_sio_kind_t kind, int queue_depth, mt_error_t *err) {
    *out = NULL;
    if (queue_depth < 1 || queue_depth > 256)
        return mt_error_set(err, MT_ERR_CONFIG, "I/O queue depth %d: expected 1..256", queue_depth);
    mt_sio_t *io = calloc(1, sizeof *io);
    if (!io) return mt_error_set(err, MT_ERR_NOMEM, "out of memory for the I/O engine");
    io->qd = queue_depth;
    io->kind = MT_SIO_PSYNC;
    if (kind != MT_SIO_PSYNC) {
        const int rc = io_uring_queue_init((unsigned)queue_depth, &io->ring, 0);
        if (rc == 0) {
            io->kind = MT_SIO_URING;
        } else if (kind == MT_SIO_URING) {
            free(io);
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "io_uring is not available here (%s)", strerror(-rc));
        }
    }
    *out = io;
    return MT_OK;
}

void mt_sio_close(mt_sio_t *io) {
    if (!io) return;
    if (io->kind == MT_SIO_URING) io_uring_queue_exit(&io->ring);
    free(io->done);
    free(io);
}

const char *mt_sio_name(const mt_sio_t *io) { return io->kind == MT_SIO_URING ? "io_uring" : "pread/pwrite"; }

int mt_sio_queue_depth(const mt_sio_t *io) { return io->kind == MT_SIO_URING ? io->qd : 1; }

static int run_psync(mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *h) {
    int first = -1;
    for (int i = 0; i < n; i++) {
        mt_sio_req_t *r = &reqs[i];
        if (h && h->before) h->before(h->ctx, i);
        size_t done = 0;
        r->result = 0;
        while (done < r->bytes) {
            char *b = (char *)r->buf + done;
            const off_t off = (off_t)(r->offset + done);
            const ssize_t k = r->write ? pwrite(r->fd, b, r->bytes - done, off) : pread(r->fd, b, r->bytes - done, off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                r->result = k < 0 ? -errno : -EIO;
                break;
            }
            done += (size_t)k;
        }
        if (r->result == 0) r->result = (int64_t)done;
        if (r->result < 0 && first < 0) first = i;
        if (r->result >= 0 && h && h->after) h->after(h->ctx, i);
    }
    return first;
}

static void prep(mt_sio_t *io, mt_sio_req_t *reqs, int i) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    mt_sio_req_t *r = &reqs[i];
    const size_t d = io->done[i];
    if (r->write) io_uring_prep_write(sqe, r->fd, (char *)r->buf + d, (unsigned)(r->bytes - d), r->offset + d);
    else io_uring_prep_read(sqe, r->fd, (char *)r->buf + d, (unsigned)(r->bytes - d), r->offset + d);
    io_uring_sqe_set_data64(sqe, (uint64_t)i);
}

static int run_uring(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *h) {
    if (n > io->done_cap) {
        free(io->done);
        io->done = malloc((size_t)n * sizeof *io->done);
        MT_CHECK_ALLOC(io->done, "I/O batch table");
        io->done_cap = n;
    }
    memset(io->done, 0, (size_t)n * sizeof *io->done);
    int next = 0, inflight = 0, first = -1;
    while (next < n || inflight > 0) {
        int queued = 0;
        while (next < n && inflight < io->qd) {
            reqs[next].result = 0;
            if (h && h->before) h->before(h->ctx, next);
            prep(io, reqs, next++);
            inflight++;
            queued++;
        }
        (void)queued;
        struct io_uring_cqe *cqe;
        /* submits what was prepared (new requests and remainders of short ones) */
        int rc = io_uring_submit_and_wait(&io->ring, 1);
        if (rc == -EINTR) continue;
        MT_CHECK(rc >= 0, "io_uring submit/wait failed: %s", strerror(-rc));
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&io->ring, head, cqe) {
            seen++;
            const int i = (int)io_uring_cqe_get_data64(cqe);
            mt_sio_req_t *r = &reqs[i];
            inflight--;
            if (cqe->res < 0 || cqe->res == 0) {
                r->result = cqe->res < 0 ? cqe->res : -EIO;
                if (first < 0 || i < first) first = i;
                continue;
            }
            io->done[i] += (size_t)cqe->res;
            if (io->done[i] < r->bytes) {
                prep(io, reqs, i); /* the remainder of a short transfer */
                inflight++;
            } else {
                r->result = (int64_t)r->bytes;
                if (h && h->after) h->after(h->ctx, i);
            }
        }
        io_uring_cq_advance(&io->ring, seen);
    }
    return first;
}

int mt_sio_run_hooked(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks) {
    if (n <= 0) return -1;
    return io->kind == MT_SIO_URING ? run_uring(io, reqs, n, hooks) : run_psync(reqs, n, hooks);
}

int mt_sio_run(mt_sio_t *io, mt_sio_req_t *reqs, int n) { return mt_sio_run_hooked(io, reqs, n, NULL); }

void *mt_sio_buffer_alloc(size_t bytes) {
    const size_t n = (bytes + MT_SIO_ALIGN - 1) / MT_SIO_ALIGN * MT_SIO_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, MT_SIO_ALIGN, n ? n : MT_SIO_ALIGN) != 0) return NULL;
    memset(p, 0, n ? n : MT_SIO_ALIGN);
    return p;
}

void mt_sio_buffer_free(void *buf) { free(buf); }
