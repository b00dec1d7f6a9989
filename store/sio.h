/* The store's I/O engine: runs a batch of aligned O_DIRECT requests with up
 * to queue_depth of them in flight, through io_uring (liburing) where the
 * kernel allows it, else through pread/pwrite one at a time.
 *
 * Containers often forbid io_uring (seccomp, kernel.io_uring_disabled):
 * mt_sio_open with MT_SIO_AUTO tries a ring first and falls back, and
 * mt_sio_name says which one runs, so a bench or a run can print it.
 * Requests know nothing of the store's layout: a file descriptor, an
 * offset, a length and a buffer, all multiples of MT_SIO_ALIGN. */
#ifndef MT_STORE_SIO_H
#define MT_STORE_SIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

enum { MT_SIO_ALIGN = 4096 }; /* offsets, lengths and buffers of O_DIRECT requests */

typedef enum {
    MT_SIO_AUTO,  /* io_uring when a ring can be made, else pread/pwrite */
    MT_SIO_URING, /* io_uring or an error */
    MT_SIO_PSYNC, /* pread/pwrite, one request at a time */
} mt_sio_kind_t;

typedef struct {
    int fd;
    bool write;
    uint64_t offset;
    size_t bytes;
    void *buf;
    int64_t result; /* set by mt_sio_run: bytes done (== bytes), or -errno; a short transfer
                       is continued, and one that makes no progress is -EIO */
} mt_sio_req_t;

typedef struct mt_sio mt_sio_t;

/* An engine with up to queue_depth (1..256) requests in flight. */
mt_status_t mt_sio_open(mt_sio_t **out, mt_sio_kind_t kind, int queue_depth, mt_error_t *err);
void mt_sio_close(mt_sio_t *io);
/* "io_uring" or "pread/pwrite" */
const char *mt_sio_name(const mt_sio_t *io);
int mt_sio_queue_depth(const mt_sio_t *io);
/* Runs every request of reqs (in submission order, up to the queue depth
 * at once) and sets each one's result; returns the index of the first
 * failed request, or -1 when all succeeded. */
int mt_sio_run(mt_sio_t *io, mt_sio_req_t *reqs, int n);

/* Work the caller does while other requests are in flight: before(ctx, i)
 * runs just before request i is first submitted (fill what it writes),
 * after(ctx, i) once it has completed whole (check what it read).  Either
 * may be NULL. */
typedef struct {
    void *ctx;
    void (*before)(void *ctx, int req);
    void (*after)(void *ctx, int req);
} mt_sio_hooks_t;

/* mt_sio_run with hooks (NULL: none). */
int mt_sio_run_hooked(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks);

/* A zeroed buffer of bytes rounded up to MT_SIO_ALIGN, aligned to it (NULL
 * when the host is out of memory); freed with mt_sio_buffer_free. */
void *mt_sio_buffer_alloc(size_t bytes);
void mt_sio_buffer_free(void *buf);

#endif
