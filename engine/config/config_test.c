/* Run config: defaults, every key, relative paths, error messages (unknown
 * key with suggestion and line, wrong types, bad enums, malformed YAML),
 * --set overrides (dotted keys, model_config), validation and sizes; each
 * section's own keys are in config_keys_test.c. */
#include "engine/config/config.h"
#include "engine/config/config_testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
int main(void) {
    test_defaults();
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
