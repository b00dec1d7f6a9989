/* The training loop (see train.h).
 *
 * One optimizer step = gradient_accumulation_steps micro-batches, each
 * forward+backward with its loss divided by the number of micro-batches,
 * then clipping and AdamW at the learning rate the schedule gives for this
 * step (transformers' get_scheduler, 0-based step).  The logged loss is the
 * mean of the micro-batch losses, measured in the forward pass before the
 * update, as the HF Trainer logs it. */
#include "engine/run/train.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/run/host_mem.h"
#include "engine/model/lora_model.h"
#include "engine/model/model.h"
#include "engine/parallel/devices.h"
#include "engine/exec/optim.h"
#include "engine/exec/optim_state.h"
#include "engine/parallel/ranks.h"
#include "engine/run/report.h"
#include "engine/run/signals.h"
#include "engine/exec/trace.h"
#include "engine/run/plan.h"
#include "engine/run/save.h"
#include "engine/run/state.h"
#include "base/clock.h"

mt_status_t eng_open_device(const eng_run_config_t *rc, kern_device_t **out, mt_error_t *err) {
    kern_device_opts_t o = {0};
    o.device_budget_bytes = rc->memory_device;
    if (rc->link_gbps > 0) o.link_h2d_bytes_per_s = o.link_d2h_bytes_per_s = rc->link_gbps * 1e9;
    o.link_latency_s = rc->link_latency_us * 1e-6;
    o.host_threads = rc->compute_threads;
    o.device_index = rc->devices.ids[0];
    o.pin_threads = rc->compute_threads > 0;
    char why[512];
    switch (rc->backend) {
    case ENG_BACKEND_CPU: return kern_device_create(KERN_BACKEND_CPU, &o, out, err);
    case ENG_BACKEND_CUDA:
        if (!kern_cuda_available(why, sizeof why))
            return mt_error_set(err, MT_ERR_DEVICE,
                                "backend: cuda was requested but no usable GPU was found (%s); "
                                "use backend: cpu or backend: auto",
                                why);
        return kern_device_create(KERN_BACKEND_CUDA, &o, out, err);
    case ENG_BACKEND_AUTO:
    default:
        if (kern_cuda_available(why, sizeof why)) return kern_device_create(KERN_BACKEND_CUDA, &o, out, err);
        fprintf(stderr, "moetune: no usable GPU (%s); running on the CPU backend\n", why);
        return kern_device_create(KERN_BACKEND_CPU, &o, out, err);
    }
}

static int total_steps(const eng_run_config_t *rc, const eng_loader_t *ld) {
    if (rc->max_steps > 0) return rc->max_steps;
    /* HF Trainer: update steps per epoch = max(batches // accumulation, 1) */
    int64_t per_epoch = eng_loader_batches_per_epoch(ld) / rc->gradient_accumulation_steps;
    if (per_epoch < 1) per_epoch = 1;
    /* num_epochs (<= 10^6) x steps per epoch can pass INT_MAX, where the
     * conversion to int is undefined: a run that long never ends anyway, so
     * the count is capped there instead. */
    const double steps = ceil((double)rc->num_epochs * (double)per_epoch);
    return steps < (double)INT_MAX ? (int)steps : INT_MAX;
}

/* A step whose loss or gradient is not finite stops the run before any
 * save.  The loader refuses a checkpoint holding NaN or Inf, so the cause is
 * the step itself, and the advice is about what makes steps diverge.
 * err holds the optimizer's finding (the gradient norm, the first
 * parameter whose gradient is non-finite); this adds where and what next. */
static mt_status_t diverged(mt_error_t *err, int step, double loss, const eng_run_config_t *rc,
                            const char *last_good) {
    char found[sizeof err->msg];
    snprintf(found, sizeof found, "%s", err->msg);
    char clip[160];
    if (rc->max_grad_norm > 0)
        snprintf(clip, sizeof clip, "(max_grad_norm: %g already clips finite gradients)",
                 rc->max_grad_norm);
    else
        snprintf(clip, sizeof clip, "or set max_grad_norm (e.g. 1.0) to clip large gradients");
    char lbuf[32];
    if (isnan(loss)) snprintf(lbuf, sizeof lbuf, "NaN");
    else snprintf(lbuf, sizeof lbuf, "%g", loss);
    return mt_error_set(err, MT_ERR_DATA,
                        "step %d: loss is %s; %s. The checkpoint's weights were all finite when "
                        "loaded, so training diverged: lower learning_rate (now %g) %s, and check "
                        "the data for extreme or corrupted examples; nothing was saved from this "
                        "step; %s%s",
                        step, lbuf, found, rc->learning_rate, clip,
                        last_good[0] ? "the last good checkpoint is " : "no checkpoint was saved before it",
                        last_good);
}

static mt_status_t save_checkpoint(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                   eng_ckpt_dir_mode_t mode, eng_reporter_t *rep, mt_error_t *err) {
    mt_status_t st = eng_train_save(x, rc, dir, mode, eng_save_dtype(eng_exec_model(x), rc), err);
    if (st == MT_OK) eng_reporter_note(rep, "moetune: saved checkpoint to %s", dir);
    return st;
}

static mt_status_t eng_train_locked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                                    mt_error_t *err);
static mt_status_t eng_train_run(const eng_run_config_t *rc, eng_ranks_t *ranks, const eng_lora_opts_t *lora,
                                 const char *resume_dir, eng_train_result_t *result, mt_error_t *err);

/* Rank 0's share of eng_train: the lock and the recovery of an interrupted
 * save, the only writes before the run (the other ranks write nothing). */
static mt_status_t lock_outdir(const eng_run_config_t *rc, eng_outdir_lock_t *lock, mt_error_t *err) {
    mt_status_t st = eng_outdir_lock(lock, rc->output_dir, err);
    if (st != MT_OK) return st;
    char note[1200];
    st = eng_outdir_recover(rc->output_dir, note, sizeof note, err);
    if (st != MT_OK) {
        eng_outdir_unlock(lock);
        return st;
    }
    if (note[0]) fprintf(stderr, "%s\n", note);
    return MT_OK;
}

mt_status_t eng_train(const eng_run_config_t *rc, eng_train_result_t *result, mt_error_t *err) {
    memset(result, 0, sizeof *result);
    eng_ranks_t ranks;
    mt_status_t st = eng_ranks_open(&ranks, err);
    if (st != MT_OK) return st;
    st = eng_train_ranked(rc, &ranks, result, err);
    eng_ranks_close(&ranks);
    return st;
}

mt_status_t eng_train_ranked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                             mt_error_t *err) {
    memset(result, 0, sizeof *result);
    result->rank = ranks->rank;
    result->ranks = ranks->size;
    /* Before anything is written: inputs are never outputs, and one run per
     * output_dir (the lock is held until eng_train returns). */
    mt_status_t st = eng_run_check_paths(rc, err);
    eng_outdir_lock_t lock;
    const bool writes = eng_ranks_writes(ranks);
    if (st == MT_OK && writes) st = lock_outdir(rc, &lock, err);
    if (st == MT_OK) {
        /* the other ranks look for checkpoints only after rank 0 has
         * recovered (or set aside) an interrupted save */
        eng_ranks_barrier(ranks);
        st = eng_train_locked(rc, ranks, result, err);
        if (writes) eng_outdir_unlock(&lock);
    }
    if (st != MT_OK && ranks->size > 1) eng_ranks_abort(ranks, err->msg);
    return st;
}

static mt_status_t eng_train_locked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                                    mt_error_t *err) {
    /* which checkpoint to resume from, before anything heavy is opened */
    char resume_dir[2048];
    mt_status_t st = eng_train_state_resolve(rc, resume_dir, sizeof resume_dir, err);
    if (st != MT_OK) return st;

    /* A LoRA run's adapter settings, before the device: a lora_model_dir
     * that disagrees with the run fails first.  A run that names no targets
     * continues the adapter's, and plans with them. */
    eng_lora_run_opts_t lora;
    const bool use_lora = rc->adapter == ENG_ADAPTER_LORA;
    eng_run_config_t rc_lora;
    if (use_lora) {
        st = eng_lora_run_opts(rc, &lora, err);
        if (st != MT_OK) {
            eng_lora_run_opts_free(&lora);
            return st;
        }
        rc_lora = *rc;
        if (rc->num_lora_target_modules == 0 && !rc->lora_target_regex[0] && !rc->lora_target_linear) {
            const eng_lora_config_t *c = &lora.init_cfg;
            for (int i = 0; i < c->num_target_modules && i < ENG_MAX_LORA_TARGETS; i++)
                snprintf(rc_lora.lora_target_modules[i], sizeof rc_lora.lora_target_modules[i], "%s",
                         c->target_modules[i]);
            rc_lora.num_lora_target_modules = c->num_target_modules < ENG_MAX_LORA_TARGETS ? c->num_target_modules
                                                                                             : ENG_MAX_LORA_TARGETS;
            if (c->target_regex)
                snprintf(rc_lora.lora_target_regex, sizeof rc_lora.lora_target_regex, "%s", c->target_regex);
        }
        rc = &rc_lora;
        /* resuming: the adapter comes from the checkpoint (its training
         * state from its optimizer.safetensors, eng_train_state_load) */
        if (resume_dir[0]) lora.opts.init_dir = resume_dir;
    }
    st = eng_train_run(rc, ranks, use_lora ? &lora.opts : NULL, resume_dir, result, err);
    if (use_lora) eng_lora_run_opts_free(&lora);
    return st;
}

static mt_status_t eng_train_run(const eng_run_config_t *rc, eng_ranks_t *ranks, const eng_lora_opts_t *lora,
                                 const char *resume_dir, eng_train_result_t *result, mt_error_t *err) {
    /* before any weight is read: the step must split evenly over ranks x devices */
    mt_status_t st = eng_ranks_check_accum(ranks, rc->gradient_accumulation_steps, rc->devices.count, err);
    if (st != MT_OK) return st;
    const int nranks = ranks->size;
    const bool writes = eng_ranks_writes(ranks);
    eng_run_config_t rc_rank;
    if (nranks > 1) {
        /* ranks sharing a node take the node's devices in turn: local rank
         * l opens the ordinals `devices:` names shifted by l * count (the
         * CPU backend has no ordinals) */
        rc_rank = *rc;
        for (int d = 0; d < rc_rank.devices.count; d++)
            rc_rank.devices.ids[d] += ranks->local_rank * rc_rank.devices.count;
        rc = &rc_rank;
    }
    kern_device_t *dev = NULL;
    st = eng_open_device(rc, &dev, err);
    if (st != MT_OK) return st;

    /* plan from config.json alone, before any weight is read */
    eng_model_config_t mc;
    st = eng_model_config_load(rc->base_model, rc->model_config_json, &mc, err);
    if (st != MT_OK) {
        kern_device_destroy(dev);
        return st;
    }
    eng_train_plan_t tp;
    /* with devices: N each device runs K / N of a step's micro-batches
     * within its own budget (K / (R N) with R ranks): that share is what is
     * planned */
    eng_run_config_t rc_share = *rc;
    const int shares = (rc->devices.count > 1 ? rc->devices.count : 1) * nranks;
    if (shares > 1 && rc->gradient_accumulation_steps % shares == 0)
        rc_share.gradient_accumulation_steps /= shares;
    st = eng_train_plan(&rc_share, &mc, dev, &tp, err);
    eng_model_config_free(&mc);
    if (st != MT_OK) {
        kern_device_destroy(dev);
        return st;
    }
    eng_multi_t multi; /* the model and an executor on each of the `devices:` (engine/parallel/devices.h) */
    eng_staging_settings_t staging;
    eng_staging_settings_from_run(rc, &staging);
    if (!rc->trace) staging.timeline_samples = (size_t)1 << 14; /* only a trace reads the timeline */
    const eng_model_opts_t mo = {.overrides_json = rc->model_config_json,
                                 .plan = &tp.plan,
                                 .staging = &staging,
                                 .compute = eng_compute_dtype(rc, dev),
                                 .lora = lora};
    st = eng_multi_open(&multi, dev, &rc->devices, rc->gradient_accumulation_steps / nranks, rc->base_model, &mo,
                        err);
    if (st == MT_OK) {
        multi.ranks = ranks;
        st = eng_ranks_bind_device(ranks, dev, err);
        if (st != MT_OK) eng_multi_free(&multi);
    }
    if (st != MT_OK) {
        eng_train_plan_free(&tp);
        kern_device_destroy(dev);
        return st;
    }
    eng_exec_t *x = multi.primary; /* device 0: the optimizer step, saves, reports */
    eng_model_t *model = eng_multi_model(&multi);
    eng_trace_t *trace = NULL;
    double t_trace = 0; /* when tracing started */

    const char *paths[ENG_MAX_DATASETS];
    for (int i = 0; i < rc->num_datasets; i++) paths[i] = rc->datasets[i].path;
    eng_dataset_t ds;
    st = eng_dataset_load(&ds, paths, rc->num_datasets, rc->sequence_len, model->cfg.vocab_size, err);
    if (st != MT_OK) {
        eng_multi_free(&multi);
        eng_train_plan_free(&tp);
        kern_device_destroy(dev);
        return st;
    }
    char mask_warning[1024];
    if (eng_dataset_mask_warning(&ds, mask_warning, sizeof mask_warning))
        fprintf(stderr, "moetune: warning: %s\n", mask_warning);
    eng_loader_t ld;
    eng_loader_init(&ld, &ds, rc->micro_batch_size, rc->shuffle, rc->seed);
    const int total = total_steps(rc, &ld);
    eng_train_state_t ts;
    eng_train_state_init(&ts);
    char last_ckpt[2048] = "";
    if (resume_dir[0]) {
        char note[1024];
        st = eng_train_state_load(resume_dir, x, rc, &ld, &ts, note, sizeof note, err);
        /* the other devices' resident copies take the loaded weights too */
        if (st == MT_OK) st = eng_multi_sync_replicas(&multi, err);
        if (st != MT_OK) {
            mt_error_prefix(err, "resume_from_checkpoint %s: ", resume_dir);
            eng_train_state_free(&ts);
            eng_loader_free(&ld);
            eng_dataset_free(&ds);
            eng_multi_free(&multi);
            eng_train_plan_free(&tp);
            kern_device_destroy(dev);
            return st;
        }
        fprintf(stderr, "moetune: resuming from %s at step %d of %d\n", resume_dir, ts.global_step, total);
        if (note[0])
            fprintf(stderr, "moetune: note: changed since the checkpoint: %s; the run continues with the new values\n",
                    note);
        snprintf(last_ckpt, sizeof last_ckpt, "%s", resume_dir);
    }
    const eng_train_state_save_t ckpt_state = {.exec = x, .rc = rc, .ts = &ts, .loader = &ld,
                                               .total_steps = total, .save_dtype = eng_save_dtype(model, rc)};
    int64_t steps_per_epoch = eng_loader_batches_per_epoch(&ld) / rc->gradient_accumulation_steps;
    if (steps_per_epoch < 1) steps_per_epoch = 1;
    eng_signals_install();
    result->first_step = result->steps_done = ts.global_step;
    bool have_first_loss = false;

    eng_reporter_t rep;
    memset(&rep, 0, sizeof rep); /* the other ranks' reporter writes no metrics.jsonl and shows no progress */
    if (writes) {
        st = eng_reporter_open(&rep, rc->output_dir, rc->progress, err);
        if (st != MT_OK) goto out;
        const eng_run_header_t header = {.config_path = rc->source_path, .base_model = rc->base_model,
                                         .output_dir = rc->output_dir, .total_steps = total, .seed = rc->seed};
        st = eng_reporter_run_start(&rep, &header, err);
        if (st != MT_OK) goto out;
    }
    if (rc->trace && writes) {
        char path[1200];
        snprintf(path, sizeof path, "%s/trace.json", rc->output_dir);
        st = eng_trace_open(path, &trace, err);
        if (st != MT_OK) goto out;
        eng_exec_set_trace(x, trace);
        t_trace = mt_now_s();
    }
    eng_reporter_note(&rep,
                      "moetune: %s, %d layers, %d experts (top-%d), %lld examples of %d tokens, "
                      "%d steps x %d micro-batches of %d on %s",
                      model->cfg.model_type, model->cfg.num_hidden_layers, model->cfg.num_experts,
                      model->cfg.num_experts_per_tok, (long long)ds.num_rows, rc->sequence_len, total,
                      rc->gradient_accumulation_steps, rc->micro_batch_size, dev->vt->name);
    if (nranks > 1 && writes)
        eng_reporter_note(&rep,
                          "moetune: data parallel across %d ranks (%s), %d micro-batches each per step; "
                          "rank 0 writes %s",
                          nranks, ranks->launcher, rc->gradient_accumulation_steps / nranks, rc->output_dir);
    if (multi.n > 1)
        eng_reporter_note(&rep, "moetune: data parallel on %d devices sharing one host copy, %d micro-batches each per step",
                          multi.n, rc->gradient_accumulation_steps / nranks / multi.n);
    if (tp.predicted_step_s > 0)
        eng_reporter_note(&rep, "moetune: %s; predicted step %.3f s, peak device %.1f MiB", tp.summary,
                          tp.predicted_step_s, tp.predicted_peak_device / 1048576.0);
    else
        eng_reporter_note(&rep, "moetune: %s", tp.summary);
    result->predicted_step_s = tp.predicted_step_s;
    if (model->lora.on) {
        /* what is trained, by module kind: an adapter that skips the
         * experts shows here */
        char summary[2048];
        eng_lora_plan_summary(&model->lora.plan, summary, sizeof summary);
        eng_reporter_note(&rep, "moetune: LoRA r=%d alpha=%g (scale %g%s), base frozen\n%s", model->lora.r,
                          model->lora.alpha, (double)model->lora.scale, model->lora.use_rslora ? ", rsLoRA" : "",
                          summary);
    }
    eng_exec_staging_info_t si;
    eng_exec_staging_info(x, &si);
    eng_reporter_note(&rep, "moetune: staging %s: %.1f MiB pinned for an in-flight window of %.1f MiB (%d tensors)",
                      moe_staging_mode_name(si.mode), si.capacity / 1048576.0, si.window_payload / 1048576.0,
                      si.window_tensors);

    const eng_optim_hparams_t hp_base = {
        .beta1 = rc->adam_beta1, .beta2 = rc->adam_beta2, .eps = rc->adam_epsilon,
        .weight_decay = rc->weight_decay, .max_grad_norm = rc->max_grad_norm};
    const double t_run = mt_now_s();
    for (int step = ts.global_step; step < total; step++) {
        const double t0 = mt_now_s();
        kern_device_reset_peaks(dev);
        const int accum = rc->gradient_accumulation_steps;
        eng_optim_hparams_t hp = hp_base;
        hp.lr = eng_lr_at(rc, step, total);
        /* host AdamW overlaps backward when the plan puts it on the host and nothing clips;
           not when a non-finite step may be skipped: overlapped blocks are updated before
           the norm is known */
        eng_multi_begin_step(&multi, &hp, accum, rc->skip_nonfinite_steps == 0);
        double loss = 0, ce = 0, aux = 0;
        int64_t tokens = 0;
        /* the step's micro-batches in the run's step_order (engine/exec/exec.h) */
        eng_micro_stats_t *ms = calloc((size_t)accum, sizeof *ms);
        MT_CHECK_ALLOC(ms, "micro-batch statistics");
        st = eng_multi_step_from_loader(&multi, &ld, accum, rc->step_order, ms, err);
        for (int micro = 0; st == MT_OK && micro < accum; micro++) {
            loss += ms[micro].loss / accum;
            ce += ms[micro].ce_loss / accum;
            aux += ms[micro].aux_loss / accum;
            tokens += ms[micro].tokens;
        }
        free(ms);
        if (st != MT_OK) {
            mt_error_prefix(err, "step %d, ", step + 1);
            goto out;
        }
        eng_optim_stats_t os;
        st = eng_multi_optim_step(&multi, &hp, &os, err);
        if (st == MT_ERR_DATA && ts.nonfinite_skipped < rc->skip_nonfinite_steps) {
            /* nothing was updated: drop the gradients and go on, counted (the other
               devices' were cleared when they were summed into this one's) */
            eng_optim_discard_step(x);
            ts.nonfinite_skipped++;
            eng_reporter_note(&rep, "moetune: step %d skipped (%d of skip_nonfinite_steps: %d): %s", step + 1,
                              ts.nonfinite_skipped, rc->skip_nonfinite_steps, err->msg);
            eng_train_state_log(&ts, &(eng_log_entry_t){.step = step + 1, .loss = loss, .lr = hp.lr,
                                                        .grad_norm = NAN, .skipped = true});
            ts.global_step = step + 1;
            result->steps_done = step + 1;
            st = MT_OK;
            goto step_end;
        }
        if (st == MT_ERR_DATA) { /* a non-finite gradient: nothing was updated */
            st = diverged(err, step + 1, loss, rc, last_ckpt);
            goto out;
        }
        if (st != MT_OK) {
            mt_error_prefix(err, "step %d, optimizer: ", step + 1);
            goto out;
        }
        const double dt = mt_now_s() - t0;
        const kern_device_stats_t ds_stats = kern_device_stats(dev);
        const eng_host_mem_t hm = eng_host_mem_read();
        moe_staging_stats_t ss; /* this step's (eng_optim_begin_step restarted the counters) */
        moe_staging_get_stats(eng_exec_staging(x), MOE_STAGING_SCOPE_STEP, &ss);
        eng_exec_staging_counters_t xc;
        eng_exec_staging_counters(x, &xc);
        eng_step_report_t r = {
            .step = step + 1, .total_steps = total, .loss = loss, .ce_loss = ce, .aux_loss = aux,
            .lr = hp.lr, .grad_norm = os.grad_norm, .tokens_per_s = dt > 0 ? (double)tokens / dt : 0,
            .step_time_s = dt, .tokens = tokens, .epoch = ld.epoch,
            .peak_device_bytes = ds_stats.device_peak, .peak_pinned_bytes = ss.peak_reserved,
            .peak_host_bytes = hm.peak_rss, .host_allocated_bytes = hm.allocated, .has_staging = true,
            .staging_copies = {ss.copies[0], ss.copies[1]},
            .staging_mean_copy_bytes = {ss.mean_copy_bytes[0], ss.mean_copy_bytes[1]},
            .staging_experts_skipped = ss.experts_skipped, .staging_wait_s = ss.wait_s,
            .staging_peak_in_use_bytes = ss.peak_in_use, .weight_h2d_bytes = xc.weight_h2d_bytes,
            .grad_d2h_bytes = xc.grad_d2h_bytes};
        const bool log_line = (step + 1) % (rc->logging_steps > 0 ? rc->logging_steps : 1) == 0 ||
                              step + 1 == total || step == 0;
        eng_reporter_step(&rep, &r, log_line);
        if (!isfinite(loss)) {
            mt_error_set(err, MT_ERR_DATA, "the gradient norm is %g", os.grad_norm);
            st = diverged(err, step + 1, loss, rc, last_ckpt);
            goto out;
        }
        eng_train_state_log(&ts, &(eng_log_entry_t){.step = step + 1, .loss = loss, .lr = hp.lr,
                                                    .grad_norm = os.grad_norm});
        ts.global_step = step + 1;
        if (!have_first_loss) result->first_loss = loss; /* this run's first: a resumed one starts later */
        have_first_loss = true;
        result->last_loss = loss;
        result->steps_done = step + 1;
    step_end:;
        /* a signal that reached some ranks only stops them all at the same step */
        const int stop_sig = eng_ranks_agree_max(ranks, eng_signals_pending());
        if (writes &&
            (eng_train_state_save_due(rc, step + 1, total, steps_per_epoch) || (stop_sig && step + 1 < total))) {
            st = eng_train_state_checkpoint(&ckpt_state, step + 1, last_ckpt, sizeof last_ckpt, err);
            if (st != MT_OK) goto out;
            eng_reporter_note(&rep, "moetune: saved checkpoint to %s", last_ckpt);
            result->checkpoints_saved++;
        }
        if (stop_sig && step + 1 < total) {
            result->stopped_by_signal = stop_sig;
            result->steps_done = step + 1;
            snprintf(result->last_checkpoint, sizeof result->last_checkpoint, "%s", last_ckpt);
            result->seconds = mt_now_s() - t_run;
            goto out;
        }
    }
    result->seconds = mt_now_s() - t_run;
    if (rc->save_final && writes) {
        st = save_checkpoint(x, rc, rc->output_dir, ENG_CKPT_DIR_MERGE, &rep, err);
        result->model_saved = st == MT_OK;
    }
    if (st == MT_OK && model->lora.on && rc->merge_lora && writes) {
        char dir[1200];
        snprintf(dir, sizeof dir, "%s/merged", rc->output_dir);
        st = eng_train_save_model(x, rc, dir, ENG_CKPT_DIR_SWAP, eng_save_dtype(model, rc), err);
        if (st == MT_OK) eng_reporter_note(&rep, "moetune: saved the merged model (base + LoRA) to %s", dir);
    }
out:
    if (trace) {
        mt_error_t serr = {0}; /* the staging pool's counter tracks */
        if (eng_exec_trace_staging(x, trace, t_trace, &serr) != MT_OK && st == MT_OK)
            st = mt_error_set(err, serr.code, "%s", serr.msg);
        eng_exec_set_trace(x, NULL);
        mt_error_t terr = {0};
        if (eng_trace_close(trace, &terr) != MT_OK && st == MT_OK) st = mt_error_set(err, terr.code, "%s", terr.msg);
    }
    eng_signals_restore();
    eng_train_state_free(&ts);
    eng_train_plan_free(&tp);
    eng_reporter_close(&rep);
    eng_loader_free(&ld);
    eng_dataset_free(&ds);
    eng_multi_free(&multi);
    kern_device_destroy(dev);
    return st;
}
