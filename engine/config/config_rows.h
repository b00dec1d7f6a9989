/* The run config's key tables and the walk's context, shared by the file
 * reader (config.c) and the `--set` path (config_set.c); private to
 * engine/config. */
#ifndef MT_ENGINE_CONFIG_ROWS_H
#define MT_ENGINE_CONFIG_ROWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "base/status.h"

/* config.h's eng_run_config_t; named here, not included, so that this
 * header stays below both files that share it. */
struct eng_run_config;

typedef enum {
    K_INT,      /* int */
    K_U64,      /* uint64_t, non-negative */
    K_DOUBLE,   /* double; integers accepted */
    K_BOOL,     /* bool, YAML 1.1 words */
    K_BF16,     /* eng_bf16_choice_t: a YAML 1.1 boolean, or "auto" */
    K_RESUME,   /* eng_resume_t: a YAML 1.1 boolean, or a path */
    K_PATH,     /* char[], relative paths anchored at the YAML's folder */
    K_STRING,   /* char[], kept as written (names that may also be paths, e.g. hardware) */
    K_SIZE,     /* size_t from eng_parse_size */
    K_ENUM,     /* C enum from a name list */
    K_DATASETS, /* list of {path, type} */
    K_JSON,     /* mapping -> JSON object text (model_config) */
    K_STRLIST,  /* list of strings (lora_target_modules) */
    K_SECTION,  /* nested mapping with its own table */
    K_DEVICES,  /* eng_devices_t: a count, or a list of distinct ordinals */
    K_TEXT,     /* char *, owned: a long string kept as written (chat_template_jinja) */
    K_VALSET,   /* eng_val_set_t: a fraction in [0, 1), or a whole count */
} key_kind_t;

typedef struct {
    const char *name;
    int value;
} enum_name_t;

typedef struct key_row {
    const char *name;
    key_kind_t kind;
    size_t offset, size; /* the field in eng_run_config_t */
    const enum_name_t *enums;
    const struct key_row *section;
    int64_t lo, hi; /* K_INT: the accepted range, inclusive */
} key_row_t;

typedef struct {
    const char *file;    /* names the YAML in messages */
    const char *set_arg; /* the --set assignment, or NULL while reading a file */
    char base_dir[1024]; /* anchor of relative paths; "" = keep as written */
    yaml_document_t *doc;
    struct eng_run_config *cfg;
    mt_error_t *err;
} pctx_t;

/* The top-level table; a K_SECTION row leads to its section's table. */
extern const key_row_t eng_cfg_top_rows[];

/* A config error at node `at` (NULL: no line), located as file:line or as
 * the --set assignment. */
mt_status_t eng_cfg_fail(const pctx_t *c, const yaml_node_t *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
const key_row_t *eng_cfg_find_row(const key_row_t *rows, const char *name);
/* "unknown key", with the nearest valid key or the list of valid keys. */
mt_status_t eng_cfg_unknown_key(const pctx_t *c, const yaml_node_t *at, const key_row_t *rows,
                                const char *prefix, const char *key);
/* Applies node n (NULL = null, i.e. back to the default) to one row. */
mt_status_t eng_cfg_apply(pctx_t *c, const key_row_t *row, const char *key, yaml_node_t *n);

/* "KEY: expected WHAT, got ..." at node n. */
mt_status_t eng_cfg_expected(const pctx_t *c, const yaml_node_t *n, const char *key, const char *what);
/* A string scalar copied into dst (cap bytes); relative paths joined to
 * the config's folder when `path`. */
mt_status_t eng_cfg_take_string(const pctx_t *c, const yaml_node_t *n, const char *key, bool path, char *dst,
                                size_t cap);
/* One key `name` of entry `index` of the dataset list `list` (config_datasets.c). */
struct eng_dataset_entry;
mt_status_t eng_cfg_dataset_key(pctx_t *c, const char *list, const char *name, yaml_node_t *v, int index,
                                struct eng_dataset_entry *d);

#endif
