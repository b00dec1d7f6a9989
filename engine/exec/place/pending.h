/* Buffers freed once the copies reading them are done: an offloaded
 * activation's device buffer after its D2H copy, a span of gradients after
 * the batch that sends them, a pinned fallback buffer after its H2D copy.
 * Each waits on an event recorded behind its copy.
 *
 * Processing the list also polls the staging pool, whose regions are
 * released the same way (moe_staging_release_after): both are "what copies
 * in flight still hold", settled together at the same points of the step.
 * Kept apart from the executor so that spans and activations, which defer
 * frees, sit below it. */
#ifndef MT_ENGINE_EXEC_PENDING_H
#define MT_ENGINE_EXEC_PENDING_H

#include <stdbool.h>
#include <stddef.h>

#include "engine/exec/place/stage.h"
#include "kernels/device.h"

typedef struct {
    void *dev;        /* device buffer to free, or NULL */
    void *pinned;     /* pinned host buffer to free, or NULL */
    size_t pinned_bytes;
    kern_event_t *ev; /* fires when the copy reading them is done */
} exec_pending_t;

typedef struct {
    kern_device_t *dev;        /* not owned */
    const exec_stage_t *stage; /* not owned: its pool is polled with every pass */
    exec_pending_t *v;
    int n, cap;
} exec_pending_list_t;

void exec_pending_init(exec_pending_list_t *p, kern_device_t *dev, const exec_stage_t *stage);
/* Frees the list itself; what it still held must have been processed
 * (exec_process_pending with force). */
void exec_pending_free(exec_pending_list_t *p);

/* Frees dev_ptr (device) and pinned (pinned host, pinned_bytes) once the
 * work issued so far on `after` is done; either may be NULL. */
void exec_defer_free(exec_pending_list_t *p, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after);
/* Frees what the copies have finished with (force: waits for them all),
 * then polls the staging pool. */
void exec_process_pending(exec_pending_list_t *p, bool force);

#endif
