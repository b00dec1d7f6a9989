/* Run config: defaults, every key, relative paths, error messages (unknown
 * key with suggestion and line, wrong types, bad enums, malformed YAML),
 * --set overrides (dotted keys, model_config), validation and sizes. */
#include "engine/config/config.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failures;
#define EXPECT(c)                                                                       \
    do {                                                                                \
        if (!(c)) {                                                                     \
            fprintf(stderr, "%s:%d: expectation failed: %s\n", __FILE__, __LINE__, #c); \
            failures++;                                                                 \
        }                                                                               \
    } while (0)

/* Parses text; expects failure with `code` and every needle in the message. */
static void expect_error(const char *yaml, mt_status_t code, const char *n1, const char *n2, int line) {
    eng_run_config_t cfg;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_parse(yaml, strlen(yaml), "cfgs/run.yaml", &cfg, &err);
    bool ok = st == code && (!n1 || strstr(err.msg, n1)) && (!n2 || strstr(err.msg, n2));
    if (!ok) {
        fprintf(stderr, "config_test.c:%d: for YAML\n%s\nexpected %s with '%s' and '%s', got %s: %s\n", line, yaml,
                mt_status_name(code), n1 ? n1 : "", n2 ? n2 : "", mt_status_name(st), err.msg);
        failures++;
    }
    eng_run_config_free(&cfg);
}
#define EXPECT_ERROR(yaml, code, n1, n2) expect_error(yaml, code, n1, n2, __LINE__)

static void expect_set_error(eng_run_config_t *cfg, const char *assignment, const char *n1, const char *n2,
                             int line) {
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_set(cfg, assignment, &err);
    bool ok = st == MT_ERR_CONFIG && strstr(err.msg, "--set") && (!n1 || strstr(err.msg, n1)) &&
              (!n2 || strstr(err.msg, n2));
    if (!ok) {
        fprintf(stderr, "config_test.c:%d: --set %s: expected a config error with '%s' and '%s', got %s: %s\n", line,
                assignment, n1 ? n1 : "", n2 ? n2 : "", mt_status_name(st), err.msg);
        failures++;
    }
}
#define EXPECT_SET_ERROR(cfg, a, n1, n2) expect_set_error(cfg, a, n1, n2, __LINE__)

static bool set_ok(eng_run_config_t *cfg, const char *a) {
    mt_error_t err = {0};
    if (eng_run_config_set(cfg, a, &err) == MT_OK) return true;
    fprintf(stderr, "--set %s failed: %s\n", a, err.msg);
    return false;
}

static void test_defaults(void) {
    eng_run_config_t c;
    eng_run_config_defaults(&c);
    EXPECT(c.sequence_len == 512 && c.micro_batch_size == 1 && c.gradient_accumulation_steps == 1);
    EXPECT(c.max_steps == 0 && c.num_epochs == 1 && c.learning_rate == 2e-5);
    EXPECT(c.lr_scheduler == ENG_LR_COSINE && c.warmup_steps == 0);
    EXPECT(c.adam_beta1 == 0.9 && c.adam_beta2 == 0.999 && c.adam_epsilon == 1e-8);
    EXPECT(c.weight_decay == 0.0 && c.max_grad_norm == 1.0 && c.shuffle && c.seed == 42);
    EXPECT(c.idle_experts == ENG_IDLE_EXPERTS_STEP);
    EXPECT(strcmp(c.output_dir, "./outputs/run") == 0 && c.logging_steps == 1 && c.save_steps == 0);
    EXPECT(c.save_final && !c.bf16 && c.backend == ENG_BACKEND_AUTO && c.model_config_json == NULL);
    EXPECT(c.save_max_shard_bytes == 5000000000ull && c.progress);
    EXPECT(c.memory_device == 0 && c.memory_pinned == 0 && c.memory_host == 0);
    EXPECT(c.link_gbps == 0 && c.link_latency_us == 0);
    EXPECT(c.adapter == ENG_ADAPTER_NONE && c.lora_r == 8 && c.lora_alpha == 8.0 && c.num_lora_target_modules == 0);
    EXPECT(c.num_datasets == 0 && c.base_model[0] == '\0' && c.base_model_init[0] == '\0');

    /* an empty file is the defaults; validation then wants base_model */
    mt_error_t err = {0};
    EXPECT(eng_run_config_parse("", 0, "cfgs/run.yaml", &c, &err) == MT_OK);
    EXPECT(c.sequence_len == 512);
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "base_model"));
    eng_run_config_free(&c);
}

static const char *k_full =
    "# every key\n"
    "base_model: ckpt/mixtral-tiny\n"
    "base_model_init: models/tiny.json\n"
    "datasets:\n"
    "  - path: data/train.jsonl\n"
    "    type: completion\n"
    "  - path: /abs/tokens.bin\n"
    "sequence_len: 1024\n"
    "micro_batch_size: 2\n"
    "gradient_accumulation_steps: 8\n"
    "max_steps: 100\n"
    "num_epochs: 3\n"
    "learning_rate: 2e-4\n"
    "lr_scheduler: linear\n"
    "warmup_steps: 10\n"
    "adam_beta1: 0.85\n"
    "adam_beta2: 0.95\n"
    "adam_epsilon: 1.0e-6\n"
    "weight_decay: 0.1\n"
    "max_grad_norm: 0.5\n"
    "shuffle: false\n"
    "seed: 18446744073709551615\n"
    "output_dir: out/run1\n"
    "logging_steps: 5\n"
    "save_steps: 50\n"
    "save_final: no\n"
    "bf16: true\n"
    "backend: cpu\n"
    "model_config:\n"
    "  output_router_logits: true\n"
    "  router_aux_loss_coef: 0.02\n"
    "  num_experts_per_tok: 2\n"
    "  rms_norm_eps: 1e-5\n"
    "  sliding_window: ~\n"
    "  name: \"12\"\n"
    "  word: hello\n"
    "  hex: 0x10\n"
    "  list: [1, two, 3.5, off]\n"
    "  nested: {a: {b: Yes}}\n"
    "memory:\n"
    "  device: 80GiB\n"
    "  pinned: 512MiB\n"
    "  host: 1.5GB\n"
    "backend_options: {link_gbps: 25, link_latency_us: 7.5, compute_threads: 1}\n"
    "save_max_shard_size: 2GB\n"
    "progress: off\n"
    "adapter: lora\n"
    "lora_r: 16\n"
    "lora_alpha: 32\n"
    "lora_dropout: 0.05\n"
    "lora_target_modules:\n"
    "  - q_proj\n"
    "  - v_proj\n"
    "  - 'w1'\n";

static void test_every_key(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_parse(k_full, strlen(k_full), "cfgs/run.yaml", &c, &err);
    if (st != MT_OK) fprintf(stderr, "parse: %s\n", err.msg);
    EXPECT(st == MT_OK);
    EXPECT(strcmp(c.source_path, "cfgs/run.yaml") == 0);
    /* relative paths are anchored at the YAML's folder, absolute ones kept */
    EXPECT(strcmp(c.base_model, "cfgs/ckpt/mixtral-tiny") == 0);
    EXPECT(strcmp(c.base_model_init, "cfgs/models/tiny.json") == 0);
    EXPECT(c.num_datasets == 2);
    EXPECT(strcmp(c.datasets[0].path, "cfgs/data/train.jsonl") == 0);
    EXPECT(strcmp(c.datasets[1].path, "/abs/tokens.bin") == 0);
    EXPECT(c.sequence_len == 1024 && c.micro_batch_size == 2 && c.gradient_accumulation_steps == 8);
    EXPECT(c.max_steps == 100 && c.num_epochs == 3);
    EXPECT(c.learning_rate == 2e-4 && c.lr_scheduler == ENG_LR_LINEAR && c.warmup_steps == 10);
    EXPECT(c.adam_beta1 == 0.85 && c.adam_beta2 == 0.95 && c.adam_epsilon == 1e-6);
    EXPECT(c.weight_decay == 0.1 && c.max_grad_norm == 0.5 && !c.shuffle);
    EXPECT(c.seed == 18446744073709551615ull);
    EXPECT(strcmp(c.output_dir, "cfgs/out/run1") == 0);
    EXPECT(c.logging_steps == 5 && c.save_steps == 50 && !c.save_final && c.bf16);
    EXPECT(c.backend == ENG_BACKEND_CPU);
    EXPECT(c.memory_device == 80ull << 30 && c.memory_pinned == 512ull << 20 && c.memory_host == 1500000000ull);
    EXPECT(c.link_gbps == 25.0 && c.link_latency_us == 7.5 && c.compute_threads == 1);
    EXPECT(c.save_max_shard_bytes == 2000000000ull && !c.progress);
    EXPECT(c.adapter == ENG_ADAPTER_LORA && c.lora_r == 16 && c.lora_alpha == 32.0 && c.lora_dropout == 0.05);
    EXPECT(c.num_lora_target_modules == 3 && strcmp(c.lora_target_modules[0], "q_proj") == 0 &&
           strcmp(c.lora_target_modules[2], "w1") == 0);
    EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
    /* an 8-bit optimizer name with other moments contradicts itself, named with both keys */
    EXPECT(set_ok(&c, "optimizer=adamw_8bit") && set_ok(&c, "optimizer_state=bf16"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "optimizer_state: bf16") &&
           strstr(err.msg, "optimizer: an 8-bit"));
    EXPECT(set_ok(&c, "optimizer_state=8bit") && eng_run_config_validate(&c, &err) == MT_OK);
    EXPECT(set_ok(&c, "optimizer=adamw_torch") && set_ok(&c, "optimizer_state=~"));

    /* model_config: scalars typed as YAML 1.1 (PyYAML) would */
    EXPECT(c.model_config_json != NULL);
    json_error_t je;
    json_t *j = c.model_config_json ? json_loads(c.model_config_json, 0, &je) : NULL;
    EXPECT(j && json_is_object(j));
    if (j) {
        EXPECT(json_is_true(json_object_get(j, "output_router_logits")));
        EXPECT(json_is_real(json_object_get(j, "router_aux_loss_coef")) &&
               json_real_value(json_object_get(j, "router_aux_loss_coef")) == 0.02);
        EXPECT(json_is_integer(json_object_get(j, "num_experts_per_tok")) &&
               json_integer_value(json_object_get(j, "num_experts_per_tok")) == 2);
        EXPECT(json_is_real(json_object_get(j, "rms_norm_eps")) &&
               json_real_value(json_object_get(j, "rms_norm_eps")) == 1e-5);
        EXPECT(json_is_null(json_object_get(j, "sliding_window")));
        EXPECT(json_is_string(json_object_get(j, "name")) &&
               strcmp(json_string_value(json_object_get(j, "name")), "12") == 0); /* quoted: a string */
        EXPECT(json_is_string(json_object_get(j, "word")));
        EXPECT(json_integer_value(json_object_get(j, "hex")) == 16);
        json_t *l = json_object_get(j, "list");
        EXPECT(json_array_size(l) == 4 && json_integer_value(json_array_get(l, 0)) == 1 &&
               json_is_string(json_array_get(l, 1)) && json_real_value(json_array_get(l, 2)) == 3.5 &&
               json_is_false(json_array_get(l, 3)));
        EXPECT(json_is_true(json_object_get(json_object_get(json_object_get(j, "nested"), "a"), "b")));
        json_decref(j);
    }
    eng_run_config_free(&c);
    EXPECT(c.model_config_json == NULL);
}

static void test_null_and_scalars(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    /* null keeps the default; YAML 1.1 ints (octal, hex, underscores) */
    const char *y = "learning_rate:\nwarmup_steps: 0x10\nsequence_len: 1_024\nmax_steps: 010\nmemory: ~\n";
    EXPECT(eng_run_config_parse(y, strlen(y), NULL, &c, &err) == MT_OK);
    EXPECT(c.learning_rate == 2e-5 && c.warmup_steps == 16 && c.sequence_len == 1024 && c.max_steps == 8);
    eng_run_config_free(&c);
    /* no path: relative paths kept as written */
    y = "base_model: ckpt\n";
    EXPECT(eng_run_config_parse(y, strlen(y), NULL, &c, &err) == MT_OK && strcmp(c.base_model, "ckpt") == 0);
    eng_run_config_free(&c);
    y = "base_model: ckpt\n";
    EXPECT(eng_run_config_parse(y, strlen(y), "run.yaml", &c, &err) == MT_OK && strcmp(c.base_model, "ckpt") == 0);
    eng_run_config_free(&c);
}

static void test_errors(void) {
    /* unknown key: file, line, nearest valid key at the same level */
    EXPECT_ERROR("base_model: x\nmicro_batch_sise: 4\n", MT_ERR_CONFIG, "cfgs/run.yaml:2:",
                 "unknown key 'micro_batch_sise', did you mean 'micro_batch_size'?");
    EXPECT_ERROR("lr_schedular: cosine\n", MT_ERR_CONFIG, "cfgs/run.yaml:1:", "did you mean 'lr_scheduler'?");
    EXPECT_ERROR("memory:\n  device: 1GiB\n  pined: 1GiB\n", MT_ERR_CONFIG, "cfgs/run.yaml:3:",
                 "unknown key 'memory.pined', did you mean 'memory.pinned'?");
    EXPECT_ERROR("datasets:\n  - path: a.jsonl\n    pth: b\n", MT_ERR_CONFIG, "cfgs/run.yaml:3:", "did you mean 'datasets[].path'?");
    /* nothing near: the valid keys are listed instead of a wild guess */
    EXPECT_ERROR("memory:\n  wandb_project: x\n", MT_ERR_CONFIG, "valid keys here: memory.device, memory.pinned",
                 NULL);
    /* wrong types name the key and what was expected */
    EXPECT_ERROR("micro_batch_size: \"abc\"\n", MT_ERR_CONFIG, "cfgs/run.yaml:1:",
                 "micro_batch_size: expected an integer");
    EXPECT_ERROR("micro_batch_size: \"4\"\n", MT_ERR_CONFIG, "expected an integer", "quoted string");
    EXPECT_ERROR("micro_batch_size: 4.5\n", MT_ERR_CONFIG, "expected an integer", NULL);
    EXPECT_ERROR("\n\nlearning_rate: [1]\n", MT_ERR_CONFIG, "cfgs/run.yaml:3:", "learning_rate: expected a number, got a list");
    EXPECT_ERROR("shuffle: 1\n", MT_ERR_CONFIG, "shuffle: expected a boolean", NULL);
    EXPECT_ERROR("seed: -1\n", MT_ERR_CONFIG, "seed: expected a non-negative integer", NULL);
    EXPECT_ERROR("sequence_len: 99999999999\n", MT_ERR_CONFIG, "out of range", NULL);
    EXPECT_ERROR("base_model: {a: 1}\n", MT_ERR_CONFIG, "base_model: expected a string, got a mapping", NULL);
    EXPECT_ERROR("datasets: data.jsonl\n", MT_ERR_CONFIG, "datasets: expected a list", NULL);
    EXPECT_ERROR("datasets:\n  - type: completion\n", MT_ERR_CONFIG, "cfgs/run.yaml:2:", "has no 'path'");
    /* a dataset type moetune does not know: refused, naming the accepted ones */
    EXPECT_ERROR("datasets:\n  - path: a.jsonl\n    type: bogus\n", MT_ERR_CONFIG, "datasets[0].type: 'bogus'",
                 "completion, pretrain, chat_template, alpaca, input_output");
    EXPECT_ERROR("datasets:\n  - path: a.jsonl\n    train_on_eos: sometimes\n", MT_ERR_CONFIG,
                 "datasets[0].train_on_eos: 'sometimes'", "turn, all, last, none");
    EXPECT_ERROR("datasets:\n  - path: a.jsonl\n    message_property_mappings: {speaker: from}\n", MT_ERR_CONFIG,
                 "unknown key 'speaker'", NULL);
    {
        /* a chat dataset's keys land in its entry */
        eng_run_config_t c;
        mt_error_t e = {0};
        const char *y = "base_model: m\ndatasets:\n  - path: chats.jsonl\n    type: chat_template\n    field_messages: conversations\n"
                        "    message_property_mappings: {role: from, content: value}\n"
                        "    roles_to_train: [assistant, tool]\n    train_on_eos: last\n"
                        "chat_template: chatml\ntrain_on_inputs: true\n";
        EXPECT(eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &e) == MT_OK);
        const eng_dataset_entry_t *d = &c.datasets[0];
        EXPECT(d->type == ENG_DATA_CHAT_TEMPLATE && strcmp(d->field_messages, "conversations") == 0 &&
                   strcmp(d->role_key, "from") == 0 && strcmp(d->content_key, "value") == 0 &&
                   d->num_roles_to_train == 2 && strcmp(d->roles_to_train[1], "tool") == 0 &&
                   d->train_on_eos == ENG_EOS_LAST && strcmp(c.chat_template, "chatml") == 0 && c.train_on_inputs);
        EXPECT(eng_run_config_validate(&c, &e) == MT_OK);
        eng_run_config_free(&c);
        /* chat_template: jinja without its text is refused by the checks, naming the missing key */
        const char *j = "base_model: m\ndatasets:\n  - path: chats.jsonl\nchat_template: jinja\n";
        EXPECT(eng_run_config_parse(j, strlen(j), "cfgs/run.yaml", &c, &e) == MT_OK);
        EXPECT(eng_run_config_validate(&c, &e) == MT_ERR_CONFIG && strstr(e.msg, "chat_template_jinja"));
        eng_run_config_free(&c);
    }
    EXPECT_ERROR("model_config: 3\n", MT_ERR_CONFIG, "model_config: expected a mapping", NULL);
    EXPECT_ERROR("model_config: {a: .inf}\n", MT_ERR_CONFIG, "cannot be written to JSON", NULL);
    /* one string is PEFT's regular-expression form; a mapping is nothing */
    EXPECT_ERROR("lora_target_modules: {q: 1}\n", MT_ERR_CONFIG, "expected a list of module names", "regular expression");
    EXPECT_ERROR("lora_modules_to_save: lm_head\n", MT_ERR_CONFIG, "lora_modules_to_save: expected a list of module names",
                 NULL);
    EXPECT_ERROR("memory: 8GiB\n", MT_ERR_CONFIG, "memory: expected a mapping", NULL);
    EXPECT_ERROR("memory:\n  device: 8 GiBs\n", MT_ERR_CONFIG, "cfgs/run.yaml:2:", "memory.device: bad size '8 GiBs'");
    /* bad enum values list the valid ones */
    EXPECT_ERROR("lr_scheduler: cosine_with_restarts\n", MT_ERR_CONFIG, "lr_scheduler: got 'cosine_with_restarts'",
                 "expected one of: constant, constant_with_warmup, linear, cosine");
    EXPECT_ERROR("backend: tpu\n", MT_ERR_CONFIG, "expected one of: cpu, cuda, auto", NULL);
    EXPECT_ERROR("adapter: qlora\n", MT_ERR_CONFIG, "expected one of: lora", NULL);
    EXPECT_ERROR("idle_experts: none\n", MT_ERR_CONFIG, "expected one of: step, skip", NULL);
    /* duplicates, non-mapping root, a second document */
    EXPECT_ERROR("seed: 1\nseed: 2\n", MT_ERR_CONFIG, "cfgs/run.yaml:2:", "duplicate key 'seed' (first at line 1)");
    EXPECT_ERROR("- a\n- b\n", MT_ERR_CONFIG, "must be a mapping", NULL);
    EXPECT_ERROR("seed: 1\n---\nseed: 2\n", MT_ERR_CONFIG, "second YAML document", NULL);
    /* malformed YAML: libyaml's problem with line and column */
    EXPECT_ERROR("seed: 1\nmemory: {device: 1GiB\nbf16: true\n", MT_ERR_CONFIG, "cfgs/run.yaml:", "invalid YAML");
    EXPECT_ERROR("a: b: c\n", MT_ERR_CONFIG, "cfgs/run.yaml:1:5: invalid YAML: mapping values are not allowed", NULL);
    EXPECT_ERROR("seed: 1\n---\nx: [\n", MT_ERR_CONFIG, "invalid YAML", NULL); /* error in a later document */

    eng_run_config_t c;
    mt_error_t err = {0};
    EXPECT(eng_run_config_load("/nonexistent/dir/run.yaml", &c, &err) == MT_ERR_IO &&
           strstr(err.msg, "/nonexistent/dir/run.yaml"));
    eng_run_config_free(&c);
}

static void test_set(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    const char *y = "base_model: m\ndatasets: [{path: d.jsonl}]\nmodel_config: {num_experts_per_tok: 2}\n";
    EXPECT(eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &err) == MT_OK);
    EXPECT(set_ok(&c, "micro_batch_size=4") && c.micro_batch_size == 4);
    EXPECT(set_ok(&c, " learning_rate = 1e-4") && c.learning_rate == 1e-4);
    EXPECT(set_ok(&c, "memory.device=8GiB") && c.memory_device == 8ull << 30);
    EXPECT(set_ok(&c, "backend_options.link_gbps=12.5") && c.link_gbps == 12.5);
    EXPECT(set_ok(&c, "memory={pinned: 1MB}") && c.memory_pinned == 1000000 && c.memory_device == 8ull << 30);
    EXPECT(set_ok(&c, "lr_scheduler=constant_with_warmup") && c.lr_scheduler == ENG_LR_CONSTANT_WITH_WARMUP);
    EXPECT(set_ok(&c, "shuffle=false") && !c.shuffle);
    EXPECT(!c.sample_packing && set_ok(&c, "sample_packing=true") && c.sample_packing);
    /* --set paths are the user's, relative to the working directory */
    EXPECT(set_ok(&c, "output_dir=runs/x") && strcmp(c.output_dir, "runs/x") == 0);
    EXPECT(set_ok(&c, "datasets=[{path: a.bin}, {path: b.jsonl}]") && c.num_datasets == 2 &&
           strcmp(c.datasets[1].path, "b.jsonl") == 0);
    EXPECT(set_ok(&c, "lora_target_modules=[q_proj, k_proj]") && c.num_lora_target_modules == 2);
    /* dotted model_config keys add to the object; a whole mapping replaces it */
    EXPECT(set_ok(&c, "model_config.output_router_logits=true"));
    EXPECT(set_ok(&c, "model_config.rope_scaling.factor=2"));
    json_error_t je;
    json_t *j = json_loads(c.model_config_json, 0, &je);
    EXPECT(j && json_integer_value(json_object_get(j, "num_experts_per_tok")) == 2 &&
           json_is_true(json_object_get(j, "output_router_logits")) &&
           json_integer_value(json_object_get(json_object_get(j, "rope_scaling"), "factor")) == 2);
    json_decref(j);
    EXPECT(set_ok(&c, "model_config={router_aux_loss_coef: 0.01}"));
    EXPECT(strcmp(c.model_config_json, "{\"router_aux_loss_coef\":0.01}") == 0);
    /* an empty value is null: back to the default */
    EXPECT(set_ok(&c, "micro_batch_size=") && c.micro_batch_size == 1);
    EXPECT(set_ok(&c, "model_config=") && c.model_config_json == NULL);
    /* the NVMe tier's keys, a section inside a section; null resets both */
    EXPECT(c.memory_nvme_path[0] == '\0' && c.memory_nvme_budget == 0);
    EXPECT(set_ok(&c, "memory.nvme.path=/mnt/nvme/m") && strcmp(c.memory_nvme_path, "/mnt/nvme/m") == 0);
    EXPECT(set_ok(&c, "memory.nvme={path: /d, budget: 4TiB}") && strcmp(c.memory_nvme_path, "/d") == 0 &&
           c.memory_nvme_budget == 4ull << 40);
    EXPECT(set_ok(&c, "memory=~") && c.memory_device == 0 && c.memory_pinned == 0);
    EXPECT(c.memory_nvme_path[0] == '\0' && c.memory_nvme_budget == 0);

    EXPECT_SET_ERROR(&c, "micro_batch_sise=4", "did you mean 'micro_batch_size'?", NULL);
    EXPECT_SET_ERROR(&c, "memory.devce=8GiB", "unknown key 'memory.devce', did you mean 'memory.device'?", NULL);
    EXPECT_SET_ERROR(&c, "learning_rate=abc", "learning_rate: expected a number, got 'abc'", NULL);
    EXPECT_SET_ERROR(&c, "lr_scheduler=bogus", "expected one of: constant, constant_with_warmup, linear, cosine", NULL);
    EXPECT_SET_ERROR(&c, "memory.device=lots", "bad size 'lots'", NULL);
    EXPECT_SET_ERROR(&c, "memory.nvme.pth=/d", "unknown key 'memory.nvme.pth', did you mean 'memory.nvme.path'?", NULL);
    EXPECT_SET_ERROR(&c, "memory.nvme.budget=lots", "bad size 'lots'", NULL);
    EXPECT_SET_ERROR(&c, "seed.x=1", "'seed' has no sub-keys", NULL);
    EXPECT_SET_ERROR(&c, "micro_batch_size", "expected key=value", NULL);
    EXPECT_SET_ERROR(&c, "=4", "the key is empty", NULL);
    EXPECT_SET_ERROR(&c, "model_config={a: [1, 2}", "invalid YAML", NULL);
    EXPECT(c.micro_batch_size == 1 && c.learning_rate == 1e-4); /* failed sets change nothing */
    /* datasets holds a.bin: an llm.c stream has no examples to pack */
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "sample_packing") &&
           strstr(err.msg, "a.bin"));
    EXPECT(set_ok(&c, "sample_packing=false"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
    eng_run_config_free(&c);
}

/* A valid config with one field broken must fail naming that field. */
static void expect_invalid(const char *assignment, const char *needle, int line) {
    eng_run_config_t c;
    mt_error_t err = {0};
    const char *y = "base_model: m\ndatasets: [{path: d.jsonl}]\n";
    if (eng_run_config_parse(y, strlen(y), "v.yaml", &c, &err) != MT_OK) {
        failures++;
        return;
    }
    /* A key's own range is checked as it is set (naming the key and the
     * range); what needs other keys is checked by validate. */
    if (eng_run_config_set(&c, assignment, &err) != MT_OK) {
        if (!strstr(err.msg, needle) || !strstr(err.msg, "out of range")) {
            fprintf(stderr, "config_test.c:%d: --set %s refused without naming '%s': %s\n", line, assignment,
                    needle, err.msg);
            failures++;
        }
        eng_run_config_free(&c);
        return;
    }
    mt_status_t st = eng_run_config_validate(&c, &err);
    if (st != MT_ERR_CONFIG || !strstr(err.msg, needle) || !strstr(err.msg, "v.yaml")) {
        fprintf(stderr, "config_test.c:%d: validate after %s: expected an error naming '%s', got %s: %s\n", line,
                assignment, needle, mt_status_name(st), err.msg);
        failures++;
    }
    eng_run_config_free(&c);
}
#define EXPECT_INVALID(a, needle) expect_invalid(a, needle, __LINE__)

static void test_validate(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    snprintf(c.base_model, sizeof c.base_model, "m");
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "datasets"));
    c.num_datasets = 1;
    snprintf(c.datasets[0].path, sizeof c.datasets[0].path, "d.jsonl");
    EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
    eng_run_config_free(&c);

    EXPECT_INVALID("micro_batch_size=0", "micro_batch_size: 0 is out of range; expected an integer from 1 to 65536");
    EXPECT_INVALID("sequence_len=-5", "sequence_len");
    EXPECT_INVALID("gradient_accumulation_steps=2147483647",
                   "gradient_accumulation_steps: 2147483647 is out of range; expected an integer from 1 to 1000000");
    EXPECT_INVALID("max_steps=-1", "max_steps");
    EXPECT_INVALID("save_steps=2000000000", "save_steps");
    EXPECT_INVALID("warmup_steps=-3", "warmup_steps");
    EXPECT_INVALID("sequence_len=1048577", "sequence_len");
    {
        /* each in range, their product too large for one micro-batch */
        eng_run_config_t c;
        mt_error_t err = {0};
        const char *y = "base_model: m\ndatasets: [{path: d.jsonl}]\nmicro_batch_size: 65536\nsequence_len: 1048576\n";
        EXPECT(eng_run_config_parse(y, strlen(y), "v.yaml", &c, &err) == MT_OK);
        EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG &&
               strstr(err.msg, "micro_batch_size x sequence_len = 68719476736 tokens"));
        EXPECT(set_ok(&c, "micro_batch_size=64") && eng_run_config_validate(&c, &err) == MT_OK);
        eng_run_config_free(&c);
    }
    EXPECT_INVALID("gradient_accumulation_steps=0", "gradient_accumulation_steps");
    EXPECT_INVALID("adam_beta1=1.0", "adam_beta1 must be in [0, 1)");
    EXPECT_INVALID("adam_beta2=-0.1", "adam_beta2");
    EXPECT_INVALID("learning_rate=-1e-3", "learning_rate");
    EXPECT_INVALID("learning_rate=.nan", "learning_rate");
    EXPECT_INVALID("learning_rate=1e38", "learning_rate: 1e+38 is above 1");
    EXPECT_INVALID("adam_epsilon=0", "adam_epsilon: 0; expected a positive number");
    EXPECT_INVALID("adam_epsilon=-1e-8", "adam_epsilon");
    EXPECT_INVALID("weight_decay=-1", "weight_decay");
    EXPECT_INVALID("save_max_shard_size=0", "save_max_shard_size");
    EXPECT_INVALID("logging_steps=0", "logging_steps");
    EXPECT_INVALID("backend_options.link_gbps=-1", "link_gbps");
    EXPECT_INVALID("backend_options.compute_threads=-2", "compute_threads");
    EXPECT_INVALID("num_epochs=0", "max_steps or num_epochs");
    EXPECT_INVALID("adapter=lora", "lora_target_modules");
    EXPECT_INVALID("datasets=[]", "datasets is empty");
}

static void test_sizes(void) {
    static const struct {
        const char *text;
        size_t bytes;
    } ok[] = {
        {"80GiB", 80ull << 30}, {"512MiB", 512ull << 20}, {"1.5GB", 1500000000ull}, {"1e9", 1000000000ull},
        {"4096", 4096},         {"10KB", 10000},          {"10KiB", 10240},          {"2 TB", 2000000000000ull},
        {"0", 0},               {"7B", 7},                {"64gib", 64ull << 30},    {"18446744073709551615", 18446744073709551615ull},
        {"0.5KiB", 512},        {" 3MB ", 3000000},
    };
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        size_t v = 1;
        mt_error_t err = {0};
        mt_status_t st = eng_parse_size(ok[i].text, &v, &err);
        if (st != MT_OK || v != ok[i].bytes) {
            fprintf(stderr, "eng_parse_size(\"%s\") = %zu (%s), expected %zu\n", ok[i].text, v, err.msg, ok[i].bytes);
            failures++;
        }
    }
    static const char *const bad[] = {"", "GiB", "-1GB", "80XB", "1.5.5GB", "0x10", "inf", "nan", "5Gb", "1e30", "12 34"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t v;
        mt_error_t err = {0};
        char quoted[64];
        snprintf(quoted, sizeof quoted, "'%s'", bad[i]);
        if (eng_parse_size(bad[i], &v, &err) != MT_ERR_CONFIG || !strstr(err.msg, quoted)) {
            fprintf(stderr, "eng_parse_size(\"%s\") should fail naming the text; got: %s\n", bad[i], err.msg);
            failures++;
        }
    }
}

/* The file path: read from disk, relative paths anchored at its folder. */
static void test_load(void) {
    const char *tmp = getenv("TEST_TMPDIR");
    if (!tmp) tmp = "/tmp";
    char path[1024];
    snprintf(path, sizeof path, "%s/config_test_run.yaml", tmp);
    FILE *f = fopen(path, "w");
    EXPECT(f != NULL);
    if (!f) return;
    fputs(k_full, f);
    fclose(f);
    eng_run_config_t c;
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_load(path, &c, &err);
    if (st != MT_OK) fprintf(stderr, "load: %s\n", err.msg);
    EXPECT(st == MT_OK);
    char want[1100];
    snprintf(want, sizeof want, "%s/ckpt/mixtral-tiny", tmp);
    EXPECT(strcmp(c.base_model, want) == 0);
    EXPECT(c.num_datasets == 2 && c.lora_r == 16);
    eng_run_config_free(&c);
    remove(path);
}

/* scheduler: section and hardware: key */
static void test_scheduler(void) {
    eng_run_config_t c;
    eng_run_config_defaults(&c);
    EXPECT(c.sched_policy == ENG_SCHED_AUTO && c.sched_prefetch_window == 0 && c.hardware[0] == '\0');
    EXPECT(c.sched_weights == ENG_WEIGHTS_AUTO && c.sched_grads == ENG_PLACE_AUTO);
    EXPECT(c.sched_optimizer == ENG_PLACE_AUTO && c.sched_activations == ENG_ACTS_AUTO);
    const char *y = "hardware: h100-sxm\n"
                    "scheduler:\n"
                    "  policy: offload_all\n"
                    "  prefetch_window: 3\n"
                    "  weights: stream\n"
                    "  grads: device\n"
                    "  optimizer: host\n"
                    "  activations: recompute\n";
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &err);
    if (st != MT_OK) fprintf(stderr, "scheduler parse: %s\n", err.msg);
    EXPECT(st == MT_OK);
    /* a name is not a path: not joined with the config's folder */
    EXPECT(strcmp(c.hardware, "h100-sxm") == 0);
    EXPECT(c.sched_policy == ENG_SCHED_OFFLOAD_ALL && c.sched_prefetch_window == 3);
    EXPECT(c.sched_weights == ENG_WEIGHTS_STREAM && c.sched_grads == ENG_PLACE_DEVICE);
    EXPECT(c.sched_optimizer == ENG_PLACE_HOST && c.sched_activations == ENG_ACTS_RECOMPUTE);
    EXPECT(set_ok(&c, "scheduler.policy=min_memory") && c.sched_policy == ENG_SCHED_MIN_MEMORY);
    EXPECT(set_ok(&c, "scheduler.activations=keep") && c.sched_activations == ENG_ACTS_KEEP);
    EXPECT(set_ok(&c, "hardware=../hw/mine.yaml") && strcmp(c.hardware, "../hw/mine.yaml") == 0);
    EXPECT(!c.sched_speculative);
    EXPECT(set_ok(&c, "scheduler.speculative_optimizer=true") && c.sched_speculative);
    EXPECT_SET_ERROR(&c, "scheduler.speculative_optimizer=maybe", "scheduler.speculative_optimizer", NULL);
    EXPECT(set_ok(&c, "scheduler=~") && c.sched_policy == ENG_SCHED_AUTO && c.sched_prefetch_window == 0 &&
           !c.sched_speculative);
    EXPECT_SET_ERROR(&c, "scheduler.policy=fastest", "scheduler.policy", "keep_all");
    EXPECT_SET_ERROR(&c, "scheduler.grads=gpu", "scheduler.grads", "device, host");
    EXPECT_SET_ERROR(&c, "scheduler.polcy=auto", "did you mean 'scheduler.policy'", NULL);
    /* axolotl's optimizer spellings of AdamW are accepted, others refused with the list */
    EXPECT(set_ok(&c, "optimizer=adamw_torch") && set_ok(&c, "optimizer=adamw_torch_fused"));
    EXPECT(eng_config_moments(&c) == 0); /* fp32 moments by default */
    EXPECT_SET_ERROR(&c, "optimizer=sgd", "optimizer", "adamw_torch");
    /* bitsandbytes' 8-bit AdamW names: AdamW with 8-bit moments */
    EXPECT(set_ok(&c, "optimizer=paged_adamw_8bit") && eng_config_moments(&c) == 2);
    EXPECT(set_ok(&c, "optimizer=adamw_bnb_8bit") && set_ok(&c, "optimizer=adamw_8bit") && c.optimizer == 1);
    EXPECT(set_ok(&c, "optimizer_state=8bit") && eng_config_moments(&c) == 2);
    EXPECT(set_ok(&c, "optimizer=adamw_torch") && set_ok(&c, "optimizer_state=bf16") && eng_config_moments(&c) == 1);
    EXPECT(set_ok(&c, "optimizer_state=fp32") && eng_config_moments(&c) == 0);
    EXPECT_SET_ERROR(&c, "optimizer_state=fp16", "optimizer_state", "fp32, bf16, 8bit");
    EXPECT(set_ok(&c, "gradient_checkpointing=true") && c.gradient_checkpointing);
    eng_run_config_free(&c);
    EXPECT_ERROR("scheduler:\n  activations: swap\n", MT_ERR_CONFIG, "run.yaml:2", "keep, offload, recompute");
    EXPECT_ERROR("scheduler:\n  prefetch_windw: 2\n", MT_ERR_CONFIG, "did you mean 'scheduler.prefetch_window'", NULL);
    EXPECT_ERROR("scheduler:\n  swap: yes\n", MT_ERR_CONFIG, "valid keys here", "scheduler.activations");
    EXPECT_ERROR("hardwre: rtx4090\n", MT_ERR_CONFIG, "did you mean 'hardware'", NULL);
    EXPECT_ERROR("scheduler: auto\n", MT_ERR_CONFIG, "scheduler", "a mapping");

    /* validation: the window's range and the one invalid combination */
    const char *base = "base_model: m\ndatasets: [{path: d.jsonl}]\n";
    char text[512];
    snprintf(text, sizeof text, "%sscheduler: {grads: host, optimizer: device}\n", base);
    st = eng_run_config_parse(text, strlen(text), "cfgs/run.yaml", &c, &err);
    EXPECT(st == MT_OK);
    st = eng_run_config_validate(&c, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "grads: host with optimizer: device"));
    eng_run_config_free(&c);
    snprintf(text, sizeof text, "%sscheduler: {weights: stream, optimizer: device}\n", base);
    st = eng_run_config_parse(text, strlen(text), "cfgs/run.yaml", &c, &err);
    EXPECT(st == MT_OK);
    st = eng_run_config_validate(&c, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "weights: stream with optimizer: device"));
    eng_run_config_free(&c);
    snprintf(text, sizeof text, "%sscheduler: {prefetch_window: -1}\n", base);
    st = eng_run_config_parse(text, strlen(text), "cfgs/run.yaml", &c, &err);
    EXPECT(st == MT_ERR_CONFIG && strstr(err.msg, "cfgs/run.yaml:3") && strstr(err.msg, "prefetch_window"));
}

/* staging: section.  The values are checked by the pool itself
 * when the run starts (it knows the largest tensor); here only types. */
static void test_staging(void) {
    eng_run_config_t c;
    eng_run_config_defaults(&c);
    EXPECT(c.staging_mode == ENG_STAGING_COMPACT && c.staging_cap == 0);
    EXPECT(c.staging_num_slabs == -1 && c.staging_slab_size == 0);
    const char *y = "staging:\n"
                    "  mode: per_tensor\n"
                    "  cap: 2GiB\n"
                    "  num_slabs: 3\n"
                    "  slab_size: 64MiB\n";
    mt_error_t err = {0};
    mt_status_t st = eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &err);
    if (st != MT_OK) fprintf(stderr, "staging parse: %s\n", err.msg);
    EXPECT(st == MT_OK);
    EXPECT(c.staging_mode == ENG_STAGING_PER_TENSOR && c.staging_cap == (size_t)2 << 30);
    EXPECT(c.staging_num_slabs == 3 && c.staging_slab_size == (size_t)64 << 20);
    EXPECT(set_ok(&c, "staging.mode=max_slot") && c.staging_mode == ENG_STAGING_MAX_SLOT);
    EXPECT(set_ok(&c, "staging={mode: compact, cap: 512MB}") && c.staging_mode == ENG_STAGING_COMPACT);
    EXPECT(c.staging_cap == 512000000u && c.staging_num_slabs == 3); /* keys not given keep their values */
    /* zero slabs parses (an integer); the pool refuses it when the run starts */
    EXPECT(set_ok(&c, "staging.num_slabs=0") && c.staging_num_slabs == 0);
    EXPECT(set_ok(&c, "staging=~") && c.staging_mode == ENG_STAGING_COMPACT && c.staging_num_slabs == -1 &&
           c.staging_cap == 0 && c.staging_slab_size == 0);
    EXPECT_SET_ERROR(&c, "staging.mode=pinned", "staging.mode", "compact, per_tensor, max_slot");
    EXPECT_SET_ERROR(&c, "staging.cap=lots", "staging.cap", NULL);
    EXPECT_SET_ERROR(&c, "staging.num_slab=2", "did you mean 'staging.num_slabs'", NULL);
    eng_run_config_free(&c);
    EXPECT_ERROR("staging:\n  mode: zero_copy\n", MT_ERR_CONFIG, "run.yaml:2", "compact, per_tensor, max_slot");
    EXPECT_ERROR("staging:\n  slab_sise: 1GiB\n", MT_ERR_CONFIG, "did you mean 'staging.slab_size'", NULL);
    EXPECT_ERROR("staging:\n  num_slabs: two\n", MT_ERR_CONFIG, "staging.num_slabs", "an integer");
    EXPECT_ERROR("stagin:\n  mode: compact\n", MT_ERR_CONFIG, "did you mean 'staging'", NULL);
    EXPECT_ERROR("staging: compact\n", MT_ERR_CONFIG, "staging", "a mapping");
}

/* save_expert_layout: per_expert by default (the Hub's layout), fused on
 * request; any other value names the key and the choices. */
static void test_save_expert_layout(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    EXPECT(c.save_expert_layout == ENG_SAVE_LAYOUT_PER_EXPERT);
    static const char fused[] = "base_model: m\nsave_expert_layout: fused\n";
    mt_status_t st = eng_run_config_parse(fused, strlen(fused), "run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.save_expert_layout == ENG_SAVE_LAYOUT_FUSED);
    if (st == MT_OK) eng_run_config_free(&c);
    static const char bad[] = "base_model: m\nsave_expert_layout: packed\n";
    st = eng_run_config_parse(bad, strlen(bad), "run.yaml", &c, &err);
    EXPECT(st != MT_OK && strstr(err.msg, "save_expert_layout") && strstr(err.msg, "per_expert") &&
           strstr(err.msg, "fused"));
    if (st != MT_OK) fprintf(stderr, "   (refused as expected: %s)\n", err.msg);
    else eng_run_config_free(&c);
}

/* The keys of resumable runs: defaults, both forms of resume_from_checkpoint,
 * a null resetting both halves, and errors naming file and key. */
static void test_resume_keys(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    const char *y = "save_strategy: epoch\nsave_total_limit: 3\nskip_nonfinite_steps: 2\n"
                    "resume_from_checkpoint: out/checkpoint-40\n";
    EXPECT(eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &err) == MT_OK);
    EXPECT(c.save_strategy == ENG_SAVE_STRATEGY_EPOCH && c.save_total_limit == 3 && c.skip_nonfinite_steps == 2);
    /* a path is anchored at the YAML's folder, like every path key */
    EXPECT(strcmp(c.resume_from_checkpoint.path, "cfgs/out/checkpoint-40") == 0 && !c.resume_from_checkpoint.latest);
    EXPECT(set_ok(&c, "resume_from_checkpoint=true"));
    EXPECT(c.resume_from_checkpoint.latest && c.resume_from_checkpoint.path[0] == '\0');
    EXPECT(set_ok(&c, "resume_from_checkpoint=false"));
    EXPECT(!c.resume_from_checkpoint.latest && c.resume_from_checkpoint.path[0] == '\0');
    EXPECT(set_ok(&c, "resume_from_checkpoint=x/checkpoint-2") && set_ok(&c, "resume_from_checkpoint="));
    EXPECT(!c.resume_from_checkpoint.latest && c.resume_from_checkpoint.path[0] == '\0');
    EXPECT(set_ok(&c, "save_strategy=no") && c.save_strategy == ENG_SAVE_STRATEGY_NO);
    eng_run_config_free(&c);
    eng_run_config_defaults(&c);
    EXPECT(c.save_strategy == ENG_SAVE_STRATEGY_AUTO && c.save_total_limit == 0 && c.skip_nonfinite_steps == 0 &&
           !c.resume_from_checkpoint.latest && !c.resume_from_checkpoint.path[0]);
    eng_run_config_free(&c);
    EXPECT_ERROR("save_strategy: hourly\n", MT_ERR_CONFIG, "cfgs/run.yaml:1", "save_strategy");
    EXPECT_ERROR("resume_from_checkpoint: [a]\n", MT_ERR_CONFIG, "resume_from_checkpoint",
                 "a checkpoint directory, true (the latest in output_dir) or false");
    EXPECT_ERROR("save_total_limit: -1\n", MT_ERR_CONFIG, "save_total_limit", "out of range");
    EXPECT_INVALID("save_strategy=steps", "save_strategy: steps needs save_steps > 0");
}

/* devices: a count or a list of distinct ordinals; default one device, 0. */
static void test_devices(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    EXPECT(c.devices.count == 1 && c.devices.ids[0] == 0);
    static const char two[] = "base_model: m\ndevices: 2\n";
    mt_status_t st = eng_run_config_parse(two, strlen(two), "run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.devices.count == 2 && c.devices.ids[0] == 0 && c.devices.ids[1] == 1);
    if (st == MT_OK) eng_run_config_free(&c);
    static const char list[] = "base_model: m\ndevices: [3, 1]\n";
    st = eng_run_config_parse(list, strlen(list), "run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.devices.count == 2 && c.devices.ids[0] == 3 && c.devices.ids[1] == 1);
    if (st == MT_OK) {
        EXPECT(set_ok(&c, "devices=1") && c.devices.count == 1);
        eng_run_config_free(&c);
    }
    EXPECT_ERROR("base_model: m\ndevices: 0\n", MT_ERR_CONFIG, "devices", "device count");
    EXPECT_ERROR("base_model: m\ndevices: [0, 0]\n", MT_ERR_CONFIG, "devices", "listed twice");
    EXPECT_ERROR("base_model: m\ndevices: []\n", MT_ERR_CONFIG, "devices", "no device");
    EXPECT_ERROR("base_model: m\ndevices: [a]\n", MT_ERR_CONFIG, "devices", "ordinal");
}

/* parallel: auto (default) | data | expert; expert needs two devices, and
 * training refuses it until the executor runs it. */
static void test_parallel(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    EXPECT(c.parallel == ENG_PARALLEL_AUTO);
    static const char y[] = "base_model: m\ndevices: 2\nparallel: expert\n";
    mt_status_t st = eng_run_config_parse(y, strlen(y), "run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.parallel == ENG_PARALLEL_EXPERT);
    if (st == MT_OK) {
        EXPECT(set_ok(&c, "parallel=data") && c.parallel == ENG_PARALLEL_DATA);
        EXPECT(set_ok(&c, "parallel=auto") && c.parallel == ENG_PARALLEL_AUTO);
        eng_run_config_free(&c);
    }
    EXPECT_ERROR("base_model: m\nparallel: tensor\n", MT_ERR_CONFIG, "parallel", "expert");
    EXPECT_INVALID("parallel=expert", "parallel: expert splits each MoE layer's experts between 2 devices");
    /* two devices run it, for full fine-tuning */
    static const char two[] = "base_model: m\ndatasets: [{path: d.jsonl}]\ndevices: 2\nparallel: expert\n";
    st = eng_run_config_parse(two, strlen(two), "v.yaml", &c, &err);
    EXPECT(st == MT_OK);
    if (st == MT_OK) {
        EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
        eng_run_config_free(&c);
    }
    static const char lora[] =
        "base_model: m\ndatasets: [{path: d.jsonl}]\ndevices: 2\nparallel: expert\nadapter: lora\nlora_r: 8\n"
        "lora_alpha: 16\nlora_target_modules: [q_proj]\n";
    st = eng_run_config_parse(lora, strlen(lora), "v.yaml", &c, &err);
    EXPECT(st == MT_OK);
    if (st == MT_OK) {
        EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "parallel: expert") &&
               strstr(err.msg, "LoRA"));
        eng_run_config_free(&c);
    }
}

/* Evaluation keys: val_set_size a fraction or a count, test_datasets like
 * datasets, eval_steps and eval_batch_size; every refusal names its key. */
static void test_eval_keys(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    EXPECT(c.val_set_size.size == 0 && c.num_test_datasets == 0 && c.eval_steps == -1 && c.eval_batch_size == 0);
    static const char y[] = "base_model: m\ndatasets: [{path: d.jsonl}]\nval_set_size: 0.05\neval_steps: 10\n"
                            "eval_batch_size: 4\n";
    mt_status_t st = eng_run_config_parse(y, strlen(y), "cfgs/run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.val_set_size.size == 0.05 && !c.val_set_size.whole && c.eval_steps == 10 &&
           c.eval_batch_size == 4);
    if (st == MT_OK) {
        EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
        EXPECT(set_ok(&c, "val_set_size=100") && c.val_set_size.size == 100 && c.val_set_size.whole);
        EXPECT(set_ok(&c, "val_set_size=") && c.val_set_size.size == 0 && !c.val_set_size.whole);
        EXPECT(set_ok(&c, "eval_steps=0") && c.eval_steps == 0);
        EXPECT(set_ok(&c, "eval_steps=") && c.eval_steps == -1);
        EXPECT_SET_ERROR(&c, "val_set_size=1.0", "val_set_size", "[0, 1)");
        EXPECT_SET_ERROR(&c, "val_set_size=1.5", "val_set_size", "integer");
        EXPECT_SET_ERROR(&c, "val_set_size=-3", "val_set_size", ">= 0");
        EXPECT_SET_ERROR(&c, "val_set_size=lots", "val_set_size", "fraction");
        EXPECT_SET_ERROR(&c, "eval_steps=-1", "eval_steps", "out of range");
        EXPECT_SET_ERROR(&c, "eval_batch_size=0", "eval_batch_size", "out of range");
        eng_run_config_free(&c);
    }
    static const char t[] = "base_model: m\ndatasets: [{path: d.jsonl}]\ntest_datasets:\n  - path: e.jsonl\n"
                            "  - path: /abs/f.jsonl\n    type: completion\n";
    st = eng_run_config_parse(t, strlen(t), "cfgs/run.yaml", &c, &err);
    EXPECT(st == MT_OK && c.num_test_datasets == 2 && c.num_datasets == 1 &&
           strcmp(c.test_datasets[0].path, "cfgs/e.jsonl") == 0 && strcmp(c.test_datasets[1].path, "/abs/f.jsonl") == 0 &&
           strcmp(c.datasets[0].path, "cfgs/d.jsonl") == 0);
    if (st == MT_OK) {
        EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
        /* both ways at once: refused naming both keys */
        EXPECT(set_ok(&c, "val_set_size=0.1"));
        EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "val_set_size") &&
               strstr(err.msg, "test_datasets"));
        EXPECT(set_ok(&c, "test_datasets=") && c.num_test_datasets == 0 && c.num_datasets == 1);
        EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
        eng_run_config_free(&c);
    }
    EXPECT_ERROR("base_model: m\ntest_datasets: [{pth: e.jsonl}]\n", MT_ERR_CONFIG, "test_datasets", "path");
    EXPECT_INVALID("eval_steps=5", "eval_steps is 5, but there is no evaluation set");
}

/* axolotl's quantised-base keys: parsed and typed; true refused by validate
 * with the reason, until the executor streams a quantised base. */
static void test_quant_keys(void) {
    eng_run_config_t c;
    mt_error_t err = {0};
    eng_run_config_defaults(&c);
    EXPECT(!c.load_in_4bit && !c.load_in_8bit && c.bnb_4bit_quant_type == ENG_BNB_NF4 &&
           !c.bnb_4bit_use_double_quant);
    static const char y[] = "base_model: m\ndatasets: [{path: d.jsonl}]\nadapter: lora\nlora_target_modules: [q_proj]\n"
                            "load_in_4bit: false\nbnb_4bit_quant_type: fp4\nbnb_4bit_use_double_quant: true\n";
    mt_status_t st = eng_run_config_parse(y, strlen(y), "v.yaml", &c, &err);
    EXPECT(st == MT_OK && c.bnb_4bit_quant_type == ENG_BNB_FP4 && c.bnb_4bit_use_double_quant);
    if (st != MT_OK) return;
    EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
    EXPECT(set_ok(&c, "load_in_4bit=true"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_OK);
    EXPECT(c.num_llm_int8_skip_modules == 0);
    EXPECT(set_ok(&c, "llm_int8_skip_modules=[o_proj, mlp.experts]"));
    EXPECT(c.num_llm_int8_skip_modules == 2 && strcmp(c.llm_int8_skip_modules[1], "mlp.experts") == 0);
    EXPECT(set_ok(&c, "llm_int8_skip_modules=~") && c.num_llm_int8_skip_modules == 0);
    EXPECT(set_ok(&c, "load_in_8bit=true"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "choose one"));
    EXPECT(set_ok(&c, "load_in_4bit=false"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "load_in_8bit: true is not supported"));
    EXPECT(set_ok(&c, "load_in_8bit=false") && set_ok(&c, "adapter=~") && set_ok(&c, "load_in_4bit=true"));
    EXPECT(eng_run_config_validate(&c, &err) == MT_ERR_CONFIG && strstr(err.msg, "needs adapter: lora"));
    EXPECT_SET_ERROR(&c, "bnb_4bit_quant_type=int4", "expected one of: nf4, fp4", NULL);
    eng_run_config_free(&c);
}

int main(void) {
    test_quant_keys();
    test_eval_keys();
    test_parallel();
    test_defaults();
    test_save_expert_layout();
    test_resume_keys();
    test_devices();
    test_scheduler();
    test_staging();
    test_every_key();
    test_null_and_scalars();
    test_errors();
    test_set();
    test_validate();
    test_sizes();
    test_load();
    if (failures) fprintf(stderr, "config_test: %d failure(s)\n", failures);
    else printf("config_test: all passed\n");
    return failures != 0;
}
