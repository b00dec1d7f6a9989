/* A checkpoint's training state: writing it beside the model, finding the
 * checkpoint to resume from, loading it back (see state.h).
 *
 * Identity: a checkpoint's optimizer state only means something for the
 * same parameters, so a resume whose model has other parameter names,
 * shapes or trained set (another base_model, other model_config overrides
 * that change a shape), other adapter settings, or a dataset with another
 * number of rows (the saved position indexes its rows) is refused naming
 * the key.  Hyperparameters (learning rate, schedule, betas, batch shape)
 * may change, as the HF Trainer allows; the run is then not the same as an
 * uninterrupted one, and a note says which changed. */
#include "engine/run/state.h"

#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/model/io/checkpoint.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim_state.h"
#include "engine/model/io/safetensors.h"
#include "engine/run/save.h"
#include "engine/run/state_json.h"
#include "kernels/host/adamw_host.h"
#include "base/fileio.h"
#include "base/finite.h"

void eng_train_state_init(eng_train_state_t *ts) { memset(ts, 0, sizeof *ts); }

void eng_train_state_free(eng_train_state_t *ts) {
    free(ts->log);
    memset(ts, 0, sizeof *ts);
}

void eng_train_state_log(eng_train_state_t *ts, const eng_log_entry_t *e) {
    if (ts->log_count == ts->log_cap) {
        const int cap = ts->log_cap ? ts->log_cap * 2 : 256;
        eng_log_entry_t *l = realloc(ts->log, (size_t)cap * sizeof *l);
        MT_CHECK_ALLOC(l, "log history");
        ts->log = l;
        ts->log_cap = cap;
    }
    ts->log[ts->log_count++] = *e;
}

/* ---- identity ----------------------------------------------------------- */

static json_t *params_json(const eng_model_t *m) {
    json_t *a = json_array();
    for (int i = 0; i < m->num_params; i++) { /* a LoRA run's adapter factors after the base's */
        const eng_param_spec_t *ps = m->params[i].spec;
        json_t *shape = json_array();
        for (int d = 0; d < ps->ndim; d++) json_array_append_new(shape, json_integer(ps->shape[d]));
        json_array_append_new(a, json_pack("{s:s, s:o, s:b}", "name", ps->name, "shape", shape, "trained",
                                           !m->params[i].frozen));
    }
    return a;
}

static json_t *adapter_json(const eng_run_config_t *rc) {
    json_t *targets = json_array();
    for (int i = 0; i < rc->num_lora_target_modules; i++)
        json_array_append_new(targets, json_string(rc->lora_target_modules[i]));
    if (rc->adapter == ENG_ADAPTER_NONE) {
        json_decref(targets);
        return json_pack("{s:s}", "adapter", "none");
    }
    return json_pack("{s:s, s:i, s:f, s:o}", "adapter", "lora", "lora_r", rc->lora_r, "lora_alpha",
                     rc->lora_alpha, "lora_target_modules", targets);
}

static json_t *hparams_json(const eng_run_config_t *rc) {
    return json_pack("{s:f, s:i, s:i, s:f, s:f, s:f, s:f, s:f, s:i, s:i, s:i, s:b, s:I}", "learning_rate",
                     rc->learning_rate, "lr_scheduler", (int)rc->lr_scheduler, "warmup_steps", rc->warmup_steps,
                     "adam_beta1", rc->adam_beta1, "adam_beta2", rc->adam_beta2, "adam_epsilon", rc->adam_epsilon,
                     "weight_decay", rc->weight_decay, "max_grad_norm", rc->max_grad_norm, "micro_batch_size",
                     rc->micro_batch_size, "gradient_accumulation_steps", rc->gradient_accumulation_steps,
                     "max_steps", rc->max_steps, "shuffle", rc->shuffle, "seed", (json_int_t)rc->seed);
}

/* ---- writing ------------------------------------------------------------ */

/* One tensor of optimizer.safetensors, read from the model as it is
 * written: the file is three times the model's fp32 bytes, more than a
 * large model's host memory can hold beside it. */
typedef struct {
    eng_exec_t *x;
    int param;
    int what; /* 1 exp_avg, 2 exp_avg_sq, 3 master */
} optim_fill_t;

static void fill_optim(void *ctx, float *dst) {
    const optim_fill_t *f = ctx;
    if (f->what == 3) {
        eng_exec_read_optim_state(f->x, f->param, dst, NULL);
        return;
    }
    /* fp32 or bf16 moments as fp32 values (exact: the writer rounds bf16
     * values to bf16 unchanged) */
    const eng_param_t *p = &eng_exec_model(f->x)->params[f->param];
    void *raw = malloc(eng_param_moments_bytes(p));
    MT_CHECK_ALLOC(raw, "optimizer state buffer");
    eng_exec_read_optim_state(f->x, f->param, NULL, raw);
    const kern_moments_t mv = eng_param_moments_view(p, raw);
    kern_moments_to_f32(&mv, p->spec->numel, f->what == 1 ? dst : NULL, f->what == 2 ? dst : NULL);
    free(raw);
}

/* The run's moment format: the widest any parameter has (8-bit leaves
 * small tensors in fp32). */
static kern_moments_fmt_t run_moments_fmt(const eng_model_t *m) {
    kern_moments_fmt_t f = KERN_MOMENTS_F32;
    for (int i = 0; i < m->num_params; i++)
        if (!m->params[i].frozen && m->params[i].mom_fmt > (int)f) f = (kern_moments_fmt_t)m->params[i].mom_fmt;
    return f;
}

/* An 8-bit parameter's four raw tensors (codes and absmax of m and v) from
 * raw, its moments read whole (they are a quarter of the fp32 bytes). */
static int add_8bit_tensors(eng_st_write_tensor_t *w, char **names, const eng_param_t *p, void *raw,
                            const int64_t *nblocks) {
    const eng_param_spec_t *ps = p->spec;
    const kern_moments_t mv = eng_param_moments_view(p, raw);
    static const char *const sfx[4] = {".exp_avg", ".exp_avg.absmax", ".exp_avg_sq", ".exp_avg_sq.absmax"};
    void *data[4] = {mv.m, mv.m_absmax, mv.v, mv.v_absmax};
    for (int k = 0; k < 4; k++) {
        size_t len = strlen(ps->name) + strlen(sfx[k]) + 1;
        names[k] = malloc(len);
        MT_CHECK_ALLOC(names[k], "tensor name");
        snprintf(names[k], len, "%s%s", ps->name, sfx[k]);
        const bool codes = k % 2 == 0;
        w[k] = (eng_st_write_tensor_t){.name = names[k], .dtype = codes ? ENG_ST_U8 : ENG_ST_F32,
                                       .ndim = codes ? ps->ndim : 1, .shape = codes ? ps->shape : nblocks,
                                       .data = data[k]};
    }
    return 4;
}

static mt_status_t write_optimizer(eng_ckpt_dir_t *tx, const eng_train_state_save_t *s, mt_error_t *err) {
    eng_model_t *m = eng_exec_model(s->exec);
    /* a checkpoint never holds state a resume would refuse (one more read of the moments) */
    mt_status_t cst = eng_exec_check_optim_state(s->exec, err);
    if (cst != MT_OK) return mt_error_prefix(err, "not saving %s: ", ENG_OPTIM_STATE_FILE);
    const int P = m->num_params; /* a LoRA run's adapter factors too */
    const bool keep_master = s->save_dtype != MT_F32;
    /* up to 6 tensors per parameter: step, exp_avg, exp_avg_sq (and 8-bit: their absmax), master */
    eng_st_write_tensor_t *w = calloc((size_t)P * 6 + 1, sizeof *w);
    optim_fill_t *fills = calloc((size_t)P * 6 + 1, sizeof *fills);
    eng_st_fill_t *fill_of = calloc((size_t)P * 6 + 1, sizeof *fill_of);
    char **names = calloc((size_t)P * 6 + 1, sizeof *names);
    int64_t *steps = calloc((size_t)P + 1, sizeof *steps), *nblocks = calloc((size_t)P + 1, sizeof *nblocks);
    void **raw8 = calloc((size_t)P + 1, sizeof *raw8);
    MT_CHECK(w && fills && fill_of && names && steps && nblocks && raw8, "out of memory preparing %s",
             ENG_OPTIM_STATE_FILE);
    int nw = 0;
    static const int64_t no_shape[1] = {0};
    static const char *const sfx[4] = {".step", ".exp_avg", ".exp_avg_sq", ".master"};
    for (int i = 0; i < P; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->frozen) continue;
        const eng_param_spec_t *ps = p->spec;
        steps[i] = eng_model_optim_step_count(m, i);
        const bool q8 = p->mom_fmt == KERN_MOMENTS_8BIT;
        for (int k = 0; k < 4; k++) {
            /* a parameter never stepped has no moments (torch creates them lazily) */
            if ((k == 1 || k == 2) && steps[i] == 0) continue;
            if (k == 1 && q8) {
                raw8[i] = malloc(eng_param_moments_bytes(p));
                MT_CHECK_ALLOC(raw8[i], "8-bit optimizer state");
                eng_exec_read_optim_state(s->exec, i, NULL, raw8[i]);
                nblocks[i] = (int64_t)kern_moments_blocks(ps->numel);
                nw += add_8bit_tensors(&w[nw], &names[nw], p, raw8[i], &nblocks[i]);
            }
            if ((k == 1 || k == 2) && q8) continue;
            if (k == 3 && !keep_master) continue;
            size_t len = strlen(ps->name) + strlen(sfx[k]) + 1;
            names[nw] = malloc(len);
            MT_CHECK_ALLOC(names[nw], "tensor name");
            snprintf(names[nw], len, "%s%s", ps->name, sfx[k]);
            if (k == 0) {
                w[nw] = (eng_st_write_tensor_t){.name = names[nw], .dtype = ENG_ST_I64, .ndim = 0,
                                                .shape = no_shape, .data = &steps[i]};
            } else {
                fills[nw] = (optim_fill_t){.x = s->exec, .param = i, .what = k};
                fill_of[nw] = (eng_st_fill_t){.fn = fill_optim, .ctx = &fills[nw]};
                const bool bf16 = k != 3 && p->mom_fmt == KERN_MOMENTS_BF16;
                w[nw] = (eng_st_write_tensor_t){.name = names[nw], .dtype = bf16 ? ENG_ST_BF16 : ENG_ST_F32,
                                                .ndim = ps->ndim, .shape = ps->shape};
            }
            nw++;
        }
    }
    const char *meta[] = {"format", "pt", ENG_CKPT_SAVE_ID_KEY, tx->save_id, ENG_OPTIM_FORMAT_KEY,
                          kern_moments_fmt_name(run_moments_fmt(m))};
    char *path = eng_ckpt_dir_path(tx, ENG_OPTIM_STATE_FILE);
    mt_status_t st = eng_st_write_filled(path, w, fill_of, nw, meta, 3, err);
    free(path);
    if (st == MT_OK) eng_ckpt_dir_add(tx, ENG_OPTIM_STATE_FILE);
    for (int i = 0; i < nw; i++) free(names[i]);
    for (int i = 0; i < P; i++) free(raw8[i]);
    free(raw8);
    free(nblocks);
    free(names);
    free(fills);
    free(fill_of);
    free(steps);
    free(w);
    return st;
}

static mt_status_t write_trainer_state(eng_ckpt_dir_t *tx, const eng_train_state_save_t *s, mt_error_t *err) {
    const eng_loader_t *ld = s->loader;
    const int64_t per_epoch = eng_loader_batches_per_epoch(ld);
    json_t *hist = json_array();
    for (int i = 0; i < s->ts->log_count; i++) {
        const eng_log_entry_t *e = &s->ts->log[i];
        if (e->eval) { /* HF Trainer's evaluation entry, as its tooling reads it */
            json_t *o = json_object();
            static const char *const keys[] = {"eval_loss", "eval_runtime", "eval_samples_per_second",
                                               "eval_steps_per_second", "epoch"};
            const double vals[] = {e->eval_loss, e->eval_runtime, e->eval_samples_per_s, e->eval_steps_per_s,
                                   e->epoch};
            for (size_t k = 0; k < sizeof keys / sizeof keys[0]; k++) /* NaN is not JSON: null */
                json_object_set_new(o, keys[k], isfinite(vals[k]) ? json_real(vals[k]) : json_null());
            json_object_set_new(o, "step", json_integer(e->step));
            json_array_append_new(hist, o);
            continue;
        }
        json_t *o = json_pack("{s:i, s:f, s:f, s:f}", "step", e->step, "loss", e->loss, "learning_rate", e->lr,
                              "grad_norm", e->grad_norm);
        /* NaN is not JSON: a skipped step's values are recorded as null */
        if (!o) o = json_pack("{s:i, s:n, s:n, s:n}", "step", e->step, "loss", "learning_rate", "grad_norm");
        if (e->skipped) json_object_set_new(o, "skipped", json_true());
        json_array_append_new(hist, o);
    }
    const double micro_done = (double)s->ts->global_step * s->rc->gradient_accumulation_steps;
    json_t *root = json_pack(
        "{s:i, s:f, s:i, s:i, s:{s:i, s:I, s:I, s:b, s:I, s:i}, s:s, s:o, s:o, s:o, s:o}", "global_step",
        s->ts->global_step, "epoch", per_epoch > 0 ? micro_done / (double)per_epoch : 0.0, "max_steps",
        s->total_steps, "nonfinite_steps_skipped", s->ts->nonfinite_skipped, "data", "epoch", ld->epoch, "cursor",
        (json_int_t)ld->cursor, "rows", (json_int_t)ld->ds->num_rows, "shuffle", ld->shuffle, "seed",
        (json_int_t)ld->seed, "micro_batch_size", ld->micro_batch, "optimizer_file", ENG_OPTIM_STATE_FILE,
        "params", params_json(eng_exec_model(s->exec)), "adapter", adapter_json(s->rc), "hyperparameters", hparams_json(s->rc),
        "log_history", hist);
    MT_CHECK(root, "building %s", ENG_TRAINER_STATE_FILE);
    char *text = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
    json_decref(root);
    MT_CHECK_ALLOC(text, ENG_TRAINER_STATE_FILE);
    char *path = eng_ckpt_dir_path(tx, ENG_TRAINER_STATE_FILE);
    mt_status_t st = eng_write_file_atomic(path, text, strlen(text), err);
    free(path);
    free(text);
    if (st == MT_OK) eng_ckpt_dir_add(tx, ENG_TRAINER_STATE_FILE);
    return st;
}

mt_status_t eng_train_state_write(eng_ckpt_dir_t *tx, void *ctx, mt_error_t *err) {
    const eng_train_state_save_t *s = ctx;
    mt_status_t st = write_optimizer(tx, s, err);
    if (st == MT_OK) st = write_trainer_state(tx, s, err);
    return st;
}

bool eng_train_state_save_due(const eng_run_config_t *rc, int done, int total, int64_t steps_per_epoch) {
    if (done >= total) return false;
    eng_save_strategy_t s = rc->save_strategy;
    if (s == ENG_SAVE_STRATEGY_AUTO) s = rc->save_steps > 0 ? ENG_SAVE_STRATEGY_STEPS : ENG_SAVE_STRATEGY_NO;
    if (s == ENG_SAVE_STRATEGY_STEPS) return rc->save_steps > 0 && done % rc->save_steps == 0;
    if (s == ENG_SAVE_STRATEGY_EPOCH) return steps_per_epoch > 0 && done % steps_per_epoch == 0;
    return false;
}

mt_status_t eng_train_state_checkpoint(const eng_train_state_save_t *ss, int n, char *last, size_t cap,
                                       mt_error_t *err) {
    const eng_run_config_t *rc = ss->rc;
    char path[2048];
    snprintf(path, sizeof path, "%s/checkpoint-%d", rc->output_dir, n);
    mt_status_t st = eng_train_save_with(ss->exec, rc, path, ENG_CKPT_DIR_SWAP, ss->save_dtype,
                                         eng_train_state_write, (void *)ss, err);
    if (st != MT_OK) {
        /* the save was atomic: what was there before is as it was */
        mt_error_prefix(err, "saving checkpoint-%d (%s%s): ", n,
                        last[0] ? "the last complete checkpoint, intact, is " : "no earlier checkpoint", last);
        return st;
    }
    snprintf(last, cap, "%s", path);
    eng_train_state_prune(rc->output_dir, rc->save_total_limit, n);
    return MT_OK;
}

/* ---- finding the checkpoint --------------------------------------------- */

static bool checkpoint_number(const char *name, int *n) {
    if (strncmp(name, "checkpoint-", 11) != 0 || !name[11]) return false;
    char *end;
    errno = 0;
    long v = strtol(name + 11, &end, 10);
    if (*end || errno || v < 0 || v > 2000000000L) return false;
    *n = (int)v;
    return true;
}

/* A checkpoint a resume can use: its manifest matches and it holds the
 * training state (an ordinary HF model directory does not). */
static bool checkpoint_complete(const char *dir, char *why, size_t cap) {
    char p[2048];
    struct stat sb;
    snprintf(p, sizeof p, "%s/%s", dir, ENG_CKPT_MANIFEST_FILE);
    if (stat(p, &sb) != 0) {
        snprintf(why, cap, "%s has no %s (its save did not finish)", dir, ENG_CKPT_MANIFEST_FILE);
        return false;
    }
    mt_error_t e = {0};
    if (eng_ckpt_dir_check(dir, &e) != MT_OK) {
        snprintf(why, cap, "%.900s", e.msg);
        return false;
    }
    snprintf(p, sizeof p, "%s/%s", dir, ENG_TRAINER_STATE_FILE);
    if (stat(p, &sb) != 0) {
        snprintf(why, cap, "%s has no %s (a model without training state)", dir, ENG_TRAINER_STATE_FILE);
        return false;
    }
    return true;
}

typedef struct {
    int n;
    bool complete;
} ckpt_entry_t;

static int by_n(const void *a, const void *b) {
    const ckpt_entry_t *x = a, *y = b;
    return (x->n > y->n) - (x->n < y->n);
}

/* checkpoint-N directories of dir sorted by N; incomplete ones warned about when warn. */
static int list_checkpoints(const char *dir, ckpt_entry_t **out, bool warn) {
    *out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        int n;
        if (!checkpoint_number(de->d_name, &n)) continue;
        char p[2048], why[1024];
        snprintf(p, sizeof p, "%s/%s", dir, de->d_name);
        struct stat sb;
        if (stat(p, &sb) != 0 || !S_ISDIR(sb.st_mode)) continue;
        const bool ok = checkpoint_complete(p, why, sizeof why);
        if (!ok && warn) fprintf(stderr, "moetune: warning: skipping incomplete checkpoint %s: %s\n", p, why);
        if (count == cap) {
            cap = cap ? cap * 2 : 16;
            ckpt_entry_t *e = realloc(*out, (size_t)cap * sizeof *e);
            MT_CHECK_ALLOC(e, "checkpoint list");
            *out = e;
        }
        (*out)[count++] = (ckpt_entry_t){n, ok};
    }
    closedir(d);
    if (count > 1) qsort(*out, (size_t)count, sizeof **out, by_n);
    return count;
}

mt_status_t eng_train_state_resolve(const eng_run_config_t *rc, char *out, size_t cap, mt_error_t *err) {
    out[0] = '\0';
    const eng_resume_t *r = &rc->resume_from_checkpoint;
    char why[1024];
    if (r->path[0]) {
        if (!checkpoint_complete(r->path, why, sizeof why))
            return mt_error_set(err, MT_ERR_CONFIG, "%s: resume_from_checkpoint '%s' cannot be resumed from: %s",
                                rc->source_path, r->path, why);
        snprintf(out, cap, "%s", r->path);
        return MT_OK;
    }
    if (!r->latest) return MT_OK;
    ckpt_entry_t *list;
    const int count = list_checkpoints(rc->output_dir, &list, true);
    int best = -1;
    for (int i = 0; i < count; i++)
        if (list[i].complete) best = list[i].n;
    free(list);
    if (best < 0)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: resume_from_checkpoint: true, but output_dir '%s' holds no complete "
                            "checkpoint-N (%d checkpoint director%s found); remove the key to start afresh",
                            rc->source_path, rc->output_dir, count, count == 1 ? "y" : "ies");
    snprintf(out, cap, "%s/checkpoint-%d", rc->output_dir, best);
    return MT_OK;
}

/* ---- loading ------------------------------------------------------------ */

static mt_status_t check_identity(const char *path, json_t *root, const eng_model_t *m, const eng_run_config_t *rc,
                                  const eng_loader_t *ld, mt_error_t *err) {
    json_t *params = json_object_get(root, "params");
    if (!json_is_array(params))
        return mt_error_set(err, MT_ERR_FORMAT, "%s: no params list", path);
    json_t *mine = params_json(m);
    const size_t n_saved = json_array_size(params), n_mine = json_array_size(mine);
    mt_status_t st = MT_OK;
    for (size_t i = 0; i < n_saved || i < n_mine; i++) {
        json_t *a = json_array_get(params, i), *b = json_array_get(mine, i);
        if (a && b && json_equal(a, b)) continue;
        char *da = a ? json_dumps(a, JSON_COMPACT) : strdup("nothing");
        char *db = b ? json_dumps(b, JSON_COMPACT) : strdup("nothing");
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s: base_model '%s' does not match the checkpoint being resumed (%s): parameter %zu is "
                          "%.300s in the checkpoint but %.300s in this run's model; resume with the base_model "
                          "and model_config the checkpoint was trained with",
                          rc->source_path, rc->base_model, path, i, da ? da : "?", db ? db : "?");
        free(da);
        free(db);
        break;
    }
    json_decref(mine);
    if (st != MT_OK) return st;
    json_t *ad = adapter_json(rc);
    const bool same_adapter = json_equal(ad, json_object_get(root, "adapter"));
    json_decref(ad);
    if (!same_adapter) {
        char *saved = json_dumps(json_object_get(root, "adapter"), JSON_COMPACT);
        st = mt_error_set(err, MT_ERR_CONFIG,
                          "%s: adapter settings (adapter, lora_r, lora_alpha, lora_target_modules) differ from "
                          "the checkpoint being resumed (%s: %.300s)",
                          rc->source_path, path, saved ? saved : "?");
        free(saved);
        return st;
    }
    const json_int_t rows = json_integer_value(json_object_get(json_object_get(root, "data"), "rows"));
    if (rows != ld->ds->num_rows)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: datasets hold %lld examples but the checkpoint being resumed (%s) was trained "
                            "on %lld; its data position means nothing for other data",
                            rc->source_path, (long long)ld->ds->num_rows, path, (long long)rows);
    return MT_OK;
}

static void changed_hparams(json_t *root, const eng_run_config_t *rc, char *note, size_t cap) {
    note[0] = '\0';
    json_t *saved = json_object_get(root, "hyperparameters"), *mine = hparams_json(rc);
    const char *key;
    json_t *v;
    size_t used = 0;
    json_object_foreach(mine, key, v) {
        if (json_equal(v, json_object_get(saved, key))) continue;
        int w = snprintf(note + used, cap - used, "%s%s", used ? ", " : "", key);
        if (w < 0 || (size_t)w >= cap - used) break;
        used += (size_t)w;
    }
    json_decref(mine);
}

static mt_status_t read_tensor_f32(const eng_st_file_t *f, const char *name, const eng_param_spec_t *ps,
                                   float *dst, mt_error_t *err) {
    const eng_st_tensor_t *t = eng_st_find(f, name);
    if (!t) return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' is missing", f->path, name);
    bool shape_ok = t->numel == ps->numel && t->ndim == ps->ndim;
    for (int d = 0; shape_ok && d < t->ndim; d++) shape_ok = t->shape[d] == (uint64_t)ps->shape[d];
    if (!shape_ok) return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' has the wrong shape", f->path, name);
    return eng_st_read_f32(f, t, dst, err);
}

/* Optimizer state read back must be what a finite run writes: no NaN or
 * Inf anywhere, and exp_avg_sq (a running mean of squares) never below 0,
 * where its square root would be NaN at the next update. */
static mt_status_t check_state_values(const char *path, const char *name, const eng_param_spec_t *ps,
                                      const float *v, bool nonneg, mt_error_t *err) {
    const size_t bad = mt_first_nonfinite_f32(v, ps->numel);
    char at[160];
    if (bad != MT_ALL_FINITE) {
        mt_index_to_str(at, sizeof at, bad, ps->ndim, ps->shape);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s' holds %s at %s; expected finite values (a run never saves "
                            "non-finite optimizer state: the file was altered or damaged)",
                            path, name, mt_nonfinite_name(v[bad]), at);
    }
    for (size_t i = 0; nonneg && i < ps->numel; i++) {
        if (v[i] >= 0) continue;
        mt_index_to_str(at, sizeof at, i, ps->ndim, ps->shape);
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s' holds %g at %s; expected values >= 0 (a running mean of squared "
                            "gradients)",
                            path, name, (double)v[i], at);
    }
    return MT_OK;
}

/* NAME.step: an I64 scalar from 0 to the checkpoint's global_step (a
 * parameter is stepped at most once per optimizer step). */
static mt_status_t read_step(const eng_st_file_t *f, const char *pname, int global_step, int64_t *step,
                             mt_error_t *err) {
    char name[1200];
    snprintf(name, sizeof name, "%s.step", pname);
    const eng_st_tensor_t *t = eng_st_find(f, name);
    if (!t || t->dtype != ENG_ST_I64 || t->numel != 1)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' (an I64 scalar) is missing", f->path, name);
    memcpy(step, t->data, sizeof *step);
    if (*step < 0 || *step > global_step)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: tensor '%s' is %lld; expected a step count from 0 to the checkpoint's "
                            "global_step %d",
                            f->path, name, (long long)*step, global_step);
    return MT_OK;
}

/* An 8-bit moment's codes (NAME.exp_avg or NAME.exp_avg_sq, U8 of the
 * parameter's shape) and scales (NAME.<moment>.absmax, F32 per block,
 * finite and >= 0) into codes and absmax. */
static mt_status_t read_8bit_moment(const eng_st_file_t *f, const eng_param_spec_t *ps, const char *sfx,
                                    uint8_t *codes, float *absmax, mt_error_t *err) {
    char name[1200];
    snprintf(name, sizeof name, "%s%s", ps->name, sfx);
    const eng_st_tensor_t *t = eng_st_find(f, name);
    if (!t || t->dtype != ENG_ST_U8 || t->numel != ps->numel)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' (U8 codes of %zu elements, optimizer_state 8bit) is %s",
                            f->path, name, ps->numel, t ? "of another dtype or size" : "missing");
    memcpy(codes, t->data, ps->numel);
    const size_t nb = kern_moments_blocks(ps->numel);
    snprintf(name, sizeof name, "%s%s.absmax", ps->name, sfx);
    t = eng_st_find(f, name);
    if (!t || t->dtype != ENG_ST_F32 || t->numel != nb)
        return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' (F32, one per 256 elements: %zu) is %s", f->path,
                            name, nb, t ? "of another dtype or size" : "missing");
    memcpy(absmax, t->data, nb * sizeof(float));
    for (size_t b = 0; b < nb; b++)
        if (!isfinite(absmax[b]) || absmax[b] < 0)
            return mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' holds %g at [%zu]; expected finite values >= 0",
                                f->path, name, (double)absmax[b], b);
    return MT_OK;
}

/* NAME.exp_avg and NAME.exp_avg_sq of a parameter stepped at least once,
 * into raw in the parameter's moment format (m1, m2: fp32 scratch). */
static mt_status_t read_moments(const eng_st_file_t *f, const eng_param_t *p, void *raw, float *m1, float *m2,
                                mt_error_t *err) {
    const eng_param_spec_t *ps = p->spec;
    const kern_moments_t mv = eng_param_moments_view(p, raw);
    if (p->mom_fmt == KERN_MOMENTS_8BIT) {
        mt_status_t st = read_8bit_moment(f, ps, ".exp_avg", mv.m, mv.m_absmax, err);
        return st == MT_OK ? read_8bit_moment(f, ps, ".exp_avg_sq", mv.v, mv.v_absmax, err) : st;
    }
    char name[1200];
    snprintf(name, sizeof name, "%s.exp_avg", ps->name);
    mt_status_t st = read_tensor_f32(f, name, ps, m1, err);
    if (st == MT_OK) st = check_state_values(f->path, name, ps, m1, false, err);
    snprintf(name, sizeof name, "%s.exp_avg_sq", ps->name);
    if (st == MT_OK) st = read_tensor_f32(f, name, ps, m2, err);
    if (st == MT_OK) st = check_state_values(f->path, name, ps, m2, true, err);
    /* exact: the file holds values of the format (bf16 rounds bf16 values to themselves) */
    if (st == MT_OK) kern_moments_from_f32(&mv, ps->numel, m1, m2);
    return st;
}

/* The file's moment format (its metadata) against the run's. */
static mt_status_t check_moments_fmt(const eng_st_file_t *f, const eng_model_t *m, mt_error_t *err) {
    const char *saved = eng_st_metadata_get(f, ENG_OPTIM_FORMAT_KEY);
    if (!saved) saved = kern_moments_fmt_name(KERN_MOMENTS_F32);
    const char *run = kern_moments_fmt_name(run_moments_fmt(m));
    if (strcmp(saved, run) == 0) return MT_OK;
    return mt_error_set(err, MT_ERR_CONFIG,
                        "%s holds AdamW moments in %s (metadata %s); this run has optimizer_state: %s. Resume with "
                        "optimizer_state: %s (moments are not converted between formats)",
                        f->path, saved, ENG_OPTIM_FORMAT_KEY, run, saved);
}

typedef struct {
    const char *dir;
    eng_exec_t *x;
    eng_st_file_t f;
    eng_checkpoint_t ck;
    bool ck_open;
} optim_src_t;

/* Parameter i's fp32 master: NAME.master, else a LoRA run's adapter (the
 * model was opened from it), else the checkpoint's own fp32 tensor. */
static mt_status_t read_master(optim_src_t *s, int i, float *master, mt_error_t *err) {
    const eng_model_t *m = eng_exec_model(s->x);
    const eng_param_spec_t *ps = m->params[i].spec;
    char name[1200];
    snprintf(name, sizeof name, "%s.master", ps->name);
    if (eng_st_find(&s->f, name)) {
        mt_status_t st = read_tensor_f32(&s->f, name, ps, master, err);
        return st == MT_OK ? check_state_values(s->f.path, name, ps, master, false, err) : st;
    }
    if (m->lora.on) { /* lora_model_dir = the checkpoint: its weights are the masters already */
        eng_exec_read_param(s->x, i, master, false);
        return MT_OK;
    }
    /* the model's own weights are the master when they were saved in fp32
     * (and were checked for NaN and Inf as they loaded) */
    if (!s->ck_open) {
        mt_status_t st = eng_checkpoint_open(s->dir, &s->ck, err);
        if (st != MT_OK) return st;
        s->ck_open = true;
    }
    const eng_ckpt_entry_t *e = eng_checkpoint_find(&s->ck, ps->name);
    if (!e || e->tensor->dtype != ENG_ST_F32)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: no fp32 master for '%s': %s holds no '%s.master' and the model's tensor is %s",
                            s->dir, ps->name, ENG_OPTIM_STATE_FILE, ps->name,
                            e ? eng_st_dtype_name(e->tensor->dtype) : "missing");
    return eng_checkpoint_read_f32(&s->ck, ps->name, ps->ndim, ps->shape, master, err);
}

static mt_status_t load_optimizer(const char *dir, eng_exec_t *x, int global_step, mt_error_t *err) {
    const eng_model_t *m = eng_exec_model(x);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, ENG_OPTIM_STATE_FILE);
    optim_src_t s = {.dir = dir, .x = x};
    mt_status_t st = eng_st_open(path, &s.f, err);
    if (st != MT_OK) return st;
    size_t max_numel = 1, max_bytes = 1;
    for (int i = 0; i < m->num_params; i++) {
        if (m->params[i].spec->numel > max_numel) max_numel = m->params[i].spec->numel;
        if (eng_param_moments_bytes(&m->params[i]) > max_bytes) max_bytes = eng_param_moments_bytes(&m->params[i]);
    }
    float *master = malloc(max_numel * sizeof(float)), *m1 = malloc(max_numel * sizeof(float)),
          *m2 = malloc(max_numel * sizeof(float));
    void *raw = malloc(max_bytes);
    MT_CHECK(master && m1 && m2 && raw, "out of memory loading %s", path);
    st = check_moments_fmt(&s.f, m, err);
    for (int i = 0; i < m->num_params && st == MT_OK; i++) {
        if (m->params[i].frozen) continue;
        const eng_param_spec_t *ps = m->params[i].spec;
        int64_t step = 0;
        st = read_step(&s.f, ps->name, global_step, &step, err);
        if (st == MT_OK && step > 0) st = read_moments(&s.f, &m->params[i], raw, m1, m2, err);
        if (st == MT_OK) st = read_master(&s, i, master, err);
        if (st == MT_OK) st = eng_exec_write_optim_state(x, i, master, raw, step, err);
    }
    free(raw);
    if (s.ck_open) eng_checkpoint_close(&s.ck);
    eng_st_close(&s.f);
    free(master);
    free(m1);
    free(m2);
    return st;
}

/* The loader at the saved position and the log history into ts. */
static mt_status_t apply_doc(const char *path, const eng_state_doc_t *doc, eng_loader_t *ld, eng_train_state_t *ts,
                             mt_error_t *err) {
    if (!eng_loader_seek(ld, (int)doc->epoch, doc->cursor))
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: keys 'data.epoch' %lld and 'data.cursor' %lld are not a position in this data",
                            path, (long long)doc->epoch, (long long)doc->cursor);
    ts->global_step = doc->global_step;
    ts->nonfinite_skipped = doc->nonfinite_skipped;
    for (int i = 0; i < doc->log_count; i++) {
        const eng_state_log_t *e = &doc->log[i];
        eng_train_state_log(ts, &(eng_log_entry_t){.step = e->step, .loss = e->loss, .lr = e->lr,
                                                   .grad_norm = e->grad_norm, .skipped = e->skipped,
                                                   .eval = e->eval, .eval_loss = e->eval_loss,
                                                   .eval_runtime = e->eval_runtime,
                                                   .eval_samples_per_s = e->eval_samples_per_s,
                                                   .eval_steps_per_s = e->eval_steps_per_s, .epoch = e->epoch});
    }
    return MT_OK;
}

mt_status_t eng_train_state_load(const char *dir, eng_exec_t *x, const eng_run_config_t *rc, eng_loader_t *ld,
                                 eng_train_state_t *ts, char *note, size_t note_cap, mt_error_t *err) {
    const eng_model_t *m = eng_exec_model(x);
    note[0] = '\0';
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, ENG_TRAINER_STATE_FILE);
    char *text = NULL;
    size_t len = 0;
    mt_status_t st = mt_read_regular_file(path, ENG_TRAINER_STATE_FILE, (size_t)1 << 30, &text, &len, err);
    if (st != MT_OK) return st;
    eng_state_doc_t doc;
    st = eng_state_doc_parse(path, text, len, eng_state_dir_number(dir), &doc, err);
    free(text);
    if (st != MT_OK) return st;
    st = check_identity(path, doc.root, m, rc, ld, err);
    if (st == MT_OK) st = load_optimizer(dir, x, doc.global_step, err);
    if (st == MT_OK) st = apply_doc(path, &doc, ld, ts, err);
    if (st == MT_OK) changed_hparams(doc.root, rc, note, note_cap);
    eng_state_doc_free(&doc);
    return st;
}

/* ---- save_total_limit --------------------------------------------------- */

static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    remove(p); /* keep going: what remains is reported by the caller */
    return 0;
}

void eng_train_state_prune(const char *output_dir, int limit, int keep_n) {
    if (limit <= 0) return;
    ckpt_entry_t *list;
    const int count = list_checkpoints(output_dir, &list, false);
    int complete = 0;
    for (int i = 0; i < count; i++) complete += list[i].complete;
    for (int i = 0; i < count && complete > limit; i++) {
        if (!list[i].complete || list[i].n == keep_n) continue;
        char p[2048];
        snprintf(p, sizeof p, "%s/checkpoint-%d", output_dir, list[i].n);
        /* the manifest goes first: a deletion cut short leaves an incomplete
           checkpoint that resume skips, never a mixed one it would load */
        char man[2100];
        snprintf(man, sizeof man, "%s/%s", p, ENG_CKPT_MANIFEST_FILE);
        remove(man);
        nftw(p, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
        struct stat sb;
        if (stat(p, &sb) == 0) fprintf(stderr, "moetune: warning: could not delete all of %s (save_total_limit)\n", p);
        else fprintf(stderr, "moetune: deleted %s (save_total_limit: %d)\n", p, limit);
        complete--;
    }
    free(list);
}
