/* LoRA training against the PyTorch reference, and across plans.
 *
 * For each fixture (tests/reference/make_lora_fixtures.py: Mixtral with
 * attention adapters, Qwen3-MoE with per-expert adapters under rsLoRA and
 * accumulation 2, Qwen2-MoE with every linear layer incl. the shared expert
 * and a dense layer under a warmup-cosine schedule; and DeepSeek-V3 with
 * adapters on MLA's five projections, from transformers + PEFT themselves
 * (tests/reference/make_deepseek_lora_fixture.py); each starting from a
 * given adapter with non-zero B), and PEFT's own fused-expert adapters
 * from transformers 5 + PEFT (tests/reference/make_peft_fused_fixtures.py:
 * Mixtral with PEFT's gate_up rank_pattern, Qwen3-MoE with target_parameters,
 * rsLoRA and user rank/alpha patterns, continued in moetune), `moetune
 * train` on its run.yaml must give:
 *   - per-step losses within 1e-5 relative of the reference's, the first
 *     step's within 1e-6;
 *   - a saved adapter (PEFT's keys: per expert, or PEFT's fused form for a
 *     fused adapter) within 1e-5 of the reference's final adapter, relative
 *     to its largest element, with every key present;
 *   - the same losses and adapter bit for bit under other plans (weights
 *     streamed, gradients and AdamW on the host, activations offloaded or
 *     recomputed) and in layer-major step order, and in bf16 across plans
 *     (bf16's first loss within 1% of fp32's, later ones within 5%: see
 *     there why);
 *   - a run whose device budget is below the base model's weights in bf16
 *     (a larger random Mixtral) completes, its measured device peak within
 *     the budget.
 *
 *   lora_test FIXTURE_DIR... */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/exec/exec.h"
#include "engine/model/io/init_random.h"
#include "engine/model/lora_model.h"
#include "engine/model/io/safetensors.h"
#include "engine/run/train.h"
#include "tests/harness.h"

enum { MAX_STEPS = 64 };

typedef struct {
    double loss[MAX_STEPS];
    int steps;
    double peak_device; /* largest over the steps */
    bool ok;
} run_t;

static char g_tmp[256];

/* Trains fixture `dir`'s run.yaml with the assignments `sets` (NULL-ended)
 * into output directory `out`. */
static void train(const char *dir, const char *const *sets, const char *out, run_t *r) {
    memset(r, 0, sizeof *r);
    char path[1024];
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    eng_run_config_t rc;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(path, &rc, &err);
    char assign[1400];
    snprintf(assign, sizeof assign, "output_dir=%s", out);
    if (st == MT_OK) st = eng_run_config_set(&rc, assign, &err);
    if (st == MT_OK) st = eng_run_config_set(&rc, "progress=false", &err);
    for (int i = 0; sets && sets[i] && st == MT_OK; i++) st = eng_run_config_set(&rc, sets[i], &err);
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    eng_train_result_t res;
    if (st == MT_OK) st = eng_train(&rc, &res, &err);
    eng_run_config_free(&rc);
    TH_CHECK(st == MT_OK, "%s: training failed: %s", dir, err.msg);
    if (st != MT_OK) return;
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    TH_CHECK(f != NULL, "no %s", path);
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *loss = json_object_get(j, "loss");
        if (json_is_number(loss) && r->steps < MAX_STEPS) {
            r->loss[r->steps++] = json_number_value(loss);
            const double peak = json_number_value(json_object_get(j, "peak_device_bytes"));
            if (peak > r->peak_device) r->peak_device = peak;
        }
        json_decref(j);
    }
    fclose(f);
    r->ok = true;
}

/* Largest |a - b| over every tensor of `ref`, relative to ref's largest
 * element; keys of one file missing in the other count as failures. */
static double adapter_diff(const char *got_path, const char *ref_path, int *missing) {
    eng_st_file_t got, ref;
    mt_error_t err = {0};
    *missing = 0;
    if (eng_st_open(got_path, &got, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        return INFINITY;
    }
    if (eng_st_open(ref_path, &ref, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        eng_st_close(&got);
        return INFINITY;
    }
    double maxdiff = 0, maxref = 0;
    int matched = 0;
    for (int i = 0; i < ref.count; i++) {
        const eng_st_tensor_t *rt = &ref.tensors[i], *gt = eng_st_find(&got, rt->name);
        if (!gt || gt->numel != rt->numel) {
            fprintf(stderr, "  %s: %s in the saved adapter\n", rt->name, gt ? "another shape" : "missing");
            (*missing)++;
            continue;
        }
        matched++;
        float *a = malloc(rt->numel * sizeof *a), *b = malloc(rt->numel * sizeof *b);
        if (eng_st_read_f32(&ref, rt, a, &err) == MT_OK && eng_st_read_f32(&got, gt, b, &err) == MT_OK) {
            for (uint64_t k = 0; k < rt->numel; k++) {
                if (fabs(a[k]) > maxref) maxref = fabs(a[k]);
                if (fabs((double)a[k] - b[k]) > maxdiff) maxdiff = fabs((double)a[k] - b[k]);
            }
        }
        free(a);
        free(b);
    }
    *missing += got.count - matched; /* and those the reference does not have */
    eng_st_close(&got);
    eng_st_close(&ref);
    return maxref > 0 ? maxdiff / maxref : maxdiff;
}

/* The adapter's tensors, compared bit for bit (the files differ in their
 * save ids). */
static bool same_adapter(const char *a, const char *b) {
    int missing;
    return adapter_diff(a, b, &missing) == 0 && missing == 0;
}

/* moetune's logits on the first micro-batch with the adapter it saved in
 * out, against PEFT's on the same files (tests/reference/check_peft_moetune.py
 * wrote them: PeftModel.from_pretrained on the HF model).  Cases where PEFT
 * cannot load the adapter as written have no file (see that script). */
static void check_peft_logits(const char *dir, const char *out) {
    char path[1100];
    snprintf(path, sizeof path, "%s/peft_logits_moetune.safetensors", dir);
    if (access(path, R_OK) != 0) {
        printf("%-20s no PEFT logits recorded (see tests/fixtures/lora_peft_moetune.json)\n", dir);
        return;
    }
    eng_st_file_t want;
    mt_error_t err = {0};
    if (eng_st_open(path, &want, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        return;
    }
    const eng_st_tensor_t *wt = eng_st_find(&want, "logits");
    TH_CHECK(wt != NULL, "%s: no tensor 'logits'", path);
    eng_run_config_t rc;
    snprintf(path, sizeof path, "%s/run.yaml", dir);
    mt_status_t st = eng_run_config_load(path, &rc, &err);
    snprintf(rc.lora_model_dir, sizeof rc.lora_model_dir, "%s", out);
    eng_lora_run_opts_t lro;
    if (st == MT_OK) st = eng_lora_run_opts(&rc, &lro, &err);
    kern_device_t *dev = NULL;
    const kern_device_opts_t dopts = {0};
    if (st == MT_OK) st = kern_device_create(KERN_BACKEND_CPU, &dopts, &dev, &err);
    eng_exec_t *x = NULL;
    const eng_model_opts_t mo = {.lora = &lro.opts};
    if (st == MT_OK) st = eng_exec_open(&x, dev, rc.base_model, &mo, &err);
    TH_CHECK(st == MT_OK, "%s: opening the model with its saved adapter: %s", dir, err.msg);
    if (st == MT_OK && wt) {
        const char *paths[1] = {rc.datasets[0].path};
        eng_dataset_t ds;
        st = eng_dataset_load(&ds, paths, 1, rc.sequence_len, eng_exec_model(x)->cfg.vocab_size, &err);
        TH_CHECK(st == MT_OK, "%s", err.msg);
        if (st == MT_OK) {
            eng_loader_t ld;
            eng_loader_init(&ld, &ds, rc.micro_batch_size, false, rc.seed);
            eng_batch_t batch;
            eng_loader_next(&ld, &batch);
            const size_t n = (size_t)batch.B * batch.T * eng_exec_model(x)->cfg.vocab_size;
            float *got = malloc(n * sizeof *got), *ref = malloc(wt->numel * sizeof *ref);
            eng_micro_stats_t ms;
            st = eng_exec_forward(x, &batch, got, &ms, &err);
            TH_CHECK(st == MT_OK, "%s", err.msg);
            TH_CHECK(wt->numel == n, "PEFT logits have %llu values, moetune's %zu", (unsigned long long)wt->numel, n);
            if (st == MT_OK && wt->numel == n && eng_st_read_f32(&want, wt, ref, &err) == MT_OK) {
                double worst = 0, big = 0;
                for (size_t i = 0; i < n; i++) {
                    worst = fmax(worst, fabs((double)got[i] - ref[i]));
                    big = fmax(big, fabs(ref[i]));
                }
                TH_CHECK(worst <= 1e-5 * fmax(big, 1.0), "%s: logits differ from PEFT's by %.2e (largest %.2e)", dir,
                         worst, big);
                printf("%-20s logits with the saved adapter within %.2e of PEFT's on the same files\n",
                       th_base_name(dir), worst);
            }
            free(got);
            free(ref);
            eng_loader_free(&ld);
            eng_dataset_free(&ds);
        }
        eng_exec_free(x);
    }
    if (dev) kern_device_destroy(dev);
    eng_lora_run_opts_free(&lro);
    eng_run_config_free(&rc);
    eng_st_close(&want);
}

/* A LoRA run stopped with a checkpoint at step 4 and resumed from it gives
 * the uninterrupted run's losses for steps 5.. and its adapter, bit for bit
 * (adapter factors, AdamW moments, per-expert step counts, the data
 * position, the schedule), with the optimizer on the device or the host. */
static void check_resume(const char *dir, const run_t *full, const char *full_out) {
    static const char *const device_plan[] = {"scheduler.optimizer=device", "scheduler.grads=device",
                                              "scheduler.weights=resident", NULL};
    static const char *const host_plan[] = {"scheduler.optimizer=host", "scheduler.weights=stream", NULL};
    const char *const *plans[] = {device_plan, host_plan};
    const char *names[] = {"device", "host"};
    const char *name = th_base_name(dir);
    for (int p = 0; p < 2; p++) {
        char first[512], second[512], ckpt[600], set_resume[700];
        snprintf(first, sizeof first, "%s/%s-resume-%s-a", g_tmp, name, names[p]);
        snprintf(second, sizeof second, "%s/%s-resume-%s-b", g_tmp, name, names[p]);
        const char *sets_a[8] = {"save_steps=4", NULL};
        int n = 1;
        for (int k = 0; plans[p][k]; k++) sets_a[n++] = plans[p][k];
        sets_a[n] = NULL;
        run_t a, b;
        train(dir, sets_a, first, &a);
        snprintf(ckpt, sizeof ckpt, "%s/checkpoint-4", first);
        snprintf(set_resume, sizeof set_resume, "resume_from_checkpoint=%s", ckpt);
        const char *sets_b[8] = {set_resume, NULL};
        n = 1;
        for (int k = 0; plans[p][k]; k++) sets_b[n++] = plans[p][k];
        sets_b[n] = NULL;
        train(dir, sets_b, second, &b);
        if (!a.ok || !b.ok) continue;
        bool same = b.steps == full->steps - 4 && b.steps > 0;
        for (int s = 0; same && s < b.steps; s++) same = b.loss[s] == full->loss[4 + s];
        TH_CHECK(same, "%s: resumed at step 4 (optimizer on the %s), the losses differ from the uninterrupted run's", name,
                 names[p]);
        char x[700], y[700];
        snprintf(x, sizeof x, "%s/adapter_model.safetensors", second);
        snprintf(y, sizeof y, "%s/adapter_model.safetensors", full_out);
        TH_CHECK(same_adapter(x, y), "%s: resumed run's adapter differs from the uninterrupted run's", name);
        if (same) printf("%-20s resumed at step 4 (optimizer on the %s): losses and adapter bit-identical\n", name,
                         names[p]);
    }
}

static run_t g_last_auto;   /* the last fixture's plan-auto run, for check_dropout */
static double g_last_scale; /* and its LoRA scale, for check_merge */

static void check_fixture(const char *dir) {
    char path[1024];
    snprintf(path, sizeof path, "%s/expected.json", dir);
    json_error_t je;
    json_t *exp = json_load_file(path, 0, &je);
    TH_CHECK(exp != NULL, "%s: %s", path, je.text);
    if (!exp) return;
    json_t *losses = json_object_get(exp, "losses");
    const int steps = (int)json_array_size(losses);
    const char *name = th_base_name(dir);

    char out0[512];
    snprintf(out0, sizeof out0, "%s/%s-auto", g_tmp, name);
    run_t r0;
    train(dir, NULL, out0, &r0);
    if (r0.ok) {
        TH_CHECK(r0.steps == steps, "%s: %d steps logged, the reference has %d", name, r0.steps, steps);
        double worst = 0;
        for (int s = 0; s < steps && s < r0.steps; s++) {
            const double ref = json_number_value(json_array_get(losses, (size_t)s));
            const double rel = fabs(r0.loss[s] - ref) / fabs(ref);
            if (rel > worst) worst = rel;
            /* the first step is the adapter as given: nothing has accumulated yet */
            const double tol = s == 0 ? 1e-6 : 1e-5;
            TH_CHECK(rel <= tol, "%s: step %d loss %.9g, reference %.9g (relative %.2e, at most %.0e)", name, s + 1,
                     r0.loss[s], ref, rel, tol);
        }
        char got[600], ref[1100];
        snprintf(got, sizeof got, "%s/adapter_model.safetensors", out0);
        snprintf(ref, sizeof ref, "%s/adapter_final/adapter_model.safetensors", dir);
        int missing;
        const double d = adapter_diff(got, ref, &missing);
        TH_CHECK(missing == 0, "%s: %d adapter tensors missing or unexpected", name, missing);
        TH_CHECK(d <= 1e-5, "%s: final adapter differs by %.2e of its largest element", name, d);
        snprintf(got, sizeof got, "%s/adapter_config.json", out0);
        TH_CHECK(access(got, R_OK) == 0, "%s: no adapter_config.json saved", name);
        const double ref0 = json_number_value(json_array_get(losses, 0));
        printf("%-20s losses within %.2e relative (first step %.2e), final adapter within %.2e of its max\n", name,
               worst, r0.steps > 0 ? fabs(r0.loss[0] - ref0) / fabs(ref0) : NAN, d);
        check_peft_logits(dir, out0);
        check_resume(dir, &r0, out0);
    }

    g_last_auto = r0;
    g_last_scale = json_number_value(json_object_get(exp, "scaling"));
    /* other plans: bit-identical, fp32 and bf16 */
    static const char *const streamed[] = {"scheduler.weights=stream", "scheduler.grads=host",
                                           "scheduler.optimizer=host", "scheduler.activations=offload", NULL};
    static const char *const recomputed[] = {"scheduler.weights=resident", "scheduler.grads=device",
                                             "scheduler.optimizer=device", "scheduler.activations=recompute", NULL};
    static const char *const bf16_streamed[] = {"bf16=true", "scheduler.weights=stream", "scheduler.grads=host",
                                                "scheduler.optimizer=host", "scheduler.activations=offload", NULL};
    static const char *const bf16_recomputed[] = {"bf16=true", "scheduler.weights=resident",
                                                  "scheduler.grads=device", "scheduler.optimizer=device",
                                                  "scheduler.activations=recompute", NULL};
    static const char *const layer_major[] = {"step_order=layer", "scheduler.weights=stream", "scheduler.grads=host",
                                              "scheduler.optimizer=host", "scheduler.activations=recompute", NULL};
    static const char *const micro_major[] = {"step_order=micro_batch", "scheduler.weights=stream", NULL};
    const char *const *plans[] = {streamed, recomputed, bf16_streamed, bf16_recomputed, layer_major, micro_major};
    const char *plan_names[] = {"streamed", "recomputed", "bf16-streamed", "bf16-recomputed", "layer-major",
                                "micro-batch-major"};
    enum { PLANS = 6 };
    run_t rp[PLANS];
    char outp[PLANS][512];
    for (int p = 0; p < PLANS; p++) {
        snprintf(outp[p], sizeof outp[p], "%s/%s-%s", g_tmp, name, plan_names[p]);
        train(dir, plans[p], outp[p], &rp[p]);
    }
    for (int p = 0; p < PLANS; p++) {
        const bool bf16 = p == 2 || p == 3;
        const run_t *base = bf16 ? &rp[2] : &r0;
        const char *base_out = bf16 ? outp[2] : out0;
        if (!rp[p].ok || !base->ok || (p == 2)) continue;
        bool same = rp[p].steps == base->steps;
        for (int s = 0; same && s < rp[p].steps; s++) same = rp[p].loss[s] == base->loss[s];
        TH_CHECK(same, "%s: plan %s changes the losses", name, plan_names[p]);
        char a[600], b[600];
        snprintf(a, sizeof a, "%s/adapter_model.safetensors", outp[p]);
        snprintf(b, sizeof b, "%s/adapter_model.safetensors", base_out);
        TH_CHECK(same_adapter(a, b), "%s: plan %s changes the saved adapter", name, plan_names[p]);
    }
    if (rp[2].ok && r0.ok) { /* bf16 is a different computation: close, not equal */
        /* The first step's loss is the forward alone at the same weights:
         * bf16's precision, held to 1%.  Later steps follow updates made
         * from bf16 gradients, and on these tiny models (hidden 16, a few
         * dozen tokens, AdamW at lr 0.01, rsLoRA scale 8) a bf16-sized
         * change of the first gradients can move a later step's loss by a
         * few percent: AdamW's first update is lr * sign(g) for every
         * element whose gradient is above eps, so elements whose gradient
         * is near zero get a full step of either sign, and a token whose
         * best experts score within a rounding of each other changes
         * experts.  Measured on lora_peft_qwen3_fused (Qwen3-MoE with
         * q_proj / o_proj adapters, 5 steps): fp32 with every attention
         * value v multiplied by 1 + U(-2^-9, 2^-9) (a bf16 rounding's size,
         * four seeds) moves step 5's loss by 0.1% to 1.7% from plain fp32;
         * truncating v to bf16 instead of rounding it, 0.1%; the bf16 run
         * with tensor-core attention (bf16 q, k, v, P, dS), 2.9% (0.28% at
         * step 1), while the other fixtures stay under 0.2%.  So later
         * steps are held to 5%, room for that: what this guards is that a
         * bf16 run trains and stays near fp32; the gradients themselves are
         * held to PyTorch's in fp32 above, and the bf16 attention's
         * roundings by kernels/cpu/tests/attention_test.c. */
        double worst = 0;
        for (int s = 0; s < r0.steps && s < rp[2].steps; s++)
            worst = fmax(worst, fabs(rp[2].loss[s] - r0.loss[s]) / fabs(r0.loss[s]));
        const double first = fabs(rp[2].loss[0] - r0.loss[0]) / fabs(r0.loss[0]);
        TH_CHECK(first < 0.01, "%s: bf16's first loss %.2e relative from fp32 (expected under 1%%)", name, first);
        TH_CHECK(worst < 0.05 && worst > 0, "%s: bf16 losses %.2e relative from fp32 (expected in (0, 5%%))", name,
                 worst);
        printf("%-20s plans and step orders bit-identical (fp32 and bf16); bf16 within %.2e of fp32 (first step "
               "%.2e)\n",
               name, worst, first);
    }
    json_decref(exp);
}

/* merge_lora: output_dir/merged holds W + s B A for every adapted module
 * (the saved adapter's factors) and the base's other tensors unchanged. */
static void check_merge(const char *dir, double scale) {
    static const char *const sets[] = {"merge_lora=true", NULL};
    char out[512], path[1100];
    snprintf(out, sizeof out, "%s/merge", g_tmp);
    run_t r;
    train(dir, sets, out, &r);
    if (!r.ok) return;
    eng_st_file_t merged, base, adapter;
    mt_error_t err = {0};
    snprintf(path, sizeof path, "%s/merged/model.safetensors", out);
    if (eng_st_open(path, &merged, &err) != MT_OK) {
        TH_CHECK(false, "%s", err.msg);
        return;
    }
    snprintf(path, sizeof path, "%s/ckpt/model.safetensors", dir);
    TH_CHECK(eng_st_open(path, &base, &err) == MT_OK, "%s", err.msg);
    snprintf(path, sizeof path, "%s/adapter_model.safetensors", out);
    TH_CHECK(eng_st_open(path, &adapter, &err) == MT_OK, "%s", err.msg);
    TH_CHECK(merged.count == base.count, "merged model has %d tensors, the base %d", merged.count, base.count);
    int adapted = 0;
    double worst = 0;
    for (int i = 0; i < base.count; i++) {
        const eng_st_tensor_t *bt = &base.tensors[i], *mt = eng_st_find(&merged, bt->name);
        TH_CHECK(mt && mt->numel == bt->numel, "merged model: %s missing or reshaped", bt->name);
        if (!mt || mt->numel != bt->numel) continue;
        float *w = malloc(bt->numel * sizeof *w), *got = malloc(bt->numel * sizeof *got);
        eng_st_read_f32(&base, bt, w, &err);
        eng_st_read_f32(&merged, mt, got, &err);
        char an[400], bn[400];
        const size_t stem = strlen(bt->name) - strlen(".weight");
        snprintf(an, sizeof an, "base_model.model.%.*s.lora_A.weight", (int)stem, bt->name);
        snprintf(bn, sizeof bn, "base_model.model.%.*s.lora_B.weight", (int)stem, bt->name);
        const eng_st_tensor_t *at = eng_st_find(&adapter, an), *btl = eng_st_find(&adapter, bn);
        if (at && btl && bt->ndim == 2) {
            adapted++;
            const int64_t out_d = (int64_t)bt->shape[0], in_d = (int64_t)bt->shape[1], rk = (int64_t)at->shape[0];
            float *a = malloc(at->numel * sizeof *a), *b = malloc(btl->numel * sizeof *b);
            eng_st_read_f32(&adapter, at, a, &err);
            eng_st_read_f32(&adapter, btl, b, &err);
            for (int64_t o = 0; o < out_d; o++)
                for (int64_t c = 0; c < in_d; c++) {
                    double d = 0;
                    for (int64_t k = 0; k < rk; k++) d += (double)b[o * rk + k] * a[k * in_d + c];
                    w[o * in_d + c] += (float)(scale * d);
                }
            free(a);
            free(b);
        }
        for (uint64_t k = 0; k < bt->numel; k++) worst = fmax(worst, fabs((double)got[k] - w[k]));
        free(w);
        free(got);
    }
    TH_CHECK(adapted > 0, "no adapted module found in the merged model");
    TH_CHECK(worst <= 1e-6, "merged weights differ from W + s B A by %.2e", worst);
    printf("merge_lora: %d adapted modules merged as W + s B A (max difference %.2e), the rest unchanged\n", adapted,
           worst);
    eng_st_close(&merged);
    eng_st_close(&base);
    eng_st_close(&adapter);
}

/* lora_dropout > 0: reproducible (the same losses under a plan that
 * recomputes activations, whose masks must be the forward's), and not the
 * dropout-free run. */
static void check_dropout(const char *dir, const run_t *no_dropout) {
    static const char *const kept[] = {"lora_dropout=0.1", "scheduler.activations=keep", NULL};
    static const char *const recomputed[] = {"lora_dropout=0.1", "scheduler.activations=recompute",
                                             "scheduler.weights=stream", "scheduler.optimizer=host",
                                             "step_order=layer", NULL};
    char out_a[512], out_b[512];
    snprintf(out_a, sizeof out_a, "%s/dropout-kept", g_tmp);
    snprintf(out_b, sizeof out_b, "%s/dropout-recomputed", g_tmp);
    run_t a, b;
    train(dir, kept, out_a, &a);
    train(dir, recomputed, out_b, &b);
    if (!a.ok || !b.ok) return;
    bool same = a.steps == b.steps && a.steps > 0, differs = false;
    for (int s = 0; same && s < a.steps; s++) same = a.loss[s] == b.loss[s];
    for (int s = 0; s < a.steps && s < no_dropout->steps; s++) differs |= a.loss[s] != no_dropout->loss[s];
    TH_CHECK(same, "lora_dropout: recomputing activations in layer-major order changes the losses (masks not "
                "reproduced)");
    TH_CHECK(differs, "lora_dropout 0.1 gives the dropout-free losses");
    printf("lora_dropout 0.1: losses bit-identical kept vs recomputed in layer-major order, and unlike lora_dropout "
           "0\n");
}

/* A device budget below the base's weights in bf16: a random 8-layer
 * Mixtral of about 14M parameters (28 MB in bf16), every linear layer
 * adapted, trained under 60% of that budget: it must stream, complete, and
 * peak within the budget. */
static void check_small_budget(void) {
    char cwd[512], yaml[1024], text[4096];
    if (!getcwd(cwd, sizeof cwd)) return;
    const char *model_json =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\", \"vocab_size\": 128,"
          " \"hidden_size\": 256, \"intermediate_size\": 256, \"num_hidden_layers\": 8,"
          " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"head_dim\": 64, \"num_local_experts\": 8,"
          " \"num_experts_per_tok\": 2, \"max_position_embeddings\": 512, \"rms_norm_eps\": 1e-05,"
          " \"rope_theta\": 10000.0, \"tie_word_embeddings\": false, \"torch_dtype\": \"float32\"}\n";
    char base[600];
    snprintf(base, sizeof base, "%s/budget-base", g_tmp);
    mt_error_t ierr = {0};
    const mt_status_t ist = eng_checkpoint_init_random(base, model_json, 3, &ierr);
    TH_CHECK(ist == MT_OK, "random base: %s", ierr.msg);
    if (ist != MT_OK) return;
    /* parameters: per layer attention 2*256*256 + 2*256*128, experts 8*3*256*256, router 8*256, norms 2*256 */
    const uint64_t per_layer = 2ull * 256 * 256 + 2ull * 256 * 128 + 8ull * 3 * 256 * 256 + 8 * 256 + 2 * 256;
    const uint64_t numel = 8 * per_layer + 2ull * 128 * 256 + 256;
    const uint64_t bf16_bytes = 2 * numel, budget = bf16_bytes * 6 / 10;
    snprintf(yaml, sizeof yaml, "%s/budget.yaml", g_tmp);
    snprintf(text, sizeof text,
             "base_model: %s/budget-base\ndatasets:\n  - path: %s/configs/data/quickstart.jsonl\n"
             "sequence_len: 32\nmicro_batch_size: 2\nmax_steps: 3\nlearning_rate: 1.0e-3\nseed: 3\nbf16: true\n"
             "backend: cpu\nadapter: lora\nlora_r: 8\nlora_alpha: 16\nlora_target_linear: true\n"
             "memory:\n  device: %llu\noutput_dir: %s/budget-out\nprogress: false\n",
             g_tmp, cwd, (unsigned long long)budget, g_tmp);
    FILE *f = fopen(yaml, "w");
    TH_CHECK(f != NULL, "cannot write %s", yaml);
    if (!f) return;
    fputs(text, f);
    fclose(f);
    eng_run_config_t rc;
    mt_error_t err = {0};
    eng_train_result_t res;
    mt_status_t st = eng_run_config_load(yaml, &rc, &err);
    if (st == MT_OK) st = eng_run_config_validate(&rc, &err);
    if (st == MT_OK) st = eng_train(&rc, &res, &err);
    eng_run_config_free(&rc);
    TH_CHECK(st == MT_OK, "training under a device budget of %llu bytes failed: %s", (unsigned long long)budget, err.msg);
    if (st != MT_OK) return;
    char metrics[600];
    snprintf(metrics, sizeof metrics, "%s/budget-out/metrics.jsonl", g_tmp);
    f = fopen(metrics, "r");
    TH_CHECK(f != NULL, "no %s", metrics);
    if (!f) return;
    double peak = 0;
    uint64_t h2d = 0;
    char line[8192];
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        if (json_is_number(json_object_get(j, "loss"))) {
            peak = fmax(peak, json_number_value(json_object_get(j, "peak_device_bytes")));
            h2d = (uint64_t)json_number_value(json_object_get(j, "weight_h2d_bytes"));
        }
        json_decref(j);
    }
    fclose(f);
    TH_CHECK(peak > 0 && peak <= (double)budget, "device peak %.0f bytes, budget %llu", peak,
             (unsigned long long)budget);
    TH_CHECK(h2d > 0, "nothing was streamed under a budget below the weights");
    printf("budget %llu bytes (60%% of the %llu bytes of bf16 base weights): completed, device peak %.0f bytes, "
           "%llu weight bytes streamed in the last step\n",
           (unsigned long long)budget, (unsigned long long)bf16_bytes, peak, (unsigned long long)h2d);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: lora_test FIXTURE_DIR...\n");
        return 2;
    }
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s/lora_test.XXXXXX", tmp ? tmp : "/tmp");
    if (!mkdtemp(g_tmp)) {
        perror("mkdtemp");
        return 2;
    }
    for (int i = 1; i < argc; i++) check_fixture(argv[i]);
    check_dropout(argv[argc - 1], &g_last_auto);
    check_merge(argv[argc - 1], g_last_scale);
    check_small_budget();
    if (th_failures()) fprintf(stderr, "lora_test: %d failure(s)\n", th_failures());
    else printf("lora_test: ok\n");
    return th_failures() ? 1 : 0;
}
