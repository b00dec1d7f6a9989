/* The parser: tokens into a syntax tree, with jinja2's grammar and operator
 * precedence (lowest first):
 *
 *   x if c else y  <  or  <  and  <  not  <  comparisons, in, not in
 *   <  + -  <  ~  <  * / // %  <  **  <  unary - +  <  filters |f, tests is t
 *   <  postfix . [] ()  <  literals, names, ( ) [ ] { }
 *
 * Filters bind tighter than every binary operator (`a ~ b|upper` upper-cases
 * b alone) and a unary minus is inside them (`-x|abs` is abs(-x)), as in
 * jinja2.  Tags other than the ones chat templates use are refused by name. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "text/jinja/internal.h"

typedef struct {
    tj_pool_t *pool;
    const tj_token_t *t;
    int n, i, depth;
    const char *origin;
    mt_error_t *err;
    jmp_buf *jb;
} parser_t;

__attribute__((noreturn, format(printf, 2, 3))) static void fail(parser_t *ps, const char *fmt, ...) {
    const tj_token_t *t = &ps->t[ps->i];
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    mt_error_set(ps->err, MT_ERR_FORMAT, "%s:%d:%d: %s", ps->origin, t->line, t->col, msg);
    longjmp(*ps->jb, 1);
}

static const tj_token_t *cur(parser_t *ps) { return &ps->t[ps->i]; }
static const tj_token_t *peek(parser_t *ps, int k) { return &ps->t[ps->i + k < ps->n ? ps->i + k : ps->n - 1]; }
static void next(parser_t *ps) {
    if (ps->i < ps->n - 1) ps->i++;
}
static bool is_op(const tj_token_t *t, const char *op) { return t->kind == T_OP && strcmp(t->s, op) == 0; }
static bool is_name(const tj_token_t *t, const char *name) { return t->kind == T_NAME && strcmp(t->s, name) == 0; }

static const char *describe(const tj_token_t *t) {
    switch (t->kind) {
    case T_EOF: return "end of template";
    case T_DATA: return "template text";
    case T_VAR_BEGIN: return "'{{'";
    case T_VAR_END: return "'}}'";
    case T_BLOCK_BEGIN: return "'{%'";
    case T_BLOCK_END: return "'%}'";
    case T_STRING: return "a string";
    case T_INT: case T_FLOAT: return "a number";
    default: return t->s;
    }
}

static void expect_op(parser_t *ps, const char *op) {
    if (!is_op(cur(ps), op)) fail(ps, "expected '%s', got %s", op, describe(cur(ps)));
    next(ps);
}
static const char *expect_name(parser_t *ps, const char *what) {
    if (cur(ps)->kind != T_NAME) fail(ps, "expected %s, got %s", what, describe(cur(ps)));
    const char *s = cur(ps)->s;
    next(ps);
    return s;
}
static void expect_kind(parser_t *ps, tj_tkind_t k, const char *what) {
    if (cur(ps)->kind != k) fail(ps, "expected %s, got %s", what, describe(cur(ps)));
    next(ps);
}

static tj_node_t *node(parser_t *ps, tj_nkind_t kind) {
    tj_node_t *n = tj_alloc(ps->pool, sizeof *n);
    n->kind = (uint8_t)kind;
    n->line = cur(ps)->line;
    n->col = cur(ps)->col;
    return n;
}

/* appends kid (and its keyword name, when names is used) to n */
static void add_kid(parser_t *ps, tj_node_t *n, tj_node_t *kid, const char *kw) {
    if ((n->nkids & (n->nkids - 1)) == 0) { /* capacity doubles at powers of two */
        int cap = n->nkids ? n->nkids * 2 : 1;
        tj_node_t **k = tj_alloc(ps->pool, sizeof *k * (size_t)cap);
        const char **nm = tj_alloc(ps->pool, sizeof *nm * (size_t)cap);
        int *ops = tj_alloc(ps->pool, sizeof *ops * (size_t)cap);
        if (n->nkids) {
            memcpy(k, n->kids, sizeof *k * (size_t)n->nkids);
            memcpy(nm, n->names, sizeof *nm * (size_t)n->nkids);
            memcpy(ops, n->ops, sizeof *ops * (size_t)n->nkids);
        }
        n->kids = k, n->names = nm, n->ops = ops;
    }
    n->names[n->nkids] = kw;
    n->kids[n->nkids++] = kid;
}

static tj_node_t *parse_expr(parser_t *ps);
static tj_node_t *parse_or(parser_t *ps);
static tj_node_t *parse_unary(parser_t *ps, bool with_filter);

static void enter(parser_t *ps) {
    if (++ps->depth > TJ_MAX_PARSE_DEPTH) fail(ps, "nested deeper than %d levels", TJ_MAX_PARSE_DEPTH);
}

/* (a, b=c, ...) after the '(' was seen; fills n's kids and names */
static void parse_args(parser_t *ps, tj_node_t *n) {
    expect_op(ps, "(");
    while (!is_op(cur(ps), ")")) {
        if (n->nkids) expect_op(ps, ",");
        if (is_op(cur(ps), ")")) break;
        const char *kw = NULL;
        if (cur(ps)->kind == T_NAME && is_op(peek(ps, 1), "=")) {
            kw = cur(ps)->s;
            next(ps), next(ps);
        } else if (n->nkids && n->names[n->nkids - 1]) {
            fail(ps, "a positional argument after a keyword argument");
        }
        add_kid(ps, n, parse_expr(ps), kw);
    }
    next(ps);
}

static tj_node_t *parse_const(parser_t *ps, tj_val_t v) {
    tj_node_t *n = node(ps, N_CONST);
    n->v = v;
    next(ps);
    return n;
}

static tj_node_t *parse_seq(parser_t *ps, tj_nkind_t kind, const char *close) {
    tj_node_t *n = node(ps, kind);
    next(ps);
    while (!is_op(cur(ps), close)) {
        if (n->nkids) expect_op(ps, ",");
        if (is_op(cur(ps), close)) break;
        add_kid(ps, n, parse_expr(ps), NULL);
        if (kind == N_DICT) {
            expect_op(ps, ":");
            add_kid(ps, n, parse_expr(ps), NULL);
        }
    }
    next(ps);
    return n;
}

static tj_node_t *parse_primary(parser_t *ps) {
    const tj_token_t *t = cur(ps);
    if (t->kind == T_NAME) {
        const char *s = t->s;
        if (!strcmp(s, "true") || !strcmp(s, "True")) return parse_const(ps, tj_bool(true));
        if (!strcmp(s, "false") || !strcmp(s, "False")) return parse_const(ps, tj_bool(false));
        if (!strcmp(s, "none") || !strcmp(s, "None")) return parse_const(ps, tj_none());
        tj_node_t *n = node(ps, N_NAME);
        n->name = s;
        next(ps);
        return n;
    }
    if (t->kind == T_STRING) { /* adjacent literals concatenate */
        tj_node_t *n = node(ps, N_CONST);
        size_t len = 0;
        for (int k = ps->i; ps->t[k].kind == T_STRING; k++) len += ps->t[k].n;
        tj_str_t *s = tj_str_new(ps->pool, NULL, len, NULL, 0);
        len = 0;
        for (; cur(ps)->kind == T_STRING; next(ps)) {
            memcpy(s->p + len, cur(ps)->s, cur(ps)->n);
            len += cur(ps)->n;
        }
        n->v = tj_strv(s);
        return n;
    }
    if (t->kind == T_INT) return parse_const(ps, tj_int(t->i));
    if (t->kind == T_FLOAT) return parse_const(ps, tj_float(t->f));
    if (is_op(t, "(")) {
        tj_node_t *tup = node(ps, N_TUPLE);
        next(ps);
        if (is_op(cur(ps), ")")) {
            next(ps);
            return tup;
        }
        tj_node_t *first = parse_expr(ps);
        if (is_op(cur(ps), ")")) {
            next(ps);
            return first;
        }
        add_kid(ps, tup, first, NULL);
        while (is_op(cur(ps), ",")) {
            next(ps);
            if (is_op(cur(ps), ")")) break;
            add_kid(ps, tup, parse_expr(ps), NULL);
        }
        expect_op(ps, ")");
        return tup;
    }
    if (is_op(t, "[")) return parse_seq(ps, N_LIST, "]");
    if (is_op(t, "{")) return parse_seq(ps, N_DICT, "}");
    fail(ps, "expected an expression, got %s", describe(t));
}

static tj_node_t *parse_subscript(parser_t *ps, tj_node_t *obj) {
    tj_node_t *n = node(ps, N_GETITEM);
    next(ps);
    tj_node_t *parts[3] = {NULL, NULL, NULL};
    int k = 0;
    for (;;) {
        if (!is_op(cur(ps), ":") && !is_op(cur(ps), "]")) parts[k] = parse_expr(ps);
        if (is_op(cur(ps), ":") && k < 2) {
            k++;
            next(ps);
            continue;
        }
        break;
    }
    expect_op(ps, "]");
    n->a = obj;
    if (k == 0) {
        if (!parts[0]) fail(ps, "expected a subscript");
        n->b = parts[0];
        return n;
    }
    n->kind = N_SLICE;
    for (int j = 0; j < 3; j++) add_kid(ps, n, parts[j], NULL);
    return n;
}

static tj_node_t *parse_postfix(parser_t *ps, tj_node_t *e) {
    for (;;) {
        if (is_op(cur(ps), ".")) {
            tj_node_t *n = node(ps, N_GETATTR);
            next(ps);
            n->a = e;
            if (cur(ps)->kind == T_INT) {
                n->kind = N_GETITEM;
                n->b = parse_const(ps, tj_int(cur(ps)->i));
            } else {
                n->name = expect_name(ps, "an attribute name after '.'");
            }
            e = n;
        } else if (is_op(cur(ps), "[")) {
            e = parse_subscript(ps, e);
        } else if (is_op(cur(ps), "(")) {
            tj_node_t *n = node(ps, N_CALL);
            n->line = e->line, n->col = e->col; /* a call is reported where its callee starts */
            n->a = e;
            parse_args(ps, n);
            e = n;
        } else {
            return e;
        }
    }
}

static tj_node_t *parse_filter_or_test(parser_t *ps, tj_node_t *e) {
    for (;;) {
        if (is_op(cur(ps), "|")) {
            tj_node_t *n = node(ps, N_FILTER);
            next(ps);
            n->a = e;
            if (cur(ps)->kind == T_NAME && !tj_has_filter(cur(ps)->s)) fail(ps, "no filter named '%s'", cur(ps)->s);
            n->name = expect_name(ps, "a filter name after '|'");
            if (is_op(cur(ps), "(")) parse_args(ps, n);
            e = n;
        } else if (is_name(cur(ps), "is")) {
            tj_node_t *n = node(ps, N_TEST);
            next(ps);
            n->a = e;
            if (is_name(cur(ps), "not")) n->op = 1, next(ps);
            if (cur(ps)->kind == T_NAME && !tj_has_test(cur(ps)->s)) fail(ps, "no test named '%s'", cur(ps)->s);
            n->name = expect_name(ps, "a test name after 'is'");
            const tj_token_t *t = cur(ps);
            if (is_op(t, "(")) {
                parse_args(ps, n);
            } else if ((t->kind == T_NAME || t->kind == T_STRING || t->kind == T_INT || t->kind == T_FLOAT ||
                        is_op(t, "[") || is_op(t, "{")) &&
                       !is_name(t, "else") && !is_name(t, "or") && !is_name(t, "and") && !is_name(t, "if")) {
                if (is_name(t, "is")) fail(ps, "tests cannot be chained with 'is'");
                add_kid(ps, n, parse_postfix(ps, parse_primary(ps)), NULL);
            }
            e = n;
        } else {
            return e;
        }
    }
}

static tj_node_t *parse_unary(parser_t *ps, bool with_filter) {
    enter(ps);
    tj_node_t *e;
    if (is_op(cur(ps), "-") || is_op(cur(ps), "+")) {
        e = node(ps, N_UNARY);
        e->op = is_op(cur(ps), "-") ? OP_NEG : OP_POS;
        next(ps);
        e->a = parse_unary(ps, false);
    } else {
        e = parse_primary(ps);
    }
    e = parse_postfix(ps, e);
    if (with_filter) e = parse_filter_or_test(ps, e);
    ps->depth--;
    return e;
}

static tj_node_t *binary(parser_t *ps, int op, tj_node_t *a, tj_node_t *b) {
    tj_node_t *n = tj_alloc(ps->pool, sizeof *n);
    n->kind = N_BINARY;
    n->op = op;
    n->line = a->line, n->col = a->col;
    n->a = a, n->b = b;
    return n;
}

static tj_node_t *parse_pow(parser_t *ps) {
    tj_node_t *e = parse_unary(ps, true);
    while (is_op(cur(ps), "**")) {
        next(ps);
        e = binary(ps, OP_POW, e, parse_unary(ps, true));
    }
    return e;
}

static tj_node_t *parse_math2(parser_t *ps) {
    tj_node_t *e = parse_pow(ps);
    for (;;) {
        int op = is_op(cur(ps), "*") ? OP_MUL : is_op(cur(ps), "/") ? OP_DIV
               : is_op(cur(ps), "//") ? OP_FLOORDIV : is_op(cur(ps), "%") ? OP_MOD : 0;
        if (!op) return e;
        next(ps);
        e = binary(ps, op, e, parse_pow(ps));
    }
}

static tj_node_t *parse_concat(parser_t *ps) {
    tj_node_t *e = parse_math2(ps);
    while (is_op(cur(ps), "~")) {
        next(ps);
        e = binary(ps, OP_CONCAT, e, parse_math2(ps));
    }
    return e;
}

static tj_node_t *parse_math1(parser_t *ps) {
    tj_node_t *e = parse_concat(ps);
    for (;;) {
        int op = is_op(cur(ps), "+") ? OP_ADD : is_op(cur(ps), "-") ? OP_SUB : 0;
        if (!op) return e;
        next(ps);
        e = binary(ps, op, e, parse_concat(ps));
    }
}

static int compare_op(parser_t *ps) {
    static const char *const ops[] = {"==", "!=", "<", "<=", ">", ">="};
    static const int codes[] = {OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE};
    for (int k = 0; k < 6; k++)
        if (is_op(cur(ps), ops[k])) return next(ps), codes[k];
    if (is_name(cur(ps), "in")) return next(ps), OP_IN;
    if (is_name(cur(ps), "not") && is_name(peek(ps, 1), "in")) return next(ps), next(ps), OP_NOTIN;
    return 0;
}

static tj_node_t *parse_compare(parser_t *ps) {
    tj_node_t *e = parse_math1(ps);
    tj_node_t *cmp = NULL;
    int op;
    while ((op = compare_op(ps))) {
        if (!cmp) {
            cmp = node(ps, N_COMPARE);
            cmp->line = e->line, cmp->col = e->col;
            cmp->a = e;
        }
        add_kid(ps, cmp, parse_math1(ps), NULL);
        cmp->ops[cmp->nkids - 1] = op;
    }
    return cmp ? cmp : e;
}

static tj_node_t *parse_not(parser_t *ps) {
    if (is_name(cur(ps), "not")) {
        enter(ps);
        tj_node_t *n = node(ps, N_NOT);
        next(ps);
        n->a = parse_not(ps);
        ps->depth--;
        return n;
    }
    return parse_compare(ps);
}

static tj_node_t *parse_and(parser_t *ps) {
    tj_node_t *e = parse_not(ps);
    while (is_name(cur(ps), "and")) {
        next(ps);
        tj_node_t *n = binary(ps, 0, e, parse_not(ps));
        n->kind = N_AND;
        e = n;
    }
    return e;
}

static tj_node_t *parse_or(parser_t *ps) {
    tj_node_t *e = parse_and(ps);
    while (is_name(cur(ps), "or")) {
        next(ps);
        tj_node_t *n = binary(ps, 0, e, parse_and(ps));
        n->kind = N_OR;
        e = n;
    }
    return e;
}

static tj_node_t *parse_expr(parser_t *ps) {
    enter(ps);
    tj_node_t *e = parse_or(ps);
    if (is_name(cur(ps), "if")) {
        tj_node_t *n = node(ps, N_COND);
        next(ps);
        n->a = e;
        n->b = parse_or(ps);
        if (is_name(cur(ps), "else")) {
            next(ps);
            n->c = parse_expr(ps);
        }
        e = n;
    }
    ps->depth--;
    return e;
}

/* a, b, c without brackets: a tuple when there is a comma (`{{ a, b }}`, `set x = 1, 2`) */
static tj_node_t *parse_tuple(parser_t *ps, bool condexpr) {
    tj_node_t *first = condexpr ? parse_expr(ps) : parse_or(ps);
    if (!is_op(cur(ps), ",")) return first;
    tj_node_t *t = node(ps, N_TUPLE);
    t->line = first->line, t->col = first->col;
    add_kid(ps, t, first, NULL);
    while (is_op(cur(ps), ",")) {
        next(ps);
        if (cur(ps)->kind == T_BLOCK_END || cur(ps)->kind == T_VAR_END || is_name(cur(ps), "in")) break;
        add_kid(ps, t, condexpr ? parse_expr(ps) : parse_or(ps), NULL);
    }
    return t;
}

/* ---- statements ---- */

static tj_node_t *parse_body(parser_t *ps, const char *const *ends);

static void end_tag(parser_t *ps) { expect_kind(ps, T_BLOCK_END, "'%}'"); }

/* names separated by commas, optionally in parentheses: for-loop and set targets */
static void parse_targets(parser_t *ps, tj_node_t *n) {
    bool paren = is_op(cur(ps), "(");
    if (paren) next(ps);
    do {
        if (n->ntargets) next(ps);
        const char **nm = tj_alloc(ps->pool, sizeof *nm * (size_t)(n->ntargets + 1));
        if (n->ntargets) memcpy(nm, n->targets, sizeof *nm * (size_t)n->ntargets);
        nm[n->ntargets] = expect_name(ps, "a variable name");
        n->targets = nm;
        n->ntargets++;
    } while (is_op(cur(ps), ","));
    if (paren) expect_op(ps, ")");
}

static tj_node_t *parse_if(parser_t *ps) {
    static const char *const ends[] = {"elif", "else", "endif", NULL};
    tj_node_t *n = node(ps, N_IF);
    next(ps);
    for (;;) {
        add_kid(ps, n, parse_tuple(ps, false), NULL);
        end_tag(ps);
        add_kid(ps, n, parse_body(ps, ends), NULL);
        const char *which = cur(ps)->s;
        next(ps);
        if (!strcmp(which, "elif")) continue;
        if (!strcmp(which, "else")) {
            static const char *const endif[] = {"endif", NULL};
            end_tag(ps);
            n->c = parse_body(ps, endif);
            next(ps);
        }
        end_tag(ps);
        return n;
    }
}

static tj_node_t *parse_for(parser_t *ps) {
    static const char *const ends[] = {"else", "endfor", NULL};
    static const char *const endfor[] = {"endfor", NULL};
    tj_node_t *n = node(ps, N_FOR);
    next(ps);
    parse_targets(ps, n);
    if (!is_name(cur(ps), "in")) fail(ps, "expected 'in' in a for loop, got %s", describe(cur(ps)));
    next(ps);
    n->a = parse_tuple(ps, false);
    if (is_name(cur(ps), "if")) {
        next(ps);
        n->b = parse_expr(ps);
    }
    if (is_name(cur(ps), "recursive")) fail(ps, "recursive for loops are not supported");
    end_tag(ps);
    add_kid(ps, n, parse_body(ps, ends), NULL);
    if (is_name(cur(ps), "else")) {
        next(ps);
        end_tag(ps);
        n->c = parse_body(ps, endfor);
    }
    next(ps);
    end_tag(ps);
    return n;
}

static tj_node_t *parse_set(parser_t *ps) {
    tj_node_t *n = node(ps, N_SET);
    next(ps);
    if (cur(ps)->kind == T_NAME && is_op(peek(ps, 1), ".")) {
        n->name = expect_name(ps, "a variable name");
        next(ps);
        n->name2 = expect_name(ps, "an attribute name");
    } else {
        parse_targets(ps, n);
        n->name = n->targets[0];
    }
    if (is_op(cur(ps), "=")) {
        next(ps);
        n->a = parse_tuple(ps, true);
        end_tag(ps);
        return n;
    }
    if (n->ntargets != 1 || n->name2) fail(ps, "expected '=' in a set with several targets");
    if (is_op(cur(ps), "|")) fail(ps, "filtered block assignments are not supported");
    static const char *const ends[] = {"endset", NULL};
    end_tag(ps);
    n->kind = N_SETBLOCK;
    add_kid(ps, n, parse_body(ps, ends), NULL);
    next(ps);
    end_tag(ps);
    return n;
}

static tj_node_t *parse_macro(parser_t *ps) {
    static const char *const ends[] = {"endmacro", NULL};
    tj_node_t *n = node(ps, N_MACRO);
    next(ps);
    n->name = expect_name(ps, "a macro name");
    expect_op(ps, "(");
    const char **params = tj_alloc(ps->pool, sizeof *params * 64);
    while (!is_op(cur(ps), ")")) {
        if (n->nkids) expect_op(ps, ",");
        if (n->nkids == 63) fail(ps, "a macro with more than 63 parameters");
        params[n->nkids] = expect_name(ps, "a parameter name");
        tj_node_t *dflt = NULL;
        if (is_op(cur(ps), "=")) {
            next(ps);
            dflt = parse_expr(ps);
        } else if (n->nkids && n->kids[n->nkids - 1]) {
            fail(ps, "a parameter without a default after one with a default");
        }
        add_kid(ps, n, dflt, NULL);
    }
    next(ps);
    n->nnames = n->nkids;
    n->names = params;
    end_tag(ps);
    n->a = parse_body(ps, ends);
    next(ps);
    if (cur(ps)->kind == T_NAME) next(ps); /* `endmacro name` */
    end_tag(ps);
    return n;
}

static tj_node_t *parse_statement(parser_t *ps) {
    enter(ps);
    next(ps); /* '{%' */
    const tj_token_t *t = cur(ps);
    if (t->kind != T_NAME) fail(ps, "expected a tag name, got %s", describe(t));
    tj_node_t *n;
    if (!strcmp(t->s, "if")) n = parse_if(ps);
    else if (!strcmp(t->s, "for")) n = parse_for(ps);
    else if (!strcmp(t->s, "set")) n = parse_set(ps);
    else if (!strcmp(t->s, "macro")) n = parse_macro(ps);
    else if (!strcmp(t->s, "break") || !strcmp(t->s, "continue")) {
        n = node(ps, t->s[0] == 'b' ? N_BREAK : N_CONTINUE);
        next(ps);
        end_tag(ps);
    } else if (!strcmp(t->s, "generation")) {
        static const char *const ends[] = {"endgeneration", NULL};
        n = node(ps, N_GENERATION);
        next(ps);
        end_tag(ps);
        add_kid(ps, n, parse_body(ps, ends), NULL);
        next(ps);
        end_tag(ps);
    } else {
        fail(ps, "unknown or unsupported tag '%s'", t->s);
    }
    ps->depth--;
    return n;
}

/* Statements until a `{% end %}` tag whose name is in ends (left current:
 * the caller consumes it), or the end of the template when ends is NULL. */
static tj_node_t *parse_body(parser_t *ps, const char *const *ends) {
    tj_node_t *body = node(ps, N_BODY);
    for (;;) {
        const tj_token_t *t = cur(ps);
        if (t->kind == T_EOF) {
            if (!ends) return body;
            int last = 0;
            while (ends[last + 1]) last++;
            fail(ps, "unexpected end of template, expected '%s'", ends[last]);
        }
        if (t->kind == T_DATA) {
            tj_node_t *d = node(ps, N_DATA);
            d->v = tj_strv(tj_str_new(ps->pool, t->s, t->n, NULL, 0));
            next(ps);
            add_kid(ps, body, d, NULL);
        } else if (t->kind == T_VAR_BEGIN) {
            tj_node_t *o = node(ps, N_OUTPUT);
            next(ps);
            o->a = parse_tuple(ps, true);
            expect_kind(ps, T_VAR_END, "'}}'");
            add_kid(ps, body, o, NULL);
        } else if (t->kind == T_BLOCK_BEGIN) {
            const tj_token_t *name = peek(ps, 1);
            for (int k = 0; ends && ends[k]; k++)
                if (is_name(name, ends[k])) {
                    next(ps);
                    return body;
                }
            if (name->kind == T_NAME && (!strncmp(name->s, "end", 3) || !strcmp(name->s, "else") ||
                                         !strcmp(name->s, "elif"))) {
                next(ps);
                fail(ps, "unexpected '%s'%s%s%s", name->s, ends ? ", expected '" : "", ends ? ends[0] : "",
                     ends ? "'" : "");
            }
            add_kid(ps, body, parse_statement(ps), NULL);
        } else {
            fail(ps, "unexpected %s", describe(t));
        }
    }
}

tj_node_t *tj_parse(tj_pool_t *p, const tj_token_t *toks, int ntok, const char *origin, mt_error_t *err,
                    jmp_buf *jb) {
    parser_t ps = {.pool = p, .t = toks, .n = ntok, .origin = origin, .err = err, .jb = jb};
    return parse_body(&ps, NULL);
}
