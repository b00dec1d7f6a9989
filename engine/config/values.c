/* Reading values for the run config: YAML 1.1 scalar typing and YAML ->
 * JSON.  It knows nothing of the run config itself (config.h), so config.c
 * calls it and it calls nothing back.
 *
 * Design notes: libyaml only tokenises; deciding that `true` is a bool and
 * `0x10` an integer is the resolver's job, which libyaml leaves to us.  We
 * follow PyYAML's resolver (that is what axolotl sees), not the letter of
 * the YAML 1.1 spec: no y/n booleans, no sexagesimal 1:30 numbers.  Only
 * plain scalars are typed; any quoted scalar is a string.  Extension: an
 * exponent without a dot or without a sign (2e-5, 1.0e5) is a float, where
 * PyYAML would leave a string for pydantic to coerce. */
#include "engine/config/values.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/status.h"

static bool plain(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE && n->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
}

static const char *text(const yaml_node_t *n) { return (const char *)n->data.scalar.value; }

static bool one_of(const char *s, const char *const *words) {
    for (; *words; words++)
        if (strcmp(s, *words) == 0) return true;
    return false;
}

bool eng_yaml_is_null(const yaml_node_t *n) {
    static const char *const words[] = {"", "~", "null", "Null", "NULL", NULL};
    return plain(n) && one_of(text(n), words);
}

bool eng_yaml_bool(const yaml_node_t *n, bool *v) {
    static const char *const yes[] = {"true", "True", "TRUE", "yes", "Yes", "YES", "on", "On", "ON", NULL};
    static const char *const no[] = {"false", "False", "FALSE", "no", "No", "NO", "off", "Off", "OFF", NULL};
    if (!plain(n)) return false;
    if (one_of(text(n), yes)) return *v = true, true;
    if (one_of(text(n), no)) return *v = false, true;
    return false;
}

/* [-+]? then 0b[01_]+ | 0x[0-9a-fA-F_]+ | 0[0-7_]+ | 0 | [1-9][0-9_]* */
static bool parse_int(const char *s, bool *neg, uint64_t *mag) {
    *neg = false;
    if (*s == '+' || *s == '-') *neg = *s++ == '-';
    if (!isdigit((unsigned char)*s)) return false;
    unsigned base = 10;
    if (s[0] == '0' && s[1] == 'b') base = 2, s += 2;
    else if (s[0] == '0' && s[1] == 'x') base = 16, s += 2;
    else if (s[0] == '0' && s[1]) base = 8, s += 1;
    uint64_t v = 0;
    int digits = 0;
    for (; *s; s++) {
        if (*s == '_') continue;
        unsigned d;
        if (isdigit((unsigned char)*s)) d = (unsigned)(*s - '0');
        else if (base == 16 && isxdigit((unsigned char)*s)) d = (unsigned)(tolower((unsigned char)*s) - 'a' + 10);
        else return false;
        if (d >= base) return false;
        if (v > (UINT64_MAX - d) / base) return false; /* overflow: not representable */
        v = v * base + d;
        digits++;
    }
    if (!digits) return false;
    *mag = v;
    return true;
}

bool eng_yaml_int(const yaml_node_t *n, int64_t *v) {
    bool neg;
    uint64_t mag;
    if (!plain(n) || !parse_int(text(n), &neg, &mag)) return false;
    if (neg ? mag > (uint64_t)INT64_MAX + 1 : mag > (uint64_t)INT64_MAX) return false;
    *v = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return true;
}

bool eng_yaml_u64(const yaml_node_t *n, uint64_t *v) {
    bool neg;
    uint64_t mag;
    if (!plain(n) || !parse_int(text(n), &neg, &mag) || (neg && mag)) return false;
    *v = mag;
    return true;
}

/* PyYAML's float: [-+]?[0-9][0-9_]*\.[0-9_]*([eE][-+][0-9]+)? | [-+]?\.[0-9_]+(...)? |
 * [-+]?\.(inf|Inf|INF) | \.(nan|NaN|NAN); plus exponents without a dot or sign. */
static bool parse_float(const char *s, double *v) {
    static const char *const inf[] = {".inf", ".Inf", ".INF", NULL};
    static const char *const nan_[] = {".nan", ".NaN", ".NAN", NULL};
    if (one_of(s, nan_)) return *v = NAN, true;
    const char *p = s;
    bool neg = false;
    if (*p == '+' || *p == '-') neg = *p++ == '-';
    if (one_of(p, inf)) return *v = neg ? -INFINITY : INFINITY, true;
    char buf[128];
    size_t k = 0;
    int digits = 0;
    bool dot = false, exp = false;
    if (*p == '_') return false;
    for (; *p; p++) {
        char ch = *p;
        if (ch == '_' && !exp) continue;
        if (isdigit((unsigned char)ch)) digits++;
        else if (ch == '.' && !dot && !exp) dot = true;
        else if ((ch == 'e' || ch == 'E') && !exp && digits) {
            exp = true;
            if (k + 3 >= sizeof buf) return false;
            buf[k++] = ch;
            if (p[1] == '+' || p[1] == '-') buf[k++] = *++p;
            if (!isdigit((unsigned char)p[1])) return false;
            continue;
        } else return false;
        if (k + 1 >= sizeof buf) return false;
        buf[k++] = ch;
    }
    buf[k] = '\0';
    if (!digits || (!dot && !exp)) return false;
    char *end;
    errno = 0;
    double x = strtod(buf, &end);
    if (*end) return false;
    /* overflow gives +-HUGE_VAL = inf, as PyYAML's float() would; underflow gives 0 */
    *v = neg ? -x : x;
    return true;
}

bool eng_yaml_number(const yaml_node_t *n, double *v) {
    int64_t i;
    if (eng_yaml_int(n, &i)) return *v = (double)i, true;
    bool neg;
    uint64_t mag;
    if (plain(n) && parse_int(text(n), &neg, &mag)) return *v = neg ? -(double)mag : (double)mag, true;
    return plain(n) && parse_float(text(n), v);
}

static json_t *to_json(yaml_document_t *doc, const yaml_node_t *n, int depth, char *msg, size_t cap,
                       const yaml_node_t **bad) {
    if (!n) {
        snprintf(msg, cap, "missing node");
        return NULL;
    }
    /* aliases can make a node contain itself; real configs are shallow */
    if (depth > 64) {
        *bad = n;
        snprintf(msg, cap, "nested more than 64 levels (a recursive alias?)");
        return NULL;
    }
    if (n->type == YAML_MAPPING_NODE) {
        json_t *obj = json_object();
        MT_CHECK_ALLOC(obj, "JSON object");
        for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
            const yaml_node_t *k = yaml_document_get_node(doc, p->key);
            if (!k || k->type != YAML_SCALAR_NODE || strlen(text(k)) != k->data.scalar.length) {
                *bad = k ? k : n;
                snprintf(msg, cap, "keys must be strings");
                json_decref(obj);
                return NULL;
            }
            if (json_object_get(obj, text(k))) {
                *bad = k;
                snprintf(msg, cap, "duplicate key '%.200s'", text(k));
                json_decref(obj);
                return NULL;
            }
            json_t *v = to_json(doc, yaml_document_get_node(doc, p->value), depth + 1, msg, cap, bad);
            if (!v) {
                json_decref(obj);
                return NULL;
            }
            json_object_set_new(obj, text(k), v);
        }
        return obj;
    }
    if (n->type == YAML_SEQUENCE_NODE) {
        json_t *arr = json_array();
        MT_CHECK_ALLOC(arr, "JSON array");
        for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top; it++) {
            json_t *v = to_json(doc, yaml_document_get_node(doc, *it), depth + 1, msg, cap, bad);
            if (!v) {
                json_decref(arr);
                return NULL;
            }
            json_array_append_new(arr, v);
        }
        return arr;
    }
    if (eng_yaml_is_null(n)) return json_null();
    bool b;
    if (eng_yaml_bool(n, &b)) return json_boolean(b);
    int64_t i;
    if (eng_yaml_int(n, &i)) return json_integer((json_int_t)i);
    double d;
    if (eng_yaml_number(n, &d)) {
        if (!isfinite(d)) {
            *bad = n;
            snprintf(msg, cap, "'%.200s' (inf or nan) cannot be written to JSON", text(n));
            return NULL;
        }
        return json_real(d);
    }
    json_t *s = json_stringn(text(n), n->data.scalar.length);
    if (!s) {
        *bad = n;
        snprintf(msg, cap, "'%.200s' is not valid UTF-8", text(n));
    }
    return s;
}

json_t *eng_yaml_to_json(yaml_document_t *doc, const yaml_node_t *n, char *msg, size_t cap,
                         const yaml_node_t **bad) {
    *bad = NULL;
    return to_json(doc, n, 0, msg, cap, bad);
}
