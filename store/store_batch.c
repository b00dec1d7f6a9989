/* The store's batches (see store.h): a batch of extents goes to the I/O
 * engine as one list of requests of about request_bytes, so many tensors
 * of a few MB keep the queue full, and up to MT_STORE_MAX_BATCHES of them
 * are in flight at once.  The work on the data runs in the engine's hooks,
 * on its I/O thread, while other requests are in flight: a write's CRC32C
 * and trailer as its extent's last request (the one holding the trailer)
 * is queued, so the extent's first requests are already on their way; a
 * read's checks as its extent's last request lands.  The hooks see only
 * the batch (a copy of what they need of each extent), never the store's
 * tables, which the caller may grow meanwhile. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "store/crc32c.h"
#include "store/store.h"
#include "store/store_internal.h"
#include "store/store_testing.h"

#define TRAILER_MAGIC "MTSTORE1"

/* The first bytes of an extent's trailer block (the rest is zero). */
typedef struct {
    char magic[8];
    uint64_t run_id;
    uint32_t file, extent;
    uint64_t offset, bytes, gen;
    uint32_t data_crc;
    uint32_t self_crc; /* of the fields above */
} store_trailer_t;

/* Two per-item tables of a batch slot, grown together to hold `want`
 * (their contents are not kept: a slot is refilled whole per batch). */
static void grow2(void **a, size_t ea, void **b, size_t eb, int *cap, int want) {
    if (want <= *cap) return;
    free(*a);
    free(*b);
    *a = malloc((size_t)want * ea);
    *b = malloc((size_t)want * eb);
    MT_CHECK(*a && *b, "out of memory for a store batch of %d", want);
    *cap = want;
}

/* The length of the request at `at` of a span: req_bytes, or the rest of
 * the span when that is at most a quarter more.  The rest of an extent is
 * often its data's tail and the 4 KiB trailer: on its own it would take a
 * queue slot for a few KB, and the bytes in flight are what keeps a disk
 * busy while the I/O thread waits for a CPU. */
static uint64_t request_len(uint64_t span, uint64_t at, size_t req_bytes) {
    const uint64_t rest = span - at;
    return rest <= req_bytes + req_bytes / 4 ? rest : req_bytes;
}

/* The requests of every op's span, split at about req_bytes. */
static void make_requests(store_batch_t *b, size_t req_bytes) {
    int count = 0;
    for (int i = 0; i < b->n; i++) {
        const uint64_t span = mt_store_span_bytes(b->ops[i].bytes);
        for (uint64_t at = 0; at < span; at += request_len(span, at, req_bytes)) count++;
    }
    grow2((void **)&b->reqs, sizeof *b->reqs, (void **)&b->req_op, sizeof *b->req_op, &b->cap_reqs, count);
    int k = 0;
    for (int i = 0; i < b->n; i++) {
        const store_op_t *o = &b->ops[i];
        const uint64_t span = mt_store_span_bytes(o->bytes);
        b->left[i] = 0;
        for (uint64_t at = 0, len; at < span; at += len, k++) {
            len = request_len(span, at, req_bytes);
            b->reqs[k] = (mt_sio_req_t){.fd = o->file->fd, .write = b->write, .offset = o->offset + at,
                                        .bytes = (size_t)len, .buf = (char *)o->buf + at};
            b->req_op[k] = i;
            b->left[i]++;
        }
    }
    b->count = k;
}

static char *trailer_at(const store_op_t *o) { return (char *)o->buf + mt_store_span_bytes(o->bytes) - MT_SIO_ALIGN; }

static store_trailer_t make_trailer(const store_batch_t *b, const store_op_t *o) {
    store_trailer_t t;
    memset(&t, 0, sizeof t);
    memcpy(t.magic, TRAILER_MAGIC, 8);
    t.run_id = b->run_id;
    t.file = (uint32_t)o->file_index;
    t.extent = (uint32_t)o->extent;
    t.offset = o->offset;
    t.bytes = o->bytes;
    t.gen = o->gen;
    t.data_crc = o->crc;
    t.self_crc = mt_crc32c(0, &t, offsetof(store_trailer_t, self_crc));
    return t;
}

/* What op's buffer holds, against what this run last wrote there. */
static mt_status_t check_extent(const store_batch_t *b, const store_op_t *o, mt_error_t *err) {
    const char *path = o->file->path;
    store_trailer_t t;
    memcpy(&t, trailer_at(o), sizeof t);
    const uint64_t at = o->offset;
    if (memcmp(t.magic, TRAILER_MAGIC, 8) != 0 || t.self_crc != mt_crc32c(0, &t, offsetof(store_trailer_t, self_crc)))
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " (%" PRIu64 " bytes) has no valid trailer: the "
                            "file was corrupted or overwritten",
                            path, at, o->bytes);
    if (t.run_id != b->run_id)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " was written by another run (id %016" PRIx64
                            "), not this one (id %016" PRIx64 ")",
                            path, at, t.run_id, b->run_id);
    if (t.offset != at || t.bytes != o->bytes || t.extent != (uint32_t)o->extent || t.file != (uint32_t)o->file_index)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " holds the data of offset %" PRIu64 " (%" PRIu64
                            " bytes); expected %" PRIu64 " bytes",
                            path, at, t.offset, t.bytes, o->bytes);
    if (t.gen != o->gen)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " is stale: write %" PRIu64 " of it, expected %" PRIu64,
                            path, at, t.gen, o->gen);
    const uint32_t crc = mt_crc32c(0, o->buf, o->bytes);
    if (crc != t.data_crc || crc != o->crc)
        return mt_error_set(err, MT_ERR_IO,
                            "%s: the extent at offset %" PRIu64 " (%" PRIu64 " bytes) fails its checksum: CRC32C "
                            "%08x read, %08x written",
                            path, at, o->bytes, crc, o->crc);
    return MT_OK;
}

/* Before an op's last request (the one holding its trailer) goes out: the
 * checksum of its data and the trailer.  Its earlier requests are in
 * flight meanwhile; they only read the buffer, as the checksum does. */
static void write_before(void *ctx, int req) {
    store_batch_t *b = ctx;
    const int i = b->req_op[req];
    if (req + 1 < b->count && b->req_op[req + 1] == i) return;
    store_op_t *o = &b->ops[i];
    o->crc = mt_crc32c(0, o->buf, o->bytes);
    const store_trailer_t t = make_trailer(b, o);
    char *tb = trailer_at(o);
    memset(tb, 0, MT_SIO_ALIGN);
    memcpy(tb, &t, sizeof t);
}

/* After an op's last request has landed: its check. */
static void read_after(void *ctx, int req) {
    store_batch_t *b = ctx;
    const int i = b->req_op[req];
    if (--b->left[i] > 0 || b->st != MT_OK) return;
    b->st = check_extent(b, &b->ops[i], &b->err);
}

/* Marks ops' extents busy for a batch, or refuses (marks undone). */
static mt_status_t claim(mt_store_t *s, const mt_store_op_t *ops, int n, bool write, mt_error_t *err) {
    for (int i = 0; i < n; i++) {
        mt_status_t st = MT_OK;
        const int x = ops[i].extent;
        if (x < 0 || x >= s->next) {
            st = mt_error_set(err, MT_ERR_INTERNAL, "store extent %d of a batch: the store has %d", x, s->next);
        } else {
            store_extent_t *e = &s->ext[x];
            const char *path = s->files[e->file]->path;
            if (e->busy < 0 || (write && e->busy > 0))
                st = mt_error_set(err, MT_ERR_INTERNAL,
                                  "%s: the extent at offset %" PRIu64 " is %s by a batch in flight (or twice in this "
                                  "one): wait for that batch before this %s",
                                  path, e->offset, e->busy < 0 ? "written" : "read", write ? "write" : "read");
            else if (!write && e->gen == 0)
                st = mt_error_set(err, MT_ERR_INTERNAL, "%s: the extent at offset %" PRIu64 " is read before any write",
                                  path, e->offset);
            else
                e->busy = write ? -1 : e->busy + 1;
        }
        if (st != MT_OK) {
            for (int j = 0; j < i; j++) {
                store_extent_t *e = &s->ext[ops[j].extent];
                e->busy = write ? 0 : e->busy - 1;
            }
            return st;
        }
    }
    return MT_OK;
}

static mt_status_t submit(mt_store_t *s, const mt_store_op_t *ops, int n, bool write, mt_store_ticket_t *ticket,
                          mt_error_t *err) {
    *ticket = 0;
    if (n < 0) return mt_error_set(err, MT_ERR_INTERNAL, "a store batch of %d ops", n);
    store_batch_t *b = NULL;
    for (int k = 0; k < MT_STORE_MAX_BATCHES && !b; k++)
        if (s->batch[k].ticket == 0) b = &s->batch[k];
    if (!b)
        return mt_error_set(err, MT_ERR_INTERNAL,
                            "%s: %d store batches are in flight already: wait for one before submitting another",
                            s->dir, MT_STORE_MAX_BATCHES);
    const mt_status_t st = claim(s, ops, n, write, err);
    if (st != MT_OK) return st;
    grow2((void **)&b->ops, sizeof *b->ops, (void **)&b->left, sizeof *b->left, &b->cap_ops, n > 0 ? n : 1);
    for (int i = 0; i < n; i++) {
        const store_extent_t *e = &s->ext[ops[i].extent];
        b->ops[i] = (store_op_t){.file = s->files[e->file], .file_index = e->file, .extent = ops[i].extent,
                                 .buf = ops[i].buf, .offset = e->offset, .bytes = e->bytes,
                                 .gen = write ? e->gen + 1 : e->gen, .crc = e->crc};
    }
    b->n = n;
    b->write = write;
    b->st = MT_OK;
    b->run_id = s->id;
    make_requests(b, s->req_bytes);
    const mt_sio_hooks_t hooks = {b, write ? write_before : NULL, write ? NULL : read_after};
    /* A read goes ahead of writes not yet started: its caller is waiting
     * for it, a write's is not yet.  It cannot pass a write of its own
     * extents: claim() refuses a read of an extent while a batch in flight,
     * started or queued, writes it, and a write of one a batch reads. */
    b->sio_ticket = mt_sio_submit(s->io, b->reqs, b->count, &hooks, !write);
    MT_CHECK(b->sio_ticket != 0, "the I/O engine has no room for a store batch");
    b->ticket = ++s->next_ticket; /* from 1: 0 is no ticket */
    *ticket = b->ticket;
    return MT_OK;
}

mt_status_t mt_store_submit_write(mt_store_t *s, const mt_store_op_t *ops, int n, mt_store_ticket_t *ticket,
                                  mt_error_t *err) {
    return submit(s, ops, n, true, ticket, err);
}

mt_status_t mt_store_submit_read(mt_store_t *s, const mt_store_op_t *ops, int n, mt_store_ticket_t *ticket,
                                 mt_error_t *err) {
    return submit(s, ops, n, false, ticket, err);
}

mt_status_t mt_store_wait(mt_store_t *s, mt_store_ticket_t ticket, mt_error_t *err) {
    store_batch_t *b = NULL;
    for (int k = 0; k < MT_STORE_MAX_BATCHES && !b; k++)
        if (ticket != 0 && s->batch[k].ticket == ticket) b = &s->batch[k];
    if (!b)
        return mt_error_set(err, MT_ERR_INTERNAL,
                            "%s: store batch %" PRIu64 " is not in flight (already waited for, or never submitted)",
                            s->dir, ticket);
    const int bad = mt_sio_wait_traced(s->io, b->sio_ticket, &b->started, &b->finished);
    mt_status_t st = b->st;
    if (bad >= 0) {
        const mt_sio_req_t *r = &b->reqs[bad];
        st = mt_error_set(err, MT_ERR_IO, "%s: %s of %zu bytes at offset %" PRIu64 " failed: %s",
                          b->ops[b->req_op[bad]].file->path, b->write ? "write" : "read", r->bytes, r->offset,
                          strerror((int)-r->result));
    } else if (st != MT_OK) {
        if (err) *err = b->err;
    }
    for (int i = 0; i < b->n; i++) {
        store_extent_t *e = &s->ext[b->ops[i].extent];
        if (b->write && st == MT_OK) {
            e->gen = b->ops[i].gen;
            e->crc = b->ops[i].crc;
        }
        e->busy = b->write ? 0 : e->busy - 1;
    }
    b->ticket = 0;
    return st;
}

int mt_store_in_flight(const mt_store_t *s) {
    int n = 0;
    for (int k = 0; k < MT_STORE_MAX_BATCHES; k++) n += s->batch[k].ticket != 0;
    return n;
}

void mt_store_hold_io(mt_store_t *s, bool hold) { mt_sio_hold(s->io, hold); }

mt_status_t mt_store_wait_traced(mt_store_t *s, mt_store_ticket_t ticket, uint64_t *started, uint64_t *finished,
                                 mt_error_t *err) {
    const store_batch_t *b = NULL;
    for (int k = 0; k < MT_STORE_MAX_BATCHES && !b; k++)
        if (ticket != 0 && s->batch[k].ticket == ticket) b = &s->batch[k];
    const mt_status_t st = mt_store_wait(s, ticket, err);
    *started = b ? b->started : 0;
    *finished = b ? b->finished : 0;
    return st;
}

mt_status_t mt_store_write(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err) {
    mt_store_ticket_t t;
    const mt_status_t st = mt_store_submit_write(s, ops, n, &t, err);
    return st != MT_OK ? st : mt_store_wait(s, t, err);
}

mt_status_t mt_store_read(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err) {
    mt_store_ticket_t t;
    const mt_status_t st = mt_store_submit_read(s, ops, n, &t, err);
    return st != MT_OK ? st : mt_store_wait(s, t, err);
}
