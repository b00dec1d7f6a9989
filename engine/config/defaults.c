/* Every run-config key's default, in one place: what a YAML that omits a
 * key (or sets it to null) gets.  axolotl's defaults where it has the key,
 * PEFT's for LoRA's (engine/config/config.h documents each field). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/config/config.h"

void eng_run_config_defaults(eng_run_config_t *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->sequence_len = 512;
    cfg->eval_steps = -1;
    cfg->micro_batch_size = 1;
    cfg->gradient_accumulation_steps = 1;
    cfg->devices.count = 1;
    for (int i = 0; i < ENG_MAX_DEVICES; i++) cfg->devices.ids[i] = i;
    cfg->max_steps = 0;
    cfg->num_epochs = 1;
    cfg->learning_rate = 2e-5;
    cfg->lr_scheduler = ENG_LR_COSINE;
    cfg->warmup_steps = 0;
    cfg->adam_beta1 = 0.9;
    cfg->adam_beta2 = 0.999;
    cfg->adam_epsilon = 1e-8;
    cfg->weight_decay = 0.0;
    cfg->max_grad_norm = 1.0;
    cfg->idle_experts = ENG_IDLE_EXPERTS_STEP;
    cfg->shuffle = true;
    cfg->seed = 42;
    snprintf(cfg->output_dir, sizeof cfg->output_dir, "%s", "./outputs/run");
    cfg->logging_steps = 1;
    cfg->save_steps = 0;
    cfg->save_final = true;
    cfg->bf16 = ENG_BF16_OFF;
    cfg->save_dtype = ENG_SAVE_DTYPE_AUTO;
    cfg->backend = ENG_BACKEND_AUTO;
    cfg->model_config_json = NULL;
    cfg->save_max_shard_bytes = (size_t)5000000000ull; /* HF's max_shard_size="5GB" */
    cfg->progress = true;
    cfg->staging_mode = ENG_STAGING_COMPACT;
    snprintf(cfg->chat_template, sizeof cfg->chat_template, "%s", "tokenizer_default");
    cfg->staging_num_slabs = -1; /* automatic: one slab per 4 GiB of capacity */
    cfg->adapter = ENG_ADAPTER_NONE;
    cfg->lora_r = 8;
    cfg->lora_alpha = 8.0;
    cfg->lora_dropout = 0.0;
}

void eng_dataset_entry_defaults(eng_dataset_entry_t *d) {
    memset(d, 0, sizeof *d);
    snprintf(d->field, sizeof d->field, "text");
    snprintf(d->field_messages, sizeof d->field_messages, "messages");
    snprintf(d->role_key, sizeof d->role_key, "role");
    snprintf(d->content_key, sizeof d->content_key, "content");
    snprintf(d->roles_to_train[0], sizeof d->roles_to_train[0], "assistant");
    d->num_roles_to_train = 1;
    d->train_on_eos = ENG_EOS_TURN;
    d->weight = 1.0;
}

void eng_run_config_copy(eng_run_config_t *dst, const eng_run_config_t *src) {
    *dst = *src;
    char **owned[] = {&dst->model_config_json, &dst->chat_template_jinja};
    for (size_t i = 0; i < sizeof owned / sizeof *owned; i++)
        if (*owned[i]) {
            *owned[i] = strdup(*owned[i]);
            MT_CHECK_ALLOC(*owned[i], "run config text");
        }
}

void eng_run_config_free(eng_run_config_t *cfg) {
    if (!cfg) return;
    free(cfg->model_config_json);
    cfg->model_config_json = NULL;
    free(cfg->chat_template_jinja);
    cfg->chat_template_jinja = NULL;
}
