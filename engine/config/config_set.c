/* `--set key=value`: the value parsed as a one-node YAML document and
 * applied to the row found by walking the dotted key through the same
 * tables as the file reader (config.c), so types are checked the same way;
 * `model_config.a.b=v` edits one key of the model_config JSON object. */
#include <ctype.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/yaml_doc.h"
#include "engine/config/config.h"
#include "engine/config/config_rows.h"
#include "engine/config/values.h"

/* `model_config.a.b=v`: sets one key of the model_config object, creating
 * intermediate objects, keeping every other key. */
static mt_status_t set_json_path(pctx_t *c, const char *path, yaml_node_t *n) {
    eng_run_config_t *cfg = c->cfg;
    json_t *root;
    if (cfg->model_config_json) {
        json_error_t je;
        root = json_loads(cfg->model_config_json, 0, &je);
        if (!root || !json_is_object(root)) {
            json_decref(root);
            return eng_cfg_fail(c, n, "model_config: the current value is not a JSON object");
        }
    } else {
        root = json_object();
        MT_CHECK_ALLOC(root, "model_config object");
    }
    char msg[512];
    const yaml_node_t *bad = NULL;
    json_t *value = n ? eng_yaml_to_json(c->doc, n, msg, sizeof msg, &bad) : json_null();
    if (!value) {
        json_decref(root);
        return eng_cfg_fail(c, bad, "model_config.%s: %s", path, msg);
    }
    json_t *obj = root;
    char seg[256];
    const char *p = path;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (l == 0 || l >= sizeof seg) {
            json_decref(root);
            json_decref(value);
            return eng_cfg_fail(c, n, "model_config.%s: empty or overlong key segment", path);
        }
        memcpy(seg, p, l);
        seg[l] = '\0';
        if (!dot) break;
        json_t *next = json_object_get(obj, seg);
        if (!next) {
            next = json_object();
            MT_CHECK_ALLOC(next, "model_config object");
            json_object_set_new(obj, seg, next);
        } else if (!json_is_object(next)) {
            json_decref(root);
            json_decref(value);
            return eng_cfg_fail(c, n, "model_config.%s: '%s' is not an object", path, seg);
        }
        obj = next;
        p = dot + 1;
    }
    json_object_set_new(obj, seg, value);
    char *text = json_dumps(root, JSON_COMPACT);
    json_decref(root);
    MT_CHECK_ALLOC(text, "model_config JSON text");
    free(cfg->model_config_json);
    cfg->model_config_json = text;
    return MT_OK;
}

static mt_status_t set_node(pctx_t *c, const char *key, yaml_node_t *n) {
    const key_row_t *rows = eng_cfg_top_rows;
    char prefix[256] = "", seg[256];
    const char *p = key;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (l == 0 || l >= sizeof seg) return eng_cfg_fail(c, n, "'%s' is not a valid key", key);
        memcpy(seg, p, l);
        seg[l] = '\0';
        const key_row_t *row = eng_cfg_find_row(rows, seg);
        if (!row) return eng_cfg_unknown_key(c, n, rows, prefix, seg);
        char full[256];
        snprintf(full, sizeof full, "%s%s", prefix, row->name);
        if (!dot) return eng_cfg_apply(c, row, full, n);
        if (row->kind == K_JSON) return set_json_path(c, dot + 1, n);
        if (row->kind != K_SECTION) return eng_cfg_fail(c, n, "'%s' has no sub-keys (in '%s')", full, key);
        size_t fl = strlen(full);
        if (fl + 2 > sizeof prefix) return eng_cfg_fail(c, n, "'%s' is not a valid key", key);
        memcpy(prefix, full, fl);
        memcpy(prefix + fl, ".", 2);
        rows = row->section;
        p = dot + 1;
    }
}

mt_status_t eng_run_config_set(eng_run_config_t *cfg, const char *assignment, mt_error_t *err) {
    pctx_t c = {.file = "--set", .set_arg = assignment, .cfg = cfg, .err = err};
    const char *eq = strchr(assignment, '=');
    if (!eq) return eng_cfg_fail(&c, NULL, "expected key=value");
    /* the key without surrounding blanks */
    const char *ks = assignment, *ke = eq;
    while (ks < ke && isspace((unsigned char)*ks)) ks++;
    while (ke > ks && isspace((unsigned char)ke[-1])) ke--;
    if (ke == ks) return eng_cfg_fail(&c, NULL, "expected key=value, the key is empty");
    char key[256];
    if ((size_t)(ke - ks) >= sizeof key) return eng_cfg_fail(&c, NULL, "the key is too long");
    memcpy(key, ks, (size_t)(ke - ks));
    key[ke - ks] = '\0';

    const char *value = eq + 1;
    char where[512];
    snprintf(where, sizeof where, "--set '%.400s' (value)", assignment);
    mt_yaml_doc_t yd;
    mt_status_t st = mt_yaml_doc_parse(&yd, value, strlen(value), where, "--set value", MT_ERR_CONFIG, err);
    if (st != MT_OK) return st;
    c.doc = &yd.doc;
    st = set_node(&c, key, yd.root);
    mt_yaml_doc_free(&yd);
    return st;
}
