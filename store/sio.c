/* The store's I/O engine (see sio.h).  One thread of the engine's own does
 * all the I/O, so the caller's thread only hands batches over and waits:
 *
 *   - with io_uring, that thread alone touches the ring.  It feeds the
 *     requests of the submitted batches, one batch after another in the
 *     order pick() gives, as slots free up: at most queue_depth are
 *     outstanding, each completion carries its
 *     batch slot and request index in user_data, and a short transfer is
 *     resubmitted for its remainder.  A poll on an eventfd stays armed in
 *     the ring beside them, so a submit (or close) wakes a thread that is
 *     blocked waiting for completions;
 *   - without it, the thread runs each batch's requests through
 *     pread/pwrite one at a time, a batch at a time in the same order.
 *
 * The order is by batch: a batch once started has all its requests handed
 * on before another starts (so the queue does not drain at a boundary),
 * and the next to start is the oldest batch submitted `ahead` (the
 * store's reads, which a caller waits on) before older batches that were
 * not, unless one of those has already been passed by an `ahead` batch:
 * then the oldest goes first.  A batch so waits behind at most one batch
 * submitted after it (SIO_MAX_PASSED), however many `ahead` batches come.
 * The engine knows nothing of what the requests touch: whoever submits
 * `ahead` vouches that it may pass the batches before it (the store
 * refuses a read of an extent while a write of it is in flight).
 *
 * A batch slot is FREE, QUEUED (the I/O thread owns its progress fields)
 * or DONE (the waiter may read its result); the state moves under the
 * mutex, so the waiter sees everything the I/O thread and the hooks wrote. */
#include "store/sio.h"

#include <errno.h>
#include <liburing.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

enum { SLOT_FREE, SLOT_QUEUED, SLOT_DONE };

enum { SIO_MAX_PASSED = 1 }; /* `ahead` batches one batch may be passed by */

#define WAKE_DATA UINT64_MAX /* user_data of the eventfd's poll */

typedef struct {
    int state;
    uint64_t ticket;
    mt_sio_req_t *reqs;
    int n;
    mt_sio_hooks_t hooks; /* zeroed: none */
    bool ahead;           /* may start before older batches (see the note above) */
    int passed;           /* `ahead` batches started before this one, though younger */
    uint64_t started, finished; /* when the I/O thread started / finished it, in io->events */
    /* the I/O thread's progress through the batch */
    int next;     /* requests handed to the queue so far */
    int inflight; /* outstanding in the ring */
    int first;    /* lowest failed request, -1: none yet */
    size_t *done; /* per request: bytes transferred so far (io_uring) */
    int done_cap;
} sio_batch_t;

struct mt_sio {
    mt_sio_kind_t kind; /* URING or PSYNC: what runs */
    int qd;
    struct io_uring ring;
    int wake_fd; /* eventfd the ring polls (io_uring only) */
    pthread_t thread;
    bool thread_started;
    pthread_mutex_t mu;
    pthread_cond_t work; /* a batch was submitted or the engine closes (pread/pwrite) */
    pthread_cond_t done; /* a batch finished */
    bool stop;
    bool held;       /* start no batch (mt_sio_hold, for tests) */
    uint64_t events; /* batch starts and finishes so far, for mt_sio_wait_traced */
    uint64_t next_ticket;
    sio_batch_t slot[MT_SIO_MAX_BATCHES];
};

static void *io_thread(void *arg);

mt_status_t mt_sio_open(mt_sio_t **out, mt_sio_kind_t kind, int queue_depth, mt_error_t *err) {
    *out = NULL;
    if (queue_depth < 1 || queue_depth > 256)
        return mt_error_set(err, MT_ERR_CONFIG, "I/O queue depth %d: expected 1..256", queue_depth);
    mt_sio_t *io = calloc(1, sizeof *io);
    if (!io) return mt_error_set(err, MT_ERR_NOMEM, "out of memory for the I/O engine");
    io->qd = queue_depth;
    io->kind = MT_SIO_PSYNC;
    io->wake_fd = -1;
    io->next_ticket = 1;
    pthread_mutex_init(&io->mu, NULL);
    pthread_cond_init(&io->work, NULL);
    pthread_cond_init(&io->done, NULL);
    if (kind != MT_SIO_PSYNC) {
        /* one entry more than the depth: the wake-up poll */
        int rc = io_uring_queue_init((unsigned)queue_depth + 1, &io->ring, 0);
        if (rc == 0) {
            io->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
            if (io->wake_fd < 0) {
                rc = -errno;
                io_uring_queue_exit(&io->ring);
            } else {
                io->kind = MT_SIO_URING;
            }
        }
        if (rc != 0 && kind == MT_SIO_URING) {
            mt_sio_close(io);
            return mt_error_set(err, MT_ERR_UNSUPPORTED, "io_uring is not available here (%s)", strerror(-rc));
        }
    }
    const int rc = pthread_create(&io->thread, NULL, io_thread, io);
    if (rc != 0) {
        mt_sio_close(io);
        return mt_error_set(err, MT_ERR_NOMEM, "cannot start the I/O thread: %s", strerror(rc));
    }
    io->thread_started = true;
    *out = io;
    return MT_OK;
}

/* Tells the I/O thread to look at the slots again. */
static void wake(mt_sio_t *io) {
    if (io->kind == MT_SIO_URING) {
        const uint64_t one = 1;
        ssize_t k;
        do k = write(io->wake_fd, &one, sizeof one);
        while (k < 0 && errno == EINTR);
        /* EAGAIN: the counter is full, so a wake-up is pending anyway */
    } else {
        pthread_cond_signal(&io->work);
    }
}

void mt_sio_close(mt_sio_t *io) {
    if (!io) return;
    if (io->thread_started) {
        pthread_mutex_lock(&io->mu);
        io->stop = true; /* the thread finishes what was submitted first */
        io->held = false;
        pthread_mutex_unlock(&io->mu);
        wake(io);
        pthread_join(io->thread, NULL);
    }
    if (io->kind == MT_SIO_URING) {
        io_uring_queue_exit(&io->ring);
        close(io->wake_fd);
    }
    for (int k = 0; k < MT_SIO_MAX_BATCHES; k++) free(io->slot[k].done);
    pthread_cond_destroy(&io->done);
    pthread_cond_destroy(&io->work);
    pthread_mutex_destroy(&io->mu);
    free(io);
}

const char *mt_sio_name(const mt_sio_t *io) { return io->kind == MT_SIO_URING ? "io_uring" : "pread/pwrite"; }

int mt_sio_queue_depth(const mt_sio_t *io) { return io->kind == MT_SIO_URING ? io->qd : 1; }

/* A batch's requests, one at a time, on the I/O thread. */
static void run_psync(sio_batch_t *b) {
    const mt_sio_hooks_t *h = &b->hooks;
    for (int i = 0; i < b->n; i++) {
        mt_sio_req_t *r = &b->reqs[i];
        if (h->before) h->before(h->ctx, i);
        size_t done = 0;
        r->result = 0;
        while (done < r->bytes) {
            char *p = (char *)r->buf + done;
            const off_t off = (off_t)(r->offset + done);
            const ssize_t k = r->write ? pwrite(r->fd, p, r->bytes - done, off) : pread(r->fd, p, r->bytes - done, off);
            if (k < 0 && errno == EINTR) continue;
            if (k <= 0) {
                r->result = k < 0 ? -errno : -EIO;
                break;
            }
            done += (size_t)k;
        }
        if (r->result == 0) r->result = (int64_t)done;
        if (r->result < 0 && b->first < 0) b->first = i;
        if (r->result >= 0 && h->after) h->after(h->ctx, i);
    }
}

/* Whether a batch is QUEUED (under the mutex). */
static bool any_queued(const mt_sio_t *io) {
    for (int k = 0; k < MT_SIO_MAX_BATCHES; k++)
        if (io->slot[k].state == SLOT_QUEUED) return true;
    return false;
}

/* Whether `ahead` may start before every unstarted batch older than it,
 * and if so counts the pass on each (under the mutex). */
static bool may_pass(mt_sio_t *io, const sio_batch_t *ahead) {
    for (int pass = 0; pass < 2; pass++)
        for (int k = 0; k < MT_SIO_MAX_BATCHES; k++) {
            sio_batch_t *b = &io->slot[k];
            if (b->state != SLOT_QUEUED || b->next > 0 || b->ticket > ahead->ticket || b == ahead) continue;
            if (pass == 0 && b->passed >= SIO_MAX_PASSED) return false;
            if (pass == 1) b->passed++;
        }
    return true;
}

/* The QUEUED batch whose requests go to the queue next (see the note at
 * the top), or NULL when none has requests left to hand on or the engine
 * is held (under the mutex).  Marks a batch it starts. */
static sio_batch_t *pick(mt_sio_t *io) {
    sio_batch_t *cur = NULL, *first = NULL, *ahead = NULL;
    for (int k = 0; k < MT_SIO_MAX_BATCHES; k++) {
        sio_batch_t *b = &io->slot[k];
        if (b->state != SLOT_QUEUED || b->next >= b->n) continue;
        if (b->next > 0) cur = b; /* at most one: it is finished before another starts */
        if (!first || b->ticket < first->ticket) first = b;
        if (b->ahead && (!ahead || b->ticket < ahead->ticket)) ahead = b;
    }
    if (cur) return cur;
    if (!first || io->held) return NULL;
    sio_batch_t *b = ahead && ahead != first && may_pass(io, ahead) ? ahead : first;
    b->started = ++io->events;
    return b;
}

static void finish(mt_sio_t *io, sio_batch_t *b) {
    pthread_mutex_lock(&io->mu);
    b->state = SLOT_DONE;
    b->finished = ++io->events;
    pthread_cond_broadcast(&io->done);
    pthread_mutex_unlock(&io->mu);
}

static void psync_loop(mt_sio_t *io) {
    pthread_mutex_lock(&io->mu);
    for (;;) {
        sio_batch_t *b = pick(io);
        if (!b && io->stop && !any_queued(io)) break;
        if (!b) {
            pthread_cond_wait(&io->work, &io->mu);
            continue;
        }
        pthread_mutex_unlock(&io->mu);
        run_psync(b);
        b->next = b->n;
        finish(io, b);
        pthread_mutex_lock(&io->mu);
    }
    pthread_mutex_unlock(&io->mu);
}

static void prep(mt_sio_t *io, sio_batch_t *b, int i) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    MT_CHECK(sqe != NULL, "io_uring submission queue full with %d of %d in flight", b->inflight, io->qd);
    mt_sio_req_t *r = &b->reqs[i];
    const size_t d = b->done[i];
    if (r->write) io_uring_prep_write(sqe, r->fd, (char *)r->buf + d, (unsigned)(r->bytes - d), r->offset + d);
    else io_uring_prep_read(sqe, r->fd, (char *)r->buf + d, (unsigned)(r->bytes - d), r->offset + d);
    io_uring_sqe_set_data64(sqe, ((uint64_t)(b - io->slot) << 32) | (uint64_t)i);
    b->inflight++;
}

static void arm_wake(mt_sio_t *io) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    MT_CHECK(sqe != NULL, "io_uring submission queue full arming the wake-up poll");
    io_uring_prep_poll_add(sqe, io->wake_fd, POLLIN);
    io_uring_sqe_set_data64(sqe, WAKE_DATA);
}

/* One completion of a request: its result, its remainder, its hook.
 * Returns the requests that left the ring for good (0 or 1). */
static int complete(mt_sio_t *io, sio_batch_t *b, int i, int res) {
    mt_sio_req_t *r = &b->reqs[i];
    b->inflight--;
    if (res <= 0) {
        r->result = res < 0 ? res : -EIO;
        if (b->first < 0 || i < b->first) b->first = i;
        return 1;
    }
    b->done[i] += (size_t)res;
    if (b->done[i] < r->bytes) {
        prep(io, b, i); /* the remainder of a short transfer */
        return 0;
    }
    r->result = (int64_t)r->bytes;
    if (b->hooks.after) b->hooks.after(b->hooks.ctx, i);
    return 1;
}

/* Hands requests of the batches pick() gives to the ring up to the depth. */
static int feed(mt_sio_t *io, int inflight) {
    for (;;) {
        pthread_mutex_lock(&io->mu);
        sio_batch_t *b = inflight < io->qd ? pick(io) : NULL;
        pthread_mutex_unlock(&io->mu);
        if (!b) return inflight;
        while (b->next < b->n && inflight < io->qd) {
            const int i = b->next++;
            b->reqs[i].result = 0;
            if (b->hooks.before) b->hooks.before(b->hooks.ctx, i);
            prep(io, b, i);
            inflight++;
        }
    }
}

static void uring_loop(mt_sio_t *io) {
    int inflight = 0; /* requests of all batches in the ring, the poll aside */
    arm_wake(io);
    for (;;) {
        inflight = feed(io, inflight);
        pthread_mutex_lock(&io->mu);
        const bool quit = io->stop && !any_queued(io);
        pthread_mutex_unlock(&io->mu);
        if (quit) break;
        /* submits what was prepared (new requests, remainders, the poll) */
        const int rc = io_uring_submit_and_wait(&io->ring, 1);
        if (rc == -EINTR) continue;
        MT_CHECK(rc >= 0, "io_uring submit/wait failed: %s", strerror(-rc));
        struct io_uring_cqe *cqe;
        unsigned head, seen = 0;
        bool rearm = false;
        io_uring_for_each_cqe(&io->ring, head, cqe) {
            seen++;
            const uint64_t data = io_uring_cqe_get_data64(cqe);
            if (data == WAKE_DATA) {
                uint64_t v;
                (void)!read(io->wake_fd, &v, sizeof v);
                rearm = true;
                continue;
            }
            sio_batch_t *b = &io->slot[data >> 32];
            inflight -= complete(io, b, (int)(data & 0xffffffffu), cqe->res);
            if (b->next == b->n && b->inflight == 0) finish(io, b);
        }
        io_uring_cq_advance(&io->ring, seen);
        if (rearm) arm_wake(io);
    }
}

static void *io_thread(void *arg) {
    mt_sio_t *io = arg;
    if (io->kind == MT_SIO_URING) uring_loop(io);
    else psync_loop(io);
    return NULL;
}

uint64_t mt_sio_submit(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks, bool ahead) {
    pthread_mutex_lock(&io->mu);
    sio_batch_t *b = NULL;
    for (int k = 0; k < MT_SIO_MAX_BATCHES && !b; k++)
        if (io->slot[k].state == SLOT_FREE) b = &io->slot[k];
    if (!b) {
        pthread_mutex_unlock(&io->mu);
        return 0;
    }
    if (io->kind == MT_SIO_URING && n > b->done_cap) {
        free(b->done);
        b->done = malloc((size_t)n * sizeof *b->done);
        MT_CHECK_ALLOC(b->done, "I/O batch table");
        b->done_cap = n;
    }
    if (b->done) memset(b->done, 0, (size_t)b->done_cap * sizeof *b->done);
    b->ticket = io->next_ticket++;
    b->reqs = reqs;
    b->n = n > 0 ? n : 0;
    b->hooks = hooks ? *hooks : (mt_sio_hooks_t){0};
    b->ahead = ahead;
    b->passed = 0;
    b->started = b->finished = 0;
    b->next = 0;
    b->inflight = 0;
    b->first = -1;
    b->state = b->n ? SLOT_QUEUED : SLOT_DONE;
    const uint64_t t = b->ticket;
    pthread_mutex_unlock(&io->mu);
    if (n > 0) wake(io);
    return t;
}

int mt_sio_wait(mt_sio_t *io, uint64_t ticket) { return mt_sio_wait_traced(io, ticket, NULL, NULL); }

int mt_sio_wait_traced(mt_sio_t *io, uint64_t ticket, uint64_t *started, uint64_t *finished) {
    pthread_mutex_lock(&io->mu);
    sio_batch_t *b = NULL;
    for (int k = 0; k < MT_SIO_MAX_BATCHES && !b; k++)
        if (io->slot[k].state != SLOT_FREE && io->slot[k].ticket == ticket) b = &io->slot[k];
    MT_CHECK(b != NULL, "I/O batch %llu is not in flight (waited twice, or never submitted)",
             (unsigned long long)ticket);
    while (b->state != SLOT_DONE) pthread_cond_wait(&io->done, &io->mu);
    const int first = b->first;
    if (started) *started = b->started;
    if (finished) *finished = b->finished;
    b->state = SLOT_FREE;
    pthread_mutex_unlock(&io->mu);
    return first;
}

int mt_sio_run_hooked(mt_sio_t *io, mt_sio_req_t *reqs, int n, const mt_sio_hooks_t *hooks) {
    if (n <= 0) return -1;
    const uint64_t t = mt_sio_submit(io, reqs, n, hooks, false);
    MT_CHECK(t != 0, "%d I/O batches already in flight", MT_SIO_MAX_BATCHES);
    return mt_sio_wait(io, t);
}

int mt_sio_run(mt_sio_t *io, mt_sio_req_t *reqs, int n) { return mt_sio_run_hooked(io, reqs, n, NULL); }

void mt_sio_hold(mt_sio_t *io, bool hold) {
    pthread_mutex_lock(&io->mu);
    io->held = hold;
    pthread_mutex_unlock(&io->mu);
    if (!hold) wake(io);
}

void *mt_sio_buffer_alloc(size_t bytes) {
    const size_t n = (bytes + MT_SIO_ALIGN - 1) / MT_SIO_ALIGN * MT_SIO_ALIGN;
    void *p = NULL;
    if (posix_memalign(&p, MT_SIO_ALIGN, n ? n : MT_SIO_ALIGN) != 0) return NULL;
    memset(p, 0, n ? n : MT_SIO_ALIGN);
    return p;
}

void mt_sio_buffer_free(void *buf) { free(buf); }
