/* Routed experts in either layout a transformers 5 checkpoint may use (see
 * eng_ckpt_layout_t in engine/model/io/checkpoint.h).
 *
 * The fixtures under tests/fixtures/fused/ were written by transformers 5's
 * own save_pretrained (tests/reference/make_fused_fixtures.py) from the
 * reference checkpoints ref_mixtral and ref_qwen3_moe: fused fp32 and bf16,
 * and per-expert bf16, each sharded.  For each family:
 *   1. training from the fused fp32 checkpoint gives the reference's
 *      per-step losses (relative 1e-5, as reference_test) and exactly the
 *      losses of training from the per-expert original: the weights are the
 *      same numbers, only stored differently;
 *   2. the fused and per-expert bf16 checkpoints give exactly the same
 *      losses;
 *   3. saving with save_expert_layout: fused writes gate_up_proj/down_proj
 *      (Mixtral's block as `mlp`), and that save reads back to exactly the
 *      weights of the per-expert save of the same run;
 *   4. a fused tensor whose shape disagrees with config.json is refused,
 *      naming the tensor and both shapes;
 *   5. `moetune inspect` names the layout and finds every tensor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/model/io/checkpoint.h"
#include "engine/config/config.h"
#include "engine/exec/exec.h"
#include "engine/model/io/inspect.h"
#include "engine/model/model.h"
#include "engine/run/train.h"
#include "tests/harness.h"

enum { MAX_STEPS = 16 };

/* Trains the reference case's run.yaml from base_model into out; returns the
 * number of per-step losses read back from metrics.jsonl. */
static int train_losses(const char *ref_dir, const char *base_model, const char *out, eng_save_layout_t layout,
                        double *losses) {
    char path[2048];
    mt_error_t err = {0};
    snprintf(path, sizeof path, "%s/run.yaml", ref_dir);
    eng_run_config_t rc;
    if (eng_run_config_load(path, &rc, &err) != MT_OK) {
        TH_CHECK(0, "%s: %s", path, err.msg);
        return 0;
    }
    snprintf(rc.base_model, sizeof rc.base_model, "%s", base_model);
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(rc.output_dir, sizeof rc.output_dir, "%s/%s", tmp ? tmp : "/tmp", out);
    rc.save_expert_layout = layout;
    rc.progress = false;
    eng_train_result_t res;
    int n = 0;
    if (eng_train(&rc, &res, &err) != MT_OK) {
        TH_CHECK(0, "train from %s: %s", base_model, err.msg);
    } else {
        snprintf(path, sizeof path, "%s/metrics.jsonl", rc.output_dir);
        FILE *f = fopen(path, "r");
        TH_CHECK(f != NULL, "no %s", path);
        char line[8192];
        while (f && fgets(line, sizeof line, f) && n < MAX_STEPS) {
            json_t *o = json_loads(line, 0, NULL);
            json_t *l = json_object_get(o, "loss");
            if (json_is_number(l)) losses[n++] = json_number_value(l);
            json_decref(o);
        }
        if (f) fclose(f);
    }
    eng_run_config_free(&rc);
    return n;
}

static void expect_same(const char *what, const double *a, int na, const double *b, int nb) {
    TH_CHECK(na == nb && na > 0, "%s: %d vs %d steps", what, na, nb);
    for (int i = 0; i < na && i < nb; i++)
        TH_CHECK(a[i] == b[i], "%s: step %d loss %.9g vs %.9g", what, i + 1, a[i], b[i]);
}

/* Every tensor the description names, read from both saves: bit-identical. */
static void compare_saves(const char *fused_out, const char *per_out) {
    char a[2048], b[2048];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(a, sizeof a, "%s/%s", tmp ? tmp : "/tmp", fused_out);
    snprintf(b, sizeof b, "%s/%s", tmp ? tmp : "/tmp", per_out);
    mt_error_t err = {0};
    eng_model_config_t cfg;
    if (eng_model_config_load(b, NULL, &cfg, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    eng_model_desc_t spec;
    eng_checkpoint_t fa, fb;
    TH_CHECK(eng_model_desc_build(&cfg, &spec, &err) == MT_OK, "%s", err.msg);
    TH_CHECK(eng_checkpoint_open(a, &fa, &err) == MT_OK, "%s", err.msg);
    TH_CHECK(eng_checkpoint_open(b, &fb, &err) == MT_OK, "%s", err.msg);
    if (th_failures()) return;
    /* what transformers 5 names the fused tensors, before they are resolved */
    TH_CHECK(eng_checkpoint_find(&fa, "model.layers.0.mlp.experts.gate_up_proj") != NULL, "%s: no fused gate_up_proj", a);
    TH_CHECK(eng_checkpoint_find(&fa, "model.layers.1.mlp.experts.down_proj") != NULL, "%s: no fused down_proj", a);
    TH_CHECK(eng_checkpoint_find(&fa, "model.layers.0.mlp.gate.weight") != NULL, "%s: the router is not under mlp", a);
    TH_CHECK(eng_checkpoint_resolve(&fa, &spec, &err) == MT_OK, "%s", err.msg);
    TH_CHECK(eng_checkpoint_resolve(&fb, &spec, &err) == MT_OK, "%s", err.msg);
    TH_CHECK(fa.layout == ENG_CKPT_LAYOUT_FUSED && fb.layout == ENG_CKPT_LAYOUT_PER_EXPERT, "layouts %s, %s",
             eng_ckpt_layout_name(fa.layout), eng_ckpt_layout_name(fb.layout));
    TH_CHECK(eng_checkpoint_check(&fa, &cfg, &spec, "config.json", false, &err) == MT_OK, "fused save: %s", err.msg);
    int differ = 0;
    for (int i = 0; i < spec.count; i++) {
        const eng_param_spec_t *p = &spec.params[i];
        float *x = malloc(p->numel * sizeof *x), *y = malloc(p->numel * sizeof *y);
        if (eng_checkpoint_read_f32(&fa, p->name, p->ndim, p->shape, x, &err) != MT_OK ||
            eng_checkpoint_read_f32(&fb, p->name, p->ndim, p->shape, y, &err) != MT_OK)
            TH_CHECK(0, "%s", err.msg);
        else if (memcmp(x, y, p->numel * sizeof *x) != 0)
            differ++;
        free(x);
        free(y);
    }
    TH_CHECK(differ == 0, "%d tensors differ between the fused and the per-expert save", differ);
    fprintf(stderr, "   fused save (%d tensors on disk for %d parameters) reads back identical to the per-expert save\n",
            fa.count - fa.view_count + 2 * cfg.num_hidden_layers, spec.count);
    eng_checkpoint_close(&fa);
    eng_checkpoint_close(&fb);
    eng_model_desc_free(&spec);
    eng_model_config_free(&cfg);
}

static void check_family(const char *fam) {
    char ref[256], dir[256], out[128];
    double ref_l[MAX_STEPS], fused_l[MAX_STEPS], per_l[MAX_STEPS], fb_l[MAX_STEPS], pb_l[MAX_STEPS];
    fprintf(stderr, "== %s\n", fam);
    snprintf(ref, sizeof ref, "tests/fixtures/ref_%s", fam);

    /* 1. fp32: the reference's losses, and exactly the per-expert run's */
    snprintf(ref, sizeof ref, "tests/fixtures/ref_%s/expected.json", fam);
    json_t *ej = json_load_file(ref, 0, NULL);
    TH_CHECK(ej != NULL, "%s", ref);
    json_t *losses = json_object_get(ej, "losses");
    const int nref = (int)json_array_size(losses);
    for (int i = 0; i < nref && i < MAX_STEPS; i++) ref_l[i] = json_number_value(json_array_get(losses, (size_t)i));
    json_decref(ej);
    snprintf(ref, sizeof ref, "tests/fixtures/ref_%s", fam);
    snprintf(dir, sizeof dir, "tests/fixtures/fused/%s_f32", fam);
    snprintf(out, sizeof out, "%s-fused-f32", fam);
    const int nf = train_losses(ref, dir, out, ENG_SAVE_LAYOUT_FUSED, fused_l);
    snprintf(dir, sizeof dir, "tests/fixtures/ref_%s/ckpt", fam);
    snprintf(out, sizeof out, "%s-per-expert-f32", fam);
    const int np = train_losses(ref, dir, out, ENG_SAVE_LAYOUT_PER_EXPERT, per_l);
    TH_CHECK(nf == nref, "%d steps, reference %d", nf, nref);
    for (int i = 0; i < nf && i < nref; i++) {
        fprintf(stderr, "   step %d: fused f32 %.9g, reference %.9g (rel %.2g)\n", i + 1, fused_l[i], ref_l[i],
                fabs(fused_l[i] - ref_l[i]) / fabs(ref_l[i]));
        TH_CHECK(fabs(fused_l[i] - ref_l[i]) <= 1e-5 * fabs(ref_l[i]), "step %d: %.9g vs reference %.9g", i + 1,
                 fused_l[i], ref_l[i]);
    }
    expect_same("fused vs per-expert fp32", fused_l, nf, per_l, np);

    /* 2. bf16 in both layouts, as transformers 5 saved them */
    snprintf(dir, sizeof dir, "tests/fixtures/fused/%s_bf16", fam);
    snprintf(out, sizeof out, "%s-fused-bf16", fam);
    const int nfb = train_losses(ref, dir, out, ENG_SAVE_LAYOUT_PER_EXPERT, fb_l);
    snprintf(dir, sizeof dir, "tests/fixtures/fused/%s_bf16_per_expert", fam);
    snprintf(out, sizeof out, "%s-per-expert-bf16", fam);
    const int npb = train_losses(ref, dir, out, ENG_SAVE_LAYOUT_PER_EXPERT, pb_l);
    for (int i = 0; i < nfb; i++) fprintf(stderr, "   step %d: bf16 weights, fused %.9g per-expert %.9g\n", i + 1, fb_l[i], pb_l[i]);
    expect_same("fused vs per-expert bf16", fb_l, nfb, pb_l, npb);

    /* 3. the fused save against the per-expert save of the same run */
    char a[128], b[128];
    snprintf(a, sizeof a, "%s-fused-f32", fam);
    snprintf(b, sizeof b, "%s-per-expert-f32", fam);
    compare_saves(a, b);
}

/* 4. a fused tensor of the wrong shape */
static void check_mismatch(void) {
    kern_device_t *dev = NULL;
    kern_device_opts_t o = {0};
    mt_error_t err = {0};
    if (kern_device_create(KERN_BACKEND_CPU, &o, &dev, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    eng_exec_t *x = NULL;
    const mt_status_t st =
        eng_exec_load(&x, dev, "tests/fixtures/fused/mixtral_f32", "{\"intermediate_size\": 20}", NULL, NULL, &err);
    fprintf(stderr, "== wrong shape: %s\n", err.msg);
    TH_CHECK(st == MT_ERR_FORMAT, "a fused tensor of the wrong shape was accepted");
    TH_CHECK(strstr(err.msg, "model.layers.0.mlp.experts.gate_up_proj") && strstr(err.msg, "[4, 48, 32]") &&
              strstr(err.msg, "[4, 40, 32]"),
             "the message does not name the tensor and both shapes: %s", err.msg);
    if (st == MT_OK) eng_exec_free(x);
    kern_device_destroy(dev);
}

/* 4b. a fused checkpoint that lacks one layer's down_proj: the header check
 * names the per-expert tensor and the fused one it looked for */
static void check_missing_fused(void) {
    const char *src = "tests/fixtures/fused/mixtral_f32";
    mt_error_t err = {0};
    eng_model_config_t cfg;
    eng_model_desc_t spec;
    eng_checkpoint_t ck;
    if (eng_model_config_load(src, NULL, &cfg, &err) != MT_OK || eng_model_desc_build(&cfg, &spec, &err) != MT_OK ||
        eng_checkpoint_open(src, &ck, &err) != MT_OK || eng_checkpoint_resolve(&ck, &spec, &err) != MT_OK) {
        TH_CHECK(0, "%s", err.msg);
        return;
    }
    /* every tensor as per-expert floats, then the fused list without layer 1's down_proj */
    float **data = calloc((size_t)spec.count, sizeof *data);
    eng_ckpt_tensor_t *ts = calloc((size_t)spec.count, sizeof *ts);
    for (int i = 0; i < spec.count; i++) {
        const eng_param_spec_t *p = &spec.params[i];
        data[i] = malloc(p->numel * sizeof **data);
        TH_CHECK(eng_checkpoint_read_f32(&ck, p->name, p->ndim, p->shape, data[i], &err) == MT_OK, "%s", err.msg);
        ts[i] = (eng_ckpt_tensor_t){p->name, MT_F32, p->ndim, p->shape, data[i]};
    }
    eng_checkpoint_close(&ck);
    eng_ckpt_fused_t fused;
    eng_ckpt_fuse_experts(&spec, ts, &fused);
    int k = 0;
    for (int i = 0; i < fused.count; i++)
        if (strcmp(fused.tensors[i].name, "model.layers.1.mlp.experts.down_proj") != 0) fused.tensors[k++] = fused.tensors[i];
    TH_CHECK(k == fused.count - 1, "the fused list has no model.layers.1.mlp.experts.down_proj");
    char dir[1024];
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(dir, sizeof dir, "%s/fused-missing-down", tmp ? tmp : "/tmp");
    TH_CHECK(eng_checkpoint_save(dir, cfg.config_json, fused.tensors, k, 0, &err) == MT_OK, "%s", err.msg);
    eng_ckpt_fused_free(&fused);
    for (int i = 0; i < spec.count; i++) free(data[i]);
    free(data);
    free(ts);
    if (eng_checkpoint_open(dir, &ck, &err) == MT_OK) {
        mt_status_t st = eng_checkpoint_resolve(&ck, &spec, &err);
        if (st == MT_OK) st = eng_checkpoint_check(&ck, &cfg, &spec, "config.json", false, &err);
        fprintf(stderr, "== missing fused tensor: %s\n", err.msg);
        TH_CHECK(st == MT_ERR_FORMAT && strstr(err.msg, "'model.layers.1.block_sparse_moe.experts.0.w2.weight'") &&
                  strstr(err.msg, "'model.layers.1.mlp.experts.down_proj'"),
                 "the message does not name the per-expert and the fused tensor: %s", err.msg);
        eng_checkpoint_close(&ck);
    } else {
        TH_CHECK(0, "%s", err.msg);
    }
    eng_model_desc_free(&spec);
    eng_model_config_free(&cfg);
}

/* 5. inspect names the layout and finds every tensor in either */
static void check_inspect(const char *dir, const char *layout) {
    char *out = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len);
    mt_error_t err = {0};
    const mt_status_t st = eng_inspect(dir, mem, &err);
    fclose(mem);
    TH_CHECK(st == MT_OK, "inspect %s: %s", dir, err.msg);
    TH_CHECK(out && strstr(out, layout) && strstr(out, "all 41 tensors present"), "inspect %s:\n%s", dir, out ? out : "");
    free(out);
}

int main(void) {
    check_inspect("tests/fixtures/fused/mixtral_f32", "experts stored fused");
    check_inspect("tests/fixtures/fused/mixtral_bf16_per_expert", "experts stored per expert");
    check_family("mixtral");
    check_family("qwen3_moe");
    check_mismatch();
    check_missing_fused();
    if (th_failures()) {
        fprintf(stderr, "expert_layout_test: %d failures\n", th_failures());
        return 1;
    }
    fprintf(stderr, "expert_layout_test: both layouts load and train alike\n");
    return 0;
}
