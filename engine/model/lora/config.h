/* adapter_config.json: a PEFT LoRA adapter's settings.
 *
 * What moetune reads, each as PEFT 0.21 means it:
 *   r, lora_alpha, use_rslora   the default rank and scale
 *                               (s = alpha / r, or alpha / sqrt(r));
 *   rank_pattern, alpha_pattern per-module rank and alpha: the first key,
 *                               in the file's order, for which the regular
 *                               expression `(.*\.)?(KEY)$` matches a name
 *                               from its start (peft.utils.other
 *                               .get_pattern_key); the keys are POSIX
 *                               extended expressions here, so Python's \d,
 *                               \w, \s are refused by name (write [0-9]);
 *   target_modules              names (a list: equal, or ending in "." +
 *                               entry), a regex, or all-linear;
 *   target_parameters           parameters PEFT wraps directly (transformers
 *                               5's fused experts, `mlp.experts.gate_up_proj`,
 *                               or a 2-D `….weight`): an entry matches a
 *                               parameter name equal to it or ending in "." +
 *                               entry;
 *   modules_to_save, lora_dropout.
 * The name a pattern is matched against, and the rewrite PEFT applies to
 * gate/up targets on transformers 5, are adapter.h's.  An option that would
 * change y = W x + s B A x in a way moetune does not compute (DoRA, an
 * adapter bias, fan_in_fan_out, layers_to_transform, PiSSA-style inits) is
 * refused with the file and the key. */
#ifndef MT_ENGINE_LORA_CONFIG_H
#define MT_ENGINE_LORA_CONFIG_H

#include <stdbool.h>

#include "base/status.h"
#include "engine/model/lora/targets.h"

/* One rank_pattern or alpha_pattern entry. */
typedef struct {
    char *key;    /* PEFT's pattern key, as written */
    double value; /* a rank (an integer) or an alpha */
} eng_lora_pattern_t;

typedef struct {
    char *base_model_name_or_path; /* may be NULL */
    int r;
    double lora_alpha;
    double lora_dropout;
    bool use_rslora;
    char **target_modules;       /* list form (num_target_modules); NULL when a regex */
    int num_target_modules;
    char *target_regex;          /* string form, or NULL */
    char **target_parameters;    /* parameters PEFT wraps directly (transformers 5's fused experts) */
    int num_target_parameters;
    char **modules_to_save;
    int num_modules_to_save;
    eng_lora_pattern_t *rank_pattern; /* in the file's order: the first match wins */
    int num_rank_pattern;
    eng_lora_pattern_t *alpha_pattern;
    int num_alpha_pattern;
} eng_lora_config_t;

/* The selection an adapter_config.json describes (pointers into c; valid
 * while c lives).  A string target_modules is a regex, or all-linear. */
void eng_lora_config_select(const eng_lora_config_t *c, eng_lora_select_t *out);

/* s in y = W x + s · B A x for the config's default r and lora_alpha, and
 * for a given rank and alpha under its use_rslora. */
double eng_lora_scale(const eng_lora_config_t *c);
double eng_lora_scale_of(const eng_lora_config_t *c, int r, double alpha);

/* The rank and alpha PEFT gives the module or wrapped parameter `name`
 * (PEFT's get_pattern_key over rank_pattern and alpha_pattern; r and
 * lora_alpha where no key matches); *rank_key (when not NULL) gets the
 * rank_pattern key that decided the rank, or NULL for r.  `gate_up_rewrite`: name is a fused
 * gate_up_proj that PEFT on transformers 5 reached by rewriting gate and up
 * targets (eng_lora_config_names both), which adds the keys
 * `.*\.gate_up_proj`: 2 r and 2 lora_alpha after the file's own (or in
 * place of one spelled the same way). */
void eng_lora_config_lookup(const eng_lora_config_t *c, const char *name, bool gate_up_rewrite, int *r,
                            double *alpha, const char **rank_key);

/* Whether target_modules names the leaf `leaf` as PEFT on transformers 5
 * resolves it: a list entry equal to it or ending in "." + leaf,
 * all-linear, or a regex that matches one of the `probes` (whole names, as
 * PEFT probes `model.layers.N.mlp.experts.gate_proj` for a regex). */
bool eng_lora_config_names(const eng_lora_config_t *c, const char *leaf, const char *const *probes, int num_probes);

/* Errors: MT_ERR_IO, MT_ERR_FORMAT (not JSON, a key of the wrong type),
 * MT_ERR_UNSUPPORTED (an option moetune does not compute, a pattern key
 * in Python-only syntax), each naming the file and the key. */
mt_status_t eng_lora_config_read(const char *path, eng_lora_config_t *out, mt_error_t *err);
/* Writes the keys PEFT reads (patterns and target_parameters when set),
 * the patterns in the order given. */
mt_status_t eng_lora_config_write(const char *path, const eng_lora_config_t *c, mt_error_t *err);
void eng_lora_config_free(eng_lora_config_t *c);
/* Appends a pattern entry (key copied) to rank_pattern (rank true) or
 * alpha_pattern. */
void eng_lora_config_add_pattern(eng_lora_config_t *c, bool rank, const char *key, double value);

#endif
