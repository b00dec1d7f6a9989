/* Offloaded activations (see acts.h). */
#include "engine/exec/place/acts.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void exec_acts_init(exec_acts_t *a, kern_device_t *dev, int nb, exec_stage_t *stage, exec_pending_list_t *pend,
                    exec_counters_t *cnt) {
    memset(a, 0, sizeof *a);
    a->dev = dev;
    a->stage = stage;
    a->pend = pend;
    a->cnt = cnt;
    a->nb = nb;
    a->a_ready = calloc((size_t)nb, sizeof *a->a_ready);
    a->o_done = calloc((size_t)nb, sizeof *a->o_done);
    a->offl = calloc((size_t)nb, sizeof *a->offl);
    MT_CHECK(a->a_ready && a->o_done && a->offl, "out of memory for the offload tables");
    for (int b = 0; b < nb; b++) {
        a->a_ready[b] = kern_event_create(dev);
        a->o_done[b] = kern_event_create(dev);
        a->offl[b].region.id = -1;
    }
}

void exec_acts_free(exec_acts_t *a) {
    for (int b = 0; b < a->nb; b++) {
        kern_event_destroy(a->dev, a->a_ready[b]);
        kern_event_destroy(a->dev, a->o_done[b]);
        free(a->offl[b].e);
    }
    free(a->a_ready);
    free(a->o_done);
    free(a->offl);
    memset(a, 0, sizeof *a);
}

static int cmp_entry_dev(const void *a, const void *b) {
    const uintptr_t u = (uintptr_t)((const exec_offload_entry_t *)a)->dev;
    const uintptr_t v = (uintptr_t)((const exec_offload_entry_t *)b)->dev;
    return u < v ? -1 : u > v;
}

/* Entries [k0, end) whose device buffers follow each other (one copy). */
static int run_end(const exec_offload_entry_t *e, int k0, int n) {
    int k = k0 + 1;
    while (k < n && (char *)e[k].dev == (char *)e[k - 1].dev + e[k - 1].bytes) k++;
    return k;
}

mt_status_t exec_offload_acts(exec_acts_t *a, int b, void **const *slots, int nslots, mt_error_t *err) {
    kern_stream_t *d2h = kern_stream(a->dev, KERN_STREAM_D2H);
    kern_event_t *ready = kern_event_create(a->dev);
    kern_event_record(a->dev, ready, kern_stream(a->dev, KERN_STREAM_COMPUTE));
    kern_stream_wait_event(a->dev, d2h, ready);
    kern_event_destroy(a->dev, ready);
    exec_offload_t *o = &a->offl[b];
    o->n = 0;
    if (o->cap < nslots) {
        o->cap = nslots;
        o->e = realloc(o->e, (size_t)o->cap * sizeof *o->e);
        MT_CHECK_ALLOC(o->e, "offload table");
    }
    for (int k = 0; k < nslots; k++)
        if (*slots[k])
            o->e[o->n++] = (exec_offload_entry_t){slots[k], kern_alloc_size(a->dev, *slots[k]), 0, *slots[k]};
    if (o->n == 0) return MT_OK;
    /* one pinned region per block, laid out like the device (arena blocks
     * are multiples of the pool's alignment), so neighbours move together */
    qsort(o->e, (size_t)o->n, sizeof *o->e, cmp_entry_dev);
    size_t total = 0;
    for (int k = 0; k < o->n; k++) {
        o->e[k].off = total;
        total += o->e[k].bytes;
    }
    char tag[64];
    snprintf(tag, sizeof tag, a->inputs ? "a block input of layer %d" : "the saved activations of layer %d", b - 1);
    if (a->inputs) a->cnt->ctr.inputs_d2h_bytes += total;
    else a->cnt->ctr.acts_offloaded += total;
    mt_error_t quiet = {0};
    if (moe_staging_reserve(a->stage->pool, total, tag, &o->region, &quiet) != MT_OK) {
        /* the pool was sized for other activations (or capped): a plain pinned buffer, counted */
        o->direct = kern_pinned_alloc(a->dev, total);
        if (!o->direct)
            return mt_error_set(err, MT_ERR_NOMEM, "cannot pin %zu bytes to offload %s (%s)", total, tag, quiet.msg);
        o->direct_bytes = total;
        a->cnt->ctr.acts_unstaged++;
    }
    for (int k0 = 0; k0 < o->n;) {
        const int k1 = run_end(o->e, k0, o->n);
        const size_t len = o->e[k1 - 1].off + o->e[k1 - 1].bytes - o->e[k0].off;
        if (o->direct) kern_memcpy_d2h(a->dev, d2h, (char *)o->direct + o->e[k0].off, o->e[k0].dev, len);
        else moe_staging_copy_d2h(a->stage->pool, d2h, &o->region, o->e[k0].off, o->e[k0].dev, len);
        k0 = k1;
    }
    for (int k = 0; k < o->n; k++) {
        exec_defer_free(a->pend, o->e[k].dev, NULL, 0, d2h);
        *o->e[k].slot = NULL;
        o->e[k].dev = NULL;
    }
    kern_event_record(a->dev, a->o_done[b], d2h);
    return MT_OK;
}

mt_status_t exec_fetch_acts(exec_acts_t *a, int b, mt_error_t *err) {
    exec_offload_t *o = &a->offl[b];
    if (o->fetched || o->n == 0) return MT_OK;
    kern_stream_t *h2d = kern_stream(a->dev, KERN_STREAM_H2D);
    kern_stream_wait_event(a->dev, h2d, a->o_done[b]); /* the offload copies have landed */
    for (int k = 0; k < o->n; k++) {
        o->e[k].dev = kern_alloc(a->dev, o->e[k].bytes, "activation fetched back for backward", err);
        if (!o->e[k].dev) return err->code;
        *o->e[k].slot = o->e[k].dev;
    }
    for (int k0 = 0; k0 < o->n;) { /* offsets are contiguous: runs follow the new buffers */
        const int k1 = run_end(o->e, k0, o->n);
        const size_t len = o->e[k1 - 1].off + o->e[k1 - 1].bytes - o->e[k0].off;
        if (o->direct) kern_memcpy_h2d(a->dev, h2d, o->e[k0].dev, (char *)o->direct + o->e[k0].off, len);
        else moe_staging_copy_h2d(a->stage->pool, h2d, o->e[k0].dev, &o->region, o->e[k0].off, len);
        if (a->inputs) a->cnt->ctr.inputs_h2d_bytes += len;
        k0 = k1;
    }
    if (o->direct) {
        exec_defer_free(a->pend, NULL, o->direct, o->direct_bytes, h2d);
        o->direct = NULL;
    } else {
        moe_staging_release_after(a->stage->pool, &o->region, h2d);
    }
    kern_event_record(a->dev, a->a_ready[b], h2d);
    o->fetched = true;
    return MT_OK;
}

void exec_wait_acts(exec_acts_t *a, int b) {
    if (!a->offl[b].fetched) return;
    kern_stream_wait_event(a->dev, kern_stream(a->dev, KERN_STREAM_COMPUTE), a->a_ready[b]);
    a->offl[b].fetched = false;
    a->offl[b].n = 0;
}

void exec_drop_offloads(exec_acts_t *a) {
    for (int b = 0; b < a->nb; b++) {
        exec_offload_t *o = &a->offl[b];
        if (o->region.id >= 0 && a->stage->pool) moe_staging_release_now(a->stage->pool, &o->region);
        o->region.id = -1;
        if (o->direct) kern_pinned_free(a->dev, o->direct, o->direct_bytes);
        o->direct = NULL;
        o->n = 0;
        o->fetched = false;
    }
}

