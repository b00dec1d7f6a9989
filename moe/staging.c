/* The staging pool's core (see staging.h): settings, the three layouts,
 * reservations and their lazy release, backpressure, counters and the
 * timeline.  Batched copies are in staging_xfer.c (which calls in here),
 * host-side jobs and the pack threads in staging_pack.c (which this file
 * starts and stops), sizing in staging_plan.c.
 *
 * Every reservation is a record: HELD while the caller fills it, PENDING
 * once release_after recorded an event behind the copy that reads it,
 * FREE when that event has fired and its bytes went back to the layout.
 * Pending records are kept in release order; copy streams complete in
 * order, so the poll stops querying a stream at its first unfired event
 * and a wait always targets the oldest pending record. */
#include "moe/staging.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "moe/staging_internal.h"
#include "base/clock.h"
#include "base/grow.h"

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }
static bool is_pow2(size_t x) { return x && (x & (x - 1)) == 0; }

static size_t next_pow2(size_t x) {
    size_t p = 1;
    while (p < x) p <<= 1;
    return p;
}

static const char *const k_mode_names[MOE_STAGING_MODE_COUNT] = {"compact", "per_tensor", "max_slot"};

const char *moe_staging_mode_name(moe_staging_mode_t mode) {
    return mode >= 0 && mode < MOE_STAGING_MODE_COUNT ? k_mode_names[mode] : "unknown";
}

bool moe_staging_mode_parse(const char *name, moe_staging_mode_t *out) {
    for (int m = 0; m < MOE_STAGING_MODE_COUNT; m++)
        if (name && strcmp(name, k_mode_names[m]) == 0) {
            *out = (moe_staging_mode_t)m;
            return true;
        }
    return false;
}

void moe_staging_opts_init(moe_staging_opts_t *o, moe_staging_mode_t mode) {
    memset(o, 0, sizeof *o);
    o->mode = mode;
    o->num_slabs = MOE_STAGING_SLABS_AUTO;
    o->align = MOE_STAGING_DEFAULT_ALIGN;
    o->fit = MOE_STAGING_FIRST_FIT;
    o->pack_thread = true;
    o->max_samples = (size_t)1 << 20;
}

/* per_tensor's block size for a request: page granularity (what
 * cudaHostAlloc / mmap give), or PyTorch's power-of-two class. */
static size_t per_tensor_block(const moe_staging_t *p, size_t bytes) {
    size_t b = bytes ? bytes : 1;
    if (p->o.pow2_round) b = next_pow2(b);
    return round_up(b, MOE_STAGING_PAGE);
}

/* ---- settings ------------------------------------------------------------ */

static mt_status_t plan_layout(moe_staging_t *p, mt_error_t *err) {
    const moe_staging_opts_t *o = &p->o;
    const char *tname = o->max_tensor_name ? o->max_tensor_name : "the largest tensor";
    const size_t maxt = o->max_tensor_bytes;
    if (o->mode < 0 || o->mode >= MOE_STAGING_MODE_COUNT)
        return mt_error_set(err, MT_ERR_CONFIG, "staging.mode %d is not compact, per_tensor or max_slot", (int)o->mode);
    if (!is_pow2(p->align) || p->align > ((size_t)1 << 20))
        return mt_error_set(err, MT_ERR_CONFIG, "staging.align = %zu: expected a power of two up to 1 MiB",
                            p->align);
    /* the smallest pool that can stage the largest tensor, in this mode */
    size_t floor = 0;
    if (maxt) floor = o->mode == MOE_STAGING_PER_TENSOR ? per_tensor_block(p, maxt) : round_up(maxt, p->align);
    if (o->cap_bytes && o->cap_bytes < floor)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "memory.pinned (the staging cap) = %zu bytes is smaller than %s (%zu bytes, %zu "
                            "in %s staging): that tensor could never be staged",
                            o->cap_bytes, tname, maxt, floor, moe_staging_mode_name(o->mode));
    size_t total = o->capacity_bytes;
    const bool explicit_slabs = o->mode == MOE_STAGING_COMPACT && o->slab_bytes > 0;
    const bool explicit_slots = o->mode == MOE_STAGING_MAX_SLOT && o->num_slots > 0;
    int nslabs = o->num_slabs; /* compact; MOE_STAGING_SLABS_AUTO until decided */

    if (o->mode == MOE_STAGING_COMPACT) {
        if (o->num_slabs < 1 && o->num_slabs != MOE_STAGING_SLABS_AUTO)
            return mt_error_set(err, MT_ERR_CONFIG, "staging.num_slabs = %d: the compact pool needs at least one slab",
                                o->num_slabs);
        if (explicit_slabs) {
            /* slab_bytes alone: as many slabs as the capacity needs */
            nslabs = o->num_slabs != MOE_STAGING_SLABS_AUTO
                         ? o->num_slabs
                         : (int)((o->capacity_bytes + o->slab_bytes - 1) / o->slab_bytes);
            if (o->slab_bytes < floor)
                return mt_error_set(err, MT_ERR_CONFIG,
                                    "staging.slab_bytes = %zu is smaller than %s (%zu bytes): a tensor cannot "
                                    "span two slabs (%d slabs x %zu bytes)",
                                    o->slab_bytes, tname, maxt, nslabs, o->slab_bytes);
            total = (size_t)nslabs * round_up(o->slab_bytes, p->align);
        }
    } else if (o->mode == MOE_STAGING_MAX_SLOT) {
        if (maxt == 0)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "staging.mode max_slot needs max_tensor_bytes (the largest tensor, which sizes "
                                "every slot)");
        if (o->num_slots < 0)
            return mt_error_set(err, MT_ERR_CONFIG, "staging.num_slots = %d is negative", o->num_slots);
        p->slot_bytes = floor;
        if (explicit_slots) total = (size_t)o->num_slots * p->slot_bytes;
    }
    if (total == 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "staging capacity is 0 bytes: give the plan's in-flight window (capacity_bytes)%s",
                            o->mode == MOE_STAGING_COMPACT ? " or staging.num_slabs with staging.slab_bytes"
                            : o->mode == MOE_STAGING_MAX_SLOT ? " or staging.num_slots" : "");
    if ((explicit_slabs || explicit_slots) && o->cap_bytes && total > o->cap_bytes)
        return mt_error_set(err, MT_ERR_CONFIG, "staging: %d %s x %zu bytes = %zu bytes exceeds memory.pinned = %zu bytes",
                            explicit_slabs ? nslabs : o->num_slots, explicit_slabs ? "slabs" : "slots",
                            explicit_slabs ? o->slab_bytes : p->slot_bytes, total, o->cap_bytes);
    p->capacity = o->cap_bytes && total > o->cap_bytes ? o->cap_bytes : total;
    if (p->capacity < floor)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "staging capacity %zu bytes (the in-flight window%s) is smaller than %s (%zu bytes, "
                            "%zu in %s staging)",
                            p->capacity, o->cap_bytes && total > o->cap_bytes ? ", clamped to memory.pinned" : "",
                            tname, maxt, floor, moe_staging_mode_name(o->mode));

    if (o->mode == MOE_STAGING_COMPACT) {
        const int ns = nslabs > 0 ? nslabs
                                  : (int)((p->capacity + MOE_STAGING_AUTO_SLAB_MAX - 1) / MOE_STAGING_AUTO_SLAB_MAX);
        p->slab = calloc((size_t)ns, sizeof *p->slab);
        p->slab_bytes = calloc((size_t)ns, sizeof *p->slab_bytes);
        p->alloc = calloc((size_t)ns, sizeof *p->alloc);
        MT_CHECK(p->slab && p->slab_bytes && p->alloc, "out of host memory for staging slabs");
        size_t left = p->capacity & ~(p->align - 1);
        for (int i = 0; i < ns && left >= p->align; i++) {
            size_t share = explicit_slabs ? round_up(o->slab_bytes, p->align)
                                          : round_up((left + (size_t)(ns - i) - 1) / (size_t)(ns - i), p->align);
            if (i == 0 && share < floor) share = floor; /* the largest tensor needs one slab to itself */
            if (share > left) share = left;
            p->slab_bytes[p->nslabs++] = share;
            left -= share;
        }
    } else if (o->mode == MOE_STAGING_MAX_SLOT) {
        p->nslots = explicit_slots ? o->num_slots : (int)(p->capacity / p->slot_bytes);
        p->capacity = (size_t)p->nslots * p->slot_bytes;
    }
    return MT_OK;
}

static void sample(moe_staging_t *p);

mt_status_t moe_staging_create(kern_device_t *dev, const moe_staging_opts_t *opts, moe_staging_t **out,
                               mt_error_t *err) {
    *out = NULL;
    if (!dev || !opts) return mt_error_set(err, MT_ERR_INTERNAL, "moe_staging_create: no device or options");
    moe_staging_t *p = calloc(1, sizeof *p);
    MT_CHECK_ALLOC(p, "staging pool");
    p->dev = dev;
    p->o = *opts;
    p->align = opts->align ? opts->align : MOE_STAGING_DEFAULT_ALIGN;
    if (!p->o.max_samples) p->o.max_samples = (size_t)1 << 20;
    p->free_rec = -1;
    mt_status_t st = plan_layout(p, err);
    if (st != MT_OK) {
        free(p->slab);
        free(p->slab_bytes);
        free(p->alloc);
        free(p);
        return st;
    }
    snprintf(p->label, sizeof p->label, "%s", opts->label ? opts->label : moe_staging_mode_name(opts->mode));
    p->o.label = p->label;
    p->o.max_tensor_name = NULL; /* the caller's string need not outlive creation */
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->cond, NULL);
    snprintf(p->tl.label, sizeof p->tl.label, "%s", p->label);
    p->tl.mode = opts->mode;
    for (int s = 0; s < 2; s++) p->st[s].capacity = p->capacity;
    p->t0 = mt_now_s();
    p->tl.epoch_s = p->t0;
    *out = p; /* from here destroy cleans up a partial pool */

    if (p->o.mode == MOE_STAGING_COMPACT) {
        for (int i = 0; i < p->nslabs; i++) {
            p->slab[i] = kern_pinned_alloc(dev, p->slab_bytes[i]);
            if (!p->slab[i]) {
                moe_staging_destroy(p);
                *out = NULL;
                return mt_error_set(err, MT_ERR_NOMEM, "cannot pin %zu bytes for staging slab %d of %d",
                                    p->slab_bytes[i], i, p->nslabs);
            }
            moe_salloc_init(&p->alloc[i], p->slab_bytes[i], p->align, p->o.fit);
            p->reserved += p->slab_bytes[i];
        }
    } else if (p->o.mode == MOE_STAGING_MAX_SLOT) {
        p->slot_busy = calloc((size_t)p->nslots, sizeof *p->slot_busy);
        MT_CHECK_ALLOC(p->slot_busy, "staging slots");
        p->slot_mem = kern_pinned_alloc(dev, p->capacity);
        if (!p->slot_mem) {
            moe_staging_destroy(p);
            *out = NULL;
            return mt_error_set(err, MT_ERR_NOMEM, "cannot pin %zu bytes for %d staging slots", p->capacity,
                                p->nslots);
        }
        p->reserved = p->capacity;
    }
    if (p->o.pack_thread) staging_pack_start(p);
    sample(p);
    for (int s = 0; s < 2; s++) p->st[s].peak_reserved = p->reserved;
    return MT_OK;
}

void moe_staging_destroy(moe_staging_t *p) {
    if (!p) return;
    moe_staging_drain(p);
    staging_pack_stop(p);
    for (int i = 0; i < p->nrec; i++)
        if (p->rec[i].state == REC_HELD && p->o.mode == MOE_STAGING_PER_TENSOR)
            kern_pinned_free(p->dev, p->rec[i].host, p->rec[i].size);
    for (int i = 0; i < p->ncache; i++) kern_pinned_free(p->dev, p->cache[i].p, p->cache[i].size);
    for (int i = 0; i < p->nslabs; i++) {
        if (p->slab[i]) kern_pinned_free(p->dev, p->slab[i], p->slab_bytes[i]);
        moe_salloc_free_all(&p->alloc[i]);
    }
    if (p->slot_mem) kern_pinned_free(p->dev, p->slot_mem, p->capacity);
    for (int i = 0; i < p->nevs; i++) kern_event_destroy(p->dev, p->evs[i]);
    if (p->follow) kern_event_destroy(p->dev, p->follow);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->cond);
    free(p->slab);
    free(p->slab_bytes);
    free(p->alloc);
    free(p->slot_busy);
    free(p->cache);
    free(p->rec);
    free(p->pend);
    free(p->evs);
    free(p->tl.s);
    free(p);
}

/* ---- counters and timeline --------------------------------------------- */

static void sample(moe_staging_t *p) {
    for (int s = 0; s < 2; s++) {
        moe_staging_stats_t *st = &p->st[s];
        if (p->reserved > st->peak_reserved) st->peak_reserved = p->reserved;
        if (p->in_use > st->peak_in_use) st->peak_in_use = p->in_use;
        if (p->payload > st->peak_payload) {
            st->peak_payload = p->payload;
            st->reserved_at_peak_payload = p->reserved;
        }
    }
    moe_staging_timeline_t *tl = &p->tl;
    if (tl->n == p->o.max_samples) {
        p->st[MOE_STAGING_SCOPE_STEP].samples_dropped++;
        p->st[MOE_STAGING_SCOPE_TOTAL].samples_dropped++;
        return;
    }
    if (tl->n == tl->cap) {
        tl->cap = tl->cap ? 2 * tl->cap : 1024;
        if (tl->cap > p->o.max_samples) tl->cap = p->o.max_samples;
        tl->s = realloc(tl->s, tl->cap * sizeof *tl->s);
        MT_CHECK_ALLOC(tl->s, "staging timeline");
    }
    tl->s[tl->n++] = (moe_staging_sample_t){mt_now_s() - p->t0, p->reserved, p->in_use, p->payload, p->step,
                                            (uint8_t)p->waiting};
}

void staging_count_copy(moe_staging_t *p, int dir, size_t bytes) {
    for (int s = 0; s < 2; s++) {
        p->st[s].copies[dir]++;
        p->st[s].bytes[dir] += bytes;
    }
}

void staging_count_tensors(moe_staging_t *p, int dir, int n) {
    for (int s = 0; s < 2; s++) p->st[s].tensors[dir] += (uint64_t)n;
}

void moe_staging_count_skipped(moe_staging_t *p, int experts) {
    for (int s = 0; s < 2; s++) p->st[s].experts_skipped += (uint64_t)(experts > 0 ? experts : 0);
}

void moe_staging_step_begin(moe_staging_t *p) {
    pthread_mutex_lock(&p->lock);
    moe_staging_stats_t *st = &p->st[MOE_STAGING_SCOPE_STEP];
    memset(st, 0, sizeof *st);
    st->capacity = p->capacity;
    st->peak_reserved = p->reserved;
    st->peak_in_use = p->in_use;
    st->peak_payload = p->payload;
    st->reserved_at_peak_payload = p->reserved;
    pthread_mutex_unlock(&p->lock);
    p->step++;
    sample(p);
}

void moe_staging_get_stats(moe_staging_t *p, moe_staging_scope_t scope, moe_staging_stats_t *out) {
    pthread_mutex_lock(&p->lock);
    *out = p->st[scope == MOE_STAGING_SCOPE_STEP ? 0 : 1];
    pthread_mutex_unlock(&p->lock);
    for (int d = 0; d < MOE_STAGING_DIRS; d++)
        out->mean_copy_bytes[d] = out->copies[d] ? (double)out->bytes[d] / (double)out->copies[d] : 0;
    out->waste_pct = out->reserved_at_peak_payload
                         ? 100.0 * (double)(out->reserved_at_peak_payload - out->peak_payload) /
                               (double)out->reserved_at_peak_payload
                         : 0;
}

moe_staging_mode_t moe_staging_mode(const moe_staging_t *p) { return p->o.mode; }

const moe_staging_timeline_t *moe_staging_timeline(const moe_staging_t *p) { return &p->tl; }

moe_staging_timeline_t *moe_staging_timeline_copy(const moe_staging_t *p) {
    moe_staging_timeline_t *t = calloc(1, sizeof *t);
    MT_CHECK_ALLOC(t, "staging timeline copy");
    *t = p->tl;
    t->cap = t->n;
    t->s = malloc((t->n ? t->n : 1) * sizeof *t->s);
    MT_CHECK_ALLOC(t->s, "staging timeline copy");
    if (t->n) memcpy(t->s, p->tl.s, t->n * sizeof *t->s);
    return t;
}

void moe_staging_timeline_free(moe_staging_timeline_t *tl) {
    if (!tl) return;
    free(tl->s);
    free(tl);
}

/* ---- records -------------------------------------------------------------- */

static int rec_new(moe_staging_t *p) {
    int id = p->free_rec;
    if (id >= 0) {
        p->free_rec = p->rec[id].next_free;
    } else {
        MT_GROW(p->rec, p->cap_rec, p->nrec + 1, "staging reservations");
        id = p->nrec++;
    }
    memset(&p->rec[id], 0, sizeof p->rec[id]);
    p->rec[id].state = REC_HELD;
    p->rec[id].next_free = -1;
    return id;
}

static staging_rec_t *rec_get(moe_staging_t *p, const moe_staging_region_t *r, staging_rec_state_t want) {
    MT_CHECK(r && r->id >= 0 && r->id < p->nrec && p->rec[r->id].state == want,
             "staging: region %d is not a %s reservation of this pool", r ? r->id : -1,
             want == REC_HELD ? "held" : "pending");
    return &p->rec[r->id];
}

/* Gives a record's bytes back to the layout. */
static void rec_free(moe_staging_t *p, int id) {
    staging_rec_t *r = &p->rec[id];
    switch (p->o.mode) {
    case MOE_STAGING_COMPACT: moe_salloc_release(&p->alloc[r->where], r->off); break;
    case MOE_STAGING_MAX_SLOT: p->slot_busy[r->where] = false; break;
    case MOE_STAGING_PER_TENSOR:
        MT_GROW(p->cache, p->cap_cache, p->ncache + 1, "staging block cache");
        p->cache[p->ncache++] = (staging_block_t){r->host, r->size};
        break;
    default: break;
    }
    p->in_use -= r->size;
    p->payload -= r->payload;
    if (r->ev) {
        MT_GROW(p->evs, p->cap_evs, p->nevs + 1, "staging events");
        p->evs[p->nevs++] = r->ev;
    }
    r->state = REC_FREE;
    r->ev = NULL;
    r->next_free = p->free_rec;
    p->free_rec = id;
}

/* ---- reserving ------------------------------------------------------------ */

static void held(moe_staging_t *p, int id, moe_staging_region_t *out) {
    staging_rec_t *r = &p->rec[id];
    p->in_use += r->size;
    p->payload += r->payload;
    for (int s = 0; s < 2; s++) p->st[s].reservations++;
    *out = (moe_staging_region_t){r->host, r->payload, id};
    sample(p);
}

static bool try_compact(moe_staging_t *p, size_t bytes, size_t payload, int *id_out) {
    for (int i = 0; i < p->nslabs; i++) {
        size_t off;
        if (!moe_salloc_alloc(&p->alloc[i], bytes, &off)) continue;
        const int id = rec_new(p);
        staging_rec_t *r = &p->rec[id];
        r->where = i;
        r->off = off;
        r->size = moe_salloc_size(&p->alloc[i], off);
        r->payload = payload;
        r->host = (char *)p->slab[i] + off;
        *id_out = id;
        return true;
    }
    return false;
}

size_t staging_largest_slab(const moe_staging_t *p) {
    size_t m = 0;
    for (int i = 0; i < p->nslabs; i++)
        if (p->alloc[i].capacity > m) m = p->alloc[i].capacity;
    return m;
}

mt_status_t staging_try_reserve(moe_staging_t *p, size_t bytes, const char *tag, moe_staging_region_t *out,
                                bool *got, mt_error_t *err) {
    const char *what = tag ? tag : "a tensor";
    *got = false;
    int id = -1;
    switch (p->o.mode) {
    case MOE_STAGING_COMPACT:
        if (round_up(bytes ? bytes : 1, p->align) > staging_largest_slab(p))
            return mt_error_set(err, MT_ERR_BUDGET,
                                "staging: %s (%zu bytes) is larger than the largest compact slab (%zu bytes); "
                                "raise the staging capacity or max_tensor_bytes",
                                what, bytes, staging_largest_slab(p));
        if (!try_compact(p, bytes, bytes, &id)) return MT_OK;
        break;
    case MOE_STAGING_MAX_SLOT: {
        if (bytes > p->slot_bytes)
            return mt_error_set(err, MT_ERR_BUDGET,
                                "staging: %s (%zu bytes) does not fit a max_slot slot of %zu bytes (slots are "
                                "sized for max_tensor_bytes)",
                                what, bytes, p->slot_bytes);
        int s = 0;
        while (s < p->nslots && p->slot_busy[s]) s++;
        if (s == p->nslots) return MT_OK;
        p->slot_busy[s] = true;
        id = rec_new(p);
        p->rec[id].where = s;
        p->rec[id].size = p->slot_bytes;
        p->rec[id].payload = bytes;
        p->rec[id].host = (char *)p->slot_mem + (size_t)s * p->slot_bytes;
        break;
    }
    case MOE_STAGING_PER_TENSOR: {
        const size_t size = per_tensor_block(p, bytes);
        if (size > p->capacity)
            return mt_error_set(err, MT_ERR_BUDGET,
                                "staging: %s (%zu bytes, a %zu-byte pinned block) exceeds the per_tensor "
                                "capacity of %zu bytes",
                                what, bytes, size, p->capacity);
        void *host = NULL;
        for (int i = 0; i < p->ncache && !host; i++)
            if (p->cache[i].size == size) {
                host = p->cache[i].p;
                p->cache[i] = p->cache[--p->ncache];
            }
        /* evict cached blocks of other sizes until the new one fits under the capacity */
        while (!host && p->reserved + size > p->capacity && p->ncache > 0) {
            staging_block_t b = p->cache[--p->ncache];
            kern_pinned_free(p->dev, b.p, b.size);
            p->reserved -= b.size;
        }
        if (!host) {
            if (p->reserved + size > p->capacity) {
                sample(p);
                return MT_OK;
            }
            host = kern_pinned_alloc(p->dev, size);
            if (!host)
                return mt_error_set(err, MT_ERR_NOMEM, "staging: cannot pin %zu bytes for %s", size, what);
            p->reserved += size;
        }
        id = rec_new(p);
        p->rec[id].where = -1;
        p->rec[id].size = size;
        p->rec[id].payload = bytes;
        p->rec[id].host = host;
        break;
    }
    default: return mt_error_set(err, MT_ERR_INTERNAL, "staging: bad mode");
    }
    held(p, id, out);
    *got = true;
    return MT_OK;
}

static mt_status_t full_error(moe_staging_t *p, size_t bytes, const char *tag, mt_error_t *err) {
    int holders = 0;
    for (int i = 0; i < p->nrec; i++) holders += p->rec[i].state == REC_HELD;
    return mt_error_set(err, MT_ERR_BUDGET,
                        "staging pool (%s, %zu bytes) is full: %s needs %zu bytes and nothing is pending; %zu "
                        "bytes are held by %d reservations not released (release_after them first, or raise "
                        "the capacity)",
                        p->label, p->capacity, tag ? tag : "a tensor", bytes, p->in_use, holders);
}

bool staging_wait_one(moe_staging_t *p) {
    if (p->npend == 0) return false;
    const double t0 = mt_now_s();
    p->waiting = true;
    sample(p);
    kern_event_sync(p->dev, p->rec[p->pend[0]].ev);
    moe_staging_poll(p);
    p->waiting = false;
    const double dt = mt_now_s() - t0;
    for (int s = 0; s < 2; s++) p->st[s].wait_s += dt;
    sample(p);
    return true;
}

mt_status_t moe_staging_reserve(moe_staging_t *p, size_t bytes, const char *tag, moe_staging_region_t *out,
                                mt_error_t *err) {
    bool waited = false;
    *out = (moe_staging_region_t){NULL, 0, -1};
    moe_staging_poll(p);
    for (;;) {
        bool got;
        mt_status_t st = staging_try_reserve(p, bytes, tag, out, &got, err);
        if (st != MT_OK || got) return st;
        if (!waited) {
            waited = true;
            for (int s = 0; s < 2; s++) p->st[s].waits++;
        }
        if (!staging_wait_one(p)) return full_error(p, bytes, tag, err);
    }
}

mt_status_t staging_reserve_flex(moe_staging_t *p, size_t min, size_t want, size_t accept, const char *tag,
                                 bool may_wait, moe_staging_region_t *out, bool *got, mt_error_t *err) {
    *got = false;
    *out = (moe_staging_region_t){NULL, 0, -1};
    if (round_up(min ? min : 1, p->align) > staging_largest_slab(p))
        return mt_error_set(err, MT_ERR_BUDGET,
                            "staging: %s needs %zu contiguous bytes, more than the largest compact slab (%zu "
                            "bytes); raise the staging capacity or max_tensor_bytes",
                            tag ? tag : "a tensor", min, staging_largest_slab(p));
    if (want < min) want = min;
    if (accept < min) accept = min;
    bool waited = false;
    moe_staging_poll(p);
    for (;;) {
        int id = -1, best = -1;
        size_t largest = 0;
        if (!try_compact(p, want, 0, &id)) {
            for (int i = 0; i < p->nslabs; i++) {
                const size_t l = moe_salloc_largest_free(&p->alloc[i]);
                if (l > largest) largest = l, best = i;
            }
            /* a partial block: take it when large enough, or when waiting cannot help */
            const bool can_wait = may_wait && p->npend > 0;
            if (best >= 0 && (largest >= accept || (largest >= min && may_wait && !can_wait)))
                try_compact(p, largest, 0, &id);
        }
        if (id >= 0) {
            held(p, id, out);
            out->bytes = 0; /* payload set when the batch shrinks it */
            *got = true;
            return MT_OK;
        }
        if (!may_wait) return MT_OK;
        if (!waited) {
            waited = true;
            for (int s = 0; s < 2; s++) p->st[s].waits++;
        }
        if (!staging_wait_one(p)) return full_error(p, min, tag, err);
    }
}

void staging_shrink(moe_staging_t *p, moe_staging_region_t *r, size_t keep, size_t payload) {
    staging_rec_t *rec = rec_get(p, r, REC_HELD);
    MT_CHECK(p->o.mode == MOE_STAGING_COMPACT, "staging: only compact regions shrink");
    moe_salloc_shrink(&p->alloc[rec->where], rec->off, keep);
    const size_t size = moe_salloc_size(&p->alloc[rec->where], rec->off);
    p->in_use = p->in_use - rec->size + size;
    p->payload = p->payload - rec->payload + payload;
    rec->size = size;
    rec->payload = payload;
    r->bytes = payload;
    sample(p);
}

/* ---- releasing ------------------------------------------------------------ */

void moe_staging_release_after(moe_staging_t *p, moe_staging_region_t *r, kern_stream_t *stream) {
    staging_rec_t *rec = rec_get(p, r, REC_HELD);
    rec->ev = p->nevs ? p->evs[--p->nevs] : kern_event_create(p->dev);
    kern_event_record(p->dev, rec->ev, stream);
    rec->stream = stream;
    rec->state = REC_PENDING;
    MT_GROW(p->pend, p->cap_pend, p->npend + 1, "staging pending list");
    p->pend[p->npend++] = r->id;
    *r = (moe_staging_region_t){NULL, 0, -1};
}

void moe_staging_release_now(moe_staging_t *p, moe_staging_region_t *r) {
    rec_get(p, r, REC_HELD);
    rec_free(p, r->id);
    *r = (moe_staging_region_t){NULL, 0, -1};
    sample(p);
}

static void raw_copy_check(moe_staging_t *p, const moe_staging_region_t *r, size_t off, size_t bytes) {
    rec_get(p, r, REC_HELD);
    MT_CHECK(off <= r->bytes && bytes <= r->bytes - off,
             "staging: copy of %zu bytes at offset %zu outside a %zu-byte region", bytes, off, r->bytes);
}

void moe_staging_copy_h2d(moe_staging_t *p, kern_stream_t *s, void *dev, const moe_staging_region_t *r, size_t off,
                          size_t bytes) {
    raw_copy_check(p, r, off, bytes);
    kern_memcpy_h2d(p->dev, s, dev, (const char *)r->host + off, bytes);
    staging_count_copy(p, MOE_STAGING_H2D, bytes);
}

void moe_staging_copy_d2h(moe_staging_t *p, kern_stream_t *s, const moe_staging_region_t *r, size_t off,
                          const void *dev, size_t bytes) {
    raw_copy_check(p, r, off, bytes);
    kern_memcpy_d2h(p->dev, s, (char *)r->host + off, dev, bytes);
    staging_count_copy(p, MOE_STAGING_D2H, bytes);
}

void moe_staging_poll(moe_staging_t *p) {
    enum { MAX_BLOCKED = 8 };
    kern_stream_t *blocked[MAX_BLOCKED];
    int nblocked = 0, keep = 0;
    bool freed = false;
    for (int i = 0; i < p->npend; i++) {
        const int id = p->pend[i];
        staging_rec_t *r = &p->rec[id];
        bool skip = false;
        for (int b = 0; b < nblocked && !skip; b++) skip = blocked[b] == r->stream;
        if (!skip && kern_event_query(p->dev, r->ev)) {
            rec_free(p, id);
            freed = true;
            continue;
        }
        /* work on one stream completes in order: later records on it are not done either */
        if (!skip && nblocked < MAX_BLOCKED) blocked[nblocked++] = r->stream;
        p->pend[keep++] = id;
    }
    p->npend = keep;
    if (freed) sample(p);
}

void moe_staging_drain(moe_staging_t *p) {
    for (int i = 0; i < p->npend; i++) kern_event_sync(p->dev, p->rec[p->pend[i]].ev);
    moe_staging_poll(p);
}
