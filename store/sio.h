/* The store's I/O engine: runs a batch of aligned O_DIRECT requests with up
 * to queue_depth of them in flight, through io_uring (liburing) where the
 * kernel allows it, else through pread/pwrite one at a time.
 *
 * One thread of the engine's own submits the requests and reaps their
 * completions, so a caller can start a batch, compute, and wait for it
 * later (mt_sio_submit / mt_sio_wait); several batches share the one queue
 * depth.  With pread/pwrite that thread runs the requests one at a time.
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

/* Batches an engine holds at once: submitted and not yet waited for. */
enum { MT_SIO_MAX_BATCHES = 8 };

/* An engine with up to queue_depth (1..256) requests in flight, and its I/O
 * thread (see mt_sio_submit). */
mt_status_t mt_sio_open(mt_sio_t **out, mt_sio_kind_t kind, int queue_depth, mt_error_t *err);
/* Waits for every batch still in flight, then stops the thread. */
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
 * may be NULL.  Both run on the engine's I/O thread, one call at a time. */
typedef struct {
    void *ctx;
    void (*before)(void *ctx, int req);
    void (*after)(void *ctx, int req);
} mt_sio_hooks_t;

/* mt_sio_run with hooks (NULL: none). */
int mt_sio_run_hooked(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks);

/* The same batch in the background: the engine's I/O thread feeds the
 * requests of the submitted batches to the queue a batch after another (a
 * batch's requests queue behind the previous batch's, so the queue stays
 * full across batches) and runs the hooks.  Batches start in submission
 * order, except that one submitted `ahead` starts before older batches
 * not yet started that were not: a batch waits so behind at most one
 * batch submitted after it.  The engine does not know what requests
 * touch: submit `ahead` only a batch that may pass the ones before it.
 * Returns the batch's ticket (> 0), or 0 when MT_SIO_MAX_BATCHES are
 * already submitted and not waited for.  reqs, the buffers they name and
 * the hooks' context belong to the engine until mt_sio_wait of the ticket
 * returns.  Submit and wait come from one thread at a time. */
uint64_t mt_sio_submit(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks, bool ahead);
/* Waits for batch `ticket` (each ticket once, in any order); returns what
 * mt_sio_run returns. */
int mt_sio_wait(mt_sio_t *io, uint64_t ticket);
/* mt_sio_wait, also saying when the I/O thread started the batch (handed
 * its first request on) and finished it, as numbers of one count of such
 * events since open (0: never, for an empty batch): the order batches ran
 * in, for tests. */
int mt_sio_wait_traced(mt_sio_t *io, uint64_t ticket, uint64_t *started, uint64_t *finished);
/* For tests: while held, the I/O thread starts no batch (one started goes
 * on), so batches can be queued behind each other deterministically;
 * mt_sio_close releases it. */
void mt_sio_hold(mt_sio_t *io, bool hold);

/* A zeroed buffer of bytes rounded up to MT_SIO_ALIGN, aligned to it (NULL
 * when the host is out of memory); freed with mt_sio_buffer_free. */
void *mt_sio_buffer_alloc(size_t bytes);
void mt_sio_buffer_free(void *buf);

#endif
