/* Which modules a LoRA run adapts, with PEFT's matching rules.
 *
 * A module is a parameter's HF name without ".weight" (the description's
 * names are the checkpoint's, so they are the names PEFT sees on the HF
 * model).  PEFT's rules (peft/tuners/tuners_utils.py, check_target_module_exists):
 *   - a list entry matches a module whose name equals it or ends with
 *     "." + entry ("gate_proj" hits routed, shared and dense MLPs alike);
 *   - a string target_modules is a regular expression that must match the
 *     whole name (POSIX extended syntax here; PEFT uses Python's re, which
 *     agrees on the patterns people write: alternation, classes, .*, \d is
 *     NOT available: write [0-9]);
 *   - "all-linear" selects every linear layer except the output head.
 * moetune's one departure: all-linear (and axolotl's lora_target_linear)
 * leaves out the router `gate` and Qwen2-MoE's `shared_expert_gate`, which
 * decide routing rather than transform tokens; name them to adapt them.
 *
 * An entry that matches no linear module is an error listing the model's
 * module kinds, so a Qwen name used on Mixtral ("gate_proj") says what
 * Mixtral calls it.  A rank above a target's smaller dimension is an error
 * naming the module and its shape (the update could not have that rank).
 *
 * modules_to_save entries match the same way; those parameters are trained
 * in full and saved in the adapter file under their own names. */
#ifndef MT_ENGINE_LORA_TARGETS_H
#define MT_ENGINE_LORA_TARGETS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "base/status.h"
#include "engine/model/desc/model_desc.h"

/* Where a trainable tensor sits, for the summary a run prints. */
typedef enum {
    ENG_LORA_KIND_ATTN = 0,   /* q/k/v/o_proj */
    ENG_LORA_KIND_EXPERT,     /* routed experts */
    ENG_LORA_KIND_SHARED,     /* shared expert and its gate */
    ENG_LORA_KIND_DENSE,      /* dense MLP layers (Qwen mlp_only_layers) */
    ENG_LORA_KIND_ROUTER,     /* the router gate */
    ENG_LORA_KIND_HEAD,       /* lm_head, only when named */
    ENG_LORA_KIND_SAVED,      /* modules_to_save: trained in full */
    ENG_LORA_KIND_COUNT,
} eng_lora_kind_t;

const char *eng_lora_kind_name(eng_lora_kind_t k); /* "attention", "routed experts", ... */

/* What to select: a list of names, or a regex, or all-linear. */
typedef struct {
    const char *const *modules; /* target_modules as a list (may hold "all-linear") */
    int num_modules;
    const char *regex;          /* target_modules as a string; NULL for a list */
    const char *const *params;  /* target_parameters: names as PEFT on transformers 5 sees them */
    int num_params;
    bool all_linear;            /* lora_target_linear: true */
    int r;
    const char *const *modules_to_save;
    int num_modules_to_save;
} eng_lora_select_t;

typedef struct {
    int param;                /* index into desc->params of the module's weight */
    eng_lora_kind_t kind;
    int64_t out, in;          /* the base weight's shape (out, in) */
    int r;                    /* its rank (the selection's r unless an adapter file says otherwise) */
    double alpha;             /* its lora_alpha */
    float scale;              /* s in y = W x + s B A x: alpha / r, or alpha / sqrt(r) */
    int share_a;              /* -1, or the target whose A this one uses: a routed expert's up
                               * adapter in PEFT's fused gate_up form (adapter.h) uses its gate's */
} eng_lora_target_t;

typedef struct {
    eng_lora_target_t *targets; /* (count) in description (checkpoint) order */
    int count;
    int *saved;               /* (num_saved) params trained in full */
    int num_saved;
    size_t modules[ENG_LORA_KIND_COUNT];   /* adapted (or saved) modules per kind */
    size_t trainable[ENG_LORA_KIND_COUNT]; /* trainable elements per kind: r*(in+out) per target */
    size_t total_trainable;
    size_t total_params;      /* the base model's parameters */
} eng_lora_plan_t;

/* The module path of a parameter (its name less ".weight"); false when the
 * parameter is not a weight (a bias, say). */
bool eng_lora_module_of(const eng_param_spec_t *p, char *buf, size_t cap);
/* True for the roles LoRA can wrap: the model's nn.Linear weights. */
bool eng_lora_role_is_linear(eng_param_role_t role);
eng_lora_kind_t eng_lora_role_kind(eng_param_role_t role);

/* The names PEFT on transformers 5 gives parameter p of d (false when p is
 * no linear module or the name does not fit):
 *   eng_lora_peft_param: what a target_parameters entry and a pattern key
 *     are matched against when PEFT wraps the parameter itself: a routed
 *     expert's gate or up weight is `model.layers.N.mlp.experts.gate_up_proj`,
 *     its down weight `….down_proj` (transformers 5 fuses the experts), any
 *     other weight its module's name + ".weight";
 *   eng_lora_peft_module: the module's name (Mixtral's `block_sparse_moe`
 *     is `mlp` on transformers 5). */
bool eng_lora_peft_param(const eng_model_desc_t *d, int p, char *buf, size_t cap);
bool eng_lora_peft_module(const eng_model_desc_t *d, int p, char *buf, size_t cap);
/* Whether PEFT on transformers 5 rewrites a target_modules entry with this
 * leaf into a target_parameters one (its routed experts' leaf names, w1/w2/w3
 * or gate_proj/up_proj/down_proj, and the router's `gate`): a module outside
 * the routed experts with such a leaf is reachable only by target_parameters. */
bool eng_lora_peft_rewritten_leaf(const eng_model_desc_t *d, const char *leaf);
/* PEFT's list rule: `name` equals `entry` or ends with "." + entry. */
bool eng_lora_name_matches(const char *name, const char *entry);
/* NULL when the regular expression (a target regex or a pattern key) is
 * one moetune compiles within bounded memory and time; otherwise why not.
 * POSIX regcomp expands stacked and counted repetitions into copies of the
 * tree, so `d+++…` or `(a{200}){200}` would take gigabytes: refused are a
 * quantifier on a quantifier (one lazy `?`, as Python writes `.*?`, is
 * allowed), a count above 100, more than 8 counts, and patterns over 1024
 * bytes. */
const char *eng_lora_regex_unbounded(const char *re);

/* Errors: MT_ERR_CONFIG naming the entry (no match, bad regex) or the
 * module and its shape (rank too large). */
mt_status_t eng_lora_targets_select(const eng_model_desc_t *d, const eng_lora_select_t *sel,
                                    eng_lora_plan_t *out, mt_error_t *err);
void eng_lora_plan_free(eng_lora_plan_t *p);
/* The counts again after targets changed rank or share an A (r * out only). */
void eng_lora_plan_recount(eng_lora_plan_t *p);
/* Index into p->targets of a parameter, or -1. */
int eng_lora_plan_find(const eng_lora_plan_t *p, int param);
/* A few lines: trainable parameters by kind and in all, for the run's log. */
void eng_lora_plan_summary(const eng_lora_plan_t *p, char *buf, size_t cap);

#endif
