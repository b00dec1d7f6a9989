/* `moetune plan` end to end on the shipped config.json files and hardware
 * profiles: the four planning cases (exit codes, the short budget, what is
 * needed), --json parses and holds the documented keys, every model config
 * plans, --trace writes a Chrome trace, bad command lines are refused. */
#include "tools/plan/plan_cmd.h"

#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int failures;
#define EXPECT(c, ...)                                                                  \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s: ", __FILE__, __LINE__, #c); \
            fprintf(stderr, __VA_ARGS__);                                               \
            fprintf(stderr, "\n");                                                      \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

static const double GiB = 1073741824.0;
static char g_tmp[512], g_cwd[1024];

/* Runs mt_plan_main with stdout and stderr captured into files; returns its exit code. */
static int run_plan(const char *const *args, int nargs, char **out, char **errtext) {
    char *argv[32];
    int argc = 0;
    argv[argc++] = (char *)"plan";
    for (int i = 0; i < nargs && argc < 31; i++) argv[argc++] = (char *)args[i];
    argv[argc] = NULL;
    char opath[700], epath[700];
    snprintf(opath, sizeof opath, "%s/out.txt", g_tmp);
    snprintf(epath, sizeof epath, "%s/err.txt", g_tmp);
    fflush(stdout);
    fflush(stderr);
    int so = dup(1), se = dup(2);
    int fo = open(opath, O_WRONLY | O_CREAT | O_TRUNC, 0644), fe = open(epath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fo, 1);
    dup2(fe, 2);
    int rc = mt_plan_main(argc, argv);
    fflush(stdout);
    fflush(stderr);
    dup2(so, 1);
    dup2(se, 2);
    close(so), close(se), close(fo), close(fe);
    const char *paths[2] = {opath, epath};
    char **dst[2] = {out, errtext};
    for (int k = 0; k < 2; k++) {
        FILE *f = fopen(paths[k], "rb");
        fseek(f, 0, SEEK_END);
        long n = ftell(f);
        fseek(f, 0, SEEK_SET);
        *dst[k] = malloc((size_t)n + 1);
        size_t got = fread(*dst[k], 1, (size_t)n, f);
        (*dst[k])[got] = '\0';
        fclose(f);
    }
    return rc;
}

/* A run config under $TEST_TMPDIR/runs/NAME.yaml for configs/models/MODEL. */
static void write_run(const char *name, const char *model, const char *extra) {
    char path[800];
    snprintf(path, sizeof path, "%s/runs", g_tmp);
    mkdir(path, 0755);
    snprintf(path, sizeof path, "%s/runs/%s.yaml", g_tmp, name);
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL, "cannot write %s", path);
    if (!f) return;
    fprintf(f, "base_model: %s/configs/models/%s\n%s", g_cwd, model, extra);
    fclose(f);
}

static json_t *plan_json(const char *run, const char *hw, const char *set1, const char *set2, int *rc) {
    char path[800];
    snprintf(path, sizeof path, "%s/runs/%s.yaml", g_tmp, run);
    const char *args[10];
    int n = 0;
    args[n++] = path;
    args[n++] = "--json";
    if (hw) args[n++] = "--hw", args[n++] = hw;
    if (set1) args[n++] = "--set", args[n++] = set1;
    if (set2) args[n++] = "--set", args[n++] = set2;
    char *out, *err;
    *rc = run_plan(args, n, &out, &err);
    json_error_t je;
    json_t *doc = json_loads(out, 0, &je);
    EXPECT(doc != NULL, "%s: --json output does not parse (%s): %.300s / stderr %.300s", run, je.text, out, err);
    free(out);
    free(err);
    return doc;
}

static double num(json_t *doc, const char *a, const char *b) {
    json_t *x = json_object_get(doc, a);
    if (b) x = json_object_get(x, b);
    return json_is_number(x) ? json_number_value(x) : NAN;
}

static void test_mixtral(void) {
    write_run("mixtral", "mixtral-8x7b",
              "sequence_len: 4096\nbf16: true\nmax_grad_norm: 1.0\nmemory: {device: 80GiB, host: 1TiB}\n");
    int rc;
    json_t *d = plan_json("mixtral", "h100-80gb-pcie", NULL, NULL, &rc);
    if (!d) return;
    EXPECT(rc == 0, "exit %d", rc);
    EXPECT(strcmp(json_string_value(json_object_get(d, "schema")), "moetune.plan/1") == 0, "schema");
    EXPECT(json_is_true(json_object_get(d, "feasible")), "feasible");
    EXPECT(num(d, "model", "params") == 46702792704.0, "params %.0f", num(d, "model", "params"));
    EXPECT(num(d, "prediction", "step_time_s") > 0 && num(d, "prediction", "tokens_per_s") > 0, "prediction");
    EXPECT(num(d, "prediction", "mfu") > 0 && num(d, "prediction", "mfu") < 1, "mfu %g", num(d, "prediction", "mfu"));
    json_t *mem = json_object_get(d, "memory");
    const char *kinds[] = {"device", "pinned", "host"};
    for (int i = 0; i < 3; i++) {
        json_t *k = json_object_get(mem, kinds[i]);
        EXPECT(num(k, "peak_bytes", NULL) <= num(k, "budget_bytes", NULL), "%s within budget", kinds[i]);
    }
    EXPECT(num(mem, "device", "budget_bytes") == 80 * GiB, "device budget from memory.device");
    json_t *plan = json_object_get(d, "plan");
    EXPECT(json_array_size(json_object_get(plan, "blocks")) == 34, "34 blocks");
    EXPECT(json_array_size(json_object_get(plan, "runs")) >= 3, "runs");
    EXPECT(json_is_string(json_object_get(json_object_get(d, "prediction"), "bound_by")), "bound_by");
    EXPECT(json_is_object(json_object_get(json_object_get(d, "kinds"), "activations")), "kinds");
    json_decref(d);

    d = plan_json("mixtral", "h100-80gb-pcie", "memory.host=512GiB", NULL, &rc);
    if (!d) return;
    EXPECT(rc == 3, "infeasible exits 3, got %d", rc);
    EXPECT(json_is_false(json_object_get(d, "feasible")), "512 GiB host is not enough");
    json_t *sh = json_object_get(d, "short");
    EXPECT(json_array_size(sh) == 1 && strcmp(json_string_value(json_array_get(sh, 0)), "host") == 0, "host short");
    double need = num(d, "needed_bytes", "host");
    EXPECT(need > 512 * GiB && need < 1024 * GiB, "needed host %.1f GiB", need / GiB);
    const char *why = json_string_value(json_object_get(d, "reason"));
    EXPECT(why && strstr(why, "host memory is short") && strstr(why, "alone is 521.9 GiB"), "reason %s", why);
    json_decref(d);

    /* text mode says the same */
    char path[800];
    snprintf(path, sizeof path, "%s/runs/mixtral.yaml", g_tmp);
    const char *args[] = {path, "--hw", "h100-80gb-pcie", "--set", "memory.host=512GiB"};
    char *out, *err;
    rc = run_plan(args, 5, &out, &err);
    EXPECT(rc == 3 && strstr(out, "INFEASIBLE: ") && strstr(out, "host memory is short") && strstr(out, "<- short"),
           "text: %.400s", out);
    free(out);
    free(err);
}

static void test_qwen3(void) {
    write_run("qwen3", "qwen3-30b-a3b",
              "sequence_len: 2048\nbf16: true\nadapter: lora\nlora_r: 16\n"
              "lora_target_modules: [q_proj, k_proj, v_proj, o_proj]\nhardware: rtx4090\n"
              "memory: {host: 128GiB}\n");
    int rc;
    json_t *d = plan_json("qwen3", NULL, NULL, NULL, &rc); /* hardware: from the run config */
    if (!d) return;
    EXPECT(rc == 0 && json_is_true(json_object_get(d, "feasible")), "Qwen3 LoRA on a 4090: exit %d", rc);
    EXPECT(num(d, "model", "params") == 30532122624.0, "qwen3 params %.0f", num(d, "model", "params"));
    EXPECT(strcmp(json_string_value(json_object_get(json_object_get(d, "run"), "adapter")), "lora") == 0, "lora");
    /* memory.device not set: the profile's capacity is the budget; memory.host from the run config */
    json_t *mem = json_object_get(d, "memory");
    EXPECT(num(mem, "device", "budget_bytes") == 24 * GiB && num(mem, "host", "budget_bytes") == 128 * GiB,
           "budgets %g %g", num(mem, "device", "budget_bytes"), num(mem, "host", "budget_bytes"));
    /* pinned staging for the plan's window; max_slot needs >= 4x compact (128 experts of
       768x2048 against a 151936x2048 embedding), compact stays within 1.10x of the payload */
    json_t *stg = json_object_get(d, "staging");
    EXPECT(num(stg, "max_slot_bytes", NULL) >= 4 * num(stg, "compact_bytes", NULL), "max_slot %g vs compact %g",
           num(stg, "max_slot_bytes", NULL), num(stg, "compact_bytes", NULL));
    EXPECT(num(stg, "compact_bytes", NULL) <= 1.10 * num(stg, "payload_bytes", NULL) &&
               num(stg, "per_tensor_bytes", NULL) >= num(stg, "compact_bytes", NULL),
           "compact %g, per_tensor %g, payload %g", num(stg, "compact_bytes", NULL), num(stg, "per_tensor_bytes", NULL),
           num(stg, "payload_bytes", NULL));
    EXPECT(num(json_object_get(stg, "host_total_bytes"), "compact", NULL) > num(mem, "host", "peak_bytes"),
           "host total includes the pinned staging");
    json_decref(d);
    d = plan_json("qwen3", NULL, "memory.device=1GiB", NULL, &rc);
    if (!d) return;
    EXPECT(rc == 3 && json_is_false(json_object_get(d, "feasible")), "1 GiB device: exit %d", rc);
    const char *why = json_string_value(json_object_get(d, "reason"));
    EXPECT(why && strstr(why, "device memory is short") && strstr(why, "smaller than one block's working set"),
           "reason %s", why);
    EXPECT(num(d, "needed_bytes", "device") > 1 * GiB, "needed device");
    json_decref(d);

    /* 16 micro-batches of 2048 tokens: weights streamed once per step
     * instead of once per micro-batch; both orders are planned and reported */
    d = plan_json("qwen3", NULL, "gradient_accumulation_steps=16", NULL, &rc);
    if (!d) return;
    json_t *orders = json_object_get(d, "step_orders");
    const double mb = num(orders, "micro_batch", "tokens_per_s"), lm = num(orders, "layer", "tokens_per_s");
    EXPECT(rc == 0 && strcmp(json_string_value(json_object_get(d, "step_order")), "layer") == 0,
           "16 micro-batches on a 4090: exit %d, order %s", rc, json_string_value(json_object_get(d, "step_order")));
    EXPECT(lm >= 4 * mb && num(d, "prediction", "tokens_per_s") == lm, "layer-major %.0f tokens/s vs %.0f", lm, mb);
    EXPECT(num(orders, "layer", "h2d_bytes") * 8 < num(orders, "micro_batch", "h2d_bytes"), "h2d %g vs %g",
           num(orders, "layer", "h2d_bytes"), num(orders, "micro_batch", "h2d_bytes"));
    json_decref(d);
    d = plan_json("qwen3", NULL, "gradient_accumulation_steps=16", "step_order=micro_batch", &rc);
    if (!d) return;
    EXPECT(strcmp(json_string_value(json_object_get(d, "step_order")), "micro_batch") == 0 &&
               json_object_get(json_object_get(d, "step_orders"), "layer") == NULL,
           "step_order: micro_batch is planned alone");
    json_decref(d);
}

static void test_every_model(void) {
    static const struct {
        const char *dir;
        double params_lo, params_hi; /* model cards' totals, +-1% */
    } models[] = {
        {"mixtral-8x22b", 139e9, 142e9},   {"qwen2-57b-a14b", 57.0e9, 57.8e9},
        {"qwen1.5-moe-a2.7b", 14.2e9, 14.4e9}, {"olmoe-1b-7b", 6.9e9, 6.95e9},
        {"mixtral-8x7b", 46.7e9, 46.71e9},  {"qwen3-30b-a3b", 30.5e9, 30.6e9},
        /* the later families: 671B without the MTP layer,
         * 106B, 21B (20.91B in the model card), 117B (116.83B) */
        {"deepseek-v3", 664.3e9, 677.7e9}, {"glm-4.5-air", 104.9e9, 107.1e9},
        {"gpt-oss-20b", 20.79e9, 21.21e9}, {"gpt-oss-120b", 115.8e9, 118.2e9},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        write_run(models[i].dir, models[i].dir, "sequence_len: 1024\nbf16: true\nmax_grad_norm: 0\n");
        int rc;
        json_t *d = plan_json(models[i].dir, "h200", NULL, NULL, &rc);
        if (!d) continue;
        EXPECT(rc == 0 || rc == 3, "%s: exit %d", models[i].dir, rc);
        double p = num(d, "model", "params");
        EXPECT(p >= models[i].params_lo && p <= models[i].params_hi, "%s: params %.4g", models[i].dir, p);
        EXPECT(num(d, "prediction", "step_time_s") > 0, "%s: step time", models[i].dir);
        json_decref(d);
    }
}

/* The committed planning examples of the families moetune describes but
 * cannot train yet: each plans from its config.json alone. */
static void test_committed_runs(void) {
    static const char *const runs[] = {"deepseek-v3-h100-lora", "glm-4.5-air-h100-lora", "gpt-oss-20b-rtx4090-lora",
                                       "gpt-oss-120b-h100-lora"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        char path[1200];
        snprintf(path, sizeof path, "%s/configs/runs/%s.yaml", g_cwd, runs[i]);
        const char *args[] = {path, "--json"};
        char *out, *err;
        int rc = run_plan(args, 2, &out, &err);
        json_error_t je;
        json_t *d = json_loads(out, 0, &je);
        EXPECT(d != NULL && rc == 0, "%s: exit %d, %.300s / stderr %.300s", runs[i], rc, out, err);
        if (d) {
            EXPECT(num(d, "prediction", "step_time_s") > 0, "%s: step time", runs[i]);
            json_decref(d);
        }
        free(out);
        free(err);
    }
}

/* A committed run config planned with --json (and one --set when given). */
static json_t *committed_json(const char *run, const char *set, int *rc) {
    char path[1200];
    snprintf(path, sizeof path, "%s/configs/runs/%s.yaml", g_cwd, run);
    const char *args[] = {path, "--json", "--set", set};
    char *out, *err;
    *rc = run_plan(args, set ? 4 : 2, &out, &err);
    json_error_t je;
    json_t *d = json_loads(out, 0, &je);
    EXPECT(d != NULL, "%s: exit %d, %.300s / stderr %.300s", run, *rc, out, err);
    free(out);
    free(err);
    return d;
}

static double peak(json_t *d, const char *kind, const char *what) {
    return num(json_object_get(json_object_get(d, "memory"), kind), what, NULL);
}

/* DeepSeek-V3 LoRA on one H100, 8 micro-batches per step: layer-major fits
 * once layers' block inputs wait in host memory, and is chosen, faster than
 * micro-batch order; with the inputs kept it does not fit, as the report
 * says, and micro-batch order is chosen. */
static void test_layer_major_fits(void) {
    int rc;
    json_t *d = committed_json("deepseek-v3-h100-lora", NULL, &rc);
    if (!d) return;
    json_t *orders = json_object_get(d, "step_orders");
    const char *order = json_string_value(json_object_get(d, "step_order"));
    EXPECT(rc == 0 && json_is_true(json_object_get(d, "feasible")) && order && strcmp(order, "layer") == 0,
           "deepseek-v3-h100-lora: exit %d, order %s", rc, order ? order : "?");
    const double tps = num(d, "prediction", "tokens_per_s");
    EXPECT(tps >= 500 && tps > 2 * num(orders, "micro_batch", "tokens_per_s"), "layer-major %.0f tokens/s vs %.0f",
           tps, num(orders, "micro_batch", "tokens_per_s"));
    EXPECT(peak(d, "device", "peak_bytes") <= peak(d, "device", "budget_bytes"), "device peak %g of %g",
           peak(d, "device", "peak_bytes"), peak(d, "device", "budget_bytes"));
    const double nin = num(orders, "layer", "inputs_offloaded_layers");
    EXPECT(nin >= 1 && num(orders, "layer", "input_bytes") > 0, "inputs of %g layers offloaded, %g bytes", nin,
           num(orders, "layer", "input_bytes"));
    json_t *blocks = json_object_get(json_object_get(d, "plan"), "blocks");
    const size_t nb = json_array_size(blocks);
    int offl = 0;
    for (size_t b = 0; b < nb; b++) {
        json_t *bi = json_object_get(json_array_get(blocks, b), "block_inputs");
        if (b == 0 || b == nb - 1) EXPECT(json_is_null(bi), "block %zu: block_inputs should be null", b);
        else offl += json_is_string(bi) && strcmp(json_string_value(bi), "offload") == 0;
    }
    EXPECT(offl == (int)nin && nb == 63, "%d of %zu blocks offload their inputs, the order says %g", offl, nb, nin);
    json_decref(d);

    d = committed_json("deepseek-v3-h100-lora", "scheduler.block_inputs=keep", &rc);
    if (!d) return;
    orders = json_object_get(d, "step_orders");
    order = json_string_value(json_object_get(d, "step_order"));
    EXPECT(order && strcmp(order, "micro_batch") == 0 && json_is_false(json_object_get(json_object_get(orders, "layer"),
                                                                                      "feasible")),
           "block inputs kept: order %s", order ? order : "?");
    json_decref(d);
    char path[1200];
    snprintf(path, sizeof path, "%s/configs/runs/deepseek-v3-h100-lora.yaml", g_cwd);
    const char *args[] = {path, "--set", "scheduler.block_inputs=keep"};
    char *out, *err;
    rc = run_plan(args, 3, &out, &err);
    EXPECT(strstr(out, "layer-major does not fit: it holds 8 micro-batches' block inputs"), "text: %.400s", out);
    free(out);
    free(err);
    const char *args2[] = {path};
    rc = run_plan(args2, 1, &out, &err);
    EXPECT(rc == 0 && strstr(out, "step order      layer-major") && strstr(out, "block inputs") &&
               strstr(out, "wait in host memory"),
           "text: %.600s", out);
    free(out);
    free(err);
}

/* Full fine-tuning beyond host memory: feasible only with the NVMe tier,
 * which it fills within its budget, and which bounds the step. */
static void test_nvme_runs(void) {
    static const char *const runs[] = {"qwen3-235b-a22b-h100-nvme-full", "mixtral-8x22b-h100-nvme-full"};
    for (size_t i = 0; i < sizeof runs / sizeof runs[0]; i++) {
        int rc;
        json_t *d = committed_json(runs[i], NULL, &rc);
        if (!d) continue;
        json_t *nv = json_object_get(d, "nvme");
        EXPECT(rc == 0 && json_is_true(json_object_get(d, "feasible")), "%s: exit %d", runs[i], rc);
        EXPECT(num(nv, "read_bytes", NULL) > 0 && num(nv, "write_bytes", NULL) > 0 && num(nv, "busy_s", NULL) > 0,
               "%s: NVMe traffic", runs[i]);
        EXPECT(num(nv, "bytes", NULL) > 1e12 && num(nv, "bytes", NULL) <= num(nv, "budget_bytes", NULL),
               "%s: NVMe holds %g of %g", runs[i], num(nv, "bytes", NULL), num(nv, "budget_bytes", NULL));
        EXPECT(peak(d, "host", "peak_bytes") <= peak(d, "host", "budget_bytes") &&
                   peak(d, "device", "peak_bytes") <= peak(d, "device", "budget_bytes") &&
                   peak(d, "pinned", "peak_bytes") <= peak(d, "pinned", "budget_bytes"),
               "%s: within the budgets", runs[i]);
        /* the optimizer state alone is more than host memory: it must be on NVMe */
        EXPECT(num(nv, "optimizer_bytes", NULL) > peak(d, "host", "budget_bytes"), "%s: optimizer on NVMe %g", runs[i],
               num(nv, "optimizer_bytes", NULL));
        const char *bound = json_string_value(json_object_get(json_object_get(d, "prediction"), "bound_by"));
        EXPECT(bound && strcmp(bound, "nvme") == 0, "%s: bound by %s", runs[i], bound ? bound : "?");
        EXPECT(num(d, "prediction", "tokens_per_s") > 0, "%s: tokens/s", runs[i]);
        json_decref(d);
    }
    /* without the tier the same run does not fit, and says what would */
    int rc;
    json_t *d = committed_json("mixtral-8x22b-h100-nvme-full", "memory.nvme.path=", &rc);
    if (d) {
        EXPECT(rc == 3 && json_is_false(json_object_get(d, "feasible")) && !json_object_get(d, "nvme"),
               "without NVMe: exit %d", rc);
        const char *why = json_string_value(json_object_get(d, "reason"));
        EXPECT(why && strstr(why, "host memory is short") && strstr(why, "NVMe tier"), "reason: %s", why ? why : "?");
        json_decref(d);
    }
}

/* Quantized bases: counted at their stored size, and what that buys. */
static void test_quantized_runs(void) {
    int rc;
    json_t *q = committed_json("qwen3-30b-a3b-rtx4090-qlora", NULL, &rc);
    json_t *b = committed_json("qwen3-30b-a3b-rtx4090-lora", NULL, &rc);
    if (q && b) {
        json_t *bq = json_object_get(q, "base_quant");
        EXPECT(json_is_true(json_object_get(q, "feasible")) && json_is_true(json_object_get(bq, "double_quant")) &&
                   strcmp(json_string_value(json_object_get(bq, "format")), "nf4") == 0,
               "QLoRA: nf4 with double quant");
        /* 4 bits + a byte of absmax per 64 + 4 bytes per 256 blocks over bf16's 16 bits */
        const double ratio = num(bq, "stored_bytes", NULL) / num(bq, "working_dtype_bytes", NULL);
        EXPECT(fabs(ratio - (0.5 + (1 + 4.0 / 256) / 64) / 2) < 1e-9, "NF4 bytes / bf16 bytes %g", ratio);
        EXPECT(!json_object_get(b, "base_quant"), "the bf16 run has no quantized base");
        /* link traffic compared in one step order (the planner may pick either, and with it how much
         * it streams) */
        json_t *ql = json_object_get(json_object_get(q, "step_orders"), "layer");
        json_t *bl = json_object_get(json_object_get(b, "step_orders"), "layer");
        EXPECT(num(q, "prediction", "tokens_per_s") > num(b, "prediction", "tokens_per_s") &&
                   num(ql, "h2d_bytes", NULL) < 0.5 * num(bl, "h2d_bytes", NULL) &&
                   peak(q, "host", "peak_bytes") < 0.5 * peak(b, "host", "peak_bytes"),
               "QLoRA %g tokens/s, %g B h2d layer-major vs bf16 %g tokens/s, %g B", num(q, "prediction", "tokens_per_s"),
               num(ql, "h2d_bytes", NULL), num(b, "prediction", "tokens_per_s"), num(bl, "h2d_bytes", NULL));
    }
    json_decref(q);
    json_decref(b);
    /* the whole 4-bit base resident on the 24 GB card: no weight crosses
     * the link (activations may: with the routed experts' bf16 ones the
     * planner offloads some layers' where that beats recomputing them) */
    json_t *r = committed_json("qwen3-30b-a3b-rtx4090-qlora", "scheduler.weights=resident", &rc);
    if (r) {
        json_t *kw = json_object_get(json_object_get(r, "kinds"), "weights");
        EXPECT(rc == 0 && kw && num(kw, "fetched_bytes", NULL) == 0 && num(kw, "stream_blocks", NULL) == 0,
               "resident QLoRA: exit %d, weights fetched %g bytes in %g streamed blocks", rc,
               kw ? num(kw, "fetched_bytes", NULL) : -1.0, kw ? num(kw, "stream_blocks", NULL) : -1.0);
        json_decref(r);
    }
    json_t *f = committed_json("deepseek-v3-fp8-h100-lora", NULL, &rc);
    if (f) {
        json_t *bq = json_object_get(f, "base_quant");
        EXPECT(rc == 0 && strcmp(json_string_value(json_object_get(bq, "format")), "fp8") == 0, "DeepSeek FP8: %d", rc);
        EXPECT(peak(f, "host", "peak_bytes") + peak(f, "pinned", "budget_bytes") <= 768 * GiB,
               "DeepSeek-V3 FP8 LoRA host %g", peak(f, "host", "peak_bytes"));
        EXPECT(num(bq, "stored_bytes", NULL) <= 0.55 * num(bq, "working_dtype_bytes", NULL), "FP8 bytes");
        json_decref(f);
    }
    json_t *g = committed_json("gpt-oss-120b-h100-lora", NULL, &rc);
    if (g) {
        json_t *bq = json_object_get(g, "base_quant");
        EXPECT(rc == 0 && strcmp(json_string_value(json_object_get(bq, "format")), "mxfp4") == 0 &&
                   json_is_true(json_object_get(bq, "experts_only")),
               "gpt-oss MXFP4 experts");
        EXPECT(peak(g, "host", "peak_bytes") <= 80e9, "gpt-oss-120b MXFP4 LoRA host %g B", peak(g, "host", "peak_bytes"));
        json_decref(g);
    }
}

static void test_cli(void) {
    char path[800], trace[800];
    snprintf(path, sizeof path, "%s/runs/olmoe-1b-7b.yaml", g_tmp);
    snprintf(trace, sizeof trace, "%s/trace.json", g_tmp);
    char *out, *err;
    /* no hardware anywhere */
    const char *a1[] = {path};
    int rc = run_plan(a1, 1, &out, &err);
    EXPECT(rc == 1 && strstr(err, "--hw"), "no profile: %d %s", rc, err);
    free(out), free(err);
    const char *a2[] = {path, "--frobnicate"};
    rc = run_plan(a2, 2, &out, &err);
    EXPECT(rc == 2 && strstr(err, "unexpected argument"), "bad flag: %d %s", rc, err);
    free(out), free(err);
    const char *a3[] = {path, "--hw", "no-such-gpu"};
    rc = run_plan(a3, 3, &out, &err);
    EXPECT(rc == 1 && strstr(err, "no-such-gpu"), "unknown profile: %d %s", rc, err);
    free(out), free(err);
    /* text output and a trace */
    const char *a4[] = {path, "--hw", "gh200", "--trace", trace};
    rc = run_plan(a4, 5, &out, &err);
    EXPECT(rc == 0 && strstr(out, "FEASIBLE") && strstr(out, "decisions") && strstr(out, "bound by"), "text: %.300s",
           out);
    free(out), free(err);
    json_error_t je;
    json_t *t = json_load_file(trace, 0, &je);
    EXPECT(t && json_array_size(json_object_get(t, "traceEvents")) > 10, "trace: %s", je.text);
    json_decref(t);
    /* a LoRA target that is not in the model */
    const char *a5[] = {path, "--hw", "gh200", "--set", "adapter=lora", "--set", "lora_target_modules=[w1]"};
    rc = run_plan(a5, 7, &out, &err);
    EXPECT(rc == 1 && strstr(err, "'w1' matches no module"), "bad target: %d %s", rc, err);
    free(out), free(err);
    /* measuring this machine instead of a profile */
    const char *a6[] = {path, "--hw", "calibrate", "--set", "sequence_len=64", "--json"};
    rc = run_plan(a6, 6, &out, &err);
    json_t *d = json_loads(out, 0, &je);
    EXPECT(d && strcmp(json_string_value(json_object_get(json_object_get(d, "hardware"), "source")), "calibrate") == 0,
           "calibrate: %d %.200s %s", rc, out, err);
    EXPECT(d && json_is_true(json_object_get(json_object_get(d, "run"), "bf16_working_copies")),
           "bf16: true keeps bf16 working copies on the CPU backend too");
    json_decref(d);
    free(out), free(err);
}

/* --devices 2: data parallel, each device's share planned over its own
 * link; the JSON's data_parallel section adds up, and a step count that
 * does not divide is refused naming both keys. */
static void test_devices(void) {
    write_run("mixtral_dp", "mixtral-8x7b",
              "sequence_len: 4096\nbf16: true\ngradient_accumulation_steps: 8\nmemory: {device: 80GiB, host: 1TiB}\n");
    char path[800];
    snprintf(path, sizeof path, "%s/runs/mixtral_dp.yaml", g_tmp);
    const char *a1[] = {path, "--hw", "h100-80gb-pcie", "--devices", "2", "--json"};
    char *out, *err;
    int rc = run_plan(a1, 6, &out, &err);
    json_error_t je;
    json_t *d = json_loads(out, 0, &je);
    EXPECT(rc == 0 && d, "exit %d, %s", rc, err);
    json_t *dp = json_object_get(d, "data_parallel");
    EXPECT(json_is_object(dp), "data_parallel section: %.300s", out);
    if (json_is_object(dp)) {
        const double step = num(dp, "step_time_s", NULL), fb = num(dp, "fwd_bwd_s", NULL);
        const double parts = fb + num(dp, "reduce_s", NULL) + num(dp, "optim_s", NULL) + num(dp, "refresh_s", NULL);
        EXPECT(num(dp, "devices", NULL) == 2 && num(dp, "micro_batches_per_device", NULL) == 4, "2 devices x 4");
        EXPECT(step > 0 && fabs(step - parts) <= 1e-9 * step, "step %g = parts %g", step, parts);
        EXPECT(num(dp, "reduce_s", NULL) > 0, "the gradients are summed across devices");
        /* tokens/s counts both devices' micro-batches: 8 x 4096 tokens per step */
        EXPECT(fabs(num(dp, "tokens_per_s", NULL) * step - 8 * 4096.0) < 1e-6 * 8 * 4096, "tokens/s");
        json_t *per = json_object_get(dp, "per_device");
        EXPECT(json_array_size(per) == 2, "per device");
        double sum = 0;
        for (size_t i = 0; i < json_array_size(per); i++) sum += num(json_array_get(per, i), "h2d_bytes", NULL);
        EXPECT(sum > 0 && fabs(sum - num(dp, "h2d_bytes_total", NULL)) <= 1e-9 * sum, "H2D per device adds up");
        /* each device streams its own copy of the weights over its own link: the
         * H2D each one moves is at least the single device's weight traffic
         * for half the micro-batches, not half of it */
        EXPECT(num(json_array_get(per, 1), "h2d_bytes", NULL) > 0, "device 1 has its own link traffic");
    }
    json_decref(d);
    free(out), free(err);
    const char *a2[] = {path, "--hw", "h100-80gb-pcie", "--devices", "3"};
    rc = run_plan(a2, 5, &out, &err);
    EXPECT(rc == 1 && strstr(err, "gradient_accumulation_steps (8)") && strstr(err, "devices (3)"), "K=8 on 3: %d %s",
           rc, err);
    free(out), free(err);
    const char *a3[] = {path, "--hw", "h100-80gb-pcie", "--devices", "2", "--set", "parallel=data"};
    rc = run_plan(a3, 7, &out, &err);
    EXPECT(rc == 0 && strstr(out, "data parallel on 2 devices") && strstr(out, "each other"), "text: %d %.300s", rc,
           err);
    free(out), free(err);
}

/* One run with --devices 2 and parallel: ASK; the data_parallel section. */
static json_t *parallel_json(const char *path, const char *hw, const char *ask, char **text) {
    char set[64];
    snprintf(set, sizeof set, "parallel=%s", ask);
    const char *a[] = {path, "--hw", hw, "--devices", "2", "--set", set, "--json"};
    char *out, *err;
    int rc = run_plan(a, text ? 7 : 8, &out, &err);
    EXPECT(rc == 0, "parallel: %s: exit %d, %.300s", ask, rc, err);
    json_t *d = NULL;
    if (text) {
        *text = out;
    } else {
        json_error_t je;
        d = json_loads(out, 0, &je);
        EXPECT(d != NULL, "parallel: %s: JSON does not parse: %.300s", ask, out);
        free(out);
    }
    free(err);
    return d;
}

static double layout_num(json_t *dp, const char *layout, const char *key) {
    return num(json_object_get(dp, "layouts"), layout, key);
}

/* --devices 2 with MoE layers: all-data, the planner's per-layer mix and
 * all-expert, each with its step, per-device link bytes and peaks and the
 * peer exchange; the choice per MoE layer; parallel: data and expert force
 * the layout; expert on one device is refused naming the key. */
static void test_expert_parallel(void) {
    write_run("mixtral_ep", "mixtral-8x7b",
              "sequence_len: 4096\nbf16: true\ngradient_accumulation_steps: 8\nmemory: {device: 80GiB, host: 1TiB}\n");
    char path[800];
    snprintf(path, sizeof path, "%s/runs/mixtral_ep.yaml", g_tmp);
    static const char *const asks[3] = {"auto", "data", "expert"};
    static const char *const used[3] = {"mix", "data", "expert"};
    double steps[3] = {0};
    for (int k = 0; k < 3; k++) {
        json_t *d = parallel_json(path, "h100-80gb-pcie", asks[k], NULL);
        json_t *dp = json_object_get(d, "data_parallel");
        EXPECT(json_is_object(json_object_get(dp, "layouts")), "layouts");
        if (!json_is_object(json_object_get(dp, "layouts"))) {
            json_decref(d);
            continue;
        }
        const char *lay = json_string_value(json_object_get(dp, "layout"));
        EXPECT(lay && strcmp(lay, used[k]) == 0 && strcmp(json_string_value(json_object_get(dp, "parallel")), asks[k]) == 0,
               "parallel: %s uses %s", asks[k], lay ? lay : "?");
        EXPECT(json_is_null(json_object_get(dp, "expert_parallel_refused")), "full fine-tuning runs expert parallel");
        EXPECT(json_is_true(json_object_get(dp, "peer_via_host")), "the PCIe profile exchanges through the host");
        const double sd = layout_num(dp, "data", "step_time_s"), sm = layout_num(dp, "mix", "step_time_s"),
                     se = layout_num(dp, "expert", "step_time_s");
        EXPECT(sd > 0 && se > 0 && sm > 0 && sm <= sd && sm <= se, "mix %g, data %g, expert %g", sm, sd, se);
        /* the section's numbers are the used layout's */
        EXPECT(num(dp, "step_time_s", NULL) == layout_num(dp, used[k], "step_time_s"), "used layout's step");
        steps[k] = num(dp, "step_time_s", NULL);
        EXPECT(layout_num(dp, "data", "peer_bytes") == 0 && layout_num(dp, "data", "expert_parallel_layers") == 0,
               "all data: no exchange");
        EXPECT(layout_num(dp, "expert", "peer_bytes") > 0 && layout_num(dp, "expert", "expert_parallel_layers") == 32,
               "all expert: 32 layers exchange");
        /* only the replicated tensors' gradients are summed between the devices */
        EXPECT(layout_num(dp, "expert", "reduce_device_bytes") < layout_num(dp, "data", "reduce_device_bytes") ||
                   layout_num(dp, "data", "reduce_device_bytes") == 0,
               "fewer gradients reduced");
        json_t *per = json_object_get(json_object_get(json_object_get(dp, "layouts"), "expert"), "per_device");
        EXPECT(json_array_size(per) == 2, "per device");
        for (size_t i = 0; i < json_array_size(per); i++) {
            json_t *x = json_array_get(per, i);
            /* through host memory each device's link carries the rows it sends and receives */
            EXPECT(num(x, "peak_device_bytes", NULL) > 0 && num(x, "peak_device_bytes", NULL) <= 80 * GiB &&
                       num(x, "h2d_bytes", NULL) > layout_num(dp, "expert", "peer_bytes") &&
                       num(x, "d2h_bytes", NULL) > layout_num(dp, "expert", "peer_bytes"),
                   "device %zu", i);
        }
        json_t *moe = json_object_get(dp, "moe_layers");
        int ep = 0;
        for (size_t i = 0; i < json_array_size(moe); i++)
            ep += json_is_true(json_object_get(json_array_get(moe, i), "expert_parallel"));
        EXPECT(json_array_size(moe) == 32 && (k != 1 || ep == 0) && (k != 2 || ep == 32),
               "moe_layers: %zu, %d expert parallel", json_array_size(moe), ep);
        EXPECT(k != 0 || ep == (int)layout_num(dp, "mix", "expert_parallel_layers"), "the mix's choice is listed");
        json_decref(d);
    }
    EXPECT(steps[0] <= steps[1] && steps[0] <= steps[2], "auto is never slower: %g %g %g", steps[0], steps[1],
           steps[2]);
    char *text;
    parallel_json(path, "h100-80gb-pcie", "auto", &text);
    EXPECT(strstr(text, "all data parallel") && strstr(text, "planner's per-layer mix") &&
               strstr(text, "all expert parallel") && strstr(text, "choice per MoE layer: layers 0-31") &&
               strstr(text, "device 1: link H2D") && strstr(text, "peak device memory") &&
               strstr(text, "peer exchange:"),
           "text: %.2000s", text);
    free(text);
    /* a direct peer link (NVLink) makes the exchange cheap and keeps it off the host links */
    json_t *d = parallel_json(path, "h100-sxm", "expert", NULL);
    json_t *dp = json_object_get(d, "data_parallel");
    EXPECT(json_is_false(json_object_get(dp, "peer_via_host")) && num(dp, "peer_bytes", NULL) > 0, "NVLink");
    json_decref(d);
    /* expert on one device: refused, naming the key */
    const char *a[] = {path, "--hw", "h100-80gb-pcie", "--set", "parallel=expert"};
    char *out, *err;
    int rc = run_plan(a, 5, &out, &err);
    EXPECT(rc == 1 && strstr(err, "parallel: expert") && strstr(err, "2 devices"), "one device: %d %s", rc, err);
    free(out), free(err);
    /* a LoRA run trains data parallel: auto plans it so and says why, expert is refused */
    write_run("qwen3_ep_lora", "qwen3-30b-a3b",
              "sequence_len: 4096\nbf16: true\ngradient_accumulation_steps: 8\nadapter: lora\nlora_r: 16\n"
              "lora_target_modules: [q_proj, v_proj]\nmemory: {device: 80GiB, host: 1TiB}\n");
    snprintf(path, sizeof path, "%s/runs/qwen3_ep_lora.yaml", g_tmp);
    d = parallel_json(path, "h100-80gb-pcie", "auto", NULL);
    dp = json_object_get(d, "data_parallel");
    const char *lay = json_string_value(json_object_get(dp, "layout"));
    const char *why = json_string_value(json_object_get(dp, "expert_parallel_refused"));
    EXPECT(lay && strcmp(lay, "data") == 0 && why && strstr(why, "LoRA"), "LoRA: layout %s, refused %s",
           lay ? lay : "?", why ? why : "(null)");
    json_decref(d);
    const char *a4[] = {path, "--hw", "h100-80gb-pcie", "--devices", "2", "--set", "parallel=expert"};
    rc = run_plan(a4, 7, &out, &err);
    EXPECT(rc == 1 && strstr(err, "parallel: expert") && strstr(err, "LoRA"), "LoRA, expert: %d %s", rc, err);
    free(out), free(err);
}

/* Mixtral-8x7B full fine-tuning, one H100's plan for the two-device run:
 * pinned working copies take most of the pinned budget, and the walk
 * spends device memory on a layer's optimizer rather than the pinned room
 * left on offloaded activations (which would break that budget and lose
 * every plan after it). */
static void test_pinned_budget_walk(void) {
    int rc;
    json_t *d = committed_json("mixtral-8x7b-2xh100-full", NULL, &rc);
    if (!d) return;
    json_t *blocks = json_object_get(json_object_get(d, "plan"), "blocks");
    int device_optim = 0, pinned = 0;
    for (size_t b = 0; b < json_array_size(blocks); b++) {
        json_t *bi = json_array_get(blocks, b);
        device_optim += strcmp(json_string_value(json_object_get(bi, "optimizer")), "device") == 0;
        pinned += json_is_true(json_object_get(bi, "pinned_home"));
    }
    EXPECT(rc == 0 && json_is_true(json_object_get(d, "feasible")) && device_optim >= 1 && pinned >= 16,
           "exit %d: %d blocks with the optimizer on the device, %d with pinned working copies", rc, device_optim,
           pinned);
    EXPECT(peak(d, "pinned", "peak_bytes") <= peak(d, "pinned", "budget_bytes"), "pinned peak %g of %g",
           peak(d, "pinned", "peak_bytes"), peak(d, "pinned", "budget_bytes"));
    json_decref(d);
}

int main(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    snprintf(g_tmp, sizeof g_tmp, "%s", tmp ? tmp : "/tmp");
    if (!getcwd(g_cwd, sizeof g_cwd)) return 1;
    test_mixtral();
    test_qwen3();
    test_every_model();
    test_committed_runs();
    test_layer_major_fits();
    test_nvme_runs();
    test_quantized_runs();
    test_cli();
    test_devices();
    test_expert_parallel();
    test_pinned_budget_walk();
    if (failures) fprintf(stderr, "plan_cmd_test: %d failure(s)\n", failures);
    else printf("plan_cmd_test: all passed\n");
    return failures != 0;
}
