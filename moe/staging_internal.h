/* State of the staging pool shared by staging.c (regions, backpressure,
 * counters, timeline), staging_xfer.c (batched copies) and staging_pack.c
 * (host-side jobs, the pack threads).  Calls among them go one way:
 * staging_xfer.c calls the other two, staging.c calls staging_pack.c (to
 * start and stop the threads), staging_pack.c calls neither.  Private to
 * moe/staging. */
#ifndef MT_MOE_STAGING_INTERNAL_H
#define MT_MOE_STAGING_INTERNAL_H

#include <pthread.h>

#include "moe/staging.h"
#include "moe/staging_alloc.h"

/* Pack threads (staging_pack_start): one beside the CPU backend; on a GPU's
 * host up to this many, one per 2 cores. */
#define STAGING_MAX_PACK_THREADS 16

typedef enum { REC_FREE = 0, REC_HELD, REC_PENDING } staging_rec_state_t;

/* One reservation. */
typedef struct {
    staging_rec_state_t state;
    int where;          /* compact: slab; max_slot: slot; per_tensor: -1 */
    size_t off;         /* compact: offset in the slab */
    size_t size;        /* bytes counted in use (aligned / page or pow2 block / slot) */
    size_t payload;     /* bytes requested */
    void *host;
    kern_event_t *ev;   /* pending: fires when the reading work is done */
    kern_stream_t *stream;
    int next_free;
} staging_rec_t;

/* per_tensor: a pinned block, live or cached for reuse. */
typedef struct {
    void *p;
    size_t size;
} staging_block_t;

/* A list of host memcpys (H2D packing, run on the pack threads or inline),
 * cut into pieces of at most STAGING_PACK_PIECE bytes that pack threads
 * take one at a time. */
typedef struct staging_pack_job {
    struct staging_pack_job *next;
    struct moe_staging *pool;
    int n, cap;
    struct {
        void *dst;
        const void *src;
        size_t bytes;
        moe_staging_op_t op;
        size_t room; /* MOE_STAGING_READ: the aligned room at dst the read fills (0: none there, it
                      * reads into a buffer of its own and copies the bytes over) */
    } *cp;
    int taken, finished; /* pieces handed to pack threads, and done; under pool->lock */
    bool done;           /* under pool->lock */
} staging_pack_job_t;

struct moe_staging {
    kern_device_t *dev;
    moe_staging_opts_t o;
    char label[64];
    size_t capacity, align;
    double t0;

    /* compact */
    int nslabs;
    void **slab;
    size_t *slab_bytes;
    moe_salloc_t *alloc;
    /* max_slot */
    int nslots;
    size_t slot_bytes;
    void *slot_mem;
    bool *slot_busy;
    /* per_tensor: cached free blocks */
    staging_block_t *cache;
    int ncache, cap_cache;

    size_t reserved, in_use, payload;
    staging_rec_t *rec;
    int nrec, cap_rec, free_rec;
    int *pend; /* record ids in release order */
    int npend, cap_pend;
    kern_event_t **evs; /* recycled events */
    int nevs, cap_evs;
    kern_event_t *follow; /* one stream waiting for another (staging_xfer.c); a wait takes the
                           * event's state when it is issued, so one event serves every such wait */

    moe_staging_stats_t st[2]; /* [MOE_STAGING_SCOPE_STEP], [..._TOTAL] */
    int32_t step;
    bool waiting;
    moe_staging_timeline_t tl;

    /* pack thread and host-side timing (pack_s is written by other threads) */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    pthread_t threads[STAGING_MAX_PACK_THREADS];
    int nthreads;
    bool thread_on, stopping;
    staging_pack_job_t *qhead, *qtail;
    double pack_s;
};

double staging_now(void);
/* Reserves without waiting; false when no space is free now.  Errors only
 * for requests that can never fit. */
mt_status_t staging_try_reserve(moe_staging_t *pool, size_t bytes, const char *tag, moe_staging_region_t *out,
                                bool *got, mt_error_t *err);
/* Compact: a region of at least `min` and at most `want` bytes (the largest
 * free block when no block holds `want`, if it is at least `accept`).
 * Waits under backpressure like moe_staging_reserve. */
mt_status_t staging_reserve_flex(moe_staging_t *pool, size_t min, size_t want, size_t accept, const char *tag,
                                 bool may_wait, moe_staging_region_t *out, bool *got, mt_error_t *err);
/* Compact: gives the tail of a region back (keeps align_up(keep)) and sets
 * its payload (the bytes of the tensors packed into it). */
void staging_shrink(moe_staging_t *pool, moe_staging_region_t *r, size_t keep, size_t payload);
/* Waits for the oldest pending release (counted as a wait); false when nothing is pending. */
bool staging_wait_one(moe_staging_t *pool);
size_t staging_largest_slab(const moe_staging_t *pool);
void staging_count_copy(moe_staging_t *pool, int dir, size_t bytes);
void staging_count_tensors(moe_staging_t *pool, int dir, int n);

/* staging_pack.c: the pack threads, and jobs, which are built by adding
 * pieces and then handed over (the two calls below take the job). */
void staging_pack_start(moe_staging_t *pool);
void staging_pack_stop(moe_staging_t *pool);
staging_pack_job_t *staging_job_new(moe_staging_t *pool);
void staging_job_add(staging_pack_job_t *j, void *dst, const void *src, size_t bytes, moe_staging_op_t op);
/* A MOE_STAGING_READ item's piece: req reads its bytes into dst, straight
 * into `room` aligned bytes there, or (room 0) through a buffer. */
void staging_job_add_read(staging_pack_job_t *j, void *dst, moe_staging_read_t *req, size_t bytes, size_t room);
void staging_job_free(staging_pack_job_t *j);
/* H2D: the job is packed before the copies issued on `stream` after this
 * call: queued to the pack threads with the stream held until it is done,
 * or packed here when there are none. */
void staging_pack_before(moe_staging_t *pool, kern_stream_t *stream, staging_pack_job_t *j);
/* D2H: the job unpacks into the pageable destinations as a host function
 * on `stream`, after the copies issued before this call. */
void staging_unpack_after(moe_staging_t *pool, kern_stream_t *stream, staging_pack_job_t *j);

#endif
