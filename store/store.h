/* The NVMe tier's store: scratch files of one run in a user-given
 * directory, opened O_DIRECT, read and written in large aligned requests
 * with several in flight (store/sio.h: io_uring, or pread/pwrite where it
 * is forbidden).  It knows nothing of models: a file holds extents, an
 * extent is bytes the caller writes whole and reads whole.
 *
 * Safety, because these files outlive a killed run:
 *   - each run gets a random 64-bit id and its own subdirectory
 *     DIR/moetune-<id>/ holding a lock file (its pid, flock held while the
 *     run lives); mt_store_close removes it all;
 *   - mt_store_open removes other runs' subdirectories whose lock is not
 *     held (their run was killed) and never touches a live run's;
 *   - every file starts with a 4 KiB header naming the run id, and every
 *     extent ends with a 4 KiB trailer: run id, file, offset, length,
 *     write generation and the CRC32C of the data; a read checks all of
 *     them against what this run wrote, so a corrupted, stale or foreign
 *     extent is an error (MT_ERR_IO: the file could not be read back as
 *     written) naming the file and offset, never a wrong value;
 *   - planned bytes are checked at open against the budget and the free
 *     space of the filesystem (statvfs), and space is allocated when an
 *     extent is reserved (fallocate), so running out is an error at
 *     set-up naming the directory and both sizes; a write that still fails
 *     (ENOSPC, EIO) is an error naming the file.
 *
 * Buffers: a read or write of an extent of `bytes` uses a caller buffer of
 * mt_store_buffer_bytes(bytes), aligned to MT_SIO_ALIGN (mt_sio_buffer_alloc,
 * or a slab of the caller's own pinned pool): the data at its start, the
 * store's trailer after it, so reads land in the caller's memory with no
 * copy.
 *
 * Batches run in the background: mt_store_submit_read/_write hand a batch
 * to the store's I/O thread and return a ticket at once, mt_store_wait
 * waits for it and gives its status.  Up to MT_STORE_MAX_BATCHES are in
 * flight together, sharing the one queue depth, and the next batch's
 * requests queue behind the current one's, so the queue does not drain at
 * a batch boundary.  Batches start in submission order, except that a
 * read starts before writes not yet started (its caller waits on it, as
 * the optimizer on its read-ahead), a write passed by one read at most;
 * the refusals below keep a read from passing a write of its extents.
 * The CRC32C and the trailer of a write are made on the
 * I/O thread as its extent's last request is queued, and a read's checks
 * run there as each extent lands; the caller's thread does neither.  This
 * is what lets one thread read block b+1 and write block b-1 back while it
 * updates block b.
 *
 * Threading: one caller thread at a time per store (the caller
 * serialises); every call may come while batches are in flight, including
 * mt_store_file_add and mt_store_reserve.  The store's own I/O thread is
 * internal and touches only what a batch was given. */
#ifndef MT_STORE_STORE_H
#define MT_STORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "store/sio.h"

typedef struct {
    const char *dir;        /* the user's directory (must exist); the run's subdirectory goes inside */
    uint64_t budget;        /* bytes this run may place there; 0: only the free space limits it */
    uint64_t planned_bytes; /* what the caller will reserve (mt_store_span_bytes of each extent) */
    int queue_depth;        /* requests in flight; 0: 8 */
    size_t request_bytes;   /* request size; 0: 1 MiB (an extent's last request up to 1.25 times it) */
    mt_sio_kind_t io;       /* MT_SIO_AUTO by default */
} mt_store_opts_t;

typedef struct mt_store mt_store_t;

/* Removes leftovers of killed runs in o->dir, checks the planned bytes, and
 * makes this run's subdirectory. */
mt_status_t mt_store_open(mt_store_t **out, const mt_store_opts_t *o, mt_error_t *err);
/* Finishes the batches in flight, then closes and removes this run's
 * files and subdirectory. */
void mt_store_close(mt_store_t *s);

const char *mt_store_io_name(const mt_store_t *s);  /* "io_uring" or "pread/pwrite" */
const char *mt_store_run_dir(const mt_store_t *s);
uint64_t mt_store_run_id(const mt_store_t *s);
int mt_store_leftovers_removed(const mt_store_t *s); /* killed runs' subdirectories removed at open */
uint64_t mt_store_reserved_bytes(const mt_store_t *s);

/* Bytes of disk an extent of `bytes` takes (data rounded up, trailer). */
uint64_t mt_store_span_bytes(uint64_t bytes);
/* Bytes of the aligned buffer a read or write of such an extent needs. */
size_t mt_store_buffer_bytes(uint64_t bytes);

/* A new file NAME (letters, digits, '-', '_', '.') in the run's subdirectory;
 * *file is its index. */
mt_status_t mt_store_file_add(mt_store_t *s, const char *name, int *file, mt_error_t *err);
/* An extent of `bytes` at the end of file `file`, its space allocated now;
 * *extent is its index.  Past the budget or the disk: an error. */
mt_status_t mt_store_reserve(mt_store_t *s, int file, uint64_t bytes, int *extent, mt_error_t *err);
uint64_t mt_store_extent_bytes(const mt_store_t *s, int extent);
bool mt_store_extent_written(const mt_store_t *s, int extent);

typedef struct {
    int extent;
    void *buf; /* mt_store_buffer_bytes(extent's bytes), aligned; the data at its start */
} mt_store_op_t;

/* Writes each op's extent from its buffer (the trailer is filled in there);
 * all requests of the batch are in flight together up to the queue depth.
 * mt_store_submit_write then mt_store_wait. */
mt_status_t mt_store_write(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err);
/* Reads each op's extent into its buffer and checks it (see the note above).
 * mt_store_submit_read then mt_store_wait. */
mt_status_t mt_store_read(mt_store_t *s, const mt_store_op_t *ops, int n, mt_error_t *err);

enum { MT_STORE_MAX_BATCHES = 4 }; /* batches submitted and not waited for, at most */

typedef uint64_t mt_store_ticket_t; /* a batch in flight; 0 is none */

/* Starts the batch mt_store_write / mt_store_read would run and returns at
 * once with *ticket set.  The ops array is copied; the buffers are not:
 * until mt_store_wait of the ticket returns, the caller must not touch a
 * buffer of the batch (a write's is read, and its trailer filled, on the
 * I/O thread; a read's is being filled).  Refused (MT_ERR_INTERNAL, *ticket
 * 0, nothing to wait for, nothing claimed): MT_STORE_MAX_BATCHES already
 * in flight (naming the directory); an extent read before any write; an
 * extent that a batch in flight (or this one) writes; a write of an
 * extent that a batch in flight reads (the two would race on the disk);
 * the extent ones name the file and offset.  Batches of different extents
 * may complete in any order; a read may start before older writes (see
 * the note at the top). */
mt_status_t mt_store_submit_write(mt_store_t *s, const mt_store_op_t *ops, int n, mt_store_ticket_t *ticket,
                                  mt_error_t *err);
mt_status_t mt_store_submit_read(mt_store_t *s, const mt_store_op_t *ops, int n, mt_store_ticket_t *ticket,
                                 mt_error_t *err);
/* Waits for the batch and returns its status with the same checks and
 * messages as mt_store_read / mt_store_write.  Every ticket is to be
 * waited for once, a failed batch's and those after it included, in any
 * order; a ticket not in flight is MT_ERR_INTERNAL.  A write's extents
 * count as written (a later read expects this write) only when its wait
 * returns MT_OK.  mt_store_close finishes batches never waited for. */
mt_status_t mt_store_wait(mt_store_t *s, mt_store_ticket_t ticket, mt_error_t *err);
/* Batches submitted and not waited for. */
int mt_store_in_flight(const mt_store_t *s);

/* The path of file `file` (for messages and tests). */
const char *mt_store_file_path(const mt_store_t *s, int file);

#endif
