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
#include "base/fileio.h"

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
    eng_exec_read_optim_state(f->x, f->param, f->what == 3 ? dst : NULL, f->what == 1 ? dst : NULL,
                               f->what == 2 ? dst : NULL);
}

static mt_status_t write_optimizer(eng_ckpt_dir_t *tx, const eng_train_state_save_t *s, mt_error_t *err) {
    eng_model_t *m = eng_exec_model(s->exec);
    const int P = m->num_params; /* a LoRA run's adapter factors too */
    const bool keep_master = s->save_dtype != MT_F32;
    /* up to 4 tensors per parameter: step, exp_avg, exp_avg_sq, master */
    eng_st_write_tensor_t *w = calloc((size_t)P * 4 + 1, sizeof *w);
    optim_fill_t *fills = calloc((size_t)P * 4 + 1, sizeof *fills);
    eng_st_fill_t *fill_of = calloc((size_t)P * 4 + 1, sizeof *fill_of);
    char **names = calloc((size_t)P * 4 + 1, sizeof *names);
    int64_t *steps = calloc((size_t)P + 1, sizeof *steps);
    MT_CHECK(w && fills && fill_of && names && steps, "out of memory preparing %s", ENG_OPTIM_STATE_FILE);
    int nw = 0;
    static const int64_t no_shape[1] = {0};
    static const char *const sfx[4] = {".step", ".exp_avg", ".exp_avg_sq", ".master"};
    for (int i = 0; i < P; i++) {
        const eng_param_t *p = &m->params[i];
        if (p->frozen) continue;
        const eng_param_spec_t *ps = p->spec;
        steps[i] = eng_model_optim_step_count(m, i);
        for (int k = 0; k < 4; k++) {
            /* a parameter never stepped has no moments (torch creates them lazily) */
            if ((k == 1 || k == 2) && steps[i] == 0) continue;
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
                w[nw] = (eng_st_write_tensor_t){.name = names[nw], .dtype = ENG_ST_F32, .ndim = ps->ndim,
                                                .shape = ps->shape};
            }
            nw++;
        }
    }
    const char *meta[] = {"format", "pt", ENG_CKPT_SAVE_ID_KEY, tx->save_id};
    char *path = eng_ckpt_dir_path(tx, ENG_OPTIM_STATE_FILE);
    mt_status_t st = eng_st_write_filled(path, w, fill_of, nw, meta, 2, err);
    free(path);
    if (st == MT_OK) eng_ckpt_dir_add(tx, ENG_OPTIM_STATE_FILE);
    for (int i = 0; i < nw; i++) free(names[i]);
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

static mt_status_t load_optimizer(const char *dir, eng_exec_t *x, mt_error_t *err) {
    const eng_model_t *m = eng_exec_model(x);
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, ENG_OPTIM_STATE_FILE);
    eng_st_file_t f;
    mt_status_t st = eng_st_open(path, &f, err);
    if (st != MT_OK) return st;
    eng_checkpoint_t ck;
    bool ck_open = false;
    size_t max_numel = 1;
    for (int i = 0; i < m->num_params; i++)
        if (m->params[i].spec->numel > max_numel) max_numel = m->params[i].spec->numel;
    float *master = malloc(max_numel * sizeof(float)), *m1 = malloc(max_numel * sizeof(float)),
          *m2 = malloc(max_numel * sizeof(float));
    MT_CHECK(master && m1 && m2, "out of memory loading %s", path);
    char name[1200];
    for (int i = 0; i < m->num_params && st == MT_OK; i++) {
        if (m->params[i].frozen) continue;
        const eng_param_spec_t *ps = m->params[i].spec;
        snprintf(name, sizeof name, "%s.step", ps->name);
        const eng_st_tensor_t *t = eng_st_find(&f, name);
        if (!t || t->dtype != ENG_ST_I64 || t->numel != 1) {
            st = mt_error_set(err, MT_ERR_FORMAT, "%s: tensor '%s' (an I64 scalar) is missing", path, name);
            break;
        }
        int64_t step;
        memcpy(&step, t->data, sizeof step);
        if (step > 0) {
            snprintf(name, sizeof name, "%s.exp_avg", ps->name);
            st = read_tensor_f32(&f, name, ps, m1, err);
            snprintf(name, sizeof name, "%s.exp_avg_sq", ps->name);
            if (st == MT_OK) st = read_tensor_f32(&f, name, ps, m2, err);
        }
        snprintf(name, sizeof name, "%s.master", ps->name);
        if (st == MT_OK && eng_st_find(&f, name)) {
            st = read_tensor_f32(&f, name, ps, master, err);
        } else if (st == MT_OK && m->lora.on) {
            /* a LoRA checkpoint's adapter file (fp32) is what the model was
             * opened from (lora_model_dir = the checkpoint): its weights are
             * the masters already */
            eng_exec_read_param(x, i, master, false);
        } else if (st == MT_OK) {
            /* the model's own weights are the master when they were saved in fp32 */
            if (!ck_open) {
                st = eng_checkpoint_open(dir, &ck, err);
                ck_open = st == MT_OK;
            }
            const eng_ckpt_entry_t *e = ck_open ? eng_checkpoint_find(&ck, ps->name) : NULL;
            if (st == MT_OK && (!e || e->tensor->dtype != ENG_ST_F32))
                st = mt_error_set(err, MT_ERR_FORMAT,
                                  "%s: no fp32 master for '%s': %s holds no '%s.master' and the model's tensor is %s",
                                  dir, ps->name, ENG_OPTIM_STATE_FILE, ps->name,
                                  e ? eng_st_dtype_name(e->tensor->dtype) : "missing");
            if (st == MT_OK) st = eng_checkpoint_read_f32(&ck, ps->name, ps->ndim, ps->shape, master, err);
        }
        if (st == MT_OK) st = eng_exec_write_optim_state(x, i, master, m1, m2, step, err);
    }
    if (ck_open) eng_checkpoint_close(&ck);
    eng_st_close(&f);
    free(master);
    free(m1);
    free(m2);
    return st;
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
    json_error_t je;
    json_t *root = json_loadb(text, len, 0, &je);
    free(text);
    if (!json_is_object(root)) {
        json_decref(root);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: not a JSON object (line %d: %s)", path, je.line, je.text);
    }
    st = check_identity(path, root, m, rc, ld, err);
    json_t *data = json_object_get(root, "data");
    const json_int_t gstep = json_integer_value(json_object_get(root, "global_step"));
    const json_int_t epoch = json_integer_value(json_object_get(data, "epoch"));
    const json_int_t cursor = json_integer_value(json_object_get(data, "cursor"));
    if (st == MT_OK && (gstep < 0 || gstep > 2000000000 || epoch < 0 || epoch > 2000000000 ||
                        !eng_loader_seek(ld, (int)epoch, (int64_t)cursor)))
        st = mt_error_set(err, MT_ERR_FORMAT, "%s: global_step or the data position (epoch, cursor) is out of range",
                          path);
    if (st == MT_OK) st = load_optimizer(dir, x, err);
    if (st == MT_OK) {
        ts->global_step = (int)gstep;
        ts->nonfinite_skipped = (int)json_integer_value(json_object_get(root, "nonfinite_steps_skipped"));
        json_t *hist = json_object_get(root, "log_history");
        size_t i;
        json_t *e;
        json_array_foreach(hist, i, e) {
            eng_log_entry_t le = {
                .step = (int)json_integer_value(json_object_get(e, "step")),
                .loss = json_is_number(json_object_get(e, "loss")) ? json_number_value(json_object_get(e, "loss")) : NAN,
                .lr = json_number_value(json_object_get(e, "learning_rate")),
                .grad_norm = json_number_value(json_object_get(e, "grad_norm")),
                .skipped = json_is_true(json_object_get(e, "skipped"))};
            eng_train_state_log(ts, &le);
        }
        changed_hparams(root, rc, note, note_cap);
    }
    json_decref(root);
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
