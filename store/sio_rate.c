/* A directory's raw O_DIRECT rates (see sio_rate.h).  Rates are bytes moved
 * over wall time. */
#include "store/sio_rate.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/clock.h"

/* Sequential I/O of `bytes` on fd in whole requests at io's queue depth;
 * bytes/s, or 0 with *st set. */
static double raw_pass(mt_sio_t *io, int fd, uint64_t bytes, bool write, void *buf, mt_error_t *err,
                       mt_status_t *st) {
    const int n = (int)(bytes / MT_SIO_RATE_REQ);
    const int qd = mt_sio_queue_depth(io);
    mt_sio_req_t *r = calloc((size_t)(n > 0 ? n : 1), sizeof *r);
    MT_CHECK_ALLOC(r, "raw requests");
    for (int i = 0; i < n; i++)
        r[i] = (mt_sio_req_t){.fd = fd, .write = write, .offset = (uint64_t)i * MT_SIO_RATE_REQ,
                              .bytes = MT_SIO_RATE_REQ, .buf = (char *)buf + (size_t)(i % qd) * MT_SIO_RATE_REQ};
    const double t0 = mt_now_s();
    const int bad = mt_sio_run(io, r, n);
    const double dt = mt_now_s() - t0;
    if (bad >= 0)
        *st = mt_error_set(err, MT_ERR_IO, "raw %s at offset %" PRIu64 " failed: %s", write ? "write" : "read",
                           r[bad].offset, strerror((int)-r[bad].result));
    free(r);
    return bad < 0 && dt > 0 ? (double)n * MT_SIO_RATE_REQ / dt : 0;
}

mt_status_t mt_sio_measure_dir(const char *dir, uint64_t bytes, int queue_depth, mt_sio_kind_t kind,
                               mt_sio_rates_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    bytes = (bytes + MT_SIO_RATE_REQ - 1) / MT_SIO_RATE_REQ * MT_SIO_RATE_REQ;
    if (bytes == 0) bytes = MT_SIO_RATE_REQ;
    if (queue_depth < 1) queue_depth = 1;
    char path[4200];
    snprintf(path, sizeof path, "%s/moetune-raw-rate-%ld.bin", dir, (long)getpid());
    const int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0) return mt_error_set(err, MT_ERR_IO, "%s: cannot create with O_DIRECT: %s", path, strerror(errno));
    mt_sio_t *one = NULL, *many = NULL;
    mt_status_t st = mt_sio_open(&one, kind, 1, err);
    if (st == MT_OK) st = mt_sio_open(&many, kind, queue_depth, err);
    void *buf = mt_sio_buffer_alloc((size_t)queue_depth * MT_SIO_RATE_REQ);
    MT_CHECK_ALLOC(buf, "raw buffers");
    memset(buf, 0x5a, (size_t)queue_depth * MT_SIO_RATE_REQ);
    if (st == MT_OK && posix_fallocate(fd, 0, (off_t)bytes) != 0)
        st = mt_error_set(err, MT_ERR_IO, "%s: cannot allocate %" PRIu64 " bytes", path, bytes);
    if (st == MT_OK) out->write_1 = raw_pass(one, fd, bytes, true, buf, err, &st);
    if (st == MT_OK) out->write_q = raw_pass(many, fd, bytes, true, buf, err, &st);
    if (st == MT_OK) out->read_1 = raw_pass(one, fd, bytes, false, buf, err, &st);
    if (st == MT_OK) out->read_q = raw_pass(many, fd, bytes, false, buf, err, &st);
    if (st != MT_OK) mt_error_prefix(err, "%s: ", path);
    mt_sio_buffer_free(buf);
    mt_sio_close(one);
    mt_sio_close(many);
    close(fd);
    unlink(path);
    return st;
}
