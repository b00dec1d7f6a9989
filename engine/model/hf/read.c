/* config.json's typed getters (see read.h): each names file and key in its
 * message, and a missing key takes the caller's default (transformers'
 * for the family being read).
 *
 * Its own file, below the families' parsers (model_config.c,
 * model_config_families.c) that call it, so that none of them calls back
 * into another. */
#include "engine/model/hf/read.h"

#include <jansson.h>

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

mt_status_t eng_cfg_type_error(eng_cfg_reader_t *r, const char *key, const char *want, const json_t *v) {
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must be %s, found %s", r->path, key,
                        want, json_type_name(v));
}

/* required: missing key is an error; nullable: JSON null counts as absent. */
mt_status_t eng_cfg_get_int(eng_cfg_reader_t *r, const char *key, bool required, bool nullable, int def,
                           int *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v || (nullable && json_is_null(v))) {
        if (required)
            return mt_error_set(r->err, MT_ERR_CONFIG, "%s: missing required key '%s'", r->path, key);
        *out = def;
        return MT_OK;
    }
    if (!json_is_integer(v)) return eng_cfg_type_error(r, key, "an integer", v);
    json_int_t x = json_integer_value(v);
    if (x < -2147483647 || x > 2147483647)
        return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' = %lld is out of range", r->path,
                            key, (long long)x);
    *out = (int)x;
    return MT_OK;
}

mt_status_t eng_cfg_get_double(eng_cfg_reader_t *r, const char *key, double def, double *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_number(v)) return eng_cfg_type_error(r, key, "a number", v);
    *out = json_number_value(v);
    return MT_OK;
}

mt_status_t eng_cfg_get_bool(eng_cfg_reader_t *r, const char *key, bool def, bool *out) {
    json_t *v = json_object_get(r->obj, key);
    if (!v) {
        *out = def;
        return MT_OK;
    }
    if (!json_is_boolean(v)) return eng_cfg_type_error(r, key, "true or false", v);
    *out = json_is_true(v);
    return MT_OK;
}

mt_status_t eng_cfg_positive(eng_cfg_reader_t *r, const char *key, int v) {
    if (v > 0) return MT_OK;
    return mt_error_set(r->err, MT_ERR_CONFIG, "%s: key '%s' must be positive, found %d", r->path,
                        key, v);
}
