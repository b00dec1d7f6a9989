/* The step loop of `moetune train` (see train_loop.h).
 *
 * One optimizer step = gradient_accumulation_steps micro-batches, each
 * forward+backward with its loss divided by the number of micro-batches,
 * then clipping and AdamW at the learning rate the schedule gives for this
 * step (transformers' get_scheduler, 0-based step).  The logged loss is the
 * mean of the micro-batch losses, measured in the forward pass before the
 * update, as the HF Trainer logs it.
 *
 * A step is forward+backward, then the optimizer, then its report; after
 * every step, skipped or not, come an evaluation when one is due (before
 * the checkpoint, as the HF Trainer orders them, so that a checkpoint's
 * log history holds its step's evaluation, and one a stop interrupted is
 * redone on resume) and the decision to checkpoint and to stop.
 * Each is its own function over the loop's state (loop_t), so that the
 * loop itself reads as that sentence. */
#include "engine/run/train_loop.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/clock.h"
#include "engine/exec/optim_state.h"
#include "engine/run/eval.h"
#include "engine/run/host_mem.h"
#include "engine/run/signals.h"

/* The loop's state beside the run's. */
typedef struct {
    eng_run_t *run;
    eng_train_result_t *result;
    eng_optim_hparams_t hp_base; /* every step's, but for the learning rate */
    int64_t steps_per_epoch;
    bool have_first_loss;        /* this run's first: a resumed one starts later */
} loop_t;

/* A step's micro-batches, averaged over them (tokens summed). */
typedef struct {
    double loss, ce, aux;
    int64_t tokens;
} step_sums_t;

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

/* An update that left a weight NaN or Inf (the gradient was finite): the
 * weights are changed, so the step cannot be skipped, and the run stops
 * before anything of it is saved.  err names the parameter and element. */
static mt_status_t bad_update(mt_error_t *err, int step, const char *last_good) {
    char found[sizeof err->msg];
    snprintf(found, sizeof found, "%s", err->msg);
    return mt_error_set(err, MT_ERR_DATA,
                        "step %d: %s; the gradient was finite, so the update itself overflowed: lower "
                        "learning_rate, and check adam_epsilon and the optimizer state resumed from; nothing "
                        "was saved from this step; %s%s",
                        step, found,
                        last_good[0] ? "the last good checkpoint is " : "no checkpoint was saved before it",
                        last_good);
}

/* The step's micro-batches in the run's step_order (engine/exec/exec.h).
 * Host AdamW overlaps backward when the plan puts it on the host and
 * nothing clips; not when a non-finite step may be skipped: overlapped
 * blocks are updated before the norm is known. */
static mt_status_t forward_backward(eng_run_t *run, int step, const eng_optim_hparams_t *hp, step_sums_t *s,
                                    mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    const int accum = rc->gradient_accumulation_steps;
    eng_multi_begin_step(&run->multi, hp, accum, rc->skip_nonfinite_steps == 0);
    *s = (step_sums_t){0};
    eng_micro_stats_t *ms = calloc((size_t)accum, sizeof *ms);
    MT_CHECK_ALLOC(ms, "micro-batch statistics");
    mt_status_t st = eng_multi_step_from_loader(&run->multi, &run->ld, accum, rc->step_order, ms, err);
    for (int micro = 0; st == MT_OK && micro < accum; micro++) {
        s->loss += ms[micro].loss / accum;
        s->ce += ms[micro].ce_loss / accum;
        s->aux += ms[micro].aux_loss / accum;
        s->tokens += ms[micro].tokens;
    }
    free(ms);
    if (st != MT_OK) mt_error_prefix(err, "step %d, ", step + 1);
    return st;
}

/* A step whose gradient is not finite, within skip_nonfinite_steps: nothing
 * was updated, so its gradients are dropped and it is counted (the other
 * devices' were cleared when they were summed into this one's). */
static void skip_step(loop_t *l, int step, double loss, double lr, const mt_error_t *err) {
    eng_run_t *run = l->run;
    eng_optim_discard_step(run->x);
    run->ts.nonfinite_skipped++;
    eng_reporter_note(&run->rep, "moetune: step %d skipped (%d of skip_nonfinite_steps: %d): %s", step + 1,
                      run->ts.nonfinite_skipped, run->rc->skip_nonfinite_steps, err->msg);
    eng_train_state_log(&run->ts, &(eng_log_entry_t){.step = step + 1, .loss = loss, .lr = lr,
                                                     .grad_norm = NAN, .skipped = true});
    run->ts.global_step = step + 1;
    l->result->steps_done = step + 1;
}

/* The step's line in metrics.jsonl and on the terminal: its numbers, the
 * device's and host's peaks, and the staging pool's counters for the step
 * (eng_optim_begin_step restarted them). */
static void report_step(eng_run_t *run, int step, const eng_optim_hparams_t *hp, const step_sums_t *s,
                        const eng_optim_stats_t *os, double dt) {
    const eng_run_config_t *rc = run->rc;
    const int total = run->total_steps;
    const kern_device_stats_t ds_stats = kern_device_stats(run->dev);
    const eng_host_mem_t hm = eng_host_mem_read();
    moe_staging_stats_t ss;
    moe_staging_get_stats(eng_exec_staging(run->x), MOE_STAGING_SCOPE_STEP, &ss);
    eng_exec_staging_counters_t xc;
    eng_exec_staging_counters(run->x, &xc);
    eng_step_report_t r = {
        .step = step + 1, .total_steps = total, .loss = s->loss, .ce_loss = s->ce, .aux_loss = s->aux,
        .lr = hp->lr, .grad_norm = os->grad_norm, .tokens_per_s = dt > 0 ? (double)s->tokens / dt : 0,
        .step_time_s = dt, .tokens = s->tokens, .epoch = run->ld.epoch,
        .peak_device_bytes = ds_stats.device_peak, .peak_pinned_bytes = ss.peak_reserved,
        .peak_host_bytes = hm.peak_rss, .host_allocated_bytes = hm.allocated, .has_staging = true,
        .staging_copies = {ss.copies[0], ss.copies[1]},
        .staging_mean_copy_bytes = {ss.mean_copy_bytes[0], ss.mean_copy_bytes[1]},
        .staging_experts_skipped = ss.experts_skipped, .staging_wait_s = ss.wait_s,
        .staging_peak_in_use_bytes = ss.peak_in_use, .weight_h2d_bytes = xc.weight_h2d_bytes,
        .grad_d2h_bytes = xc.grad_d2h_bytes, .input_d2h_bytes = xc.inputs_d2h_bytes,
        .input_h2d_bytes = xc.inputs_h2d_bytes,
        .speculation = !os->speculative ? NULL : os->speculation_undone ? "redone" : "kept",
        .updates_taken_back = os->taken_back};
    const bool log_line = (step + 1) % (rc->logging_steps > 0 ? rc->logging_steps : 1) == 0 ||
                          step + 1 == total || step == 0;
    eng_reporter_step(&run->rep, &r, log_line);
}

/* One optimizer step (0-based `step`): MT_OK when it was applied, logged
 * and reported, or skipped within skip_nonfinite_steps. */
static mt_status_t train_step(loop_t *l, int step, mt_error_t *err) {
    eng_run_t *run = l->run;
    const eng_run_config_t *rc = run->rc;
    const double t0 = mt_now_s();
    kern_device_reset_peaks(run->dev);
    eng_optim_hparams_t hp = l->hp_base;
    hp.lr = eng_lr_at(rc, step, run->total_steps);
    step_sums_t s;
    mt_status_t st = forward_backward(run, step, &hp, &s, err);
    if (st != MT_OK) return st;
    eng_optim_stats_t os = {0};
    st = eng_multi_optim_step(&run->multi, &hp, &os, err);
    if (st == MT_ERR_DATA && os.weights_nonfinite) return bad_update(err, step + 1, run->last_checkpoint);
    if (st == MT_ERR_DATA && run->ts.nonfinite_skipped < rc->skip_nonfinite_steps) {
        skip_step(l, step, s.loss, hp.lr, err);
        return MT_OK;
    }
    if (st == MT_ERR_DATA) /* a non-finite gradient: nothing was updated */
        return diverged(err, step + 1, s.loss, rc, run->last_checkpoint);
    if (st != MT_OK) {
        mt_error_prefix(err, "step %d, optimizer: ", step + 1);
        return st;
    }
    report_step(run, step, &hp, &s, &os, mt_now_s() - t0);
    if (!isfinite(s.loss)) {
        mt_error_set(err, MT_ERR_DATA, "the gradient norm is %g", os.grad_norm);
        return diverged(err, step + 1, s.loss, rc, run->last_checkpoint);
    }
    eng_train_state_log(&run->ts, &(eng_log_entry_t){.step = step + 1, .loss = s.loss, .lr = hp.lr,
                                                     .grad_norm = os.grad_norm});
    run->ts.global_step = step + 1;
    if (!l->have_first_loss) l->result->first_loss = s.loss;
    l->have_first_loss = true;
    l->result->last_loss = s.loss;
    l->result->steps_done = step + 1;
    return MT_OK;
}

/* After step `done` (1-based), when eval_steps says so: a pass over the
 * evaluation set on the rank that writes (the others' weights are the
 * same), reported, logged and kept in the training state. */
static mt_status_t evaluate_if_due(loop_t *l, int done, mt_error_t *err) {
    eng_run_t *run = l->run;
    const eng_run_config_t *rc = run->rc;
    if (!run->writes || !eng_eval_due(rc, &run->eval_ds, done, run->total_steps)) return MT_OK;
    eng_eval_result_t ev;
    mt_status_t st = eng_eval_run(run->x, rc, &run->eval_ds, &ev, err);
    if (st != MT_OK) return mt_error_prefix(err, "step %d, ", done);
    /* HF's fractional epoch: micro-batches done over micro-batches per epoch */
    const int64_t per_epoch = eng_loader_batches_per_epoch(&run->ld);
    const double epoch = per_epoch > 0 ? (double)done * rc->gradient_accumulation_steps / (double)per_epoch : 0.0;
    eng_reporter_eval(&run->rep, &(eng_eval_report_t){.step = done, .loss = ev.loss, .ppl = ev.ppl,
                                                       .tokens = ev.counted, .examples = ev.examples,
                                                       .seconds = ev.seconds, .epoch = epoch});
    const double secs = ev.seconds > 0 ? ev.seconds : 1e-9;
    eng_train_state_log(&run->ts, &(eng_log_entry_t){.step = done, .eval = true, .eval_loss = ev.loss,
                                                     .eval_runtime = ev.seconds,
                                                     .eval_samples_per_s = (double)ev.examples / secs,
                                                     .eval_steps_per_s = (double)ev.batches / secs, .epoch = epoch,
                                                     .loss = NAN, .lr = NAN, .grad_norm = NAN});
    l->result->has_eval = true;
    l->result->eval_loss = ev.loss;
    l->result->eval_step = done;
    return MT_OK;
}

/* After step `done` (1-based): a checkpoint when save_strategy says so or
 * a signal stops the run before its end (a signal that reached some ranks
 * only stops them all at the same step; rank 0 alone writes). */
static mt_status_t checkpoint_or_stop(loop_t *l, int done, mt_error_t *err) {
    eng_run_t *run = l->run;
    const eng_run_config_t *rc = run->rc;
    const int total = run->total_steps;
    const int pending = eng_signals_pending();
    const int stop_sig = run->ranks ? eng_ranks_agree_max(run->ranks, pending) : pending;
    const bool stopping = stop_sig && done < total;
    if (run->writes && (eng_train_state_save_due(rc, done, total, l->steps_per_epoch) || stopping)) {
        const eng_train_state_save_t state = {.exec = run->x, .rc = rc, .ts = &run->ts, .loader = &run->ld,
                                              .total_steps = total, .save_dtype = eng_save_dtype(run->model, rc)};
        mt_status_t st =
            eng_train_state_checkpoint(&state, done, run->last_checkpoint, sizeof run->last_checkpoint, err);
        if (st != MT_OK) return st;
        eng_reporter_note(&run->rep, "moetune: saved checkpoint to %s", run->last_checkpoint);
        l->result->checkpoints_saved++;
    }
    if (stopping) {
        l->result->stopped_by_signal = stop_sig;
        l->result->steps_done = done;
        snprintf(l->result->last_checkpoint, sizeof l->result->last_checkpoint, "%s", run->last_checkpoint);
    }
    return MT_OK;
}

mt_status_t eng_train_steps(eng_run_t *run, eng_train_result_t *result, mt_error_t *err) {
    const eng_run_config_t *rc = run->rc;
    loop_t l = {.run = run,
                .result = result,
                .hp_base = {.beta1 = rc->adam_beta1, .beta2 = rc->adam_beta2, .eps = rc->adam_epsilon,
                            .weight_decay = rc->weight_decay, .max_grad_norm = rc->max_grad_norm,
                            .skip_idle_experts = rc->idle_experts == ENG_IDLE_EXPERTS_SKIP,
                            .speculative = rc->sched_speculative}};
    l.steps_per_epoch = eng_loader_batches_per_epoch(&run->ld) / rc->gradient_accumulation_steps;
    if (l.steps_per_epoch < 1) l.steps_per_epoch = 1;
    const double t_run = mt_now_s();
    for (int step = run->ts.global_step; step < run->total_steps && !result->stopped_by_signal; step++) {
        mt_status_t st = train_step(&l, step, err);
        if (st == MT_OK) st = evaluate_if_due(&l, step + 1, err);
        if (st == MT_OK) st = checkpoint_or_stop(&l, step + 1, err);
        if (st != MT_OK) return st;
    }
    /* the last steps' write backs to the NVMe tier: a failure is the run's, not lost with the scratch files */
    const mt_status_t st = eng_exec_nvme_drain(run->x, err);
    result->seconds = mt_now_s() - t_run;
    return st;
}
