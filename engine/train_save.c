/* A run's outputs: which paths it may write and how its model is saved.
 *
 * Where the final model goes: into output_dir itself (model.safetensors or
 * shards + index, config.json, moetune_complete.json), beside metrics.jsonl,
 * because that is the layout users, the quick start and CI already read and
 * what `save_pretrained(output_dir)` gives.  Such a directory holds other
 * files, so it cannot be swapped whole; the files are merged in
 * (ENG_CKPT_DIR_MERGE) and readers rely on the completion manifest and the
 * save ids rather than on one rename.  checkpoint-N directories belong to
 * their checkpoint alone and are swapped whole (ENG_CKPT_DIR_SWAP). */
#include "engine/train_save.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "engine/checkpoint.h"
#include "engine/exec.h"

mt_status_t eng_run_check_paths(const eng_run_config_t *rc, mt_error_t *err) {
    mt_status_t st = eng_outdir_check_apart(rc->source_path, "output_dir", rc->output_dir, "base_model",
                                            rc->base_model, err);
    char key[64];
    for (int i = 0; i < rc->num_datasets && st == MT_OK; i++) {
        snprintf(key, sizeof key, "datasets[%d].path", i);
        st = eng_outdir_check_apart(rc->source_path, "output_dir", rc->output_dir, key, rc->datasets[i].path,
                                    err);
    }
    return st;
}

char *eng_saved_config_json(const char *base_text, const char *overrides_json, mt_dtype_t dtype,
                            const char *source, mt_error_t *err) {
    json_error_t je;
    json_t *root = json_loads(base_text, 0, &je);
    if (!json_is_object(root)) {
        json_decref(root);
        mt_error_set(err, MT_ERR_CONFIG, "base model config.json: not a JSON object (%s)", je.text);
        return NULL;
    }
    if (overrides_json) {
        json_t *ov = json_loads(overrides_json, 0, &je);
        if (!json_is_object(ov)) {
            json_decref(ov);
            json_decref(root);
            mt_error_set(err, MT_ERR_CONFIG, "%s: model_config: not a JSON object", source);
            return NULL;
        }
        json_object_update(root, ov); /* the same merge the loader made before training */
        json_decref(ov);
    }
    const char *name = dtype == MT_BF16 ? "bfloat16" : dtype == MT_F16 ? "float16" : "float32";
    json_object_set_new(root, "torch_dtype", json_string(name));
    json_object_set_new(root, "dtype", json_string(name)); /* transformers >= 5 reads this key */
    char *text = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
    json_decref(root);
    MT_CHECK_ALLOC(text, "config.json");
    size_t len = strlen(text);
    char *out = realloc(text, len + 2);
    MT_CHECK_ALLOC(out, "config.json");
    memcpy(out + len, "\n", 2);
    return out;
}

mt_status_t eng_train_save(eng_model_t *m, const eng_run_config_t *rc, const char *dir,
                           eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, mt_error_t *err) {
    return eng_train_save_with(m, rc, dir, mode, dtype, NULL, NULL, err);
}

mt_status_t eng_train_save_with(eng_model_t *m, const eng_run_config_t *rc, const char *dir,
                                eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, eng_save_extra_fn extra, void *ctx,
                                mt_error_t *err) {
    char *config = eng_saved_config_json(m->cfg.config_json, rc->model_config_json, dtype,
                                         rc->source_path, err);
    if (!config) return err->code;
    const int n = m->spec.count;
    eng_ckpt_tensor_t *t = calloc(n ? (size_t)n : 1, sizeof *t);
    float **host = calloc(n ? (size_t)n : 1, sizeof *host);
    MT_CHECK(t && host, "out of memory preparing checkpoint");
    for (int i = 0; i < n; i++) {
        const eng_param_spec_t *ps = &m->spec.params[i];
        host[i] = malloc(ps->numel ? ps->numel * sizeof(float) : 1);
        MT_CHECK_ALLOC(host[i], ps->name);
        eng_model_read_param(m, i, host[i], false);
        t[i] = (eng_ckpt_tensor_t){.name = ps->name, .dtype = dtype,
                                   .ndim = ps->ndim, .shape = ps->shape, .data = host[i]};
    }
    eng_ckpt_dir_t tx;
    mt_status_t st = eng_ckpt_dir_begin(&tx, dir, mode, err);
    if (st == MT_OK) {
        st = eng_checkpoint_write(&tx, config, t, n, rc->save_max_shard_bytes, err);
        if (st == MT_OK && extra) st = extra(&tx, ctx, err);
        if (st == MT_OK) st = eng_ckpt_dir_commit(&tx, err);
        else eng_ckpt_dir_abort(&tx);
    }
    for (int i = 0; i < n; i++) free(host[i]);
    free(host);
    free(t);
    free(config);
    return st;
}
