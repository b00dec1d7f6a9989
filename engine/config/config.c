/* The run config: YAML (libyaml's document API, so every node carries its
 * line) -> eng_run_config_t, plus `--set key=value` overrides.
 *
 * Design notes:
 * - One table per nesting level (top level, memory:, backend_options:,
 *   scheduler:, staging:);
 *   a row names the key, its kind and where it lands in eng_run_config_t.
 *   A later section (scheduler:, staging:) is a new table plus one
 *   K_SECTION row: the walker, the "did you mean" suggestions, null resets
 *   and --set all follow the tables, nothing else changes.
 * - YAML files and --set share one path: `--set a.b=v` parses v as a
 *   one-node YAML document and applies it to the row found by walking the
 *   dotted key, so types are checked the same way; only the "where" of a
 *   message differs (file:line vs --set 'a.b=v').
 * - Scalars are typed as PyYAML (YAML 1.1, what axolotl reads configs
 *   with) types them: only plain (unquoted) scalars get implicit types, so
 *   a quoted "4" is a string and is refused for an integer key.  One
 *   deliberate extension: exponent forms without a dot or without an
 *   exponent sign (2e-5, 1.0e5) are floats here; PyYAML leaves them strings
 *   and axolotl's pydantic coerces them, and HF config values written that
 *   way must reach config.json as numbers.
 * - A null value (`key:` / `key: ~`) puts the field back to its default,
 *   as axolotl treats empty keys as unset.
 * - Every run-config problem, malformed YAML included, is MT_ERR_CONFIG;
 *   only failing to read the file is MT_ERR_IO. */
#include "engine/config/config.h"

#include "base/fileio.h"
#include "base/yaml_doc.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "engine/config/config_rows.h"
#include "engine/config/values.h" /* YAML 1.1 scalar typing, YAML -> JSON */

/* ---- key tables ---------------------------------------------------------- */


#define FIELD(f) offsetof(eng_run_config_t, f), sizeof(((eng_run_config_t *)0)->f)
#define ROW(name, kind, f) {name, kind, FIELD(f), NULL, NULL, 0, 0}
#define ROW_ENUM(name, f, names) {name, K_ENUM, FIELD(f), names, NULL, 0, 0}
#define ROW_SECTION(name, rows) {name, K_SECTION, 0, 0, NULL, rows, 0, 0}
/* Every integer key has a range, so that no accepted value overflows the
 * int arithmetic downstream (tokens per step = micro_batch_size *
 * sequence_len * gradient_accumulation_steps stays far inside int64, each
 * factor inside int) and nonsense (a negative batch) is refused by name. */
#define ROW_INT(name, f, lo, hi) {name, K_INT, FIELD(f), NULL, NULL, lo, hi}
#define STEPS_MAX 1000000000 /* max_steps, warmup_steps, save_steps, logging_steps */

static const enum_name_t k_lr_names[] = {
    {"constant", ENG_LR_CONSTANT},
    {"constant_with_warmup", ENG_LR_CONSTANT_WITH_WARMUP},
    {"linear", ENG_LR_LINEAR},
    {"cosine", ENG_LR_COSINE},
    {NULL, 0},
};
static const enum_name_t k_idle_experts_names[] = {
    {"step", ENG_IDLE_EXPERTS_STEP},
    {"skip", ENG_IDLE_EXPERTS_SKIP},
    {NULL, 0},
};
static const enum_name_t k_optimizer_names[] = {
    {"adamw_torch", 0},
    {"adamw_torch_fused", 0},
    {"adamw", 0},
    {"adamw_bnb_8bit", 1},
    {"adamw_8bit", 1},
    {"paged_adamw_8bit", 1},
    {NULL, 0},
};
static const enum_name_t k_optimizer_state_names[] = {
    {"fp32", ENG_MOMENTS_FP32},
    {"bf16", ENG_MOMENTS_BF16},
    {"8bit", ENG_MOMENTS_8BIT},
    {NULL, 0},
};
static const enum_name_t k_save_dtype_names[] = {
    {"auto", ENG_SAVE_DTYPE_AUTO},
    {"float32", ENG_SAVE_DTYPE_F32},
    {"bfloat16", ENG_SAVE_DTYPE_BF16},
    {"float16", ENG_SAVE_DTYPE_F16},
    {NULL, 0},
};
static const enum_name_t k_save_layout_names[] = {
    {"per_expert", ENG_SAVE_LAYOUT_PER_EXPERT},
    {"fused", ENG_SAVE_LAYOUT_FUSED},
    {NULL, 0},
};

static const enum_name_t k_save_strategy_names[] = {
    {"steps", ENG_SAVE_STRATEGY_STEPS},
    {"epoch", ENG_SAVE_STRATEGY_EPOCH},
    {"no", ENG_SAVE_STRATEGY_NO},
    {NULL, 0},
};

static const enum_name_t k_backend_names[] = {
    {"cpu", ENG_BACKEND_CPU},
    {"cuda", ENG_BACKEND_CUDA},
    {"auto", ENG_BACKEND_AUTO},
    {NULL, 0},
};
/* axolotl also knows qlora; moetune trains LoRA on unquantised weights only. */
static const enum_name_t k_adapter_names[] = {
    {"lora", ENG_ADAPTER_LORA},
    {NULL, 0},
};

static const enum_name_t k_bnb_quant_names[] = {
    {"nf4", ENG_BNB_NF4},
    {"fp4", ENG_BNB_FP4},
    {NULL, 0},
};

static const enum_name_t k_policy_names[] = {
    {"auto", ENG_SCHED_AUTO},
    {"keep_all", ENG_SCHED_KEEP_ALL},
    {"offload_all", ENG_SCHED_OFFLOAD_ALL},
    {"min_memory", ENG_SCHED_MIN_MEMORY},
    {NULL, 0},
};
static const enum_name_t k_weights_names[] = {
    {"auto", ENG_WEIGHTS_AUTO},
    {"resident", ENG_WEIGHTS_RESIDENT},
    {"stream", ENG_WEIGHTS_STREAM},
    {NULL, 0},
};
static const enum_name_t k_place_names[] = {
    {"auto", ENG_PLACE_AUTO},
    {"device", ENG_PLACE_DEVICE},
    {"host", ENG_PLACE_HOST},
    {NULL, 0},
};
static const enum_name_t k_acts_names[] = {
    {"auto", ENG_ACTS_AUTO},
    {"keep", ENG_ACTS_KEEP},
    {"offload", ENG_ACTS_OFFLOAD},
    {"recompute", ENG_ACTS_RECOMPUTE},
    {NULL, 0},
};
static const enum_name_t k_inputs_names[] = {
    {"auto", ENG_ACTS_AUTO},
    {"keep", ENG_ACTS_KEEP},
    {"offload", ENG_ACTS_OFFLOAD},
    {NULL, 0},
};

static const key_row_t k_scheduler_rows[] = {
    ROW_ENUM("policy", sched_policy, k_policy_names),
    ROW_INT("prefetch_window", sched_prefetch_window, 0, 64),
    ROW_ENUM("weights", sched_weights, k_weights_names),
    ROW_ENUM("grads", sched_grads, k_place_names),
    ROW_ENUM("optimizer", sched_optimizer, k_place_names),
    ROW_ENUM("activations", sched_activations, k_acts_names),
    ROW_ENUM("block_inputs", sched_block_inputs, k_inputs_names),
    ROW("speculative_optimizer", K_BOOL, sched_speculative),
    {0},
};

static const enum_name_t k_staging_mode_names[] = {
    {"compact", ENG_STAGING_COMPACT},
    {"per_tensor", ENG_STAGING_PER_TENSOR},
    {"max_slot", ENG_STAGING_MAX_SLOT},
    {NULL, 0},
};

/* Values are checked by the pool itself when the run starts (moe_staging_create), where the
   model's largest tensor is known: a cap below it or zero slabs is refused there. */
static const key_row_t k_staging_rows[] = {
    ROW_ENUM("mode", staging_mode, k_staging_mode_names),
    ROW("cap", K_SIZE, staging_cap),
    ROW_INT("num_slabs", staging_num_slabs, -1, 65536),
    ROW("slab_size", K_SIZE, staging_slab_size),
    {0},
};

/* memory.nvme: the NVMe tier's directory and budget (engine/optim/nvme_state.h) */
static const key_row_t k_memory_nvme_rows[] = {
    ROW("path", K_STRING, memory_nvme_path),
    ROW("budget", K_SIZE, memory_nvme_budget),
    {0},
};

static const key_row_t k_memory_rows[] = {
    ROW("device", K_SIZE, memory_device),
    ROW("pinned", K_SIZE, memory_pinned),
    ROW("host", K_SIZE, memory_host),
    ROW_SECTION("nvme", k_memory_nvme_rows),
    {0},
};

static const key_row_t k_backend_options_rows[] = {
    ROW("link_gbps", K_DOUBLE, link_gbps),
    ROW("link_latency_us", K_DOUBLE, link_latency_us),
    ROW_INT("compute_threads", compute_threads, 0, 4096),
    {0},
};

/* The keys of one `datasets:` entry; only for lookup and suggestions. */
static const key_row_t k_dataset_rows[] = {
    {"path", K_PATH, 0, 0, NULL, NULL, 0, 0},
    {"type", K_STRING, 0, 0, NULL, NULL, 0, 0},
    {"field", K_STRING, 0, 0, NULL, NULL, 0, 0},
    {"field_messages", K_STRING, 0, 0, NULL, NULL, 0, 0},
    {"message_property_mappings", K_SECTION, 0, 0, NULL, NULL, 0, 0},
    {"roles_to_train", K_STRLIST, 0, 0, NULL, NULL, 0, 0},
    {"train_on_eos", K_STRING, 0, 0, NULL, NULL, 0, 0},
    {"weight", K_DOUBLE, 0, 0, NULL, NULL, 0, 0},
    {0},
};

static const enum_name_t k_step_order_names[] = {
    {"auto", ENG_STEP_ORDER_AUTO},
    {"micro_batch", ENG_STEP_ORDER_MICRO_BATCH},
    {"layer", ENG_STEP_ORDER_LAYER},
    {NULL, 0},
};

static const enum_name_t k_parallel_names[] = {
    {"auto", ENG_PARALLEL_AUTO},
    {"data", ENG_PARALLEL_DATA},
    {"expert", ENG_PARALLEL_EXPERT},
    {NULL, 0},
};

const key_row_t eng_cfg_top_rows[] = {
    ROW("base_model", K_PATH, base_model),
    ROW("base_model_init", K_PATH, base_model_init),
    ROW("datasets", K_DATASETS, datasets),
    ROW("val_set_size", K_VALSET, val_set_size),
    ROW("test_datasets", K_DATASETS, test_datasets),
    ROW_INT("eval_steps", eval_steps, 0, STEPS_MAX),
    ROW_INT("eval_batch_size", eval_batch_size, 1, 65536),
    ROW_INT("sequence_len", sequence_len, 1, 1048576),
    ROW_INT("micro_batch_size", micro_batch_size, 1, 65536),
    ROW_INT("gradient_accumulation_steps", gradient_accumulation_steps, 1, 1000000),
    ROW_INT("max_steps", max_steps, 0, STEPS_MAX),
    ROW_INT("num_epochs", num_epochs, 0, 1000000),
    ROW("learning_rate", K_DOUBLE, learning_rate),
    ROW_ENUM("lr_scheduler", lr_scheduler, k_lr_names),
    ROW_INT("warmup_steps", warmup_steps, 0, STEPS_MAX),
    ROW("adam_beta1", K_DOUBLE, adam_beta1),
    ROW("adam_beta2", K_DOUBLE, adam_beta2),
    ROW("adam_epsilon", K_DOUBLE, adam_epsilon),
    ROW("weight_decay", K_DOUBLE, weight_decay),
    ROW("max_grad_norm", K_DOUBLE, max_grad_norm),
    ROW_ENUM("idle_experts", idle_experts, k_idle_experts_names),
    ROW("shuffle", K_BOOL, shuffle),
    ROW("sample_packing", K_BOOL, sample_packing),
    ROW("seed", K_U64, seed),
    ROW("output_dir", K_PATH, output_dir),
    ROW_INT("logging_steps", logging_steps, 1, STEPS_MAX),
    ROW_INT("save_steps", save_steps, 0, STEPS_MAX),
    ROW("save_final", K_BOOL, save_final),
    ROW_ENUM("save_strategy", save_strategy, k_save_strategy_names),
    ROW_INT("save_total_limit", save_total_limit, 0, 1000000),
    ROW("resume_from_checkpoint", K_RESUME, resume_from_checkpoint),
    ROW_INT("skip_nonfinite_steps", skip_nonfinite_steps, 0, STEPS_MAX),
    ROW("allow_unused_tensors", K_BOOL, allow_unused_tensors),
    ROW("bf16", K_BF16, bf16),
    ROW_ENUM("save_dtype", save_dtype, k_save_dtype_names),
    ROW_ENUM("save_expert_layout", save_expert_layout, k_save_layout_names),
    ROW_ENUM("backend", backend, k_backend_names),
    ROW_ENUM("optimizer", optimizer, k_optimizer_names),
    ROW_ENUM("optimizer_state", optimizer_state, k_optimizer_state_names),
    ROW("gradient_checkpointing", K_BOOL, gradient_checkpointing),
    ROW("model_config", K_JSON, model_config_json),
    ROW_SECTION("memory", k_memory_rows),
    ROW_SECTION("backend_options", k_backend_options_rows),
    ROW("hardware", K_STRING, hardware),
    ROW("tokenizer_config", K_PATH, tokenizer_config),
    ROW("chat_template", K_STRING, chat_template),
    ROW("chat_template_jinja", K_TEXT, chat_template_jinja),
    ROW("train_on_inputs", K_BOOL, train_on_inputs),
    ROW("dataset_prepared_path", K_PATH, dataset_prepared_path),
    ROW_SECTION("scheduler", k_scheduler_rows),
    ROW_SECTION("staging", k_staging_rows),
    ROW("save_max_shard_size", K_SIZE, save_max_shard_bytes),
    ROW("progress", K_BOOL, progress),
    ROW("trace", K_BOOL, trace),
    ROW_ENUM("step_order", step_order, k_step_order_names),
    ROW("devices", K_DEVICES, devices),
    ROW_ENUM("parallel", parallel, k_parallel_names),
    ROW_ENUM("adapter", adapter, k_adapter_names),
    ROW_INT("lora_r", lora_r, 1, 65536),
    ROW("lora_alpha", K_DOUBLE, lora_alpha),
    ROW("lora_dropout", K_DOUBLE, lora_dropout),
    ROW("lora_target_modules", K_STRLIST, lora_target_modules),
    ROW("lora_target_linear", K_BOOL, lora_target_linear),
    ROW("use_rslora", K_BOOL, use_rslora),
    ROW("lora_modules_to_save", K_STRLIST, lora_modules_to_save),
    ROW("lora_model_dir", K_PATH, lora_model_dir),
    ROW("merge_lora", K_BOOL, merge_lora),
    ROW("load_in_4bit", K_BOOL, load_in_4bit),
    ROW("load_in_8bit", K_BOOL, load_in_8bit),
    ROW_ENUM("bnb_4bit_quant_type", bnb_4bit_quant_type, k_bnb_quant_names),
    ROW("bnb_4bit_use_double_quant", K_BOOL, bnb_4bit_use_double_quant),
    ROW("llm_int8_skip_modules", K_STRLIST, llm_int8_skip_modules),
    {0},
};

/* ---- the walk ------------------------------------------------------------ */


static void put(eng_run_config_t *cfg, const key_row_t *row, const void *v, size_t size) {
    MT_CHECK(size == row->size, "config table: key %s has size %zu, value %zu", row->name, row->size, size);
    memcpy((char *)cfg + row->offset, v, size);
}

/* Null resets a key (or a whole section) to its default. */
static void reset_row(eng_run_config_t *cfg, const key_row_t *row) {
    if (row->kind == K_SECTION) {
        for (const key_row_t *r = row->section; r->name; r++) reset_row(cfg, r);
        return;
    }
    if (row->kind == K_JSON || row->kind == K_TEXT) {
        char **owned = (char **)((char *)cfg + row->offset);
        free(*owned);
        *owned = NULL;
        return;
    }
    eng_run_config_t def;
    eng_run_config_defaults(&def);
    memcpy((char *)cfg + row->offset, (const char *)&def + row->offset, row->size);
    if (row->kind == K_DATASETS && row->offset == offsetof(eng_run_config_t, datasets))
        cfg->num_datasets = def.num_datasets;
    if (row->kind == K_DATASETS && row->offset == offsetof(eng_run_config_t, test_datasets))
        cfg->num_test_datasets = def.num_test_datasets;
    if (row->kind == K_STRLIST && row->offset == offsetof(eng_run_config_t, lora_target_modules)) {
        cfg->num_lora_target_modules = def.num_lora_target_modules;
        cfg->lora_target_regex[0] = '\0';
    }
    if (row->kind == K_STRLIST && row->offset == offsetof(eng_run_config_t, lora_modules_to_save))
        cfg->num_lora_modules_to_save = def.num_lora_modules_to_save;
    if (row->kind == K_STRLIST && row->offset == offsetof(eng_run_config_t, llm_int8_skip_modules))
        cfg->num_llm_int8_skip_modules = def.num_llm_int8_skip_modules;
}

static mt_status_t walk_mapping(pctx_t *c, const key_row_t *rows, const char *prefix, yaml_node_t *map);

/* datasets: and test_datasets: alike; the row says which. */
static mt_status_t apply_datasets(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n) {
    if (n->type != YAML_SEQUENCE_NODE) return eng_cfg_expected(c, n, key, "a list of {path: FILE}");
    eng_dataset_entry_t list[ENG_MAX_DATASETS];
    int count = 0;
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *e = yaml_document_get_node(c->doc, *it);
        if (!e || e->type != YAML_MAPPING_NODE) return eng_cfg_expected(c, e, key, "each entry to be a mapping {path: FILE}");
        if (count == ENG_MAX_DATASETS) return eng_cfg_fail(c, e, "%s: more than %d datasets", key, ENG_MAX_DATASETS);
        eng_dataset_entry_defaults(&list[count]);
        bool have_path = false;
        for (yaml_node_pair_t *p = e->data.mapping.pairs.start; p < e->data.mapping.pairs.top; p++) {
            yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
            yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
            if (!k || k->type != YAML_SCALAR_NODE) return eng_cfg_expected(c, k, key, "string keys in a dataset entry");
            const char *name = (const char *)k->data.scalar.value;
            char prefix[160];
            snprintf(prefix, sizeof prefix, "%s[].", key);
            if (!eng_cfg_find_row(k_dataset_rows, name)) return eng_cfg_unknown_key(c, k, k_dataset_rows, prefix, name);
            mt_status_t st = eng_cfg_dataset_key(c, key, name, v, count, &list[count]);
            if (st != MT_OK) return st;
            have_path |= strcmp(name, "path") == 0;
        }
        if (!have_path) return eng_cfg_fail(c, e, "%s: entry %d has no 'path'", key, count);
        count++;
    }
    const bool test = row->offset == offsetof(eng_run_config_t, test_datasets);
    memcpy(test ? c->cfg->test_datasets : c->cfg->datasets, list, sizeof list[0] * (size_t)count);
    *(test ? &c->cfg->num_test_datasets : &c->cfg->num_datasets) = count;
    return MT_OK;
}

/* val_set_size as axolotl reads it (datasets' train_test_split): an
 * integer is a count of examples, a float a fraction, which must be below
 * 1 (1.0 would hold out everything); 0 = no split. */
static mt_status_t apply_val_set(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n) {
    eng_val_set_t v = {0};
    int64_t i;
    if (eng_yaml_int(n, &i)) {
        if (i < 0) return eng_cfg_fail(c, n, "%s: %lld; expected a count of examples >= 0 or a fraction in [0, 1)", key, (long long)i);
        v.size = (double)i;
        v.whole = true;
    } else if (eng_yaml_number(n, &v.size)) {
        if (!(v.size >= 0) || v.size >= 1)
            return eng_cfg_fail(c, n,
                        "%s: %g as a fraction must be in [0, 1) (0.05 holds out 5%% of the examples); a count of "
                        "examples is written as an integer (e.g. 100)",
                        key, v.size);
    } else {
        return eng_cfg_expected(c, n, key, "a fraction in [0, 1) or a count of examples");
    }
    put(c->cfg, row, &v, sizeof v);
    return MT_OK;
}

/* A long string, kept as written (owned by the config). */
static mt_status_t apply_text(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n) {
    if (n->type != YAML_SCALAR_NODE) return eng_cfg_expected(c, n, key, "a string");
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length) return eng_cfg_fail(c, n, "%s: the string contains a NUL byte", key);
    char **dst = (char **)((char *)c->cfg + row->offset);
    free(*dst);
    *dst = strdup(s);
    MT_CHECK_ALLOC(*dst, key);
    return MT_OK;
}

/* A list of module names (lora_target_modules, lora_modules_to_save,
 * llm_int8_skip_modules).
 * lora_target_modules may also be one string, as PEFT's target_modules:
 * "all-linear" or a regular expression over the whole module name. */
static mt_status_t apply_strlist(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n) {
    eng_run_config_t *cfg = c->cfg;
    const bool targets = row->offset == offsetof(eng_run_config_t, lora_target_modules);
    if (targets && n->type == YAML_SCALAR_NODE && !eng_yaml_is_null(n)) {
        mt_status_t st = eng_cfg_take_string(c, n, key, false, cfg->lora_target_regex, sizeof cfg->lora_target_regex);
        if (st != MT_OK) return st;
        cfg->num_lora_target_modules = 0;
        return MT_OK;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return eng_cfg_expected(c, n, key, targets ? "a list of module names, \"all-linear\" or a regular expression"
                                           : "a list of module names");
    int count = 0;
    char tmp[ENG_MAX_LORA_TARGETS][sizeof cfg->lora_target_modules[0]];
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
        yaml_node_t *e = yaml_document_get_node(c->doc, *it);
        if (count == ENG_MAX_LORA_TARGETS) return eng_cfg_fail(c, e, "%s: more than %d entries", key, ENG_MAX_LORA_TARGETS);
        mt_status_t st = eng_cfg_take_string(c, e, key, false, tmp[count], sizeof tmp[count]);
        if (st != MT_OK) return st;
        count++;
    }
    if (targets) {
        memcpy(cfg->lora_target_modules, tmp, sizeof tmp[0] * (size_t)count);
        cfg->num_lora_target_modules = count;
        cfg->lora_target_regex[0] = '\0';
    } else if (row->offset == offsetof(eng_run_config_t, llm_int8_skip_modules)) {
        memcpy(cfg->llm_int8_skip_modules, tmp, sizeof tmp[0] * (size_t)count);
        cfg->num_llm_int8_skip_modules = count;
    } else {
        memcpy(cfg->lora_modules_to_save, tmp, sizeof tmp[0] * (size_t)count);
        cfg->num_lora_modules_to_save = count;
    }
    return MT_OK;
}

static mt_status_t apply_json(pctx_t *c, const char *key, yaml_node_t *n) {
    if (n->type != YAML_MAPPING_NODE) return eng_cfg_expected(c, n, key, "a mapping (HF config.json keys)");
    char msg[512];
    const yaml_node_t *bad = NULL;
    json_t *obj = eng_yaml_to_json(c->doc, n, msg, sizeof msg, &bad);
    if (!obj) return eng_cfg_fail(c, bad ? bad : n, "%s: %s", key, msg);
    char *text = json_dumps(obj, JSON_COMPACT);
    json_decref(obj);
    MT_CHECK_ALLOC(text, "model_config JSON text");
    free(c->cfg->model_config_json);
    c->cfg->model_config_json = text;
    return MT_OK;
}

/* `devices: N` (ordinals 0..N-1) or `devices: [0, 1]` (distinct ordinals). */
static mt_status_t apply_devices(pctx_t *c, const char *key, yaml_node_t *n) {
    eng_devices_t d = {0};
    int64_t v;
    if (n->type == YAML_SCALAR_NODE) {
        if (!eng_yaml_int(n, &v) || v < 1 || v > ENG_MAX_DEVICES)
            return eng_cfg_expected(c, n, key, "a device count from 1 to 8, or a list of device ordinals");
        d.count = (int)v;
        for (int i = 0; i < ENG_MAX_DEVICES; i++) d.ids[i] = i;
    } else if (n->type == YAML_SEQUENCE_NODE) {
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            yaml_node_t *e = yaml_document_get_node(c->doc, *it);
            if (!e || e->type != YAML_SCALAR_NODE || !eng_yaml_int(e, &v) || v < 0 || v > 1023)
                return eng_cfg_expected(c, e, key, "each entry to be a device ordinal from 0 to 1023");
            if (d.count == ENG_MAX_DEVICES) return eng_cfg_fail(c, e, "%s: more than %d devices", key, ENG_MAX_DEVICES);
            for (int i = 0; i < d.count; i++)
                if (d.ids[i] == (int)v) return eng_cfg_fail(c, e, "%s: device %lld is listed twice", key, (long long)v);
            d.ids[d.count++] = (int)v;
        }
        if (d.count == 0) return eng_cfg_fail(c, n, "%s: the list names no device", key);
    } else {
        return eng_cfg_expected(c, n, key, "a device count or a list of device ordinals");
    }
    c->cfg->devices = d;
    return MT_OK;
}

mt_status_t eng_cfg_apply(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n) {
    eng_run_config_t *cfg = c->cfg;
    if (!n || eng_yaml_is_null(n)) {
        reset_row(cfg, row);
        return MT_OK;
    }
    switch (row->kind) {
    case K_INT: {
        int64_t v;
        if (!eng_yaml_int(n, &v)) return eng_cfg_expected(c, n, key, "an integer");
        if (v < row->lo || v > row->hi)
            return eng_cfg_fail(c, n, "%s: %lld is out of range; expected an integer from %lld to %lld", key, (long long)v,
                        (long long)row->lo, (long long)row->hi);
        int iv = (int)v;
        put(cfg, row, &iv, sizeof iv);
        return MT_OK;
    }
    case K_U64: {
        uint64_t v;
        if (!eng_yaml_u64(n, &v)) return eng_cfg_expected(c, n, key, "a non-negative integer");
        put(cfg, row, &v, sizeof v);
        return MT_OK;
    }
    case K_DOUBLE: {
        double v;
        if (!eng_yaml_number(n, &v)) return eng_cfg_expected(c, n, key, "a number");
        put(cfg, row, &v, sizeof v);
        return MT_OK;
    }
    case K_BOOL: {
        bool v;
        if (!eng_yaml_bool(n, &v)) return eng_cfg_expected(c, n, key, "a boolean (true or false)");
        put(cfg, row, &v, sizeof v);
        return MT_OK;
    }
    case K_BF16: {
        bool v;
        eng_bf16_choice_t choice;
        if (n->type == YAML_SCALAR_NODE && strcmp((const char *)n->data.scalar.value, "auto") == 0)
            choice = ENG_BF16_AUTO;
        else if (eng_yaml_bool(n, &v))
            choice = v ? ENG_BF16_ON : ENG_BF16_OFF;
        else
            return eng_cfg_expected(c, n, key, "true, false or auto");
        put(cfg, row, &choice, sizeof choice);
        return MT_OK;
    }
    case K_RESUME: {
        /* booleans as PyYAML types them (so a plain `no` is false); a
           quoted "true" is a directory of that name */
        eng_resume_t r = {0};
        bool v;
        if (eng_yaml_bool(n, &v)) {
            r.latest = v;
        } else if (n->type != YAML_SCALAR_NODE) {
            return eng_cfg_expected(c, n, key, "a checkpoint directory, true (the latest in output_dir) or false");
        } else {
            mt_status_t st = eng_cfg_take_string(c, n, key, true, r.path, sizeof r.path);
            if (st != MT_OK) return st;
        }
        put(cfg, row, &r, sizeof r);
        return MT_OK;
    }
    case K_PATH:
    case K_STRING: {
        char tmp[1024];
        MT_CHECK(row->size <= sizeof tmp, "config table: path key %s too large", row->name);
        mt_status_t st = eng_cfg_take_string(c, n, key, row->kind == K_PATH, tmp, row->size);
        if (st == MT_OK) memcpy((char *)cfg + row->offset, tmp, row->size);
        return st;
    }
    case K_SIZE: {
        if (n->type != YAML_SCALAR_NODE) return eng_cfg_expected(c, n, key, "a size such as 80GiB");
        size_t v;
        mt_error_t sub;
        if (eng_parse_size((const char *)n->data.scalar.value, &v, &sub) != MT_OK)
            return eng_cfg_fail(c, n, "%s: %s", key, sub.msg);
        put(cfg, row, &v, sizeof v);
        return MT_OK;
    }
    case K_ENUM: {
        if (n->type == YAML_SCALAR_NODE) {
            for (const enum_name_t *e = row->enums; e->name; e++) {
                if (strcmp(e->name, (const char *)n->data.scalar.value) == 0) {
                    int v = e->value;
                    put(cfg, row, &v, sizeof v);
                    return MT_OK;
                }
            }
        }
        char list[256] = "", got[256];
        size_t used = 0;
        for (const enum_name_t *e = row->enums; e->name; e++) {
            int w = snprintf(list + used, sizeof list - used, "%s%s", e == row->enums ? "" : ", ", e->name);
            if (w < 0 || (size_t)w >= sizeof list - used) break;
            used += (size_t)w;
        }
        mt_yaml_describe(n, got, sizeof got);
        return eng_cfg_fail(c, n, "%s: got %s, expected one of: %s", key, got, list);
    }
    case K_DATASETS: return apply_datasets(c, row, key, n);
    case K_VALSET: return apply_val_set(c, row, key, n);
    case K_STRLIST: return apply_strlist(c, row, key, n);
    case K_JSON: return apply_json(c, key, n);
    case K_TEXT: return apply_text(c, row, key, n);
    case K_DEVICES: return apply_devices(c, key, n);
    case K_SECTION: {
        if (n->type != YAML_MAPPING_NODE) return eng_cfg_expected(c, n, key, "a mapping");
        char prefix[128];
        snprintf(prefix, sizeof prefix, "%s.", key);
        return walk_mapping(c, row->section, prefix, n);
    }
    }
    return eng_cfg_fail(c, n, "%s: internal error: unhandled key kind", key);
}

static mt_status_t walk_mapping(pctx_t *c, const key_row_t *rows, const char *prefix, yaml_node_t *map) {
    for (yaml_node_pair_t *p = map->data.mapping.pairs.start; p < map->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        if (!k || k->type != YAML_SCALAR_NODE) return eng_cfg_fail(c, k, "keys must be strings");
        const char *name = (const char *)k->data.scalar.value;
        /* YAML forbids duplicate keys but libyaml lets them through; the
         * second would silently win, so refuse it. */
        for (yaml_node_pair_t *q = map->data.mapping.pairs.start; q < p; q++) {
            yaml_node_t *qk = yaml_document_get_node(c->doc, q->key);
            if (qk && qk->type == YAML_SCALAR_NODE && strcmp((const char *)qk->data.scalar.value, name) == 0)
                return eng_cfg_fail(c, k, "duplicate key '%s%.200s' (first at line %zu)", prefix, name,
                            (size_t)qk->start_mark.line + 1);
        }
        const key_row_t *row = eng_cfg_find_row(rows, name);
        if (!row) return eng_cfg_unknown_key(c, k, rows, prefix, name);
        char key[256];
        snprintf(key, sizeof key, "%s%s", prefix, row->name);
        mt_status_t st = eng_cfg_apply(c, row, key, v);
        if (st != MT_OK) return st;
    }
    return MT_OK;
}

mt_status_t eng_run_config_parse(const char *yaml_text, size_t len, const char *path, eng_run_config_t *cfg,
                                 mt_error_t *err) {
    eng_run_config_defaults(cfg);
    const char *name = path ? path : "<run config>";
    pctx_t c = {.file = name, .set_arg = NULL, .cfg = cfg, .err = err};
    if (path) {
        int w = snprintf(cfg->source_path, sizeof cfg->source_path, "%s", path);
        if (w < 0 || (size_t)w >= sizeof cfg->source_path)
            return mt_error_set(err, MT_ERR_CONFIG, "%.400s: path longer than %zu bytes", path,
                                sizeof cfg->source_path - 1);
        const char *slash = strrchr(path, '/');
        if (slash == path) snprintf(c.base_dir, sizeof c.base_dir, "/");
        else if (slash) snprintf(c.base_dir, sizeof c.base_dir, "%.*s", (int)(slash - path), path);
        if (strcmp(c.base_dir, "/") == 0) c.base_dir[0] = '\0'; /* "/x" joins as "//x" otherwise */
    }

    mt_yaml_doc_t yd;
    mt_status_t st = mt_yaml_doc_parse(&yd, yaml_text, len, name, "run config", MT_ERR_CONFIG, err);
    if (st != MT_OK) return st;
    c.doc = &yd.doc;
    yaml_node_t *root = yd.root;
    if (root && !eng_yaml_is_null(root)) {
        if (root->type != YAML_MAPPING_NODE) st = eng_cfg_fail(&c, root, "the run config must be a mapping of keys");
        else st = walk_mapping(&c, eng_cfg_top_rows, "", root);
    }
    mt_yaml_doc_free(&yd);
    if (st != MT_OK) eng_run_config_free(cfg);
    return st;
}

mt_status_t eng_run_config_load(const char *path, eng_run_config_t *cfg, mt_error_t *err) {
    eng_run_config_defaults(cfg);
    char *buf;
    size_t len;
    mt_status_t st = mt_read_regular_file(path, "run config", MT_YAML_MAX_BYTES, &buf, &len, err);
    if (st != MT_OK) return st;
    st = eng_run_config_parse(buf, len, path, cfg, err);
    free(buf);
    return st;
}
