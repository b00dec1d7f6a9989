/* Quantized bases and the NVMe tier in a plan (see plan_tiers.h). */
#include "engine/run/plan_tiers.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/run/calibrate.h"

/* gpt-oss's modules_to_not_convert lists attention: only experts are MXFP4. */
static bool attention_not_converted(json_t *qc) {
    json_t *skip = json_object_get(qc, "modules_to_not_convert");
    size_t i;
    json_t *v;
    json_array_foreach(skip, i, v) {
        if (json_is_string(v) && strstr(json_string_value(v), "self_attn")) return true;
    }
    return false;
}

static mt_status_t stored_format(json_t *qc, const char *path, sched_base_quant_t *q, mt_error_t *err) {
    const char *method = json_string_value(json_object_get(qc, "quant_method"));
    if (!method) return mt_error_set(err, MT_ERR_CONFIG, "%s: quantization_config.quant_method is missing", path);
    if (strcmp(method, "fp8") == 0) {
        json_t *bs = json_object_get(qc, "weight_block_size");
        const json_int_t br = json_integer_value(json_array_get(bs, 0)), bc = json_integer_value(json_array_get(bs, 1));
        if (json_array_size(bs) != 2 || br <= 0 || br != bc)
            return mt_error_set(err, MT_ERR_CONFIG,
                                "%s: quantization_config.weight_block_size: expected two equal positive integers "
                                "(square scale blocks, e.g. [128, 128])",
                                path);
        *q = (sched_base_quant_t){.on = true, .format = MT_QUANT_FP8_BLOCK, .block = br};
        return MT_OK;
    }
    if (strcmp(method, "mxfp4") == 0) {
        *q = (sched_base_quant_t){.on = true, .format = MT_QUANT_MXFP4, .block = 32,
                                  .experts_only = attention_not_converted(qc)};
        return MT_OK;
    }
    if (strcmp(method, "bitsandbytes") == 0 && json_is_true(json_object_get(qc, "load_in_4bit"))) {
        const char *t = json_string_value(json_object_get(qc, "bnb_4bit_quant_type"));
        *q = (sched_base_quant_t){.on = true, .format = t && strcmp(t, "fp4") == 0 ? MT_QUANT_FP4 : MT_QUANT_NF4,
                                  .block = 64,
                                  .double_quant = json_is_true(json_object_get(qc, "bnb_4bit_use_double_quant"))};
        return MT_OK;
    }
    return mt_error_set(err, MT_ERR_CONFIG,
                        "%s: quantization_config.quant_method \"%.64s\": the planner counts fp8 (block-scaled), "
                        "mxfp4 and bitsandbytes 4-bit",
                        path, method);
}

static mt_status_t base_quant_of(const eng_run_config_t *rc, json_t *root, const char *config_json,
                                 sched_base_quant_t *q, mt_error_t *err);

mt_status_t eng_plan_base_quant(const eng_run_config_t *rc, const char *config_json, sched_base_quant_t *q,
                                mt_error_t *err) {
    memset(q, 0, sizeof *q);
    if (rc->adapter != ENG_ADAPTER_LORA) return MT_OK; /* full fine-tuning trains a dequantized copy */
    json_error_t je;
    json_t *root = json_load_file(config_json, 0, &je);
    if (!root) return mt_error_set(err, MT_ERR_CONFIG, "%s:%d: %s", config_json, je.line, je.text);
    return base_quant_of(rc, root, config_json, q, err);
}

mt_status_t eng_plan_base_quant_held(const eng_run_config_t *rc, const char *text, const char *name,
                                     sched_base_quant_t *q, mt_error_t *err) {
    memset(q, 0, sizeof *q);
    if (rc->adapter != ENG_ADAPTER_LORA || !text) return MT_OK;
    json_error_t je;
    json_t *root = json_loads(text, 0, &je);
    if (!root) return mt_error_set(err, MT_ERR_CONFIG, "%s:%d: %s", name, je.line, je.text);
    /* every stored format is held as stored, gpt-oss's MXFP4 experts too */
    return base_quant_of(rc, root, name, q, err);
}

/* The format of config.json `root`'s base for run rc (see plan_tiers.h); takes root. */
static mt_status_t base_quant_of(const eng_run_config_t *rc, json_t *root, const char *config_json,
                                 sched_base_quant_t *q, mt_error_t *err) {
    json_t *qc = json_object_get(root, "quantization_config");
    mt_status_t st = MT_OK;
    if (json_is_object(qc)) {
        st = stored_format(qc, config_json, q, err);
        /* transformers 5 quantises only nn.Linear: its fused routed experts are
         * written unquantised, and stay so unless load_in_4bit quantises them */
        const char *tv = json_string_value(json_object_get(root, "transformers_version"));
        const char *m = json_string_value(json_object_get(qc, "quant_method"));
        if (st == MT_OK && m && strcmp(m, "bitsandbytes") == 0 && tv && atoi(tv) >= 5 && !rc->load_in_4bit)
            q->experts_wide = true;
    } else if (rc->load_in_4bit) {
        *q = (sched_base_quant_t){.on = true,
                                  .format = rc->bnb_4bit_quant_type == ENG_BNB_FP4 ? MT_QUANT_FP4 : MT_QUANT_NF4,
                                  .block = 64, /* bitsandbytes' default blocksize */
                                  .double_quant = rc->bnb_4bit_use_double_quant};
    }
    json_decref(root);
    return st;
}

mt_status_t eng_plan_nvme(const eng_run_config_t *rc, const sched_hw_t *hw, sched_workload_t *w,
                          sched_planner_opts_t *o, mt_error_t *err) {
    if (!rc->memory_nvme_path[0]) return MT_OK;
    if (!hw->has_nvme)
        return mt_error_set(err, MT_ERR_CONFIG,
                            "%s: memory.nvme.path is set, but the hardware profile %s has no nvme: section (the "
                            "array's read and write rates and queue depth; docs/planning.md)",
                            rc->source_path, hw->source);
    sched_workload_set_nvme(w, hw);
    o->nvme = true;
    o->nvme_budget = (double)rc->memory_nvme_budget;
    return MT_OK;
}

mt_status_t eng_plan_nvme_for_training(const eng_run_config_t *rc, bool bf16, sched_hw_t *hw, sched_workload_t *w,
                                       sched_planner_opts_t *o, mt_error_t *err) {
    if (!rc->memory_nvme_path[0]) return MT_OK;
    if (!hw->has_nvme) {
        sched_calibration_t cal;
        memset(&cal, 0, sizeof cal);
        const mt_status_t st = eng_calibrate_nvme(rc, &cal, err);
        if (st != MT_OK) return mt_error_prefix(err, "%s: ", rc->source_path);
        sched_hw_set_measured_nvme(&cal, hw);
        fprintf(stderr, "moetune: NVMe tier: %s measured at %.2f / %.2f GB/s read / write (the hardware profile has "
                        "no nvme: section)\n", rc->memory_nvme_path, cal.nvme_read_bw / 1e9, cal.nvme_write_bw / 1e9);
    }
    const mt_status_t st = eng_plan_nvme(rc, hw, w, o, err);
    /* a LoRA run's frozen base moves in fp32 too: it is no master */
    o->nvme_optim_only = !bf16 && rc->adapter != ENG_ADAPTER_LORA;
    return st;
}
