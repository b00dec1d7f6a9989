/* How the run-config reader reports a problem (file:line or the --set
 * argument it came from, "did you mean" for unknown keys) and takes a string
 * value.  Below the key tables (config.c), the dataset entries
 * (config_datasets.c) and --set (config_set.c), which all report through it. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "base/yaml_doc.h"
#include "engine/config/config_rows.h"
#include "engine/config/values.h"

mt_status_t eng_cfg_fail(const pctx_t *c, const yaml_node_t *at, const char *fmt, ...) {
    char what[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (c->set_arg) return mt_error_set(c->err, MT_ERR_CONFIG, "--set '%.400s': %s", c->set_arg, what);
    if (at)
        return mt_error_set(c->err, MT_ERR_CONFIG, "%.400s:%zu: %s", c->file, (size_t)at->start_mark.line + 1,
                            what);
    return mt_error_set(c->err, MT_ERR_CONFIG, "%.400s: %s", c->file, what);
}

const key_row_t *eng_cfg_find_row(const key_row_t *rows, const char *name) {
    for (const key_row_t *r = rows; r->name; r++)
        if (strcmp(r->name, name) == 0) return r;
    return NULL;
}

mt_status_t eng_cfg_unknown_key(const pctx_t *c, const yaml_node_t *at, const key_row_t *rows,
                               const char *prefix, const char *key) {
    const key_row_t *best = NULL;
    size_t best_d = (size_t)-1;
    for (const key_row_t *r = rows; r->name; r++) {
        size_t d = mt_yaml_key_distance(key, r->name);
        if (d < best_d) best_d = d, best = r;
    }
    /* A suggestion far from what was typed is noise: above a third of the
     * key's length (at least 2 edits), list the valid keys instead. */
    size_t limit = strlen(key) / 3;
    if (limit < 2) limit = 2;
    if (best && best_d <= limit)
        return eng_cfg_fail(c, at, "unknown key '%s%.200s', did you mean '%s%s'?", prefix, key, prefix, best->name);
    char list[1024] = "";
    size_t used = 0;
    for (const key_row_t *r = rows; r->name && used < sizeof list; r++) {
        int w = snprintf(list + used, sizeof list - used, "%s%s%s", r == rows ? "" : ", ", prefix, r->name);
        if (w < 0) break;
        used += (size_t)w;
    }
    return eng_cfg_fail(c, at, "unknown key '%s%.200s'; valid keys here: %s", prefix, key, list);
}

mt_status_t eng_cfg_expected(const pctx_t *c, const yaml_node_t *n, const char *key, const char *what) {
    char got[256];
    mt_yaml_describe(n, got, sizeof got);
    return eng_cfg_fail(c, n, "%s: expected %s, got %s", key, what, got);
}

/* A scalar holding a string (any style, not null, no NUL inside) copied
 * into dst; relative paths joined to the config's folder when `path`. */
mt_status_t eng_cfg_take_string(const pctx_t *c, const yaml_node_t *n, const char *key, bool path, char *dst,
                               size_t cap) {
    if (!n || n->type != YAML_SCALAR_NODE || eng_yaml_is_null(n)) return eng_cfg_expected(c, n, key, "a string");
    const char *s = (const char *)n->data.scalar.value;
    if (strlen(s) != n->data.scalar.length) return eng_cfg_fail(c, n, "%s: the string contains a NUL byte", key);
    int w;
    if (path && s[0] != '/' && c->base_dir[0])
        w = snprintf(dst, cap, "%s/%s", c->base_dir, s);
    else
        w = snprintf(dst, cap, "%s", s);
    if (w < 0 || (size_t)w >= cap) return eng_cfg_fail(c, n, "%s: '%.200s' is longer than %zu bytes", key, s, cap - 1);
    return MT_OK;
}

