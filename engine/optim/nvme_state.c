/* Host AdamW state on the NVMe tier (see nvme_state.h). */
#include "engine/optim/nvme_state.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "kernels/host/adamw_host.h"

/* A parameter's master in its extent: fp32, padded so the moments after
 * it start on a cache line as in their own allocation. */
static size_t master_bytes(const eng_param_t *p) { return (p->spec->numel * sizeof(float) + 63) / 64 * 64; }

/* A parameter's extent and buffer: its master (with_master), then its
 * moments' one allocation in the run's format (kern_moments_bytes: m | v |
 * scales, each part 64-byte aligned so the AdamW kernel's vectors start on
 * a cache line). */
static uint64_t extent_bytes(const eng_param_t *p, bool with_master) {
    return (with_master ? master_bytes(p) : 0) + kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, p->spec->numel);
}

/* A home's extent: the bytes a fetch copies from it as they are.  A
 * trained parameter's home is its bf16 working copy; a frozen one's is
 * its home as the base keeps it: a quantised base's packed codes and
 * scales, else a copy in its working dtype (a bf16 home, or fp32 weights
 * where compute reads fp32: lora_model.c freeze_base). */
static uint64_t home_bytes(const eng_param_t *p) {
    if (!p->frozen) return p->spec->numel * sizeof(uint16_t);
    return p->home_q ? p->home_q->nbytes : p->spec->numel * mt_dtype_size(p->w_dtype);
}

/* A frozen parameter's home, home_bytes of it, copied to dst: a quantised
 * one packed from its bytes or, still pending in the checkpoint's
 * mapping, straight from there (it never takes host memory of its own). */
static void copy_base_home(const eng_param_t *p, void *dst) {
    if (p->home_q) {
        eng_quant_home_fill(p->home_q, dst);
        return;
    }
    const void *home = p->w_dtype == MT_BF16 ? (const void *)p->home_bf16 : (const void *)p->host_w;
    MT_CHECK(home, "the frozen home of %s is not in host memory when the NVMe tier is placed", p->spec->name);
    memcpy(dst, home, home_bytes(p));
}

/* Parameter i's home is a frozen base's: on the tier without AdamW state, never written back. */
static bool is_base_home(const eng_optim_nvme_t *nv, int i) { return nv->home[i] >= 0 && nv->extent[i] < 0; }

uint64_t eng_optim_nvme_planned_bytes(const eng_model_t *m, const bool *in_store, const bool *with_master,
                                      const bool *with_home) {
    uint64_t total = 0;
    for (int i = 0; i < m->num_params; i++) {
        if (in_store[i]) total += mt_store_span_bytes(extent_bytes(&m->params[i], with_master && with_master[i]));
        if (with_home && with_home[i]) total += mt_store_span_bytes(home_bytes(&m->params[i]));
    }
    return total;
}

/* Parameter i's master (zero moments after it) and bf16 working copy,
 * where the store holds them, written to their new extents; then their
 * host copies freed. */
static mt_status_t move_out(eng_optim_nvme_t *nv, eng_param_t *p, int i, mt_error_t *err) {
    MT_CHECK(p->host_w && p->work_bf16 && !p->host_mom && p->step == 0,
             "the master of %s moved to the NVMe tier without a bf16 working copy, or after a step", p->spec->name);
    char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p, true))); /* zeroed */
    MT_CHECK(nv->home[i] < 0 || !p->work_pinned, "the working copy of %s is pinned and its home planned on NVMe",
             p->spec->name);
    char *hbuf = nv->home[i] >= 0 ? mt_sio_buffer_alloc(mt_store_buffer_bytes(home_bytes(p))) : NULL;
    MT_CHECK(buf && (hbuf || nv->home[i] < 0), "out of memory for the fp32 master buffer of %s", p->spec->name);
    memcpy(buf, p->host_w, p->spec->numel * sizeof(float));
    mt_store_op_t ops[2] = {{nv->extent[i], buf}, {nv->home[i], hbuf}};
    if (hbuf) memcpy(hbuf, p->work_bf16, home_bytes(p));
    const mt_status_t st = mt_store_write(nv->store, ops, hbuf ? 2 : 1, err);
    mt_sio_buffer_free(buf);
    mt_sio_buffer_free(hbuf);
    if (st != MT_OK) return mt_error_prefix(err, "fp32 master: ");
    free(p->host_w);
    p->host_w = NULL;
    if (hbuf) {
        free(p->work_bf16);
        p->work_bf16 = NULL;
    }
    return MT_OK;
}

/* Every frozen base home the store holds written to its extent, one at a
 * time through a buffer of its own; the host copies stay until all are
 * written (free_base_homes), so a failure leaves host memory as it was. */
static mt_status_t write_base_homes(eng_optim_nvme_t *nv, const eng_model_t *m, mt_error_t *err) {
    for (int i = 0; i < m->num_params; i++) {
        if (!is_base_home(nv, i)) continue;
        const eng_param_t *p = &m->params[i];
        char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(home_bytes(p)));
        MT_CHECK(buf, "out of memory for the write buffer of %s", p->spec->name);
        copy_base_home(p, buf);
        const mt_store_op_t op = {nv->home[i], buf};
        const mt_status_t st = mt_store_write(nv->store, &op, 1, err);
        mt_sio_buffer_free(buf);
        if (st != MT_OK) return mt_error_prefix(err, "frozen base weights: ");
    }
    return MT_OK;
}

/* The host copies of the frozen homes now on the tier let go: freed, or
 * for a home in the base checkpoint's mapping (eng_param_t.home_mapped)
 * no longer pointed at (its pages are clean, the kernel takes them back).
 * A quantised home keeps its layout, which the fetch's dequantisation reads. */
static void free_base_homes(eng_optim_nvme_t *nv, eng_model_t *m) {
    for (int i = 0; i < m->num_params; i++) {
        if (!is_base_home(nv, i)) continue;
        eng_param_t *p = &m->params[i];
        if (p->home_q) eng_quant_home_drop_bytes(p->home_q);
        if (!p->home_mapped) free(p->home_bf16);
        p->home_bf16 = NULL;
        p->home_mapped = false;
        free(p->host_w);
        p->host_w = NULL;
    }
}

/* Parameter i's master (and bf16 working copy) back in host memory, read
 * from the store: an open that failed half way leaves the run as it was. */
static void bring_back(eng_optim_nvme_t *nv, eng_model_t *m, int i) {
    eng_param_t *p = &m->params[i];
    const bool home = nv->home[i] >= 0 && !p->work_bf16;
    mt_error_t err = {0};
    MT_CHECK(eng_optim_nvme_load(nv, m, i, &err) == MT_OK, "%s", err.msg);
    float *w = malloc(p->spec->numel * sizeof *w);
    uint16_t *wb = home ? malloc(home_bytes(p)) : NULL;
    MT_CHECK(w && (wb || !home), "out of host memory bringing %s back from the NVMe tier", p->spec->name);
    memcpy(w, p->host_w, p->spec->numel * sizeof *w);
    if (wb) memcpy(wb, p->work_bf16, home_bytes(p));
    eng_optim_nvme_unload(nv, m, i, false, NULL);
    p->host_w = w;
    if (wb) p->work_bf16 = wb;
}

mt_status_t eng_optim_nvme_open(eng_optim_nvme_t **out, eng_model_t *m, const bool *in_store, const bool *with_master,
                                const bool *with_home, const char *dir, uint64_t budget, mt_error_t *err) {
    *out = NULL;
    eng_optim_nvme_t *nv = calloc(1, sizeof *nv);
    MT_CHECK_ALLOC(nv, "NVMe optimizer state");
    const size_t np = (size_t)(m->num_params > 0 ? m->num_params : 1);
    nv->num_params = m->num_params;
    nv->extent = malloc(np * sizeof *nv->extent);
    nv->master = calloc(np, sizeof *nv->master);
    nv->home = malloc(np * sizeof *nv->home);
    nv->pending = calloc(np, sizeof *nv->pending);
    nv->lost = calloc(np, sizeof *nv->lost);
    MT_CHECK(nv->extent && nv->master && nv->home && nv->pending && nv->lost,
             "out of memory for the NVMe extent table");
    pthread_mutex_init(&nv->lock, NULL);
    bool any_base = false;
    for (int i = 0; i < m->num_params; i++) {
        nv->extent[i] = nv->home[i] = -1;
        nv->master[i] = in_store[i] && with_master && with_master[i];
        const bool base = !in_store[i] && m->params[i].frozen;
        MT_CHECK(!(with_home && with_home[i]) || nv->master[i] || base,
                 "the home of %s on NVMe without its master", m->params[i].spec->name);
        any_base |= with_home && with_home[i] && base;
    }
    const mt_store_opts_t so = {.dir = dir, .budget = budget,
                                .planned_bytes = eng_optim_nvme_planned_bytes(m, in_store, with_master, with_home)};
    mt_status_t st = mt_store_open(&nv->store, &so, err);
    int file = -1;
    if (st == MT_OK) st = mt_store_file_add(nv->store, "adamw.bin", &file, err);
    int hfile = -1;
    if (st == MT_OK && with_home) st = mt_store_file_add(nv->store, "weights.bin", &hfile, err);
    /* a frozen base's homes apart: a file the tier only ever reads back */
    int bfile = -1;
    if (st == MT_OK && any_base) st = mt_store_file_add(nv->store, "base.bin", &bfile, err);
    for (int i = 0; i < m->num_params && st == MT_OK; i++) {
        if (in_store[i])
            st = mt_store_reserve(nv->store, file, extent_bytes(&m->params[i], nv->master[i]), &nv->extent[i], err);
        if (st == MT_OK && with_home && with_home[i])
            st = mt_store_reserve(nv->store, in_store[i] ? hfile : bfile, home_bytes(&m->params[i]), &nv->home[i],
                                  err);
    }
    /* every extent reserved (the space is there) before the first master leaves host memory */
    for (int i = 0; i < m->num_params && st == MT_OK; i++)
        if (nv->master[i]) st = move_out(nv, &m->params[i], i, err);
    if (st == MT_OK) st = write_base_homes(nv, m, err);
    if (st == MT_OK) free_base_homes(nv, m);
    if (st != MT_OK) {
        /* what already moved comes back: the run stops with host memory as it was */
        for (int i = 0; i < m->num_params; i++)
            if (nv->master[i] && !m->params[i].host_w) bring_back(nv, m, i);
        eng_optim_nvme_free(nv);
        return st;
    }
    *out = nv;
    return MT_OK;
}

/* Frees what a prefetch holds (its batch already waited for). */
static void prefetch_clear(eng_nvme_prefetch_t *pf) {
    for (int k = 0; k < pf->n; k++) {
        mt_sio_buffer_free(pf->buf[k]);
        mt_sio_buffer_free(pf->home[k]);
    }
    free(pf->idx);
    free(pf->buf);
    free(pf->home);
    memset(pf, 0, sizeof *pf);
}

/* Under nv->lock: st (err's) kept as the tier's failure unless one is already. */
static void keep_failure(eng_optim_nvme_t *nv, mt_status_t st, const mt_error_t *err) {
    if (st == MT_OK || nv->failed != MT_OK) return;
    nv->failed = st;
    nv->err = *err;
}

/* Under nv->lock: the write back in slot w waited for (the wait counted in
 * write_s), its buffers freed, its parameters no longer pending.  A
 * failure is kept as the tier's, its parameters marked lost (the store
 * still holds an older state of them), and returned in err (may be NULL). */
static mt_status_t write_finish(eng_optim_nvme_t *nv, eng_nvme_write_t *w, mt_error_t *err) {
    mt_error_t e = {0};
    const double t0 = mt_now_s();
    const mt_status_t st = mt_store_wait(nv->store, w->ticket, &e);
    nv->io.write_s += mt_now_s() - t0;
    if (st == MT_OK) nv->io.write_bytes += w->bytes;
    else mt_error_prefix(&e, "AdamW state: ");
    keep_failure(nv, st, &e);
    if (st != MT_OK && err) *err = e;
    for (int k = 0; k < w->n; k++) {
        if (nv->pending[w->idx[k]] == w->ticket) nv->pending[w->idx[k]] = 0;
        nv->lost[w->idx[k]] = st != MT_OK;
    }
    for (int k = 0; k < w->nbuf; k++) mt_sio_buffer_free(w->buf[k]);
    free(w->idx);
    free(w->buf);
    memset(w, 0, sizeof *w);
    return st;
}

/* Under nv->lock: every write of idx[0..n) in flight waited for, since a
 * read of an extent must come after its write (store.h refuses it during
 * one, and expects it only once waited for); then a lost parameter is the
 * failure of its write.  The first failure is returned in err (may be NULL). */
static mt_status_t wait_writes_of(eng_optim_nvme_t *nv, const eng_model_t *m, const int *idx, int n,
                                  mt_error_t *err) {
    mt_status_t st = MT_OK;
    for (int k = 0; k < n; k++) {
        const mt_store_ticket_t t = nv->pending[idx[k]];
        for (int j = 0; t != 0 && j < ENG_NVME_MAX_WRITES; j++) {
            if (nv->wr[j].ticket != t) continue;
            const mt_status_t ws = write_finish(nv, &nv->wr[j], st == MT_OK ? err : NULL);
            if (st == MT_OK) st = ws;
        }
    }
    for (int k = 0; k < n && st == MT_OK; k++)
        if (nv->lost[idx[k]])
            st = mt_error_set(err, nv->failed, "AdamW state of %s: its write back failed, so the NVMe tier holds an "
                              "older state (%s)", m->params[idx[k]].spec->name, nv->err.msg);
    return st;
}

/* Under nv->lock: a free write slot, the oldest write waited for when all
 * are in flight (its failure in *st and err). */
static eng_nvme_write_t *write_room(eng_optim_nvme_t *nv, mt_status_t *st, mt_error_t *err) {
    eng_nvme_write_t *oldest = NULL;
    for (int j = 0; j < ENG_NVME_MAX_WRITES; j++) {
        if (nv->wr[j].ticket == 0) return &nv->wr[j];
        if (!oldest || nv->wr[j].ticket < oldest->ticket) oldest = &nv->wr[j];
    }
    const mt_status_t ws = write_finish(nv, oldest, *st == MT_OK ? err : NULL);
    if (*st == MT_OK) *st = ws;
    return oldest;
}

/* Under nv->lock: the read ahead waited for and dropped when it reads any
 * of idx[0..n), which are about to be written: what it holds is older. */
static void drop_prefetch_of(eng_optim_nvme_t *nv, const int *idx, int n) {
    eng_nvme_prefetch_t *pf = &nv->pf;
    bool hit = false;
    for (int k = 0; k < pf->n && !hit; k++)
        for (int j = 0; j < n && !hit; j++) hit = pf->idx[k] == idx[j];
    if (!hit) return;
    mt_error_t err = {0};
    const double t0 = mt_now_s();
    (void)mt_store_wait(nv->store, pf->ticket, &err); /* its failure is no one's: the state it read is dropped */
    nv->io.read_s += mt_now_s() - t0;
    prefetch_clear(pf);
}

mt_status_t eng_optim_nvme_drain(eng_optim_nvme_t *nv, mt_error_t *err) {
    if (!nv) return MT_OK;
    pthread_mutex_lock(&nv->lock);
    for (;;) { /* oldest first, as they were queued */
        eng_nvme_write_t *w = NULL;
        for (int j = 0; j < ENG_NVME_MAX_WRITES; j++)
            if (nv->wr[j].ticket != 0 && (!w || nv->wr[j].ticket < w->ticket)) w = &nv->wr[j];
        if (!w) break;
        (void)write_finish(nv, w, NULL); /* kept in nv->failed */
    }
    const mt_status_t st = nv->failed;
    if (st != MT_OK && err) *err = nv->err;
    pthread_mutex_unlock(&nv->lock);
    return st;
}

void eng_optim_nvme_free(eng_optim_nvme_t *nv) {
    if (!nv) return;
    mt_error_t err = {0};
    (void)eng_optim_nvme_drain(nv, &err); /* the buffers are the tier's until their writes end */
    if (nv->pf.n > 0) { /* a read ahead nobody loaded */
        (void)mt_store_wait(nv->store, nv->pf.ticket, &err);
        prefetch_clear(&nv->pf);
    }
    mt_store_close(nv->store);
    pthread_mutex_destroy(&nv->lock);
    free(nv->extent);
    free(nv->master);
    free(nv->home);
    free(nv->pending);
    free(nv->lost);
    free(nv);
}

bool eng_optim_nvme_holds(const eng_optim_nvme_t *nv, int i) { return nv && i < nv->num_params && nv->extent[i] >= 0; }

bool eng_optim_nvme_holds_master(const eng_optim_nvme_t *nv, int i) {
    return eng_optim_nvme_holds(nv, i) && nv->master[i];
}

bool eng_optim_nvme_holds_home(const eng_optim_nvme_t *nv, int i) { return nv && i < nv->num_params && nv->home[i] >= 0; }

bool eng_optim_nvme_holds_base_home(const eng_optim_nvme_t *nv, int i) {
    return eng_optim_nvme_holds_home(nv, i) && is_base_home(nv, i);
}

/* The loaded buffer of parameter i (NULL: not loaded): its master leads it where the store holds one. */
static void *loaded_buffer(const eng_optim_nvme_t *nv, const eng_param_t *p, int i) {
    if (!p->host_mom) return NULL;
    return nv->master[i] ? (void *)p->host_w : p->host_mom;
}

void eng_optim_nvme_prefetch(eng_optim_nvme_t *nv, const eng_model_t *m, const int *idx, int n) {
    pthread_mutex_lock(&nv->lock);
    eng_nvme_prefetch_t *pf = &nv->pf;
    /* after their writes in flight; a lost one is left to the load to report */
    if (pf->n > 0 || n <= 0 || wait_writes_of(nv, m, idx, n, NULL) != MT_OK) {
        pthread_mutex_unlock(&nv->lock);
        return;
    }
    pf->idx = malloc((size_t)n * sizeof *pf->idx);
    pf->buf = calloc((size_t)n, sizeof *pf->buf);
    pf->home = calloc((size_t)n, sizeof *pf->home);
    mt_store_op_t *ops = malloc((size_t)n * 2 * sizeof *ops);
    MT_CHECK(pf->idx && pf->buf && pf->home && ops, "out of memory for a read ahead of AdamW state");
    int nops = 0;
    for (int k = 0; k < n; k++) {
        const int i = idx[k];
        const eng_param_t *p = &m->params[i];
        pf->idx[k] = i;
        pf->buf[k] = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p, nv->master[i]))); /* zeroed */
        MT_CHECK_ALLOC(pf->buf[k], "AdamW state buffer");
        if (p->step > 0 || nv->master[i]) ops[nops++] = (mt_store_op_t){nv->extent[i], pf->buf[k]};
        if (nv->home[i] >= 0) {
            pf->home[k] = mt_sio_buffer_alloc(mt_store_buffer_bytes(home_bytes(p)));
            MT_CHECK_ALLOC(pf->home[k], "bf16 working copy buffer");
            ops[nops++] = (mt_store_op_t){nv->home[i], pf->home[k]};
        }
    }
    pf->n = n;
    mt_error_t err = {0};
    /* refused (the store's in-flight limit): nothing read ahead, the load reads as before */
    if (nops == 0 || mt_store_submit_read(nv->store, ops, nops, &pf->ticket, &err) != MT_OK) prefetch_clear(pf);
    else
        for (int k = 0; k < nops; k++) nv->io.read_bytes += mt_store_extent_bytes(nv->store, ops[k].extent);
    free(ops);
    pthread_mutex_unlock(&nv->lock);
}

/* Under nv->lock: the read ahead waited for; true when it was for exactly
 * idx[0..n) and succeeded, its buffers then taken into the parameters. */
static bool prefetch_take(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, mt_error_t *err) {
    eng_nvme_prefetch_t *pf = &nv->pf;
    if (pf->n == 0) return false;
    const double t0 = mt_now_s();
    const mt_status_t st = mt_store_wait(nv->store, pf->ticket, err);
    nv->io.read_s += mt_now_s() - t0;
    bool same = st == MT_OK && pf->n == n;
    for (int k = 0; same && k < n; k++) same = pf->idx[k] == idx[k];
    if (!same) {
        prefetch_clear(pf); /* a failure is read again by the load, and reported there */
        return false;
    }
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        MT_CHECK(!p->host_mom, "AdamW state of %s loaded twice", p->spec->name);
        if (nv->master[idx[k]]) p->host_w = (float *)pf->buf[k];
        p->host_mom = pf->buf[k] + (nv->master[idx[k]] ? master_bytes(p) : 0);
        if (pf->home[k]) p->work_bf16 = (uint16_t *)pf->home[k];
        pf->buf[k] = pf->home[k] = NULL; /* the parameters own them now */
    }
    prefetch_clear(pf);
    return true;
}

mt_status_t eng_optim_nvme_load_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, mt_error_t *err) {
    pthread_mutex_lock(&nv->lock);
    const mt_status_t wst = wait_writes_of(nv, m, idx, n, err);
    const bool taken = wst == MT_OK && prefetch_take(nv, m, idx, n, err);
    nv->io.loads++;
    nv->io.loads_read_ahead += taken;
    pthread_mutex_unlock(&nv->lock);
    if (wst != MT_OK) return wst;
    if (taken) return MT_OK;
    mt_store_op_t *ops = malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof *ops);
    MT_CHECK_ALLOC(ops, "AdamW state reads");
    int nops = 0;
    for (int k = 0; k < n; k++) {
        const int i = idx[k];
        eng_param_t *p = &m->params[i];
        MT_CHECK(nv->extent[i] >= 0 && !p->host_mom, "AdamW state of %s loaded twice or not in the store",
                 p->spec->name);
        const bool master = nv->master[i];
        char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p, master)));
        MT_CHECK_ALLOC(buf, "AdamW state buffer"); /* zeroed: the state before a first step, any format */
        if (master) p->host_w = (float *)buf;
        p->host_mom = buf + (master ? master_bytes(p) : 0);
        if (p->step > 0 || master) ops[nops++] = (mt_store_op_t){nv->extent[i], buf};
        if (nv->home[i] >= 0) { /* the working copy the update rewrites, with it */
            p->work_bf16 = mt_sio_buffer_alloc(mt_store_buffer_bytes(home_bytes(p)));
            MT_CHECK_ALLOC(p->work_bf16, "bf16 working copy buffer");
            ops[nops++] = (mt_store_op_t){nv->home[i], p->work_bf16};
        }
    }
    pthread_mutex_lock(&nv->lock);
    const double t0 = mt_now_s();
    mt_status_t st = nops ? mt_store_read(nv->store, ops, nops, err) : MT_OK;
    nv->io.read_s += mt_now_s() - t0;
    for (int k = 0; st == MT_OK && k < nops; k++) nv->io.read_bytes += mt_store_extent_bytes(nv->store, ops[k].extent);
    pthread_mutex_unlock(&nv->lock);
    free(ops);
    if (st != MT_OK) {
        for (int k = 0; k < n; k++) eng_optim_nvme_unload_many(nv, m, &idx[k], 1, false, NULL);
        return mt_error_prefix(err, "AdamW state: ");
    }
    return MT_OK;
}

/* Frees the loaded state of idx[0..n) without writing it (those not loaded are skipped). */
static void release(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n) {
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        if (!p->host_mom) continue; /* not loaded */
        mt_sio_buffer_free(loaded_buffer(nv, p, idx[k]));
        if (nv->master[idx[k]]) p->host_w = NULL;
        if (nv->home[idx[k]] >= 0) {
            mt_sio_buffer_free(p->work_bf16);
            p->work_bf16 = NULL;
        }
        p->host_mom = NULL;
    }
}

/* Under nv->lock: w (a free slot, holding the loaded parameters and their
 * buffers, already taken from them) submitted as one batch of nops ops.
 * Refused, its parameters are lost and its buffers freed. */
static mt_status_t write_submit(eng_optim_nvme_t *nv, eng_nvme_write_t *w, const mt_store_op_t *ops, int nops,
                                mt_error_t *err) {
    for (int k = 0; k < nops; k++) w->bytes += mt_store_extent_bytes(nv->store, ops[k].extent);
    mt_error_t e = {0};
    const double t0 = mt_now_s();
    const mt_status_t st = mt_store_submit_write(nv->store, ops, nops, &w->ticket, &e);
    nv->io.write_s += mt_now_s() - t0;
    if (st == MT_OK) {
        for (int k = 0; k < w->n; k++) nv->pending[w->idx[k]] = w->ticket;
        return MT_OK;
    }
    mt_error_prefix(&e, "AdamW state: ");
    keep_failure(nv, st, &e);
    if (err) *err = e;
    for (int k = 0; k < w->n; k++) nv->lost[w->idx[k]] = true;
    for (int k = 0; k < w->nbuf; k++) mt_sio_buffer_free(w->buf[k]);
    free(w->idx);
    free(w->buf);
    memset(w, 0, sizeof *w);
    return st;
}

mt_status_t eng_optim_nvme_unload_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, bool write,
                                       mt_error_t *err) {
    if (!write) {
        release(nv, m, idx, n);
        return MT_OK;
    }
    const size_t cap = (size_t)(n > 0 ? n : 1);
    eng_nvme_write_t w = {.idx = malloc(cap * sizeof *w.idx), .buf = malloc(cap * 2 * sizeof *w.buf)};
    mt_store_op_t *ops = malloc(cap * 2 * sizeof *ops);
    MT_CHECK(w.idx && w.buf && ops, "out of memory for AdamW state writes");
    int nops = 0;
    for (int k = 0; k < n; k++) { /* the loaded ones' buffers go to the write */
        const int i = idx[k];
        eng_param_t *p = &m->params[i];
        void *buf = loaded_buffer(nv, p, i);
        if (!buf) continue;
        w.idx[w.n++] = i;
        ops[nops++] = (mt_store_op_t){nv->extent[i], buf};
        w.buf[w.nbuf++] = buf;
        if (nv->home[i] >= 0) {
            ops[nops++] = (mt_store_op_t){nv->home[i], p->work_bf16};
            w.buf[w.nbuf++] = p->work_bf16;
            p->work_bf16 = NULL;
        }
        if (nv->master[i]) p->host_w = NULL;
        p->host_mom = NULL;
    }
    mt_status_t st = MT_OK;
    if (nops == 0) {
        free(w.idx);
        free(w.buf);
    } else {
        pthread_mutex_lock(&nv->lock);
        drop_prefetch_of(nv, w.idx, w.n);
        eng_nvme_write_t *slot = write_room(nv, &st, err);
        *slot = w;
        const mt_status_t sst = write_submit(nv, slot, ops, nops, st == MT_OK ? err : NULL);
        if (st == MT_OK) st = sst;
        pthread_mutex_unlock(&nv->lock);
    }
    free(ops);
    return st;
}

size_t eng_optim_nvme_home_bytes(const eng_model_t *m, int i) { return home_bytes(&m->params[i]); }

size_t eng_optim_nvme_home_buffer_bytes(const eng_model_t *m, int i) {
    return mt_store_buffer_bytes(home_bytes(&m->params[i]));
}

void *eng_optim_nvme_buffer_alloc(size_t bytes) { return mt_sio_buffer_alloc(bytes); }

void eng_optim_nvme_buffer_free(void *buf) { mt_sio_buffer_free(buf); }

mt_status_t eng_optim_nvme_read_homes(eng_optim_nvme_t *nv, const eng_model_t *m, const int *idx, int n, char *buf,
                                      mt_error_t *err) {
    mt_store_op_t *ops = malloc((size_t)(n > 0 ? n : 1) * sizeof *ops);
    MT_CHECK_ALLOC(ops, "working copy reads");
    size_t off = 0;
    for (int k = 0; k < n; k++) {
        MT_CHECK(nv->home[idx[k]] >= 0, "the home of %s is not on the NVMe tier", m->params[idx[k]].spec->name);
        ops[k] = (mt_store_op_t){nv->home[idx[k]], buf + off};
        off += eng_optim_nvme_home_buffer_bytes(m, idx[k]);
    }
    pthread_mutex_lock(&nv->lock);
    mt_status_t st = wait_writes_of(nv, m, idx, n, err);
    if (st != MT_OK) {
        pthread_mutex_unlock(&nv->lock);
        free(ops);
        return st;
    }
    const double t0 = mt_now_s();
    st = n ? mt_store_read(nv->store, ops, n, err) : MT_OK;
    nv->io.read_s += mt_now_s() - t0;
    for (int k = 0; st == MT_OK && k < n; k++) nv->io.read_bytes += mt_store_extent_bytes(nv->store, ops[k].extent);
    pthread_mutex_unlock(&nv->lock);
    free(ops);
    return st == MT_OK ? MT_OK : mt_error_prefix(err, "streamed weights: ");
}

mt_status_t eng_optim_nvme_load(eng_optim_nvme_t *nv, eng_model_t *m, int i, mt_error_t *err) {
    return eng_optim_nvme_load_many(nv, m, &i, 1, err);
}

mt_status_t eng_optim_nvme_unload(eng_optim_nvme_t *nv, eng_model_t *m, int i, bool write, mt_error_t *err) {
    return eng_optim_nvme_unload_many(nv, m, &i, 1, write, err);
}

eng_nvme_io_t eng_optim_nvme_io(eng_optim_nvme_t *nv) {
    eng_nvme_io_t io = {0};
    if (!nv) return io;
    pthread_mutex_lock(&nv->lock);
    io = nv->io;
    pthread_mutex_unlock(&nv->lock);
    return io;
}

mt_status_t eng_optim_nvme_note(eng_optim_nvme_t *nv, mt_status_t st, const mt_error_t *err) {
    if (st == MT_OK) return st;
    pthread_mutex_lock(&nv->lock);
    keep_failure(nv, st, err);
    pthread_mutex_unlock(&nv->lock);
    return st;
}

mt_status_t eng_optim_nvme_error(eng_optim_nvme_t *nv, mt_error_t *err) {
    if (!nv) return MT_OK;
    pthread_mutex_lock(&nv->lock);
    const mt_status_t st = nv->failed;
    if (st != MT_OK) *err = nv->err;
    pthread_mutex_unlock(&nv->lock);
    return st;
}
