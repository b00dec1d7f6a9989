/* `moetune bench staging` (see staging_bench.h).
 *
 * What it models: the executor's weight streaming with a prefetch window
 * of W blocks (embedding, L MoE layers, final norm + lm_head), forward then
 * backward, each layer fetching its dense tensors and only the A experts
 * (of E) that got tokens in this step; in backward each block's gradients
 * go D2H and are added into host fp32 accumulators.  Device destinations
 * are a ring of W + 1 block buffers, each block's tensors laid out
 * contiguously (moe_staging_layout), the next user of a buffer waiting for
 * the gradient copy that reads it.  No compute runs (--compute-us sleeps
 * per block if wanted): the run measures the transfer path alone.
 *
 * Every mode gets the pinned capacity its layout needs for the same
 * in-flight window (W fetched blocks + 1 block of gradients, sized by
 * moe_staging_plan_bytes), except max_slot, which gets --slots slots
 * (default 5, ZeRO-Infinity's buffer_count): one embedding-sized slot per
 * tensor of the window would pin gigabytes here (the CPU backend mlocks).
 * The planned same-window ratio is printed beside the measured one.
 *
 * Baseline in the same run: compact's throughput is reported against
 * per_tensor's, and the host gradient accumulators of every mode are
 * compared bit for bit (the staging layout must not change results). */
#include "tools/bench/staging_bench.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kernels/device.h"
#include "moe/staging.h"
#include "moe/staging_report.h"
#include "base/clock.h"
#include "tools/build_info.h"

typedef struct {
    int layers, experts, active, hidden, inter, vocab, window, steps, slots, slabs, repeats;
    double gbps, latency_us, compute_us;
    bool pack_thread, json;
    uint64_t seed;
    const char *svg, *csv;
    int modes[MOE_STAGING_MODE_COUNT], nmodes;
} opts_t;

/* One block's tensors: host masters and gradient accumulators (pageable). */
typedef struct {
    int n, dense;   /* tensors; the first `dense` are not experts */
    size_t *bytes;
    float **w, **g;
} block_t;

typedef struct {
    opts_t o;
    int nb;
    block_t *blk;
    size_t max_span;
    uint8_t *active; /* (steps + 1, L, E) expert got tokens */
} model_t;

typedef struct {
    moe_staging_mode_t mode;
    double step_s, bytes_per_step;
    int max_copies_per_batch[MOE_STAGING_DIRS];
    moe_staging_stats_t st;
    uint64_t grad_hash;
    moe_staging_timeline_t *tl;
} result_t;

static uint64_t rng_next(uint64_t *s) {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return *s * 2685821657736338717ull;
}

static void usage(FILE *f) {
    fprintf(f, "usage: moetune bench staging [--layers L] [--experts E] [--active A] [--hidden H] [--inter I]\n"
               "         [--vocab V] [--window W] [--steps S] [--repeats R] [--gbps G] [--latency-us U]\n"
               "         [--compute-us C]"
               "         [--slots N] [--slabs N] [--modes compact,per_tensor,max_slot] [--no-pack-thread]\n"
               "         [--seed X]"
               "         [--svg PATH] [--csv PATH] [--json]\n");
}

static int parse(int argc, char **argv, opts_t *o) {
    *o = (opts_t){.layers = 8, .experts = 64, .active = 48, .hidden = 256, .inter = 96, .vocab = 16384,
                  .window = 2, .steps = 2, .repeats = 3, .slots = 5, .slabs = MOE_STAGING_SLABS_AUTO, .gbps = 2, .latency_us = 10, .pack_thread = true,
                  .seed = 42, .modes = {0, 1, 2}, .nmodes = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        struct { const char *name; int *ip; double *dp; int min; } num[] = {
            {"--layers", &o->layers, NULL, 1}, {"--experts", &o->experts, NULL, 1}, {"--active", &o->active, NULL, 0},
            {"--hidden", &o->hidden, NULL, 8}, {"--inter", &o->inter, NULL, 1}, {"--vocab", &o->vocab, NULL, 1},
            {"--window", &o->window, NULL, 1}, {"--steps", &o->steps, NULL, 1}, {"--slots", &o->slots, NULL, 0},
            {"--slabs", &o->slabs, NULL, 1}, /* default: the pool's automatic count */
            {"--repeats", &o->repeats, NULL, 1},
            {"--gbps", NULL, &o->gbps, 0}, {"--latency-us", NULL, &o->latency_us, 0},
            {"--compute-us", NULL, &o->compute_us, 0},
        };
        bool done = false;
        for (size_t k = 0; k < sizeof num / sizeof num[0] && !done; k++) {
            if (strcmp(a, num[k].name) != 0) continue;
            char *end = NULL;
            const double x = v ? strtod(v, &end) : 0;
            if (!v || !end || *end || x < num[k].min || x > 1e9 || (num[k].ip && x != (double)(int)x)) {
                fprintf(stderr, "bench staging: %s needs a number >= %d, got %s\n", a, num[k].min, v ? v : "nothing");
                return 2;
            }
            if (num[k].ip) *num[k].ip = (int)x;
            else *num[k].dp = x;
            i++;
            done = true;
        }
        if (done) continue;
        if (strcmp(a, "--json") == 0) o->json = true;
        else if (strcmp(a, "--no-pack-thread") == 0) o->pack_thread = false;
        else if ((strcmp(a, "--svg") == 0 || strcmp(a, "--csv") == 0 || strcmp(a, "--seed") == 0) && v) {
            if (a[2] == 's' && a[3] == 'v') o->svg = v;
            else if (a[2] == 'c') o->csv = v;
            else o->seed = strtoull(v, NULL, 0);
            i++;
        } else if (strcmp(a, "--modes") == 0 && v) {
            o->nmodes = 0;
            char buf[256];
            snprintf(buf, sizeof buf, "%s", v);
            for (char *tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
                moe_staging_mode_t m;
                if (!moe_staging_mode_parse(tok, &m) || o->nmodes == MOE_STAGING_MODE_COUNT) {
                    fprintf(stderr, "bench staging: --modes: unknown or repeated mode '%s' (compact, per_tensor, "
                                    "max_slot)\n", tok);
                    return 2;
                }
                o->modes[o->nmodes++] = m;
            }
            i++;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 3;
        } else {
            fprintf(stderr, "bench staging: unknown option or missing value: %s\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (o->active > o->experts) {
        fprintf(stderr, "bench staging: --active %d exceeds --experts %d\n", o->active, o->experts);
        return 2;
    }
    if (o->nmodes == 0) {
        fprintf(stderr, "bench staging: --modes lists no mode\n");
        return 2;
    }
    return 0;
}

/* ---- the model ------------------------------------------------------------- */

static void block_init(block_t *b, const size_t *bytes, int n, int dense, uint64_t *rng) {
    b->n = n;
    b->dense = dense;
    b->bytes = malloc((size_t)n * sizeof *b->bytes);
    b->w = malloc((size_t)n * sizeof *b->w);
    b->g = malloc((size_t)n * sizeof *b->g);
    MT_CHECK(b->bytes && b->w && b->g, "out of host memory for the bench model");
    for (int k = 0; k < n; k++) {
        b->bytes[k] = bytes[k];
        b->w[k] = malloc(bytes[k]);
        b->g[k] = calloc(1, bytes[k]);
        MT_CHECK(b->w[k] && b->g[k], "out of host memory for the bench model");
        for (size_t j = 0; j < bytes[k] / sizeof(float); j++)
            b->w[k][j] = (float)((double)(rng_next(rng) >> 40) / 16777216.0 - 0.5);
    }
}

static void model_init(model_t *m, const opts_t *o) {
    memset(m, 0, sizeof *m);
    m->o = *o;
    m->nb = o->layers + 2;
    m->blk = calloc((size_t)m->nb, sizeof *m->blk);
    MT_CHECK_ALLOC(m->blk, "bench blocks");
    uint64_t rng = o->seed * 0x9e3779b97f4a7c15ull + 1;
    const size_t f = sizeof(float), H = (size_t)o->hidden, V = (size_t)o->vocab;
    size_t *t = malloc((size_t)(16 + 3 * o->experts) * sizeof *t);
    MT_CHECK_ALLOC(t, "bench tensor list");
    t[0] = V * H * f; /* embed_tokens */
    block_init(&m->blk[0], t, 1, 1, &rng);
    for (int l = 0; l < o->layers; l++) {
        int n = 0;
        t[n++] = H * f, t[n++] = H * H * f, t[n++] = H / 4 * H * f, t[n++] = H / 4 * H * f; /* norm, q, k, v */
        t[n++] = H * H * f, t[n++] = H * f, t[n++] = (size_t)o->experts * H * f;            /* o, norm, router */
        const int dense = n;
        for (int e = 0; e < 3 * o->experts; e++) t[n++] = (size_t)o->inter * H * f;        /* gate, up, down */
        block_init(&m->blk[l + 1], t, n, dense, &rng);
    }
    t[0] = H * f, t[1] = V * H * f; /* final norm, lm_head */
    block_init(&m->blk[m->nb - 1], t, 2, 2, &rng);
    free(t);
    /* which experts get tokens, per step (warm-up included) and layer: A of E */
    const int S = o->steps + 1;
    m->active = calloc((size_t)S * o->layers * o->experts, 1);
    MT_CHECK_ALLOC(m->active, "bench routing");
    for (int s = 0; s < S; s++)
        for (int l = 0; l < o->layers; l++) {
            uint8_t *a = &m->active[((size_t)s * o->layers + l) * o->experts];
            for (int k = 0; k < o->active;) {
                const int e = (int)(rng_next(&rng) % (uint64_t)o->experts);
                if (!a[e]) a[e] = 1, k++;
            }
        }
}

static void model_free(model_t *m) {
    for (int b = 0; b < m->nb; b++) {
        for (int k = 0; k < m->blk[b].n; k++) {
            free(m->blk[b].w[k]);
            free(m->blk[b].g[k]);
        }
        free(m->blk[b].bytes);
        free(m->blk[b].w);
        free(m->blk[b].g);
    }
    free(m->blk);
    free(m->active);
}

/* The tensors block b moves in step s (dense + active experts), as indices. */
static int block_tensors(const model_t *m, int s, int b, int *idx) {
    const block_t *B = &m->blk[b];
    int n = 0;
    for (int k = 0; k < B->dense; k++) idx[n++] = k;
    if (b == 0 || b == m->nb - 1) return n;
    const uint8_t *a = &m->active[((size_t)s * m->o.layers + (b - 1)) * m->o.experts];
    for (int k = B->dense; k < B->n; k++)
        if (a[(k - B->dense) / 3]) idx[n++] = k;
    return n;
}

/* ---- one mode --------------------------------------------------------------- */

typedef struct {
    model_t *m;
    kern_device_t *dev;
    moe_staging_t *pool;
    void **buf;               /* W + 1 device block buffers */
    kern_event_t **buf_free;  /* per buffer: its last gradient copy is done */
    kern_event_t **ready;     /* per block: its weights arrived */
    int *slot;                /* per block: its buffer */
    int next_slot;
    int *idx;
    size_t *off, *sz;
    moe_staging_xfer_t *items;
    result_t *r;
} run_t;

static void track_batch(run_t *R, int dir, const moe_staging_stats_t *before) {
    moe_staging_stats_t after;
    moe_staging_get_stats(R->pool, MOE_STAGING_SCOPE_TOTAL, &after);
    const int c = (int)(after.copies[dir] - before->copies[dir]);
    if (c > R->r->max_copies_per_batch[dir]) R->r->max_copies_per_batch[dir] = c;
}

static int layout_block(run_t *R, int s, int b) {
    const block_t *B = &R->m->blk[b];
    const int n = block_tensors(R->m, s, b, R->idx);
    for (int k = 0; k < n; k++) R->sz[k] = B->bytes[R->idx[k]];
    moe_staging_layout(R->sz, n, MT_ARENA_ALIGN, R->off);
    return n;
}

static mt_status_t fetch(run_t *R, int s, int b, mt_error_t *err) {
    kern_device_t *dev = R->dev;
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    const int slot = R->next_slot++ % (R->m->o.window + 1);
    R->slot[b] = slot;
    kern_stream_wait_event(dev, h2d, R->buf_free[slot]); /* the buffer's gradients have left */
    const block_t *B = &R->m->blk[b];
    const int n = layout_block(R, s, b);
    for (int k = 0; k < n; k++)
        R->items[k] = (moe_staging_xfer_t){B->w[R->idx[k]], (char *)R->buf[slot] + R->off[k], R->sz[k], MOE_STAGING_COPY};
    if (b > 0 && b < R->m->nb - 1) moe_staging_count_skipped(R->pool, R->m->o.experts - R->m->o.active);
    char tag[64];
    snprintf(tag, sizeof tag, "weights of block %d", b);
    moe_staging_stats_t before;
    moe_staging_get_stats(R->pool, MOE_STAGING_SCOPE_TOTAL, &before);
    mt_status_t st = moe_staging_h2d_batch(R->pool, h2d, R->items, n, &(moe_staging_batch_t){tag, MT_ARENA_ALIGN}, err);
    track_batch(R, MOE_STAGING_H2D, &before);
    kern_event_record(dev, R->ready[b], h2d);
    return st;
}

static mt_status_t grads(run_t *R, int s, int b, mt_error_t *err) {
    kern_device_t *dev = R->dev;
    kern_stream_t *d2h = kern_stream(dev, KERN_STREAM_D2H);
    const block_t *B = &R->m->blk[b];
    const int n = layout_block(R, s, b);
    const int slot = R->slot[b];
    /* the device buffer stands in for the block's gradients */
    for (int k = 0; k < n; k++)
        R->items[k] = (moe_staging_xfer_t){B->g[R->idx[k]], (char *)R->buf[slot] + R->off[k], R->sz[k], MOE_STAGING_ADD_F32};
    char tag[64];
    snprintf(tag, sizeof tag, "gradients of block %d", b);
    moe_staging_stats_t before;
    moe_staging_get_stats(R->pool, MOE_STAGING_SCOPE_TOTAL, &before);
    mt_status_t st = moe_staging_d2h_batch(R->pool, d2h, R->items, n, &(moe_staging_batch_t){tag, MT_ARENA_ALIGN}, err);
    track_batch(R, MOE_STAGING_D2H, &before);
    kern_event_record(dev, R->buf_free[slot], d2h);
    return st;
}

static void compute(run_t *R, int b) {
    kern_event_sync(R->dev, R->ready[b]); /* the compute stream would wait here */
    if (R->m->o.compute_us > 0) {
        const double until = mt_now_s() + R->m->o.compute_us * 1e-6;
        while (mt_now_s() < until) {
        }
    }
}

static mt_status_t step(run_t *R, int s, mt_error_t *err) {
    const int nb = R->m->nb, W = R->m->o.window;
    mt_status_t st = MT_OK;
    int issued = -1;
    for (int b = 0; b < nb && st == MT_OK; b++) {
        while (st == MT_OK && issued < b + W - 1 && issued < nb - 1) st = fetch(R, s, ++issued, err);
        compute(R, b);
    }
    issued = nb;
    for (int b = nb - 1; b >= 0 && st == MT_OK; b--) {
        while (st == MT_OK && issued > b - W + 1 && issued > 0) st = fetch(R, s, --issued, err);
        compute(R, b);
        if (st == MT_OK) st = grads(R, s, b, err);
    }
    kern_device_sync(R->dev);
    moe_staging_poll(R->pool);
    return st;
}

/* Pinned bytes `mode` needs for the largest window of W + 1 consecutive blocks. */
static size_t window_capacity(const model_t *m, moe_staging_mode_t mode, size_t largest, int slots) {
    const int W = m->o.window + 1;
    size_t best = 0, *t = malloc(sizeof *t * (size_t)(W * (16 + 3 * m->o.experts)));
    int *idx = malloc(sizeof *idx * (size_t)(16 + 3 * m->o.experts));
    MT_CHECK(t && idx, "out of host memory");
    for (int b0 = 0; b0 + W <= m->nb || b0 == 0; b0++) {
        int n = 0;
        for (int b = b0; b < b0 + W && b < m->nb; b++) {
            const int k = block_tensors(m, 0, b, idx);
            for (int j = 0; j < k; j++) t[n++] = m->blk[b].bytes[idx[j]];
        }
        const moe_staging_plan_opts_t po = {.largest_tensor = largest, .slots = slots};
        const size_t c = moe_staging_plan_bytes(mode, t, n, &po);
        if (c > best) best = c;
    }
    free(t);
    free(idx);
    return best;
}

static uint64_t hash_grads(const model_t *m) {
    uint64_t h = 1469598103934665603ull;
    for (int b = 0; b < m->nb; b++)
        for (int k = 0; k < m->blk[b].n; k++) {
            const unsigned char *p = (const unsigned char *)m->blk[b].g[k];
            for (size_t j = 0; j < m->blk[b].bytes[k]; j++) h = (h ^ p[j]) * 1099511628211ull;
        }
    return h;
}

static int run_mode(model_t *m, moe_staging_mode_t mode, result_t *r) {
    const opts_t *o = &m->o;
    memset(r, 0, sizeof *r);
    r->mode = mode;
    for (int b = 0; b < m->nb; b++)
        for (int k = 0; k < m->blk[b].n; k++) memset(m->blk[b].g[k], 0, m->blk[b].bytes[k]);
    size_t largest = 0, span = 0;
    for (int b = 0; b < m->nb; b++) {
        size_t sz = 0;
        for (int k = 0; k < m->blk[b].n; k++) {
            if (m->blk[b].bytes[k] > largest) largest = m->blk[b].bytes[k];
            sz += (m->blk[b].bytes[k] + MT_ARENA_ALIGN - 1) / MT_ARENA_ALIGN * MT_ARENA_ALIGN;
        }
        if (sz > span) span = sz;
    }
    const kern_device_opts_t dopts = {.device_budget_bytes = (size_t)(o->window + 1) * span + (1 << 20),
                                      .host_threads = 1, .link_h2d_bytes_per_s = o->gbps * 1e9,
                                      .link_d2h_bytes_per_s = o->gbps * 1e9, .link_latency_s = o->latency_us * 1e-6};
    run_t R = {.m = m, .r = r};
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &dopts, &R.dev, &err) != MT_OK) {
        fprintf(stderr, "bench staging: %s\n", err.msg);
        return 1;
    }
    moe_staging_opts_t so;
    moe_staging_opts_init(&so, mode);
    so.max_tensor_bytes = largest;
    so.max_tensor_name = "embed_tokens";
    so.pack_thread = o->pack_thread;
    so.num_slabs = o->slabs;
    if (mode == MOE_STAGING_MAX_SLOT && o->slots > 0) so.num_slots = o->slots;
    else so.capacity_bytes = window_capacity(m, mode, largest, 0);
    int rc = 0;
    if (moe_staging_create(R.dev, &so, &R.pool, &err) != MT_OK) {
        fprintf(stderr, "bench staging: %s\n", err.msg);
        kern_device_destroy(R.dev);
        return 1;
    }
    const int W1 = o->window + 1, maxn = 16 + 3 * o->experts;
    R.buf = calloc((size_t)W1, sizeof *R.buf);
    R.buf_free = calloc((size_t)W1, sizeof *R.buf_free);
    R.ready = calloc((size_t)m->nb, sizeof *R.ready);
    R.slot = calloc((size_t)m->nb, sizeof *R.slot);
    R.idx = calloc((size_t)maxn, sizeof *R.idx);
    R.off = calloc((size_t)maxn, sizeof *R.off);
    R.sz = calloc((size_t)maxn, sizeof *R.sz);
    R.items = calloc((size_t)maxn, sizeof *R.items);
    MT_CHECK(R.buf && R.buf_free && R.ready && R.slot && R.idx && R.off && R.sz && R.items, "out of host memory");
    for (int k = 0; k < W1; k++) {
        R.buf[k] = kern_alloc(R.dev, span, "block buffer", &err);
        MT_CHECK(R.buf[k] != NULL, "bench staging: %s", err.msg);
        R.buf_free[k] = kern_event_create(R.dev);
    }
    for (int b = 0; b < m->nb; b++) R.ready[b] = kern_event_create(R.dev);

    /* step 0 warms up (first touch of pinned pages, thread start); counters
     * are then taken over the timed steps, peaks over the whole run */
    double t_total = 0;
    moe_staging_stats_t warm = {0};
    for (int s = 0; s <= o->steps && rc == 0; s++) {
        moe_staging_step_begin(R.pool);
        if (s == 1) moe_staging_get_stats(R.pool, MOE_STAGING_SCOPE_TOTAL, &warm);
        const double t0 = mt_now_s();
        if (step(&R, s, &err) != MT_OK) {
            fprintf(stderr, "bench staging (%s): %s\n", moe_staging_mode_name(mode), err.msg);
            rc = 1;
        }
        if (s > 0) t_total += mt_now_s() - t0;
    }
    moe_staging_get_stats(R.pool, MOE_STAGING_SCOPE_TOTAL, &r->st);
    for (int d = 0; d < MOE_STAGING_DIRS; d++) {
        r->st.copies[d] -= warm.copies[d];
        r->st.bytes[d] -= warm.bytes[d];
        r->st.tensors[d] -= warm.tensors[d];
        r->st.mean_copy_bytes[d] = r->st.copies[d] ? (double)r->st.bytes[d] / (double)r->st.copies[d] : 0;
    }
    r->st.experts_skipped -= warm.experts_skipped;
    r->st.reservations -= warm.reservations;
    r->st.waits -= warm.waits;
    r->st.wait_s -= warm.wait_s;
    r->st.pack_s -= warm.pack_s;
    r->step_s = t_total / o->steps;
    r->bytes_per_step = (double)(r->st.bytes[0] + r->st.bytes[1]) / o->steps;
    r->tl = moe_staging_timeline_copy(R.pool);
    r->grad_hash = hash_grads(m);
    moe_staging_destroy(R.pool);
    for (int k = 0; k < W1; k++) {
        kern_free(R.dev, R.buf[k]);
        kern_event_destroy(R.dev, R.buf_free[k]);
    }
    for (int b = 0; b < m->nb; b++) kern_event_destroy(R.dev, R.ready[b]);
    kern_device_destroy(R.dev);
    free(R.buf), free(R.buf_free), free(R.ready), free(R.slot), free(R.idx), free(R.off), free(R.sz), free(R.items);
    return rc;
}

/* ---- report ------------------------------------------------------------------ */

static const result_t *find(const result_t *r, int n, moe_staging_mode_t m) {
    for (int k = 0; k < n; k++)
        if (r[k].mode == m) return &r[k];
    return NULL;
}

int mt_bench_staging_main(int argc, char **argv) {
    opts_t o;
    const int prc = parse(argc, argv, &o);
    if (prc) return prc == 3 ? 0 : prc;
    model_t m;
    model_init(&m, &o);
    /* modes run in turn, `repeats` rounds; each keeps its fastest round (load
     * from other processes only ever slows a round down) */
    result_t res[MOE_STAGING_MODE_COUNT] = {0};
    int rc = 0;
    bool identical = true;
    for (int rep = 0; rep < o.repeats && rc == 0; rep++)
        for (int k = 0; k < o.nmodes && rc == 0; k++) {
            result_t r;
            rc = run_mode(&m, (moe_staging_mode_t)o.modes[k], &r);
            if (rc) break;
            identical &= r.grad_hash == (rep || k ? res[0].grad_hash : r.grad_hash);
            if (rep == 0 || r.step_s < res[k].step_s) {
                moe_staging_timeline_free(res[k].tl);
                res[k] = r;
            } else {
                moe_staging_timeline_free(r.tl);
            }
        }
    if (rc) {
        for (int k = 0; k < o.nmodes; k++) moe_staging_timeline_free(res[k].tl);
        model_free(&m);
        return rc;
    }
    const result_t *c = find(res, o.nmodes, MOE_STAGING_COMPACT), *p = find(res, o.nmodes, MOE_STAGING_PER_TENSOR),
                   *s = find(res, o.nmodes, MOE_STAGING_MAX_SLOT);
    const double thr_ratio = c && p ? p->step_s / c->step_s : 0;
    const double slot_ratio = c && s ? (double)s->st.peak_reserved / (double)c->st.peak_reserved : 0;
    size_t largest = 0;
    for (int b = 0; b < m.nb; b++)
        for (int k = 0; k < m.blk[b].n; k++)
            if (m.blk[b].bytes[k] > largest) largest = m.blk[b].bytes[k];
    const double planned_ratio = (double)window_capacity(&m, MOE_STAGING_MAX_SLOT, largest, 0) /
                                 (double)window_capacity(&m, MOE_STAGING_COMPACT, largest, 0);
    const double steps_run = o.steps; /* counters cover the timed steps */
    char build[256];
    mt_build_info_line(build, sizeof build);
    if (o.json) {
        printf("{\"build\": \"%s\", \"config\": {\"layers\": %d, \"experts\": %d, \"active\": %d, \"hidden\": %d, \"inter\": %d, "
               "\"vocab\": %d, \"window\": %d, \"steps\": %d, \"repeats\": %d, \"gbps\": %g, \"latency_us\": %g, "
               "\"slots\": %d, \"pack_thread\": %s},\n \"modes\": [",
               build, o.layers, o.experts, o.active, o.hidden, o.inter, o.vocab, o.window, o.steps, o.repeats, o.gbps,
               o.latency_us, o.slots, o.pack_thread ? "true" : "false");
        for (int k = 0; k < o.nmodes; k++) {
            printf("%s\n  {\"step_s\": %.6f, \"gb_per_s\": %.4f, \"copies_per_step\": [%.1f, %.1f], "
                   "\"max_copies_per_block\": [%d, %d], \"stats\": ",
                   k ? "," : "", res[k].step_s, res[k].bytes_per_step / res[k].step_s / 1e9,
                   (double)res[k].st.copies[0] / steps_run, (double)res[k].st.copies[1] / steps_run,
                   res[k].max_copies_per_batch[0], res[k].max_copies_per_batch[1]);
            moe_staging_print_stats_json(stdout, moe_staging_mode_name(res[k].mode), &res[k].st);
            printf("}");
        }
        printf("],\n \"compact_vs_per_tensor_throughput\": %.4f, \"max_slot_vs_compact_pinned\": %.3f, "
               "\"max_slot_vs_compact_pinned_same_window_planned\": %.3f, \"identical_across_modes\": %s}\n",
               thr_ratio, slot_ratio, planned_ratio, identical ? "true" : "false");
    } else {
        printf("%s\n", build);
        printf("staging bench: %d MoE layers (%d of %d experts of %dx%d fp32 active) + embedding/lm_head %dx%d, "
               "window %d blocks, link %.1f GB/s + %.0f us per copy, best of %d rounds of %d timed steps\n",
               o.layers, o.active, o.experts, o.inter, o.hidden, o.vocab, o.hidden, o.window, o.gbps, o.latency_us,
               o.repeats, o.steps);
        printf("%-11s %9s %7s %10s %10s %10s %10s %10s %7s %12s\n", "mode", "step ms", "GB/s", "H2D/step",
               "D2H/step", "mean copy", "reserved", "in use", "waste", "waited");
        for (int k = 0; k < o.nmodes; k++) {
            const result_t *r = &res[k];
            char a[32], b[32], d[32];
            printf("%-11s %9.2f %7.3f %10.0f %10.0f %10s %10s %10s %6.1f%% %5llu %5.1fms\n",
                   moe_staging_mode_name(r->mode), r->step_s * 1e3, r->bytes_per_step / r->step_s / 1e9,
                   (double)r->st.copies[0] / steps_run, (double)r->st.copies[1] / steps_run,
                   moe_staging_fmt_bytes((double)(r->st.bytes[0] + r->st.bytes[1]) /
                                             (double)(r->st.copies[0] + r->st.copies[1] ? r->st.copies[0] + r->st.copies[1] : 1),
                                         a, sizeof a),
                   moe_staging_fmt_bytes((double)r->st.peak_reserved, b, sizeof b),
                   moe_staging_fmt_bytes((double)r->st.peak_in_use, d, sizeof d), r->st.waste_pct,
                   (unsigned long long)r->st.waits, r->st.wait_s * 1e3 / steps_run);
        }
        if (c)
            printf("compact: at most %d H2D / %d D2H copies per block per direction\n", c->max_copies_per_batch[0],
                   c->max_copies_per_batch[1]);
        if (c && p) printf("compact throughput / per_tensor: %.3f (goal >= 0.95)\n", thr_ratio);
        if (c && s)
            printf("max_slot / compact pinned bytes: %.2f measured (%d slots), %.1f planned for the same window\n",
                   slot_ratio, o.slots, planned_ratio);
        printf("host gradients bit-identical across modes: %s\n", identical ? "yes" : "NO");
    }
    mt_error_t err = {0};
    const moe_staging_timeline_t *tls[MOE_STAGING_MODE_COUNT];
    for (int k = 0; k < o.nmodes; k++) tls[k] = res[k].tl;
    if (o.svg && moe_staging_write_svg(tls, o.nmodes, o.svg, &err) != MT_OK) {
        fprintf(stderr, "bench staging: %s\n", err.msg);
        rc = 1;
    }
    if (o.csv && moe_staging_write_csv_timelines(tls, o.nmodes, o.csv, &err) != MT_OK) {
        fprintf(stderr, "bench staging: %s\n", err.msg);
        rc = 1;
    }
    for (int k = 0; k < o.nmodes; k++) moe_staging_timeline_free(res[k].tl);
    model_free(&m);
    if (!identical) {
        fprintf(stderr, "bench staging: host gradients differ between modes\n");
        rc = 1;
    }
    return rc;
}
