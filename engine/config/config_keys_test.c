/* Run config: each section's keys (scheduler, staging, expert layout,
 * resume, devices, parallel, evaluation, quantized bases) parsed, set,
 * validated and refused with messages naming them. */
#include "engine/config/config.h"
#include "engine/config/config_testutil.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    test_save_expert_layout();
    test_resume_keys();
    test_devices();
    test_scheduler();
    test_staging();
    if (failures) fprintf(stderr, "config_keys_test: %d failure(s)\n", failures);
    else printf("config_keys_test: all passed\n");
    return failures != 0;
}
