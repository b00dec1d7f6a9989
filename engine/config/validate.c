/* Cross-field checks of the run config (see config.h): what a single key's
 * type cannot say (a dataset given, sizes positive, scheduler combinations
 * the executor cannot run).  Split from config.c, which parses. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "engine/config/config.h"

/* A failed check: the run config's name (src), then the message; both
 * functions below have src and err in scope. */
#define NEED(cond, ...)                                                                     \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            char what_[1024];                                                               \
            snprintf(what_, sizeof what_, __VA_ARGS__);                                     \
            return mt_error_set(err, MT_ERR_CONFIG, "%.900s: %s", src, what_);              \
        }                                                                                   \
    } while (0)

/* The evaluation keys (engine/run/eval.h): one set, from one place. */
/* axolotl's quantised-base keys: the combinations, and what is not built. */
static mt_status_t validate_quant(const eng_run_config_t *cfg, const char *src, mt_error_t *err) {
    NEED(!(cfg->load_in_4bit && cfg->load_in_8bit), "load_in_4bit and load_in_8bit are both true; choose one");
    NEED(!cfg->load_in_8bit,
         "load_in_8bit: true is not supported: bitsandbytes' 8-bit linear layers split outlier columns out of "
         "every product, which moetune's products do not do; train on the unquantised base");
    NEED(!cfg->load_in_4bit || cfg->adapter == ENG_ADAPTER_LORA,
         "load_in_4bit quantises the frozen base of an adapter run: it needs adapter: lora (full fine-tuning "
         "trains fp32 masters, which a 4-bit base cannot be)");
    return MT_OK;
}

static mt_status_t validate_eval(const eng_run_config_t *cfg, const char *src, mt_error_t *err) {
    for (int i = 0; i < cfg->num_test_datasets; i++)
        NEED(cfg->test_datasets[i].path[0], "test_datasets[%d].path is empty", i);
    NEED(!(cfg->val_set_size.size > 0 && cfg->num_test_datasets > 0),
         "val_set_size and test_datasets are both set; use one: val_set_size holds out part of datasets for "
         "evaluation, test_datasets evaluates on files of their own");
    const bool eval_set = cfg->val_set_size.size > 0 || cfg->num_test_datasets > 0;
    NEED(eval_set || cfg->eval_steps <= 0,
         "eval_steps is %d, but there is no evaluation set; set val_set_size or test_datasets (or eval_steps: 0)",
         cfg->eval_steps);
    NEED(cfg->eval_steps >= -1, "eval_steps must be >= 0 (0 = never), got %d", cfg->eval_steps);
    NEED(cfg->eval_batch_size >= 0, "eval_batch_size must be >= 1, got %d", cfg->eval_batch_size);
    NEED((int64_t)cfg->eval_batch_size * cfg->sequence_len <= ((int64_t)1 << 26),
         "eval_batch_size x sequence_len = %lld tokens per evaluation batch; at most 67,108,864 fit the executor's "
         "indexing; lower eval_batch_size",
         (long long)cfg->eval_batch_size * cfg->sequence_len);
    NEED(!eval_set || cfg->parallel != ENG_PARALLEL_EXPERT,
         "evaluation (val_set_size or test_datasets) does not run with parallel: expert (each device holds half of "
         "the experts); use parallel: auto or data");
    return MT_OK;
}

mt_status_t eng_run_config_validate(const eng_run_config_t *cfg, mt_error_t *err) {
    const char *src = cfg->source_path[0] ? cfg->source_path : "run config";
    NEED(cfg->base_model[0], "base_model is not set (the checkpoint directory)");
    NEED(cfg->num_datasets >= 1, "datasets is empty; give at least one {path: FILE}");
    for (int i = 0; i < cfg->num_datasets; i++) NEED(cfg->datasets[i].path[0], "datasets[%d].path is empty", i);
    const bool jinja = strcmp(cfg->chat_template, "jinja") == 0;
    NEED(!jinja || (cfg->chat_template_jinja && cfg->chat_template_jinja[0]),
         "chat_template: jinja needs the template's text in chat_template_jinja");
    NEED(jinja || !cfg->chat_template_jinja,
         "chat_template_jinja is given but chat_template is '%s'; set chat_template: jinja to use it",
         cfg->chat_template);
    /* an llm.c stream has no example boundaries to pack by, and its rows are full already */
    for (int i = 0; i < cfg->num_datasets && cfg->sample_packing; i++) {
        const char *p = cfg->datasets[i].path;
        const size_t n = strlen(p);
        NEED(n < 4 || strcmp(p + n - 4, ".bin") != 0,
             "sample_packing: true needs example boundaries, and datasets[%d] (%s) is an llm.c .bin token "
             "stream (one stream cut into full rows); set sample_packing: false or give tokenized .jsonl",
             i, p);
    }
    mt_status_t st = validate_eval(cfg, src, err);
    if (st != MT_OK) return st;
    NEED(cfg->output_dir[0], "output_dir is empty");
    NEED(cfg->sequence_len >= 1, "sequence_len must be >= 1, got %d", cfg->sequence_len);
    NEED(cfg->micro_batch_size >= 1, "micro_batch_size must be >= 1, got %d", cfg->micro_batch_size);
    NEED(cfg->gradient_accumulation_steps >= 1, "gradient_accumulation_steps must be >= 1, got %d",
         cfg->gradient_accumulation_steps);
    /* Each key has its own range (config.c); their product is what the
     * executor indexes: a micro-batch's routed slots (tokens x experts per
     * token, up to 32) are counted in int, so tokens stay below 2^26. */
    NEED((int64_t)cfg->micro_batch_size * cfg->sequence_len <= ((int64_t)1 << 26),
         "micro_batch_size x sequence_len = %lld tokens per micro-batch; at most %lld (67,108,864) fit the "
         "executor's indexing; lower one of them and raise gradient_accumulation_steps",
         (long long)cfg->micro_batch_size * cfg->sequence_len, (long long)1 << 26);
    NEED(cfg->max_steps >= 0, "max_steps must be >= 0, got %d", cfg->max_steps);
    NEED(cfg->num_epochs >= 0, "num_epochs must be >= 0, got %d", cfg->num_epochs);
    NEED(cfg->max_steps > 0 || cfg->num_epochs > 0, "one of max_steps or num_epochs must be > 0");
    NEED(isfinite(cfg->learning_rate) && cfg->learning_rate >= 0, "learning_rate must be >= 0, got %g",
         cfg->learning_rate);
    /* AdamW moves each weight by up to about learning_rate per step
     * whatever the gradient's size: above 1 it overwrites the weights
     * (torch accepts it; it never trains) */
    NEED(cfg->learning_rate <= 1,
         "learning_rate: %g is above 1; AdamW moves every weight by up to learning_rate each step, so the "
         "weights would be replaced by noise or overflow to Inf (typical: 1e-5 to 1e-3)",
         cfg->learning_rate);
    NEED(cfg->warmup_steps >= 0, "warmup_steps must be >= 0, got %d", cfg->warmup_steps);
    /* torch.optim.AdamW's own checks: 0 <= beta < 1, eps >= 0, wd >= 0;
     * eps 0 too, which torch accepts, is refused: an element whose moments
     * are both 0 (a row of an embedding no token used) updates by 0/0 = NaN */
    NEED(cfg->adam_beta1 >= 0 && cfg->adam_beta1 < 1, "adam_beta1 must be in [0, 1), got %g", cfg->adam_beta1);
    NEED(cfg->adam_beta2 >= 0 && cfg->adam_beta2 < 1, "adam_beta2 must be in [0, 1), got %g", cfg->adam_beta2);
    NEED(isfinite(cfg->adam_epsilon) && cfg->adam_epsilon > 0,
         "adam_epsilon: %g; expected a positive number (e.g. 1e-8): with 0, the weights no batch touched "
         "(unused embedding rows) become NaN at the first step (0/0)",
         cfg->adam_epsilon);
    NEED(isfinite(cfg->weight_decay) && cfg->weight_decay >= 0, "weight_decay must be >= 0, got %g",
         cfg->weight_decay);
    NEED(isfinite(cfg->max_grad_norm) && cfg->max_grad_norm >= 0, "max_grad_norm must be >= 0 (0 = off), got %g",
         cfg->max_grad_norm);
    NEED(cfg->logging_steps >= 1, "logging_steps must be >= 1, got %d", cfg->logging_steps);
    NEED(cfg->save_steps >= 0, "save_steps must be >= 0 (0 = only at the end), got %d", cfg->save_steps);
    NEED(!(cfg->save_strategy == ENG_SAVE_STRATEGY_STEPS && cfg->save_steps <= 0),
         "save_strategy: steps needs save_steps > 0 (how many optimizer steps between checkpoints)");
    NEED(cfg->save_total_limit >= 0, "save_total_limit must be >= 0 (0 = keep all), got %d", cfg->save_total_limit);
    NEED(cfg->skip_nonfinite_steps >= 0, "skip_nonfinite_steps must be >= 0, got %d", cfg->skip_nonfinite_steps);
    NEED(cfg->save_max_shard_bytes > 0, "save_max_shard_size must be > 0");
    NEED(isfinite(cfg->link_gbps) && cfg->link_gbps >= 0, "backend_options.link_gbps must be >= 0, got %g",
         cfg->link_gbps);
    NEED(cfg->compute_threads >= 0, "backend_options.compute_threads must be >= 0 (0 = every core), got %d",
         cfg->compute_threads);
    NEED(isfinite(cfg->link_latency_us) && cfg->link_latency_us >= 0,
         "backend_options.link_latency_us must be >= 0, got %g", cfg->link_latency_us);
    NEED(cfg->sched_prefetch_window >= 0 && cfg->sched_prefetch_window <= 64,
         "scheduler.prefetch_window must be 0 (the planner decides) to 64, got %d", cfg->sched_prefetch_window);
    NEED(!(cfg->sched_grads == ENG_PLACE_HOST && cfg->sched_optimizer == ENG_PLACE_DEVICE),
         "scheduler: grads: host with optimizer: device is not a valid combination (the device optimizer reads "
         "device gradients); use grads: device or optimizer: host");
    NEED(!(cfg->optimizer == 1 && (cfg->optimizer_state == ENG_MOMENTS_FP32 || cfg->optimizer_state == ENG_MOMENTS_BF16)),
         "optimizer: an 8-bit AdamW name (adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit) with optimizer_state: %s "
         "contradict each other; use optimizer_state: 8bit (or leave it out), or optimizer: adamw_torch",
         cfg->optimizer_state == ENG_MOMENTS_FP32 ? "fp32" : "bf16");
    NEED(!(cfg->sched_weights == ENG_WEIGHTS_STREAM && cfg->sched_optimizer == ENG_PLACE_DEVICE),
         "scheduler: weights: stream with optimizer: device is not a valid combination (the device optimizer "
         "updates resident weights in place); use weights: resident or optimizer: host");
    if (cfg->adapter == ENG_ADAPTER_LORA) {
        NEED(cfg->lora_r >= 1, "lora_r must be >= 1, got %d", cfg->lora_r);
        NEED(isfinite(cfg->lora_alpha) && cfg->lora_alpha > 0, "lora_alpha must be > 0, got %g", cfg->lora_alpha);
        NEED(cfg->lora_dropout >= 0 && cfg->lora_dropout < 1, "lora_dropout must be in [0, 1), got %g",
             cfg->lora_dropout);
        NEED(cfg->num_lora_target_modules >= 1 || cfg->lora_target_regex[0] || cfg->lora_target_linear ||
                 cfg->lora_model_dir[0],
             "adapter: lora needs lora_target_modules (e.g. [q_proj, v_proj]), lora_target_linear: true, or "
             "lora_model_dir (an adapter whose targets to continue)");
    } else {
        NEED(!cfg->lora_model_dir[0] && !cfg->merge_lora && !cfg->lora_target_linear &&
                 cfg->num_lora_modules_to_save == 0,
             "lora_model_dir, merge_lora, lora_target_linear and lora_modules_to_save need adapter: lora");
    }
    if ((st = validate_quant(cfg, src, err)) != MT_OK) return st;
    NEED(cfg->parallel != ENG_PARALLEL_EXPERT || cfg->devices.count == 2,
         "parallel: expert splits each MoE layer's experts between 2 devices; devices: is %d (set devices: 2, or "
         "parallel: auto|data)",
         cfg->devices.count);
    NEED(cfg->parallel != ENG_PARALLEL_EXPERT || cfg->adapter != ENG_ADAPTER_LORA,
         "parallel: expert trains full fine-tuning only (a LoRA run's adapters are not split between devices); use "
         "parallel: auto or data with adapter: lora");
    if (cfg->model_config_json) {
        json_error_t je;
        json_t *j = json_loads(cfg->model_config_json, 0, &je);
        bool ok = j && json_is_object(j);
        json_decref(j);
        NEED(ok, "model_config is not a JSON object");
    }
#undef NEED
    return MT_OK;
}

int eng_config_moments(const eng_run_config_t *cfg) {
    if (cfg->optimizer_state == ENG_MOMENTS_AUTO) return cfg->optimizer == 1 ? ENG_MOMENTS_8BIT - 1 : 0;
    return cfg->optimizer_state - 1;
}
