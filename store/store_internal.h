/* The store's tables, shared by store.c (files, extents, open and close)
 * and store_batch.c (batches in flight, trailers and checks); internal to
 * the store. */
#ifndef MT_STORE_STORE_INTERNAL_H
#define MT_STORE_STORE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "store/sio.h"
#include "store/store.h"

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
    int busy;      /* batches in flight on it: readers (> 0) or one writer (-1) */
} store_extent_t;

/* What a batch's I/O thread work needs of one op, copied at submit so that
 * the caller may add files and extents (moving the tables) meanwhile. */
typedef struct {
    const store_file_t *file; /* files are allocated one by one: the pointer stays */
    int file_index, extent;
    void *buf;
    uint64_t offset, bytes;
    uint64_t gen;  /* a write: the generation it writes; a read: the one expected */
    uint32_t crc;  /* a write: the CRC32C written (set on the I/O thread); a read: the one expected */
} store_op_t;

/* A batch submitted and not waited for yet. */
typedef struct {
    mt_store_ticket_t ticket; /* 0: the slot is free */
    uint64_t sio_ticket;
    bool write;
    int n, count;       /* ops, requests */
    store_op_t *ops;    /* n */
    mt_sio_req_t *reqs; /* count */
    int *req_op;        /* per request: its op */
    int *left;          /* per op: requests not completed yet */
    int cap_ops, cap_reqs;
    mt_status_t st;     /* the first failed check (set on the I/O thread) */
    mt_error_t err;
    uint64_t run_id;    /* the I/O thread's copy: it reads nothing else of the store */
    uint64_t started, finished; /* when the I/O thread ran it (mt_sio_wait_traced), set by the wait */
} store_batch_t;

struct mt_store {
    mt_sio_t *io;
    uint64_t id;
    char dir[4096];
    int lock_fd;
    int leftovers;
    uint64_t budget, reserved;
    size_t req_bytes;
    store_file_t **files;
    int nfiles;
    store_extent_t *ext;
    int next, cap_ext;
    store_batch_t batch[MT_STORE_MAX_BATCHES];
    mt_store_ticket_t next_ticket;
};

#endif
