/* Expert parallelism for the MoE block against the single-device block.
 *
 * Two (and three) CPU devices, each on its own thread with its own
 * micro-batch (13, 9 and 11 tokens), own the routed experts
 * [d*E/N, (d+1)*E/N) and hold only those (the others' weight pointers are
 * NULL, so touching one crashes); another device runs the plain block on
 * every micro-batch in turn, as one device accumulating a step's gradients
 * would.  Asserted, bit for bit:
 *   - each device's output y and input gradient dxn equal the reference's
 *     for that micro-batch;
 *   - every routed expert's weight gradients (gate, up, down) on its owner
 *     equal the reference's after all micro-batches (the owner adds
 *     device 0's rows' share, then device 1's, ...: the micro-batch order; the
 *     accumulators start non-zero, so the order shows);
 *   - each device's router and shared-expert gradients equal those of the
 *     plain block run on its micro-batch alone (they stay data parallel).
 * With fp32 and with bf16 compute (bf16 weights, gathered rows and routed
 * experts' g, u and outputs), with E
 * a multiple of the device count and not (uneven ownership), and the
 * routing is checked to send rows off every device.  Then a device that fails inside the block (its expert fetch
 * errs) must make its peer return an error, not wait forever. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/dtype.h"
#include "kernels/device.h"
#include "moe/expert_parallel.h"
#include "moe/moe_layer.h"

static int failures;
#define EXPECT(c, ...)                                           \
    do {                                                         \
        if (!(c)) {                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                        \
            fprintf(stderr, "\n");                               \
            failures++;                                          \
        }                                                        \
    } while (0)

enum { NDEV = 3, MAXE = 8 }; /* NDEV: the most devices a case runs */
static const int k_tokens[NDEV] = {13, 9, 11};

typedef struct {
    moe_layer_dims_t d;
    float *router, *gate[MAXE], *up[MAXE], *down[MAXE], *sh_gate, *sh_up, *sh_down, *sh_eg;
    float *xn[NDEV], *dy[NDEV];
} host_t;

static unsigned long rng_state;
static float rnd(float scale) {
    rng_state = rng_state * 6364136223846793005ul + 1442695040888963407ul;
    return scale * ((float)((rng_state >> 33) % 2000001) / 1000000.0f - 1.0f);
}
static float *rnd_vec(size_t n, float scale) {
    float *v = malloc(n * sizeof *v);
    for (size_t i = 0; i < n; i++) v[i] = rnd(scale);
    return v;
}

static moe_layer_dims_t dims(int E, mt_dtype_t compute) {
    const int H = 24, k = 2, I = 12, Is = 8;
    moe_layer_dims_t d = {.H = H, .E = E, .k = k, .I = I, .Is = Is,
                          .router_mode = KERN_ROUTER_SOFTMAX_TOPK_RENORM, .compute = compute};
    const moe_act_size_t f32 = {0, 0, MT_F32}, i32 = {0, 0, MT_I32};
    moe_act_size_t *a = d.acts;
    a[MOE_ACT_LOGITS] = f32, a[MOE_ACT_LOGITS].per_token = E;
    a[MOE_ACT_PROBS] = f32, a[MOE_ACT_PROBS].per_token = E;
    a[MOE_ACT_TOPW] = f32, a[MOE_ACT_TOPW].per_token = k;
    a[MOE_ACT_IDX] = i32, a[MOE_ACT_IDX].per_token = k;
    a[MOE_ACT_COUNTS] = i32, a[MOE_ACT_COUNTS].fixed = E;
    a[MOE_ACT_OFFSETS] = i32, a[MOE_ACT_OFFSETS].fixed = E + 1;
    a[MOE_ACT_PERM] = i32, a[MOE_ACT_PERM].per_token = k;
    a[MOE_ACT_INV] = i32, a[MOE_ACT_INV].per_token = k;
    a[MOE_ACT_XP] = (moe_act_size_t){(int64_t)k * H, 0, compute};
    /* the routed experts' activations in the compute dtype, as the engine
     * describes them (bf16 outputs cross between devices as bf16) */
    a[MOE_ACT_G] = (moe_act_size_t){(int64_t)k * I, 0, compute};
    a[MOE_ACT_U] = (moe_act_size_t){(int64_t)k * I, 0, compute};
    a[MOE_ACT_EP] = (moe_act_size_t){(int64_t)k * H, 0, compute};
    a[MOE_ACT_SG] = f32, a[MOE_ACT_SG].per_token = Is;
    a[MOE_ACT_SU] = f32, a[MOE_ACT_SU].per_token = Is;
    a[MOE_ACT_SO] = f32, a[MOE_ACT_SO].per_token = H;
    a[MOE_ACT_SGL] = f32, a[MOE_ACT_SGL].per_token = 1;
    return d;
}

static void host_init(host_t *h, int E, mt_dtype_t compute) {
    memset(h, 0, sizeof *h);
    h->d = dims(E, compute);
    const int H = h->d.H, I = h->d.I, Is = h->d.Is;
    rng_state = 12345u + (unsigned)E;
    h->router = rnd_vec((size_t)E * H, 0.5f);
    for (int e = 0; e < E; e++) {
        h->gate[e] = rnd_vec((size_t)I * H, 0.3f);
        h->up[e] = rnd_vec((size_t)I * H, 0.3f);
        h->down[e] = rnd_vec((size_t)H * I, 0.3f);
    }
    h->sh_gate = rnd_vec((size_t)Is * H, 0.3f);
    h->sh_up = rnd_vec((size_t)Is * H, 0.3f);
    h->sh_down = rnd_vec((size_t)H * Is, 0.3f);
    h->sh_eg = rnd_vec((size_t)H, 0.3f);
    for (int b = 0; b < NDEV; b++) {
        h->xn[b] = rnd_vec((size_t)k_tokens[b] * H, 1.0f);
        h->dy[b] = rnd_vec((size_t)k_tokens[b] * H, 1.0f);
    }
}

static void host_free(host_t *h) {
    free(h->router);
    for (int e = 0; e < h->d.E; e++) {
        free(h->gate[e]);
        free(h->up[e]);
        free(h->down[e]);
    }
    free(h->sh_gate);
    free(h->sh_up);
    free(h->sh_down);
    free(h->sh_eg);
    for (int b = 0; b < NDEV; b++) {
        free(h->xn[b]);
        free(h->dy[b]);
    }
}

/* One device's copy of the layer: weights of experts [lo, hi) only. */
typedef struct {
    kern_device_t *dev;
    int lo, hi;
    moe_layer_params_t p, gp;
    void *ptr[6 * MAXE];
    void *allocs[8 * MAXE + 16];
    int nallocs;
} dev_layer_t;

static void *up_load(dev_layer_t *L, const float *src, size_t n, mt_dtype_t dt) {
    mt_error_t err = {0};
    void *p = kern_alloc(L->dev, n * mt_dtype_size(dt), "test weight", &err);
    MT_CHECK(p, "%s", err.msg);
    if (dt == MT_BF16) {
        uint16_t *t = malloc(n * sizeof *t);
        for (size_t i = 0; i < n; i++) t[i] = mt_f32_to_bf16(src[i]);
        kern_memcpy_h2d(L->dev, kern_stream(L->dev, KERN_STREAM_COMPUTE), p, t, n * sizeof *t);
        kern_device_sync(L->dev);
        free(t);
    } else {
        kern_memcpy_h2d(L->dev, kern_stream(L->dev, KERN_STREAM_COMPUTE), p, src, n * sizeof(float));
        kern_device_sync(L->dev);
    }
    L->allocs[L->nallocs++] = p;
    return p;
}

/* A gradient accumulator holding what earlier micro-batches left (the same
 * on every device): from zero, a + b == b + a would hide a wrong order of
 * the two micro-batches' shares; from g, (g + a) + b and (g + b) + a differ. */
static float *grad_acc(dev_layer_t *L, size_t n) {
    mt_error_t err = {0};
    float *p = kern_alloc(L->dev, n * sizeof(float), "test gradient", &err);
    MT_CHECK(p, "%s", err.msg);
    float *t = malloc(n * sizeof *t);
    for (size_t i = 0; i < n; i++) t[i] = 0.37f * sinf((float)i * 0.91f);
    kern_memcpy_h2d(L->dev, kern_stream(L->dev, KERN_STREAM_COMPUTE), p, t, n * sizeof *t);
    kern_device_sync(L->dev);
    free(t);
    L->allocs[L->nallocs++] = p;
    return p;
}

static void layer_init(dev_layer_t *L, kern_device_t *dev, const host_t *h, int lo, int hi) {
    memset(L, 0, sizeof *L);
    L->dev = dev;
    L->lo = lo;
    L->hi = hi;
    const int E = h->d.E, H = h->d.H, I = h->d.I, Is = h->d.Is;
    const mt_dtype_t wdt = h->d.compute; /* bf16 weights in a bf16 run, as the engine stores them */
    moe_layer_params_t *p = &L->p, *g = &L->gp;
    p->dtype = wdt;
    g->dtype = MT_F32;
    p->gate = L->ptr, p->up = L->ptr + E, p->down = L->ptr + 2 * E;
    g->gate = L->ptr + 3 * E, g->up = L->ptr + 4 * E, g->down = L->ptr + 5 * E;
    p->router = up_load(L, h->router, (size_t)E * H, MT_F32);
    g->router = grad_acc(L, (size_t)E * H);
    for (int e = lo; e < hi; e++) {
        p->gate[e] = up_load(L, h->gate[e], (size_t)I * H, wdt);
        p->up[e] = up_load(L, h->up[e], (size_t)I * H, wdt);
        p->down[e] = up_load(L, h->down[e], (size_t)H * I, wdt);
        g->gate[e] = grad_acc(L, (size_t)I * H);
        g->up[e] = grad_acc(L, (size_t)I * H);
        g->down[e] = grad_acc(L, (size_t)H * I);
    }
    p->sh_gate = up_load(L, h->sh_gate, (size_t)Is * H, wdt);
    p->sh_up = up_load(L, h->sh_up, (size_t)Is * H, wdt);
    p->sh_down = up_load(L, h->sh_down, (size_t)H * Is, wdt);
    p->sh_expert_gate = up_load(L, h->sh_eg, (size_t)H, wdt);
    g->sh_gate = grad_acc(L, (size_t)Is * H);
    g->sh_up = grad_acc(L, (size_t)Is * H);
    g->sh_down = grad_acc(L, (size_t)H * Is);
    g->sh_expert_gate = grad_acc(L, (size_t)H);
}

static void layer_free(dev_layer_t *L) {
    for (int i = 0; i < L->nallocs; i++) kern_free(L->dev, L->allocs[i]);
}

static float *download(kern_device_t *dev, const void *p, size_t n) {
    float *h = malloc(n * sizeof *h);
    kern_memcpy_d2h(dev, kern_stream(dev, KERN_STREAM_COMPUTE), h, p, n * sizeof *h);
    kern_device_sync(dev);
    return h;
}

/* One micro-batch forward and backward on L; results to the host. */
typedef struct {
    dev_layer_t *L;
    const host_t *h;
    int mb;
    moe_layer_acts_t acts;
    float *y, *dxn; /* host (n, H) */
    int32_t counts[MAXE];
    mt_status_t st_fwd, st_bwd;
    mt_error_t err;
} mb_run_t;

static void mb_forward(mb_run_t *r) {
    kern_device_t *dev = r->L->dev;
    const int n = k_tokens[r->mb], H = r->h->d.H;
    float *xn = kern_alloc(dev, (size_t)n * H * sizeof(float), "test xn", &r->err);
    float *y = kern_alloc(dev, (size_t)n * H * sizeof(float), "test y", &r->err);
    MT_CHECK(xn && y, "%s", r->err.msg);
    kern_memcpy_h2d(dev, kern_stream(dev, KERN_STREAM_COMPUTE), xn, r->h->xn[r->mb], (size_t)n * H * sizeof(float));
    kern_device_sync(dev);
    r->st_fwd = moe_layer_forward(dev, &r->h->d, &r->L->p, xn, n, y, &r->acts, &r->err);
    if (r->st_fwd == MT_OK) {
        r->y = download(dev, y, (size_t)n * H);
        memcpy(r->counts, r->acts.counts_host, (size_t)r->h->d.E * sizeof(int32_t));
    }
    kern_free(dev, y);
    kern_free(dev, xn);
}

static void mb_backward(mb_run_t *r) {
    kern_device_t *dev = r->L->dev;
    const int n = k_tokens[r->mb], H = r->h->d.H;
    float *xn = kern_alloc(dev, (size_t)n * H * sizeof(float), "test xn", &r->err);
    float *dy = kern_alloc(dev, (size_t)n * H * sizeof(float), "test dy", &r->err);
    float *dxn = kern_alloc(dev, (size_t)n * H * sizeof(float), "test dxn", &r->err);
    MT_CHECK(xn && dy && dxn, "%s", r->err.msg);
    kern_memcpy_h2d(dev, kern_stream(dev, KERN_STREAM_COMPUTE), xn, r->h->xn[r->mb], (size_t)n * H * sizeof(float));
    kern_memcpy_h2d(dev, kern_stream(dev, KERN_STREAM_COMPUTE), dy, r->h->dy[r->mb], (size_t)n * H * sizeof(float));
    kern_device_sync(dev);
    r->st_bwd = moe_layer_backward(dev, &r->h->d, &r->L->p, &r->L->gp, xn, dy, NULL, NULL, &r->acts, dxn, &r->err);
    if (r->st_bwd == MT_OK) r->dxn = download(dev, dxn, (size_t)n * H);
    kern_free(dev, dxn);
    kern_free(dev, dy);
    kern_free(dev, xn);
}

static void *ep_thread(void *arg) {
    mb_run_t *r = arg;
    mb_forward(r);
    if (r->st_fwd == MT_OK) mb_backward(r);
    else moe_layer_acts_release(r->L->dev, &r->acts);
    return NULL;
}

static bool same(const void *a, const void *b, size_t n, const char *what, int idx, const char *run) {
    if (memcmp(a, b, n * sizeof(float)) == 0) return true;
    const float *x = a, *y = b;
    size_t i = 0;
    while (i < n && memcmp(&x[i], &y[i], sizeof(float)) == 0) i++;
    fprintf(stderr, "%s: %s %d differs first at [%zu]: %.9g vs %.9g\n", run, what, idx, i, (double)x[i],
            (double)y[i]);
    return false;
}

static bool grads_same(dev_layer_t *a, dev_layer_t *b, void *pa, void *pb, size_t n, const char *what, int idx,
                       const char *run) {
    float *x = download(a->dev, pa, n), *y = download(b->dev, pb, n);
    const bool ok = same(x, y, n, what, idx, run);
    free(x);
    free(y);
    return ok;
}

static void run_case(int E, mt_dtype_t compute, int ndev) {
    char run[64];
    snprintf(run, sizeof run, "%d devices, E=%d %s", ndev, E, mt_dtype_name(compute));
    host_t h;
    host_init(&h, E, compute);
    const int H = h.d.H, I = h.d.I, Is = h.d.Is;
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 8 << 20, .host_threads = 1};
    kern_device_t *ref_dev = NULL, *devs[NDEV] = {0};
    MT_CHECK(kern_device_create(KERN_BACKEND_CPU, &o, &ref_dev, &err) == MT_OK, "%s", err.msg);
    for (int q = 0; q < ndev; q++)
        MT_CHECK(kern_device_create(KERN_BACKEND_CPU, &o, &devs[q], &err) == MT_OK, "%s", err.msg);

    /* the reference: one device, both micro-batches, gradients accumulated */
    dev_layer_t ref;
    layer_init(&ref, ref_dev, &h, 0, E);
    mb_run_t rr[NDEV];
    for (int b = 0; b < ndev; b++) {
        rr[b] = (mb_run_t){.L = &ref, .h = &h, .mb = b};
        mb_forward(&rr[b]);
        MT_CHECK(rr[b].st_fwd == MT_OK, "%s", rr[b].err.msg);
    }
    for (int b = 0; b < ndev; b++) {
        mb_backward(&rr[b]);
        MT_CHECK(rr[b].st_bwd == MT_OK, "%s", rr[b].err.msg);
    }
    /* each micro-batch alone: the data-parallel gradients (router, shared) */
    dev_layer_t alone[NDEV];
    for (int b = 0; b < ndev; b++) {
        layer_init(&alone[b], ref_dev, &h, 0, E);
        mb_run_t r = {.L = &alone[b], .h = &h, .mb = b};
        mb_forward(&r);
        mb_backward(&r);
        MT_CHECK(r.st_fwd == MT_OK && r.st_bwd == MT_OK, "%s", r.err.msg);
        free(r.y);
        free(r.dxn);
    }

    /* expert parallel: device q owns [lo_q, hi_q) and runs micro-batch q */
    kern_comm_t *comm = NULL;
    MT_CHECK(kern_comm_create(devs, ndev, &comm, &err) == MT_OK, "%s", err.msg);
    dev_layer_t L[NDEV];
    moe_ep_t ep[NDEV];
    mb_run_t er[NDEV];
    pthread_t th[NDEV];
    for (int q = 0; q < ndev; q++) {
        int lo, hi;
        moe_ep_range(E, ndev, q, &lo, &hi);
        layer_init(&L[q], devs[q], &h, lo, hi);
        ep[q] = (moe_ep_t){comm, q};
        L[q].p.ep = &ep[q];
        er[q] = (mb_run_t){.L = &L[q], .h = &h, .mb = q};
    }
    /* rows must leave every device, or the exchange is not exercised */
    int cross[NDEV] = {0};
    for (int q = 0; q < ndev; q++) {
        for (int e = 0; e < E; e++)
            if (e < L[q].lo || e >= L[q].hi) cross[q] += rr[q].counts[e];
        EXPECT(cross[q] > 0, "%s: no rows from device %d to the others", run, q);
    }

    for (int q = 0; q < ndev; q++) pthread_create(&th[q], NULL, ep_thread, &er[q]);
    for (int q = 0; q < ndev; q++) pthread_join(th[q], NULL);
    int bad = 0;
    for (int q = 0; q < ndev; q++) {
        EXPECT(er[q].st_fwd == MT_OK && er[q].st_bwd == MT_OK, "%s device %d: %s", run, q, er[q].err.msg);
        if (er[q].st_fwd != MT_OK || er[q].st_bwd != MT_OK) continue;
        const size_t nh = (size_t)k_tokens[q] * H;
        bad += !same(er[q].y, rr[q].y, nh, "output of micro-batch", q, run);
        bad += !same(er[q].dxn, rr[q].dxn, nh, "input gradient of micro-batch", q, run);
        for (int e = L[q].lo; e < L[q].hi; e++) {
            bad += !grads_same(&L[q], &ref, L[q].gp.gate[e], ref.gp.gate[e], (size_t)I * H,
                               "gate gradient of expert", e, run);
            bad += !grads_same(&L[q], &ref, L[q].gp.up[e], ref.gp.up[e], (size_t)I * H,
                               "up gradient of expert", e, run);
            bad += !grads_same(&L[q], &ref, L[q].gp.down[e], ref.gp.down[e], (size_t)H * I,
                               "down gradient of expert", e, run);
        }
        const moe_layer_params_t *ga = &alone[q].gp, *gq = &L[q].gp;
        bad += !grads_same(&L[q], &alone[q], gq->router, ga->router, (size_t)E * H, "router gradient, device", q, run);
        bad += !grads_same(&L[q], &alone[q], gq->sh_gate, ga->sh_gate, (size_t)Is * H, "shared gate gradient, device", q, run);
        bad += !grads_same(&L[q], &alone[q], gq->sh_up, ga->sh_up, (size_t)Is * H, "shared up gradient, device", q, run);
        bad += !grads_same(&L[q], &alone[q], gq->sh_down, ga->sh_down, (size_t)H * Is, "shared down gradient, device", q, run);
        bad += !grads_same(&L[q], &alone[q], gq->sh_expert_gate, ga->sh_expert_gate, (size_t)H, "shared expert gate gradient, device", q, run);
    }
    EXPECT(bad == 0, "%s: %d tensors not bit-identical to the single-device block", run, bad);
    printf("%s: rows leaving devices 0, 1: %d, %d; outputs, input and weight gradients bit-identical: %s\n", run,
           cross[0], cross[1], bad ? "NO" : "yes");

    for (int q = 0; q < ndev; q++) {
        free(er[q].y);
        free(er[q].dxn);
        layer_free(&L[q]);
        EXPECT(kern_device_stats(devs[q]).device_in_use == 0, "%s device %d: %zu bytes left allocated", run, q,
               kern_device_stats(devs[q]).device_in_use);
    }
    for (int b = 0; b < ndev; b++) {
        free(rr[b].y);
        free(rr[b].dxn);
        layer_free(&alone[b]);
    }
    layer_free(&ref);
    kern_comm_destroy(comm);
    for (int q = 0; q < ndev; q++) kern_device_destroy(devs[q]);
    kern_device_destroy(ref_dev);
    host_free(&h);
}

/* Device 1's expert fetch fails: device 0 must come back with an error. */
static mt_status_t failing_fetch(void *ctx, const int32_t *counts, void **gate, void **up, void **down,
                                 mt_error_t *err) {
    (void)ctx, (void)counts, (void)gate, (void)up, (void)down;
    return mt_error_set(err, MT_ERR_BUDGET, "test: no room for the experts");
}

static void run_failure(void) {
    host_t h;
    host_init(&h, 4, MT_F32);
    mt_error_t err = {0};
    kern_device_opts_t o = {.device_budget_bytes = 8 << 20, .host_threads = 1};
    enum { N2 = 2 };
    kern_device_t *devs[N2] = {0};
    for (int q = 0; q < N2; q++)
        MT_CHECK(kern_device_create(KERN_BACKEND_CPU, &o, &devs[q], &err) == MT_OK, "%s", err.msg);
    kern_comm_t *comm = NULL;
    MT_CHECK(kern_comm_create(devs, N2, &comm, &err) == MT_OK, "%s", err.msg);
    dev_layer_t L[N2];
    moe_ep_t ep[N2];
    mb_run_t er[N2];
    pthread_t th[N2];
    for (int q = 0; q < N2; q++) {
        int lo, hi;
        moe_ep_range(4, N2, q, &lo, &hi);
        layer_init(&L[q], devs[q], &h, lo, hi);
        ep[q] = (moe_ep_t){comm, q};
        L[q].p.ep = &ep[q];
        er[q] = (mb_run_t){.L = &L[q], .h = &h, .mb = q};
    }
    L[1].p.fetch_experts = failing_fetch;
    for (int q = 0; q < N2; q++) pthread_create(&th[q], NULL, ep_thread, &er[q]);
    for (int q = 0; q < N2; q++) pthread_join(th[q], NULL);
    EXPECT(er[1].st_fwd == MT_ERR_BUDGET && strstr(er[1].err.msg, "no room"), "failing device: %d '%s'",
           (int)er[1].st_fwd, er[1].err.msg);
    EXPECT(er[0].st_fwd == MT_ERR_DEVICE && strstr(er[0].err.msg, "aborted"),
           "its peer: %d '%s' (want MT_ERR_DEVICE, the communicator aborted)", (int)er[0].st_fwd, er[0].err.msg);
    printf("a failing device: peer returned '%s'\n", er[0].err.msg);
    for (int q = 0; q < N2; q++) {
        free(er[q].y);
        free(er[q].dxn);
        layer_free(&L[q]);
        EXPECT(kern_device_stats(devs[q]).device_in_use == 0, "failure: device %d: %zu bytes left allocated", q,
               kern_device_stats(devs[q]).device_in_use);
    }
    kern_comm_destroy(comm);
    for (int q = 0; q < N2; q++) kern_device_destroy(devs[q]);
    host_free(&h);
}

int main(void) {
    run_case(4, MT_F32, 2);
    run_case(5, MT_F32, 2);
    run_case(6, MT_BF16, 2);
    run_case(5, MT_BF16, 2);
    run_case(7, MT_F32, 3);
    run_case(8, MT_BF16, 3);
    run_failure();
    if (failures) {
        fprintf(stderr, "expert_parallel_test: %d failure(s)\n", failures);
        return 1;
    }
    printf("expert_parallel_test: all checks passed\n");
    return 0;
}
