/* Deferred frees (see pending.h). */
#include "engine/exec/place/pending.h"

#include <stdlib.h>
#include <string.h>

#include "base/grow.h"

void exec_pending_init(exec_pending_list_t *p, kern_device_t *dev, const exec_stage_t *stage) {
    memset(p, 0, sizeof *p);
    p->dev = dev;
    p->stage = stage;
}

void exec_pending_free(exec_pending_list_t *p) {
    free(p->v);
    memset(p, 0, sizeof *p);
}

void exec_defer_free(exec_pending_list_t *p, void *dev_ptr, void *pinned, size_t pinned_bytes,
                     kern_stream_t *after) {
    MT_GROW(p->v, p->cap, p->n + 1, "pending frees");
    kern_event_t *ev = kern_event_create(p->dev);
    kern_event_record(p->dev, ev, after);
    p->v[p->n++] = (exec_pending_t){dev_ptr, pinned, pinned_bytes, ev};
}

void exec_process_pending(exec_pending_list_t *p, bool force) {
    int keep = 0;
    for (int i = 0; i < p->n; i++) {
        exec_pending_t *q = &p->v[i];
        if (force) kern_event_sync(p->dev, q->ev);
        if (force || kern_event_query(p->dev, q->ev)) {
            if (q->dev) kern_free(p->dev, q->dev);
            if (q->pinned) kern_pinned_free(p->dev, q->pinned, q->pinned_bytes);
            kern_event_destroy(p->dev, q->ev);
        } else {
            p->v[keep++] = *q;
        }
    }
    p->n = keep;
    if (p->stage->pool) moe_staging_poll(p->stage->pool);
}
