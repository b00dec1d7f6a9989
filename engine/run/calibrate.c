/* Calibration (see calibrate.h).
 *
 * Design notes: buffers are 64 MiB by default, several times a server's
 * last-level cache, so the passes measure memory, not cache; the stream
 * pass splits the buffer across one thread per online core, as host AdamW
 * does.  The GEMM goes through a CPU device and its kernel table rather
 * than calling OpenBLAS directly, so that it includes what the engine's
 * matmul includes. */
#include "engine/run/calibrate.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "kernels/device.h"
#include "kernels/host/adamw_host.h"
#include "kernels/host/threadpool.h"
#include "kernels/ops.h"
#include "base/clock.h"
#include "base/dtype.h"
#include "moe/staging.h"
#include "store/sio_rate.h"

/* threads: the kernel pool's size, as the run will have it (0 = every core) */
static mt_status_t measure_gemm(int n, int reps, int threads, mt_dtype_t compute, double *flops, mt_error_t *err) {
    const size_t bytes = (size_t)n * (size_t)n * sizeof(float);
    kern_device_opts_t o = {.device_budget_bytes = 3 * bytes + (1u << 20), .host_threads = threads};
    kern_device_t *dev = NULL;
    mt_status_t st = kern_device_create(KERN_BACKEND_CPU, &o, &dev, err);
    if (st != MT_OK) return mt_error_prefix(err, "calibration: ");
    float *a = kern_alloc(dev, bytes, "calibration A", err);
    float *b = a ? kern_alloc(dev, bytes, "calibration B", err) : NULL;
    float *c = b ? kern_alloc(dev, bytes, "calibration C", err) : NULL;
    if (!c) {
        kern_device_destroy(dev);
        return err->code;
    }
    float *host = malloc(bytes);
    MT_CHECK_ALLOC(host, "calibration matrix");
    for (size_t i = 0; i < (size_t)n * (size_t)n; i++) host[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    kern_memcpy_h2d(dev, s, a, host, bytes);
    kern_memcpy_h2d(dev, s, b, host, bytes);
    if (compute == MT_BF16) /* a bf16 run's weights are bf16 working copies */
        dev->ops->f32_to_bf16(s, (uint16_t *)b, a, (size_t)n * (size_t)n);
    kern_stream_sync(dev, s);
    /* fp32 activations times weights, x W^T, in the compute dtype the run forms products in */
    const kern_mm_t p = kern_mm_make(c, a, MT_F32, b, compute, n, n, n, false, true, 1.0f, 0.0f, compute);
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* +1: the first run warms the thread pool */
        double t0 = mt_now_s();
        dev->ops->mm(s, &p);
        kern_stream_sync(dev, s);
        double t = mt_now_s() - t0;
        if (r > 0 && t < best) best = t;
    }
    free(host);
    kern_free(dev, a);
    kern_free(dev, b);
    kern_free(dev, c);
    kern_device_destroy(dev);
    *flops = 2.0 * n * (double)n * n / best;
    return MT_OK;
}

typedef struct {
    float *a;
    const float *b, *c;
    size_t n;
} triad_t;

static void *triad(void *arg) {
    triad_t *t = arg;
    for (size_t i = 0; i < t->n; i++) t->a[i] = t->b[i] + 0.5f * t->c[i];
    return NULL;
}

static double measure_stream(size_t bytes, int reps, int threads) {
    const size_t n = bytes / sizeof(float);
    float *a = malloc(bytes), *b = malloc(bytes), *c = malloc(bytes);
    MT_CHECK(a && b && c, "out of host memory for the calibration buffers");
    for (size_t i = 0; i < n; i++) a[i] = 0, b[i] = (float)(i & 1023), c[i] = 1.0f;
    pthread_t *tid = malloc((size_t)threads * sizeof *tid);
    triad_t *parts = malloc((size_t)threads * sizeof *parts);
    MT_CHECK(tid && parts, "out of host memory for calibration threads");
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mt_now_s();
        for (int k = 0; k < threads; k++) {
            size_t lo = n * (size_t)k / (size_t)threads, hi = n * (size_t)(k + 1) / (size_t)threads;
            parts[k] = (triad_t){a + lo, b + lo, c + lo, hi - lo};
            MT_CHECK(pthread_create(&tid[k], NULL, triad, &parts[k]) == 0, "pthread_create failed");
        }
        for (int k = 0; k < threads; k++) pthread_join(tid[k], NULL);
        double t = mt_now_s() - t0;
        if (t < best) best = t;
    }
    free(tid);
    free(parts);
    free(a);
    free(b);
    free(c);
    return 3.0 * (double)bytes / best; /* two buffers read, one written */
}

static double measure_memcpy(size_t bytes, int reps) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    MT_CHECK(src && dst, "out of host memory for the calibration buffers");
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mt_now_s();
        memcpy(dst, src, bytes);
        double t = mt_now_s() - t0;
        if (t < best) best = t;
    }
    volatile char sink = dst[bytes / 2]; /* keep the copy */
    (void)sink;
    free(src);
    free(dst);
    return (double)bytes / best;
}

/* ---- how much the host's copies slow compute kept on its own cores ------ */

typedef struct {
    kern_device_t *dev;
    atomic_int stop, copying, idle; /* idle: the thread has seen copying == 0 and copies no more */
} busy_arg_t;

/* On a host core: memcpy over a 16 MiB buffer, 1 MiB at a time, while
 * `copying` (a copy stream flat out); idle (sleeping) otherwise.  The small
 * pieces make it stop within a fraction of a millisecond. */
static void *host_busy(void *arg) {
    busy_arg_t *a = arg;
    kern_device_pin_host_thread(a->dev);
    const size_t n = (size_t)16 << 20, piece = (size_t)1 << 20;
    char *src = malloc(n), *dst = malloc(n);
    MT_CHECK(src && dst, "out of host memory for the interference probe");
    memset(src, 1, n);
    memset(dst, 0, n);
    const struct timespec nap = {0, 50000};
    size_t off = 0;
    while (!atomic_load(&a->stop)) {
        if (atomic_load(&a->copying)) {
            atomic_store(&a->idle, 0);
            memcpy(dst + off, src + off, piece);
            off = (off + piece) % n;
        } else {
            atomic_store(&a->idle, 1);
            nanosleep(&nap, NULL);
        }
    }
    free(src);
    free(dst);
    return NULL;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double gemm_once(kern_device_t *dev, float *a, float *b, float *c) {
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    const kern_mm_t p = kern_mm_make(c, a, MT_F32, b, MT_F32, 512, 512, 512, false, true, 1.0f, 0.0f, MT_F32);
    const double t0 = mt_now_s();
    dev->ops->mm(s, &p);
    kern_stream_sync(dev, s);
    return mt_now_s() - t0;
}

struct eng_interference_probe {
    kern_device_t *dev;
    float *a, *b, *c;
    busy_arg_t arg;
    pthread_t th;
};

eng_interference_probe_t *eng_interference_probe_open(int threads) {
    const size_t bytes = (size_t)512 * 512 * sizeof(float);
    kern_device_opts_t o = {.device_budget_bytes = 3 * bytes + (1u << 20), .host_threads = threads, .pin_threads = true};
    mt_error_t err = {0};
    eng_interference_probe_t *p = calloc(1, sizeof *p);
    MT_CHECK_ALLOC(p, "interference probe");
    if (threads <= 0 || kern_device_create(KERN_BACKEND_CPU, &o, &p->dev, &err) != MT_OK) {
        free(p);
        return NULL;
    }
    p->a = kern_alloc(p->dev, bytes, "probe A", &err);
    p->b = p->a ? kern_alloc(p->dev, bytes, "probe B", &err) : NULL;
    p->c = p->b ? kern_alloc(p->dev, bytes, "probe C", &err) : NULL;
    p->arg = (busy_arg_t){.dev = p->dev, .idle = 1};
    if (!p->c || kern_device_caps(p->dev).host_cores == 0 || pthread_create(&p->th, NULL, host_busy, &p->arg) != 0) {
        if (p->c) kern_free(p->dev, p->c);
        if (p->b) kern_free(p->dev, p->b);
        if (p->a) kern_free(p->dev, p->a);
        kern_device_destroy(p->dev);
        free(p);
        return NULL;
    }
    for (int i = 0; i < 512 * 512; i++) p->a[i] = p->b[i] = (float)(i % 17) * 0.01f;
    for (int w = 0; w < 3; w++) gemm_once(p->dev, p->a, p->b, p->c); /* warm-up */
    return p;
}

double eng_interference_probe_pair(eng_interference_probe_t *p) {
    while (!atomic_load(&p->arg.idle)) sched_yield(); /* the last piece is done */
    const double alone = gemm_once(p->dev, p->a, p->b, p->c);
    atomic_store(&p->arg.copying, 1);
    while (atomic_load(&p->arg.idle)) sched_yield(); /* copying has started */
    const double busy = gemm_once(p->dev, p->a, p->b, p->c);
    atomic_store(&p->arg.copying, 0);
    return busy / alone;
}

void eng_interference_probe_close(eng_interference_probe_t *p) {
    if (!p) return;
    atomic_store(&p->arg.stop, 1);
    pthread_join(p->th, NULL);
    kern_free(p->dev, p->c);
    kern_free(p->dev, p->b);
    kern_free(p->dev, p->a);
    kern_device_destroy(p->dev);
    free(p);
}

/* The median of 31 pairs' ratios, minus 1 (0: nothing to measure).  The
 * two members of a pair alternate, so that a neighbour's load on a shared
 * machine, which comes and goes, weighs on both. */
static double measure_interference(int threads) {
    enum { PAIRS = 31 };
    eng_interference_probe_t *p = eng_interference_probe_open(threads);
    if (!p) return 0;
    double ratio[PAIRS];
    for (int k = 0; k < PAIRS; k++) ratio[k] = eng_interference_probe_pair(p);
    eng_interference_probe_close(p);
    qsort(ratio, PAIRS, sizeof *ratio, cmp_double);
    return ratio[PAIRS / 2] > 1 ? ratio[PAIRS / 2] - 1 : 0;
}

/* ---- the host's work beside the copies, and the optimizer --------------- */

/* Parameters per second of host AdamW with moments in fmt over n
 * parameters on `threads` threads (0: every core). */
static double measure_adamw(kern_moments_fmt_t fmt, size_t n, int threads, int reps) {
    float *p = malloc(n * sizeof *p), *g = malloc(n * sizeof *g);
    void *mom_base = calloc(1, kern_moments_bytes(fmt, n));
    MT_CHECK(p && g && mom_base, "out of host memory for the AdamW calibration");
    for (size_t i = 0; i < n; i++) p[i] = (float)(i & 1023) * 0.001f, g[i] = (float)(i & 63) * 1e-4f;
    const kern_moments_t mom = kern_moments_view(fmt, mom_base, n, 0);
    kern_threadpool_t *pool = kern_threadpool_create(threads);
    kern_adamw_params_t ap = {.lr = 1e-5f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f,
                              .grad_scale = 1.0f};
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* +1: the first pass faults the moments' pages in */
        ap.step = r + 1;
        const double t0 = mt_now_s();
        kern_adamw_cpu_pool(pool, p, &mom, g, NULL, NULL, n, &ap);
        const double t = mt_now_s() - t0;
        if (r > 0 && t < best) best = t;
    }
    kern_threadpool_destroy(pool);
    free(mom_base);
    free(g);
    free(p);
    return (double)n / best;
}

/* Bytes per second copied between host memory and staging on `threads`
 * threads, in the pieces the pack threads take: a fetch's weights packed
 * in (their host homes are in the working dtype already) and a gradient
 * unpack out. */
static double measure_staging_copy(size_t bytes, int threads, int reps) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    MT_CHECK(src && dst, "out of host memory for the staging copy calibration");
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    kern_threadpool_t *pool = kern_threadpool_create(threads);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        const double t0 = mt_now_s();
        kern_threadpool_memcpy(pool, dst, src, bytes);
        const double t = mt_now_s() - t0;
        if (t < best) best = t;
    }
    kern_threadpool_destroy(pool);
    free(dst);
    free(src);
    return (double)bytes / best;
}

/* The host rates beside the copies, for a run on a GPU (gpu) or the CPU
 * backend, with the staging pool's pack threads for its packing and its
 * gradient unpacking. */
static void measure_host_work(bool gpu, int cores, size_t adam_params, int reps, sched_calibration_t *out) {
    const size_t n = (size_t)32 << 20; /* 128 MB of fp32 in: past the caches */
    const int threads = moe_staging_default_pack_threads(gpu, cores);
    out->pack_bw = measure_staging_copy(n * sizeof(uint16_t), threads, reps); /* bf16 weights in */
    out->unpack_bw = measure_staging_copy(n * sizeof(float), threads, reps);  /* fp32 gradients out */
    /* fp32 as the cost model counts its traffic: p, g, m, v read, p, m, v
     * written, 28 B per parameter */
    out->adamw_bw = 28.0 * measure_adamw(KERN_MOMENTS_F32, adam_params, 0, reps);
    /* the lighter formats are bound by their arithmetic: fewer parameters
     * show the rate */
    out->adamw_bf16_rate = measure_adamw(KERN_MOMENTS_BF16, adam_params / 4, 0, reps);
    out->adamw_8bit_rate = measure_adamw(KERN_MOMENTS_8BIT, adam_params / 4, 0, reps);
}

/* ---- the run's NVMe directory ---------------------------------------------- */

/* The store's queue depth (mt_store_opts_t.queue_depth 0) and enough bytes
 * to see past a drive's write cache without holding calibration for long. */
enum { NVME_CAL_QD = 8 };
#define NVME_CAL_BYTES ((uint64_t)256 << 20)

mt_status_t eng_calibrate_nvme(const eng_run_config_t *rc, sched_calibration_t *out, mt_error_t *err) {
    if (!rc || !rc->memory_nvme_path[0]) return MT_OK;
    mt_sio_rates_t r;
    const mt_status_t st = mt_sio_measure_dir(rc->memory_nvme_path, NVME_CAL_BYTES, NVME_CAL_QD, MT_SIO_AUTO, &r, err);
    if (st != MT_OK) return mt_error_prefix(err, "memory.nvme.path: ");
    out->nvme_read_bw = r.read_q;
    out->nvme_write_bw = r.write_q;
    out->nvme_queue_depth = NVME_CAL_QD;
    snprintf(out->nvme_path, sizeof out->nvme_path, "%s", rc->memory_nvme_path);
    return MT_OK;
}

/* ---- the attention kernels at the run's shape ------------------------------ */

/* Best-of-reps seconds of `issue` on stream s, synced after each. */
typedef void (*issue_fn)(kern_device_t *dev, kern_stream_t *s, void *ctx);

static double time_on_stream(kern_device_t *dev, kern_stream_t *s, issue_fn issue, void *ctx, int reps) {
    issue(dev, s, ctx); /* warm-up: the algorithm heuristic, first-touch of pinned pages */
    kern_stream_sync(dev, s);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = mt_now_s();
        issue(dev, s, ctx);
        kern_stream_sync(dev, s);
        double t = mt_now_s() - t0;
        if (t < best) best = t;
    }
    return best;
}


void eng_calibrate_attn_of(const eng_model_config_t *mc, const eng_run_config_t *rc, bool bf16,
                           eng_calibrate_attn_t *out) {
    const int vd = mc->v_head_dim, qk = mc->qk_nope_head_dim + mc->qk_rope_head_dim;
    *out = (eng_calibrate_attn_t){.B = rc->micro_batch_size, .T = rc->sequence_len, .heads = mc->num_attention_heads,
                                  .kv_heads = mc->mla ? mc->num_attention_heads : mc->num_key_value_heads,
                                  .head_dim = mc->mla ? (qk >= vd ? qk : vd) : mc->head_dim, .bf16 = bf16,
                                  .packed = rc->sample_packing};
}

static const eng_calibrate_attn_t k_default_attn = {.B = 1, .T = 1024, .heads = 16, .kv_heads = 16, .head_dim = 128};

typedef struct {
    float *q, *k, *v, *o, *lse, *dout, *dq, *dk, *dv;
    int B, T, nh, nkv, hd;
    bool tc; /* the tensor-core path (it took the shape) */
} attn_job_t;

static size_t attn_bytes(const attn_job_t *j) {
    const size_t q = (size_t)j->B * j->T * j->nh * j->hd, kv = (size_t)j->B * j->T * j->nkv * j->hd;
    return (4 * q + 4 * kv + (size_t)j->B * j->nh * j->T) * sizeof(float);
}

static void issue_attn_fwd(kern_device_t *dev, kern_stream_t *s, void *ctx) {
    attn_job_t *j = ctx;
    /* bf16 storage, as a bf16 run's saved q, k, v and output (fp32-sized buffers: room for either) */
    if (j->tc && dev->ops->attention_fwd_tc(s, j->o, j->lse, j->q, j->k, j->v, MT_BF16, NULL, NULL, j->B, j->T, j->nh,
                                            j->nkv, j->hd, 0))
        return;
    j->tc = false; /* the path refused the shape: the fp32 kernel runs it, as in the run */
    dev->ops->attention_fwd(s, j->o, j->lse, j->q, j->k, j->v, NULL, NULL, j->B, j->T, j->nh, j->nkv, j->hd, 0);
}

static void issue_attn_bwd(kern_device_t *dev, kern_stream_t *s, void *ctx) {
    attn_job_t *j = ctx;
    if (j->tc && dev->ops->attention_bwd_tc(s, j->dq, j->dk, j->dv, j->dout, j->q, j->k, j->v, j->o, MT_BF16, j->lse,
                                            NULL, NULL, j->B, j->T, j->nh, j->nkv, j->hd, 0))
        return;
    dev->ops->attention_bwd(s, j->dq, j->dk, j->dv, j->dout, j->q, j->k, j->v, j->o, j->lse, NULL, NULL, j->B, j->T,
                            j->nh, j->nkv, j->hd, 0);
}

/* The attention kernels on dev at shape a, the sequence halved (down to
 * 64) until its buffers fit mem_cap and a forward and backward stay under
 * flop_cap: model FLOPs per second of each direction into out (attn_tc:
 * the path measured).  Zeros in every buffer: finite, and the kernels' time
 * does not depend on the values. */
static mt_status_t measure_attention(kern_device_t *dev, const eng_calibrate_attn_t *a, size_t mem_cap,
                                     double flop_cap, int reps, sched_calibration_t *out, mt_error_t *err) {
    attn_job_t j = {.B = a->B > 0 ? a->B : 1, .T = a->T > 0 ? a->T : 1024, .nh = a->heads, .nkv = a->kv_heads,
                    .hd = a->head_dim,
                    .tc = a->bf16 && !a->packed && kern_attention_tc_takes(a->heads, a->kv_heads, a->head_dim)};
    if (j.nh <= 0 || j.nkv <= 0 || j.hd <= 0 || j.nh % j.nkv != 0) return MT_OK; /* nothing the kernels take */
    while (j.T > 64 && (attn_bytes(&j) > mem_cap || 7.0 * j.B * (double)j.T * j.T * j.nh * j.hd > flop_cap)) j.T /= 2;
    while (j.B > 1 && attn_bytes(&j) > mem_cap) j.B /= 2;
    const size_t q = (size_t)j.B * j.T * j.nh * j.hd * sizeof(float), kv = (size_t)j.B * j.T * j.nkv * j.hd * sizeof(float);
    const size_t lse = (size_t)j.B * j.nh * j.T * sizeof(float);
    float **bufs[] = {&j.q, &j.o, &j.dout, &j.dq, &j.k, &j.v, &j.dk, &j.dv, &j.lse};
    const size_t sizes[] = {q, q, q, q, kv, kv, kv, kv, lse};
    kern_stream_t *s = kern_stream(dev, KERN_STREAM_COMPUTE);
    mt_status_t st = MT_OK;
    int got = 0;
    for (; got < 9; got++) {
        *bufs[got] = kern_alloc(dev, sizes[got], "calibration attention", err);
        if (!*bufs[got]) {
            st = mt_error_prefix(err, "calibration of attention: ");
            break;
        }
        kern_memset(dev, s, *bufs[got], 0, sizes[got]);
    }
    if (st == MT_OK) {
        const double t_fwd = time_on_stream(dev, s, issue_attn_fwd, &j, reps);
        const double t_bwd = time_on_stream(dev, s, issue_attn_bwd, &j, reps);
        const double pairs = (double)j.B * j.nh * j.T * (j.T + 1) / 2.0;
        out->attn_tc = j.tc;
        out->attn_flops[SCHED_DIR_FWD] = 4.0 * pairs * j.hd / t_fwd;
        out->attn_flops[SCHED_DIR_BWD] = 10.0 * pairs * j.hd / t_bwd;
    }
    for (int i = 0; i < got; i++) kern_free(dev, *bufs[i]);
    kern_device_sync(dev);
    return st;
}

/* The CPU backend's attention: a CPU device of its own, the run's kernel
 * threads, as measure_gemm does. */
static mt_status_t measure_attention_cpu(const eng_run_config_t *rc, const eng_calibrate_attn_t *a, double flop_cap,
                                         int reps, sched_calibration_t *out, mt_error_t *err) {
    const size_t cap = (size_t)256 << 20;
    kern_device_opts_t o = {.device_budget_bytes = cap + (4u << 20), .host_threads = rc ? rc->compute_threads : 0};
    kern_device_t *dev = NULL;
    mt_status_t st = kern_device_create(KERN_BACKEND_CPU, &o, &dev, err);
    if (st != MT_OK) return mt_error_prefix(err, "calibration: ");
    st = measure_attention(dev, a, cap, flop_cap, reps, out, err);
    kern_device_destroy(dev);
    return st;
}

mt_status_t eng_calibrate(const eng_run_config_t *rc, const eng_calibrate_attn_t *attn,
                          const eng_calibrate_opts_t *opts, sched_calibration_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    const int n = opts && opts->gemm_n > 0 ? opts->gemm_n : 1024;
    const size_t bytes = opts && opts->stream_bytes > 0 ? opts->stream_bytes : (size_t)64 << 20;
    const int reps = opts && opts->reps > 0 ? opts->reps : 3;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = cores > 0 ? (int)cores : 1;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    out->host_memory = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    mt_status_t st = measure_gemm(n, reps, rc ? rc->compute_threads : 0, MT_F32, &out->sgemm_flops, err);
    if (st == MT_OK)
        st = measure_gemm(n, reps, rc ? rc->compute_threads : 0, MT_BF16, &out->bf16_gemm_flops, err);
    if (st != MT_OK) return st;
    out->memcpy_bw = measure_memcpy(bytes, reps);
    out->stream_bw = measure_stream(bytes, reps, out->cores);
    if (rc && rc->link_gbps > 0) out->link_bw = rc->link_gbps * 1e9;
    out->link_latency_s = rc ? rc->link_latency_us * 1e-6 : 0;
    if (rc && rc->compute_threads > 0) out->compute_interference = measure_interference(rc->compute_threads);
    measure_host_work(false, out->cores, opts && opts->adam_params > 0 ? opts->adam_params : (size_t)16 << 20, reps,
                      out);
    if ((st = eng_calibrate_nvme(rc, out, err)) != MT_OK) return mt_error_prefix(err, "--hw calibrate: ");
    return measure_attention_cpu(rc, attn ? attn : &k_default_attn,
                                 opts && opts->attn_flops > 0 ? opts->attn_flops : 2e9, reps, out, err);
}

/* ---- a device whose kernels run asynchronously (a GPU) ------------------ */

typedef struct {
    void *dst;
    const void *src;
    size_t bytes;
    const kern_mm_t *mm;
} dev_job_t;

static void issue_mm(kern_device_t *dev, kern_stream_t *s, void *ctx) { dev->ops->mm(s, ((dev_job_t *)ctx)->mm); }
static void issue_h2d(kern_device_t *dev, kern_stream_t *s, void *ctx) {
    dev_job_t *j = ctx;
    kern_memcpy_h2d(dev, s, j->dst, j->src, j->bytes);
}
static void issue_d2h(kern_device_t *dev, kern_stream_t *s, void *ctx) {
    dev_job_t *j = ctx;
    kern_memcpy_d2h(dev, s, j->dst, j->src, j->bytes);
}
static void issue_d2d(kern_device_t *dev, kern_stream_t *s, void *ctx) {
    dev_job_t *j = ctx;
    kern_memcpy_d2d(dev, s, j->dst, j->src, j->bytes);
}

mt_status_t eng_calibrate_device(kern_device_t *dev, const eng_run_config_t *rc, const eng_calibrate_attn_t *attn,
                                 sched_calibration_t *out, mt_error_t *err) {
    memset(out, 0, sizeof *out);
    out->device_calibrated = true;
    snprintf(out->device_name, sizeof out->device_name, "%s device %d", dev->vt->name,
             rc ? rc->devices.ids[0] : 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    out->cores = cores > 0 ? (int)cores : 1;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    out->host_memory = pages > 0 && page > 0 ? (double)pages * (double)page : 0;
    const size_t stream_bytes = (size_t)64 << 20;
    out->memcpy_bw = measure_memcpy(stream_bytes, 3);
    out->stream_bw = measure_stream(stream_bytes, 3, out->cores);
    const kern_device_stats_t st0 = kern_device_stats(dev);
    out->device_memory = (double)st0.device_capacity;

    /* The largest square product of 4096, 2048 or 1024 whose three
     * operands fit in a quarter of the arena: big enough for a GPU's rate,
     * small enough to leave the run's budget alone (all is freed here). */
    int n = 4096;
    while (n > 1024 && 3.0 * n * n * 4 > out->device_memory / 4) n /= 2;
    const size_t mat = (size_t)n * (size_t)n * sizeof(float);
    const size_t copy_bytes = (size_t)64 << 20; /* an expert-sized transfer many times over */
    float *a = kern_alloc(dev, mat, "calibration A", err);
    float *b = a ? kern_alloc(dev, mat, "calibration B", err) : NULL;
    float *c = b ? kern_alloc(dev, mat, "calibration C", err) : NULL;
    char *d1 = c ? kern_alloc(dev, copy_bytes, "calibration copy source", err) : NULL;
    char *d2 = d1 ? kern_alloc(dev, copy_bytes, "calibration copy target", err) : NULL;
    char *pinned = d2 ? kern_pinned_alloc(dev, copy_bytes) : NULL;
    mt_status_t status = MT_OK;
    if (!d2) {
        status = mt_error_prefix(err, "calibration of the %s: ", out->device_name);
    } else if (!pinned) {
        status = mt_error_set(err, MT_ERR_NOMEM, "calibration of the %s: %zu bytes of pinned host memory refused",
                              out->device_name, copy_bytes);
    } else {
        kern_stream_t *cs = kern_stream(dev, KERN_STREAM_COMPUTE);
        memset(pinned, 0x3c, copy_bytes); /* small finite floats for the products */
        for (size_t off = 0; off < mat; off += copy_bytes) {
            const size_t k = mat - off < copy_bytes ? mat - off : copy_bytes;
            kern_memcpy_h2d(dev, cs, (char *)a + off, pinned, k);
            kern_memcpy_h2d(dev, cs, (char *)b + off, pinned, k);
        }
        kern_stream_sync(dev, cs);
        const int reps = 5;
        /* fp32 activations times weights, x W^T, as the run forms its products */
        const kern_mm_t p32 = kern_mm_make(c, a, MT_F32, b, MT_F32, n, n, n, false, true, 1.0f, 0.0f, MT_F32);
        dev_job_t j = {.mm = &p32};
        out->sgemm_flops = 2.0 * n * (double)n * n / time_on_stream(dev, cs, issue_mm, &j, reps);
        dev->ops->f32_to_bf16(cs, (uint16_t *)b, a, (size_t)n * (size_t)n); /* weights stored bf16 */
        const kern_mm_t p16 = kern_mm_make(c, a, MT_F32, b, MT_BF16, n, n, n, false, true, 1.0f, 0.0f, MT_BF16);
        j.mm = &p16;
        out->bf16_gemm_flops = 2.0 * n * (double)n * n / time_on_stream(dev, cs, issue_mm, &j, reps);
        j = (dev_job_t){.dst = d1, .src = pinned, .bytes = copy_bytes};
        out->link_bw = copy_bytes / time_on_stream(dev, kern_stream(dev, KERN_STREAM_H2D), issue_h2d, &j, reps);
        j = (dev_job_t){.dst = pinned, .src = d1, .bytes = copy_bytes};
        out->link_d2h_bw = copy_bytes / time_on_stream(dev, kern_stream(dev, KERN_STREAM_D2H), issue_d2h, &j, reps);
        /* a copy small enough that its time is the fixed cost */
        j = (dev_job_t){.dst = d1, .src = pinned, .bytes = 4096};
        out->link_latency_s = time_on_stream(dev, kern_stream(dev, KERN_STREAM_H2D), issue_h2d, &j, reps);
        j = (dev_job_t){.dst = d2, .src = d1, .bytes = copy_bytes};
        out->device_bw = 2.0 * copy_bytes / time_on_stream(dev, cs, issue_d2d, &j, reps); /* read + write */
    }
    if (pinned) kern_pinned_free(dev, pinned, copy_bytes);
    kern_free(dev, d2);
    kern_free(dev, d1);
    kern_free(dev, c);
    kern_free(dev, b);
    kern_free(dev, a);
    /* the attention kernels at the run's shape, after the products' buffers
     * are back (the fp32 kernel's a few tenths of a second at most) */
    if (status == MT_OK) {
        const eng_calibrate_attn_t *a = attn ? attn : &k_default_attn;
        status = measure_attention(dev, a, (size_t)(out->device_memory / 4), a->bf16 && !a->packed ? 1e14 : 2e12, 5,
                                   out, err);
    }
    if (status == MT_OK) measure_host_work(true, out->cores, (size_t)16 << 20, 3, out);
    if (status == MT_OK && (status = eng_calibrate_nvme(rc, out, err)) != MT_OK) mt_error_prefix(err, "--hw calibrate: ");
    kern_device_sync(dev);
    kern_device_reset_peaks(dev);
    return status;
}
