/* `moetune plan` (see plan_cmd.h): run config + config.json + hardware
 * profile -> registry -> workload -> planner -> report.
 *
 * Design note: the run config is not put through eng_run_config_validate,
 * which wants datasets and an output directory a plan does not need; the
 * checks that matter here (sizes, LoRA targets, scheduler overrides) are
 * made by the registry and the planner, with the same messages. */
#include "tools/plan/plan_cmd.h"

#include "base/fileio.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "engine/run/calibrate.h"
#include "engine/run/plan_tiers.h"
#include "kernels/device.h"
#include "engine/model/desc/program.h"
#include "tools/plan/plan_devices.h"
#include "tools/plan/plan_report.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: moetune plan RUN.yaml [--hw NAME|FILE|calibrate] [--json] [--trace FILE] [--devices N]\n"
            "                             [--set key=value]...\n"
            "  --hw       hardware profile: configs/hw/NAME.yaml, a YAML file, or 'calibrate' (measure this\n"
            "             machine's CPU backend); default: the run config's hardware: key\n"
            "  --json     print the plan as one JSON document (schema moetune.plan/1)\n"
            "  --trace    write the predicted step as a Chrome trace (open in Perfetto)\n"
            "  --set      override a run-config key, e.g. --set memory.host=512GiB\n"
            "  --devices  N devices of this host, data parallel, one host copy (default: the run config's\n"
            "             devices:): each device's share planned and predicted over its own link; with 2,\n"
            "             each MoE layer data or expert parallel (parallel: auto|data|expert), all three\n"
            "             layouts predicted\n"
            "exit codes: 0 a plan fits, 3 no plan fits the budgets, 1 error, 2 bad command line\n");
}

static int fail(const mt_error_t *err) {
    fprintf(stderr, "moetune plan: error: %s\n", err->msg);
    return 1;
}

static bool is_file(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* base_model/config.json, else base_model_init (a config.json file). */
static mt_status_t load_model_config(plan_ctx_t *c, mt_error_t *err) {
    const eng_run_config_t *rc = &c->rc;
    if (!rc->base_model[0] && !rc->base_model_init[0])
        return mt_error_set(err, MT_ERR_CONFIG, "%s: base_model is not set (a folder with config.json)",
                            rc->source_path);
    snprintf(c->model_config_path, sizeof c->model_config_path, "%s/config.json", rc->base_model);
    if (rc->base_model[0] && is_file(c->model_config_path))
        return eng_model_config_load(rc->base_model, rc->model_config_json, &c->mc, err);
    if (!rc->base_model_init[0])
        return mt_error_set(err, MT_ERR_IO, "%s: cannot open (base_model needs at least its config.json)",
                            c->model_config_path);
    snprintf(c->model_config_path, sizeof c->model_config_path, "%s", rc->base_model_init);
    FILE *f;
    mt_status_t ost = mt_fopen_regular(rc->base_model_init, "base_model_init", &f, err);
    if (ost != MT_OK) return ost;
    size_t cap = 1 << 14, len = 0;
    char *text = malloc(cap);
    MT_CHECK_ALLOC(text, "config.json text");
    size_t got;
    while ((got = fread(text + len, 1, cap - len - 1, f)) > 0) {
        len += got;
        if (len + 1 == cap) {
            cap *= 2;
            text = realloc(text, cap);
            MT_CHECK_ALLOC(text, "config.json text");
        }
    }
    fclose(f);
    text[len] = '\0';
    mt_status_t st = eng_model_config_parse(text, rc->base_model_init, rc->model_config_json, &c->mc, err);
    free(text);
    return st;
}

static mt_status_t load_hardware(plan_ctx_t *c, const char *spec, mt_error_t *err) {
    char path[1200];
    mt_status_t st = sched_hw_resolve(spec, c->rc.source_path, path, sizeof path, err);
    if (st != MT_OK) return st;
    if (strcmp(path, "calibrate") != 0) return sched_hw_load(path, &c->hw, err);
    sched_calibration_t cal;
    char why[256];
    const bool gpu = c->rc.backend == ENG_BACKEND_CUDA ||
                     (c->rc.backend == ENG_BACKEND_AUTO && kern_cuda_available(why, sizeof why));
    /* the attention path of the run's shape: bf16 working copies as run() describes them */
    eng_calibrate_attn_t attn;
    eng_calibrate_attn_of(&c->mc, &c->rc, c->rc.bf16 == ENG_BF16_ON || (c->rc.bf16 == ENG_BF16_AUTO && gpu), &attn);
    if (gpu) { /* the GPU the run would use, with its budget */
        kern_device_opts_t o = {.device_budget_bytes = c->rc.memory_device, .device_index = c->rc.devices.ids[0]};
        kern_device_t *dev = NULL;
        st = kern_device_create(KERN_BACKEND_CUDA, &o, &dev, err);
        if (st != MT_OK) return mt_error_prefix(err, "--hw calibrate: ");
        st = eng_calibrate_device(dev, &c->rc, &attn, &cal, err);
        kern_device_destroy(dev);
    } else {
        st = eng_calibrate(&c->rc, &attn, NULL, &cal, err);
    }
    if (st != MT_OK) return st;
    sched_hw_from_calibration(&cal, &c->hw);
    return MT_OK;
}

static void ctx_free(plan_ctx_t *c) {
    sched_planner_result_free(&c->res);
    sched_workload_free(&c->w);
    sched_registry_free(&c->reg);
    eng_model_config_free(&c->mc);
    eng_run_config_free(&c->rc);
}

int mt_plan_main(int argc, char **argv) {
    const char *run = NULL, *hw_spec = NULL, *trace = NULL, *devices_arg = NULL;
    bool json = false;
    const char *sets[64];
    int nsets = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--json") == 0) json = true;
        else if (strcmp(a, "--hw") == 0 && i + 1 < argc) hw_spec = argv[++i];
        else if (strncmp(a, "--hw=", 5) == 0) hw_spec = a + 5;
        else if (strcmp(a, "--trace") == 0 && i + 1 < argc) trace = argv[++i];
        else if (strcmp(a, "--devices") == 0 && i + 1 < argc) devices_arg = argv[++i];
        else if (strncmp(a, "--devices=", 10) == 0) devices_arg = a + 10;
        else if (strncmp(a, "--trace=", 8) == 0) trace = a + 8;
        else if ((strcmp(a, "--set") == 0 && i + 1 < argc) || strncmp(a, "--set=", 6) == 0) {
            if (nsets == 64) {
                fprintf(stderr, "moetune plan: more than 64 --set overrides\n");
                return 2;
            }
            sets[nsets++] = a[5] == '=' ? a + 6 : argv[++i];
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (a[0] == '-' || run) {
            fprintf(stderr, "moetune plan: unexpected argument '%s'\n", a);
            usage(stderr);
            return 2;
        } else {
            run = a;
        }
    }
    if (!run) {
        fprintf(stderr, "moetune plan: missing RUN.yaml\n");
        usage(stderr);
        return 2;
    }
    plan_ctx_t c;
    memset(&c, 0, sizeof c);
    c.run_path = run;
    mt_error_t err = {0};
    int rcode = 1;
    if (eng_run_config_load(run, &c.rc, &err) != MT_OK) goto done;
    for (int i = 0; i < nsets; i++)
        if (eng_run_config_set(&c.rc, sets[i], &err) != MT_OK) goto done;
    if (devices_arg) { /* --devices N is `--set devices=N`, with the same checks */
        char set[64];
        snprintf(set, sizeof set, "devices=%.40s", devices_arg);
        if (eng_run_config_set(&c.rc, set, &err) != MT_OK) goto done;
    }
    if (!hw_spec && c.rc.hardware[0]) hw_spec = c.rc.hardware;
    if (!hw_spec) {
        mt_error_set(&err, MT_ERR_CONFIG,
                     "%s: no hardware profile: give --hw NAME|FILE|calibrate or set hardware: in the run config "
                     "(profiles: configs/hw/*.yaml)",
                     run);
        goto done;
    }
    if (load_model_config(&c, &err) != MT_OK) goto done;
    if (load_hardware(&c, hw_spec, &err) != MT_OK) goto done;
    sched_program_t prog;
    sched_run_shape_t shape;
    mt_status_t st;
    /* bf16 working copies with bf16: true (auto: with a GPU profile) */
    const bool bf16 = c.rc.bf16 == ENG_BF16_ON || (c.rc.bf16 == ENG_BF16_AUTO && !c.hw.measured);
    if (eng_program_describe(&c.mc, &c.rc, bf16, &prog, &shape, &err) != MT_OK) goto done;
    st = sched_registry_build(&prog, &shape, &c.reg, &err);
    sched_program_free(&prog);
    if (st != MT_OK) goto done;
    if (sched_workload_build(&c.reg, &c.hw, &c.w, &err) != MT_OK) goto done;
    if (eng_plan_base_quant(&c.rc, c.model_config_path, &c.quant, &err) != MT_OK) goto done;
    sched_workload_quantize_base(&c.reg, &c.quant, &c.hw, &c.w);
    sched_workload_set_moments(&c.w, eng_config_moments(&c.rc));
    if (eng_program_planner_opts(&c.rc, &c.hw, &c.opts, &err) != MT_OK) goto done;
    if (eng_plan_nvme(&c.rc, &c.hw, &c.w, &c.opts, &err) != MT_OK) goto done;
    /* the main plan is one device running every micro-batch, the yardstick
     * the devices are compared with: no experts to split there (a single
     * device asking for expert parallel is refused by the planner) */
    if (c.rc.devices.count > 1) c.opts.parallel = SCHED_PARALLEL_DATA, c.opts.devices = 1;
    if (sched_plan_make(&c.w, &c.opts, &c.res, &err) != MT_OK) goto done;
    plan_devices_t dp;
    const bool multi = c.rc.devices.count > 1;
    if (multi && plan_devices_make(&c, c.rc.devices.count, &dp, &err) != MT_OK) goto done;
    if (json) {
        json_t *doc = plan_report_json(&c);
        if (multi) json_object_set_new(doc, "data_parallel", plan_devices_json(&c, &dp));
        char *text = json_dumps(doc, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(12));
        json_decref(doc);
        MT_CHECK_ALLOC(text, "plan JSON text");
        fputs(text, stdout);
        fputc('\n', stdout);
        free(text);
    } else {
        plan_report_text(stdout, &c);
        if (multi) plan_devices_text(stdout, &c, &dp);
    }
    if (multi) plan_devices_free(&dp);
    if (trace && plan_write_trace(&c, trace, &err) != MT_OK) goto done;
    rcode = c.res.feasible ? 0 : 3;
done:
    if (rcode == 1) fail(&err);
    ctx_free(&c);
    return rcode;
}
