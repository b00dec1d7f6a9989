/* Statements and the entry points: parse a template once, render it on a
 * context many times.
 *
 * Scopes follow jinja2: a for loop's body is a new scope on every
 * iteration (a `set` inside it is gone at the next one and after the loop;
 * that is what namespace() is for), `if` opens none, a macro's body and a
 * {% generation %} block (a call block in jinja2) open their own.  Macros see
 * the scope they were defined in.
 *
 * The source is normalised as jinja2 does before lexing: "\r\n" and "\r"
 * become "\n" and one trailing newline is dropped. */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "text/jinja/internal.h"
#include "text/jinja/jinja.h"

struct text_template {
    tj_pool_t pool;
    tj_node_t *root;
    char *origin;
};

tj_frame_t *tj_frame_new(tj_rt_t *rt, tj_frame_t *parent) {
    tj_frame_t *f = tj_alloc(&rt->pool, sizeof *f);
    f->parent = parent;
    return f;
}

void tj_frame_set(tj_rt_t *rt, tj_frame_t *f, const char *name, tj_val_t v) {
    for (int i = 0; i < f->n; i++)
        if (strcmp(f->names[i], name) == 0) {
            f->vals[i] = v;
            return;
        }
    if (f->n == f->cap) {
        int cap = f->cap ? f->cap * 2 : 8;
        const char **names = tj_alloc(&rt->pool, sizeof *names * (size_t)cap);
        tj_val_t *vals = tj_alloc(&rt->pool, sizeof *vals * (size_t)cap);
        if (f->n) {
            memcpy(names, f->names, sizeof *names * (size_t)f->n);
            memcpy(vals, f->vals, sizeof *vals * (size_t)f->n);
        }
        f->names = names, f->vals = vals, f->cap = cap;
    }
    f->names[f->n] = name;
    f->vals[f->n++] = v;
}

static void emit(tj_rt_t *rt, const tj_str_t *s) {
    tj_buf_put(rt, rt->out, s->p, s->n, s->fl, rt->gen_depth > 0 ? TJ_GEN : 0);
}

static void exec_body(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *body);

/* unpacks v into the names of a for/set target */
static void assign_targets(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *s, tj_val_t v) {
    if (s->ntargets == 1) {
        tj_frame_set(rt, f, s->targets[0], v);
        return;
    }
    tj_val_t items = tj_iterable(rt, s, v);
    if (items.l->n != s->ntargets)
        tj_fail(rt, s, "cannot unpack %d values into %d names", items.l->n, s->ntargets);
    for (int i = 0; i < s->ntargets; i++) tj_frame_set(rt, f, s->targets[i], items.l->v[i]);
}

/* The loop variable: one dict per loop whose values change in place each
 * iteration (previtem/nextitem are Undefined where there is none). */
static const char *const LOOP_KEYS[] = {"index0", "index", "revindex", "revindex0", "first", "last",
                                        "length", "depth", "depth0", "previtem", "nextitem"};
enum { LOOP_NKEYS = sizeof LOOP_KEYS / sizeof *LOOP_KEYS };

static tj_val_t loop_new(tj_rt_t *rt) {
    tj_val_t loop = tj_dict_new(rt, D_LOOP);
    for (int k = 0; k < LOOP_NKEYS; k++) tj_dict_set(rt, loop.d, tj_cstr(rt, LOOP_KEYS[k]), tj_none());
    return loop;
}

static void loop_update(tj_val_t loop, const tj_val_t *items, int i, int n) {
    tj_val_t v[LOOP_NKEYS] = {
        tj_int(i), tj_int(i + 1), tj_int(n - i), tj_int(n - i - 1), tj_bool(i == 0), tj_bool(i == n - 1),
        tj_int(n), tj_int(1), tj_int(0),
        i > 0 ? items[i - 1] : tj_undef("'loop.previtem' on the first iteration"),
        i < n - 1 ? items[i + 1] : tj_undef("'loop.nextitem' on the last iteration"),
    };
    memcpy(loop.d->vals, v, sizeof v);
}

static void exec_for(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *s) {
    tj_val_t all = tj_iterable(rt, s->a, tj_eval(rt, f, s->a));
    tj_val_t *items = all.l->v;
    int n = all.l->n;
    if (s->b) { /* `for x in xs if cond`: the loop sees only the items that pass */
        items = tj_alloc(&rt->pool, sizeof *items * (size_t)(n ? n : 1));
        int kept = 0;
        for (int i = 0; i < n; i++) {
            tj_frame_t *probe = tj_frame_new(rt, f);
            assign_targets(rt, probe, s, all.l->v[i]);
            if (tj_truthy(tj_eval(rt, probe, s->b))) items[kept++] = all.l->v[i];
        }
        n = kept;
    }
    tj_val_t loop = loop_new(rt);
    tj_frame_t *it = tj_frame_new(rt, f);
    for (int i = 0; i < n; i++) {
        if (++rt->iterations > TJ_MAX_ITERATIONS)
            tj_fail(rt, s, "more than %d loop iterations", TJ_MAX_ITERATIONS);
        it->n = 0; /* a fresh scope each iteration, its storage reused */
        loop_update(loop, items, i, n);
        tj_frame_set(rt, it, "loop", loop);
        assign_targets(rt, it, s, items[i]);
        exec_body(rt, it, s->kids[0]);
        int ctrl = rt->ctrl;
        rt->ctrl = 0;
        if (ctrl == 1) break;
    }
    if (n == 0 && s->c) exec_body(rt, f, s->c);
}

static void exec_set(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *s) {
    tj_val_t v = tj_eval(rt, f, s->a);
    if (!s->name2) {
        assign_targets(rt, f, s, v);
        return;
    }
    tj_val_t ns = tj_lookup(rt, f, s->name);
    if (ns.k != V_DICT || ns.sub != D_NS) tj_fail(rt, s, "cannot assign attribute on non-namespace object");
    if (s->name2[0] == '_') tj_fail(rt, s, "cannot store underscore-prefixed attribute '%s' on a namespace", s->name2);
    tj_dict_set(rt, ns.d, tj_cstr(rt, s->name2), v);
}

/* renders body into a fresh buffer and returns it as a string */
static tj_str_t *capture(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *body) {
    tj_buf_t buf = {0}, *saved = rt->out;
    rt->out = &buf;
    exec_body(rt, f, body);
    rt->out = saved;
    return buf.n ? tj_buf_str(rt, &buf) : tj_str_new(&rt->pool, "", 0, NULL, 0);
}

static void exec_stmt(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *s) {
    switch (s->kind) {
    case N_DATA: emit(rt, s->v.s); return;
    case N_OUTPUT: {
        tj_val_t v = tj_eval(rt, f, s->a);
        emit(rt, tj_to_str(rt, v));
        return;
    }
    case N_IF:
        for (int i = 0; i + 1 < s->nkids; i += 2)
            if (tj_truthy(tj_eval(rt, f, s->kids[i]))) {
                exec_body(rt, f, s->kids[i + 1]);
                return;
            }
        if (s->c) exec_body(rt, f, s->c);
        return;
    case N_FOR: exec_for(rt, f, s); return;
    case N_SET: exec_set(rt, f, s); return;
    case N_SETBLOCK: tj_frame_set(rt, f, s->name, tj_strv(capture(rt, tj_frame_new(rt, f), s->kids[0]))); return;
    case N_MACRO: {
        tj_func_t *fn = tj_alloc(&rt->pool, sizeof *fn);
        fn->kind = F_MACRO;
        fn->name = s->name;
        fn->node = s;
        fn->closure = f;
        tj_frame_set(rt, f, s->name, (tj_val_t){.k = V_FUNC, .fn = fn});
        return;
    }
    case N_BREAK: rt->ctrl = 1; return;
    case N_CONTINUE: rt->ctrl = 2; return;
    case N_GENERATION:
        rt->gen_depth++;
        exec_body(rt, tj_frame_new(rt, f), s->kids[0]);
        rt->gen_depth--;
        return;
    default: tj_fail(rt, s, "internal: not a statement (%d)", s->kind);
    }
}

static void exec_body(tj_rt_t *rt, tj_frame_t *f, const tj_node_t *body) {
    for (int i = 0; i < body->nkids && !rt->ctrl; i++) exec_stmt(rt, f, body->kids[i]);
}

tj_str_t *tj_call_macro(tj_rt_t *rt, const tj_node_t *at, const tj_func_t *fn, int n, const tj_val_t *args,
                        const char **kw) {
    const tj_node_t *m = fn->node;
    if (rt->call_depth >= TJ_MAX_CALL_DEPTH)
        tj_fail(rt, at, "macro '%s': calls nested deeper than %d (runaway recursion?)", fn->name, TJ_MAX_CALL_DEPTH);
    tj_frame_t *f = tj_frame_new(rt, fn->closure);
    bool *set = tj_alloc(&rt->pool, sizeof *set * (size_t)(m->nnames + 1));
    int pos = 0;
    for (int i = 0; i < n; i++) {
        int p = -1;
        if (kw[i]) {
            for (int k = 0; k < m->nnames; k++)
                if (!strcmp(m->names[k], kw[i])) p = k;
            if (p < 0) tj_fail(rt, at, "macro '%s' takes no keyword argument '%s'", fn->name, kw[i]);
        } else {
            p = pos++;
            if (p >= m->nnames) tj_fail(rt, at, "macro '%s' takes not more than %d argument(s)", fn->name, m->nnames);
        }
        if (set[p]) tj_fail(rt, at, "macro '%s' got multiple values for argument '%s'", fn->name, m->names[p]);
        set[p] = true;
        tj_frame_set(rt, f, m->names[p], args[i]);
    }
    for (int k = 0; k < m->nnames; k++) {
        if (set[k]) continue;
        tj_val_t v = m->kids[k] ? tj_eval(rt, f, m->kids[k]) : tj_undef("a macro parameter without a value");
        tj_frame_set(rt, f, m->names[k], v);
    }
    rt->call_depth++;
    int ctrl = rt->ctrl;
    tj_str_t *r = capture(rt, f, m->a);
    rt->ctrl = ctrl;
    rt->call_depth--;
    return r;
}

/* ---- entry points ---- */

mt_status_t text_template_parse(const char *src, size_t len, const char *origin, text_template_t **out,
                                mt_error_t *err) {
    *out = NULL;
    /* volatile: read after setjmp, which -O2 may otherwise keep in a register longjmp restores stale */
    const char *volatile name = origin ? origin : "template";
    text_template_t *t = calloc(1, sizeof *t);
    MT_CHECK_ALLOC(t, "a template");
    jmp_buf jb;
    t->pool.oom = &jb;
    t->pool.err = err;
    if (setjmp(jb)) {
        text_template_free(t);
        return err ? err->code : MT_ERR_FORMAT;
    }
    t->origin = tj_strdup(&t->pool, name, strlen(name));
    char *norm = tj_alloc(&t->pool, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            norm[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            norm[n++] = src[i];
        }
    }
    if (n && norm[n - 1] == '\n') n--;
    norm[n] = 0;
    int ntok;
    tj_token_t *toks = tj_lex(&t->pool, norm, n, t->origin, &ntok, err, &jb);
    t->root = tj_parse(&t->pool, toks, ntok, t->origin, err, &jb);
    *out = t;
    return MT_OK;
}

void text_template_free(text_template_t *t) {
    if (!t) return;
    tj_pool_free(&t->pool);
    free(t);
}

static void add_builtins(tj_rt_t *rt, tj_frame_t *g) {
    static const char *const names[] = {"raise_exception", "strftime_now", "namespace", "dict", "range"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        tj_func_t *fn = tj_alloc(&rt->pool, sizeof *fn);
        fn->kind = F_BUILTIN;
        fn->name = names[i];
        tj_frame_set(rt, g, names[i], (tj_val_t){.k = V_FUNC, .fn = fn});
    }
}

static mt_status_t render(const text_template_t *t, const json_t *ctx, const time_t *now, text_render_t *out,
                          mt_error_t *err) {
    memset(out, 0, sizeof *out);
    if (!ctx || !json_is_object(ctx)) return mt_error_set(err, MT_ERR_CONFIG, "%s: the render context must be a JSON object", t->origin);
    tj_rt_t *rt = calloc(1, sizeof *rt);
    MT_CHECK_ALLOC(rt, "a render");
    rt->err = err;
    rt->origin = t->origin;
    rt->pool.oom = &rt->jb;
    rt->call_macro = tj_call_macro;
    rt->pool.err = err;
    if (now) rt->now = *now, rt->now_set = true;
    if (setjmp(rt->jb)) {
        tj_pool_free(&rt->pool);
        free(rt);
        return err ? err->code : MT_ERR_FORMAT;
    }
    tj_frame_t *g = tj_frame_new(rt, NULL);
    rt->globals = g;
    add_builtins(rt, g);
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)ctx, key, v) {
        size_t kl = strlen(key);
        bool special = kl >= 6 && strcmp(key + kl - 6, "_token") == 0;
        tj_frame_set(rt, g, tj_strdup(&rt->pool, key, kl), tj_from_json(rt, v, special ? 0 : TJ_DATA));
    }
    tj_buf_t buf = {0};
    rt->out = &buf;
    exec_body(rt, tj_frame_new(rt, g), t->root);
    out->len = buf.n;
    out->text = malloc(buf.n + 1);
    out->from_data = malloc(buf.n + 1);
    out->in_generation = malloc(buf.n + 1);
    MT_CHECK_ALLOC(out->text && out->from_data && out->in_generation ? out->text : NULL, "rendered text");
    if (buf.n) memcpy(out->text, buf.p, buf.n);
    out->text[buf.n] = 0;
    for (size_t i = 0; i < buf.n; i++) {
        out->from_data[i] = (buf.fl[i] & TJ_DATA) != 0;
        out->in_generation[i] = (buf.fl[i] & TJ_GEN) != 0;
    }
    tj_pool_free(&rt->pool);
    free(rt);
    return MT_OK;
}

mt_status_t text_template_render(const text_template_t *t, const json_t *ctx, text_render_t *out, mt_error_t *err) {
    return render(t, ctx, NULL, out, err);
}

mt_status_t text_template_render_at(const text_template_t *t, const json_t *ctx, time_t now, text_render_t *out,
                                    mt_error_t *err) {
    return render(t, ctx, &now, out, err);
}

void text_render_free(text_render_t *r) {
    if (!r) return;
    free(r->text);
    free(r->from_data);
    free(r->in_generation);
    memset(r, 0, sizeof *r);
}

json_t *text_chat_messages_prepare(const json_t *messages) {
    static const char *const reasoning_keys[] = {"reasoning_content", "thinking", "reasoning"};
    json_t *out = json_array();
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) {
        if (!json_is_object(m)) {
            json_array_append(out, m);
            continue;
        }
        json_t *reasoning = NULL;
        for (int k = 0; k < 3 && !reasoning; k++) {
            json_t *r = json_object_get(m, reasoning_keys[k]);
            if (r && !json_is_null(r)) reasoning = r;
        }
        json_t *copy = json_object();
        if (reasoning) json_object_set(copy, "thinking", reasoning);
        const char *key;
        json_t *v;
        json_object_foreach(m, key, v) {
            if (!json_is_null(v)) json_object_set(copy, key, v);
        }
        if (reasoning) json_object_set(copy, "reasoning_content", reasoning);
        json_array_append_new(out, copy);
    }
    return out;
}
