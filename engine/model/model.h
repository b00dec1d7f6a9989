/* A model: its config, description and parameters' host homes (the fp32
 * masters, a frozen base's bf16 homes, host AdamW state).  This is the
 * model's one copy in host memory, whatever number of devices run it.
 * Running it on a device is an executor's (engine/exec/exec.h), which holds the
 * model and its own copies of each parameter (engine/exec/place/types.h); several
 * executors, one per device, can hold the same model.  This header
 * includes neither (//tests:layering_test checks it).
 *
 * Parameters are indexed by the model description (engine/model/desc/model_desc.h): one
 * eng_param_t per HF tensor, so gradients, optimizer state and checkpoint
 * names line up one to one.
 *
 * Semantics follow the HF modeling code of each family (see
 * docs/models.md): RMSNorm, rotate_half RoPE, causal GQA
 * attention, the family's router, SwiGLU experts, Qwen2-MoE's gated shared
 * expert, Qwen3's per-head q/k norm, causal-LM loss with -100 ignored and
 * the load-balancing aux loss when output_router_logits is set. */
#ifndef MT_ENGINE_MODEL_H
#define MT_ENGINE_MODEL_H

#include <stdbool.h>
#include <stdint.h>

#include "engine/config/config.h"
#include "engine/data/data.h"
#include "engine/model/lora/adapter.h"
#include "engine/model/lora/targets.h"
#include "engine/model/hf/model_config.h"
#include "engine/model/desc/model_desc.h"
#include "engine/model/quant_home.h"
#include "kernels/device.h"
#include "kernels/ops.h"
#include "moe/staging.h"
#include "scheduler/plan.h"

/* One parameter tensor's home: what the model keeps of it in host memory,
 * once, however many devices run it.  A device's copies of it (working
 * copy, device master, gradient accumulators, device AdamW state) are its
 * executor's (eng_dparam_t, engine/exec/place/types.h).  Which copies exist
 * depends on the plan of the block that owns it (block 0 the embedding,
 * 1..L the layers, L+1 the final norm and lm_head):
 *   optim   DEVICE:   the fp32 master and AdamW state live on the device
 *                     (host_w is freed once placed);
 *           HOST:     master = host_w, AdamW moments host_mom.
 *
 * The working copy is what compute reads, in w_dtype: bf16 in a bf16 run
 * for every matrix that only matrix products read (all 2-D weights but the
 * embedding table, whose rows are gathered as autocast leaves them: fp32),
 * fp32 otherwise.  A bf16 working copy is made from the master by rounding
 * to nearest even: by host AdamW's bf16 output into work_bf16 (so it
 * crosses the link at half the bytes with nothing converted on the way),
 * on the host while it is staged where there is no such copy, or on the
 * device by AdamW's bf16 output. */
typedef struct {
    const eng_param_spec_t *spec;
    int block;          /* owning block */
    float *host_w;      /* host fp32 master (home), or a frozen fp32 weight's home; NULL when the master
                         * is on the device or either is on the NVMe tier (engine/optim/nvme_state.h) */
    uint16_t *home_bf16; /* instead of host_w, a frozen weight's home when its working copy is bf16:
                          * kept in the dtype compute reads (rounded once on load, as staging
                          * would round it), so a bf16 base costs its own bytes in host memory;
                          * NULL once the NVMe tier holds it */
    uint16_t *work_bf16; /* beside host_w, a trained weight's bf16 working copy in host memory when its
                          * block's AdamW runs on the host: what staging copies to the device (no
                          * conversion on the link's path) and AdamW writes as it updates the master
                          * (its fused bf16 output); every writer of the master rewrites it, so it is
                          * always the master rounded to nearest even (eng_exec_place) */
    bool work_pinned;   /* work_bf16 is in pinned host memory the executor owns (engine/exec/place/host_buffers.h):
                         * the link copies it from there, nothing is packed */
    bool home_mapped;   /* home_bf16 points into the base checkpoint's read-only mapping (a bf16
                         * tensor on disk): no copy at all, the page cache holds it */
    eng_quant_home_t *home_q; /* instead of host_w / home_bf16, a frozen matrix kept quantised
                               * (engine/model/quant_home.h): its codes and scales cross the link,
                               * the device dequantises them into the working copy; its bytes NULL
                               * (the layout kept) once the NVMe tier holds them */
    bool quant_ok;      /* frozen, and a matrix a quantised base keeps quantised (set at LoRA attach) */
    mt_dtype_t w_dtype; /* every device's working copy: MT_F32 or MT_BF16 */
    void *host_mom;     /* host AdamW moments (optimizer HOST), lazily allocated: kern_moments_bytes(
                         * mom_fmt, numel) bytes laid out as kern_moments_view says (kernels/adamw.h) */
    int mom_fmt;        /* kern_moments_fmt_t of this tensor's moments (run config optimizer_state) */
    uint64_t mom_seed;  /* its bf16 moments' stochastic-rounding seed: from the run seed and its name */
    int64_t step;       /* this tensor's AdamW step count (PyTorch keeps one per parameter) */
    bool frozen;        /* not trained by this run (a LoRA run's base): no gradient, master or AdamW state */
    int lora_a, lora_b; /* a LoRA run's factors adapting this module (indices into params), -1 = none;
                         * a routed expert's up adapter in PEFT's fused form shares its gate's lora_a */
    float lora_scale;   /* and its s in y = W x + s B A x */
} eng_param_t;

/* Indices into eng_model_t.params for one decoder layer (-1 = absent),
 * filled from the model description by each parameter's role: a field
 * here has its role's row in model.c's k_layer_field. */
typedef struct {
    int attn_norm, q, k, v, o, q_bias, k_bias, v_bias, o_bias, q_norm, k_norm, mlp_norm;
    int router, sh_gate, sh_up, sh_down, sh_expert_gate;
    int dense_gate, dense_up, dense_down;
    int q_a, q_a_norm, q_b, kv_a, kv_a_norm, kv_b; /* MLA (DeepSeek) */
    int router_bias; /* index into spec.buffers: the grouped router's e_score_correction_bias */
    int *exp_gate, *exp_up, *exp_down; /* (E) when the layer is MoE with per-expert tensors */
    /* gpt-oss: attention sinks, the router's bias, experts fused over E */
    int sinks, router_b, gate_up, gate_up_b, down, down_b;
} eng_layer_index_t;

/* A LoRA run's quantised base: load_in_4bit quantises every frozen matrix
 * eng_quant_home_role_ok accepts, but those named in skip, on load as
 * bitsandbytes' quantize_4bit does (docs/quantization.md).  Checkpoints
 * stored in FP8 keep those matrices as stored whatever this says. */
typedef struct {
    bool load_in_4bit;
    mt_quant_format_t format; /* MT_QUANT_NF4 or MT_QUANT_FP4 */
    bool double_quant;
    const char (*skip)[128];  /* llm_int8_skip_modules (not owned: the run config's) */
    int num_skip;
} eng_lora_quant_t;

/* A LoRA run's adapters: y = W x + s * B (A dropout(x)) on every
 * targeted module, A (r, in) and B (out, r) trainable parameters of the
 * model (after the base's in params[]), the base frozen (engine/model/lora_model.h).
 * r, alpha and scale are the run's defaults; a module's own rank and s
 * (an adapter file's rank_pattern / alpha_pattern) are in plan.targets and
 * its eng_param_t. */
typedef struct {
    bool on;
    int r;
    float scale;             /* alpha / r, or alpha / sqrt(r) with rsLoRA */
    double alpha;
    bool use_rslora;
    float dropout;           /* 0 = exact */
    uint64_t seed;           /* dropout masks, with the running micro-batch's serial (eng_batch_t) */
    uint64_t batch_serial;
    eng_lora_plan_t plan;    /* the targets, and the modules trained in full */
    eng_param_spec_t *specs; /* (num_specs): each target's A (none when it shares one) and B */
    int num_specs;
    eng_lora_weights_t init; /* the adapter read from init_dir, until eng_lora_init_weights copies it */
    eng_lora_quant_t quant;  /* how the frozen base is quantised on load (load_in_4bit) */
} eng_model_lora_t;

/* What a LoRA run asks of eng_exec_open (engine/model/lora_model.h). */
typedef struct {
    eng_lora_select_t select; /* which modules (engine/model/lora/targets.h) */
    int r;
    double alpha;
    bool use_rslora;
    double dropout;
    uint64_t seed;            /* initial A (without init_dir) and dropout masks */
    const char *init_dir;     /* a PEFT adapter to start from, or NULL */
    eng_lora_quant_t quant;   /* the frozen base quantised on load, or not */
} eng_lora_opts_t;

typedef struct {
    eng_model_config_t cfg;
    eng_model_desc_t spec;
    /* params[0 .. spec.count) are the description's; a LoRA run appends its
     * adapter factors after them */
    int num_params;
    eng_model_lora_t lora;
    eng_param_t *params;       /* spec.count */
    /* The description's buffers (spec.buffers, e.g. DeepSeek-V3's
     * e_score_correction_bias): fp32 host copies read with the weights,
     * never trained, saved back as read */
    float **buffer_host;       /* (spec.num_buffers) */
    eng_layer_index_t *layers; /* num_hidden_layers */
    int embed, final_norm, lm_head; /* lm_head == embed when tied */
    /* How products are formed (kernels/gemm.h): MT_F32, or MT_BF16 for
     * bf16 mixed precision (bf16 operands, fp32 accumulation; norms,
     * softmax, attention, router probabilities and the loss stay fp32). */
    mt_dtype_t compute;
    mt_dtype_t storage_dtype; /* the base checkpoint's weights on disk: MT_F32, MT_BF16 or MT_F16 */
    int num_moe_layers;
    /* The base checkpoint, kept mapped (read-only) while parameters' homes
     * point into it (eng_param_t.home_mapped) or quantised homes wait in it
     * to be placed (eng_quant_home_t.pending); NULL when none does */
    struct eng_checkpoint *mapped_base;
} eng_model_t;

/* How the model's host<->device transfers are staged (the run config's
 * staging: section; engine/exec/exec.h fills it from a run config). */
typedef struct {
    moe_staging_mode_t mode; /* default compact */
    size_t cap_bytes;        /* pinned bytes the pool may hold (staging.cap, else memory.pinned); 0 = no cap */
    int num_slabs;           /* compact: MOE_STAGING_SLABS_AUTO (default) or >= 1 */
    size_t slab_bytes;       /* compact: 0 = split the capacity */
    /* tokens per micro-batch (B * T): sizes the share of offloaded
     * activations before the first step, so bad settings fail before
     * training; 0 = sized at the first micro-batch */
    int tokens;
    size_t timeline_samples; /* pool timeline samples kept (0 = moe/staging's default, about 40 MB at most) */
} eng_staging_settings_t;

void eng_staging_settings_init(eng_staging_settings_t *s);

/* Everything eng_exec_open (engine/exec/exec.h) takes beside the device and the checkpoint. */
typedef struct {
    const char *overrides_json;            /* the run config's model_config: (JSON), or NULL */
    const sched_plan_t *plan;              /* NULL: keep everything on the device (keep_all) */
    const eng_staging_settings_t *staging; /* NULL: defaults */
    mt_dtype_t compute;                    /* MT_F32 (the default, 0) or MT_BF16 */
    const eng_lora_opts_t *lora;           /* NULL: full fine-tuning */
} eng_model_opts_t;

/* The host side of eng_exec_open (engine/exec/exec.h), in its order: the
 * config (dir/config.json with opts->overrides_json), the description, the
 * parameter table with every master's host home allocated (no weight read
 * yet, no device memory: the model knows no executor). */
mt_status_t eng_model_init(eng_model_t *m, const char *dir, const eng_model_opts_t *opts, mt_error_t *err);
/* What a family that trains cannot train yet (engine/model/trainable.c):
 * MT_ERR_UNSUPPORTED naming dir, the config key and what is missing.
 * overrides_json: the run config's model_config (merged over the file's
 * keys, as the loader did), or NULL. */
mt_status_t eng_model_check_trainable(const eng_model_config_t *cfg, const char *overrides_json, const char *dir,
                                      mt_error_t *err);
/* Reads the checkpoint in dir into the host homes (and notes the dtype it
 * stores its weights in, for eng_save_dtype).  A LoRA base kept as stored
 * in FP8 or MXFP4 is left pending in the checkpoint's mapping: the
 * executor's placement (eng_exec_place, then the NVMe tier) packs or
 * writes each such home. */
mt_status_t eng_model_read_weights(eng_model_t *m, const char *dir, mt_error_t *err);
/* Frees what eng_model_init made; every executor holding the model must be
 * gone first (eng_exec_free frees a model it opened). */
void eng_model_release(eng_model_t *m);

/* L + 2: the embedding, each decoder layer, the head. */
int eng_model_num_blocks(const eng_model_t *m);

/* The dtype the run config asks a saved model to have: save_dtype, or with
 * auto the dtype the base checkpoint stores its weights in. */
mt_dtype_t eng_save_dtype(const eng_model_t *m, const eng_run_config_t *rc);

#endif
