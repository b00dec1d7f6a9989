/* config.json reading shared by the files of //engine/model/hf
 * (internal): the reader that names file and key in every message, the
 * typed getters with transformers' defaults (read.c), the keys every
 * family reads (common_keys.c), and the per-family parsers that live
 * outside model_config.c (model_config_families.c).  The getters sit below
 * every parser, so the dispatcher (model_config.c) calls the families and
 * no family calls back into it. */
#ifndef MT_ENGINE_MODEL_CONFIG_READ_H
#define MT_ENGINE_MODEL_CONFIG_READ_H

#include <jansson.h>
#include <stdbool.h>

#include "base/status.h"

/* eng_model_config_t by its tag: including model_config.h here would make
 * model_config.c and this header include each other */
struct eng_model_config;
typedef struct eng_model_config eng_model_config_t;

typedef struct {
    json_t *obj;
    const char *path;
    mt_error_t *err;
} eng_cfg_reader_t;

/* A step that can fail: its failing status (err set) is returned at once. */
#define RETURN_ON_ERROR(x)              \
    do {                                \
        mt_status_t st_ = (x);          \
        if (st_ != MT_OK) return st_;   \
    } while (0)

mt_status_t eng_cfg_type_error(eng_cfg_reader_t *r, const char *key, const char *want, const json_t *v);
/* required: a missing key is an error; nullable: JSON null counts as absent. */
mt_status_t eng_cfg_get_int(eng_cfg_reader_t *r, const char *key, bool required, bool nullable, int def, int *out);
mt_status_t eng_cfg_get_double(eng_cfg_reader_t *r, const char *key, double def, double *out);
mt_status_t eng_cfg_get_bool(eng_cfg_reader_t *r, const char *key, bool def, bool *out);
mt_status_t eng_cfg_positive(eng_cfg_reader_t *r, const char *key, int v);
/* The keys every family reads (sizes, heads, norms, activation, dropout; common_keys.c). */
mt_status_t eng_cfg_read_common(eng_cfg_reader_t *r, eng_model_config_t *c, int def_nkv, double def_eps,
                                int def_max_pos);
/* The routed-expert count under key_e or its alias, and the top-k. */
mt_status_t eng_cfg_read_experts(eng_cfg_reader_t *r, eng_model_config_t *c, const char *key_e, int def_e,
                                 int def_k);

/* DeepSeek-V2/V3, GLM-4.5 and gpt-oss (model_config_families.c). */
mt_status_t eng_cfg_parse_deepseek_v3(eng_cfg_reader_t *r, eng_model_config_t *c);
mt_status_t eng_cfg_parse_deepseek_v2(eng_cfg_reader_t *r, eng_model_config_t *c);
mt_status_t eng_cfg_parse_glm4_moe(eng_cfg_reader_t *r, eng_model_config_t *c);
mt_status_t eng_cfg_parse_gpt_oss(eng_cfg_reader_t *r, eng_model_config_t *c);

#endif
