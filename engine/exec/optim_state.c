/* Reading and writing the optimizer state wherever the plan keeps it (see
 * optim_state.h).  Writes to the device go through the staging pool like
 * every other host-to-device transfer, and are waited for before returning
 * because the caller's buffers are freed right after. */
#include "engine/exec/optim_state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/exec/place/copies.h"
#include "engine/exec/exec.h"
#include "engine/exec/executor.h"
#include "engine/optim/host_optim.h"
#include "engine/exec/place/plan_query.h"
#include "engine/exec/xfer.h"

int64_t eng_model_optim_step_count(const eng_model_t *m, int i) { return m->params[i].step; }

void eng_exec_read_optim_state(eng_exec_t *x, int i, float *master, float *mom1, float *mom2) {
    eng_model_t *m = x->model;
    if (master) eng_exec_read_param(x, i, master, false); /* drains first */
    else eng_exec_drain(x);
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
