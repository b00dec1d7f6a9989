/* The span table (see spans.h). */
#include "engine/exec/place/spans.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/arena.h"
#include "base/grow.h"
#include "engine/exec/place/copies.h"
#include "moe/staging.h"

void exec_spans_init(exec_spans_t *s, const eng_layer_env_t *env, exec_pending_list_t *pend) {
    memset(s, 0, sizeof *s);
    s->env = env;
    s->pend = pend;
    s->free_head = -1;
}

void exec_spans_free(exec_spans_t *s) {
    for (int i = 0; i < s->n; i++)
        if (s->v[i].base) kern_free(s->env->dev, s->v[i].base);
    free(s->v);
    s->v = NULL;
    s->n = s->cap = 0;
    s->free_head = -1;
}

static int span_new(exec_spans_t *s, void *base, int live) {
    int i = s->free_head;
    if (i >= 0) {
        s->free_head = s->v[i].next_free;
    } else {
        MT_GROW(s->v, s->cap, s->n + 1, "device spans");
        i = s->n++;
    }
    s->v[i] = (exec_span_t){base, live, -1};
    return i;
}

void exec_span_put(exec_spans_t *s, int sp, kern_stream_t *after) {
    exec_span_t *p = &s->v[sp];
    MT_CHECK(p->base && p->live > 0, "executor: span %d released twice", sp);
    if (--p->live > 0) return;
    if (after) exec_defer_free(s->pend, p->base, NULL, 0, after);
    else kern_free(s->env->dev, p->base);
    p->base = NULL;
    p->next_free = s->free_head;
    s->free_head = sp;
}

mt_status_t exec_span_alloc(exec_spans_t *s, const int *ids, int k, bool weights, const char *tag, int *spans,
                            void **ptrs, mt_error_t *err) {
    const eng_model_t *m = s->env->model;
    kern_device_t *dev = s->env->dev;
    if (k <= 0) return MT_OK;
    size_t *sz = calloc((size_t)k * 2, sizeof *sz);
    MT_CHECK_ALLOC(sz, "span layout");
    size_t *off = sz + k;
    for (int j = 0; j < k; j++) {
        const eng_param_t *p = &m->params[ids[j]];
        sz[j] = weights ? exec_w_span_bytes(p) : exec_f32_bytes(p);
    }
    const size_t total = moe_staging_layout(sz, k, MT_ARENA_ALIGN, off);
    mt_error_t quiet = {0};
    char *base = k > 1 ? kern_alloc(dev, total, tag, &quiet) : NULL;
    if (base) {
        const int sp = span_new(s, base, k);
        for (int j = 0; j < k; j++) {
            spans[j] = sp;
            ptrs[j] = base + off[j];
        }
        free(sz);
        return MT_OK;
    }
    for (int j = 0; j < k; j++) { /* no contiguous room: one allocation per tensor */
        char t[240];
        snprintf(t, sizeof t, "%s: %s", tag, m->params[ids[j]].spec->name);
        ptrs[j] = kern_alloc(dev, sz[j], t, err);
        if (!ptrs[j]) {
            for (int q = 0; q < j; q++) exec_span_put(s, spans[q], NULL);
            free(sz);
            return err->code;
        }
        spans[j] = span_new(s, ptrs[j], 1);
    }
    free(sz);
    return MT_OK;
}
