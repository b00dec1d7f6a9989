/* Host AdamW state on the NVMe tier (see nvme_state.h). */
#include "engine/optim/nvme_state.h"

#include <stdlib.h>
#include <string.h>

#include "kernels/host/adamw_host.h"

/* A parameter's extent and buffer: its moments' one allocation in the
 * run's format (kern_moments_bytes: m | v | scales, each part 64-byte
 * aligned so the AdamW kernel's vectors start on a cache line). */
static uint64_t extent_bytes(const eng_param_t *p) {
    return kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, p->spec->numel);
}

uint64_t eng_optim_nvme_planned_bytes(const eng_model_t *m, const bool *in_store) {
    uint64_t total = 0;
    for (int i = 0; i < m->num_params; i++)
        if (in_store[i]) total += mt_store_span_bytes(extent_bytes(&m->params[i]));
    return total;
}

mt_status_t eng_optim_nvme_open(eng_optim_nvme_t **out, const eng_model_t *m, const bool *in_store, const char *dir,
                                uint64_t budget, mt_error_t *err) {
    *out = NULL;
    eng_optim_nvme_t *nv = calloc(1, sizeof *nv);
    MT_CHECK_ALLOC(nv, "NVMe optimizer state");
    nv->num_params = m->num_params;
    nv->extent = malloc((size_t)(m->num_params > 0 ? m->num_params : 1) * sizeof *nv->extent);
    MT_CHECK_ALLOC(nv->extent, "NVMe extent table");
    pthread_mutex_init(&nv->lock, NULL);
    for (int i = 0; i < m->num_params; i++) nv->extent[i] = -1;
    const mt_store_opts_t so = {.dir = dir, .budget = budget, .planned_bytes = eng_optim_nvme_planned_bytes(m, in_store)};
    mt_status_t st = mt_store_open(&nv->store, &so, err);
    int file = -1;
    if (st == MT_OK) st = mt_store_file_add(nv->store, "adamw.bin", &file, err);
    for (int i = 0; i < m->num_params && st == MT_OK; i++)
        if (in_store[i]) st = mt_store_reserve(nv->store, file, extent_bytes(&m->params[i]), &nv->extent[i], err);
    if (st != MT_OK) {
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
    free(nv);
}

bool eng_optim_nvme_holds(const eng_optim_nvme_t *nv, int i) { return nv && i < nv->num_params && nv->extent[i] >= 0; }

mt_status_t eng_optim_nvme_load_many(eng_optim_nvme_t *nv, eng_model_t *m, const int *idx, int n, mt_error_t *err) {
    mt_store_op_t *ops = malloc((size_t)(n > 0 ? n : 1) * sizeof *ops);
    MT_CHECK_ALLOC(ops, "AdamW state reads");
    int nops = 0;
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        MT_CHECK(nv->extent[idx[k]] >= 0 && !p->host_mom, "AdamW state of %s loaded twice or not in the store",
                 p->spec->name);
        char *buf = mt_sio_buffer_alloc(mt_store_buffer_bytes(extent_bytes(p)));
        MT_CHECK_ALLOC(buf, "AdamW state buffer"); /* zeroed: the state before a first step, any format */
        p->host_mom = buf;
        if (p->step > 0) ops[nops++] = (mt_store_op_t){nv->extent[idx[k]], buf};
    }
    pthread_mutex_lock(&nv->lock);
    mt_status_t st = nops ? mt_store_read(nv->store, ops, nops, err) : MT_OK;
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
    for (int k = 0; k < n; k++)
        if (m->params[idx[k]].host_mom) ops[nops++] = (mt_store_op_t){nv->extent[idx[k]], m->params[idx[k]].host_mom};
    mt_status_t st = MT_OK;
    if (write && nops) {
        pthread_mutex_lock(&nv->lock);
        st = mt_store_write(nv->store, ops, nops, err);
        pthread_mutex_unlock(&nv->lock);
        if (st != MT_OK) mt_error_prefix(err, "AdamW state: ");
    }
    for (int k = 0; k < n; k++) {
        eng_param_t *p = &m->params[idx[k]];
        mt_sio_buffer_free(p->host_mom);
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
