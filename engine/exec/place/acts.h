/* Saved activations that go to host memory between a block's forward and
 * its backward when the plan offloads them: one pinned region of the
 * staging pool per block (or a plain pinned buffer when the pool cannot
 * hold it), laid out like the device buffers so that neighbours move in
 * one copy, with an event per block for "reached host memory" and one for
 * "back on the device".
 *
 * Above the staging pool and the deferred frees, below the step program,
 * which hands it the slots of a layer's activations.  Layer-major order
 * (layer_major.c) swaps the per-block tables below for each micro-batch,
 * and offloads micro-batches' block inputs through tables of their own
 * (exec_acts_t.inputs): the same copies, events and pinned regions. */
#ifndef MT_ENGINE_EXEC_ACTS_H
#define MT_ENGINE_EXEC_ACTS_H

#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"
#include "engine/exec/record/counters.h"
#include "engine/exec/place/pending.h"
#include "engine/exec/place/stage.h"
#include "kernels/device.h"
#include "moe/staging.h"

typedef struct {
    void **slot;  /* where the device pointer lives in the block's activation structs */
    size_t bytes; /* the device buffer's size (kern_alloc_size) */
    size_t off;   /* its place in the block's pinned copy */
    void *dev;    /* the buffer while it is being offloaded */
} exec_offload_entry_t;

typedef struct {
    exec_offload_entry_t *e; /* sorted by `off` */
    int n, cap;
    moe_staging_region_t region; /* the block's activations in the staging pool, held forward to backward */
    void *direct;                /* or a plain pinned buffer when the pool could not hold them */
    size_t direct_bytes;
    bool fetched;
} exec_offload_t;

typedef struct {
    kern_device_t *dev;         /* not owned */
    exec_stage_t *stage;        /* not owned: the pool the regions live in */
    exec_pending_list_t *pend;  /* not owned: device buffers freed once offloaded */
    exec_counters_t *cnt;       /* not owned: bytes offloaded, offloads the pool could not hold */
    int nb;
    kern_event_t **a_ready; /* per block: its offloaded activations are back */
    kern_event_t **o_done;  /* per block: its activations have reached host memory */
    exec_offload_t *offl;   /* per block */
    /* false: saved activations (counted in acts_offloaded); true: a
     * layer-major micro-batch's block inputs, one tensor per block (counted
     * in inputs_d2h_bytes and inputs_h2d_bytes) */
    bool inputs;
} exec_acts_t;

void exec_acts_init(exec_acts_t *a, kern_device_t *dev, int nb, exec_stage_t *stage, exec_pending_list_t *pend,
                    exec_counters_t *cnt);
/* Frees the tables and events (after exec_drop_offloads, streams idle). */
void exec_acts_free(exec_acts_t *a);

/* Block b's forward has run: its saved activations (the device pointers at
 * slots[0..nslots)) go to the host on the D2H stream; the slots are
 * cleared and the device buffers freed once copied. */
mt_status_t exec_offload_acts(exec_acts_t *a, int b, void **const *slots, int nslots, mt_error_t *err);
/* Before block b's backward: its activations come back on the H2D stream
 * into fresh device buffers, put back in their slots. */
mt_status_t exec_fetch_acts(exec_acts_t *a, int b, mt_error_t *err);
/* The compute stream waits for block b's activations to be back. */
void exec_wait_acts(exec_acts_t *a, int b);
/* Drops offloaded copies never fetched back (forward only, errors); streams idle. */
void exec_drop_offloads(exec_acts_t *a);

#endif
