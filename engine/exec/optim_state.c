/* Reading and writing the optimizer state wherever the plan keeps it (see
 * optim_state.h).  Writes to the device go through the staging pool like
 * every other host-to-device transfer, and are waited for before returning
 * because the caller's buffers are freed right after.  The moments are
 * checked finite before a checkpoint holds them (eng_exec_check_optim_state). */
#include "engine/exec/optim_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/finite.h"
#include "engine/exec/place/copies.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/xfer.h"

int64_t eng_model_optim_step_count(const eng_model_t *m, int i) { return m->params[i].step; }

/* Parameter i's moments from the NVMe tier into mom1, mom2 (either NULL). */
static mt_status_t read_nvme_moments(eng_exec_t *x, int i, float *mom1, float *mom2, mt_error_t *err) {
    eng_param_t *p = &x->model->params[i];
    const size_t bytes = exec_f32_bytes(p);
    mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, x->model, i, err);
    if (st != MT_OK) return st;
    if (mom1) memcpy(mom1, p->host_m, bytes);
    if (mom2) memcpy(mom2, p->host_v, bytes);
    return eng_optim_nvme_unload(x->hopt.nvme, x->model, i, false, err);
}

/* eng_exec_read_optim_state, an NVMe tier's failure returned. */
static mt_status_t read_optim_state(eng_exec_t *x, int i, float *master, float *mom1, float *mom2, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (master) eng_exec_read_param(x, i, master, false); /* drains first */
    else eng_exec_drain(x);
    if (eng_optim_nvme_holds(x->hopt.nvme, i) && (mom1 || mom2)) return read_nvme_moments(x, i, mom1, mom2, err);
    const eng_param_t *p = &m->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t bytes = exec_f32_bytes(p);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    const float *host[2] = {p->host_m, p->host_v};
    const float *dev[2] = {d->m, d->v};
    float *dst[2] = {mom1, mom2};
    for (int k = 0; k < 2; k++) {
        if (!dst[k]) continue;
        if (host[k]) memcpy(dst[k], host[k], bytes);
        else if (dev[k]) kern_memcpy_d2h(x->dev, s, dst[k], dev[k], bytes);
        else memset(dst[k], 0, bytes);
    }
    kern_stream_sync(x->dev, s);
    return MT_OK;
}

void eng_exec_read_optim_state(eng_exec_t *x, int i, float *master, float *mom1, float *mom2) {
    mt_error_t err = {0};
    /* a save checks the state first (eng_exec_check_optim_state), which
     * reports a failing NVMe tier as an error; here it is a broken invariant */
    MT_CHECK(read_optim_state(x, i, master, mom1, mom2, &err) == MT_OK, "%s", err.msg);
}

/* Parameter i's moments written to the NVMe tier (step > 0). */
static mt_status_t write_nvme_moments(eng_exec_t *x, int i, const float *mom1, const float *mom2, mt_error_t *err) {
    eng_param_t *p = &x->model->params[i];
    const size_t bytes = exec_f32_bytes(p);
    p->step = 0; /* loads zeros instead of reading an extent perhaps never written */
    mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, x->model, i, err);
    if (st != MT_OK) return st;
    memcpy(p->host_m, mom1, bytes);
    memcpy(p->host_v, mom2, bytes);
    return eng_optim_nvme_unload(x->hopt.nvme, x->model, i, true, err);
}

/* AdamW state of a parameter whose block keeps the optimizer on the
 * device, allocated as eng_optim_step does on a first step. */
static mt_status_t ensure_device_moments(eng_exec_t *x, int i, mt_error_t *err) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    if (d->m) return MT_OK;
    char t[200];
    snprintf(t, sizeof t, "AdamW m of %s", p->spec->name);
    d->m = kern_alloc_lasting(x->dev, exec_f32_bytes(p), t, err);
    if (!d->m) return err->code;
    snprintf(t, sizeof t, "AdamW v of %s", p->spec->name);
    d->v = kern_alloc_lasting(x->dev, exec_f32_bytes(p), t, err);
    return d->v ? MT_OK : err->code;
}

mt_status_t eng_exec_write_optim_state(eng_exec_t *x, int i, const float *master, const float *mom1,
                                        const float *mom2, int64_t step, mt_error_t *err) {
    eng_model_t *m = x->model;
    eng_exec_drain(x);
    eng_param_t *p = &m->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t bytes = exec_f32_bytes(p);
    const bool device_optim = exec_block_plan(&x->env, p->block)->optim == SCHED_OPTIM_DEVICE;
    moe_staging_xfer_t items[4];
    int n = 0;
    if (master) {
        if (p->host_w) {
            memcpy(p->host_w, master, bytes);
            /* a resident (or currently held) working copy is made from the master again */
            if (d->w) items[n++] = (moe_staging_xfer_t){p->host_w, d->w, exec_w_bytes(p), exec_w_upload_op(p)};
        } else {
            float *dm = exec_dev_master(p, d);
            if (dm) items[n++] = (moe_staging_xfer_t){(void *)master, dm, bytes, MOE_STAGING_COPY};
            /* a bf16 working copy beside a device master: what AdamW's bf16 output would write */
            if (d->w && (void *)dm != d->w)
                items[n++] = (moe_staging_xfer_t){(void *)master, d->w, exec_w_bytes(p), exec_w_upload_op(p)};
        }
    }
    const bool has_moments = step > 0 && mom1 && mom2;
    if (has_moments) {
        if (device_optim) {
            mt_status_t st = ensure_device_moments(x, i, err);
            if (st != MT_OK) return st;
            items[n++] = (moe_staging_xfer_t){(void *)mom1, d->m, bytes, MOE_STAGING_COPY};
            items[n++] = (moe_staging_xfer_t){(void *)mom2, d->v, bytes, MOE_STAGING_COPY};
        } else if (eng_optim_nvme_holds(x->hopt.nvme, i)) {
            mt_status_t st = write_nvme_moments(x, i, mom1, mom2, err);
            if (st != MT_OK) return st;
        } else {
            if (!p->host_m) {
                p->host_m = malloc(bytes);
                p->host_v = malloc(bytes);
                MT_CHECK(p->host_m && p->host_v, "out of host memory for AdamW state of %s", p->spec->name);
            }
            memcpy(p->host_m, mom1, bytes);
            memcpy(p->host_v, mom2, bytes);
        }
    }
    p->step = has_moments ? step : 0;
    if (n > 0) {
        char tag[200];
        snprintf(tag, sizeof tag, "optimizer state of %s", p->spec->name);
        mt_status_t st = exec_stage_h2d(x, items, n, tag, err);
        kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_H2D));
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

/* One moment of parameter p (k 0: exp_avg, 1: exp_avg_sq) as a checkpoint needs it. */
static mt_status_t check_moment(const eng_param_spec_t *ps, int k, const float *v, mt_error_t *err) {
    static const char *const sfx[2] = {"exp_avg", "exp_avg_sq"};
    size_t at = mt_first_nonfinite_f32(v, ps->numel);
    const bool nonfinite = at != MT_ALL_FINITE;
    for (size_t j = 0; !nonfinite && k == 1 && j < ps->numel && at == MT_ALL_FINITE; j++)
        if (v[j] < 0) at = j;
    if (at == MT_ALL_FINITE) return MT_OK;
    char where[160];
    mt_index_to_str(where, sizeof where, at, ps->ndim, ps->shape);
    return mt_error_set(err, MT_ERR_DATA, "optimizer state '%s.%s' holds %s at %s; expected %s", ps->name, sfx[k],
                        nonfinite ? mt_nonfinite_name(v[at]) : "a negative value", where,
                        k == 1 ? "finite values >= 0" : "finite values");
}

mt_status_t eng_exec_check_optim_state(eng_exec_t *x, mt_error_t *err) {
    const eng_model_t *m = x->model;
    size_t max_numel = 1;
    for (int i = 0; i < m->num_params; i++)
        if (m->params[i].spec->numel > max_numel) max_numel = m->params[i].spec->numel;
    float *m1 = malloc(max_numel * sizeof *m1), *m2 = malloc(max_numel * sizeof *m2);
    MT_CHECK(m1 && m2, "out of memory checking the optimizer state");
    mt_status_t st = MT_OK;
    for (int i = 0; i < m->num_params && st == MT_OK; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->frozen || p->step == 0) continue;
        st = read_optim_state(x, i, NULL, m1, m2, err);
        if (st == MT_OK) st = check_moment(p->spec, 0, m1, err);
        if (st == MT_OK) st = check_moment(p->spec, 1, m2, err);
    }
    free(m1);
    free(m2);
    return st;
}

void eng_optim_discard_step(eng_exec_t *x) {
    eng_model_t *m = x->model;
    eng_exec_drain(x);
    exec_host_optim_wait(&x->hopt);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    /* as eng_optim_step leaves them after an update */
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        eng_dparam_t *d = &x->dp[i];
        if (d->g_acc && d->acc_has_data) kern_memset(x->dev, s, d->g_acc, 0, exec_f32_bytes(p));
        d->has_grad = false;
        d->acc_has_data = false;
        x->hopt.done[i] = false;
    }
    kern_stream_sync(x->dev, s);
    x->prog.overlap = false;
    x->micro_left = 0;
}

mt_status_t eng_exec_place_optim_nvme(eng_exec_t *x, const char *dir, uint64_t budget, eng_nvme_placed_t *out,
                                      mt_error_t *err) {
    eng_model_t *m = x->model;
    MT_CHECK(!x->hopt.nvme, "the NVMe tier placed twice");
    eng_exec_drain(x);
    bool *in_store = calloc((size_t)(m->num_params > 0 ? m->num_params : 1), sizeof *in_store);
    MT_CHECK_ALLOC(in_store, "NVMe placement");
    memset(out, 0, sizeof *out);
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        in_store[i] = !p->frozen && p->host_w && exec_block_plan(&x->env, p->block)->optim == SCHED_OPTIM_HOST;
        if (!in_store[i]) continue;
        /* placed before any step or resume: nothing in host memory to move */
        MT_CHECK(!p->host_m && p->step == 0, "AdamW state of %s exists before the NVMe tier is placed", p->spec->name);
        out->params++;
    }
    mt_status_t st = MT_OK;
    if (out->params == 0)
        st = mt_error_set(err, MT_ERR_UNSUPPORTED,
                          "no block of this plan runs AdamW on the host, so the NVMe tier would hold nothing "
                          "(scheduler.optimizer: host puts it there)");
    if (st == MT_OK) {
        out->bytes = eng_optim_nvme_planned_bytes(m, in_store);
        st = eng_optim_nvme_open(&x->hopt.nvme, m, in_store, dir, budget, err);
    }
    if (st == MT_OK) {
        out->io = mt_store_io_name(x->hopt.nvme->store);
        out->run_dir = mt_store_run_dir(x->hopt.nvme->store);
        out->leftovers_removed = mt_store_leftovers_removed(x->hopt.nvme->store);
    }
    free(in_store);
    return st;
}
