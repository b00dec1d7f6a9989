/* trainer_state.json's typed reader (see state_json.h).  One small
 * function per kind of field: an integer within a range, a number or
 * null, the log_history list; each refusal names the file, the key (a
 * path such as data.cursor or log_history[3].step), the value found as
 * JSON and what was expected. */
#include "engine/run/state_json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define STATE_INT_MAX 2000000000LL

/* The value as the file spells it (compact JSON, cut short), or "nothing". */
static void show(const json_t *v, char *buf, size_t cap) {
    if (!v) {
        snprintf(buf, cap, "nothing (the key is missing)");
        return;
    }
    char *s = json_dumps(v, JSON_COMPACT | JSON_ENCODE_ANY);
    snprintf(buf, cap, "%.80s%s", s ? s : "?", s && strlen(s) > 80 ? "..." : "");
    free(s);
}

/* obj[key] as an integer in [lo, hi]; key_path names it in the message. */
static mt_status_t get_int(const char *path, const json_t *obj, const char *key, const char *key_path, long long lo,
                           long long hi, long long *out, mt_error_t *err) {
    const json_t *v = json_object_get(obj, key);
    if (json_is_integer(v) && json_integer_value(v) >= lo && json_integer_value(v) <= hi) {
        *out = json_integer_value(v);
        return MT_OK;
    }
    char got[128];
    show(v, got, sizeof got);
    return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' is %s; expected an integer from %lld to %lld", path,
                        key_path, got, lo, hi);
}

/* obj[key] as a number, NaN for null or absent (a skipped step's values). */
static mt_status_t get_number_or_null(const char *path, const json_t *obj, const char *key, const char *key_path,
                                      double *out, mt_error_t *err) {
    const json_t *v = json_object_get(obj, key);
    if (!v || json_is_null(v)) {
        *out = NAN;
        return MT_OK;
    }
    if (json_is_number(v)) {
        *out = json_number_value(v);
        return MT_OK;
    }
    char got[128];
    show(v, got, sizeof got);
    return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' is %s; expected a number or null", path, key_path, got);
}

/* One log_history entry: an object with an integer step in [1, global_step]. */
static mt_status_t read_log_entry(const char *path, const json_t *e, size_t i, int global_step, eng_state_log_t *out,
                                  mt_error_t *err) {
    char key[64];
    snprintf(key, sizeof key, "log_history[%zu]", i);
    if (!json_is_object(e)) {
        char got[128];
        show(e, got, sizeof got);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key '%s' is %s; expected an object", path, key, got);
    }
    char sub[96];
    long long step;
    snprintf(sub, sizeof sub, "%s.step", key);
    mt_status_t st = get_int(path, e, "step", sub, 1, global_step, &step, err);
    out->step = (int)step;
    if (json_object_get(e, "eval_loss")) { /* an evaluation's entry */
        out->eval = 1;
        out->loss = out->lr = out->grad_norm = NAN;
        static const char *const keys[] = {"eval_loss", "eval_runtime", "eval_samples_per_second",
                                           "eval_steps_per_second", "epoch"};
        double *const dst[] = {&out->eval_loss, &out->eval_runtime, &out->eval_samples_per_s,
                               &out->eval_steps_per_s, &out->epoch};
        for (size_t k = 0; k < sizeof keys / sizeof keys[0] && st == MT_OK; k++) {
            snprintf(sub, sizeof sub, "%s.%s", key, keys[k]);
            st = get_number_or_null(path, e, keys[k], sub, dst[k], err);
        }
        return st;
    }
    snprintf(sub, sizeof sub, "%s.loss", key);
    if (st == MT_OK) st = get_number_or_null(path, e, "loss", sub, &out->loss, err);
    snprintf(sub, sizeof sub, "%s.learning_rate", key);
    if (st == MT_OK) st = get_number_or_null(path, e, "learning_rate", sub, &out->lr, err);
    snprintf(sub, sizeof sub, "%s.grad_norm", key);
    if (st == MT_OK) st = get_number_or_null(path, e, "grad_norm", sub, &out->grad_norm, err);
    out->skipped = json_is_true(json_object_get(e, "skipped"));
    return st;
}

/* log_history: absent or a list of entries. */
static mt_status_t read_log(const char *path, eng_state_doc_t *doc, mt_error_t *err) {
    const json_t *hist = json_object_get(doc->root, "log_history");
    if (!hist) return MT_OK;
    if (!json_is_array(hist)) {
        char got[128];
        show(hist, got, sizeof got);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'log_history' is %s; expected a list", path, got);
    }
    const size_t n = json_array_size(hist);
    doc->log = calloc(n + 1, sizeof *doc->log);
    MT_CHECK_ALLOC(doc->log, "log_history");
    for (size_t i = 0; i < n; i++) {
        mt_status_t st = read_log_entry(path, json_array_get(hist, i), i, doc->global_step, &doc->log[i], err);
        if (st != MT_OK) return st;
        doc->log_count++;
    }
    return MT_OK;
}

/* global_step: present, an integer, and the directory's own N. */
static mt_status_t read_global_step(const char *path, eng_state_doc_t *doc, int dir_n, mt_error_t *err) {
    long long g;
    mt_status_t st = get_int(path, doc->root, "global_step", "global_step", 0, STATE_INT_MAX, &g, err);
    if (st != MT_OK) return st;
    if (dir_n >= 0 && g != dir_n)
        return mt_error_set(err, MT_ERR_FORMAT,
                            "%s: key 'global_step' is %lld; expected %d, the step its directory checkpoint-%d "
                            "was saved at",
                            path, g, dir_n, dir_n);
    doc->global_step = (int)g;
    return MT_OK;
}

/* data: the loader's position and the dataset's size. */
static mt_status_t read_data(const char *path, eng_state_doc_t *doc, mt_error_t *err) {
    const json_t *data = json_object_get(doc->root, "data");
    if (!json_is_object(data)) {
        char got[128];
        show(data, got, sizeof got);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: key 'data' is %s; expected an object", path, got);
    }
    long long v;
    mt_status_t st = get_int(path, data, "epoch", "data.epoch", 0, STATE_INT_MAX, &v, err);
    doc->epoch = v;
    if (st == MT_OK) st = get_int(path, data, "cursor", "data.cursor", 0, INT64_MAX / 2, &v, err);
    doc->cursor = v;
    if (st == MT_OK) st = get_int(path, data, "rows", "data.rows", 0, INT64_MAX / 2, &v, err);
    doc->rows = v;
    return st;
}

mt_status_t eng_state_doc_parse(const char *path, const char *text, size_t len, int dir_n, eng_state_doc_t *doc,
                                mt_error_t *err) {
    memset(doc, 0, sizeof *doc);
    json_error_t je;
    doc->root = json_loadb(text, len, 0, &je);
    if (!json_is_object(doc->root)) {
        eng_state_doc_free(doc);
        return mt_error_set(err, MT_ERR_FORMAT, "%s: not a JSON object (line %d: %s)", path, je.line, je.text);
    }
    mt_status_t st = read_global_step(path, doc, dir_n, err);
    if (st == MT_OK) st = read_data(path, doc, err);
    long long skipped = 0;
    if (st == MT_OK && json_object_get(doc->root, "nonfinite_steps_skipped"))
        st = get_int(path, doc->root, "nonfinite_steps_skipped", "nonfinite_steps_skipped", 0, doc->global_step,
                     &skipped, err);
    doc->nonfinite_skipped = (int)skipped;
    if (st == MT_OK) st = read_log(path, doc, err);
    if (st != MT_OK) eng_state_doc_free(doc);
    return st;
}

void eng_state_doc_free(eng_state_doc_t *doc) {
    json_decref(doc->root);
    free(doc->log);
    memset(doc, 0, sizeof *doc);
}

int eng_state_dir_number(const char *dir) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    size_t s = n;
    while (s > 0 && dir[s - 1] != '/') s--;
    const char *base = dir + s;
    const size_t blen = n - s;
    if (blen <= 11 || strncmp(base, "checkpoint-", 11) != 0 || blen - 11 > 10) return -1;
    long long v = 0;
    for (size_t i = 11; i < blen; i++) {
        if (base[i] < '0' || base[i] > '9') return -1;
        v = v * 10 + (base[i] - '0');
    }
    return v <= STATE_INT_MAX ? (int)v : -1;
}
