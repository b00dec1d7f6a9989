/* The NVMe tier's write back in the background (nvme_state.h), driven as
 * the host worker drives it, on the test's TMPDIR: blocks loaded, changed
 * and unloaded back to back, the next one read ahead meanwhile, so the
 * writes in flight reach their bound; every later read of a parameter (the
 * next load, a load right after its unload, a read ahead, a fetch's
 * working copies) sees the bytes last unloaded, and a drain leaves nothing
 * in flight.  Then, in a child (the file size limit is the process's), a
 * write past the limit: reported by the next call that waits for it (a
 * load of its parameters, or an unload that waits for the oldest write),
 * kept as the tier's failure naming the file, and a later load of its
 * parameters never reads the older state the store still holds. */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine/optim/nvme_state.h"
#include "kernels/host/adamw_host.h"

static int failures;
#define EXPECT(c, ...)                                                       \
    do {                                                                     \
        if (!(c)) {                                                          \
            fprintf(stderr, "%s:%d: expected %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            failures++;                                                      \
        }                                                                    \
    } while (0)

/* 6 blocks of 3 parameters; a few hundred KB each, so a write takes a while */
enum { BLOCKS = 6, PER = 3, P = BLOCKS * PER };

static char root[4096];

typedef struct {
    eng_model_t m;
    eng_param_spec_t spec[P];
    bool in_store[P], with_master[P], with_home[P];
} fixture_t;

static size_t numel_of(int i) { return 40000 + 3001 * (size_t)i; }

/* The value byte k of parameter i's state holds after round r. */
static unsigned char byte_of(int i, int r, size_t k) {
    return (unsigned char)(k * 131u + (unsigned)i * 17u + (unsigned)r * 29u);
}

/* Parameter i's host buffers (its moments, master and working copy where
 * loaded) filled as round r's update leaves them. */
static void fill(eng_param_t *p, int i, int r) {
    const size_t mb = kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, p->spec->numel);
    for (size_t k = 0; k < mb; k++) ((unsigned char *)p->host_mom)[k] = byte_of(i, r, k);
    for (size_t k = 0; p->host_w && k < p->spec->numel; k++) p->host_w[k] = (float)(i * 1000 + r) + (float)k * 1e-3f;
    for (size_t k = 0; p->work_bf16 && k < p->spec->numel; k++) p->work_bf16[k] = (uint16_t)(i * 7 + r * 3 + k);
}

/* Whether parameter i's loaded buffers hold round r's fill. */
static bool holds(const eng_param_t *p, int i, int r) {
    const size_t mb = kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, p->spec->numel);
    for (size_t k = 0; k < mb; k++)
        if (((const unsigned char *)p->host_mom)[k] != byte_of(i, r, k)) return false;
    for (size_t k = 0; p->host_w && k < p->spec->numel; k++)
        if (p->host_w[k] != (float)(i * 1000 + r) + (float)k * 1e-3f) return false;
    for (size_t k = 0; p->work_bf16 && k < p->spec->numel; k++)
        if (p->work_bf16[k] != (uint16_t)(i * 7 + r * 3 + k)) return false;
    return true;
}

/* Every parameter in the store; masters for odd ones (each with a bf16
 * working copy), the working copy as the weights' home for every third
 * parameter of those. */
static void fixture_init(fixture_t *f, bool masters) {
    memset(f, 0, sizeof *f);
    f->m.num_params = P;
    f->m.params = calloc(P, sizeof *f->m.params);
    for (int i = 0; i < P; i++) {
        eng_param_spec_t *s = &f->spec[i];
        snprintf(s->name, sizeof s->name, "layers.%d.w%d", i / PER, i % PER);
        s->numel = numel_of(i);
        eng_param_t *p = &f->m.params[i];
        *p = (eng_param_t){.spec = s, .block = i / PER, .mom_fmt = KERN_MOMENTS_F32};
        f->in_store[i] = true;
        f->with_master[i] = masters && i % 2 == 1;
        f->with_home[i] = f->with_master[i] && i % 3 == 0;
        if (f->with_master[i]) {
            p->host_w = calloc(s->numel, sizeof(float));
            p->work_bf16 = calloc(s->numel, sizeof(uint16_t));
        }
    }
}

static void fixture_free(fixture_t *f) {
    for (int i = 0; i < P; i++) {
        free(f->m.params[i].host_w);
        free(f->m.params[i].work_bf16);
    }
    free(f->m.params);
}

static eng_optim_nvme_t *open_tier(fixture_t *f) {
    eng_optim_nvme_t *nv = NULL;
    mt_error_t err = {0};
    const mt_status_t st =
        eng_optim_nvme_open(&nv, &f->m, f->in_store, f->with_master, f->with_home, root, 0, &err);
    EXPECT(st == MT_OK, "open: %s", err.msg);
    return st == MT_OK ? nv : NULL;
}

static void block_idx(int b, int *idx) {
    for (int k = 0; k < PER; k++) idx[k] = b * PER + k;
}

static int writes_in_flight(const eng_optim_nvme_t *nv) {
    int n = 0;
    for (int j = 0; j < ENG_NVME_MAX_WRITES; j++) n += nv->wr[j].ticket != 0;
    return n;
}

/* Round r over every block, last first as a backward goes: load (what
 * round r-1 left), read the next block ahead, change, unload. */
static void round_of_blocks(fixture_t *f, eng_optim_nvme_t *nv, int r, int *max_writes) {
    mt_error_t err = {0};
    for (int b = BLOCKS - 1; b >= 0; b--) {
        int idx[PER], next[PER];
        block_idx(b, idx);
        EXPECT(eng_optim_nvme_load_many(nv, &f->m, idx, PER, &err) == MT_OK, "round %d load of block %d: %s", r, b,
               err.msg);
        if (b > 0) {
            block_idx(b - 1, next);
            eng_optim_nvme_prefetch(nv, &f->m, next, PER);
        }
        for (int k = 0; k < PER; k++) {
            eng_param_t *p = &f->m.params[idx[k]];
            if (r > 0) EXPECT(holds(p, idx[k], r - 1), "round %d: %s does not hold round %d's bytes", r,
                              p->spec->name, r - 1);
            fill(p, idx[k], r);
            p->step = r + 1;
        }
        EXPECT(eng_optim_nvme_unload_many(nv, &f->m, idx, PER, true, &err) == MT_OK,
               "round %d unload of block %d: %s", r, b, err.msg);
        for (int k = 0; k < PER; k++)
            EXPECT(!f->m.params[idx[k]].host_mom && (!f->with_master[idx[k]] || !f->m.params[idx[k]].host_w),
                   "unloaded state still pointed at");
        const int w = writes_in_flight(nv);
        EXPECT(w <= ENG_NVME_MAX_WRITES && mt_store_in_flight(nv->store) <= MT_STORE_MAX_BATCHES,
               "%d writes, %d batches in flight", w, mt_store_in_flight(nv->store));
        if (w > *max_writes) *max_writes = w;
    }
}

/* A parameter's state read back as soon as it is unloaded: a load, and
 * (for a weights' home) a fetch's read of the working copy. */
static void read_after_write(fixture_t *f, eng_optim_nvme_t *nv, int r) {
    mt_error_t err = {0};
    int idx[PER];
    block_idx(1, idx);
    EXPECT(eng_optim_nvme_load_many(nv, &f->m, idx, PER, &err) == MT_OK, "load: %s", err.msg);
    for (int k = 0; k < PER; k++) fill(&f->m.params[idx[k]], idx[k], r);
    EXPECT(eng_optim_nvme_unload_many(nv, &f->m, idx, PER, true, &err) == MT_OK, "unload: %s", err.msg);
    EXPECT(writes_in_flight(nv) > 0, "the unload waited for its own write");
    const int home = 3; /* block 1's first parameter: odd, a multiple of 3 */
    if (f->with_home[home]) {
        char *buf = eng_optim_nvme_buffer_alloc(eng_optim_nvme_home_buffer_bytes(&f->m, home));
        EXPECT(eng_optim_nvme_read_homes(nv, &f->m, &home, 1, buf, &err) == MT_OK, "read_homes: %s", err.msg);
        bool same = true;
        for (size_t k = 0; k < numel_of(home); k++) same &= ((uint16_t *)buf)[k] == (uint16_t)(home * 7 + r * 3 + k);
        EXPECT(same, "a fetch right after the write back read an older working copy");
        eng_optim_nvme_buffer_free(buf);
    }
    EXPECT(eng_optim_nvme_load_many(nv, &f->m, idx, PER, &err) == MT_OK, "load right after: %s", err.msg);
    for (int k = 0; k < PER; k++)
        EXPECT(holds(&f->m.params[idx[k]], idx[k], r), "a load right after the write back read older bytes");
    eng_optim_nvme_unload_many(nv, &f->m, idx, PER, false, NULL);
}

static void test_back_to_back(bool masters) {
    fixture_t f;
    fixture_init(&f, masters);
    eng_optim_nvme_t *nv = open_tier(&f);
    if (!nv) {
        fixture_free(&f);
        return;
    }
    int max_writes = 0;
    for (int r = 0; r < 3; r++) round_of_blocks(&f, nv, r, &max_writes);
    EXPECT(max_writes == ENG_NVME_MAX_WRITES, "at most %d writes in flight, expected the bound %d", max_writes,
           ENG_NVME_MAX_WRITES);
    read_after_write(&f, nv, 7);
    mt_error_t err = {0};
    EXPECT(eng_optim_nvme_drain(nv, &err) == MT_OK, "drain: %s", err.msg);
    EXPECT(writes_in_flight(nv) == 0 && mt_store_in_flight(nv->store) <= 1, "drain left writes in flight");
    const eng_nvme_io_t io = eng_optim_nvme_io(nv);
    uint64_t want = 0; /* 3 rounds and read_after_write's block, each extent's bytes once per write */
    for (int i = 0; i < P; i++) {
        const uint64_t b = mt_store_extent_bytes(nv->store, nv->extent[i]) +
                           (nv->home[i] >= 0 ? mt_store_extent_bytes(nv->store, nv->home[i]) : 0);
        want += b * (3 + (i / PER == 1));
    }
    EXPECT(io.write_bytes == want, "%" PRIu64 " bytes written, expected %" PRIu64, io.write_bytes, want);
    EXPECT(eng_optim_nvme_error(nv, &err) == MT_OK, "a failure kept: %s", err.msg);
    /* what round 2 left, read once more after the drain */
    int idx[PER];
    block_idx(4, idx);
    EXPECT(eng_optim_nvme_load_many(nv, &f.m, idx, PER, &err) == MT_OK, "load after drain: %s", err.msg);
    for (int k = 0; k < PER; k++) EXPECT(holds(&f.m.params[idx[k]], idx[k], 2), "after the drain");
    eng_optim_nvme_unload_many(nv, &f.m, idx, PER, false, NULL);
    eng_optim_nvme_free(nv);
    fixture_free(&f);
}

/* The store's offset of parameter i's extent in adamw.bin (its header,
 * then the extents in parameter order; no masters). */
static uint64_t offset_of(const fixture_t *f, int i) {
    uint64_t at = 4096;
    for (int j = 0; j < i; j++)
        at += mt_store_span_bytes(kern_moments_bytes(KERN_MOMENTS_F32, f->spec[j].numel));
    return at;
}

static bool names_write_failure(const mt_error_t *err, const eng_optim_nvme_t *nv) {
    return strstr(err->msg, mt_store_file_path(nv->store, 0)) && strstr(err->msg, "write of") &&
           strstr(err->msg, "failed");
}

/* Blocks 4 and 5 lie past the file size limit: their writes fail. */
static int write_failure_child(void) {
    failures = 0; /* the parent's, copied by fork: this child reports its own */
    signal(SIGXFSZ, SIG_IGN);
    fixture_t f;
    fixture_init(&f, false);
    eng_optim_nvme_t *nv = open_tier(&f);
    if (!nv) return 1;
    mt_error_t err = {0};
    int idx[PER], low[PER];
    block_idx(5, idx);
    /* block 5 written once before the limit: what a lost parameter's load must not give back */
    EXPECT(eng_optim_nvme_load_many(nv, &f.m, idx, PER, &err) == MT_OK, "load: %s", err.msg);
    for (int k = 0; k < PER; k++) fill(&f.m.params[idx[k]], idx[k], 0), f.m.params[idx[k]].step = 1;
    EXPECT(eng_optim_nvme_unload_many(nv, &f.m, idx, PER, true, &err) == MT_OK, "unload: %s", err.msg);
    EXPECT(eng_optim_nvme_drain(nv, &err) == MT_OK, "drain: %s", err.msg);
    const uint64_t limit = offset_of(&f, 4 * PER) + (64u << 10);
    struct rlimit rl = {limit, limit};
    EXPECT(setrlimit(RLIMIT_FSIZE, &rl) == 0, "setrlimit");
    /* the failing write, then its parameters' next load: that load reports it */
    EXPECT(eng_optim_nvme_load_many(nv, &f.m, idx, PER, &err) == MT_OK, "load: %s", err.msg);
    EXPECT(holds(&f.m.params[idx[0]], idx[0], 0), "the first write");
    for (int k = 0; k < PER; k++) fill(&f.m.params[idx[k]], idx[k], 1), f.m.params[idx[k]].step = 2;
    EXPECT(eng_optim_nvme_unload_many(nv, &f.m, idx, PER, true, &err) == MT_OK, "the unload waits: %s", err.msg);
    mt_status_t st = eng_optim_nvme_load_many(nv, &f.m, idx, PER, &err);
    EXPECT(st == MT_ERR_IO && names_write_failure(&err, nv), "the next load of the block: %s",
           st == MT_OK ? "succeeded" : err.msg);
    EXPECT(!f.m.params[idx[0]].host_mom, "a failed load left state loaded");
    EXPECT(eng_optim_nvme_error(nv, &err) == MT_ERR_IO && names_write_failure(&err, nv), "not kept: %s", err.msg);
    /* a load of a lost parameter, its write long waited for: the failure, not the older state */
    st = eng_optim_nvme_load(nv, &f.m, idx[1], &err);
    EXPECT(st == MT_ERR_IO && strstr(err.msg, f.spec[idx[1]].name) && names_write_failure(&err, nv),
           "a lost parameter's load: %s", st == MT_OK ? "succeeded" : err.msg);
    /* block 4 lies past the limit too: its write fails in the background
     * while blocks below the limit are unloaded after it, and the unload
     * that finds ENG_NVME_MAX_WRITES in flight waits for it and reports it */
    block_idx(4, idx);
    EXPECT(eng_optim_nvme_load_many(nv, &f.m, idx, PER, &err) == MT_OK, "load: %s", err.msg);
    for (int k = 0; k < PER; k++) fill(&f.m.params[idx[k]], idx[k], 1), f.m.params[idx[k]].step = 1;
    EXPECT(eng_optim_nvme_unload_many(nv, &f.m, idx, PER, true, &err) == MT_OK, "the unload waits: %s", err.msg);
    for (int b = 0; b < ENG_NVME_MAX_WRITES; b++) {
        block_idx(b, low);
        EXPECT(eng_optim_nvme_load_many(nv, &f.m, low, PER, &err) == MT_OK, "load below: %s", err.msg);
        for (int k = 0; k < PER; k++) fill(&f.m.params[low[k]], low[k], 1), f.m.params[low[k]].step = 1;
        st = eng_optim_nvme_unload_many(nv, &f.m, low, PER, true, &err);
        if (b < ENG_NVME_MAX_WRITES - 1) EXPECT(st == MT_OK, "an unload with room: %s", err.msg);
        else EXPECT(st == MT_ERR_IO && names_write_failure(&err, nv), "an unload waiting for a failed write: %s",
                    st == MT_OK ? "succeeded" : err.msg);
    }
    /* the writes below the limit are intact */
    block_idx(0, low);
    EXPECT(eng_optim_nvme_load_many(nv, &f.m, low, PER, &err) == MT_OK, "load below after: %s", err.msg);
    for (int k = 0; k < PER; k++) EXPECT(holds(&f.m.params[low[k]], low[k], 1), "a write beside a failed one");
    eng_optim_nvme_unload_many(nv, &f.m, low, PER, false, NULL);
    EXPECT(eng_optim_nvme_drain(nv, &err) == MT_ERR_IO && names_write_failure(&err, nv), "drain: %s", err.msg);
    eng_optim_nvme_free(nv);
    fixture_free(&f);
    return failures != 0;
}

static void test_write_failure(void) {
    fflush(NULL);
    const pid_t pid = fork();
    if (pid == 0) _exit(write_failure_child());
    int wst = 0;
    waitpid(pid, &wst, 0);
    EXPECT(WIFEXITED(wst) && WEXITSTATUS(wst) == 0, "a write failure reported (see above)");
}

/* A LoRA run's frozen base on the tier: a bf16 home, fp32 weights and an
 * NF4 home, each written to base.bin when the tier opens and its host copy
 * let go (a quantised home keeps its layout); a fetch's read gives back
 * exactly the bytes the host held; a trained parameter beside them keeps
 * its state as before, and a frozen one not asked for stays in host memory. */
static void test_base_homes(void) {
    enum { N = 5, NUMEL = 4096 };
    eng_param_spec_t spec[N] = {{.numel = NUMEL}, {.numel = NUMEL}, {.numel = NUMEL}, {.numel = NUMEL}, {.numel = NUMEL}};
    eng_param_t params[N];
    for (int i = 0; i < N; i++) {
        snprintf(spec[i].name, sizeof spec[i].name, "layers.0.base%d", i);
        params[i] = (eng_param_t){.spec = &spec[i], .frozen = i != 3, .mom_fmt = KERN_MOMENTS_F32,
                                  .w_dtype = i == 0 || i == 2 ? MT_BF16 : MT_F32};
    }
    float *x = malloc(NUMEL * sizeof *x);
    params[0].home_bf16 = malloc(NUMEL * sizeof(uint16_t));
    params[1].host_w = malloc(NUMEL * sizeof(float));
    params[3].host_w = calloc(NUMEL, sizeof(float));
    params[4].host_w = malloc(NUMEL * sizeof(float));
    eng_quant_home_t *q = calloc(1, sizeof *q);
    for (size_t k = 0; k < NUMEL; k++) {
        x[k] = (float)((int)(k * 37 % 101) - 50) * 0.01f;
        params[0].home_bf16[k] = (uint16_t)(k * 13 + 5);
        params[1].host_w[k] = params[4].host_w[k] = x[k] * 3.0f;
    }
    mt_error_t err = {0};
    EXPECT(eng_quant_home_bnb4(q, x, 64, 64, MT_QUANT_NF4, true, "layers.0.base2", &err) == MT_OK, "%s", err.msg);
    params[2].home_q = q;
    /* what each home holds, as a fetch would copy it */
    const size_t want_bytes[3] = {NUMEL * 2, NUMEL * 4, q->nbytes};
    void *want[3] = {malloc(want_bytes[0]), malloc(want_bytes[1]), malloc(want_bytes[2])};
    memcpy(want[0], params[0].home_bf16, want_bytes[0]);
    memcpy(want[1], params[1].host_w, want_bytes[1]);
    memcpy(want[2], q->bytes, want_bytes[2]);
    eng_model_t m = {.num_params = N, .params = params};
    const bool in_store[N] = {false, false, false, true, false}, with_home[N] = {true, true, true, false, false};
    eng_optim_nvme_t *nv = NULL;
    EXPECT(eng_optim_nvme_open(&nv, &m, in_store, NULL, with_home, root, 0, &err) == MT_OK, "open: %s", err.msg);
    if (!nv) return;
    EXPECT(!params[0].home_bf16 && !params[1].host_w && !q->bytes && !q->view.codes && q->nbytes == want_bytes[2],
           "a frozen home on the tier is still in host memory (or the quantised layout is gone)");
    EXPECT(params[3].host_w && params[4].host_w, "a master or a frozen home kept in host memory was let go");
    for (int i = 0; i < N; i++) {
        EXPECT(eng_optim_nvme_holds_base_home(nv, i) == (i < 3), "holds_base_home(%d)", i);
        EXPECT(eng_optim_nvme_holds(nv, i) == (i == 3), "holds(%d): a frozen parameter has no state", i);
    }
    const int idx[3] = {0, 1, 2};
    size_t total = 0;
    for (int k = 0; k < 3; k++) {
        EXPECT(eng_optim_nvme_home_bytes(&m, k) == want_bytes[k], "home %d: %zu bytes, expected %zu", k,
               eng_optim_nvme_home_bytes(&m, k), want_bytes[k]);
        total += eng_optim_nvme_home_buffer_bytes(&m, k);
    }
    char *buf = eng_optim_nvme_buffer_alloc(total);
    EXPECT(eng_optim_nvme_read_homes(nv, &m, idx, 3, buf, &err) == MT_OK, "read_homes: %s", err.msg);
    size_t off = 0;
    for (int k = 0; k < 3; k++) {
        EXPECT(memcmp(buf + off, want[k], want_bytes[k]) == 0, "home %d read back other bytes", k);
        off += eng_optim_nvme_home_buffer_bytes(&m, k);
    }
    /* adamw.bin, weights.bin (none of its extents here), base.bin */
    EXPECT(strstr(mt_store_file_path(nv->store, 2), "base.bin"), "the base's file: %s", mt_store_file_path(nv->store, 2));
    eng_optim_nvme_buffer_free(buf);
    eng_optim_nvme_free(nv);
    for (int k = 0; k < 3; k++) free(want[k]);
    for (int i = 0; i < N; i++) {
        free(params[i].host_w);
        free(params[i].home_bf16);
    }
    eng_quant_home_free(q);
    free(q);
    free(x);
}

int main(void) {
    const char *t = getenv("TEST_TMPDIR");
    snprintf(root, sizeof root, "%s/nvme_state_test.XXXXXX", t ? t : "/tmp");
    if (!mkdtemp(root)) return 2;
    test_back_to_back(false);
    test_back_to_back(true);
    test_write_failure();
    test_base_homes();
    rmdir(root);
    if (failures) fprintf(stderr, "%d failures\n", failures);
    else printf("nvme_state_test: all passed\n");
    return failures != 0;
}
