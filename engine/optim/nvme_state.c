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

uint64_t eng_optim_nvme_planned_bytes(const eng_model_t *m, const bool *in_store, const bool *with_master) {
    uint64_t total = 0;
    for (int i = 0; i < m->num_params; i++)
        if (in_store[i]) total += mt_store_span_bytes(extent_bytes(&m->params[i], with_master && with_master[i]));
    return total;
}

/* Parameter i's master written to its new extent (zero moments after it),
 * then its host copy freed. */
static mt_status_t move_master(eng_optim_nvme_t *nv, eng_param_t *p, int i, mt_error_t *err) {
    MT_CHECK(p->host_w && p->work_bf16 && !p->host_mom && p->step == 0,
             "the master of %s moved to the NVMe tier without a bf16 working copy, or after a step", p->spec->name);
    char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p, true))); /* zeroed */
    MT_CHECK_ALLOC(buf, "fp32 master buffer");
    memcpy(buf, p->host_w, p->spec->numel * sizeof(float));
    const mt_store_op_t op = {nv->extent[i], buf};
    const mt_status_t st = mt_store_write(nv->store, &op, 1, err);
    mt_sio_buffer_free(buf);
    if (st != MT_OK) return mt_error_prefix(err, "fp32 master: ");
    free(p->host_w);
    p->host_w = NULL;
    return MT_OK;
}

mt_status_t eng_optim_nvme_open(eng_optim_nvme_t **out, eng_model_t *m, const bool *in_store, const bool *with_master,
                                const char *dir, uint64_t budget, mt_error_t *err) {
    *out = NULL;
    eng_optim_nvme_t *nv = calloc(1, sizeof *nv);
    MT_CHECK_ALLOC(nv, "NVMe optimizer state");
    const size_t np = (size_t)(m->num_params > 0 ? m->num_params : 1);
    nv->num_params = m->num_params;
    nv->extent = malloc(np * sizeof *nv->extent);
    nv->master = calloc(np, sizeof *nv->master);
    MT_CHECK(nv->extent && nv->master, "out of memory for the NVMe extent table");
    pthread_mutex_init(&nv->lock, NULL);
    for (int i = 0; i < m->num_params; i++) {
        nv->extent[i] = -1;
        nv->master[i] = in_store[i] && with_master && with_master[i];
    }
    const mt_store_opts_t so = {.dir = dir, .budget = budget,
                                .planned_bytes = eng_optim_nvme_planned_bytes(m, in_store, with_master)};
    mt_status_t st = mt_store_open(&nv->store, &so, err);
    int file = -1;
    if (st == MT_OK) st = mt_store_file_add(nv->store, "adamw.bin", &file, err);
    for (int i = 0; i < m->num_params && st == MT_OK; i++)
        if (in_store[i])
            st = mt_store_reserve(nv->store, file, extent_bytes(&m->params[i], nv->master[i]), &nv->extent[i], err);
    /* every extent reserved (the space is there) before the first master leaves host memory */
    for (int i = 0; i < m->num_params && st == MT_OK; i++)
        if (nv->master[i]) st = move_master(nv, &m->params[i], i, err);
    if (st != MT_OK) {
        /* masters already moved come back: the run stops with host memory as it was */
        for (int i = 0; i < m->num_params; i++)
            if (nv->master[i] && !m->params[i].host_w) {
                mt_error_t e2 = {0};
                MT_CHECK(eng_optim_nvme_load(nv, m, i, &e2) == MT_OK, "%s", e2.msg);
                float *w = malloc(m->params[i].spec->numel * sizeof *w);
                MT_CHECK_ALLOC(w, m->params[i].spec->name);
                memcpy(w, m->params[i].host_w, m->params[i].spec->numel * sizeof *w);
                eng_optim_nvme_unload(nv, m, i, false, NULL);
                m->params[i].host_w = w;
            }
        eng_optim_nvme_free(nv);
        return st;
    }
    *out = nv;
    return MT_OK;
}

void eng_optim_nvme_free(eng_optim_nvme_t *nv) {
    if (!nv) return;
    mt_store_close(nv->store);
    pthread_mutex_destroy(&nv->lock);
    free(nv->extent);
    free(nv->master);
    free(nv);
}

bool eng_optim_nvme_holds(const eng_optim_nvme_t *nv, int i) { return nv && i < nv->num_params && nv->extent[i] >= 0; }

bool eng_optim_nvme_holds_master(const eng_optim_nvme_t *nv, int i) {
    return eng_optim_nvme_holds(nv, i) && nv->master[i];
}

/* The loaded buffer of parameter i (NULL: not loaded): its master leads it where the store holds one. */
static void *loaded_buffer(const eng_optim_nvme_t *nv, const eng_param_t *p, int i) {
    if (!p->host_mom) return NULL;
    return nv->master[i] ? (void *)p->host_w : p->host_mom;
}

mt_status_t eng_optim_nvme_load_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, mt_error_t *err) {
    mt_store_op_t *ops = malloc((size_t)(n > 0 ? n : 1) * sizeof *ops);
    MT_CHECK_ALLOC(ops, "AdamW state reads");
    int nops = 0;
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        MT_CHECK(nv->extent[idx[k]] >= 0 && !p->host_mom, "AdamW state of %s loaded twice or not in the store",
                 p->spec->name);
        const bool master = nv->master[idx[k]];
        char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p, master)));
        MT_CHECK_ALLOC(buf, "AdamW state buffer"); /* zeroed: the state before a first step, any format */
        if (master) p->host_w = (float *)buf;
        p->host_mom = buf + (master ? master_bytes(p) : 0);
        if (p->step > 0 || master) ops[nops++] = (mt_store_op_t){nv->extent[idx[k]], buf};
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

mt_status_t eng_optim_nvme_unload_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, bool write,
                                       mt_error_t *err) {
    mt_store_op_t *ops = malloc((size_t)(n > 0 ? n : 1) * sizeof *ops);
    MT_CHECK_ALLOC(ops, "AdamW state writes");
    int nops = 0;
    for (int k = 0; k < n; k++) {
        void *buf = loaded_buffer(nv, &m->params[idx[k]], idx[k]);
        if (buf) ops[nops++] = (mt_store_op_t){nv->extent[idx[k]], buf};
    }
    mt_status_t st = MT_OK;
    if (write && nops) {
        pthread_mutex_lock(&nv->lock);
        const double t0 = mt_now_s();
        st = mt_store_write(nv->store, ops, nops, err);
        nv->io.write_s += mt_now_s() - t0;
        for (int k = 0; st == MT_OK && k < nops; k++)
            nv->io.write_bytes += mt_store_extent_bytes(nv->store, ops[k].extent);
        pthread_mutex_unlock(&nv->lock);
        if (st != MT_OK) mt_error_prefix(err, "AdamW state: ");
    }
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        mt_sio_buffer_free(loaded_buffer(nv, p, idx[k]));
        if (nv->master[idx[k]]) p->host_w = NULL;
        p->host_mom = NULL;
    }
    free(ops);
    return st;
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
    if (nv->failed == MT_OK) {
        nv->failed = st;
        nv->err = *err;
    }
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
