/* The run config: a YAML file (axolotl's key names where one exists) plus
 * `--set key=value` overrides.  Unknown keys and wrong types are errors
 * naming the key, the file and line, and the nearest valid key. */
#ifndef MT_ENGINE_CONFIG_H
#define MT_ENGINE_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"

#define ENG_MAX_DATASETS 16
#define ENG_MAX_LORA_TARGETS 32

typedef enum { ENG_LR_CONSTANT = 0, ENG_LR_CONSTANT_WITH_WARMUP, ENG_LR_LINEAR, ENG_LR_COSINE } eng_lr_sched_t;
typedef enum { ENG_BACKEND_AUTO = 0, ENG_BACKEND_CPU, ENG_BACKEND_CUDA } eng_backend_choice_t;
/* bf16 mixed precision: off, on, or on where the device computes bf16 products natively. */
typedef enum { ENG_BF16_OFF = 0, ENG_BF16_ON, ENG_BF16_AUTO } eng_bf16_choice_t;
/* The dtype a saved model is written in; AUTO = the base checkpoint's own. */
typedef enum { ENG_SAVE_DTYPE_AUTO = 0, ENG_SAVE_DTYPE_F32, ENG_SAVE_DTYPE_BF16, ENG_SAVE_DTYPE_F16 } eng_save_dtype_t;
/* How a saved model stores routed experts: the Hub's per-expert tensors, or
 * transformers 5's fused gate_up_proj / down_proj (engine/model/io/checkpoint.h). */
typedef enum { ENG_SAVE_LAYOUT_PER_EXPERT = 0, ENG_SAVE_LAYOUT_FUSED } eng_save_layout_t;
typedef enum { ENG_ADAPTER_NONE = 0, ENG_ADAPTER_LORA } eng_adapter_t;
/* bitsandbytes' 4-bit code (bnb_4bit_quant_type); base/quant_elem.h defines both. */
typedef enum { ENG_BNB_NF4 = 0, ENG_BNB_FP4 } eng_bnb_quant_t;
/* When checkpoint-N is written (HF's save_strategy); AUTO = steps when
 * save_steps > 0, else no. */
typedef enum {
    ENG_SAVE_STRATEGY_AUTO = 0,
    ENG_SAVE_STRATEGY_STEPS,
    ENG_SAVE_STRATEGY_EPOCH,
    ENG_SAVE_STRATEGY_NO,
} eng_save_strategy_t;
/* resume_from_checkpoint: a checkpoint directory, or `true` for the latest
 * complete checkpoint-N in output_dir; neither (false, absent) = a fresh run.
 * One struct so that a null value resets both halves together. */
typedef struct {
    bool latest;
    char path[1024]; /* "" = none; relative paths anchored at the YAML's folder */
} eng_resume_t;
/* scheduler: section (scheduler/plan.h has the semantics; engine/model/desc/program.c maps these) */
typedef enum {
    ENG_SCHED_AUTO = 0,     /* least predicted step time within the budgets */
    ENG_SCHED_KEEP_ALL,
    ENG_SCHED_OFFLOAD_ALL,
    ENG_SCHED_MIN_MEMORY,
} eng_sched_policy_t;
typedef enum { ENG_WEIGHTS_AUTO = 0, ENG_WEIGHTS_RESIDENT, ENG_WEIGHTS_STREAM } eng_weights_place_t;
typedef enum { ENG_PLACE_AUTO = 0, ENG_PLACE_DEVICE, ENG_PLACE_HOST } eng_place_t; /* grads, optimizer */
typedef enum { ENG_ACTS_AUTO = 0, ENG_ACTS_KEEP, ENG_ACTS_OFFLOAD, ENG_ACTS_RECOMPUTE } eng_acts_place_t;
/* optimizer_state: the AdamW moments' format; FP32..Q8 have
 * kern_moments_fmt_t's values plus one (kernels/adamw.h) */
enum { ENG_MOMENTS_AUTO = 0, ENG_MOMENTS_FP32, ENG_MOMENTS_BF16, ENG_MOMENTS_8BIT };
/* idle_experts: what the optimizer step does with a trainable routed expert
 * that received no token in the step: step it with a zero gradient, as
 * transformers 5's fused expert parameters get from torch's AdamW, or skip
 * it, as transformers 4's per-expert modules (grad None) did. */
typedef enum { ENG_IDLE_EXPERTS_STEP = 0, ENG_IDLE_EXPERTS_SKIP } eng_idle_experts_t;

/* staging: section; the same order as moe/staging.h's moe_staging_mode_t (engine/exec/exec.c maps them) */
typedef enum { ENG_STAGING_COMPACT = 0, ENG_STAGING_PER_TENSOR, ENG_STAGING_MAX_SLOT } eng_staging_mode_t;
/* step_order: how an optimizer step's micro-batches go through the blocks (engine/exec/exec.h) */
typedef enum { ENG_STEP_ORDER_AUTO = 0, ENG_STEP_ORDER_MICRO_BATCH, ENG_STEP_ORDER_LAYER } eng_step_order_t;
/* parallel: how a MoE layer uses two devices (scheduler/plan.h's sched_parallel_t) */
typedef enum { ENG_PARALLEL_AUTO = 0, ENG_PARALLEL_DATA, ENG_PARALLEL_EXPERT } eng_parallel_t;

/* datasets[].type: how a row becomes tokens and labels (engine/data/text.h).
 * Left out, rows are already tokenized (input_ids, labels); completion and
 * pretrain take a text field, or tokenized rows as given. */
typedef enum {
    ENG_DATA_TOKENIZED = 0,
    ENG_DATA_COMPLETION,    /* "completion" / "pretrain": field `field` (default "text") */
    ENG_DATA_CHAT_TEMPLATE, /* "chat_template": a conversation rendered by the model's chat template */
    ENG_DATA_ALPACA,        /* "alpaca": instruction, input, output */
    ENG_DATA_INPUT_OUTPUT,  /* "input_output": segments of {text, label} */
} eng_data_type_t;

/* datasets[].train_on_eos (axolotl's): which end-of-turn tokens are trained
 * in a chat: after each trained turn, every one, only after the last
 * trained turn, or none. */
typedef enum { ENG_EOS_TURN = 0, ENG_EOS_ALL, ENG_EOS_LAST, ENG_EOS_NONE } eng_train_on_eos_t;

#define ENG_MAX_TRAIN_ROLES 8
typedef struct eng_dataset_entry {
    char path[1024]; /* resolved relative to the run config's folder */
    eng_data_type_t type;
    char field[64];          /* completion: the text field; default "text" */
    char field_messages[64]; /* chat_template: the conversation field; default "messages" */
    char role_key[64];       /* message_property_mappings.role; default "role" */
    char content_key[64];    /* message_property_mappings.content; default "content" */
    char roles_to_train[ENG_MAX_TRAIN_ROLES][32]; /* default [assistant] */
    int num_roles_to_train;
    eng_train_on_eos_t train_on_eos; /* default turn */
    double weight;           /* examples taken per epoch = weight x the file's; default 1 (engine/data/data.h) */
} eng_dataset_entry_t;

/* val_set_size: a fraction of the training examples (0 < size < 1) or a
 * count (whole, written as an integer) held out for evaluation; 0 = none.
 * One struct so that a null value resets both halves together. */
typedef struct {
    double size;
    bool whole; /* written as an integer: a count of examples */
} eng_val_set_t;

#define ENG_MAX_DEVICES 8
typedef struct {
    int count;                 /* 1..ENG_MAX_DEVICES */
    int ids[ENG_MAX_DEVICES];  /* device ordinals, distinct */
} eng_devices_t;

typedef struct eng_run_config {
    /* where the config came from (for messages and relative paths) */
    char source_path[1024];

    char base_model[1024];          /* checkpoint directory */
    char base_model_init[1024];     /* HF config.json that `moetune init` creates base_model from
                                       (random weights); "" = none */
    eng_dataset_entry_t datasets[ENG_MAX_DATASETS];
    int num_datasets;
    /* evaluation (engine/run/eval.h): held out of datasets (val_set_size),
     * or other files (test_datasets), never both */
    eng_val_set_t val_set_size;     /* default none */
    eng_dataset_entry_t test_datasets[ENG_MAX_DATASETS];
    int num_test_datasets;          /* default 0 */
    int eval_steps;                 /* evaluate every N optimizer steps; default -1 = at the end of the
                                       run when there is an evaluation set; 0 = never */
    int eval_batch_size;            /* default 0 = micro_batch_size */
    int sequence_len;               /* default 512 */
    int micro_batch_size;           /* default 1 */
    int gradient_accumulation_steps;/* default 1 */
    int max_steps;                  /* 0 = from num_epochs */
    int num_epochs;                 /* default 1 */
    double learning_rate;           /* default 2e-5 */
    eng_lr_sched_t lr_scheduler;    /* default cosine (axolotl's default) */
    int warmup_steps;               /* default 0 */
    double adam_beta1, adam_beta2, adam_epsilon; /* 0.9, 0.999, 1e-8 */
    double weight_decay;            /* default 0 */
    double max_grad_norm;           /* default 1.0; 0 = no clipping */
    eng_idle_experts_t idle_experts; /* default step (transformers 5); docs/configuration.md */
    bool shuffle;                   /* default true */
    bool sample_packing;            /* default false: whole examples packed into rows (engine/data/pack.h) */
    uint64_t seed;                  /* default 42 */
    char output_dir[1024];          /* default "./outputs/run" */
    int logging_steps;              /* default 1 */
    int save_steps;                 /* 0 = only at the end */
    bool save_final;                /* default true */
    eng_save_strategy_t save_strategy; /* default auto: steps when save_steps > 0 */
    int save_total_limit;           /* complete checkpoint-N kept; default 0 = all */
    eng_resume_t resume_from_checkpoint; /* default none */
    /* steps whose loss or gradient norm is not finite that are skipped (no
       update, counted, logged) before the run stops; default 0 */
    int skip_nonfinite_steps;
    /* default false: checkpoint tensors config.json does not explain (an
       expert past num_local_experts) are an error; true makes them a note */
    bool allow_unused_tensors;
    eng_bf16_choice_t bf16;         /* default off: fp32 everywhere */
    eng_save_dtype_t save_dtype;    /* default auto: the base checkpoint's dtype */
    eng_save_layout_t save_expert_layout; /* default per_expert (the Hub's layout) */
    eng_backend_choice_t backend;   /* default auto */
    /* `devices: N` or `devices: [0, 1]`: data parallel over N devices of
     * this process sharing one host copy (engine/parallel/devices.h); default 1,
     * ids 0..N-1 (CUDA ordinals; the CPU backend opens N CPU devices) */
    eng_devices_t devices;
    char *model_config_json;        /* `model_config:` overrides as a JSON object text, or NULL */
    size_t save_max_shard_bytes;    /* default 5 GB, as HF's max_shard_size */
    /* memory budgets (0 = unlimited / backend default), sizes like "80GiB" */
    size_t memory_device, memory_pinned, memory_host;
    /* `memory: {nvme: {path, budget}}`: a directory on a fast disk that holds
     * the host AdamW state instead of host memory (docs/nvme.md); "" = none.
     * budget 0: the filesystem's free space is the only limit */
    char memory_nvme_path[1024];
    size_t memory_nvme_budget;
    /* CPU backend link throttling for measurement (0 = off) */
    double link_gbps, link_latency_us;
    /* CPU backend: kernel threads, 0 = every core; N > 0 also pins compute
     * to N cores and copies and the host optimizer to the rest, as a GPU
     * computes apart from its copy engines (kern_device_opts_t.pin_threads) */
    int compute_threads;
    /* `hardware: NAME|FILE`: the profile plans are made for (configs/hw/NAME.yaml, a file, or
       "calibrate"); "" = none: training calibrates on the CPU backend, `moetune plan` needs --hw */
    char hardware[1024];
    /* text datasets (engine/data/text.h): where tokenizer.json and the chat
     * template come from (default: base_model), which template renders
     * conversations, and whether prompts are trained too */
    char tokenizer_config[1024];    /* "" = base_model */
    char chat_template[64];         /* "tokenizer_default" (default), a named template, or "jinja" */
    char *chat_template_jinja;      /* chat_template: jinja: the template's text, or NULL */
    bool train_on_inputs;           /* default false: only responses (and trained turns) are labels */
    char dataset_prepared_path[1024]; /* "" = none: where tokenized examples are cached (engine/data/prepared.h) */
    /* `scheduler:` section */
    /* axolotl's optimizer name: every accepted spelling is PyTorch AdamW
     * (moetune's only optimizer); others are refused with the valid list.
     * 1: a bitsandbytes 8-bit AdamW name (adamw_bnb_8bit, adamw_8bit,
     * paged_adamw_8bit): AdamW with 8-bit moments (optimizer_state) */
    int optimizer;                          /* default adamw_torch (0) */
    /* optimizer_state: how AdamW keeps its moments m and v (the master
     * stays fp32): ENG_MOMENTS_* (eng_config_moments resolves auto) */
    int optimizer_state;                    /* default auto: fp32, or 8bit with an 8-bit optimizer name */
    /* axolotl's gradient_checkpointing: true asks for recomputed activations
     * where the scheduler's activations choice is auto */
    bool gradient_checkpointing;            /* default false */
    eng_sched_policy_t sched_policy;        /* default auto */
    int sched_prefetch_window;              /* default 0 = the planner decides */
    eng_weights_place_t sched_weights;      /* default auto */
    eng_place_t sched_grads;                /* default auto */
    eng_place_t sched_optimizer;            /* default auto */
    eng_acts_place_t sched_activations;     /* default auto */
    /* layer-major order: where the micro-batches' block inputs wait between a
     * layer's forward and backward (keep or offload; recompute is not offered) */
    eng_acts_place_t sched_block_inputs;    /* default auto */
    bool sched_speculative;           /* scheduler.speculative_optimizer: host AdamW overlaps the backward
                                       * under clipping too, undone when the norm clips (default false) */
    /* `staging:` section: the pinned pool host<->device transfers go through (moe/staging.h).
       The pool's size comes from the plan's in-flight window; these only choose and bound it. */
    eng_staging_mode_t staging_mode;        /* default compact */
    size_t staging_cap;                     /* pinned bytes the pool may hold; 0 = memory.pinned */
    int staging_num_slabs;                  /* compact: default -1 = automatic (0 is refused) */
    size_t staging_slab_size;               /* compact: bytes per slab; 0 = split the capacity */
    bool progress;                  /* default true: live bar on a terminal */
    bool trace;                     /* default false: write output_dir/trace.json (Chrome trace) */
    eng_step_order_t step_order;    /* default auto: layer-major where it saves link traffic */
    /* with devices: 2, each MoE layer data parallel (experts replicated) or
     * expert parallel (experts split, routed tokens exchanged); default auto:
     * the planner's choice per layer; expert needs two devices and MoE layers */
    eng_parallel_t parallel;
    /* axolotl's LoRA keys; stored here, used when adapter == ENG_ADAPTER_LORA */
    eng_adapter_t adapter;          /* default none = full fine-tuning; `adapter: lora` */
    int lora_r;                     /* default 8 (peft's LoraConfig) */
    double lora_alpha;              /* default 8 (peft's LoraConfig); scale = alpha / r */
    double lora_dropout;            /* default 0 */
    char lora_target_modules[ENG_MAX_LORA_TARGETS][128]; /* module names, e.g. "q_proj" */
    int num_lora_target_modules;
    /* lora_target_modules given as one string: PEFT's form, a regular
     * expression matched against the whole module name, or "all-linear" */
    char lora_target_regex[512];
    bool lora_target_linear;        /* every linear layer but the router and lm_head (axolotl) */
    bool use_rslora;                /* scale = alpha / sqrt(r) (PEFT's use_rslora) */
    char lora_modules_to_save[ENG_MAX_LORA_TARGETS][128]; /* trained in full, e.g. "embed_tokens" */
    int num_lora_modules_to_save;
    char lora_model_dir[1024];      /* start from this PEFT adapter (adapter_config.json + weights) */
    bool merge_lora;                /* also write the merged full model to output_dir/merged */
    /* axolotl's quantised-base keys (docs/quantization.md): load_in_4bit
     * quantises a LoRA run's frozen base on load; load_in_8bit true is refused */
    bool load_in_4bit;
    bool load_in_8bit;
    eng_bnb_quant_t bnb_4bit_quant_type; /* default nf4 */
    bool bnb_4bit_use_double_quant;
    char llm_int8_skip_modules[ENG_MAX_LORA_TARGETS][128]; /* modules kept unquantised, e.g. "self_attn" */
    int num_llm_int8_skip_modules;
} eng_run_config_t;

/* The moments' format a config asks for, as a kern_moments_fmt_t value:
 * 0 fp32, 1 bf16, 2 8-bit. */
int eng_config_moments(const eng_run_config_t *cfg);

/* Sets every field to its default. */
void eng_run_config_defaults(eng_run_config_t *cfg);
/* Parses YAML text into *cfg, starting from the defaults (previous contents
 * are overwritten, not freed); `path` names it in messages and anchors
 * relative paths (NULL: "<run config>", paths kept as written).  A null
 * value (`key:` / `key: ~`) leaves a key at its default.  On error *cfg is
 * left so that eng_run_config_free is safe. */
mt_status_t eng_run_config_parse(const char *yaml_text, size_t len, const char *path,
                                 eng_run_config_t *cfg, mt_error_t *err);
mt_status_t eng_run_config_load(const char *path, eng_run_config_t *cfg, mt_error_t *err);
/* Applies one `key=value` override (value parsed as a YAML scalar or flow
 * node, e.g. `model_config={output_router_logits: true}`).  Dotted keys
 * reach into sections (`memory.device=8GiB`) and into model_config
 * (`model_config.router_aux_loss_coef=0.02` sets one key, keeping the
 * rest).  Relative paths stay relative to the working directory. */
mt_status_t eng_run_config_set(eng_run_config_t *cfg, const char *assignment, mt_error_t *err);
/* Checks cross-field constraints (a dataset given, sizes positive, ...). */
mt_status_t eng_run_config_validate(const eng_run_config_t *cfg, mt_error_t *err);
void eng_run_config_free(eng_run_config_t *cfg);
/* A copy that owns its own strings (model_config, chat_template_jinja);
 * free it with eng_run_config_free. */
void eng_run_config_copy(eng_run_config_t *dst, const eng_run_config_t *src);
/* A dataset entry's defaults (axolotl's): field text, field_messages
 * messages, role and content keys, roles_to_train [assistant],
 * train_on_eos turn. */
void eng_dataset_entry_defaults(eng_dataset_entry_t *d);

/* The learning rate for optimizer step `step` (0-based) of `total` steps:
 * learning_rate times the multiplier transformers' get_scheduler gives
 * (LambdaLR's lambda(step)), i.e. the actual lr, not the multiplier. */
double eng_lr_at(const eng_run_config_t *cfg, int step, int total);

/* "80GiB", "512MB", "1.5GB", "1e9", "4096" -> bytes.  KB/MB/GB/TB are
 * decimal, KiB/MiB/GiB/TiB binary (units case-insensitive, "5Gb" refused as
 * ambiguous); fractions round to the nearest byte. */
mt_status_t eng_parse_size(const char *text, size_t *out, mt_error_t *err);

#endif
