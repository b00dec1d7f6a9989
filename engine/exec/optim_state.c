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
#include "kernels/host/adamw_host.h"

int64_t eng_model_optim_step_count(const eng_model_t *m, int i) { return m->params[i].step; }

size_t eng_param_moments_bytes(const eng_param_t *p) {
    return kern_moments_bytes((kern_moments_fmt_t)p->mom_fmt, p->spec->numel);
}

kern_moments_t eng_param_moments_view(const eng_param_t *p, void *base) {
    return kern_moments_view((kern_moments_fmt_t)p->mom_fmt, base, p->spec->numel, p->mom_seed);
}

/* FNV-1a of a parameter's name: its identity in every plan, device and resume. */
static uint64_t name_hash(const char *s) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s; s++) h = (h ^ (unsigned char)*s) * 0x100000001b3ull;
    return h;
}

void eng_optim_set_moments(eng_model_t *m, kern_moments_fmt_t fmt, uint64_t seed) {
    for (int i = 0; i < m->num_params; i++) {
        eng_param_t *p = &m->params[i];
        MT_CHECK(!p->host_mom && p->step == 0, "the moment format of %s set after its AdamW state exists",
                 p->spec->name);
        /* bitsandbytes keeps tensors under 4096 elements (norms, biases) in
         * fp32: their state is small and 8 bits would cost them the most */
        kern_moments_fmt_t f = fmt;
        if (fmt == KERN_MOMENTS_8BIT && p->spec->numel < ENG_MOMENTS_8BIT_MIN_NUMEL) f = KERN_MOMENTS_F32;
        p->mom_fmt = (int)f;
        p->mom_seed = name_hash(p->spec->name) ^ (seed * 0x9e3779b97f4a7c15ull);
    }
}

/* Parameter i's moments from the NVMe tier into mom. */
static mt_status_t read_nvme_moments(eng_exec_t *x, int i, void *mom, mt_error_t *err) {
    eng_param_t *p = &x->model->params[i];
    mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, x->model, i, err);
    if (st != MT_OK) return st;
    memcpy(mom, p->host_mom, eng_param_moments_bytes(p));
    return eng_optim_nvme_unload(x->hopt.nvme, x->model, i, false, err);
}

/* eng_exec_read_optim_state, an NVMe tier's failure returned. */
static mt_status_t read_optim_state(eng_exec_t *x, int i, float *master, void *mom, mt_error_t *err) {
    eng_model_t *m = x->model;
    if (master) eng_exec_read_param(x, i, master, false); /* drains first */
    else eng_exec_drain(x);
    if (!mom) return MT_OK;
    if (eng_optim_nvme_holds(x->hopt.nvme, i)) return read_nvme_moments(x, i, mom, err);
    const eng_param_t *p = &m->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t bytes = eng_param_moments_bytes(p);
    kern_stream_t *s = kern_stream(x->dev, KERN_STREAM_COMPUTE);
    if (p->host_mom) memcpy(mom, p->host_mom, bytes);
    else if (d->mom) kern_memcpy_d2h(x->dev, s, mom, d->mom, bytes);
    else memset(mom, 0, bytes);
    kern_stream_sync(x->dev, s);
    return MT_OK;
}

void eng_exec_read_optim_state(eng_exec_t *x, int i, float *master, void *mom) {
    mt_error_t err = {0};
    /* a save checks the state first (eng_exec_check_optim_state), which
     * reports a failing NVMe tier as an error; here it is a broken invariant */
    MT_CHECK(read_optim_state(x, i, master, mom, &err) == MT_OK, "%s", err.msg);
}

/* Parameter i's moments written to the NVMe tier (step > 0). */
static mt_status_t write_nvme_moments(eng_exec_t *x, int i, const void *mom, mt_error_t *err) {
    eng_param_t *p = &x->model->params[i];
    p->step = 0; /* loads zeros instead of reading an extent perhaps never written */
    mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, x->model, i, err);
    if (st != MT_OK) return st;
    memcpy(p->host_mom, mom, eng_param_moments_bytes(p));
    return eng_optim_nvme_unload(x->hopt.nvme, x->model, i, true, err);
}

/* One moment's element bytes (m or v, without the alignment padding). */
static size_t mom_part_bytes(const eng_param_t *p) {
    static const size_t esz[3] = {4, 2, 1};
    return p->spec->numel * esz[p->mom_fmt];
}

/* AdamW state of a parameter whose block keeps the optimizer on the
 * device, allocated as eng_optim_step does on a first step. */
static mt_status_t ensure_device_moments(eng_exec_t *x, int i, mt_error_t *err) {
    const eng_param_t *p = &x->model->params[i];
    eng_dparam_t *d = &x->dp[i];
    if (d->mom) return MT_OK;
    char t[200];
    snprintf(t, sizeof t, "AdamW moments (%s) of %s", kern_moments_fmt_name((kern_moments_fmt_t)p->mom_fmt),
             p->spec->name);
    d->mom = kern_alloc_lasting(x->dev, eng_param_moments_bytes(p), t, err);
    return d->mom ? MT_OK : err->code;
}

/* eng_exec_write_optim_state for a parameter whose master the NVMe tier
 * holds: master and moments written into its extent together, the host's
 * bf16 working copy (and a resident device copy) made from the master. */
static mt_status_t write_nvme_state(eng_exec_t *x, int i, const float *master, const void *mom, int64_t step,
                                    mt_error_t *err) {
    eng_param_t *p = &x->model->params[i];
    mt_status_t st = eng_optim_nvme_load(x->hopt.nvme, x->model, i, err);
    if (st != MT_OK) return st;
    const bool has_moments = step > 0 && mom;
    if (master) {
        memcpy(p->host_w, master, exec_f32_bytes(p));
        kern_threadpool_to_bf16(x->hopt.pool, p->work_bf16, p->host_w, p->spec->numel);
    }
    if (has_moments) memcpy(p->host_mom, mom, eng_param_moments_bytes(p));
    else memset(p->host_mom, 0, eng_param_moments_bytes(p));
    p->step = has_moments ? step : 0;
    st = eng_optim_nvme_unload(x->hopt.nvme, x->model, i, true, err);
    /* a resident working copy (a home on NVMe is always a streamed block's: nothing resident to refresh) */
    if (st != MT_OK || !master || !x->dp[i].w || eng_optim_nvme_holds_home(x->hopt.nvme, i)) return st;
    moe_staging_xfer_t item = exec_w_refresh_item(p, x->dp[i].w);
    char tag[200];
    snprintf(tag, sizeof tag, "working copy of %s", p->spec->name);
    st = exec_stage_h2d(x, &item, 1, tag, err);
    kern_stream_sync(x->dev, kern_stream(x->dev, KERN_STREAM_H2D));
    return st;
}

mt_status_t eng_exec_write_optim_state(eng_exec_t *x, int i, const float *master, const void *mom, int64_t step,
                                        mt_error_t *err) {
    eng_model_t *m = x->model;
    eng_exec_drain(x);
    if (eng_optim_nvme_holds_master(x->hopt.nvme, i)) return write_nvme_state(x, i, master, mom, step, err);
    eng_param_t *p = &m->params[i];
    eng_dparam_t *d = &x->dp[i];
    const size_t bytes = exec_f32_bytes(p);
    const bool device_optim = exec_block_plan(&x->env, p->block)->optim == SCHED_OPTIM_DEVICE;
    moe_staging_xfer_t items[8];
    int n = 0;
    if (master) {
        if (p->host_w) {
            memcpy(p->host_w, master, bytes);
            if (p->work_bf16) kern_threadpool_to_bf16(x->hopt.pool, p->work_bf16, p->host_w, p->spec->numel);
            /* a resident (or currently held) working copy is made from the master again */
            if (d->w) items[n++] = exec_w_refresh_item(p, d->w);
        } else {
            float *dm = exec_dev_master(p, d);
            if (dm) items[n++] = (moe_staging_xfer_t){(void *)master, dm, bytes, MOE_STAGING_COPY};
            /* a bf16 working copy beside a device master: what AdamW's bf16 output would write */
            if (d->w && (void *)dm != d->w)
                items[n++] = (moe_staging_xfer_t){(void *)master, d->w, exec_w_bytes(p), exec_w_from_master_op(p)};
        }
    }
    const bool has_moments = step > 0 && mom;
    const size_t mbytes = eng_param_moments_bytes(p);
    if (has_moments) {
        if (device_optim) {
            mt_status_t st = ensure_device_moments(x, i, err);
            if (st != MT_OK) return st;
            /* part by part (m, v, and 8-bit's scales), each at most the
             * tensor's fp32 bytes: staging's slabs are sized by the largest
             * tensor, the whole block is up to twice that */
            const kern_moments_t s = eng_param_moments_view(p, (void *)mom), t = eng_param_moments_view(p, d->mom);
            const size_t part = mom_part_bytes(p);
            if (part > 0) {
                items[n++] = (moe_staging_xfer_t){s.m, t.m, part, MOE_STAGING_COPY};
                items[n++] = (moe_staging_xfer_t){s.v, t.v, part, MOE_STAGING_COPY};
            }
            if (s.m_absmax && part > 0) {
                const size_t sb = kern_moments_blocks(p->spec->numel) * sizeof(float);
                items[n++] = (moe_staging_xfer_t){s.m_absmax, t.m_absmax, sb, MOE_STAGING_COPY};
                items[n++] = (moe_staging_xfer_t){s.v_absmax, t.v_absmax, sb, MOE_STAGING_COPY};
            }
        } else if (eng_optim_nvme_holds(x->hopt.nvme, i)) {
            mt_status_t st = write_nvme_moments(x, i, mom, err);
            if (st != MT_OK) return st;
        } else {
            if (!p->host_mom) {
                p->host_mom = malloc(mbytes);
                MT_CHECK(p->host_mom, "out of host memory for AdamW state of %s", p->spec->name);
            }
            memcpy(p->host_mom, mom, mbytes);
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

/* One moment of parameter p (k 0: exp_avg, 1: exp_avg_sq, as fp32) as a checkpoint needs it. */
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
    size_t max_numel = 1, max_bytes = 1;
    for (int i = 0; i < m->num_params; i++) {
        if (m->params[i].spec->numel > max_numel) max_numel = m->params[i].spec->numel;
        if (eng_param_moments_bytes(&m->params[i]) > max_bytes) max_bytes = eng_param_moments_bytes(&m->params[i]);
    }
    float *m1 = malloc(max_numel * sizeof *m1), *m2 = malloc(max_numel * sizeof *m2);
    void *raw = malloc(max_bytes);
    MT_CHECK(m1 && m2 && raw, "out of memory checking the optimizer state");
    mt_status_t st = eng_exec_nvme_drain(x, err);
    for (int i = 0; i < m->num_params && st == MT_OK; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->frozen || p->step == 0) continue;
        st = read_optim_state(x, i, NULL, raw, err);
        const kern_moments_t mv = eng_param_moments_view(p, raw);
        if (st == MT_OK) kern_moments_to_f32(&mv, p->spec->numel, m1, m2);
        if (st == MT_OK) st = check_moment(p->spec, 0, m1, err);
        if (st == MT_OK) st = check_moment(p->spec, 1, m2, err);
    }
    free(m1);
    free(m2);
    free(raw);
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
        x->hopt.summed[i] = false;
    }
    kern_stream_sync(x->dev, s);
    x->prog.overlap = false;
    x->micro_left = 0;
}

/* A block whose weights' home the plan keeps on NVMe must be one the
 * executor streams from there.  A LoRA block (a frozen base in it) is: the
 * base's homes go to the tier as the fetch copies them, and the trained
 * parameters beside them (the adapter's factors) follow their optimizer
 * state, their bf16 working copies onto the tier with it, else staying in
 * host memory (a small part of the block).  A block trained in full is
 * only when trained in bf16 with its optimizer state on NVMe too (the home
 * it streams is the host's bf16 working copy, which moves with the
 * state): otherwise nothing of its home would move, and the host budget
 * the plan fits would not hold. */
static mt_status_t check_nvme_weights(eng_exec_t *x, int b, mt_error_t *err) {
    const eng_model_t *m = x->model;
    const sched_block_plan_t *bp = exec_block_plan(&x->env, b);
    bool bf16 = false, frozen = false, state_stays = false;
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->block != b) continue;
        frozen |= p->frozen;
        state_stays |= !p->frozen && (!sched_block_nvme_optim(bp) || bp->optim != SCHED_OPTIM_HOST);
        bf16 |= p->work_bf16 != NULL;
    }
    if (frozen) return MT_OK;
    if (state_stays)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "the plan keeps block %d's streamed weights on NVMe, which training reads from there only "
                            "for blocks it trains with their optimizer state on NVMe too (this one's state is not); "
                            "give the run more host memory (memory.host)", b);
    if (!bf16)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "the plan keeps block %d's streamed weights on NVMe, which training reads from there only "
                            "for bf16 working copies (bf16: true); give the run more host memory (memory.host)", b);
    return MT_OK;
}

/* Which parameters the NVMe tier holds under x's plan: in_store the
 * moments, with_master the master too, with_home the weights' home a
 * fetch streams (a trained parameter's bf16 working copy, or a frozen
 * one's home, which has no state); out counts them. */
static mt_status_t nvme_selection(eng_exec_t *x, bool *in_store, bool *with_master, bool *with_home,
                                  eng_nvme_placed_t *out, mt_error_t *err) {
    const eng_model_t *m = x->model;
    for (int b = 0; b < x->nb; b++)
        if (sched_block_nvme_weights(exec_block_plan(&x->env, b))) {
            const mt_status_t st = check_nvme_weights(x, b, err);
            if (st != MT_OK) return st;
        }
    for (int i = 0; i < m->num_params; i++) {
        const eng_param_t *p = &m->params[i];
        const sched_block_plan_t *bp = exec_block_plan(&x->env, p->block);
        if (exec_base_home_on_nvme(&x->env, p)) {
            with_home[i] = true;
            out->base_homes++;
            out->base_unpacked += p->home_q && p->home_q->pending;
            continue;
        }
        in_store[i] = !p->frozen && p->host_w && bp->optim == SCHED_OPTIM_HOST && sched_block_nvme_optim(bp);
        if (!in_store[i]) continue;
        /* placed before any step or resume: nothing in host memory to move */
        MT_CHECK(!p->host_mom && p->step == 0, "AdamW state of %s exists before the NVMe tier is placed", p->spec->name);
        with_master[i] = p->work_bf16 != NULL; /* an fp32 run's master is its weights' home */
        with_home[i] = with_master[i] && sched_block_nvme_weights(bp);
        out->params++;
        out->masters += with_master[i];
        out->homes += with_home[i];
    }
    return MT_OK;
}

mt_status_t eng_exec_place_optim_nvme(eng_exec_t *x, const char *dir, uint64_t budget, eng_nvme_placed_t *out,
                                      mt_error_t *err) {
    eng_model_t *m = x->model;
    MT_CHECK(!x->hopt.nvme, "the NVMe tier placed twice");
    eng_exec_drain(x);
    const size_t np = (size_t)(m->num_params > 0 ? m->num_params : 1);
    bool *in_store = calloc(np, sizeof *in_store), *with_master = calloc(np, sizeof *with_master);
    bool *with_home = calloc(np, sizeof *with_home);
    MT_CHECK(in_store && with_master && with_home, "out of memory for the NVMe placement");
    memset(out, 0, sizeof *out);
    mt_status_t st = nvme_selection(x, in_store, with_master, with_home, out, err);
    if (st == MT_OK && out->params + out->base_homes > 0) {
        out->bytes = eng_optim_nvme_planned_bytes(m, in_store, with_master, with_home);
        st = eng_optim_nvme_open(&x->hopt.nvme, m, in_store, with_master, with_home, dir, budget, err);
    }
    if (st == MT_OK && x->hopt.nvme) {
        out->io = mt_store_io_name(x->hopt.nvme->store);
        out->run_dir = mt_store_run_dir(x->hopt.nvme->store);
        out->leftovers_removed = mt_store_leftovers_removed(x->hopt.nvme->store);
    }
    free(in_store);
    free(with_master);
    free(with_home);
    return st;
}

eng_nvme_io_t eng_exec_nvme_io(eng_exec_t *x) { return eng_optim_nvme_io(x->hopt.nvme); }

mt_status_t eng_exec_nvme_drain(eng_exec_t *x, mt_error_t *err) {
    if (!x->hopt.nvme) return MT_OK;
    eng_exec_drain(x); /* the worker's last unloads first */
    return eng_optim_nvme_drain(x->hopt.nvme, err);
}
