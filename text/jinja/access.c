/* Access and operators: attribute and item lookup, slices, Python's
 * arithmetic and comparisons, `in`, and what for-in iterates.  Below the
 * evaluator, the filters and the methods, which all use it.
 *
 * Undefined follows jinja2's default Undefined: a missing key or attribute
 * gives a value that prints empty and is false; an attribute of it or
 * arithmetic with it fails the render naming what was undefined.  On a dict,
 * `d.name` looks for a method first (items, keys, values, get) then a key;
 * `d['k']` the key first. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith",
                                          "replace", "upper", "lower", "title", "capitalize", "find", "rfind",
                                          "count", "format", "join", "isdigit", "isspace", NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};

bool tj_has_method(tj_val_t obj, const char *name) {
    const char *const *m = obj.k == V_STR ? STR_METHODS : obj.k == V_DICT && obj.sub == D_DICT ? DICT_METHODS : NULL;
    for (; m && *m; m++)
        if (!strcmp(*m, name)) return true;
    return false;
}

static tj_val_t missing(tj_rt_t *rt, tj_val_t obj, const char *name) {
    size_t n = strlen(name) + 64;
    char *msg = tj_alloc(&rt->pool, n);
    snprintf(msg, n, "'%s object' has no attribute '%s'", tj_type_name(obj), name);
    return tj_undef(msg);
}

static tj_val_t method(tj_rt_t *rt, tj_val_t self, const char *name) {
    tj_func_t *fn = tj_alloc(&rt->pool, sizeof *fn);
    fn->kind = F_METHOD;
    fn->name = name;
    fn->self = self;
    return (tj_val_t){.k = V_FUNC, .fn = fn};
}

tj_val_t tj_getattr(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, const char *name) {
    if (obj.k == V_UNDEF) tj_fail(rt, at, "%s", obj.undef);
    if (obj.k == V_DICT) {
        if (obj.sub == D_DICT && tj_has_method(obj, name)) return method(rt, obj, name);
        const tj_val_t *v = tj_dict_gets(obj.d, name);
        return v ? *v : missing(rt, obj, name);
    }
    if (tj_has_method(obj, name)) return method(rt, obj, name);
    return missing(rt, obj, name);
}

/* Python's index normalisation for a sequence of n items */
static bool norm_index(int64_t *i, int64_t n) {
    if (*i < 0) *i += n;
    return *i >= 0 && *i < n;
}

tj_val_t tj_getitem(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, tj_val_t key) {
    if (obj.k == V_UNDEF) tj_fail(rt, at, "%s", obj.undef);
    bool int_key = key.k == V_INT || key.k == V_BOOL;
    int64_t i = key.k == V_INT ? key.i : key.k == V_BOOL ? key.b : 0;
    if (obj.k == V_DICT) {
        const tj_val_t *v = tj_dict_get(obj.d, key);
        if (v) return *v;
        if (key.k == V_STR) return tj_getattr(rt, at, obj, key.s->p);
        return tj_undef("a missing key");
    }
    if (obj.k == V_LIST && int_key) {
        if (norm_index(&i, obj.l->n)) return obj.l->v[i];
        return tj_undef("an index out of range");
    }
    if (obj.k == V_STR && int_key) {
        int64_t n = (int64_t)tj_utf8_len(obj.s->p, obj.s->n);
        if (!norm_index(&i, n)) return tj_undef("an index out of range");
        size_t a = tj_utf8_offset(obj.s->p, obj.s->n, (size_t)i), b = tj_utf8_offset(obj.s->p, obj.s->n, (size_t)i + 1);
        return tj_strv(tj_substr(rt, obj.s, a, b - a));
    }
    if (key.k == V_STR) return tj_getattr(rt, at, obj, key.s->p);
    return tj_undef("an item of a value that has none");
}

static int64_t slice_bound(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, int64_t dflt) {
    if (v.k == V_NONE || v.k == V_UNDEF) return dflt;
    if (v.k == V_INT) return v.i;
    if (v.k == V_BOOL) return v.b;
    tj_fail(rt, at, "slice indices must be integers or None, not %s", tj_type_name(v));
}

/* Python's PySlice_AdjustIndices: fills the chosen indices of a sequence of n */
static int64_t slice_indices(tj_rt_t *rt, const tj_node_t *at, const tj_val_t b[3], int64_t n, int64_t *idx) {
    int64_t step = slice_bound(rt, at, b[2], 1);
    if (step == 0) tj_fail(rt, at, "slice step cannot be zero");
    int64_t lo = step < 0 ? -1 : 0, hi = step < 0 ? n - 1 : n;
    int64_t start = slice_bound(rt, at, b[0], step < 0 ? hi : lo);
    int64_t stop = slice_bound(rt, at, b[1], step < 0 ? lo : hi);
    if (b[0].k == V_INT || b[0].k == V_BOOL) {
        if (start < 0) start += n;
        start = start < lo ? lo : start > hi ? hi : start;
    }
    if (b[1].k == V_INT || b[1].k == V_BOOL) {
        if (stop < 0) stop += n;
        stop = stop < lo ? lo : stop > hi ? hi : stop;
    }
    int64_t count = 0;
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) idx[count++] = i;
    return count;
}

tj_val_t tj_slice(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, const tj_val_t b[3]) {
    if (obj.k == V_UNDEF) tj_fail(rt, at, "%s", obj.undef);
    if (obj.k == V_LIST) {
        int64_t *idx = tj_alloc(&rt->pool, sizeof *idx * (size_t)(obj.l->n + 1));
        int64_t count = slice_indices(rt, at, b, obj.l->n, idx);
        tj_val_t r = tj_list_new(rt, (int)count, obj.sub);
        for (int64_t i = 0; i < count; i++) r.l->v[i] = obj.l->v[idx[i]];
        return r;
    }
    if (obj.k == V_STR) {
        int64_t n = (int64_t)tj_utf8_len(obj.s->p, obj.s->n);
        int64_t *idx = tj_alloc(&rt->pool, sizeof *idx * (size_t)(n + 1));
        int64_t count = slice_indices(rt, at, b, n, idx);
        tj_buf_t out = {0};
        for (int64_t i = 0; i < count; i++) {
            size_t a = tj_utf8_offset(obj.s->p, obj.s->n, (size_t)idx[i]);
            size_t e = tj_utf8_offset(obj.s->p, obj.s->n, (size_t)idx[i] + 1);
            tj_buf_put(rt, &out, obj.s->p + a, e - a, obj.s->fl ? obj.s->fl + a : NULL, 0);
        }
        return tj_strv(count ? tj_buf_str(rt, &out) : tj_str_new(&rt->pool, "", 0, NULL, 0));
    }
    tj_fail(rt, at, "'%s' object is not subscriptable", tj_type_name(obj));
}

static void check_defined(tj_rt_t *rt, const tj_node_t *at, tj_val_t a, tj_val_t b) {
    if (a.k == V_UNDEF) tj_fail(rt, at, "%s", a.undef);
    if (b.k == V_UNDEF) tj_fail(rt, at, "%s", b.undef);
}

static bool is_intlike(tj_val_t v) { return v.k == V_INT || v.k == V_BOOL; }
static int64_t as_int(tj_val_t v) { return v.k == V_INT ? v.i : v.b; }
static double as_num(tj_val_t v) { return v.k == V_FLOAT ? v.f : (double)as_int(v); }

static tj_val_t repeat(tj_rt_t *rt, const tj_node_t *at, tj_val_t seq, int64_t times) {
    if (times < 0) times = 0;
    if (seq.k == V_STR) {
        if (seq.s->n && (size_t)times > TJ_MAX_OUTPUT / seq.s->n) tj_fail(rt, at, "a repeated string too long");
        tj_buf_t b = {0};
        for (int64_t i = 0; i < times; i++) tj_buf_put(rt, &b, seq.s->p, seq.s->n, seq.s->fl, 0);
        return tj_strv(b.n ? tj_buf_str(rt, &b) : tj_str_new(&rt->pool, "", 0, NULL, 0));
    }
    if (seq.l->n && times > TJ_MAX_ITERATIONS / seq.l->n) tj_fail(rt, at, "a repeated list too long");
    tj_val_t r = tj_list_new(rt, (int)(seq.l->n * times), seq.sub);
    for (int64_t i = 0; i < times; i++)
        memcpy(r.l->v + i * seq.l->n, seq.l->v, sizeof *r.l->v * (size_t)seq.l->n);
    return r;
}

static tj_val_t arith(tj_rt_t *rt, const tj_node_t *at, int op, tj_val_t a, tj_val_t b) {
    static const char *const names[] = {"", "+", "-", "*", "/", "//", "%", "**"};
    bool nums = (is_intlike(a) || a.k == V_FLOAT) && (is_intlike(b) || b.k == V_FLOAT);
    if (!nums)
        tj_fail(rt, at, "unsupported operand type(s) for %s: '%s' and '%s'", names[op], tj_type_name(a),
                tj_type_name(b));
    bool ints = is_intlike(a) && is_intlike(b);
    int64_t x = ints ? as_int(a) : 0, y = ints ? as_int(b) : 0, r;
    double fx = as_num(a), fy = as_num(b);
    if ((op == OP_DIV || op == OP_FLOORDIV || op == OP_MOD) && fy == 0)
        tj_fail(rt, at, "division by zero");
    switch (op) {
    case OP_ADD:
        if (!ints) return tj_float(fx + fy);
        if (__builtin_add_overflow(x, y, &r)) tj_fail(rt, at, "integer overflow");
        return tj_int(r);
    case OP_SUB:
        if (!ints) return tj_float(fx - fy);
        if (__builtin_sub_overflow(x, y, &r)) tj_fail(rt, at, "integer overflow");
        return tj_int(r);
    case OP_MUL:
        if (!ints) return tj_float(fx * fy);
        if (__builtin_mul_overflow(x, y, &r)) tj_fail(rt, at, "integer overflow");
        return tj_int(r);
    case OP_DIV: return tj_float(fx / fy);
    case OP_FLOORDIV:
        if (ints) {
            if (x == INT64_MIN && y == -1) tj_fail(rt, at, "integer overflow");
            r = x / y;
            return tj_int((x % y != 0 && ((x < 0) != (y < 0))) ? r - 1 : r);
        }
        return tj_float(floor(fx / fy));
    case OP_MOD:
        if (ints) {
            if (y == -1) return tj_int(0);
            r = x % y;
            return tj_int(r != 0 && ((r < 0) != (y < 0)) ? r + y : r);
        } else {
            double m = fmod(fx, fy);
            return tj_float(m != 0 && ((m < 0) != (fy < 0)) ? m + fy : m);
        }
    default: /* OP_POW */
        if (ints && y >= 0) {
            int64_t acc = 1;
            for (int64_t k = 0; k < y; k++)
                if (__builtin_mul_overflow(acc, x, &acc)) tj_fail(rt, at, "integer overflow");
            return tj_int(acc);
        }
        return tj_float(pow(fx, fy));
    }
}

tj_val_t tj_binary(tj_rt_t *rt, const tj_node_t *at, int op, tj_val_t a, tj_val_t b) {
    if (op == OP_CONCAT) {
        tj_buf_t buf = {0};
        tj_put_str(rt, &buf, a);
        tj_put_str(rt, &buf, b);
        return tj_strv(tj_buf_str(rt, &buf));
    }
    check_defined(rt, at, a, b);
    if (op == OP_ADD && a.k == V_STR && b.k == V_STR) {
        tj_buf_t buf = {0};
        tj_buf_put(rt, &buf, a.s->p, a.s->n, a.s->fl, 0);
        tj_buf_put(rt, &buf, b.s->p, b.s->n, b.s->fl, 0);
        return tj_strv(tj_buf_str(rt, &buf));
    }
    if (op == OP_ADD && a.k == V_LIST && b.k == V_LIST && a.sub == b.sub) {
        tj_val_t r = tj_list_new(rt, a.l->n + b.l->n, a.sub);
        memcpy(r.l->v, a.l->v, sizeof *r.l->v * (size_t)a.l->n);
        memcpy(r.l->v + a.l->n, b.l->v, sizeof *r.l->v * (size_t)b.l->n);
        return r;
    }
    if (op == OP_MUL && (a.k == V_STR || a.k == V_LIST) && is_intlike(b)) return repeat(rt, at, a, as_int(b));
    if (op == OP_MUL && (b.k == V_STR || b.k == V_LIST) && is_intlike(a)) return repeat(rt, at, b, as_int(a));
    return arith(rt, at, op, a, b);
}

static bool contains(tj_rt_t *rt, const tj_node_t *at, tj_val_t hay, tj_val_t needle) {
    if (hay.k == V_STR) {
        if (needle.k != V_STR) tj_fail(rt, at, "'in <string>' requires string as left operand, not %s",
                                       tj_type_name(needle));
        return needle.s->n == 0 || memmem(hay.s->p, hay.s->n, needle.s->p, needle.s->n) != NULL;
    }
    if (hay.k == V_LIST) {
        for (int i = 0; i < hay.l->n; i++)
            if (tj_equal(hay.l->v[i], needle)) return true;
        return false;
    }
    if (hay.k == V_DICT) return tj_dict_get(hay.d, needle) != NULL;
    if (hay.k == V_UNDEF) return false;
    tj_fail(rt, at, "argument of type '%s' is not iterable", tj_type_name(hay));
}

bool tj_compare_op(tj_rt_t *rt, const tj_node_t *at, int op, tj_val_t a, tj_val_t b) {
    switch (op) {
    case OP_EQ: return tj_equal(a, b);
    case OP_NE: return !tj_equal(a, b);
    case OP_IN: return contains(rt, at, b, a);
    case OP_NOTIN: return !contains(rt, at, b, a);
    default: break;
    }
    int c = tj_compare(rt, at, a, b);
    return op == OP_LT ? c < 0 : op == OP_LE ? c <= 0 : op == OP_GT ? c > 0 : c >= 0;
}

tj_val_t tj_iterable(tj_rt_t *rt, const tj_node_t *at, tj_val_t v) {
    if (v.k == V_LIST) return v;
    if (v.k == V_UNDEF) return tj_list_new(rt, 0, L_LIST);
    if (v.k == V_DICT && v.sub == D_DICT) {
        tj_val_t r = tj_list_new(rt, v.d->n, L_LIST);
        memcpy(r.l->v, v.d->keys, sizeof *r.l->v * (size_t)v.d->n);
        return r;
    }
    if (v.k == V_STR) {
        size_t n = tj_utf8_len(v.s->p, v.s->n);
        tj_val_t r = tj_list_new(rt, (int)n, L_LIST);
        for (size_t i = 0, off = 0; i < n; i++) {
            size_t end = tj_utf8_offset(v.s->p, v.s->n, i + 1);
            r.l->v[i] = tj_strv(tj_substr(rt, v.s, off, end - off));
            off = end;
        }
        return r;
    }
    tj_fail(rt, at, "'%s' object is not iterable", tj_type_name(v));
}

/* jinja2's make_attrgetter: a dotted path, digits as indices */
tj_val_t tj_attr_path(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, const char *path) {
    char part[256];
    while (*path) {
        size_t len = strcspn(path, ".");
        if (len >= sizeof part) tj_fail(rt, at, "attribute path too long");
        memcpy(part, path, len);
        part[len] = 0;
        bool digits = len > 0;
        for (size_t i = 0; i < len; i++) digits = digits && isdigit((unsigned char)part[i]);
        tj_val_t key = digits ? tj_int(atoll(part)) : tj_cstr(rt, part);
        v = tj_getitem(rt, at, v, key);
        path += len + (path[len] == '.');
    }
    return v;
}

