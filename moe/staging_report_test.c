/* Tests of the staging pool's sizing, settings and profiler outputs:
 *  - sizing: max_slot >= 4x compact for Qwen3-30B-A3B's window (planned,
 *    bf16 and fp32, Mixtral-8x7B printed beside it) and measured on a
 *    scaled-down window with the same expert/embedding proportions;
 *    PyTorch's power-of-two rounding and fixed slot counts as options;
 *  - bad settings are refused, naming the setting, before pinning anything;
 *  - the CSV / SVG / trace writers produce what they promise. */
#include "moe/staging.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "moe/staging_report.h"
#include "moe/staging_testutil.h"

static int g_failures;

/* ---- sizing ---------------------------------------------------------------- */

/* A window of `layers` MoE layers of a real model: attention, norms,
 * router and all `experts` experts (every expert receives tokens at
 * realistic batch sizes).  Returns the tensor count. */
static int model_window(size_t *t, int layers, size_t H, size_t I, int experts, size_t q, size_t kv, size_t hd,
                        size_t dt) {
    int n = 0;
    for (int l = 0; l < layers; l++) {
        t[n++] = H * dt, t[n++] = H * dt;                 /* layernorms */
        t[n++] = q * H * dt, t[n++] = kv * H * dt, t[n++] = kv * H * dt, t[n++] = H * q * dt;
        if (hd) t[n++] = hd * dt, t[n++] = hd * dt;        /* q_norm, k_norm (Qwen3) */
        t[n++] = (size_t)experts * H * dt;                 /* router */
        for (int e = 0; e < 3 * experts; e++) t[n++] = I * H * dt;
    }
    return n;
}

static void test_plan_sizes(void) {
    static size_t t[2048];
    for (int bf16 = 1; bf16 >= 0; bf16--) {
        const size_t dt = bf16 ? 2 : 4;
        /* Qwen3-30B-A3B: H 2048, 128 experts of 768, 32 heads x 128, 4 kv heads, vocab 151936 */
        int n = model_window(t, 2, 2048, 768, 128, 4096, 512, 128, dt);
        moe_staging_plan_opts_t o = {.largest_tensor = (size_t)151936 * 2048 * dt};
        moe_staging_plan_t q;
        moe_staging_plan_all(t, n, &o, &q);
        moe_staging_plan_print(stdout, bf16 ? "Qwen3-30B-A3B (bf16, 2 MoE layers in flight)"
                                            : "Qwen3-30B-A3B (fp32, 2 MoE layers in flight)", &q);
        EXPECT(q.max_slot >= 4 * q.compact, "Qwen3-30B-A3B: max_slot %zu < 4 x compact %zu", q.max_slot, q.compact);
        EXPECT(q.compact <= q.payload + q.payload / 10, "Qwen3 compact %zu > 1.10 x payload %zu", q.compact,
               q.payload);
        EXPECT(q.per_tensor_pow2 > q.per_tensor && q.per_tensor >= q.compact,
               "ordering compact <= per_tensor < per_tensor_pow2 broken: %zu %zu %zu", q.compact, q.per_tensor,
               q.per_tensor_pow2);
        /* Mixtral-8x7B: H 4096, 8 experts of 14336, 32 heads x 128, 8 kv heads, vocab 32000 */
        n = model_window(t, 2, 4096, 14336, 8, 4096, 1024, 0, dt);
        o.largest_tensor = (size_t)32000 * 4096 * dt;
        moe_staging_plan_all(t, n, &o, &q);
        moe_staging_plan_print(stdout, bf16 ? "Mixtral-8x7B (bf16, 2 MoE layers in flight)"
                                            : "Mixtral-8x7B (fp32, 2 MoE layers in flight)", &q);
        EXPECT(q.max_slot > q.compact && q.compact <= q.payload + q.payload / 10, "Mixtral sizes: %zu %zu %zu",
               q.max_slot, q.compact, q.payload);
    }
    /* explicit knobs */
    const size_t one[] = {135790592}; /* 129.5 MiB */
    moe_staging_plan_opts_t o = {.pow2_round = true};
    EXPECT(moe_staging_plan_bytes(MOE_STAGING_PER_TENSOR, one, 1, &o) == (size_t)1 << 28,
           "a 129.5 MB tensor should take 256 MiB with power-of-two rounding (MemAscend's example)");
    o.pow2_round = false;
    EXPECT(moe_staging_plan_bytes(MOE_STAGING_PER_TENSOR, one, 1, &o) == (135790592 + 4095) / 4096 * 4096,
           "page rounding of a 129.5 MB tensor");
    o.slots = 5;
    o.largest_tensor = 1000;
    EXPECT(moe_staging_plan_bytes(MOE_STAGING_MAX_SLOT, one, 1, &o) == 5 * ((135790592 + 255) / 256 * 256),
           "5 fixed slots of the largest tensor");
}

/* Measured on a scaled window with Qwen3's expert/embedding proportions:
 * max_slot (one slot per tensor in flight) reserves >= 4x compact. */
static void test_measured_ratio(void) {
    const size_t expert = 32 * 64 * 4, embed = 2048 * 64 * 4; /* 64x an expert */
    const int n = 96;
    size_t t[96];
    for (int k = 0; k < n; k++) t[k] = expert;
    moe_staging_plan_opts_t o = {.largest_tensor = embed};
    kern_device_t *dev = staging_test_device((size_t)16 << 20, 0, 0);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    size_t off[96];
    const size_t span = moe_staging_layout(t, n, 0, off);
    char *host = calloc(1, span);
    char *buf = kern_alloc(dev, span, "window", NULL);
    moe_staging_xfer_t it[96];
    for (int k = 0; k < n; k++) it[k] = (moe_staging_xfer_t){host + off[k], buf + off[k], t[k], MOE_STAGING_COPY};
    size_t reserved[MOE_STAGING_MODE_COUNT];
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++) {
        moe_staging_t *p = staging_test_pool(dev, (moe_staging_mode_t)mode,
                                     moe_staging_plan_bytes((moe_staging_mode_t)mode, t, n, &o), embed, true);
        mt_error_t err = {0};
        EXPECT(moe_staging_h2d_batch(p, h2d, it, n, &(moe_staging_batch_t){"window", MT_ARENA_ALIGN}, &err) == MT_OK,
               "%s: %s", moe_staging_mode_name(mode), err.msg);
        kern_stream_sync(dev, h2d);
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        reserved[mode] = s.peak_reserved;
        moe_staging_destroy(p);
    }
    EXPECT(reserved[MOE_STAGING_MAX_SLOT] >= 4 * reserved[MOE_STAGING_COMPACT],
           "measured max_slot %zu < 4 x compact %zu", reserved[MOE_STAGING_MAX_SLOT], reserved[MOE_STAGING_COMPACT]);
    EXPECT(reserved[MOE_STAGING_COMPACT] <= reserved[MOE_STAGING_PER_TENSOR],
           "measured compact %zu > per_tensor %zu", reserved[MOE_STAGING_COMPACT], reserved[MOE_STAGING_PER_TENSOR]);
    kern_free(dev, buf);
    free(host);
    kern_device_destroy(dev);
}

/* ---- settings --------------------------------------------------------------- */

static void expect_refused(kern_device_t *dev, const moe_staging_opts_t *o, const char *needle, const char *what) {
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    const mt_status_t st = moe_staging_create(dev, o, &p, &err);
    EXPECT(st == MT_ERR_CONFIG && p == NULL, "%s: accepted (status %d)", what, st);
    EXPECT(strstr(err.msg, needle) != NULL, "%s: message does not name %s: %s", what, needle, err.msg);
    EXPECT(kern_device_stats(dev).pinned_in_use == 0, "%s: pinned memory allocated before refusing", what);
    if (p) moe_staging_destroy(p);
}

static void test_bad_settings(void) {
    kern_device_t *dev = staging_test_device((size_t)1 << 20, 0, 0);
    const size_t MiB = (size_t)1 << 20;
    moe_staging_opts_t o;
    for (int mode = 0; mode < MOE_STAGING_MODE_COUNT; mode++) {
        moe_staging_opts_init(&o, (moe_staging_mode_t)mode);
        o.capacity_bytes = 64 * MiB;
        o.max_tensor_bytes = 4 * MiB;
        o.max_tensor_name = "model.embed_tokens.weight";
        o.cap_bytes = 2 * MiB;
        expect_refused(dev, &o, "memory.pinned", "cap below the largest tensor");
        expect_refused(dev, &o, "model.embed_tokens.weight", "cap below the largest tensor (tensor named)");
        o.cap_bytes = 0;
        o.capacity_bytes = 0;
        expect_refused(dev, &o, "capacity", "zero capacity");
        o.capacity_bytes = 3 * MiB;
        expect_refused(dev, &o, "smaller than model.embed_tokens.weight", "capacity below the largest tensor");
        o.capacity_bytes = 64 * MiB;
        o.align = 3;
        expect_refused(dev, &o, "staging.align", "alignment not a power of two");
    }
    moe_staging_opts_init(&o, MOE_STAGING_COMPACT);
    o.capacity_bytes = 64 * MiB;
    o.max_tensor_bytes = 4 * MiB;
    o.num_slabs = 0;
    expect_refused(dev, &o, "staging.num_slabs", "zero slabs");
    o.num_slabs = 4;
    o.slab_bytes = MiB; /* 4 x 1 MiB: even the total is below one 4 MiB tensor */
    expect_refused(dev, &o, "staging.slab_bytes", "slabs smaller than the largest tensor");
    o.slab_bytes = 8 * MiB;
    o.cap_bytes = 16 * MiB;
    expect_refused(dev, &o, "exceeds memory.pinned", "explicit slabs over the cap");
    moe_staging_opts_init(&o, MOE_STAGING_MAX_SLOT);
    o.capacity_bytes = 64 * MiB;
    expect_refused(dev, &o, "max_tensor_bytes", "max_slot without the largest tensor");
    /* accepted: the cap clamps the capacity */
    moe_staging_opts_init(&o, MOE_STAGING_COMPACT);
    o.capacity_bytes = 8 * MiB;
    o.cap_bytes = 2 * MiB;
    o.max_tensor_bytes = MiB;
    moe_staging_t *p = NULL;
    mt_error_t err = {0};
    EXPECT(moe_staging_create(dev, &o, &p, &err) == MT_OK, "clamped pool refused: %s", err.msg);
    if (p) {
        moe_staging_stats_t s;
        moe_staging_get_stats(p, MOE_STAGING_SCOPE_TOTAL, &s);
        EXPECT(s.capacity == 2 * MiB && s.peak_reserved == 2 * MiB, "capacity %zu not clamped to the 2 MiB cap",
               s.capacity);
        moe_staging_destroy(p);
    }
    kern_device_destroy(dev);
}

/* ---- reports ----------------------------------------------------------------- */

static size_t count_str(const char *hay, const char *needle) {
    size_t n = 0;
    for (const char *s = strstr(hay, needle); s; s = strstr(s + 1, needle)) n++;
    return n;
}

static char *slurp(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)len + 1);
    MT_CHECK_ALLOC(b, "file");
    const size_t got = fread(b, 1, (size_t)len, f);
    b[got] = 0;
    fclose(f);
    return b;
}

static void test_reports(void) {
    kern_device_t *dev = staging_test_device((size_t)8 << 20, 1e9, 5e-6);
    kern_stream_t *h2d = kern_stream(dev, KERN_STREAM_H2D);
    size_t t[40], off[40];
    for (int k = 0; k < 40; k++) t[k] = 24576;
    const size_t span = moe_staging_layout(t, 40, 0, off);
    char *host = calloc(1, span), *buf = kern_alloc(dev, span, "report buffer", NULL);
    moe_staging_xfer_t it[40];
    for (int k = 0; k < 40; k++) it[k] = (moe_staging_xfer_t){host + off[k], buf + off[k], t[k], MOE_STAGING_COPY};
    moe_staging_timeline_t *tl[2];
    for (int m = 0; m < 2; m++) {
        moe_staging_t *p = staging_test_pool(dev, (moe_staging_mode_t)m, 300 << 10, 24576, true);
        mt_error_t err = {0};
        for (int rep = 0; rep < 3; rep++)
            EXPECT(moe_staging_h2d_batch(p, h2d, it, 40, &(moe_staging_batch_t){"r", MT_ARENA_ALIGN}, &err) == MT_OK,
                   "%s", err.msg);
        kern_stream_sync(dev, h2d);
        moe_staging_poll(p);
        tl[m] = moe_staging_timeline_copy(p);
        moe_staging_destroy(p);
    }
    const char *dir = getenv("TEST_TMPDIR") ? getenv("TEST_TMPDIR") : "/tmp";
    char csv[4096], svg[4096];
    snprintf(csv, sizeof csv, "%s/staging.csv", dir);
    snprintf(svg, sizeof svg, "%s/staging.svg", dir);
    mt_error_t err = {0};
    const moe_staging_timeline_t *const ctl[2] = {tl[0], tl[1]};
    EXPECT(moe_staging_write_csv_timelines(ctl, 2, csv, &err) == MT_OK, "csv: %s", err.msg);
    EXPECT(moe_staging_write_svg(ctl, 2, svg, &err) == MT_OK, "svg: %s", err.msg);
    char *c = slurp(csv), *s = slurp(svg);
    EXPECT(c && count_str(c, "\n") == 1 + tl[0]->n + tl[1]->n, "csv has %zu lines for %zu samples",
           c ? count_str(c, "\n") : 0, tl[0]->n + tl[1]->n);
    EXPECT(c && strncmp(c, "mode,t_ms,reserved_bytes,in_use_bytes,", 38) == 0, "csv header: %.60s", c ? c : "");
    EXPECT(s && strstr(s, "<svg") && strstr(s, "</svg>"), "svg not a complete document");
    EXPECT(s && strstr(s, "time (ms)") && strstr(s, "pinned host memory (") && strstr(s, ">compact<") &&
               strstr(s, ">per_tensor<") && count_str(s, "<polyline") == 4,
           "svg lacks axes labels, legend entries or the 4 lines (2 modes x in use / reserved)");
    EXPECT(moe_staging_write_svg(ctl, 2, "/nonexistent-dir/x.svg", &err) == MT_ERR_IO && strstr(err.msg, "/nonexistent-dir"),
           "unwritable path: %s", err.msg);
    /* trace counters */
    char *mem = NULL;
    size_t memlen = 0;
    FILE *f = open_memstream(&mem, &memlen);
    const size_t events = moe_staging_trace_counters(f, tl[0], 7, 100.0, false);
    fclose(f);
    EXPECT(events >= tl[0]->n && count_str(mem, "\"ph\":\"C\"") == events && mem[0] == '{',
           "trace: %zu events written, %zu found", events, count_str(mem, "\"ph\":\"C\""));
    EXPECT(strstr(mem, "\"pid\":7") && strstr(mem, "\"name\":\"staging compact\""), "trace fields: %.200s", mem);
    char small[16];
    const size_t need = moe_staging_trace_counter_event(small, sizeof small, tl[0], 0, 1, 0);
    EXPECT(need > sizeof small && strlen(small) == sizeof small - 1, "formatter must truncate and report %zu", need);
    free(mem);
    free(c);
    free(s);
    moe_staging_timeline_free(tl[0]);
    moe_staging_timeline_free(tl[1]);
    kern_free(dev, buf);
    free(host);
    kern_device_destroy(dev);
}

int main(void) {
    test_plan_sizes();
    test_measured_ratio();
    test_bad_settings();
    test_reports();
    return staging_test_finish("staging_report_test", g_failures);
}
