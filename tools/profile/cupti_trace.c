/* A GPU activity trace of any CUDA program, summarised at its exit
 * (trace_summary.h): loaded by the CUDA driver as an injection library,
 *
 *     CUDA_INJECTION64_PATH=/path/libmoetune_cupti_trace.so moetune ...
 *
 * it records through CUPTI's activity API every kernel, copy and memset
 * on the device and every CUDA runtime call on the host, and at exit
 * writes the summary to $MOETUNE_PROFILE_OUT (default: stderr).
 * $MOETUNE_PROFILE_GAP_S (default 0.3) is the idle time that ends a phase,
 * $MOETUNE_PROFILE_TOP (default 40) how many kernels and calls each phase
 * lists.  What it answers: whether a step keeps the GPU busy, which
 * kernels take its time, and how much host time the runtime calls take
 * (launches, synchronous copies); cuBLAS's and cuDNN's own host work shows
 * only through the runtime calls they make.  Recording the runtime calls
 * adds about a microsecond to each. */
#include <cupti.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/profile/trace_summary.h"

#define BUFFER_BYTES ((size_t)8 << 20)

static struct {
    pthread_mutex_t mu;
    ts_event_t *ev;
    size_t n, cap;
} g_trace = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void record(uint64_t start, uint64_t end, ts_kind_t kind, const char *name) {
    pthread_mutex_lock(&g_trace.mu);
    if (g_trace.n == g_trace.cap) {
        const size_t cap = g_trace.cap ? 2 * g_trace.cap : (size_t)1 << 20;
        ts_event_t *ev = realloc(g_trace.ev, cap * sizeof *ev);
        if (!ev) { /* out of memory: the trace stops growing, the program goes on */
            pthread_mutex_unlock(&g_trace.mu);
            return;
        }
        g_trace.ev = ev, g_trace.cap = cap;
    }
    g_trace.ev[g_trace.n++] = (ts_event_t){start, end, kind, name};
    pthread_mutex_unlock(&g_trace.mu);
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records) {
    *buffer = aligned_alloc(8, BUFFER_BYTES);
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static const char *copy_name(uint8_t kind) {
    switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "[copy host to device]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "[copy device to host]";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "[copy device to device]";
    default: return "[copy, other]";
    }
}

static void CUPTIAPI buffer_completed(CUcontext ctx, uint32_t stream, uint8_t *buffer, size_t size, size_t valid) {
    (void)ctx, (void)stream, (void)size;
    CUpti_Activity *r = NULL;
    while (cuptiActivityGetNextRecord(buffer, valid, &r) == CUPTI_SUCCESS) {
        if (r->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || r->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
            const CUpti_ActivityKernel10 *k = (const void *)r;
            record(k->start, k->end, TS_KERNEL, k->name ? strdup(k->name) : "?");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
            const CUpti_ActivityMemcpy6 *m = (const void *)r;
            record(m->start, m->end, TS_COPY, copy_name(m->copyKind));
        } else if (r->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
            const CUpti_ActivityMemset4 *m = (const void *)r;
            record(m->start, m->end, TS_COPY, "[memset]");
        } else if (r->kind == CUPTI_ACTIVITY_KIND_RUNTIME) {
            const CUpti_ActivityAPI *a = (const void *)r;
            const char *name = NULL;
            cuptiGetCallbackName(CUPTI_CB_DOMAIN_RUNTIME_API, a->cbid, &name);
            record(a->start, a->end, TS_API, name);
        }
    }
    free(buffer);
}

static double env_or(const char *key, double fallback) {
    const char *v = getenv(key);
    return v && *v ? atof(v) : fallback;
}

static void report_at_exit(void) {
    cuptiActivityFlushAll(1);
    const char *path = getenv("MOETUNE_PROFILE_OUT");
    FILE *out = path && *path ? fopen(path, "w") : stderr;
    if (!out) {
        fprintf(stderr, "moetune profile: cannot write %s; the summary goes to stderr\n", path);
        out = stderr;
    }
    const ts_options_t opt = {.gap_s = env_or("MOETUNE_PROFILE_GAP_S", 0.3), .min_span_s = 0.2,
                              .top = (int)env_or("MOETUNE_PROFILE_TOP", 40)};
    pthread_mutex_lock(&g_trace.mu);
    ts_report(out, g_trace.ev, g_trace.n, &opt);
    pthread_mutex_unlock(&g_trace.mu);
    if (out != stderr) fclose(out);
}

/* The CUDA driver calls this when it loads the library. */
int InitializeInjection(void);

int InitializeInjection(void) {
    if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return 0;
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMCPY);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_MEMSET);
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_RUNTIME);
    atexit(report_at_exit);
    return 1;
}
