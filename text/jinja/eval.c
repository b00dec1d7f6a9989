/* Expressions: evaluates a syntax tree node to a value, with the sandboxed
 * jinja2 semantics transformers renders under (access and operators are
 * access.c's).  A missing name is Undefined (it prints empty, is false,
 * iterates as empty and passes `is defined` as false); `and`/`or` return an
 * operand as Python's do; `x if c` without else gives Undefined.  Macro
 * calls go up to the statements through rt->call_macro. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text/jinja/internal.h"

static bool is_intlike(tj_val_t v) { return v.k == V_INT || v.k == V_BOOL; }
static int64_t as_int(tj_val_t v) { return v.k == V_INT ? v.i : v.b; }

tj_val_t tj_lookup(tj_rt_t *rt, tj_frame_t *f, const char *name) {
    for (; f; f = f->parent)
        for (int i = f->n - 1; i >= 0; i--)
            if (strcmp(f->names[i], name) == 0) return f->vals[i];
    size_t n = strlen(name) + 32;
    char *msg = tj_alloc(&rt->pool, n);
    snprintf(msg, n, "'%s' is undefined", name);
    return tj_undef(msg);
}

tj_val_t tj_call(tj_rt_t *rt, const tj_node_t *at, tj_val_t fn, int n, const tj_val_t *args, const char **kw) {
    if (fn.k == V_UNDEF) tj_fail(rt, at, "%s", fn.undef);
    if (fn.k != V_FUNC) tj_fail(rt, at, "'%s' object is not callable", tj_type_name(fn));
    switch (fn.fn->kind) {
    case F_BUILTIN: return tj_call_builtin(rt, at, fn.fn->name, n, args, kw);
    case F_METHOD: return tj_call_method(rt, at, fn.fn->self, fn.fn->name, n, args, kw);
    default: return tj_strv(rt->call_macro(rt, at, fn.fn, n, args, kw));
    }
}

/* the arguments of a call, filter or test node: kids evaluated, with extra
 * leading slots for a subject */
static tj_val_t *eval_args(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *e, int lead, const char ***kw) {
    tj_val_t *args = tj_alloc(&rt->pool, sizeof *args * (size_t)(e->nkids + lead + 1));
    const char **names = tj_alloc(&rt->pool, sizeof *names * (size_t)(e->nkids + lead + 1));
    for (int i = 0; i < e->nkids; i++) {
        args[lead + i] = tj_eval(rt, f, e->kids[i]);
        names[lead + i] = e->names[i];
    }
    *kw = names;
    return args;
}

static tj_val_t eval_compare(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *e) {
    tj_val_t left = tj_eval(rt, f, e->a);
    for (int i = 0; i < e->nkids; i++) {
        tj_val_t right = tj_eval(rt, f, e->kids[i]);
        if (!tj_compare_op(rt, e, e->ops[i], left, right)) return tj_bool(false);
        left = right;
    }
    return tj_bool(true);
}

static tj_val_t eval_seq(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *e) {
    if (e->kind == N_DICT) {
        tj_val_t d = tj_dict_new(rt, D_DICT);
        for (int i = 0; i + 1 < e->nkids; i += 2)
            tj_dict_set(rt, d.d, tj_eval(rt, f, e->kids[i]), tj_eval(rt, f, e->kids[i + 1]));
        return d;
    }
    tj_val_t l = tj_list_new(rt, e->nkids, e->kind == N_TUPLE ? L_TUPLE : L_LIST);
    for (int i = 0; i < e->nkids; i++) l.l->v[i] = tj_eval(rt, f, e->kids[i]);
    return l;
}

tj_val_t tj_eval(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *e) {
    const char **kw;
    tj_val_t *args;
    switch (e->kind) {
    case N_CONST: return e->v;
    case N_NAME: return tj_lookup(rt, f, e->name);
    case N_LIST: case N_TUPLE: case N_DICT: return eval_seq(rt, f, e);
    case N_GETATTR: return tj_getattr(rt, e, tj_eval(rt, f, e->a), e->name);
    case N_GETITEM: {
        tj_val_t obj = tj_eval(rt, f, e->a);
        return tj_getitem(rt, e, obj, tj_eval(rt, f, e->b));
    }
    case N_SLICE: {
        tj_val_t obj = tj_eval(rt, f, e->a), b[3];
        for (int i = 0; i < 3; i++) b[i] = e->kids[i] ? tj_eval(rt, f, e->kids[i]) : tj_none();
        return tj_slice(rt, e, obj, b);
    }
    case N_CALL: {
        tj_val_t fn = tj_eval(rt, f, e->a);
        args = eval_args(rt, f, e, 0, &kw);
        return tj_call(rt, e, fn, e->nkids, args, kw);
    }
    case N_FILTER:
        args = eval_args(rt, f, e, 1, &kw);
        args[0] = tj_eval(rt, f, e->a);
        return tj_filter(rt, e, e->name, e->nkids + 1, args, kw);
    case N_TEST: {
        args = eval_args(rt, f, e, 1, &kw);
        args[0] = tj_eval(rt, f, e->a);
        bool r = tj_test(rt, e, e->name, e->nkids + 1, args);
        return tj_bool(e->op ? !r : r);
    }
    case N_UNARY: {
        tj_val_t v = tj_eval(rt, f, e->a);
        if (v.k == V_FLOAT) return tj_float(e->op == OP_NEG ? -v.f : v.f);
        if (is_intlike(v)) {
            if (e->op == OP_NEG && as_int(v) == INT64_MIN) tj_fail(rt, e, "integer overflow");
            return tj_int(e->op == OP_NEG ? -as_int(v) : as_int(v));
        }
        if (v.k == V_UNDEF) tj_fail(rt, e, "%s", v.undef);
        tj_fail(rt, e, "bad operand type for unary %s: '%s'", e->op == OP_NEG ? "-" : "+", tj_type_name(v));
    }
    case N_BINARY: {
        tj_val_t a = tj_eval(rt, f, e->a);
        return tj_binary(rt, e, e->op, a, tj_eval(rt, f, e->b));
    }
    case N_AND: {
        tj_val_t a = tj_eval(rt, f, e->a);
        return tj_truthy(a) ? tj_eval(rt, f, e->b) : a;
    }
    case N_OR: {
        tj_val_t a = tj_eval(rt, f, e->a);
        return tj_truthy(a) ? a : tj_eval(rt, f, e->b);
    }
    case N_NOT: return tj_bool(!tj_truthy(tj_eval(rt, f, e->a)));
    case N_COMPARE: return eval_compare(rt, f, e);
    case N_COND:
        if (tj_truthy(tj_eval(rt, f, e->b))) return tj_eval(rt, f, e->a);
        return e->c ? tj_eval(rt, f, e->c) : tj_undef("the missing else of a conditional expression");
    default: tj_fail(rt, e, "internal: not an expression (%d)", e->kind);
    }
}
