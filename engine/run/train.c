/* `moetune train` from start to end (see train.h): the output_dir's lock,
 * the job's ranks, a LoRA run's adapter settings, then the run: set up
 * (engine/run/session.h), announced, its steps (engine/run/train_loop.h),
 * its final save, torn down.
 *
 * Every part of the run is opened by eng_run_open and freed by
 * eng_run_close whether or not the run got that far, so each function here
 * opens at most one thing and frees it on its one way out. */
#include "engine/run/train.h"

#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/io/outdir.h"
#include "engine/model/lora/adapter.h"
#include "engine/model/lora/peft5.h"
#include "engine/model/lora_model.h"
#include "engine/run/report.h"
#include "engine/run/save.h"
#include "engine/run/session.h"
#include "engine/run/state.h"
#include "engine/run/train_loop.h"

static mt_status_t eng_train_locked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                                    mt_error_t *err);

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

/* What the run is, before its first step: the model and data, the ranks
 * and devices the step splits over, the plan and its prediction, a LoRA
 * run's adapter (by module kind: an adapter that skips the experts shows
 * here), the staging pool. */
static void announce(eng_run_t *run, eng_train_result_t *result) {
    const eng_run_config_t *rc = run->rc;
    const eng_model_t *model = run->model;
    const eng_train_plan_t *tp = &run->tp;
    eng_reporter_t *rep = &run->rep;
    eng_reporter_note(rep,
                      "moetune: %s, %d layers, %d experts (top-%d), %lld %s of %d tokens, "
                      "%d steps x %d micro-batches of %d on %s",
                      model->cfg.model_type, model->cfg.num_hidden_layers, model->cfg.num_experts,
                      model->cfg.num_experts_per_tok, (long long)run->ds.num_rows, run->ds.seg_start ? "packed rows" : "examples", rc->sequence_len,
                      run->total_steps, rc->gradient_accumulation_steps, rc->micro_batch_size, run->dev->vt->name);
    if (run->nranks > 1 && run->writes)
        eng_reporter_note(rep,
                          "moetune: data parallel across %d ranks (%s), %d micro-batches each per step; "
                          "rank 0 writes %s",
                          run->nranks, run->ranks->launcher, rc->gradient_accumulation_steps / run->nranks,
                          rc->output_dir);
    if (run->multi.n > 1)
        eng_reporter_note(rep, "moetune: data parallel on %d devices sharing one host copy, %d micro-batches each per step",
                          run->multi.n, rc->gradient_accumulation_steps / run->nranks / run->multi.n);
    if (tp->predicted_step_s > 0)
        eng_reporter_note(rep, "moetune: %s; predicted step %.3f s, peak device %.1f MiB", tp->summary,
                          tp->predicted_step_s, tp->predicted_peak_device / 1048576.0);
    else
        eng_reporter_note(rep, "moetune: %s", tp->summary);
    result->predicted_step_s = tp->predicted_step_s;
    result->nvme_base_homes = run->nvme.base_homes;
    result->nvme_base_unpacked = run->nvme.base_unpacked;
    if (model->lora.on) {
        char summary[2048];
        eng_lora_plan_summary(&model->lora.plan, summary, sizeof summary);
        bool own = false; /* modules at their own rank or scale (an adapter's rank_pattern / alpha_pattern) */
        for (int t = 0; t < model->lora.plan.count; t++)
            own = own || model->lora.plan.targets[t].r != model->lora.r ||
                  model->lora.plan.targets[t].scale != model->lora.scale;
        eng_reporter_note(rep, "moetune: LoRA r=%d alpha=%g (scale %g%s%s), base frozen\n%s", model->lora.r,
                          model->lora.alpha, (double)model->lora.scale, model->lora.use_rslora ? ", rsLoRA" : "",
                          own ? "; some modules at the adapter's own rank and scale" : "", summary);
        char notes[4096];
        if (eng_lora_peft_warnings(&model->spec, &model->lora.plan, model->lora.dropout, notes, sizeof notes) > 0)
            eng_reporter_note(rep, "moetune: warning: the adapter this run saves is not all PEFT can load:\n%s",
                              notes);
    }
    eng_exec_staging_info_t si;
    eng_exec_staging_info(run->x, &si);
    eng_reporter_note(rep, "moetune: staging %s: %.1f MiB pinned for an in-flight window of %.1f MiB (%d tensors)",
                      moe_staging_mode_name(si.mode), si.capacity / 1048576.0, si.window_payload / 1048576.0,
                      si.window_tensors);
}

/* The end of a run that ran all its steps, on the rank that writes: the
 * final model (save_final) into output_dir, and in a LoRA run with
 * merge_lora the merged model into output_dir/merged. */
static mt_status_t save_final(eng_run_t *run, eng_train_result_t *result, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    if (!run->writes) return MT_OK;
    const mt_dtype_t dtype = eng_save_dtype(run->model, rc);
    mt_status_t st = MT_OK;
    if (rc->save_final) {
        st = eng_train_save(run->x, rc, rc->output_dir, ENG_CKPT_DIR_MERGE, dtype, err);
        if (st == MT_OK) eng_reporter_note(&run->rep, "moetune: saved checkpoint to %s", rc->output_dir);
        result->model_saved = st == MT_OK;
    }
    if (st != MT_OK || !run->model->lora.on || !rc->merge_lora) return st;
    char dir[1200];
    snprintf(dir, sizeof dir, "%s/merged", rc->output_dir);
    st = eng_train_save_model(run->x, rc, dir, ENG_CKPT_DIR_SWAP, dtype, err);
    if (st == MT_OK) eng_reporter_note(&run->rep, "moetune: saved the merged model (base + LoRA) to %s", dir);
    return st;
}

/* The run itself, as rc (a LoRA run's with its adapter's targets) says. */
static mt_status_t train_run(const eng_run_config_t *rc, eng_ranks_t *ranks, const eng_lora_opts_t *lora,
                             const char *resume_dir, eng_train_result_t *result, mt_error_t *err) {
    eng_run_t run;
    const eng_run_opts_t opts = {.ranks = ranks, .lora = lora, .resume_dir = resume_dir, .training = true};
    mt_status_t st = eng_run_open(&run, rc, &opts, err);
    if (st == MT_OK) {
        result->first_step = result->steps_done = run.ts.global_step;
        announce(&run, result);
        st = eng_train_steps(&run, result, err);
    }
    if (st == MT_OK && !result->stopped_by_signal) st = save_final(&run, result, err);
    return eng_run_close(&run, st, err);
}

/* A LoRA run that names no targets continues the adapter's (c, from
 * lora_model_dir), and plans with them. */
static void adapter_targets(eng_run_config_t *rc, const eng_lora_config_t *c) {
    if (rc->num_lora_target_modules != 0 || rc->lora_target_regex[0] || rc->lora_target_linear) return;
    for (int i = 0; i < c->num_target_modules && i < ENG_MAX_LORA_TARGETS; i++)
        snprintf(rc->lora_target_modules[i], sizeof rc->lora_target_modules[i], "%s", c->target_modules[i]);
    rc->num_lora_target_modules = c->num_target_modules < ENG_MAX_LORA_TARGETS ? c->num_target_modules
                                                                                 : ENG_MAX_LORA_TARGETS;
    if (c->target_regex) snprintf(rc->lora_target_regex, sizeof rc->lora_target_regex, "%s", c->target_regex);
    /* target_parameters (transformers 5's fused experts, 2-D weights) have no
     * module names the planner reads: it plans every linear layer, an upper
     * bound on the adapters' bytes */
    if (c->num_target_parameters > 0 && rc->num_lora_target_modules < ENG_MAX_LORA_TARGETS)
        snprintf(rc->lora_target_modules[rc->num_lora_target_modules++], sizeof rc->lora_target_modules[0], "%s",
                 "all-linear");
}

/* The checkpoint being resumed against the run's adapter settings, before
 * anything heavy opens, so the message names the real culprit: a LoRA
 * checkpoint (its adapter files) resumed by a full run, or a run config
 * whose lora_r, lora_alpha or use_rslora is not the adapter_config.json
 * the checkpoint was saved with (the adapter is loaded from the checkpoint,
 * not from a lora_model_dir). */
static mt_status_t check_resume_adapter(const eng_run_config_t *rc, const char *dir, mt_error_t *err) {
    char path[2200];
    snprintf(path, sizeof path, "%s/adapter_config.json", dir);
    struct stat sb;
    const bool is_adapter = stat(path, &sb) == 0;
    if (rc->adapter != ENG_ADAPTER_LORA)
        return !is_adapter ? MT_OK
                           : mt_error_set(err, MT_ERR_CONFIG,
                                          "%s: resume_from_checkpoint %s is a LoRA adapter checkpoint (%s, "
                                          "adapter_model.safetensors), but this run trains the full model (no "
                                          "adapter: lora); resume it with adapter: lora and the adapter's settings, "
                                          "or start a full run without resume_from_checkpoint",
                                          rc->source_path, dir, path);
    if (!is_adapter)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: adapter: lora, but resume_from_checkpoint %s holds no adapter_config.json (a full "
                            "fine-tuning checkpoint); resume it without adapter: lora",
                            rc->source_path, dir);
    eng_lora_config_t c;
    mt_status_t st = eng_lora_config_read(path, &c, err);
    if (st != MT_OK) return mt_error_prefix(err, "resume_from_checkpoint: ");
    if (c.r != rc->lora_r)
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s: lora_r is %d, but the checkpoint being resumed has r %d (%s); resume with "
                          "lora_r: %d (the adapter's rank cannot change mid-run)",
                          rc->source_path, rc->lora_r, c.r, path, c.r);
    else if (fabs(c.lora_alpha - rc->lora_alpha) > 1e-12 * fabs(c.lora_alpha))
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s: lora_alpha is %g, but the checkpoint being resumed has lora_alpha %g (%s); resume "
                          "with lora_alpha: %g",
                          rc->source_path, rc->lora_alpha, c.lora_alpha, path, c.lora_alpha);
    else if (c.use_rslora != rc->use_rslora)
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s: use_rslora is %s, but the checkpoint being resumed has use_rslora %s (%s)",
                          rc->source_path, rc->use_rslora ? "true" : "false", c.use_rslora ? "true" : "false",
                          path);
    eng_lora_config_free(&c);
    return st;
}

static mt_status_t eng_train_locked(const eng_run_config_t *rc, eng_ranks_t *ranks, eng_train_result_t *result,
                                    mt_error_t *err) {
    /* which checkpoint to resume from, before anything heavy is opened */
    char resume_dir[2048];
    mt_status_t st = eng_train_state_resolve(rc, resume_dir, sizeof resume_dir, err);
    if (st == MT_OK && resume_dir[0]) st = check_resume_adapter(rc, resume_dir, err);
    if (st != MT_OK) return st;
    if (rc->adapter != ENG_ADAPTER_LORA) return train_run(rc, ranks, NULL, resume_dir, result, err);

    /* A LoRA run's adapter settings, before the device: a lora_model_dir
     * that disagrees with the run fails first. */
    eng_lora_run_opts_t lora;
    st = eng_lora_run_opts(rc, &lora, err);
    if (st == MT_OK) {
        eng_run_config_t rc_lora = *rc;
        adapter_targets(&rc_lora, &lora.init_cfg);
        /* resuming: the adapter comes from the checkpoint (its training
         * state from its optimizer.safetensors, eng_train_state_load) */
        if (resume_dir[0]) lora.opts.init_dir = resume_dir;
        st = train_run(&rc_lora, ranks, &lora.opts, resume_dir, result, err);
    }
    eng_lora_run_opts_free(&lora);
    return st;
}
