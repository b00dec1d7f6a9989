/* The staging pool: pinned host memory that every host<->device transfer
 * whose host side is pageable goes through (DESIGN.md, "compact staging
 * pool").
 *
 * Why.  Copies between the device and pageable memory are slow or
 * synchronous on CUDA, so data is staged through page-locked buffers.  How
 * those buffers are organised decides how much pinned memory a run needs:
 * ZeRO-Infinity's fixed slots are each as large as the largest tensor (an
 * embedding-sized slot for every 3 MB expert), PyTorch's pin_memory pins
 * each tensor separately (rounded to a power of two by its caching
 * allocator).  MoE models have hundreds of small expert tensors per layer,
 * so both waste most of their pinned bytes.  The pool here offers the
 * three layouts side by side so they can be measured against each other:
 *
 *  - MOE_STAGING_COMPACT: a few large slabs allocated once, sub-allocated
 *    with a small alignment (no power-of-two rounding).  A batch of tensors
 *    (a layer's active experts) is packed into one contiguous region, so
 *    it moves in one copy per contiguous device range.
 *  - MOE_STAGING_PER_TENSOR: every staged tensor pinned separately (freed
 *    blocks cached by exact size, or by power-of-two class with
 *    pow2_round, as PyTorch's CachingHostAllocator); one copy per tensor.
 *  - MOE_STAGING_MAX_SLOT: a fixed number of slots, each the size of the
 *    largest tensor; one tensor per slot, one copy per tensor.
 *
 * Lifetime of a region.  A reservation is released when the copy that
 * reads it (or the host function that unpacks it) has completed: the pool
 * records an event on that stream and frees the region lazily, once the
 * event has fired.  When no space is free, a reservation waits for the
 * oldest pending event (backpressure) instead of growing the pool; the wait
 * is counted and timed.  If nothing is pending (every byte is held by
 * reservations the caller has not handed back) the reservation fails with
 * MT_ERR_BUDGET rather than deadlocking.
 *
 * Threads.  One thread (the executor's issuing thread) calls the pool.  An
 * optional helper thread packs pageable sources into staging for H2D
 * batches so the host memcpy overlaps the copies already in flight; D2H
 * batches unpack on the unpack stream (KERN_STREAM_UNPACK) piece by piece
 * behind their copies, and the D2H stream waits for the last unpack at the
 * batch's end, so work recorded on that stream after a batch sees the
 * pageable destinations complete.
 *
 * Profiler.  Every change of reserved / in-use bytes and every wait is
 * sampled into a timeline (moe_staging_timeline); staging_report.h writes
 * it as CSV, SVG and Chrome-trace counters. */
#ifndef MT_MOE_STAGING_H
#define MT_MOE_STAGING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels/device.h"

typedef enum {
    MOE_STAGING_COMPACT = 0,
    MOE_STAGING_PER_TENSOR,
    MOE_STAGING_MAX_SLOT,
    MOE_STAGING_MODE_COUNT,
} moe_staging_mode_t;

/* "compact", "per_tensor", "max_slot" (the run config's staging.mode values). */
const char *moe_staging_mode_name(moe_staging_mode_t mode);
/* Parses a mode name; false when unknown. */
bool moe_staging_mode_parse(const char *name, moe_staging_mode_t *out);

typedef enum { MOE_STAGING_FIRST_FIT = 0, MOE_STAGING_BEST_FIT } moe_staging_fit_t;

#define MOE_STAGING_DEFAULT_ALIGN 256
#define MOE_STAGING_SLABS_AUTO (-1)
#define MOE_STAGING_AUTO_SLAB_MAX ((size_t)4 << 30)
#define MOE_STAGING_PAGE 4096

typedef struct {
    moe_staging_mode_t mode;
    /* Pinned bytes the pool may hold: the plan's in-flight window (see
     * moe_staging_plan_bytes).  Required (> 0). */
    size_t capacity_bytes;
    /* Upper bound from the run config (memory.pinned); 0 = none.  The
     * capacity is clamped to it; a cap below the largest tensor is an error. */
    size_t cap_bytes;
    /* Largest tensor that will be staged, embedding / lm_head included, and
     * its name for messages.  Required by max_slot (the slot size); checked
     * against slabs and the cap in every mode when non-zero. */
    size_t max_tensor_bytes;
    const char *max_tensor_name;
    /* compact: number of slabs (>= 1; MOE_STAGING_SLABS_AUTO, the default,
     * = one per MOE_STAGING_AUTO_SLAB_MAX bytes of capacity) and their size
     * (0 = split capacity_bytes among them, the first enlarged to hold the
     * largest tensor).  With slab_bytes set, capacity = num_slabs *
     * slab_bytes.  Fewer slabs fragment less (a batch never spans two);
     * several bound the size of one pinned allocation. */
    int num_slabs;
    size_t slab_bytes;
    size_t align;            /* compact sub-allocation alignment, power of two (default 256) */
    moe_staging_fit_t fit;   /* compact: first fit (default) or best fit */
    /* max_slot: number of slots (0 = capacity / slot size). */
    int num_slots;
    /* per_tensor: round each pinned block up to a power of two, as PyTorch's
     * CachingHostAllocator does (default false: page granularity only). */
    bool pow2_round;
    /* Pack H2D batches on a helper thread (default true); false packs on the
     * calling thread before the copies are issued. */
    bool pack_thread;
    /* How many, 1..4 (0, the default: one beside the CPU backend, one per 4
     * cores on a GPU's host, moe/staging_pack.c). */
    int pack_threads;
    size_t max_samples;      /* timeline samples kept (default 1 << 20); later ones are counted, not kept */
    const char *label;       /* timeline label (default: the mode name) */
} moe_staging_opts_t;

/* Fills the defaults above for `mode`; the caller sets capacity_bytes and max_tensor_bytes. */
void moe_staging_opts_init(moe_staging_opts_t *o, moe_staging_mode_t mode);

typedef struct moe_staging moe_staging_t;

/* Validates the settings (MT_ERR_CONFIG naming the setting: capacity 0, a
 * cap or slab smaller than the largest tensor, zero slabs, a slot count
 * over the cap, ...) and then allocates the pinned memory (compact slabs,
 * max_slot slots; per_tensor allocates on demand).  Nothing is allocated
 * when the settings are refused. */
mt_status_t moe_staging_create(kern_device_t *dev, const moe_staging_opts_t *opts, moe_staging_t **out,
                               mt_error_t *err);
/* Waits for every pending copy, then frees all pinned memory.  Regions the
 * caller still holds become invalid.  Call before kern_device_destroy. */
void moe_staging_destroy(moe_staging_t *pool);

/* ---- raw regions --------------------------------------------------------- */

typedef struct {
    void *host;    /* pinned, `bytes` long, aligned to the pool's alignment (compact) or a page */
    size_t bytes;  /* payload requested */
    int32_t id;    /* the pool's handle; -1 = empty */
} moe_staging_region_t;

/* Reserves `bytes` of pinned memory, waiting under backpressure.  `tag`
 * names the tensor in errors.  MT_ERR_BUDGET if it can never fit (larger
 * than a slab / slot / the capacity) or if the pool is full with nothing
 * pending. */
mt_status_t moe_staging_reserve(moe_staging_t *pool, size_t bytes, const char *tag, moe_staging_region_t *out,
                                mt_error_t *err);
/* Releases the region once everything queued on `stream` so far has
 * completed (an event recorded now).  The region is reset to empty. */
void moe_staging_release_after(moe_staging_t *pool, moe_staging_region_t *region, kern_stream_t *stream);
/* Releases a region no queued work reads (never used, or already synced). */
void moe_staging_release_now(moe_staging_t *pool, moe_staging_region_t *region);
/* Raw copies between part of a held region and device memory, counted in
 * the stats like batch copies (for callers that keep a region across
 * copies, e.g. activations held from forward to backward).  Aborts when
 * [offset, offset + bytes) is outside the region. */
void moe_staging_copy_h2d(moe_staging_t *pool, kern_stream_t *stream, void *dev, const moe_staging_region_t *region,
                          size_t offset, size_t bytes);
void moe_staging_copy_d2h(moe_staging_t *pool, kern_stream_t *stream, const moe_staging_region_t *region,
                          size_t offset, const void *dev, size_t bytes);
/* Frees regions whose events have fired (done by every reserve anyway). */
void moe_staging_poll(moe_staging_t *pool);
/* Waits for every pending release and performs it. */
void moe_staging_drain(moe_staging_t *pool);

/* ---- batched transfers --------------------------------------------------- */

typedef enum {
    MOE_STAGING_COPY = 0,     /* host = staged bytes (D2H), staged = host bytes (H2D) */
    MOE_STAGING_ADD_F32,      /* D2H: host[j] += staged[j] as floats (gradient accumulation) */
    MOE_STAGING_F32_TO_BF16,  /* H2D: the host holds bytes / 2 floats; they are packed rounded to
                               * bf16 (nearest even), so a bf16 working copy crosses the link at
                               * half the bytes of its fp32 master; `bytes` are the device bytes */
    MOE_STAGING_PINNED,       /* the host tensor is itself in pinned memory: copied from (H2D) or into
                               * (D2H) where it is, one copy of its own, with no staging region and
                               * nothing packed or unpacked */
    MOE_STAGING_READ,         /* H2D: `host` is a moe_staging_read_t whose reader fills the staged
                               * bytes where the pack would copy them (a read from disk lands in
                               * staging, with no buffer of its own) */
} moe_staging_op_t;

/* A MOE_STAGING_READ item's source.  read() fills dst with the item's
 * bytes; dst is aligned to MOE_STAGING_READ_ALIGN and `room` bytes long,
 * so an O_DIRECT read (and a trailer of the reader's own after the bytes)
 * can land there.  It runs where a pack runs (a pack thread, or the caller
 * without them), before the item's copy, and cannot stop the batch: a
 * reader that fails keeps and reports its failure itself, and what it left
 * in staging crosses the link.  The request must live, unchanged, until
 * the batch's copies are done. */
typedef struct moe_staging_read {
    void (*read)(struct moe_staging_read *req, void *dst, size_t room);
    size_t room; /* what read() may write at dst: at least the item's bytes, a multiple of
                  * MOE_STAGING_READ_ALIGN */
} moe_staging_read_t;

enum { MOE_STAGING_READ_ALIGN = 4096 };

typedef struct {
    void *host;          /* pageable host tensor: source (H2D) or destination (D2H) */
    void *dev;           /* device address (kern_alloc'd, or inside a caller-owned span) */
    size_t bytes;
    moe_staging_op_t op;
} moe_staging_xfer_t;

typedef struct {
    const char *tag; /* names the batch in errors, e.g. "layer 3 experts" */
    /* Coalescing rule.  0: items move in one copy only when their device
     * ranges are exactly adjacent.  A (a power of two): the bytes from an
     * item's end up to the next multiple of A belong to that item, so items
     * separated only by that padding move in one copy (the padding bytes
     * are copied too).  True for kern_alloc blocks with MT_ARENA_ALIGN and
     * for spans laid out by moe_staging_layout with the same alignment. */
    size_t dev_pad_align;
} moe_staging_batch_t;

/* H2D: packs the host tensors into staging (compact: one contiguous region
 * per slab-sized chunk laid out like the device ranges; other modes: one
 * region per tensor), then issues one copy per contiguous device range on
 * `stream` (compact) or one per tensor (other modes).  Regions are released
 * when the copies complete.  Returns once everything is issued; the host
 * sources must stay valid and unchanged until `stream` passes this point. */
mt_status_t moe_staging_h2d_batch(moe_staging_t *pool, kern_stream_t *stream, const moe_staging_xfer_t *items,
                                  int n, const moe_staging_batch_t *batch, mt_error_t *err);
/* D2H: one copy per contiguous device range (compact) or per tensor into
 * staging, then a host function on `stream` copies or adds each tensor into
 * its pageable destination.  The caller orders `stream` after the producer
 * of the device data.  Destinations are complete when `stream` passes the
 * point where this returns (record an event after it). */
mt_status_t moe_staging_d2h_batch(moe_staging_t *pool, kern_stream_t *stream, const moe_staging_xfer_t *items,
                                  int n, const moe_staging_batch_t *batch, mt_error_t *err);

/* Offsets for tensors packed into one device span, each aligned to `align`
 * (0 = MT_ARENA_ALIGN): fills offsets[n] and returns the span's bytes.
 * A caller that kern_allocs the span once and places a layer's experts at
 * these offsets gets one H2D copy per layer with dev_pad_align = align. */
size_t moe_staging_layout(const size_t *bytes, int n, size_t align, size_t *offsets);

/* ---- counters ------------------------------------------------------------ */

enum { MOE_STAGING_H2D = 0, MOE_STAGING_D2H = 1, MOE_STAGING_DIRS = 2 };

typedef struct {
    uint64_t copies[MOE_STAGING_DIRS];   /* copies issued through the pool */
    uint64_t bytes[MOE_STAGING_DIRS];    /* bytes those copies moved (padding included) */
    uint64_t tensors[MOE_STAGING_DIRS];  /* tensors moved */
    double mean_copy_bytes[MOE_STAGING_DIRS];
    uint64_t experts_skipped;            /* told by the caller (moe_staging_count_skipped) */
    uint64_t reservations;
    uint64_t waits;                      /* reservations that had to wait for space */
    double wait_s;                       /* total time waiting for space */
    double pack_s;                       /* host time packing / unpacking (any thread) */
    size_t peak_reserved;                /* pinned bytes the pool held */
    size_t peak_in_use;                  /* bytes in live regions (after rounding to align / page / slot) */
    size_t peak_payload;                 /* bytes requested by live regions */
    size_t reserved_at_peak_payload;
    double waste_pct;                    /* 100 * (reserved - payload) / reserved at peak payload */
    size_t capacity;                     /* the pool's pinned capacity after the cap */
    uint64_t samples_dropped;            /* timeline samples past max_samples */
} moe_staging_stats_t;

typedef enum { MOE_STAGING_SCOPE_STEP = 0, MOE_STAGING_SCOPE_TOTAL } moe_staging_scope_t;

/* Starts a new step: step counters reset, step peaks restart from now. */
void moe_staging_step_begin(moe_staging_t *pool);
void moe_staging_count_skipped(moe_staging_t *pool, int experts);
void moe_staging_get_stats(moe_staging_t *pool, moe_staging_scope_t scope, moe_staging_stats_t *out);
moe_staging_mode_t moe_staging_mode(const moe_staging_t *pool);

/* ---- timeline (the profiler's raw data) ----------------------------------- */

typedef struct {
    double t_s;        /* seconds since the pool was created */
    size_t reserved;   /* pinned bytes held by the pool */
    size_t in_use;     /* bytes in live regions */
    size_t payload;    /* bytes requested by live regions */
    int32_t step;      /* moe_staging_step_begin count */
    uint8_t waiting;   /* 1 while a reservation waits for space */
} moe_staging_sample_t;

typedef struct {
    char label[64];
    moe_staging_mode_t mode;
    double epoch_s; /* CLOCK_MONOTONIC seconds at t_s = 0 (to align with other traces) */
    moe_staging_sample_t *s;
    size_t n, cap;
} moe_staging_timeline_t;

/* The pool's timeline, valid until the pool is destroyed. */
const moe_staging_timeline_t *moe_staging_timeline(const moe_staging_t *pool);
/* A copy that outlives the pool (for --compare); free with moe_staging_timeline_free. */
moe_staging_timeline_t *moe_staging_timeline_copy(const moe_staging_t *pool);
void moe_staging_timeline_free(moe_staging_timeline_t *tl);

/* ---- sizing for the planner (no device needed) ----------------------------- */

typedef struct {
    size_t align;          /* compact alignment (0 = 256) */
    size_t page_bytes;     /* per_tensor allocation granularity (0 = 4096) */
    bool pow2_round;       /* per_tensor: PyTorch's power-of-two rounding */
    /* max_slot: 0 = one slot per tensor in the window (the same window in
     * flight as the other modes); > 0 = that many slots (fewer tensors in
     * flight). */
    int slots;
    size_t largest_tensor; /* largest tensor of the run, embedding / lm_head included (slot size) */
} moe_staging_plan_opts_t;

/* Pinned bytes `mode` needs to keep the n tensors of one in-flight window
 * staged at once:
 *   compact     sum of align_up(bytes) (at least the largest tensor, which
 *               must fit in a slab);
 *   per_tensor  sum of each tensor pinned alone (page-rounded, or the next
 *               power of two with pow2_round);
 *   max_slot    slots * align_up(largest_tensor). */
size_t moe_staging_plan_bytes(moe_staging_mode_t mode, const size_t *tensor_bytes, int n,
                              const moe_staging_plan_opts_t *o);

typedef struct {
    int tensors;
    size_t payload;            /* the floor no pool can beat */
    size_t largest_in_window, largest_tensor;
    size_t compact, per_tensor, per_tensor_pow2, max_slot;
    int max_slot_slots;
} moe_staging_plan_t;

/* All modes at once, for `moetune plan`. */
void moe_staging_plan_all(const size_t *tensor_bytes, int n, const moe_staging_plan_opts_t *o,
                          moe_staging_plan_t *out);

/* How many pack threads a pool starts by default (pack_threads 0): one
 * beside a device whose kernels run on the host cores (async_kernels
 * false: the CPU backend), else one per 2 of the host's `cores`, up to 16.
 * Calibration measures the host's packing with the same count. */
int moe_staging_default_pack_threads(bool async_kernels, long cores);

#endif
