/* A run's outputs: which paths it may write and how its model is saved.
 *
 * Where the final model goes: into output_dir itself (model.safetensors or
 * shards + index, config.json, moetune_complete.json), beside metrics.jsonl,
 * because that is the layout users, the quick start and CI already read and
 * what `save_pretrained(output_dir)` gives.  Such a directory holds other
 * files, so it cannot be swapped whole; the files are merged in
 * (ENG_CKPT_DIR_MERGE) and readers rely on the completion manifest and the
 * save ids rather than on one rename.  checkpoint-N directories belong to
 * their checkpoint alone and are swapped whole (ENG_CKPT_DIR_SWAP).
 *
 * Every weight is read through eng_exec_read_weights, wherever it lives: a
 * merged LoRA save reads a frozen base the NVMe tier holds from there, and
 * a broken extent is the save's error, naming the file.
 *
 * Nothing non-finite is ever written: every tensor is scanned for NaN and
 * Inf after it is read from the executor and before the directory's save
 * begins (one pass over memory the save reads anyway), so a checkpoint on
 * disk is one a resume accepts and "the last good checkpoint" is good.
 *
 * Experts are saved per expert, the Hub's layout, unless the run asks for
 * save_expert_layout: fused, transformers 5's (eng_ckpt_fuse_experts). */
#include "engine/run/save.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "base/finite.h"
#include "engine/model/io/checkpoint.h"
#include "engine/model/io/companions.h"
#include "engine/exec/exec.h"
#include "engine/exec/optim_state.h"
#include "engine/model/lora/adapter.h"
#include "engine/model/lora_model.h"

mt_status_t eng_run_check_paths(const eng_run_config_t *rc, mt_error_t *err) {
    mt_status_t st = eng_outdir_check_apart(rc->source_path, "output_dir", rc->output_dir, "base_model",
                                            rc->base_model, err);
    /* a LoRA run's starting adapter is an input too: saving into it (or a
     * checkpoint-N over it) would replace what the user started from */
    if (st == MT_OK && rc->lora_model_dir[0])
        st = eng_outdir_check_apart(rc->source_path, "output_dir", rc->output_dir, "lora_model_dir",
                                    rc->lora_model_dir, err);
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
    /* weights are saved dequantised (gpt-oss's MXFP4 experts were read into
     * plain tensors): a quantization_config would send transformers looking
     * for packed tensors the checkpoint no longer has */
    json_object_del(root, "quantization_config");
    const char *name = dtype == MT_BF16 ? "bfloat16" : dtype == MT_F16 ? "float16" : "float32";
    /* an FP8 base was read dequantised; the weights saved are not quantised */
    json_object_del(root, "quantization_config");
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

/* A tensor about to be saved into dir holds only finite values; else an
 * error naming it and the element, before any file is written. */
static mt_status_t check_saved(const char *dir, const eng_param_spec_t *ps, const float *v, mt_error_t *err) {
    const size_t at = mt_first_nonfinite_f32(v, ps->numel);
    if (at == MT_ALL_FINITE) return MT_OK;
    char where[160];
    mt_index_to_str(where, sizeof where, at, ps->ndim, ps->shape);
    return mt_error_set(err, MT_ERR_DATA, "not saving %s: parameter '%s' holds %s at %s (training diverged)", dir,
                        ps->name, mt_nonfinite_name(v[at]), where);
}

/* Where the tokenizer, chat template and generation config a saved model
 * carries come from: the tokenizer the run's text data was read with
 * (tokenizer_config), else the base model's folder. */
static const char *companion_dir(const eng_run_config_t *rc) {
    return rc->tokenizer_config[0] ? rc->tokenizer_config : rc->base_model;
}

/* The adapter in PEFT's format (engine/model/lora/adapter.h): adapter_model
 * .safetensors (fp32 factors, per-expert keys or PEFT's fused form for
 * routed experts that train as one gate_up adapter, the modules trained in
 * full under their own names) and adapter_config.json, through the same
 * transaction as a model. */
static mt_status_t save_adapter(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                eng_ckpt_dir_mode_t mode, eng_save_extra_fn extra, void *ctx, mt_error_t *err) {
    eng_model_t *m = eng_exec_model(x);
    const eng_model_lora_t *lo = &m->lora;
    eng_lora_weights_t w = {0};
    w.count = lo->plan.count;
    w.num_saved = lo->plan.num_saved;
    w.pairs = calloc((size_t)w.count + 1, sizeof *w.pairs);
    w.saved = calloc((size_t)w.num_saved + 1, sizeof *w.saved);
    MT_CHECK(w.pairs && w.saved, "out of host memory preparing the adapter");
    mt_status_t st = MT_OK; /* a read of the NVMe tier can fail (a factor's master there) */
    for (int t = 0; t < w.count; t++) {
        const eng_lora_target_t *tg = &lo->plan.targets[t];
        eng_lora_pair_t *pr = &w.pairs[t];
        *pr = (eng_lora_pair_t){.param = tg->param, .out = tg->out, .in = tg->in, .r = tg->r, .alpha = tg->alpha,
                                .scale = tg->scale, .shares_a = tg->share_a >= 0};
        pr->a = malloc((size_t)tg->r * (size_t)tg->in * sizeof(float));
        pr->b = malloc((size_t)tg->out * (size_t)tg->r * sizeof(float));
        MT_CHECK(pr->a && pr->b, "out of host memory preparing the adapter");
        if (st == MT_OK) st = eng_exec_read_weights(x, m->params[tg->param].lora_a, pr->a, err);
        if (st == MT_OK) st = eng_exec_read_weights(x, m->params[tg->param].lora_b, pr->b, err);
    }
    for (int k = 0; k < w.num_saved; k++) {
        const int i = lo->plan.saved[k];
        w.saved[k].param = i;
        w.saved[k].data = malloc(m->spec.params[i].numel * sizeof(float));
        MT_CHECK_ALLOC(w.saved[k].data, m->spec.params[i].name);
        if (st == MT_OK) st = eng_exec_read_weights(x, i, w.saved[k].data, err);
    }
    for (int t = 0; t < w.count && st == MT_OK; t++) {
        const eng_param_t *p = &m->params[w.pairs[t].param];
        st = check_saved(dir, m->params[p->lora_a].spec, w.pairs[t].a, err);
        if (st == MT_OK) st = check_saved(dir, m->params[p->lora_b].spec, w.pairs[t].b, err);
    }
    for (int k = 0; k < w.num_saved && st == MT_OK; k++) st = check_saved(dir, m->params[w.saved[k].param].spec, w.saved[k].data, err);
    if (st != MT_OK) {
        eng_lora_weights_free(&w);
        return st;
    }
    eng_lora_config_t cfg;
    eng_lora_saved_config(m, rc, &cfg);
    eng_ckpt_dir_t tx;
    st = eng_ckpt_dir_begin(&tx, dir, mode, err);
    if (st == MT_OK) {
        const char *meta[] = {"format", "pt", ENG_CKPT_SAVE_ID_KEY, tx.save_id};
        char *p = eng_ckpt_dir_path(&tx, "adapter_model.safetensors");
        st = eng_lora_weights_write(p, &m->spec, &w, meta, 2, err);
        free(p);
        if (st == MT_OK) {
            eng_ckpt_dir_add(&tx, "adapter_model.safetensors");
            p = eng_ckpt_dir_path(&tx, "adapter_config.json");
            st = eng_lora_config_write(p, &cfg, err);
            free(p);
        }
        if (st == MT_OK) {
            eng_ckpt_dir_add(&tx, "adapter_config.json");
            st = eng_ckpt_dir_copy_companions(&tx, companion_dir(rc), err);
        }
        if (st == MT_OK && extra) st = extra(&tx, ctx, err); /* a checkpoint's training state */
        if (st == MT_OK) {
            st = eng_ckpt_dir_commit(&tx, err);
        } else {
            eng_ckpt_dir_abort(&tx);
        }
    }
    eng_lora_config_free(&cfg);
    eng_lora_weights_free(&w);
    return st;
}

/* W + s * B A into w (out, in), row by row: each row of W gains s times
 * the combination of A's rows that B's row gives. */
static void merge_pair(float *w, const float *a, const float *b, int64_t out, int64_t in, int r, float s) {
    for (int64_t o = 0; o < out; o++) {
        float *row = w + o * in;
        for (int k = 0; k < r; k++) {
            const float c = s * b[o * r + k];
            const float *ak = a + (int64_t)k * in;
            for (int64_t i = 0; i < in; i++) row[i] += c * ak[i];
        }
    }
}

/* A LoRA run's merged model: parameter i's weights w (out, in) gain s B A
 * where an adapter targets it (PEFT's merge); nothing otherwise. */
static mt_status_t merge_adapter(eng_exec_t *x, int i, float *w, mt_error_t *err) {
    const eng_model_t *m = eng_exec_model(x);
    const eng_param_t *p = &m->params[i];
    if (p->lora_a < 0) return MT_OK;
    const eng_param_spec_t *as = m->params[p->lora_a].spec, *bs = m->params[p->lora_b].spec;
    float *a = malloc(as->numel * sizeof *a), *b = malloc(bs->numel * sizeof *b);
    MT_CHECK(a && b, "out of host memory merging %s", p->spec->name);
    mt_status_t st = eng_exec_read_weights(x, p->lora_a, a, err);
    if (st == MT_OK) st = eng_exec_read_weights(x, p->lora_b, b, err);
    if (st == MT_OK) merge_pair(w, a, b, p->spec->shape[0], p->spec->shape[1], (int)as->shape[0], p->lora_scale);
    free(a);
    free(b);
    return st;
}

mt_status_t eng_train_save(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                           eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, mt_error_t *err) {
    return eng_train_save_with(x, rc, dir, mode, dtype, NULL, NULL, err);
}

static mt_status_t save_model(eng_exec_t *x, const eng_run_config_t *rc, const char *dir, eng_ckpt_dir_mode_t mode,
                              mt_dtype_t dtype, eng_save_extra_fn extra, void *ctx, mt_error_t *err);

mt_status_t eng_train_save_with(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, eng_save_extra_fn extra, void *ctx,
                                mt_error_t *err) {
    eng_model_t *m = eng_exec_model(x);
    if (m->lora.on) return save_adapter(x, rc, dir, mode, extra, ctx, err);
    return save_model(x, rc, dir, mode, dtype, extra, ctx, err);
}

mt_status_t eng_train_save_model(eng_exec_t *x, const eng_run_config_t *rc, const char *dir,
                                 eng_ckpt_dir_mode_t mode, mt_dtype_t dtype, mt_error_t *err) {
    return save_model(x, rc, dir, mode, dtype, NULL, NULL, err);
}

static mt_status_t save_model(eng_exec_t *x, const eng_run_config_t *rc, const char *dir, eng_ckpt_dir_mode_t mode,
                              mt_dtype_t dtype, eng_save_extra_fn extra, void *ctx, mt_error_t *err) {
    eng_model_t *m = eng_exec_model(x);
    /* the masters the NVMe tier holds are read below: its write backs done, a failed one reported */
    mt_status_t dst = eng_exec_nvme_drain(x, err);
    if (dst != MT_OK) return dst;
    char *config = eng_saved_config_json(m->cfg.config_json, rc->model_config_json, dtype,
                                         rc->source_path, err);
    if (!config) return err->code;
    const int n = m->spec.count, nb = m->spec.num_buffers;
    /* the parameters, then the buffers (saved as read, in fp32 as
     * transformers keeps e_score_correction_bias) */
    eng_ckpt_tensor_t *t = calloc((size_t)(n + nb) + 1, sizeof *t);
    float **host = calloc(n ? (size_t)n : 1, sizeof *host);
    MT_CHECK(t && host, "out of memory preparing checkpoint");
    mt_status_t st = MT_OK;
    for (int i = 0; i < n && st == MT_OK; i++) {
        const eng_param_spec_t *ps = &m->spec.params[i];
        host[i] = malloc(ps->numel ? ps->numel * sizeof(float) : 1);
        MT_CHECK_ALLOC(host[i], ps->name);
        /* a LoRA run's frozen base may be read from the NVMe tier: a broken extent is an error */
        st = eng_exec_read_weights(x, i, host[i], err);
        if (st == MT_OK) st = merge_adapter(x, i, host[i], err);
        t[i] = (eng_ckpt_tensor_t){.name = ps->name, .dtype = dtype,
                                   .ndim = ps->ndim, .shape = ps->shape, .data = host[i]};
    }
    for (int i = 0; i < nb; i++) {
        const eng_param_spec_t *bs = &m->spec.buffers[i];
        t[n + i] = (eng_ckpt_tensor_t){.name = bs->name, .dtype = MT_F32, .ndim = bs->ndim, .shape = bs->shape,
                                       .data = m->buffer_host[i]};
    }
    for (int i = 0; i < n && st == MT_OK; i++) st = check_saved(dir, &m->spec.params[i], host[i], err);
    eng_ckpt_dir_t tx;
    if (st == MT_OK) st = eng_ckpt_dir_begin(&tx, dir, mode, err);
    if (st == MT_OK) {
        if (rc->save_expert_layout == ENG_SAVE_LAYOUT_FUSED) {
            eng_ckpt_fused_t fused;
            eng_ckpt_fuse_experts(&m->spec, t, &fused);
            eng_ckpt_tensor_t *all = calloc((size_t)(fused.count + nb) + 1, sizeof *all);
            MT_CHECK_ALLOC(all, "checkpoint tensor list");
            memcpy(all, fused.tensors, (size_t)fused.count * sizeof *all);
            memcpy(all + fused.count, t + n, (size_t)nb * sizeof *all);
            st = eng_checkpoint_write(&tx, config, all, fused.count + nb, rc->save_max_shard_bytes, err);
            free(all);
            eng_ckpt_fused_free(&fused);
        } else {
            st = eng_checkpoint_write(&tx, config, t, n + nb, rc->save_max_shard_bytes, err);
        }
        if (st == MT_OK) st = eng_ckpt_dir_copy_companions(&tx, companion_dir(rc), err);
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
