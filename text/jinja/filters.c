/* jinja2's filters that chat templates use, with jinja2's argument names
 * and defaults, and transformers' tojson (json.dumps with
 * ensure_ascii=False, indent, separators, sort_keys).  Filters that take a
 * string take str() of any value, as jinja2's soft_str does; attribute=
 * arguments accept a dotted path ("function.name"). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

static const char *const FILTERS[] = {
    "trim", "tojson", "length", "count", "upper", "lower", "title", "capitalize", "replace", "string", "int",
    "float", "default", "d", "items", "join", "list", "first", "last", "map", "select", "reject", "selectattr",
    "rejectattr", "unique", "safe", "indent", "round", "abs", "dictsort", "sort", "reverse", "min", "max", "sum",
    "wordcount", NULL};

bool tj_has_filter(const char *name) {
    for (const char *const *f = FILTERS; *f; f++)
        if (!strcmp(*f, name)) return true;
    return false;
}

#define ARG(pos, name, dflt) tj_arg(at, rt, n, args, kw, (pos), (name), (dflt))

static const char *attr_name(tj_rt_t *rt, const tj_node_t *at, tj_val_t v) {
    if (v.k == V_NONE || v.k == V_UNDEF) return NULL;
    if (v.k != V_STR) tj_fail(rt, at, "attribute= must be a string");
    return v.s->p;
}

static tj_val_t tojson(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw) {
    tj_val_t indent = ARG(2, "indent", tj_none()), seps = ARG(3, "separators", tj_none());
    tj_val_t sort = ARG(4, "sort_keys", tj_bool(false)), ascii = ARG(1, "ensure_ascii", tj_bool(false));
    if (tj_truthy(ascii)) tj_fail(rt, at, "tojson(ensure_ascii=true) is not supported");
    int ind = indent.k == V_INT ? (int)indent.i : -1;
    if (indent.k != V_INT && indent.k != V_NONE) tj_fail(rt, at, "tojson: indent must be an integer");
    if (ind > 64) tj_fail(rt, at, "tojson: indent over 64");
    const char *item_sep = ind >= 0 ? "," : ", ", *key_sep = ": ";
    if (seps.k == V_LIST) {
        if (seps.l->n != 2 || seps.l->v[0].k != V_STR || seps.l->v[1].k != V_STR)
            tj_fail(rt, at, "tojson: separators must be two strings");
        item_sep = seps.l->v[0].s->p, key_sep = seps.l->v[1].s->p;
    }
    tj_buf_t b = {0};
    tj_put_json(rt, at, &b, args[0], ind, 0, item_sep, key_sep, tj_truthy(sort));
    return tj_strv(tj_buf_str(rt, &b));
}

static tj_val_t indent(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw) {
    tj_str_t *s = tj_to_str(rt, args[0]);
    tj_val_t w = ARG(1, "width", tj_int(4));
    bool first = tj_truthy(ARG(2, "first", tj_bool(false))), blank = tj_truthy(ARG(3, "blank", tj_bool(false)));
    tj_str_t *ind = w.k == V_STR ? w.s : NULL;
    char spaces[256];
    if (!ind) {
        int64_t k = w.k == V_INT ? w.i : 4;
        if (k < 0 || k > 255) tj_fail(rt, at, "indent width %lld out of range", (long long)k);
        memset(spaces, ' ', (size_t)k);
        ind = tj_str_new(&rt->pool, spaces, (size_t)k, NULL, 0);
    }
    tj_buf_t b = {0};
    if (first) tj_buf_put(rt, &b, ind->p, ind->n, ind->fl, 0);
    /* lines as str.splitlines() of s + "\n" */
    size_t i = 0;
    bool first_line = true;
    while (i < s->n) {
        size_t j = i;
        while (j < s->n && s->p[j] != '\n' && s->p[j] != '\r' && s->p[j] != '\v' && s->p[j] != '\f') j++;
        if (!first_line) {
            tj_buf_puts(rt, &b, "\n");
            if (j > i || blank) tj_buf_put(rt, &b, ind->p, ind->n, ind->fl, 0);
        }
        tj_buf_put(rt, &b, s->p + i, j - i, s->fl ? s->fl + i : NULL, 0);
        first_line = false;
        if (j < s->n && s->p[j] == '\r' && j + 1 < s->n && s->p[j + 1] == '\n') j++;
        i = j + 1;
    }
    return tj_strv(b.n ? tj_buf_str(rt, &b) : tj_str_new(&rt->pool, "", 0, NULL, 0));
}

static tj_val_t do_round(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw) {
    tj_val_t v = args[0], p = ARG(1, "precision", tj_int(0)), m = ARG(2, "method", tj_none());
    if (v.k != V_INT && v.k != V_FLOAT && v.k != V_BOOL) tj_fail(rt, at, "round: not a number (%s)", tj_type_name(v));
    double x = v.k == V_FLOAT ? v.f : (double)(v.k == V_INT ? v.i : v.b);
    int prec = p.k == V_INT ? (int)p.i : 0;
    const char *method = m.k == V_STR ? m.s->p : "common";
    if (prec < 0 || prec > 15) tj_fail(rt, at, "round: precision %d out of range", prec);
    double scale = pow(10, prec);
    if (!strcmp(method, "floor")) return tj_float(floor(x * scale) / scale);
    if (!strcmp(method, "ceil")) return tj_float(ceil(x * scale) / scale);
    if (strcmp(method, "common")) tj_fail(rt, at, "round: method must be common, ceil or floor");
    if (prec == 0) return tj_float(nearbyint(x));
    char buf[400];
    snprintf(buf, sizeof buf, "%.*f", prec, x); /* exact decimal rounding, half to even: Python's round */
    return tj_float(strtod(buf, NULL));
}

/* a key for sorting/min/max/unique: the item or its attribute, lower-cased strings unless case-sensitive */
static tj_val_t sort_key(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, const char *attr, bool cs) {
    if (attr) v = tj_attr_path(rt, at, v, attr);
    if (!cs && v.k == V_STR) v = tj_recase(rt, v.s, 'l');
    return v;
}

typedef struct {
    tj_val_t key, item;
    int pos;
} keyed_t;

static void sort_items(tj_rt_t *rt, const tj_node_t *at, keyed_t *k, int n, bool reverse) {
    /* insertion sort: stable, and comparison failures can longjmp safely */
    for (int i = 1; i < n; i++) {
        keyed_t x = k[i];
        int j = i - 1;
        while (j >= 0) {
            int c = tj_compare(rt, at, k[j].key, x.key);
            if (reverse ? c >= 0 : c <= 0) break;
            k[j + 1] = k[j];
            j--;
        }
        k[j + 1] = x;
    }
}

static tj_val_t sorted(tj_rt_t *rt, const tj_node_t *at, tj_val_t items, const char *attr, bool cs, bool reverse,
                       int by) {
    int n = items.l->n;
    if (n > 20000) tj_fail(rt, at, "sorting %d items is more than the 20000 allowed", n);
    keyed_t *k = tj_alloc(&rt->pool, sizeof *k * (size_t)(n ? n : 1));
    for (int i = 0; i < n; i++) {
        tj_val_t v = items.l->v[i];
        if (by >= 0) v = v.l->v[by]; /* dictsort: key 0 or value 1 */
        k[i] = (keyed_t){sort_key(rt, at, v, attr, cs), items.l->v[i], i};
    }
    sort_items(rt, at, k, n, reverse);
    tj_val_t r = tj_list_new(rt, n, L_LIST);
    for (int i = 0; i < n; i++) r.l->v[i] = k[i].item;
    return r;
}

/* select/reject/selectattr/rejectattr: args after the subject (and attribute) name a test and its arguments */
static tj_val_t select_items(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args) {
    bool attr = strstr(name, "attr") != NULL, reject = name[0] == 'r';
    tj_val_t items = tj_iterable(rt, at, args[0]);
    int first = attr ? 2 : 1;
    if (attr && (n < 2 || args[1].k != V_STR)) tj_fail(rt, at, "%s needs an attribute name", name);
    const char *test = NULL;
    if (n > first) {
        if (args[first].k != V_STR) tj_fail(rt, at, "%s: the test must be named by a string", name);
        test = args[first].s->p;
        if (!tj_has_test(test)) tj_fail(rt, at, "%s: no test named '%s'", name, test);
    }
    tj_val_t r = tj_list_new(rt, items.l->n, L_LIST);
    int kept = 0;
    tj_val_t *targs = tj_alloc(&rt->pool, sizeof *targs * (size_t)(n + 1));
    for (int i = 0; i < items.l->n; i++) {
        tj_val_t v = attr ? tj_attr_path(rt, at, items.l->v[i], args[1].s->p) : items.l->v[i];
        bool ok;
        if (test) {
            targs[0] = v;
            for (int k = first + 1; k < n; k++) targs[k - first] = args[k];
            ok = tj_test(rt, at, test, n - first, targs);
        } else {
            ok = tj_truthy(v);
        }
        if (ok != reject) r.l->v[kept++] = items.l->v[i];
    }
    r.l->n = kept;
    return r;
}

static tj_val_t map_items(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw) {
    tj_val_t items = tj_iterable(rt, at, args[0]);
    tj_val_t r = tj_list_new(rt, items.l->n, L_LIST);
    const char *attr = attr_name(rt, at, ARG(1 << 20, "attribute", tj_none()));
    tj_val_t dflt = ARG(1 << 20, "default", tj_undef("no default"));
    if (!attr && (n < 2 || args[1].k != V_STR || kw[1])) tj_fail(rt, at, "map needs attribute= or a filter name");
    for (int i = 0; i < items.l->n; i++) {
        if (attr) {
            tj_val_t v = tj_attr_path(rt, at, items.l->v[i], attr);
            r.l->v[i] = v.k == V_UNDEF && dflt.k != V_UNDEF ? dflt : v;
            continue;
        }
        const char *f = args[1].s->p;
        if (!tj_has_filter(f)) tj_fail(rt, at, "map: no filter named '%s'", f);
        tj_val_t *fa = tj_alloc(&rt->pool, sizeof *fa * (size_t)n);
        const char **fk = tj_alloc(&rt->pool, sizeof *fk * (size_t)n);
        fa[0] = items.l->v[i];
        for (int k = 2; k < n; k++) fa[k - 1] = args[k], fk[k - 1] = kw[k];
        r.l->v[i] = tj_filter(rt, at, f, n - 1, fa, fk);
    }
    return r;
}

static tj_val_t min_max(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw, bool max) {
    tj_val_t items = tj_iterable(rt, at, args[0]);
    bool cs = tj_truthy(ARG(1, "case_sensitive", tj_bool(false)));
    const char *attr = attr_name(rt, at, ARG(2, "attribute", tj_none()));
    if (items.l->n == 0) return tj_undef("the min or max of an empty sequence");
    int best = 0;
    for (int i = 1; i < items.l->n; i++) {
        int c = tj_compare(rt, at, sort_key(rt, at, items.l->v[i], attr, cs), sort_key(rt, at, items.l->v[best], attr, cs));
        if (max ? c > 0 : c < 0) best = i;
    }
    return items.l->v[best];
}

static tj_val_t to_number(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, tj_val_t dflt, bool to_int) {
    double f;
    if (v.k == V_INT || v.k == V_BOOL) f = (double)(v.k == V_INT ? v.i : v.b);
    else if (v.k == V_FLOAT) f = v.f;
    else if (v.k == V_STR) {
        char *end;
        const char *s = v.s->p;
        while (isspace((unsigned char)*s)) s++;
        if (to_int) {
            long long i = strtoll(s, &end, 10);
            while (isspace((unsigned char)*end)) end++;
            if (end != s && !*end) return tj_int(i);
        }
        f = strtod(s, &end);
        while (isspace((unsigned char)*end)) end++;
        if (end == s || *end || (to_int && !isfinite(f))) return dflt;
    } else if (v.k == V_UNDEF) {
        tj_fail(rt, at, "%s", v.undef);
    } else {
        return dflt;
    }
    if (!to_int) return tj_float(f);
    if (v.k == V_INT || v.k == V_BOOL) return tj_int(v.k == V_INT ? v.i : v.b);
    if (!(fabs(f) < 9.2e18)) tj_fail(rt, at, "int: %g out of range", f);
    return tj_int((int64_t)f);
}

static tj_val_t unique(tj_rt_t *rt, const tj_node_t *at, int n, const tj_val_t *args, const char **kw) {
    tj_val_t items = tj_iterable(rt, at, args[0]);
    bool cs = tj_truthy(ARG(1, "case_sensitive", tj_bool(false)));
    const char *attr = attr_name(rt, at, ARG(2, "attribute", tj_none()));
    tj_val_t r = tj_list_new(rt, items.l->n, L_LIST);
    tj_val_t *seen = tj_alloc(&rt->pool, sizeof *seen * (size_t)(items.l->n + 1));
    int kept = 0;
    for (int i = 0; i < items.l->n; i++) {
        tj_val_t key = sort_key(rt, at, items.l->v[i], attr, cs);
        bool dup = false;
        for (int k = 0; k < kept && !dup; k++) dup = tj_equal(seen[k], key);
        if (!dup) seen[kept] = key, r.l->v[kept++] = items.l->v[i];
    }
    r.l->n = kept;
    return r;
}

static tj_val_t title(tj_rt_t *rt, tj_val_t v) {
    tj_str_t *s = tj_to_str(rt, v);
    tj_str_t *r = tj_str_new(&rt->pool, s->p, s->n, s->fl, 0);
    bool start = true;
    for (size_t i = 0; i < r->n; i++) {
        char c = r->p[i];
        bool delim = c == '-' || c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f' ||
                     c == '(' || c == '{' || c == '[' || c == '<';
        if (delim) { start = true; continue; }
        r->p[i] = (char)(start ? toupper((unsigned char)c) : tolower((unsigned char)c));
        start = false;
    }
    return tj_strv(r);
}

static tj_val_t seq_filter(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args,
                           const char **kw) {
    tj_val_t v = args[0];
    if (!strcmp(name, "list")) {
        tj_val_t items = tj_iterable(rt, at, v);
        tj_val_t r = tj_list_new(rt, items.l->n, L_LIST);
        memcpy(r.l->v, items.l->v, sizeof *r.l->v * (size_t)items.l->n);
        return r;
    }
    if (!strcmp(name, "first") || !strcmp(name, "last")) {
        tj_val_t items = tj_iterable(rt, at, v);
        if (!items.l->n) return tj_undef("the first or last item of an empty sequence");
        return items.l->v[name[0] == 'f' ? 0 : items.l->n - 1];
    }
    if (!strcmp(name, "reverse")) {
        if (v.k == V_STR) {
            tj_val_t items = tj_iterable(rt, at, v);
            tj_buf_t buf = {0};
            for (int i = items.l->n - 1; i >= 0; i--) tj_buf_put(rt, &buf, items.l->v[i].s->p, items.l->v[i].s->n, items.l->v[i].s->fl, 0);
            return tj_strv(buf.n ? tj_buf_str(rt, &buf) : tj_str_new(&rt->pool, "", 0, NULL, 0));
        }
        tj_val_t items = tj_iterable(rt, at, v);
        tj_val_t r = tj_list_new(rt, items.l->n, L_LIST);
        for (int i = 0; i < items.l->n; i++) r.l->v[i] = items.l->v[items.l->n - 1 - i];
        return r;
    }
    if (!strcmp(name, "sort")) {
        return sorted(rt, at, tj_iterable(rt, at, v), attr_name(rt, at, ARG(3, "attribute", tj_none())),
                      tj_truthy(ARG(2, "case_sensitive", tj_bool(false))), tj_truthy(ARG(1, "reverse", tj_bool(false))), -1);
    }
    if (!strcmp(name, "dictsort") || !strcmp(name, "items")) {
        if (v.k == V_UNDEF) return tj_list_new(rt, 0, L_LIST);
        if (v.k != V_DICT) tj_fail(rt, at, "%s: expected a dict, got %s", name, tj_type_name(v));
        tj_val_t pairs = tj_list_new(rt, v.d->n, L_LIST);
        for (int i = 0; i < v.d->n; i++) {
            tj_val_t p = tj_list_new(rt, 2, L_TUPLE);
            p.l->v[0] = v.d->keys[i], p.l->v[1] = v.d->vals[i];
            pairs.l->v[i] = p;
        }
        if (name[0] == 'i') return pairs;
        tj_val_t by = ARG(2, "by", tj_none());
        int col = by.k == V_STR && !strcmp(by.s->p, "value") ? 1 : 0;
        return sorted(rt, at, pairs, NULL, tj_truthy(ARG(1, "case_sensitive", tj_bool(false))),
                      tj_truthy(ARG(3, "reverse", tj_bool(false))), col);
    }
    if (!strcmp(name, "sum")) {
        tj_val_t items = tj_iterable(rt, at, v);
        const char *attr = attr_name(rt, at, ARG(1, "attribute", tj_none()));
        tj_val_t acc = ARG(2, "start", tj_int(0));
        for (int i = 0; i < items.l->n; i++)
            acc = tj_binary(rt, at, OP_ADD, acc, attr ? tj_attr_path(rt, at, items.l->v[i], attr) : items.l->v[i]);
        return acc;
    }
    if (!strcmp(name, "min") || !strcmp(name, "max")) return min_max(rt, at, n, args, kw, name[1] == 'a');
    if (!strcmp(name, "unique")) return unique(rt, at, n, args, kw);
    if (!strcmp(name, "map")) return map_items(rt, at, n, args, kw);
    return select_items(rt, at, name, n, args);
}

tj_val_t tj_filter(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args,
                   const char **kw) {
    tj_val_t v = args[0];
    if (!strcmp(name, "default") || !strcmp(name, "d")) {
        bool boolean = tj_truthy(ARG(2, "boolean", tj_bool(false)));
        bool use = v.k == V_UNDEF || (boolean && !tj_truthy(v));
        return use ? ARG(1, "default_value", tj_cstr(rt, "")) : v;
    }
    if (!strcmp(name, "safe")) return v;
    if (!strcmp(name, "tojson")) return tojson(rt, at, n, args, kw);
    if (!strcmp(name, "length") || !strcmp(name, "count")) {
        if (v.k == V_STR) return tj_int((int64_t)tj_utf8_len(v.s->p, v.s->n));
        if (v.k == V_LIST) return tj_int(v.l->n);
        if (v.k == V_DICT && v.sub == D_DICT) return tj_int(v.d->n);
        if (v.k == V_UNDEF) return tj_int(0);
        tj_fail(rt, at, "object of type '%s' has no len()", tj_type_name(v));
    }
    if (!strcmp(name, "string")) return tj_strv(tj_to_str(rt, v));
    if (!strcmp(name, "int")) return to_number(rt, at, v, ARG(1, "default", tj_int(0)), true);
    if (!strcmp(name, "float")) return to_number(rt, at, v, ARG(1, "default", tj_float(0)), false);
    if (!strcmp(name, "abs")) {
        if (v.k == V_INT) return tj_int(v.i < 0 ? -v.i : v.i);
        if (v.k == V_FLOAT) return tj_float(fabs(v.f));
        if (v.k == V_BOOL) return tj_int(v.b);
        tj_fail(rt, at, "bad operand type for abs(): '%s'", tj_type_name(v));
    }
    if (!strcmp(name, "round")) return do_round(rt, at, n, args, kw);
    if (!strcmp(name, "indent")) return indent(rt, at, n, args, kw);
    if (!strcmp(name, "trim")) {
        tj_val_t chars = ARG(1, "chars", tj_none());
        return tj_strip_value(rt, tj_to_str(rt, v), chars.k == V_STR ? chars.s : NULL, true, true);
    }
    if (!strcmp(name, "upper")) return tj_recase(rt, tj_to_str(rt, v), 'u');
    if (!strcmp(name, "lower")) return tj_recase(rt, tj_to_str(rt, v), 'l');
    if (!strcmp(name, "capitalize")) return tj_recase(rt, tj_to_str(rt, v), 'c');
    if (!strcmp(name, "title")) return title(rt, v);
    if (!strcmp(name, "replace")) {
        tj_val_t count = ARG(3, "count", tj_none());
        return tj_replace(rt, at, tj_to_str(rt, v), ARG(1, "old", tj_none()), ARG(2, "new", tj_none()),
                          count.k == V_INT ? count.i : -1);
    }
    if (!strcmp(name, "join")) {
        tj_val_t sep = ARG(1, "d", tj_cstr(rt, ""));
        return tj_join(rt, at, v, tj_to_str(rt, sep), attr_name(rt, at, ARG(2, "attribute", tj_none())));
    }
    if (!strcmp(name, "wordcount")) {
        tj_str_t *s = tj_to_str(rt, v);
        int64_t words = 0;
        bool in = false;
        for (size_t i = 0; i < s->n; i++) {
            unsigned char c = (unsigned char)s->p[i];
            bool w = isalnum(c) || c == '_' || c >= 0x80;
            words += w && !in;
            in = w;
        }
        return tj_int(words);
    }
    return seq_filter(rt, at, name, n, args, kw);
}
