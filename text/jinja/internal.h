/* The interpreter's insides, shared by its files (not part of the API).
 *
 * Memory: a template's tokens and syntax tree live in the template's pool;
 * everything a render makes (values, strings, output buffers) lives in the
 * render's pool.  Both are freed whole, so an error anywhere longjmps out to
 * the entry point (text_template_parse / text_template_render), which frees
 * the pool: no error path needs to unwind allocations by hand.
 *
 * Strings carry one flag byte per byte (NULL = all zero): TJ_DATA for bytes
 * copied from the context's data, TJ_GEN for bytes rendered inside
 * {% generation %}.  Values are immutable once built (the sandbox forbids
 * mutating lists and dicts) except a namespace's attributes, so they are
 * shared by pointer freely. */
#ifndef MT_TEXT_JINJA_INTERNAL_H
#define MT_TEXT_JINJA_INTERNAL_H

#include <jansson.h>
#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "base/status.h"

enum { TJ_DATA = 1, TJ_GEN = 2 };

/* Limits a hostile template meets. */
enum {
    TJ_MAX_CALL_DEPTH = 64,         /* nested macro calls */
    TJ_MAX_PARSE_DEPTH = 200,       /* nested expressions and blocks */
    TJ_MAX_ITERATIONS = 10000000,   /* loop iterations in one render */
};
#define TJ_MAX_OUTPUT ((size_t)64 << 20)  /* bytes of one buffer (the output or a capture) */
#define TJ_MAX_POOL ((size_t)1 << 30)     /* bytes a render may allocate */

/* ---- pool ---- */
typedef struct tj_chunk tj_chunk_t;
typedef struct {
    tj_chunk_t *head;
    size_t used, total;
    jmp_buf *oom; /* where to go when the pool passes TJ_MAX_POOL (NULL: fatal) */
    mt_error_t *err;
} tj_pool_t;
void *tj_alloc(tj_pool_t *p, size_t n); /* zeroed */
char *tj_strdup(tj_pool_t *p, const char *s, size_t n);
void tj_pool_free(tj_pool_t *p);

/* ---- values ---- */
typedef struct tj_str {
    size_t n;
    char *p;     /* n bytes + NUL */
    uint8_t *fl; /* n flag bytes, or NULL when all zero */
} tj_str_t;

typedef enum { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC } tj_kind_t;
enum { L_LIST = 0, L_TUPLE = 1 };          /* list sub-kinds */
enum { D_DICT = 0, D_NS = 1, D_LOOP = 2 }; /* dict sub-kinds (a namespace is mutable) */

typedef struct tj_list tj_list_t;
typedef struct tj_dict tj_dict_t;
typedef struct tj_func tj_func_t;
typedef struct {
    uint8_t k, sub;
    union {
        bool b;
        int64_t i;
        double f;
        tj_str_t *s;
        tj_list_t *l;
        tj_dict_t *d;
        tj_func_t *fn;
        const char *undef; /* what is undefined, for the error when it is used */
    };
} tj_val_t;

struct tj_list {
    int n;
    tj_val_t *v;
};
struct tj_dict {
    int n, cap;
    tj_val_t *keys, *vals;
};

struct tj_node;
typedef enum { F_BUILTIN, F_METHOD, F_MACRO } tj_fkind_t;
struct tj_func {
    tj_fkind_t kind;
    const char *name;
    tj_val_t self;              /* F_METHOD: the bound object */
    const struct tj_node *node; /* F_MACRO */
    struct tj_frame *closure;   /* F_MACRO: the frame it was defined in */
};

/* ---- syntax ---- */
typedef enum {
    /* expressions */
    N_CONST, N_NAME, N_LIST, N_TUPLE, N_DICT, N_GETATTR, N_GETITEM, N_SLICE, N_CALL, N_FILTER, N_TEST,
    N_UNARY, N_BINARY, N_AND, N_OR, N_NOT, N_COMPARE, N_COND,
    /* statements */
    N_BODY, N_DATA, N_OUTPUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE,
    N_GENERATION,
} tj_nkind_t;

/* One node; which fields mean what depends on kind:
 *   N_CONST v; N_NAME name; N_LIST/N_TUPLE kids; N_DICT kids = k0,v0,k1,v1...
 *   N_GETATTR a.name; N_GETITEM a[b]; N_SLICE a[kids0:kids1:kids2] (NULL = absent)
 *   N_CALL a(kids) with names[i] the keyword of kids[i] or NULL
 *   N_FILTER name(a, kids...) and N_TEST `a is [not] name(kids)` (op = negated), same names
 *   N_UNARY op a; N_BINARY a op b; N_AND/N_OR a b; N_NOT a
 *   N_COMPARE a then (ops[i], kids[i]) pairs; N_COND a if b else c (c may be NULL)
 *   N_BODY kids; N_DATA v (a string); N_OUTPUT a
 *   N_IF kids = cond0, body0, cond1, body1...; c = else body or NULL
 *   N_FOR targets, a = iterable, b = filter or NULL, kids[0] = body, c = else
 *   N_SET targets (or name.name2, a namespace attribute, when name2 != NULL), a = value
 *   N_SETBLOCK name, kids[0] = body; N_MACRO name, names = params, kids = defaults
 *   (NULL = none) then the body last; N_GENERATION kids[0] = body */
typedef struct tj_node {
    uint8_t kind;
    int op;
    int line, col;
    struct tj_node *a, *b, *c;
    struct tj_node **kids;
    int nkids;
    const char **names;
    int nnames;
    const char **targets; /* N_FOR, N_SET: the names assigned */
    int ntargets;
    const char *name, *name2;
    int *ops;
    tj_val_t v;
} tj_node_t;

/* operator codes (N_UNARY, N_BINARY, N_COMPARE) */
enum {
    OP_ADD = 1, OP_SUB, OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD, OP_POW, OP_CONCAT,
    OP_EQ, OP_NE, OP_LT, OP_LE, OP_GT, OP_GE, OP_IN, OP_NOTIN, OP_NEG, OP_POS,
};

/* ---- tokens ---- */
typedef enum {
    T_EOF, T_DATA, T_VAR_BEGIN, T_VAR_END, T_BLOCK_BEGIN, T_BLOCK_END, T_NAME, T_STRING, T_INT, T_FLOAT, T_OP,
} tj_tkind_t;
typedef struct {
    uint8_t kind;
    int line, col;
    const char *s; /* T_DATA/T_STRING/T_NAME/T_OP text (NUL-terminated, pool) */
    size_t n;
    int64_t i;
    double f;
} tj_token_t;

/* Lexes the whole (normalized) source; fails through *jb with err set. */
tj_token_t *tj_lex(tj_pool_t *p, const char *src, size_t len, const char *origin, int *ntok,
                   mt_error_t *err, jmp_buf *jb);
tj_node_t *tj_parse(tj_pool_t *p, const tj_token_t *toks, int ntok, const char *origin, mt_error_t *err,
                    jmp_buf *jb);

/* ---- render state ---- */
typedef struct tj_frame {
    struct tj_frame *parent;
    int n, cap;
    const char **names;
    tj_val_t *vals;
} tj_frame_t;

typedef struct {
    char *p;
    uint8_t *fl;
    size_t n, cap;
} tj_buf_t;

typedef struct tj_rt {
    tj_pool_t pool;
    jmp_buf jb;
    mt_error_t *err;
    const char *origin;
    tj_buf_t *out; /* where output goes now (captures push their own) */
    int gen_depth, call_depth;
    long iterations;
    int ctrl; /* 0, or 1 break / 2 continue pending */
    time_t now;
    bool now_set;
    tj_frame_t *globals;
    /* render.c's tj_call_macro, reached through here so that the evaluator
     * below the statements needs no call up into them */
    struct tj_str *(*call_macro)(struct tj_rt *rt, const struct tj_node *at, const struct tj_func *fn, int n,
                                 const tj_val_t *args, const char **kw);
} tj_rt_t;

/* value.c: fails the render: "origin:line:col: message" (node may be NULL). */
__attribute__((noreturn, format(printf, 3, 4))) void tj_fail(tj_rt_t *rt, const tj_node_t *at, const char *fmt,
                                                             ...);

/* value.c */
tj_val_t tj_none(void);
tj_val_t tj_bool(bool b);
tj_val_t tj_int(int64_t i);
tj_val_t tj_float(double f);
tj_val_t tj_undef(const char *what);
tj_val_t tj_strv(tj_str_t *s);
tj_str_t *tj_str_new(tj_pool_t *p, const char *s, size_t n, const uint8_t *fl, uint8_t fill);
tj_val_t tj_cstr(tj_rt_t *rt, const char *s);
tj_val_t tj_list_new(tj_rt_t *rt, int n, uint8_t sub);
tj_val_t tj_dict_new(tj_rt_t *rt, uint8_t sub);
void tj_dict_set(tj_rt_t *rt, tj_dict_t *d, tj_val_t k, tj_val_t v);
const tj_val_t *tj_dict_get(const tj_dict_t *d, tj_val_t k);
const tj_val_t *tj_dict_gets(const tj_dict_t *d, const char *k);
bool tj_truthy(tj_val_t v);
bool tj_equal(tj_val_t a, tj_val_t b);
int tj_compare(tj_rt_t *rt, const tj_node_t *at, tj_val_t a, tj_val_t b); /* <0 0 >0, or fails */
const char *tj_type_name(tj_val_t v);
tj_val_t tj_from_json(tj_rt_t *rt, const json_t *j, uint8_t fl);
/* text buffers */
void tj_buf_put(tj_rt_t *rt, tj_buf_t *b, const char *s, size_t n, const uint8_t *fl, uint8_t fill);
void tj_buf_puts(tj_rt_t *rt, tj_buf_t *b, const char *s);
tj_str_t *tj_buf_str(tj_rt_t *rt, const tj_buf_t *b);
/* str(), repr() and json.dumps() as Python writes them, appended to b */
void tj_put_str(tj_rt_t *rt, tj_buf_t *b, tj_val_t v);
void tj_put_repr(tj_rt_t *rt, tj_buf_t *b, tj_val_t v);
void tj_put_json(tj_rt_t *rt, const tj_node_t *at, tj_buf_t *b, tj_val_t v, int indent, int level,
                 const char *item_sep, const char *key_sep, bool sort_keys);
tj_str_t *tj_to_str(tj_rt_t *rt, tj_val_t v);
void tj_format_float(double f, char out[40]);
/* UTF-8 code points */
size_t tj_utf8_len(const char *s, size_t n);
size_t tj_utf8_offset(const char *s, size_t n, size_t cp); /* byte offset of code point cp (clamped) */
tj_str_t *tj_substr(tj_rt_t *rt, const tj_str_t *s, size_t off, size_t n);

/* eval.c */
tj_val_t tj_eval(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *e);
tj_val_t tj_call(tj_rt_t *rt, const tj_node_t *at, tj_val_t fn, int n, const tj_val_t *args,
                 const char **kw);
tj_val_t tj_lookup(tj_rt_t *rt, tj_frame_t *f, const char *name);

/* access.c */
tj_val_t tj_slice(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, const tj_val_t b[3]);
bool tj_compare_op(tj_rt_t *rt, const tj_node_t *at, int op, tj_val_t a, tj_val_t b);
tj_val_t tj_attr_path(tj_rt_t *rt, const tj_node_t *at, tj_val_t v, const char *path); /* "a.b.0" */
tj_val_t tj_getattr(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, const char *name);
tj_val_t tj_getitem(tj_rt_t *rt, const tj_node_t *at, tj_val_t obj, tj_val_t key);
tj_val_t tj_iterable(tj_rt_t *rt, const tj_node_t *at, tj_val_t v); /* a list of the items for-in sees */
tj_val_t tj_binary(tj_rt_t *rt, const tj_node_t *at, int op, tj_val_t a, tj_val_t b);

/* filters.c, tests.c, methods.c: args[0] is the subject; kw[i] names args[i] or is NULL */
tj_val_t tj_filter(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args,
                   const char **kw);
bool tj_test(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args);
bool tj_has_filter(const char *name);
bool tj_has_test(const char *name);
/* A method of a string, dict or list (NULL when obj has none of that name). */
bool tj_has_method(tj_val_t obj, const char *name);
tj_val_t tj_call_method(tj_rt_t *rt, const tj_node_t *at, tj_val_t self, const char *name, int n,
                        const tj_val_t *args, const char **kw);
tj_val_t tj_call_builtin(tj_rt_t *rt, const tj_node_t *at, const char *name, int n, const tj_val_t *args,
                         const char **kw);
/* Argument binding for filters and methods: the value of parameter `name` at
 * position pos (counting the subject as 0), or dflt. */
tj_val_t tj_arg(const tj_node_t *at, tj_rt_t *rt, int n, const tj_val_t *args, const char **kw, int pos,
                const char *name, tj_val_t dflt);

/* string operations shared by methods and filters; they keep each copied byte's flags */
tj_val_t tj_strip_value(tj_rt_t *rt, const tj_str_t *s, const tj_str_t *chars, bool left, bool right);
tj_val_t tj_replace(tj_rt_t *rt, const tj_node_t *at, const tj_str_t *s, tj_val_t oldv, tj_val_t newv,
                    int64_t count);
tj_val_t tj_recase(tj_rt_t *rt, const tj_str_t *s, char mode); /* 'u' 'l' 't' (str.title) 'c' */
tj_val_t tj_join(tj_rt_t *rt, const tj_node_t *at, tj_val_t seq, const tj_str_t *sep, const char *attribute);

/* render.c */
tj_str_t *tj_call_macro(tj_rt_t *rt, const tj_node_t *at, const tj_func_t *fn, int n, const tj_val_t *args,
                        const char **kw);
tj_frame_t *tj_frame_new(tj_rt_t *rt, tj_frame_t *parent);
void tj_frame_set(tj_rt_t *rt, tj_frame_t *f, const char *name, tj_val_t v);

#endif
