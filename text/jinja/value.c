/* Values as the template sees them: Python's None, bool, int, float, str,
 * list, tuple and dict, jinja2's Undefined, and callables; how Python
 * prints them (str, repr) and how transformers' tojson writes them
 * (json.dumps with ensure_ascii=False).
 *
 * Floats print as Python's repr does: the shortest digits that read back
 * to the same double, fixed notation for exponents -4..15 ("0.1", "1e+16",
 * "1.5e-07", "2.0").  Strings are UTF-8; lengths and indices count code
 * points, as Python's do. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

void tj_fail(tj_rt_t *rt, const tj_node_t *at, const char *fmt, ...) {
    char msg[1536];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (at)
        mt_error_set(rt->err, MT_ERR_FORMAT, "%s:%d:%d: %s", rt->origin, at->line, at->col, msg);
    else
        mt_error_set(rt->err, MT_ERR_FORMAT, "%s: %s", rt->origin, msg);
    longjmp(rt->jb, 1);
}

struct tj_chunk {
    tj_chunk_t *next;
    size_t size, used;
    max_align_t data[];
};

void *tj_alloc(tj_pool_t *p, size_t n) {
    n = (n + 15) & ~(size_t)15;
    tj_chunk_t *c = p->head;
    if (!c || c->size - c->used < n) {
        size_t size = n > ((size_t)64 << 10) ? n : ((size_t)64 << 10);
        if (p->total + size > TJ_MAX_POOL && p->oom) {
            mt_error_set(p->err, MT_ERR_BUDGET, "the template needed more than %zu MiB of memory",
                         TJ_MAX_POOL >> 20);
            longjmp(*p->oom, 1);
        }
        c = malloc(sizeof *c + size);
        MT_CHECK_ALLOC(c, "template memory");
        c->size = size, c->used = 0, c->next = p->head;
        p->head = c;
        p->total += size;
    }
    void *r = (char *)c->data + c->used;
    c->used += n;
    memset(r, 0, n);
    return r;
}

char *tj_strdup(tj_pool_t *p, const char *s, size_t n) {
    char *r = tj_alloc(p, n + 1);
    if (n) memcpy(r, s, n);
    return r;
}

void tj_pool_free(tj_pool_t *p) {
    for (tj_chunk_t *c = p->head, *next; c; c = next) {
        next = c->next;
        free(c);
    }
    p->head = NULL;
    p->total = 0;
}

tj_val_t tj_none(void) { return (tj_val_t){.k = V_NONE}; }
tj_val_t tj_bool(bool b) { return (tj_val_t){.k = V_BOOL, .b = b}; }
tj_val_t tj_int(int64_t i) { return (tj_val_t){.k = V_INT, .i = i}; }
tj_val_t tj_float(double f) { return (tj_val_t){.k = V_FLOAT, .f = f}; }
tj_val_t tj_undef(const char *what) { return (tj_val_t){.k = V_UNDEF, .undef = what}; }
tj_val_t tj_strv(tj_str_t *s) { return (tj_val_t){.k = V_STR, .s = s}; }

tj_str_t *tj_str_new(tj_pool_t *p, const char *s, size_t n, const uint8_t *fl, uint8_t fill) {
    tj_str_t *r = tj_alloc(p, sizeof *r);
    r->n = n;
    r->p = tj_alloc(p, n + 1);
    if (s && n) memcpy(r->p, s, n);
    if (fl || fill) {
        r->fl = tj_alloc(p, n + 1);
        if (fl) memcpy(r->fl, fl, n);
        else memset(r->fl, fill, n);
    }
    return r;
}

tj_val_t tj_cstr(tj_rt_t *rt, const char *s) { return tj_strv(tj_str_new(&rt->pool, s, strlen(s), NULL, 0)); }

tj_val_t tj_list_new(tj_rt_t *rt, int n, uint8_t sub) {
    tj_list_t *l = tj_alloc(&rt->pool, sizeof *l);
    l->n = n;
    l->v = tj_alloc(&rt->pool, sizeof *l->v * (size_t)(n ? n : 1));
    return (tj_val_t){.k = V_LIST, .sub = sub, .l = l};
}

tj_val_t tj_dict_new(tj_rt_t *rt, uint8_t sub) {
    tj_dict_t *d = tj_alloc(&rt->pool, sizeof *d);
    return (tj_val_t){.k = V_DICT, .sub = sub, .d = d};
}

const tj_val_t *tj_dict_get(const tj_dict_t *d, tj_val_t k) {
    for (int i = 0; i < d->n; i++)
        if (tj_equal(d->keys[i], k)) return &d->vals[i];
    return NULL;
}

const tj_val_t *tj_dict_gets(const tj_dict_t *d, const char *k) {
    size_t n = strlen(k);
    for (int i = 0; i < d->n; i++)
        if (d->keys[i].k == V_STR && d->keys[i].s->n == n && memcmp(d->keys[i].s->p, k, n) == 0)
            return &d->vals[i];
    return NULL;
}

void tj_dict_set(tj_rt_t *rt, tj_dict_t *d, tj_val_t k, tj_val_t v) {
    const tj_val_t *have = tj_dict_get(d, k);
    if (have) {
        *(tj_val_t *)have = v;
        return;
    }
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 8;
        tj_val_t *keys = tj_alloc(&rt->pool, sizeof *keys * (size_t)cap);
        tj_val_t *vals = tj_alloc(&rt->pool, sizeof *vals * (size_t)cap);
        if (d->n) {
            memcpy(keys, d->keys, sizeof *keys * (size_t)d->n);
            memcpy(vals, d->vals, sizeof *vals * (size_t)d->n);
        }
        d->keys = keys, d->vals = vals, d->cap = cap;
    }
    d->keys[d->n] = k;
    d->vals[d->n++] = v;
}

bool tj_truthy(tj_val_t v) {
    switch (v.k) {
    case V_UNDEF: case V_NONE: return false;
    case V_BOOL: return v.b;
    case V_INT: return v.i != 0;
    case V_FLOAT: return v.f != 0;
    case V_STR: return v.s->n != 0;
    case V_LIST: return v.l->n != 0;
    case V_DICT: return v.sub == D_NS || v.d->n != 0;
    default: return true;
    }
}

static bool is_num(tj_val_t v) { return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL; }
static double num(tj_val_t v) { return v.k == V_FLOAT ? v.f : v.k == V_INT ? (double)v.i : v.b; }

bool tj_equal(tj_val_t a, tj_val_t b) {
    if (is_num(a) && is_num(b)) {
        if (a.k != V_FLOAT && b.k != V_FLOAT) return (a.k == V_INT ? a.i : a.b) == (b.k == V_INT ? b.i : b.b);
        return num(a) == num(b);
    }
    if (a.k != b.k) return false;
    switch (a.k) {
    case V_UNDEF: case V_NONE: return true;
    case V_STR: return a.s->n == b.s->n && memcmp(a.s->p, b.s->p, a.s->n) == 0;
    case V_LIST:
        if (a.sub != b.sub || a.l->n != b.l->n) return false;
        for (int i = 0; i < a.l->n; i++)
            if (!tj_equal(a.l->v[i], b.l->v[i])) return false;
        return true;
    case V_DICT:
        if (a.sub != D_DICT || b.sub != D_DICT) return a.d == b.d;
        if (a.d->n != b.d->n) return false;
        for (int i = 0; i < a.d->n; i++) {
            const tj_val_t *o = tj_dict_get(b.d, a.d->keys[i]);
            if (!o || !tj_equal(a.d->vals[i], *o)) return false;
        }
        return true;
    case V_FUNC: return a.fn == b.fn;
    default: return false;
    }
}

const char *tj_type_name(tj_val_t v) {
    switch (v.k) {
    case V_UNDEF: return "Undefined";
    case V_NONE: return "NoneType";
    case V_BOOL: return "bool";
    case V_INT: return "int";
    case V_FLOAT: return "float";
    case V_STR: return "str";
    case V_LIST: return v.sub == L_TUPLE ? "tuple" : "list";
    case V_DICT: return v.sub == D_NS ? "Namespace" : v.sub == D_LOOP ? "LoopContext" : "dict";
    default: return "function";
    }
}

int tj_compare(tj_rt_t *rt, const tj_node_t *at, tj_val_t a, tj_val_t b) {
    if (is_num(a) && is_num(b)) {
        if (a.k == V_INT && b.k == V_INT) return (a.i > b.i) - (a.i < b.i);
        double x = num(a), y = num(b);
        return (x > y) - (x < y);
    }
    if (a.k == V_STR && b.k == V_STR) {
        size_t n = a.s->n < b.s->n ? a.s->n : b.s->n;
        int c = memcmp(a.s->p, b.s->p, n); /* UTF-8 byte order is code point order */
        if (c) return c;
        return (a.s->n > b.s->n) - (a.s->n < b.s->n);
    }
    if (a.k == V_LIST && b.k == V_LIST && a.sub == b.sub) {
        for (int i = 0; i < a.l->n && i < b.l->n; i++)
            if (!tj_equal(a.l->v[i], b.l->v[i])) return tj_compare(rt, at, a.l->v[i], b.l->v[i]);
        return (a.l->n > b.l->n) - (a.l->n < b.l->n);
    }
    if (a.k == V_UNDEF || b.k == V_UNDEF)
        tj_fail(rt, at, "%s is undefined", a.k == V_UNDEF ? a.undef : b.undef);
    tj_fail(rt, at, "'<' not supported between instances of '%s' and '%s'", tj_type_name(a), tj_type_name(b));
}

tj_val_t tj_from_json(tj_rt_t *rt, const json_t *j, uint8_t fl) {
    switch (json_typeof(j)) {
    case JSON_NULL: return tj_none();
    case JSON_TRUE: return tj_bool(true);
    case JSON_FALSE: return tj_bool(false);
    case JSON_INTEGER: return tj_int(json_integer_value(j));
    case JSON_REAL: return tj_float(json_real_value(j));
    case JSON_STRING:
        return tj_strv(tj_str_new(&rt->pool, json_string_value(j), json_string_length(j), NULL, fl));
    case JSON_ARRAY: {
        tj_val_t l = tj_list_new(rt, (int)json_array_size(j), L_LIST);
        for (size_t i = 0; i < json_array_size(j); i++) l.l->v[i] = tj_from_json(rt, json_array_get(j, i), fl);
        return l;
    }
    case JSON_OBJECT: {
        tj_val_t d = tj_dict_new(rt, D_DICT);
        const char *key;
        json_t *v;
        json_object_foreach((json_t *)j, key, v) {
            tj_val_t k = tj_strv(tj_str_new(&rt->pool, key, strlen(key), NULL, fl));
            tj_dict_set(rt, d.d, k, tj_from_json(rt, v, fl));
        }
        return d;
    }
    }
    return tj_none();
}

/* ---- buffers ---- */

void tj_buf_put(tj_rt_t *rt, tj_buf_t *b, const char *s, size_t n, const uint8_t *fl, uint8_t fill) {
    if (b->n + n > TJ_MAX_OUTPUT) tj_fail(rt, NULL, "the output passed %zu MiB", TJ_MAX_OUTPUT >> 20);
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = tj_alloc(&rt->pool, cap);
        uint8_t *f = tj_alloc(&rt->pool, cap);
        if (b->n) {
            memcpy(p, b->p, b->n);
            memcpy(f, b->fl, b->n);
        }
        b->p = p, b->fl = f, b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    for (size_t i = 0; i < n; i++) b->fl[b->n + i] = (uint8_t)((fl ? fl[i] : 0) | fill);
    b->n += n;
    b->p[b->n] = 0;
}

void tj_buf_puts(tj_rt_t *rt, tj_buf_t *b, const char *s) { tj_buf_put(rt, b, s, strlen(s), NULL, 0); }

tj_str_t *tj_buf_str(tj_rt_t *rt, const tj_buf_t *b) {
    bool any = false;
    for (size_t i = 0; i < b->n && !any; i++) any = b->fl[i] != 0;
    return tj_str_new(&rt->pool, b->p, b->n, any ? b->fl : NULL, 0);
}

static void put_s(tj_rt_t *rt, tj_buf_t *b, const tj_str_t *s) { tj_buf_put(rt, b, s->p, s->n, s->fl, 0); }

void tj_format_float(double f, char out[40]) {
    if (isnan(f)) { strcpy(out, "nan"); return; }
    if (isinf(f)) { strcpy(out, f < 0 ? "-inf" : "inf"); return; }
    char e[40];
    int prec = 1;
    for (; prec <= 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec - 1, f);
        if (strtod(e, NULL) == f) break;
    }
    /* e = [-]D[.DDD]e[+-]XX: split into digits and a decimal exponent */
    char digits[40];
    int nd = 0, exp10;
    const char *q = e;
    bool neg = *q == '-';
    if (neg) q++;
    for (; *q && *q != 'e'; q++)
        if (*q != '.') digits[nd++] = *q;
    exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    digits[nd] = 0;
    char *o = out;
    if (neg) *o++ = '-';
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            o += sprintf(o, "0.");
            for (int k = -1; k > exp10; k--) *o++ = '0';
            memcpy(o, digits, (size_t)nd + 1);
        } else {
            for (int k = 0; k <= exp10; k++) *o++ = k < nd ? digits[k] : '0';
            *o++ = '.';
            if (nd > exp10 + 1) memcpy(o, digits + exp10 + 1, (size_t)(nd - exp10));
            else strcpy(o, "0");
        }
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            memcpy(o, digits + 1, (size_t)nd - 1);
            o += nd - 1;
        }
        sprintf(o, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
}

void tj_put_str(tj_rt_t *rt, tj_buf_t *b, tj_val_t v) {
    char tmp[48];
    switch (v.k) {
    case V_UNDEF: return;
    case V_NONE: tj_buf_puts(rt, b, "None"); return;
    case V_BOOL: tj_buf_puts(rt, b, v.b ? "True" : "False"); return;
    case V_INT: snprintf(tmp, sizeof tmp, "%lld", (long long)v.i); tj_buf_puts(rt, b, tmp); return;
    case V_FLOAT: tj_format_float(v.f, tmp); tj_buf_puts(rt, b, tmp); return;
    case V_STR: put_s(rt, b, v.s); return;
    default: tj_put_repr(rt, b, v);
    }
}

static void repr_string(tj_rt_t *rt, tj_buf_t *b, const tj_str_t *s) {
    bool sq = memchr(s->p, '\'', s->n) != NULL, dq = memchr(s->p, '"', s->n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    tj_buf_put(rt, b, &q, 1, NULL, 0);
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        uint8_t f = s->fl ? s->fl[i] : 0;
        char tmp[8];
        const char *out = NULL;
        if (c == (unsigned char)q || c == '\\') snprintf(tmp, sizeof tmp, "\\%c", c), out = tmp;
        else if (c == '\n') out = "\\n";
        else if (c == '\r') out = "\\r";
        else if (c == '\t') out = "\\t";
        else if (c < 0x20 || c == 0x7f) snprintf(tmp, sizeof tmp, "\\x%02x", c), out = tmp;
        if (out) tj_buf_put(rt, b, out, strlen(out), NULL, f);
        else tj_buf_put(rt, b, s->p + i, 1, NULL, f);
    }
    tj_buf_put(rt, b, &q, 1, NULL, 0);
}

void tj_put_repr(tj_rt_t *rt, tj_buf_t *b, tj_val_t v) {
    switch (v.k) {
    case V_STR: repr_string(rt, b, v.s); return;
    case V_UNDEF: return;
    case V_LIST: {
        bool tuple = v.sub == L_TUPLE;
        tj_buf_puts(rt, b, tuple ? "(" : "[");
        for (int i = 0; i < v.l->n; i++) {
            if (i) tj_buf_puts(rt, b, ", ");
            tj_put_repr(rt, b, v.l->v[i]);
        }
        tj_buf_puts(rt, b, tuple ? (v.l->n == 1 ? ",)" : ")") : "]");
        return;
    }
    case V_DICT: {
        if (v.sub == D_NS) tj_buf_puts(rt, b, "<Namespace ");
        tj_buf_puts(rt, b, "{");
        for (int i = 0; i < v.d->n; i++) {
            if (i) tj_buf_puts(rt, b, ", ");
            tj_put_repr(rt, b, v.d->keys[i]);
            tj_buf_puts(rt, b, ": ");
            tj_put_repr(rt, b, v.d->vals[i]);
        }
        tj_buf_puts(rt, b, v.sub == D_NS ? "}>" : "}");
        return;
    }
    case V_FUNC: tj_buf_puts(rt, b, "<function "); tj_buf_puts(rt, b, v.fn->name); tj_buf_puts(rt, b, ">"); return;
    default: tj_put_str(rt, b, v);
    }
}

static void dump_string(tj_rt_t *rt, tj_buf_t *b, const tj_str_t *s) {
    tj_buf_puts(rt, b, "\"");
    for (size_t i = 0; i < s->n; i++) {
        unsigned char c = (unsigned char)s->p[i];
        uint8_t f = s->fl ? s->fl[i] : 0;
        char tmp[8];
        const char *out = NULL;
        if (c == '"') out = "\\\"";
        else if (c == '\\') out = "\\\\";
        else if (c == '\n') out = "\\n";
        else if (c == '\r') out = "\\r";
        else if (c == '\t') out = "\\t";
        else if (c == '\b') out = "\\b";
        else if (c == '\f') out = "\\f";
        else if (c < 0x20) snprintf(tmp, sizeof tmp, "\\u%04x", c), out = tmp;
        if (out) tj_buf_put(rt, b, out, strlen(out), NULL, f);
        else tj_buf_put(rt, b, s->p + i, 1, NULL, f);
    }
    tj_buf_puts(rt, b, "\"");
}

static void json_newline(tj_rt_t *rt, tj_buf_t *b, int indent, int level) {
    tj_buf_puts(rt, b, "\n");
    for (int i = 0; i < indent * level; i++) tj_buf_puts(rt, b, " ");
}

static int key_order(const void *x, const void *y) {
    const tj_val_t *a = *(const tj_val_t *const *)x, *b = *(const tj_val_t *const *)y;
    size_t n = a->s->n < b->s->n ? a->s->n : b->s->n;
    int c = memcmp(a->s->p, b->s->p, n);
    return c ? c : (a->s->n > b->s->n) - (a->s->n < b->s->n);
}

static void json_dict(tj_rt_t *rt, const tj_node_t *at, tj_buf_t *b, tj_val_t v, int indent, int level,
                      const char *item_sep, const char *key_sep, bool sort_keys) {
    if (v.d->n == 0) {
        tj_buf_puts(rt, b, "{}");
        return;
    }
    const tj_val_t **order = tj_alloc(&rt->pool, sizeof *order * (size_t)v.d->n);
    for (int i = 0; i < v.d->n; i++) {
        if (v.d->keys[i].k != V_STR && sort_keys)
            tj_fail(rt, at, "tojson(sort_keys=true) needs string keys");
        order[i] = &v.d->keys[i];
    }
    if (sort_keys) qsort(order, (size_t)v.d->n, sizeof *order, key_order);
    tj_buf_puts(rt, b, "{");
    for (int i = 0; i < v.d->n; i++) {
        int idx = (int)(order[i] - v.d->keys);
        if (i) tj_buf_puts(rt, b, item_sep);
        if (indent >= 0) json_newline(rt, b, indent, level + 1);
        tj_val_t k = v.d->keys[idx];
        if (k.k == V_STR) dump_string(rt, b, k.s);
        else {
            tj_buf_puts(rt, b, "\"");
            tj_put_json(rt, at, b, k, -1, 0, item_sep, key_sep, false);
            tj_buf_puts(rt, b, "\"");
        }
        tj_buf_puts(rt, b, key_sep);
        tj_put_json(rt, at, b, v.d->vals[idx], indent, level + 1, item_sep, key_sep, sort_keys);
    }
    if (indent >= 0) json_newline(rt, b, indent, level);
    tj_buf_puts(rt, b, "}");
}

/* json.dumps(v, ensure_ascii=False, indent=indent (<0: None), separators) */
void tj_put_json(tj_rt_t *rt, const tj_node_t *at, tj_buf_t *b, tj_val_t v, int indent, int level,
                 const char *item_sep, const char *key_sep, bool sort_keys) {
    char tmp[48];
    if (level > TJ_MAX_PARSE_DEPTH) tj_fail(rt, at, "tojson: nested deeper than %d levels", TJ_MAX_PARSE_DEPTH);
    switch (v.k) {
    case V_NONE: tj_buf_puts(rt, b, "null"); return;
    case V_BOOL: tj_buf_puts(rt, b, v.b ? "true" : "false"); return;
    case V_INT: tj_put_str(rt, b, v); return;
    case V_FLOAT:
        if (isnan(v.f)) tj_buf_puts(rt, b, "NaN");
        else if (isinf(v.f)) tj_buf_puts(rt, b, v.f < 0 ? "-Infinity" : "Infinity");
        else tj_format_float(v.f, tmp), tj_buf_puts(rt, b, tmp);
        return;
    case V_STR: dump_string(rt, b, v.s); return;
    case V_LIST:
        if (v.l->n == 0) {
            tj_buf_puts(rt, b, "[]");
            return;
        }
        tj_buf_puts(rt, b, "[");
        for (int i = 0; i < v.l->n; i++) {
            if (i) tj_buf_puts(rt, b, item_sep);
            if (indent >= 0) json_newline(rt, b, indent, level + 1);
            tj_put_json(rt, at, b, v.l->v[i], indent, level + 1, item_sep, key_sep, sort_keys);
        }
        if (indent >= 0) json_newline(rt, b, indent, level);
        tj_buf_puts(rt, b, "]");
        return;
    case V_DICT:
        if (v.sub == D_DICT) {
            json_dict(rt, at, b, v, indent, level, item_sep, key_sep, sort_keys);
            return;
        }
        break;
    default: break;
    }
    tj_fail(rt, at, "tojson: Object of type %s is not JSON serializable", tj_type_name(v));
}

tj_str_t *tj_to_str(tj_rt_t *rt, tj_val_t v) {
    if (v.k == V_STR) return v.s;
    tj_buf_t b = {0};
    tj_put_str(rt, &b, v);
    return tj_buf_str(rt, &b);
}

/* ---- UTF-8 ---- */

size_t tj_utf8_len(const char *s, size_t n) {
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

size_t tj_utf8_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0, c = 0;
    for (; i < n; i++) {
        if (((unsigned char)s[i] & 0xC0) != 0x80) {
            if (c == cp) return i;
            c++;
        }
    }
    return n;
}

tj_str_t *tj_substr(tj_rt_t *rt, const tj_str_t *s, size_t off, size_t n) {
    if (off > s->n) off = s->n;
    if (n > s->n - off) n = s->n - off;
    return tj_str_new(&rt->pool, s->p + off, n, s->fl ? s->fl + off : NULL, 0);
}
