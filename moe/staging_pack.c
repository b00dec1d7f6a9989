/* The staging pool's host-side work (see staging_internal.h): jobs of
 * memcpys, conversions and gradient adds between pageable memory and
 * staging, and the pack threads that run H2D jobs ahead of their copies.
 *
 * A file of its own so that calls among the pool's files go one way:
 * staging.c starts and stops the pack threads, staging_xfer.c builds jobs
 * and hands them over here, and this file calls neither (it only reads
 * and counts into the pool's state under its lock). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "moe/staging_internal.h"
#include "base/clock.h"
#include "base/dtype.h"

staging_pack_job_t *staging_job_new(moe_staging_t *p) {
    staging_pack_job_t *j = calloc(1, sizeof *j);
    MT_CHECK_ALLOC(j, "staging pack job");
    j->pool = p;
    return j;
}

static void job_add_piece(staging_pack_job_t *j, void *dst, const void *src, size_t bytes, moe_staging_op_t op,
                          size_t room) {
    if (j->n == j->cap) {
        j->cap = j->cap ? 2 * j->cap : 16;
        j->cp = realloc(j->cp, (size_t)j->cap * sizeof *j->cp);
        MT_CHECK_ALLOC(j->cp, "staging pack job");
    }
    j->cp[j->n].dst = dst;
    j->cp[j->n].src = src;
    j->cp[j->n].bytes = bytes;
    j->cp[j->n].op = op;
    j->cp[j->n].room = room;
    j->n++;
}

/* Pieces of at most this many bytes (of dst for a conversion, whose fp32
 * source is twice as long): a multiple of every element size. */
enum { STAGING_PACK_PIECE = 4 << 20 };

void staging_job_add(staging_pack_job_t *j, void *dst, const void *src, size_t bytes, moe_staging_op_t op) {
    const size_t src_per_dst = op == MOE_STAGING_F32_TO_BF16 ? 2 : 1;
    for (size_t off = 0; off < bytes; off += STAGING_PACK_PIECE) {
        const size_t k = bytes - off < STAGING_PACK_PIECE ? bytes - off : STAGING_PACK_PIECE;
        job_add_piece(j, (char *)dst + off, (const char *)src + off * src_per_dst, k, op, 0);
    }
}

void staging_job_add_read(staging_pack_job_t *j, void *dst, moe_staging_read_t *req, size_t bytes, size_t room) {
    job_add_piece(j, dst, req, bytes, MOE_STAGING_READ, room); /* one read, whole */
}

void staging_job_free(staging_pack_job_t *j) {
    free(j->cp);
    free(j);
}

/* dst += src as floats, element by element (the executor's host gradient
 * add: same order, same rounding). */
static void add_f32(void *dst, const void *src, size_t bytes) {
    const size_t n = bytes / sizeof(float);
    if (((uintptr_t)dst | (uintptr_t)src) % _Alignof(float) == 0) {
        float *d = dst;
        const float *s = src;
        for (size_t k = 0; k < n; k++) d[k] += s[k];
        return;
    }
    for (size_t k = 0; k < n; k++) { /* unaligned: through memcpy, same arithmetic */
        float a, b;
        memcpy(&a, (char *)dst + k * sizeof a, sizeof a);
        memcpy(&b, (const char *)src + k * sizeof b, sizeof b);
        a += b;
        memcpy((char *)dst + k * sizeof a, &a, sizeof a);
    }
}

/* A read item's bytes, read straight into staging where the layout gave it
 * aligned room; where it did not (a slot or slab just the item's size), into
 * an aligned buffer first. */
static void read_piece(const staging_pack_job_t *j, int k) {
    moe_staging_read_t *req = (moe_staging_read_t *)j->cp[k].src;
    if (j->cp[k].room) {
        req->read(req, j->cp[k].dst, j->cp[k].room);
        return;
    }
    void *buf = aligned_alloc(MOE_STAGING_READ_ALIGN, req->room);
    MT_CHECK(buf, "out of host memory for a %zu-byte read into staging", req->room);
    req->read(req, buf, req->room);
    memcpy(j->cp[k].dst, buf, j->cp[k].bytes);
    free(buf);
}

static void piece_run(const staging_pack_job_t *j, int k) {
    if (j->cp[k].op == MOE_STAGING_READ) read_piece(j, k);
    else if (j->cp[k].op == MOE_STAGING_ADD_F32) add_f32(j->cp[k].dst, j->cp[k].src, j->cp[k].bytes);
    else if (j->cp[k].op == MOE_STAGING_F32_TO_BF16)
        mt_convert_from_f32(j->cp[k].dst, MT_BF16, j->cp[k].src, j->cp[k].bytes / 2);
    else memcpy(j->cp[k].dst, j->cp[k].src, j->cp[k].bytes);
}

static double job_run(staging_pack_job_t *j) {
    const double t0 = mt_now_s();
    for (int k = 0; k < j->n; k++) piece_run(j, k);
    return mt_now_s() - t0;
}

/* Pack threads take the pieces of the job at the head of the queue one at
 * a time, so several pack one job (a streamed layer's weights arrive as
 * one job of hundreds of MB); the job leaves the queue when its last piece
 * is taken and is done when every piece is.  Each copy waits for its own
 * job only (wait_job_fn), so jobs may finish in any order. */
static void *pack_main(void *arg) {
    moe_staging_t *p = arg;
    kern_device_pin_host_thread(p->dev); /* host work: off the compute cores */
    pthread_mutex_lock(&p->lock);
    for (;;) {
        while (!p->qhead && !p->stopping) pthread_cond_wait(&p->cond, &p->lock);
        staging_pack_job_t *j = p->qhead;
        if (!j) break; /* stopping with an empty queue */
        const int k = j->taken++;
        if (j->taken >= j->n) {
            p->qhead = j->next;
            if (!p->qhead) p->qtail = NULL;
        }
        double dt = 0;
        if (k < j->n) {
            pthread_mutex_unlock(&p->lock);
            const double t0 = mt_now_s();
            piece_run(j, k);
            dt = mt_now_s() - t0;
            pthread_mutex_lock(&p->lock);
            j->finished++;
        }
        p->st[0].pack_s += dt;
        p->st[1].pack_s += dt;
        if (j->finished >= j->n && !j->done) {
            j->done = true;
            pthread_cond_broadcast(&p->cond);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return NULL;
}

/* One pack thread beside the CPU backend, whose host work shares the
 * machine with its compute threads (and which calibration measures that
 * way).  A GPU's host cores are otherwise idle there, and conversion, not
 * the link, bounds a streamed layer: on a 16-core H200 host four threads
 * converted a Mixtral-8x7B layer's fp32 masters to bf16 (2.9 GB out) in
 * about 490 ms, nine times its 55 ms copy.  So half the host's cores, up
 * to STAGING_MAX_PACK_THREADS; the other half stay with the host optimizer,
 * which runs beside the packing of other layers. */
int moe_staging_default_pack_threads(bool async_kernels, long cores) {
    if (!async_kernels) return 1;
    const int n = cores > 0 ? (int)(cores / 2) : 1;
    return n < 1 ? 1 : n > STAGING_MAX_PACK_THREADS ? STAGING_MAX_PACK_THREADS : n;
}

static int pack_threads_for(const moe_staging_t *p) {
    if (p->o.pack_threads > 0)
        return p->o.pack_threads < STAGING_MAX_PACK_THREADS ? p->o.pack_threads : STAGING_MAX_PACK_THREADS;
    return moe_staging_default_pack_threads(kern_device_caps(p->dev).kernels_async, sysconf(_SC_NPROCESSORS_ONLN));
}

void staging_pack_start(moe_staging_t *p) {
    p->stopping = false;
    const int n = pack_threads_for(p);
    for (p->nthreads = 0; p->nthreads < n; p->nthreads++)
        MT_CHECK(pthread_create(&p->threads[p->nthreads], NULL, pack_main, p) == 0,
                 "cannot start a staging pack thread");
    p->thread_on = true;
}

void staging_pack_stop(moe_staging_t *p) {
    if (!p->thread_on) return;
    pthread_mutex_lock(&p->lock);
    p->stopping = true;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i < p->nthreads; i++) pthread_join(p->threads[i], NULL);
    p->nthreads = 0;
    p->thread_on = false;
}

/* Host-side pack time, counted in both scopes (pack threads add theirs
 * under the lock as they go). */
static void add_pack_time(moe_staging_t *p, double secs) {
    pthread_mutex_lock(&p->lock);
    p->st[0].pack_s += secs;
    p->st[1].pack_s += secs;
    pthread_mutex_unlock(&p->lock);
}

/* Host function on the H2D stream: holds the stream until the job is packed. */
static void wait_job_fn(void *arg) {
    staging_pack_job_t *j = arg;
    moe_staging_t *p = j->pool;
    pthread_mutex_lock(&p->lock);
    while (!j->done) pthread_cond_wait(&p->cond, &p->lock);
    pthread_mutex_unlock(&p->lock);
    staging_job_free(j);
}

/* Hands the job to the pack threads (behind the jobs queued before it). */
static void enqueue_job(moe_staging_t *p, staging_pack_job_t *j) {
    pthread_mutex_lock(&p->lock);
    if (p->qtail) p->qtail->next = j;
    else p->qhead = j;
    p->qtail = j;
    pthread_cond_broadcast(&p->cond);
    pthread_mutex_unlock(&p->lock);
}

/* Host function on the unpack stream: unpacks into the pageable destinations,
 * on the pack threads where they run (a streamed layer's gradients are
 * gigabytes: one thread took about half a second per Mixtral-8x7B layer),
 * holding that stream until they are done.  Each piece is its own range, so
 * a gradient add gives the same bits on any thread. */
static void unpack_fn(void *arg) {
    staging_pack_job_t *j = arg;
    moe_staging_t *p = j->pool;
    if (!p->thread_on) {
        add_pack_time(p, job_run(j));
        staging_job_free(j);
        return;
    }
    enqueue_job(p, j);
    wait_job_fn(j);
}

void staging_pack_before(moe_staging_t *p, kern_stream_t *stream, staging_pack_job_t *j) {
    if (!p->thread_on) {
        add_pack_time(p, job_run(j));
        staging_job_free(j);
        return;
    }
    enqueue_job(p, j);
    kern_launch_host_fn(p->dev, stream, wait_job_fn, j);
}

void staging_unpack_after(moe_staging_t *p, kern_stream_t *stream, staging_pack_job_t *j) {
    kern_launch_host_fn(p->dev, stream, unpack_fn, j);
}
