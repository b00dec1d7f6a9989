/* A run's set-up and tear-down (see session.h).
 *
 * eng_run_open is a list of parts, each a function that opens one thing
 * into the run and returns; the first failure ends the list and leaves the
 * run as it is, for eng_run_close, which frees every part whether or not it
 * was reached (each part's free takes the zeroed state eng_run_open starts
 * from).  The parts' order is what the user sees: every check that needs
 * no weights fails before any weight is read, and nothing is written
 * before the run is known to start. */
#include "engine/run/session.h"

#include "engine/data/split.h"
#include "engine/data/text.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/clock.h"
#include "engine/exec/optim_state.h"
#include "engine/run/eval.h"
#include "engine/run/signals.h"

/* The CPU backend's devices are numbered 0 to N-1, N the number `devices:`
 * lists (it opens that many): an ordinal past them would name a device
 * that is not there, not be read as another CPU device.  Under a launcher
 * open_ranks has shifted the ordinals by the local rank, so only a lone
 * process's are checked against the list. */
static mt_status_t cpu_ordinals(const eng_run_config_t *rc, mt_error_t *err) {
    if (eng_ranks_launched()) return MT_OK;
    for (int d = 0; d < rc->devices.count; d++)
        if (rc->devices.ids[d] < 0 || rc->devices.ids[d] >= rc->devices.count)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "devices: ordinal %d is out of range; the CPU backend has %d device(s) here, "
                                "numbered 0 to %d (list 0 to %d, or give devices: %d)",
                                rc->devices.ids[d], rc->devices.count, rc->devices.count - 1,
                                rc->devices.count - 1, rc->devices.count);
    return MT_OK;
}

mt_status_t eng_open_device(const eng_run_config_t *rc, kern_device_t **out, mt_error_t *err) {
    kern_device_opts_t o = {0};
    o.device_budget_bytes = rc->memory_device;
    if (rc->link_gbps > 0) o.link_h2d_bytes_per_s = o.link_d2h_bytes_per_s = rc->link_gbps * 1e9;
    o.link_latency_s = rc->link_latency_us * 1e-6;
    o.host_threads = rc->compute_threads;
    o.device_index = rc->devices.ids[0];
    o.pin_threads = rc->compute_threads > 0;
    char why[512];
    mt_status_t st;
    switch (rc->backend) {
    case ENG_BACKEND_CPU:
        st = cpu_ordinals(rc, err);
        return st != MT_OK ? st : kern_device_create(KERN_BACKEND_CPU, &o, out, err);
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
        st = cpu_ordinals(rc, err);
        return st != MT_OK ? st : kern_device_create(KERN_BACKEND_CPU, &o, out, err);
    }
}

/* The ranks, before any weight is read: the step must split evenly over
 * ranks x devices.  Ranks sharing a node take the node's devices in turn:
 * local rank l opens the ordinals `devices:` names shifted by l * count
 * (the CPU backend has no ordinals). */
static mt_status_t open_ranks(eng_run_t *run, eng_ranks_t *ranks, mt_error_t *err) {
    run->ranks = ranks;
    run->nranks = ranks ? ranks->size : 1;
    run->writes = ranks ? eng_ranks_writes(ranks) : true;
    if (!ranks) return MT_OK;
    eng_run_config_t *rc = &run->rc_own;
    mt_status_t st = eng_ranks_check_accum(ranks, rc->gradient_accumulation_steps, rc->devices.count, err);
    if (st != MT_OK || run->nranks == 1) return st;
    for (int d = 0; d < rc->devices.count; d++) rc->devices.ids[d] += ranks->local_rank * rc->devices.count;
    return MT_OK;
}

static mt_status_t open_device(eng_run_t *run, const eng_run_opts_t *opts, mt_error_t *err) {
    if (opts->device) return kern_device_create(opts->backend, opts->device, &run->dev, err);
    return eng_open_device(run->rc, &run->dev, err);
}

/* The plan, from config.json alone, before any weight is read.  With
 * devices: N each device runs K / N of a step's micro-batches within its
 * own budget (K / (R N) with R ranks): that share is what is planned when
 * the run opens the devices' executors. */
static mt_status_t plan(eng_run_t *run, const eng_run_opts_t *opts, mt_error_t *err) {
    if (opts->plan) {
        run->plan = opts->plan;
        return MT_OK;
    }
    const eng_run_config_t *rc = run->rc;
    eng_model_config_t mc;
    mt_status_t st = eng_model_config_load(rc->base_model, rc->model_config_json, &mc, err);
    if (st != MT_OK) return st;
    eng_run_config_t rc_share = *rc;
    const int shares = opts->without_model ? 1 : (rc->devices.count > 1 ? rc->devices.count : 1) * run->nranks;
    if (shares > 1 && rc->gradient_accumulation_steps % shares == 0) rc_share.gradient_accumulation_steps /= shares;
    st = eng_train_plan(&rc_share, &mc, run->dev, &run->tp, err);
    run->num_blocks = mc.num_hidden_layers + 2;
    run->vocab_size = mc.vocab_size;
    eng_model_config_free(&mc);
    run->plan = &run->tp.plan;
    return st;
}

/* memory.nvme.path must be a directory this process can write, whether or
 * not the plan uses it: a typo is found now, not on the day the host runs
 * short. */
static mt_status_t check_nvme_dir(const char *dir, mt_error_t *err) {
    struct stat sb;
    if (stat(dir, &sb) != 0 || access(dir, W_OK | X_OK) != 0)
        return mt_error_set(err, MT_ERR_IO, "memory.nvme.path: %s: cannot open the store directory: %s", dir,
                            strerror(errno));
    if (!S_ISDIR(sb.st_mode))
        return mt_error_set(err, MT_ERR_IO, "memory.nvme.path: %s: cannot open the store directory: not a directory",
                            dir);
    return MT_OK;
}

/* memory.nvme: the optimizer state and weights' homes the plan keeps on
 * the NVMe tier (a LoRA run's frozen base among them), for the combination
 * built so far (one device of one process); others are refused rather
 * than silently left in host memory. */
static mt_status_t open_nvme(eng_run_t *run, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    const char *why = rc->devices.count > 1 ? "several devices (devices:)" : run->nranks > 1 ? "several ranks" : NULL;
    if (why)
        return mt_error_set(err, MT_ERR_UNSUPPORTED,
                            "memory.nvme.path %s: the NVMe tier is built for one device of one process; this run "
                            "uses %s (remove memory.nvme to train in host memory)",
                            rc->memory_nvme_path, why);
    mt_status_t st = check_nvme_dir(rc->memory_nvme_path, err);
    if (st != MT_OK) return st;
    eng_nvme_placed_t placed;
    st = eng_exec_place_optim_nvme(run->x, rc->memory_nvme_path, rc->memory_nvme_budget, &placed, err);
    if (st != MT_OK) return mt_error_prefix(err, "memory.nvme.path: ");
    run->nvme = placed;
    if (placed.params + placed.base_homes == 0) {
        fprintf(stderr, "moetune: NVMe tier: not used: the plan fits host memory (%s); memory.host lower than that "
                        "moves optimizer state to %s\n", rc->memory_host ? "memory.host" : "the hardware profile's",
                rc->memory_nvme_path);
        return MT_OK;
    }
    fprintf(stderr, "moetune: NVMe tier: AdamW state of %d parameters (%.3f GiB; fp32 masters of %d, streamed bf16 "
            "weights of %d", placed.params, placed.bytes / 1073741824.0, placed.masters, placed.homes);
    if (placed.base_homes) fprintf(stderr, "; frozen base weights of %d", placed.base_homes);
    if (placed.base_unpacked)
        fprintf(stderr, ", %d of them written as stored straight from the base checkpoint", placed.base_unpacked);
    fprintf(stderr, ") in %s through %s", placed.run_dir, placed.io);
    if (placed.leftovers_removed)
        fprintf(stderr, "; removed %d killed run(s)' leftover files", placed.leftovers_removed);
    fprintf(stderr, "\n");
    return MT_OK;
}

/* The model once and an executor on each of the `devices:`
 * (engine/parallel/devices.h), bound to the job's ranks. */
static mt_status_t open_model(eng_run_t *run, const eng_run_opts_t *opts, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    eng_staging_settings_t staging;
    if (opts->staging) {
        staging = *opts->staging;
    } else {
        eng_staging_settings_from_run(rc, &staging);
        if (!rc->trace) staging.timeline_samples = (size_t)1 << 14; /* only a trace reads the timeline */
    }
    const eng_model_opts_t mo = {.overrides_json = rc->model_config_json,
                                 .plan = run->plan,
                                 .staging = &staging,
                                 .compute = eng_compute_dtype(rc, run->dev),
                                 .lora = opts->lora};
    mt_status_t st = eng_multi_open(&run->multi, run->dev, &rc->devices,
                                    rc->gradient_accumulation_steps / run->nranks, rc->base_model, &mo, err);
    if (st != MT_OK) return st;
    run->x = run->multi.primary;
    run->model = eng_multi_model(&run->multi);
    /* the moments' format before any state exists: the NVMe tier sizes its
     * extents by it, a resume reads the checkpoint's moments into it */
    eng_optim_set_moments(run->model, (kern_moments_fmt_t)eng_config_moments(rc), rc->seed);
    if (rc->memory_nvme_path[0]) st = open_nvme(run, err);
    if (st != MT_OK || !run->ranks) return st;
    run->multi.ranks = run->ranks;
    return eng_ranks_bind_device(run->ranks, run->dev, err);
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

/* What a text dataset became: the counts a user checks the masking and
 * truncation by. */
static void report_text_data(const eng_run_config_t *rc, const eng_dataset_t *ds) {
    const int64_t trained = eng_dataset_counted(ds);
    fprintf(stderr,
            "moetune: data: %lld examples in %lld rows of %d tokens: %lld real tokens, %lld trained; %lld truncated "
            "to sequence_len, %lld without a trained token left out\n",
            (long long)ds->examples, (long long)ds->num_rows, rc->sequence_len, (long long)ds->real_tokens,
            (long long)trained, (long long)ds->truncated, (long long)ds->dropped);
}

/* The run config's datasets (tokens checked against the model's
 * vocabulary), or the caller's, and with a model the loader its steps
 * draw from (without one the caller's executors bring their own). */
static mt_status_t open_data(eng_run_t *run, const eng_run_opts_t *opts, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    if (!opts->dataset) {
        const char *paths[ENG_MAX_DATASETS];
        for (int i = 0; i < rc->num_datasets; i++) paths[i] = rc->datasets[i].path;
        const int vocab = run->model ? run->model->cfg.vocab_size : run->vocab_size;
        mt_status_t st = eng_text_open_for(rc, rc->datasets, rc->num_datasets, &run->text, err);
        if (st != MT_OK) return st;
        eng_data_report_t rep = {0};
        const eng_data_opts_t o = {.T = rc->sequence_len, .vocab_size = vocab, .pack = rc->sample_packing,
                                   .seed = rc->seed, .entries = rc->datasets, .text = run->text,
                                   .prepared_dir = rc->dataset_prepared_path[0] ? rc->dataset_prepared_path : NULL,
                                   .report = &rep};
        st = eng_dataset_load_opts(&run->ds, paths, rc->num_datasets, &o, err);
        if (st != MT_OK) return st;
        if (opts->training && rep.note[0]) fprintf(stderr, "moetune: warning: prepared data: %s\n", rep.note);
        if (opts->training && o.prepared_dir)
            fprintf(stderr, "moetune: prepared data: %d file(s) read from %s, %d tokenized and written there\n",
                    rep.files_cached, o.prepared_dir, rep.files_written);
        if (opts->training && run->text) report_text_data(rc, &run->ds);
        if (opts->training && rc->sample_packing)
            fprintf(stderr,
                    "moetune: sample_packing: %lld examples in %lld rows of %d tokens, %.1f%% of positions real "
                    "(%lld without a trained token left out, %lld truncated)\n",
                    (long long)run->ds.examples, (long long)run->ds.num_rows, rc->sequence_len,
                    100.0 * eng_dataset_efficiency(&run->ds), (long long)run->ds.dropped,
                    (long long)run->ds.truncated);
    }
    char mask_warning[1024];
    if (opts->training && eng_dataset_mask_warning(&run->ds, mask_warning, sizeof mask_warning))
        fprintf(stderr, "moetune: warning: %s\n", mask_warning);
    if (opts->training) {
        const int vocab = run->model ? run->model->cfg.vocab_size : run->vocab_size;
        mt_status_t st = eng_eval_open_set(rc, vocab, &run->ds, &run->eval_ds, err);
        if (st != MT_OK) return st;
        if (run->eval_ds.num_rows > 0 && run->multi.ep)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "%s: evaluation (val_set_size or test_datasets) does not run with MoE layers expert "
                                "parallel (the plan chose it with devices: %d); set parallel: data",
                                rc->source_path, rc->devices.count);
    }
    if (!run->model) return MT_OK;
    eng_loader_init(&run->ld, &run->ds, rc->micro_batch_size, rc->shuffle, rc->seed);
    run->total_steps = total_steps(rc, &run->ld);
    return MT_OK;
}

/* A checkpoint's training state into the model and the loader; the other
 * devices' resident copies take the loaded weights too. */
static mt_status_t resume(eng_run_t *run, const char *dir, mt_error_t *err) {
    char note[1024];
    mt_status_t st = eng_train_state_load(dir, run->x, run->rc, &run->ld, &run->ts, note, sizeof note, err);
    /* a checkpoint past the run's end would train no step and save its weights as the result */
    if (st == MT_OK && run->ts.global_step > run->total_steps)
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s/%s: key 'global_step' is %d; expected at most %d, the steps of this run (%s: %d); "
                          "raise it to train on from that checkpoint",
                          dir, ENG_TRAINER_STATE_FILE, run->ts.global_step, run->total_steps,
                          run->rc->max_steps > 0 ? "max_steps" : "num_epochs",
                          run->rc->max_steps > 0 ? run->rc->max_steps : run->rc->num_epochs);
    if (st == MT_OK) st = eng_multi_sync_replicas(&run->multi, err);
    if (st != MT_OK) {
        mt_error_prefix(err, "resume_from_checkpoint %s: ", dir);
        return st;
    }
    fprintf(stderr, "moetune: resuming from %s at step %d of %d\n", dir, run->ts.global_step, run->total_steps);
    if (note[0])
        fprintf(stderr, "moetune: note: changed since the checkpoint: %s; the run continues with the new values\n",
                note);
    snprintf(run->last_checkpoint, sizeof run->last_checkpoint, "%s", dir);
    return MT_OK;
}

/* A training run's own parts: signals, and on the rank that writes,
 * metrics.jsonl's header and the trace (the other ranks' reporter writes
 * no metrics.jsonl and shows no progress). */
static mt_status_t open_training(eng_run_t *run, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    eng_signals_install();
    run->signals = true;
    if (!run->writes) return MT_OK;
    mt_status_t st = eng_reporter_open(&run->rep, rc->output_dir, rc->progress, err);
    if (st != MT_OK) return st;
    const eng_run_header_t header = {.config_path = rc->source_path, .base_model = rc->base_model,
                                     .output_dir = rc->output_dir, .total_steps = run->total_steps,
                                     .seed = rc->seed};
    st = eng_reporter_run_start(&run->rep, &header, err);
    if (st != MT_OK || !rc->trace) return st;
    char path[1200];
    snprintf(path, sizeof path, "%s/trace.json", rc->output_dir);
    st = eng_trace_open(path, &run->trace, err);
    if (st != MT_OK) return st;
    eng_exec_set_trace(run->x, run->trace);
    run->t_trace = mt_now_s();
    return MT_OK;
}

mt_status_t eng_run_open(eng_run_t *run, const eng_run_config_t *rc, const eng_run_opts_t *opts, mt_error_t *err) {
    memset(run, 0, sizeof *run);
    eng_run_config_copy(&run->rc_own, rc);
    run->rc = &run->rc_own;
    eng_train_state_init(&run->ts);
    if (opts->dataset) { /* the run's from here on, whatever happens next */
        run->ds = *opts->dataset;
        memset(opts->dataset, 0, sizeof *opts->dataset);
    }
    mt_status_t st = open_ranks(run, opts->ranks, err);
    if (st == MT_OK) st = open_device(run, opts, err);
    if (st == MT_OK) st = plan(run, opts, err);
    if (st == MT_OK && !opts->without_model) st = open_model(run, opts, err);
    if (st == MT_OK) st = open_data(run, opts, err);
    if (st == MT_OK && opts->resume_dir && opts->resume_dir[0]) st = resume(run, opts->resume_dir, err);
    if (st == MT_OK && opts->training) st = open_training(run, err);
    return st;
}

/* Writes the trace with the staging pool's counter tracks; the first
 * failure becomes the run's when it had none. */
static mt_status_t close_trace(eng_run_t *run, mt_status_t st, mt_error_t *err) {
    mt_error_t serr = {0};
    if (eng_exec_trace_staging(run->x, run->trace, run->t_trace, &serr) != MT_OK && st == MT_OK)
        st = mt_error_set(err, serr.code, "%s", serr.msg);
    eng_exec_set_trace(run->x, NULL);
    mt_error_t terr = {0};
    if (eng_trace_close(run->trace, &terr) != MT_OK && st == MT_OK) st = mt_error_set(err, terr.code, "%s", terr.msg);
    run->trace = NULL;
    return st;
}

mt_status_t eng_run_close(eng_run_t *run, mt_status_t st, mt_error_t *err) {
    if (run->trace) st = close_trace(run, st, err);
    if (run->signals) eng_signals_restore();
    run->signals = false;
    eng_train_state_free(&run->ts);
    eng_train_plan_free(&run->tp);
    eng_reporter_close(&run->rep);
    eng_loader_free(&run->ld);
    eng_dataset_free(&run->ds);
    eng_dataset_free(&run->eval_ds);
    eng_text_free(run->text);
    eng_multi_free(&run->multi);
    run->x = NULL;
    run->model = NULL;
    kern_device_destroy(run->dev);
    run->dev = NULL;
    eng_run_config_free(&run->rc_own);
    return st;
}
