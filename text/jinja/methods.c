/* Python's string and dict methods that templates call
 * (`content.split('</think>')[-1].lstrip('\n')`, `d.get('k', x)`,
 * `d.items()`), jinja2's tests (`is defined`, `is string`...) and the
 * globals transformers adds (raise_exception, strftime_now, namespace,
 * dict) plus jinja2's range.  Case mapping (upper, lower, title) covers
 * ASCII and Latin-1 letters; other letters pass through unchanged. */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text/jinja/internal.h"

tj_val_t tj_arg(const tj_node_t *at, tj_rt_t *rt, int n, const tj_val_t *args, const char **kw, int pos,
                const char *name, tj_val_t dflt) {
    for (int i = 0; i < n; i++)
        if (kw[i] && !strcmp(kw[i], name)) return args[i];
    int p = 0;
    for (int i = 0; i < n; i++) {
        if (kw[i]) continue;
        if (p++ == pos) return args[i];
    }
    (void)at, (void)rt;
    return dflt;
}

static tj_str_t *need_str(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, const char *what) {
    if (v.k == V_STR) return v.s;
    if (v.k == V_UNDEF) tj_fail(rt, at, "%s", v.undef);
    tj_fail(rt, at, "%s must be a string, not %s", what, tj_type_name(v));
}

static bool in_set(char c, const tj_str_t *chars) {
    if (!chars) return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
    return memchr(chars->p, c, chars->n) != NULL;
}

/* str.strip/lstrip/rstrip(chars); chars NULL = whitespace.  Multibyte
 * characters in chars are matched byte by byte, which is exact for the
 * ASCII sets templates pass. */
static tj_str_t *strip(tj_rt_t *rt, const tj_str_t *s, const tj_str_t *chars, bool left, bool right) {
    size_t a = 0, b = s->n;
    while (left && a < b && in_set(s->p[a], chars)) a++;
    while (right && b > a && in_set(s->p[b - 1], chars)) b--;
    return tj_substr(rt, s, a, b - a);
}

tj_val_t tj_strip_value(tj_rt_t *rt, const tj_str_t *s, const tj_str_t *chars, bool left, bool right) {
    return tj_strv(strip(rt, s, chars, left, right));
}

static tj_val_t split(tj_rt_t *rt, const tj_node_t *at, const tj_str_t *s, tj_val_t sepv, int64_t max, bool rev) {
    tj_val_t out = tj_list_new(rt, 0, L_LIST);
    tj_val_t *items = tj_alloc(&rt->pool, sizeof *items * (s->n + 2));
    int n = 0;
    if (sepv.k == V_NONE || sepv.k == V_UNDEF) { /* runs of whitespace, no empty items */
        size_t i = 0;
        size_t end = s->n;
        if (rev) { /* rsplit on whitespace: only the split count differs; collect all then merge */
            int64_t count = 0;
            size_t b = end;
            while (b > 0) {
                while (b > 0 && in_set(s->p[b - 1], NULL)) b--;
                if (!b) break;
                size_t a = b;
                while (a > 0 && !in_set(s->p[a - 1], NULL)) a--;
                if (max >= 0 && count == max) {
                    items[n++] = tj_strv(strip(rt, tj_substr(rt, s, 0, b), NULL, true, false));
                    break;
                }
                items[n++] = tj_strv(tj_substr(rt, s, a, b - a));
                count++;
                b = a;
            }
            for (int k = 0; k < n / 2; k++) {
                tj_val_t t = items[k];
                items[k] = items[n - 1 - k], items[n - 1 - k] = t;
            }
        } else {
            int64_t count = 0;
            while (i < end) {
                while (i < end && in_set(s->p[i], NULL)) i++;
                if (i >= end) break;
                if (max >= 0 && count == max) {
                    items[n++] = tj_strv(strip(rt, tj_substr(rt, s, i, end - i), NULL, false, true));
                    break;
                }
                size_t j = i;
                while (j < end && !in_set(s->p[j], NULL)) j++;
                items[n++] = tj_strv(tj_substr(rt, s, i, j - i));
                count++;
                i = j;
            }
        }
    } else {
        const tj_str_t *sep = need_str(rt, at, sepv, "the separator");
        if (sep->n == 0) tj_fail(rt, at, "empty separator");
        int64_t count = 0;
        if (!rev) {
            size_t i = 0;
            for (;;) {
                const char *hit = (max < 0 || count < max) ? memmem(s->p + i, s->n - i, sep->p, sep->n) : NULL;
                if (!hit) break;
                size_t j = (size_t)(hit - s->p);
                items[n++] = tj_strv(tj_substr(rt, s, i, j - i));
                i = j + sep->n;
                count++;
            }
            items[n++] = tj_strv(tj_substr(rt, s, i, s->n - i));
        } else {
            size_t b = s->n;
            for (;;) {
                size_t hit = SIZE_MAX;
                if (max < 0 || count < max)
                    for (size_t j = b >= sep->n ? b - sep->n + 1 : 0; j-- > 0;)
                        if (memcmp(s->p + j, sep->p, sep->n) == 0) { hit = j; break; }
                if (hit == SIZE_MAX) break;
                items[n++] = tj_strv(tj_substr(rt, s, hit + sep->n, b - hit - sep->n));
                b = hit;
                count++;
            }
            items[n++] = tj_strv(tj_substr(rt, s, 0, b));
            for (int k = 0; k < n / 2; k++) {
                tj_val_t t = items[k];
                items[k] = items[n - 1 - k], items[n - 1 - k] = t;
            }
        }
    }
    out.l->v = items;
    out.l->n = n;
    return out;
}

tj_val_t tj_replace(tj_rt_t *rt, const tj_node_t *at, const tj_str_t *s, tj_val_t oldv, tj_val_t newv, int64_t count) {
    const tj_str_t *old = need_str(rt, at, oldv, "replace()'s first argument");
    const tj_str_t *rep = need_str(rt, at, newv, "replace()'s second argument");
    tj_buf_t b = {0};
    size_t i = 0;
    int64_t done = 0;
    if (old->n == 0) { /* Python inserts rep between every character */
        size_t cps = tj_utf8_len(s->p, s->n);
        for (size_t c = 0; c <= cps; c++) {
            if (count < 0 || done < count) tj_buf_put(rt, &b, rep->p, rep->n, rep->fl, 0), done++;
            if (c == cps) break;
            size_t a = tj_utf8_offset(s->p, s->n, c), e = tj_utf8_offset(s->p, s->n, c + 1);
            tj_buf_put(rt, &b, s->p + a, e - a, s->fl ? s->fl + a : NULL, 0);
        }
        return tj_strv(tj_buf_str(rt, &b));
    }
    for (;;) {
        const char *hit = (count < 0 || done < count) ? memmem(s->p + i, s->n - i, old->p, old->n) : NULL;
        size_t j = hit ? (size_t)(hit - s->p) : s->n;
        tj_buf_put(rt, &b, s->p + i, j - i, s->fl ? s->fl + i : NULL, 0);
        if (!hit) break;
        tj_buf_put(rt, &b, rep->p, rep->n, rep->fl, 0);
        i = j + old->n;
        done++;
    }
    return tj_strv(b.n ? tj_buf_str(rt, &b) : tj_str_new(&rt->pool, "", 0, NULL, 0));
}

/* case mapping of ASCII and Latin-1 letters; mode 'u' upper, 'l' lower, 't' str.title, 'c' capitalize */
tj_val_t tj_recase(tj_rt_t *rt, const tj_str_t *s, char mode) {
    tj_str_t *r = tj_str_new(&rt->pool, s->p, s->n, s->fl, 0);
    bool prev_cased = false;
    for (size_t i = 0; i < r->n; i++) {
        unsigned char c = (unsigned char)r->p[i];
        bool up = mode == 'u' || ((mode == 'c' && i == 0) || (mode == 't' && !prev_cased));
        if (c == 0xC3 && i + 1 < r->n) { /* Latin-1 letters U+00C0..U+00FE: upper and lower differ by 0x20 */
            unsigned char d = (unsigned char)r->p[i + 1];
            bool is_upper = d >= 0x80 && d <= 0x9E && d != 0x97, is_lower = d >= 0xA0 && d <= 0xBE && d != 0xB7;
            if (up && is_lower) r->p[i + 1] = (char)(d - 0x20);
            if (!up && is_upper) r->p[i + 1] = (char)(d + 0x20);
            prev_cased = is_upper || is_lower;
            i++;
            continue;
        }
        bool alpha = isalpha(c);
        r->p[i] = (char)(up ? toupper(c) : tolower(c));
        prev_cased = alpha || (c >= 0x80 && prev_cased);
    }
    return tj_strv(r);
}

static bool prefix_match(tj_rt_t *rt, const tj_node_t *at, const tj_str_t *s, tj_val_t p, bool end) {
    if (p.k == V_LIST && p.sub == L_TUPLE) {
        for (int i = 0; i < p.l->n; i++)
            if (prefix_match(rt, at, s, p.l->v[i], end)) return true;
        return false;
    }
    const tj_str_t *x = need_str(rt, at, p, end ? "endswith()'s argument" : "startswith()'s argument");
    if (x->n > s->n) return false;
    return memcmp(end ? s->p + s->n - x->n : s->p, x->p, x->n) == 0;
}

static int64_t find(const tj_str_t *s, const tj_str_t *x, bool rev) {
    const char *hit = NULL;
    if (!rev) hit = memmem(s->p, s->n, x->p, x->n);
    else
        for (size_t j = s->n >= x->n ? s->n - x->n + 1 : 0; j-- > 0;)
            if (memcmp(s->p + j, x->p, x->n) == 0) { hit = s->p + j; break; }
    return hit ? (int64_t)tj_utf8_len(s->p, (size_t)(hit - s->p)) : -1;
}

/* "{} and {0} and {name}".format(...) with plain fields (no format specs) */
static tj_val_t format(tj_rt_t *rt, const tj_node_t *at, const tj_str_t *s, int n, const tj_val_t *args,
                       const char **kw) {
    tj_buf_t b = {0};
    int next = 0;
    for (size_t i = 0; i < s->n; i++) {
        char c = s->p[i];
        if ((c == '{' || c == '}') && i + 1 < s->n && s->p[i + 1] == c) {
            tj_buf_put(rt, &b, s->p + i, 1, s->fl ? s->fl + i : NULL, 0);
            i++;
            continue;
        }
        if (c != '{') {
            tj_buf_put(rt, &b, s->p + i, 1, s->fl ? s->fl + i : NULL, 0);
            continue;
        }
        const char *close = memchr(s->p + i, '}', s->n - i);
        if (!close) tj_fail(rt, at, "format(): single '{' encountered in format string");
        size_t flen = (size_t)(close - s->p) - i - 1;
        char field[64];
        if (flen >= sizeof field || memchr(s->p + i + 1, ':', flen) || memchr(s->p + i + 1, '!', flen))
            tj_fail(rt, at, "format(): only plain {} fields are supported");
        memcpy(field, s->p + i + 1, flen);
        field[flen] = 0;
        tj_val_t v;
        if (flen == 0) v = tj_arg(at, rt, n, args, kw, next++, "\x01", tj_undef("a missing format argument"));
        else if (isdigit((unsigned char)field[0])) v = tj_arg(at, rt, n, args, kw, atoi(field), "\x01",
                                                               tj_undef("a missing format argument"));
        else v = tj_arg(at, rt, n, args, kw, 1 << 30, field, tj_undef("a missing format argument"));
        if (v.k == V_UNDEF) tj_fail(rt, at, "format(): no argument for field {%s}", field);
        tj_put_str(rt, &b, v);
        i = (size_t)(close - s->p);
    }
    return tj_strv(b.n ? tj_buf_str(rt, &b) : tj_str_new(&rt->pool, "", 0, NULL, 0));
}

static tj_val_t dict_method(tj_rt_t *rt, const tj_node_t *at, tj_val_t self, const char *name, int n,
                            const tj_val_t *args, const char **kw) {
    tj_dict_t *d = self.d;
    if (!strcmp(name, "get")) {
        if (n < 1) tj_fail(rt, at, "get() takes at least 1 argument");
        const tj_val_t *v = tj_dict_get(d, args[0]);
        return v ? *v : n > 1 ? args[1] : tj_none();
    }
    (void)kw;
    bool items = !strcmp(name, "items"), keys = !strcmp(name, "keys");
    tj_val_t r = tj_list_new(rt, d->n, L_LIST);
    for (int i = 0; i < d->n; i++) {
        if (items) {
            tj_val_t pair = tj_list_new(rt, 2, L_TUPLE);
            pair.l->v[0] = d->keys[i], pair.l->v[1] = d->vals[i];
            r.l->v[i] = pair;
        } else {
            r.l->v[i] = keys ? d->keys[i] : d->vals[i];
        }
    }
    return r;
}

tj_val_t tj_call_method(tj_rt_t *rt, const tj_node_t *at, tj_val_t self, const char *name, int n,
                        const tj_val_t *args, const char **kw) {
    if (self.k == V_DICT) return dict_method(rt, at, self, name, n, args, kw);
    const tj_str_t *s = self.s;
    tj_val_t a0 = tj_arg(at, rt, n, args, kw, 0, "\x01", tj_none());
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        const tj_str_t *chars = a0.k == V_NONE ? NULL : need_str(rt, at, a0, "strip()'s argument");
        return tj_strv(strip(rt, s, chars, name[0] != 'r', name[0] != 'l'));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        tj_val_t sep = tj_arg(at, rt, n, args, kw, 0, "sep", tj_none());
        tj_val_t max = tj_arg(at, rt, n, args, kw, 1, "maxsplit", tj_int(-1));
        return split(rt, at, s, sep, max.k == V_INT ? max.i : -1, name[0] == 'r');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith"))
        return tj_bool(prefix_match(rt, at, s, a0, name[0] == 'e'));
    if (!strcmp(name, "replace")) {
        tj_val_t count = tj_arg(at, rt, n, args, kw, 2, "count", tj_int(-1));
        return tj_replace(rt, at, s, a0, tj_arg(at, rt, n, args, kw, 1, "\x01", tj_none()),
                          count.k == V_INT ? count.i : -1);
    }
    if (!strcmp(name, "upper")) return tj_recase(rt, s, 'u');
    if (!strcmp(name, "lower")) return tj_recase(rt, s, 'l');
    if (!strcmp(name, "title")) return tj_recase(rt, s, 't');
    if (!strcmp(name, "capitalize")) return tj_recase(rt, s, 'c');
    if (!strcmp(name, "find") || !strcmp(name, "rfind"))
        return tj_int(find(s, need_str(rt, at, a0, "find()'s argument"), name[0] == 'r'));
    if (!strcmp(name, "count")) {
        const tj_str_t *x = need_str(rt, at, a0, "count()'s argument");
        if (x->n == 0) return tj_int((int64_t)tj_utf8_len(s->p, s->n) + 1);
        int64_t c = 0;
        for (const char *p = s->p; (p = memmem(p, s->n - (size_t)(p - s->p), x->p, x->n)); p += x->n) c++;
        return tj_int(c);
    }
    if (!strcmp(name, "format")) return format(rt, at, s, n, args, kw);
    if (!strcmp(name, "join")) return tj_join(rt, at, a0, s, NULL);
    bool all = s->n > 0;
    for (size_t i = 0; i < s->n; i++)
        all = all && (name[2] == 'd' ? isdigit((unsigned char)s->p[i]) : in_set(s->p[i], NULL));
    return tj_bool(all);
}

tj_val_t tj_join(tj_rt_t *rt, const tj_node_t *at, tj_val_t seq, const tj_str_t *sep, const char *attribute) {
    tj_val_t items = tj_iterable(rt, at, seq);
    tj_buf_t b = {0};
    for (int i = 0; i < items.l->n; i++) {
        if (i && sep) tj_buf_put(rt, &b, sep->p, sep->n, sep->fl, 0);
        tj_put_str(rt, &b, attribute ? tj_attr_path(rt, at, items.l->v[i], attribute) : items.l->v[i]);
    }
    return tj_strv(b.n ? tj_buf_str(rt, &b) : tj_str_new(&rt->pool, "", 0, NULL, 0));
}

/* ---- globals ---- */

static tj_val_t strftime_now(tj_rt_t *rt, const tj_node_t *at, tj_val_t fmt) {
    const tj_str_t *f = need_str(rt, at, fmt, "strftime_now()'s format");
    time_t now = rt->now_set ? rt->now : time(NULL);
    struct tm tm;
    if (rt->now_set) gmtime_r(&now, &tm);
    else localtime_r(&now, &tm);
    char out[512];
    size_t len = strftime(out, sizeof out, f->p, &tm);
    return tj_strv(tj_str_new(&rt->pool, out, len, NULL, 0));
}

tj_val_t tj_call_builtin(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args,
                         const char **kw) {
    if (!strcmp(name, "raise_exception")) {
        tj_val_t msg = n > 0 ? args[0] : tj_undef("no message");
        tj_buf_t b = {0};
        tj_put_str(rt, &b, msg);
        tj_fail(rt, at, "raise_exception: %s", b.n ? b.p : "");
    }
    if (!strcmp(name, "strftime_now")) return strftime_now(rt, at, n > 0 ? args[0] : tj_undef("no format"));
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        bool ns = name[0] == 'n';
        tj_val_t d = tj_dict_new(rt, ns ? D_NS : D_DICT);
        for (int i = 0; i < n; i++) {
            if (!kw[i]) {
                if (args[i].k != V_DICT) tj_fail(rt, at, "%s() takes keyword arguments or a dict", name);
                for (int k = 0; k < args[i].d->n; k++) tj_dict_set(rt, d.d, args[i].d->keys[k], args[i].d->vals[k]);
                continue;
            }
            if (ns && kw[i][0] == '_') tj_fail(rt, at, "cannot store underscore-prefixed attribute '%s' on a namespace", kw[i]);
            tj_dict_set(rt, d.d, tj_cstr(rt, kw[i]), args[i]);
        }
        return d;
    }
    /* range(stop) / range(start, stop[, step]) */
    int64_t b[3] = {0, 0, 1};
    if (n < 1 || n > 3) tj_fail(rt, at, "range() takes 1 to 3 arguments");
    for (int i = 0; i < n; i++) {
        if (args[i].k != V_INT) tj_fail(rt, at, "range() takes integers, not %s", tj_type_name(args[i]));
        b[n == 1 ? 1 : i] = args[i].i;
    }
    if (b[2] == 0) tj_fail(rt, at, "range() arg 3 must not be zero");
    int64_t count = b[2] > 0 ? (b[1] > b[0] ? (b[1] - b[0] + b[2] - 1) / b[2] : 0)
                             : (b[0] > b[1] ? (b[0] - b[1] - b[2] - 1) / -b[2] : 0);
    if (count > 100000) tj_fail(rt, at, "range() of %lld items is more than the 100000 allowed", (long long)count);
    tj_val_t r = tj_list_new(rt, (int)count, L_LIST);
    for (int64_t i = 0; i < count; i++) r.l->v[i] = tj_int(b[0] + i * b[2]);
    return r;
}

/* ---- tests ---- */

static const char *const TESTS[] = {"defined", "undefined", "none", "string", "mapping", "iterable", "sequence",
                                    "number", "integer", "float", "boolean", "true", "false", "equalto", "eq",
                                    "==", "ne", "!=", "sameas", "odd", "even", "divisibleby", "lower", "upper",
                                    "callable", "in", "gt", "lt", "ge", "le", "greaterthan", "lessthan", NULL};

bool tj_has_test(const char *name) {
    for (const char *const *t = TESTS; *t; t++)
        if (!strcmp(*t, name)) return true;
    return false;
}

bool tj_test(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args) {
    tj_val_t v = args[0], o = n > 1 ? args[1] : tj_undef("a missing test argument");
    if (!strcmp(name, "defined")) return v.k != V_UNDEF;
    if (!strcmp(name, "undefined")) return v.k == V_UNDEF;
    if (!strcmp(name, "none")) return v.k == V_NONE;
    if (!strcmp(name, "string")) return v.k == V_STR;
    if (!strcmp(name, "mapping")) return v.k == V_DICT && v.sub == D_DICT;
    if (!strcmp(name, "iterable")) return v.k == V_STR || v.k == V_LIST || (v.k == V_DICT && v.sub == D_DICT) || v.k == V_UNDEF;
    if (!strcmp(name, "sequence")) return v.k == V_STR || v.k == V_LIST || (v.k == V_DICT && v.sub == D_DICT) || v.k == V_UNDEF;
    if (!strcmp(name, "number")) return v.k == V_INT || v.k == V_FLOAT || v.k == V_BOOL;
    if (!strcmp(name, "integer")) return v.k == V_INT;
    if (!strcmp(name, "float")) return v.k == V_FLOAT;
    if (!strcmp(name, "boolean")) return v.k == V_BOOL;
    if (!strcmp(name, "true")) return v.k == V_BOOL && v.b;
    if (!strcmp(name, "false")) return v.k == V_BOOL && !v.b;
    if (!strcmp(name, "callable")) return v.k == V_FUNC;
    if (!strcmp(name, "equalto") || !strcmp(name, "eq") || !strcmp(name, "==")) return tj_equal(v, o);
    if (!strcmp(name, "ne") || !strcmp(name, "!=")) return !tj_equal(v, o);
    if (!strcmp(name, "sameas")) {
        if (v.k != o.k) return false;
        if (v.k == V_NONE || v.k == V_UNDEF) return true;
        if (v.k == V_BOOL) return v.b == o.b;
        if (v.k == V_INT) return v.i == o.i && v.i >= -5 && v.i <= 256; /* CPython's small-int cache */
        return v.k == V_STR ? v.s == o.s : v.k == V_LIST ? v.l == o.l : v.k == V_DICT ? v.d == o.d : v.fn == o.fn;
    }
    if (!strcmp(name, "lower") || !strcmp(name, "upper")) {
        const tj_str_t *s = need_str(rt, at, v, "the tested value");
        bool cased = false;
        for (size_t i = 0; i < s->n; i++) {
            unsigned char c = (unsigned char)s->p[i];
            if (name[0] == 'l' ? isupper(c) : islower(c)) return false;
            cased = cased || isalpha(c);
        }
        return cased;
    }
    if (!strcmp(name, "in")) {
        tj_val_t items = o.k == V_STR ? o : tj_iterable(rt, at, o);
        if (items.k == V_STR) return v.k == V_STR && memmem(items.s->p, items.s->n, v.s->p, v.s->n) != NULL;
        for (int i = 0; i < items.l->n; i++)
            if (tj_equal(items.l->v[i], v)) return true;
        return false;
    }
    if (v.k == V_UNDEF) tj_fail(rt, at, "%s", v.undef);
    if (!strcmp(name, "odd") || !strcmp(name, "even") || !strcmp(name, "divisibleby")) {
        if (v.k != V_INT && v.k != V_BOOL) tj_fail(rt, at, "test '%s' needs an integer, not %s", name, tj_type_name(v));
        int64_t x = v.k == V_INT ? v.i : v.b;
        if (name[0] == 'o') return x % 2 != 0;
        if (name[0] == 'e') return x % 2 == 0;
        if (o.k != V_INT || o.i == 0) tj_fail(rt, at, "divisibleby needs a non-zero integer");
        return x % o.i == 0;
    }
    int c = tj_compare(rt, at, v, o);
    if (!strcmp(name, "gt") || !strcmp(name, "greaterthan")) return c > 0;
    if (!strcmp(name, "lt") || !strcmp(name, "lessthan")) return c < 0;
    if (!strcmp(name, "ge")) return c >= 0;
    return c <= 0;
}
